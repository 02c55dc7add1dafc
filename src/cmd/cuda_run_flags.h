// The CUDA run options of bench and check-fixture from their flags: --numerics CLASS, then each
// --cuda-opt NAME=VALUE in order (cuda::set_run_option names). CUDA builds only.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "cuda/executor.h"

namespace fb::cmd {

// The first bad value is the error; `o` holds what was applied before it.
inline Status apply_cuda_run_flags(cuda::CudaRunOptions& o, const std::string& numerics, const std::vector<std::string>& cuda_opts) {
  FB_RETURN_IF_ERROR(cuda::set_run_option(o, "numerics", numerics));
  for (const std::string& kv : cuda_opts) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) return FB_ERROR(kInvalidArgument) << "--cuda-opt wants NAME=VALUE (got " << kv << ")";
    FB_RETURN_IF_ERROR(cuda::set_run_option(o, kv.substr(0, eq), kv.substr(eq + 1)));
  }
  return Status();
}

}  // namespace fb::cmd
