// DSpark verify-length scheduling (spec/13 §4.7, §7): confidences -> prefix survival, and the
// hardware-aware prefix scheduler that picks how many drafted rows one verify step carries from
// the survival table and a verify cost table. Pure functions: no clocks, no random draws (the
// verified length must be fixed before any acceptance draw, spec/13 §6.2).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace fb::engine {

// S_j = prod_{k<=j} sigmoid(z_k / T_k), j = 1..z.size() (S_0 = 1 is implied). T_k = 1 where
// `sts_temps` is shorter (no calibration shipped); a non-finite z_k counts as c_k = 1 (missing
// confidences mean "full block", spec/13 §7 notes).
std::vector<double> dspark_survival(std::span<const float> confidence_logits, std::span<const double> sts_temps = {});

// Verify cost: steps per second of one target forward over n rows, n = 1..size(). Beyond the
// table the cost per row of the last entry is extrapolated linearly.
struct VerifyCostTable {
  std::vector<double> steps_per_s;  // [n - 1] = steps/s with n rows
  double draft_s = 0;               // seconds per draft block; 0 = not measured
  bool empty() const { return steps_per_s.empty(); }
  double sps(int64_t rows) const;
  // A flat table (every row count costs the same): the memory-bound single-stream case.
  static VerifyCostTable flat(int64_t max_rows);
};

enum class ScheduleRule {
  // SGLang: evaluate every b, take the arg-max (ties to the longer block). Any verify length is
  // exact for greedy decoding, so greedy rounds use it.
  kArgmax,
  // Paper Algorithm 1: extend while Theta does not decrease. Whether draft j is verified then
  // depends only on S_1..S_j, i.e. on drafts d_1..d_{j-1}: a stopping time of the draft chain,
  // which speculative SAMPLING needs (a length that looked at d_j itself, as the arg-max does
  // through S_{j+1}, would bias which drafts get verified and so the output distribution).
  kEarlyStop,
};

// Drafts to verify, L in 0..max_len, for one request: maximises the expected committed tokens
// per second Theta(b) = (1 + sum_{j<=b} S_j) * SPS(1 + b). An empty table counts as flat
// (always the full block).
int choose_verify_len(std::span<const double> survival, const VerifyCostTable& cost, int max_len, ScheduleRule rule);

// Whether a round that drafts and verifies L drafts commits tokens faster than plain decoding,
// counting the draft block's own time: (1 + sum_{j<=L} S_j) / (1/SPS(1+L) + draft_s) >= SPS(1).
// With the draft unmeasured (draft_s == 0) only L == 0 counts as not paying. The generator uses
// the answer of one round to decide whether the NEXT rounds draft at all ([policy]: any verify
// length, zero included, keeps greedy output and the sampling distribution exact).
bool drafting_pays(std::span<const double> survival, const VerifyCostTable& cost, int L);

// Expected committed tokens per round (anchor's successor included) for L verified drafts:
// 1 + sum_{j<=L} S_j. With a per-draft acceptance p, S_j = p^j.
double expected_tokens_per_round(std::span<const double> survival, int L);

}  // namespace fb::engine
