// Shared helpers of the CUDA op tests (gtest, label gpu): skip without a device, and device arrays
// poisoned with 0xFF bytes so that an output a kernel forgot to write shows up as NaN / 0xFF.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda/device.h"

namespace fb::cuda::test_util {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

template <typename T>
struct Dev {
  DeviceBuffer buf;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    EXPECT_TRUE(buf.alloc(std::max<size_t>(count, 1) * sizeof(T)).ok());
    poison();
  }
  explicit Dev(const std::vector<T>& v) : Dev(v.size()) { set(v); }
  T* p() const { return buf.get<T>(); }
  void poison() { EXPECT_EQ(cudaMemset(buf.get(), 0xFF, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess); }
  void set(const std::vector<T>& v) { EXPECT_EQ(cudaMemcpy(buf.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess); }
  std::vector<T> get() const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(v.data(), buf.get(), n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

// The official-reference fixtures: $FB_FIXTURES_DIR, else the shared folder's fixtures/.
inline std::string fixtures_dir() {
  if (const char* d = std::getenv("FB_FIXTURES_DIR")) return d;
  return std::string(FB_SHARED_DIR) + "/fixtures";
}

// The fixture's folder, or "" when the test must skip (no GPU, fixture absent: *why says which).
inline std::string runnable_fixture(const std::string& name, std::string* why) {
  if (!have_gpu()) {
    *why = "no CUDA device";
    return "";
  }
  const std::string dir = fixtures_dir() + "/" + name;
  if (!std::filesystem::exists(dir)) {
    *why = dir + " not present";
    return "";
  }
  return dir;
}

// A test over one official fixture, named by the parameter: dir is its folder; the test skips
// when runnable_fixture says it cannot run here.
class FixtureTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    std::string why;
    dir = runnable_fixture(GetParam(), &why);
    if (dir.empty()) GTEST_SKIP() << why;
  }
  std::string dir;
};

}  // namespace fb::cuda::test_util

#define FB_NEED_GPU() \
  if (!::fb::cuda::test_util::have_gpu()) GTEST_SKIP() << "no CUDA device"
