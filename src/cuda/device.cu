// Host-side device plumbing shared by the launchers (cuda/device.h).
#include <mutex>
#include <unordered_map>

#include "cuda/device.h"

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

}  // namespace fb::cuda
