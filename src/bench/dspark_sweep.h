// DSpark end to end on any executor with a controllable acceptance rate (issue 11): plain greedy
// generation, then DSpark with drafts forced to be accepted with probability p (the engine's
// forced-acceptance harness), reporting tokens per round against the speed model and tok/s
// against plain decode. Used by `flashbox bench --synthetic --dspark-sweep` at the released
// dimensions.
#pragma once

#include <vector>

#include "base/progress.h"
#include "base/status.h"
#include "engine/dspark_harness.h"
#include "model/executor.h"

namespace fb::bench {

// progress (optional): the plain run and each p, as runs.
Result<std::vector<engine::ForcedAcceptanceReport>> dspark_sweep(model::Executor& ex, int64_t prompt_len, int64_t n_tokens,
                                                                 const std::vector<double>& ps, int verify_rows, const ProgressFn& progress = {});

}  // namespace fb::bench
