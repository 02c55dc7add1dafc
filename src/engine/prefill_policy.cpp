#include "engine/prefill_policy.h"

#include <algorithm>
#include <cmath>

namespace fb::engine {

PrefillPolicy::PrefillPolicy(PrefillPolicyOptions o) : o_(o) {
  o_.chunk = std::max<int64_t>(1, o_.chunk);
  o_.min_rows = std::clamp<int64_t>(o_.min_rows, 1, o_.chunk);
  o_.refresh_rounds = std::max(1, o_.refresh_rounds);
}

int64_t PrefillPolicy::rows(bool decoding) {
  if (!decoding) return o_.chunk;
  if (o_.fixed_rows > 0) return std::min(o_.fixed_rows, o_.chunk);
  if (d_ <= 0 || since_ref_ >= o_.refresh_rounds) {
    ++refs_;
    return 0;
  }
  // Growth from the last mixed chunk (min_rows before any): at most 1.5x per step, so a cost curve
  // with a knee (a GPU step's rows are nearly free until its GEMMs turn compute-bound) is not
  // overshot by much from an average cost measured below the knee.
  const int64_t cap = std::min(o_.chunk, last_ > 0 ? std::max(last_ + 1, last_ + last_ / 2) : o_.min_rows);
  int64_t p = cap;
  if (c_ > 0) {
    const double want = (o_.step_factor - 1.0) * d_ / c_;
    p = want >= double(cap) ? cap : int64_t(std::floor(std::max(0.0, want)));
  }
  p = std::clamp<int64_t>(p, o_.min_rows, std::max(o_.min_rows, cap));
  last_ = p;
  return p;
}

void PrefillPolicy::observe(int64_t decode_rows, int64_t prefill_rows, double step_s) {
  if (decode_rows <= 0 || step_s <= 0) return;  // a prompt step alone says nothing about decode latency
  if (prefill_rows == 0) {
    d_ = d_ > 0 ? 0.5 * d_ + 0.5 * step_s : step_s;
    since_ref_ = 0;
    return;
  }
  ++since_ref_;
  if (d_ <= 0) return;
  // What the prompt rows added to the step (a step faster than the reference adds nothing). A
  // dearer sample is taken at once (the next step must not repeat an overshoot); a cheaper one
  // is averaged in.
  const double sample = std::max(0.0, step_s - d_) / double(prefill_rows);
  c_ = sample >= c_ ? sample : 0.5 * c_ + 0.5 * sample;
}

}  // namespace fb::engine
