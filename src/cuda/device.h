// Device memory and error plumbing of the CUDA executor: RAII buffers, CUDA errors as Status.
// Host header (no kernels); every launcher in fb::cuda returns Status through FB_CUDA_TRY.
// Invariant: a DeviceBuffer owns exactly one cudaMalloc allocation (or none).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "base/status.h"

namespace fb::cuda {

inline Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status();
  const StatusCode code = e == cudaErrorMemoryAllocation ? StatusCode::kOutOfMemory : StatusCode::kInternal;
  return Status(code, std::string(what) + ": " + cudaGetErrorString(e));
}

// Per-kernel profiler (`flashbox bench --profile-kernels`): while on for the calling thread, every
// launch records an event on the profiled stream; the time between consecutive events is charged
// to "<op>/<kernel>" (op = the executor's sublayer op). Launch gaps count with the kernel after them.
void kprof_begin(cudaStream_t st);
void kprof_set_op(const char* op);
void kprof_mark(const char* kernel);
// Synchronises the stream, adds the intervals to `add(name, ms)`, and turns profiling off.
void kprof_end(void (*add)(void* ctx, const std::string& name, double ms), void* ctx);
bool kprof_on();

// cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize, bytes) only when `bytes` exceeds the
// 48 KB default and what this process already allowed for `kernel` (a host API call per launch
// costs microseconds on the decode step's critical path). Thread-safe.
Status allow_dynamic_smem(const void* kernel, size_t bytes);

}  // namespace fb::cuda

#define FB_CUDA_TRY(expr) FB_RETURN_IF_ERROR(::fb::cuda::cuda_status((expr), #expr))
// After a launch: configuration errors show up here, not at the <<<>>> site. Also the hook of
// the per-kernel profiler (kprof_mark: one flag test unless profiling is on for this thread).
#define FB_CUDA_LAUNCHED(name)          \
  do {                                  \
    ::fb::cuda::kprof_mark(name);       \
    FB_RETURN_IF_ERROR(::fb::cuda::cuda_status(cudaGetLastError(), name)); \
  } while (0)

namespace fb::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  // Allocation failure is a Status the caller may act on (shrink a cache, fewer rows).
  Status alloc(size_t bytes) {
    reset();
    if (bytes == 0) return Status();
    FB_CUDA_TRY(cudaMalloc(&p_, bytes));
    n_ = bytes;
    return Status();
  }
  void reset() {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  template <typename T = void>
  T* get() const { return static_cast<T*>(p_); }
  size_t bytes() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace fb::cuda
