// TensorView: a non-owning, typed view of C-contiguous bytes (an mmapped checkpoint tensor, a
// buffer in host RAM). Shapes are [rows, cols] in nn.Linear orientation: [out_features, in].
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/check.h"
#include "base/dtype.h"

namespace fb {

struct TensorView {
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  int rank() const { return int(shape.size()); }
  int64_t dim(int i) const {
    FB_CHECK(i >= 0 && i < rank()) << "dim " << i << " of rank " << rank();
    return shape[size_t(i)];
  }
  bool valid() const { return data != nullptr; }

  template <typename T>
  const T* as() const {
    FB_CHECK(dtype_size(dtype) == sizeof(T)) << "view of " << dtype_name(dtype) << " as " << sizeof(T) << "-byte type";
    return reinterpret_cast<const T*>(data);
  }
  // Row r of a 2-D tensor (or of the flattened leading dims) as bytes.
  const uint8_t* row_bytes(int64_t r) const {
    FB_CHECK(rank() >= 1);
    int64_t row_elems = numel() / shape[0];
    return data + size_t(r) * size_t(row_elems) * dtype_size(dtype);
  }
};

std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace fb
