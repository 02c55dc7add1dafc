// Quality cost of SWA bounded replay (spec/11 §8.4, issue 7): the same prompt is prefilled
// exactly and with bounded replay on fresh sessions, then both decode the same teacher-forced
// tokens; every logits row of the replay run is compared with the exact run's row at the same
// position (KL(exact || replay) over the full-vocabulary softmax, top-1 agreement).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/executor.h"

namespace fb::engine {

struct ReplayQualityOptions {
  std::vector<int32_t> prompt;
  // Decode inputs: step k feeds forced[k-1]. Empty: the exact run's own argmax chain of `steps`.
  std::vector<int32_t> forced;
  int64_t steps = 16;
  int64_t chunk = 0;  // prefill rows per step (0 = the whole prompt in one step)
  int reps = 1;       // timed prefills per mode (the minimum is reported)
};

struct ReplayQualityReport {
  int64_t prompt_len = 0, window = 0, replay_start = 0;
  int decoder_start = -1, n_layers = 0;
  std::vector<double> kl;        // per logits row: 0 = last prompt position, k = decode step k
  std::vector<uint8_t> top1_same;
  std::vector<double> exact_margin;  // per row: the exact run's top-1 minus top-2 logit
  std::vector<double> exact_entropy; // per row: entropy of the exact softmax (nats), for scale
  double exact_prefill_s = 0, replay_prefill_s = 0;
  double mean_kl() const;        // over all rows
  double max_kl() const;
  int top1_agree() const;
  std::string summary_line(const std::string& name) const;
};

// KL(p || q) in nats between softmax(a) and softmax(b) over n logits (double precision).
double softmax_kl(const float* a, const float* b, int64_t n);

// Runs both modes on `ex` (which must support bounded replay). Prompts no longer than the
// window are allowed: both runs are then the same and every KL is 0.
Result<ReplayQualityReport> replay_quality(model::Executor& ex, const ReplayQualityOptions& opt);

// The same comparison for an approximation that lives in a second executor (cache-conditional
// routing, issue 22): the prompt and decode steps on `exact` and on `approx`, fresh sessions,
// the same teacher-forced tokens; every logits row of `approx` against `exact`'s (replay_start 0).
Result<ReplayQualityReport> approx_quality(model::Executor& exact, model::Executor& approx, const ReplayQualityOptions& opt);

}  // namespace fb::engine
