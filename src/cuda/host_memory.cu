#include "cuda/host_memory.h"

#include <cuda_runtime.h>

namespace fb::cuda {

void pin_host_range(void* p, size_t n) {
  if (cudaHostRegister(p, n, cudaHostRegisterDefault) != cudaSuccess) (void)cudaGetLastError();
}

void unpin_host_range(void* p) {
  if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}

bool device_memory(size_t* free_bytes, size_t* total_bytes) {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  *free_bytes = free_b;
  *total_bytes = total_b;
  return true;
}

}  // namespace fb::cuda
