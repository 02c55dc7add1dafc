// Executor factory: the one place that maps `--backend cpu|cuda` to a model::Executor. The CUDA
// executor (src/cuda) plugs in through the FB_HAVE_CUDA_EXECUTOR compile definition; without it
// "cuda" is a clean kUnsupported, never a silent fallback to the CPU.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "model/executor.h"

namespace fb::engine {

Result<std::unique_ptr<model::Executor>> make_executor(const std::string& backend, const std::string& model_dir);

}  // namespace fb::engine
