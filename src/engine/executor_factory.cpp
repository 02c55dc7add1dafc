#include "engine/executor_factory.h"

#include "cpu/executor.h"
#ifdef FB_HAVE_CUDA_EXECUTOR
#include "cuda/executor.h"
#endif

namespace fb::engine {

Result<std::unique_ptr<model::Executor>> make_executor(const std::string& backend, const std::string& model_dir) {
  if (backend == "cpu") {
    auto m = cpu::CpuModel::load(model_dir);
    if (!m.ok()) return m.status();
    return std::unique_ptr<model::Executor>(std::move(m).value());
  }
  if (backend == "cuda") {
#ifdef FB_HAVE_CUDA_EXECUTOR
    // The CUDA executor's loader (src/cuda/executor.h); same contract as CpuModel::load.
    auto m = cuda::CudaModel::load(model_dir);
    if (!m.ok()) return m.status();
    return std::unique_ptr<model::Executor>(std::move(m).value());
#else
    return FB_ERROR(kUnsupported) << "this build has no CUDA executor (configure with the cuda preset on a machine with the "
                                     "CUDA toolkit), use --backend cpu";
#endif
  }
  return FB_ERROR(kInvalidArgument) << "unknown backend '" << backend << "' (cpu or cuda)";
}

}  // namespace fb::engine
