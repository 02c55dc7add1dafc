// AlignedBuffer: host bytes aligned for O_DIRECT (4 KiB). Owns plain heap memory; a CUDA-pinned
// buffer is provided by its owner as a raw (pointer, size) span instead; storage never allocates
// device or pinned memory itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <utility>

#include "base/check.h"

namespace fb::storage {

constexpr uint64_t kDirectAlign = 4096;
inline uint64_t align_down(uint64_t v) { return v & ~(kDirectAlign - 1); }
inline uint64_t align_up(uint64_t v) { return (v + kDirectAlign - 1) & ~(kDirectAlign - 1); }

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t n) : size_(n) {
    if (n == 0) return;
    void* p = nullptr;
    FB_CHECK(posix_memalign(&p, kDirectAlign, align_up(n)) == 0) << "posix_memalign of " << n << " B";
    data_ = static_cast<uint8_t*>(p);
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(AlignedBuffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace fb::storage
