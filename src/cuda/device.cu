// Host-side device plumbing shared by the launchers (cuda/device.h).
#include <mutex>
#include <unordered_map>

#include "cuda/device.h"
#include "cuda/launch.cuh"

namespace fb::cuda {

Status allow_dynamic_smem(const void* kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return Status();
  static std::mutex mu;
  static std::unordered_map<const void*, size_t> allowed;  // kernel -> bytes already allowed
  std::lock_guard<std::mutex> lock(mu);
  size_t& have = allowed[kernel];
  if (bytes <= have) return Status();
  FB_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  have = bytes;
  return Status();
}

namespace {

// Thread per 16 bytes (one 16-byte host read each); the last thread copies the tail byte by byte.
__global__ void copy_from_pinned_kernel(uint8_t* __restrict__ dst, const uint8_t* __restrict__ src, size_t bytes) {
  const size_t i = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) * 16;
  if (i >= bytes) return;
  if (i + 16 <= bytes && (reinterpret_cast<uintptr_t>(dst + i) & 15u) == 0 && (reinterpret_cast<uintptr_t>(src + i) & 15u) == 0) {
    *reinterpret_cast<uint4*>(dst + i) = *reinterpret_cast<const uint4*>(src + i);
    return;
  }
  for (size_t k = i; k < bytes && k < i + 16; ++k) dst[k] = src[k];
}

}  // namespace

Status copy_from_pinned(void* dst, const void* pinned_src, size_t bytes, cudaStream_t st) {
  if (bytes == 0) return Status();
  const size_t pieces = (bytes + 15) / 16;
  return launch_op("copy_from_pinned_kernel", copy_from_pinned_kernel, unsigned((pieces + 255) / 256), 256, 0, st, static_cast<uint8_t*>(dst),
                   static_cast<const uint8_t*>(pinned_src), bytes);
}

}  // namespace fb::cuda
