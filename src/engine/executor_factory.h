// Executor factory: the one place that maps `--backend cpu|cuda` to a model::Executor. The CUDA
// executor (src/cuda) plugs in through the FB_HAVE_CUDA_EXECUTOR compile definition; without it
// "cuda" is a clean kUnsupported, never a silent fallback to the CPU.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/executor.h"

namespace fb::engine {

// Routed experts through the tiers (issue 9, docs/tiers.md) instead of all resident.
struct ExecutorOptions {
  // Experts per layer kept resident: HBM slots on CUDA, the first host tier on the CPU. 0: all.
  int expert_slots = 0;
  int expert_staging = 0;            // CUDA: staging slots for LFU admission (0: admit every miss)
  int64_t host_experts = 0;          // host cache records (0: as many as expert_slots per layer x 1)
  std::vector<std::string> expert_store;  // expert-store replicas (flashbox convert); empty: the snapshot's shards
};

Result<std::unique_ptr<model::Executor>> make_executor(const std::string& backend, const std::string& model_dir,
                                                       const ExecutorOptions& opt = {});

}  // namespace fb::engine
