// Programmatic dependent launch (PDL, sm_90) for the fast class's decode kernels.
//
// A kernel launched with the programmatic-serialization attribute may start before the kernel
// ahead of it on the stream has finished: as soon as every CTA of that kernel has executed
// pdl_trigger() (or exited). It must then call pdl_wait() before it reads anything the earlier
// kernel wrote or writes anything the earlier kernel reads: the wait returns once the earlier
// grid has completed and its memory operations are visible. What it may do before the wait:
// read data no kernel of the step writes (weights), e.g. issue the first weight loads of a GEMV,
// so the HBM pipeline fills during the earlier kernel's tail instead of after it.
//
// Rules that keep this correct (fast_small.cu, fast_gemv.cu follow them):
//  * every kernel launched with the attribute calls pdl_wait() in every CTA before its first
//    dependent read or any store (so its completion implies its predecessor's: transitivity);
//  * kernels launched without the attribute (every exact-class kernel, memcpys, events) keep
//    plain stream order; pdl_trigger() / pdl_wait() are no-ops for them.
// Without the attribute (CudaRunOptions::pdl = 0) the same kernels run in plain stream order.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace fb::cuda {

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// <<<grid, block, smem, st>>>(args...), with the programmatic-serialization attribute when pdl.
template <typename... KArgs, typename... Args>
cudaError_t launch_pdl(bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = pdl ? attr : nullptr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace fb::cuda
