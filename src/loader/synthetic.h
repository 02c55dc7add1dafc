// Synthetic in-memory checkpoints for benchmarks at the released dimensions (issue 6): every
// tensor of the schema with realistic statistics (norm means, fan-in scaled projections with
// the release's gains, embedding RMS 0.12) without writing multi-GB files. The big FP8/FP4
// payloads share one pool of random codes (scales are per tensor), so host memory stays a few
// GB while the executor uploads a full-size model. For speed measurements only: the weights are
// random, so outputs are noise.
#pragma once

#include <memory>
#include <string>

#include "base/progress.h"
#include "loader/snapshot.h"

namespace fb::loader {

// distinct_experts > 0: routed expert e of a layer shares the scale bytes of expert
// e % distinct_experts (the codes are shared anyway), so a model with 384 experts per layer costs
// the host memory and generation time of `distinct_experts` (issue 9's tiered bench).
// Progress of the build (bytes generated, tensors) goes to stderr on a terminal only
// (base/progress.h; `progress` overrides, tests read it through a sink).
Result<std::unique_ptr<Snapshot>> synthetic_snapshot(const std::string& config_json, uint64_t seed, int distinct_experts = 0,
                                                     const ProgressOptions& progress = {});

}  // namespace fb::loader
