// One op's kernel launch, with what every op does after it written once (issue 23): the
// per-kernel profiler's mark and the launch's error under the kernel's name. For .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "base/status.h"
#include "cuda/device.h"
#include "cuda/pdl.cuh"

namespace fb::cuda {

// kernel<<<grid, block, smem, st>>>(args...), then FB_CUDA_LAUNCHED(name).
template <typename... KArgs, typename... Args>
Status launch_op(const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, Args&&... args) {
  kernel<<<grid, block, smem, st>>>(std::forward<Args>(args)...);
  FB_CUDA_LAUNCHED(name);
  return Status();
}

// The same with the programmatic-serialization attribute when pdl (pdl.cuh's launch_pdl).
template <typename... KArgs, typename... Args>
Status launch_op_pdl(const char* name, bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, Args&&... args) {
  FB_RETURN_IF_ERROR(cuda_status(launch_pdl(pdl, kernel, grid, block, smem, st, std::forward<Args>(args)...), name));
  FB_CUDA_LAUNCHED(name);
  return Status();
}

}  // namespace fb::cuda
