// Selection margins (CLARIFICATIONS "Fixture gates"): how close a top-k selection came to
// choosing differently. The layer gate lets a row exceed its tolerance only where a selection it
// uses has a near-tie at the boundary BY OUR OWN SCORES, so both executors compute this from the
// scores they actually selected with (never assumed). Host code, shared by the CPU and CUDA paths.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace fb::model {

// Relative boundary gap of "keep the k largest of s[0..n)": (k-th - (k+1)-th largest) divided by
// the scores' scale (max |finite score|). +inf entries are always kept (pinned) and count towards
// k; -inf entries are never chosen (masked, invisible). +inf when the selection is complete (no
// finite score competes for the last place); 0 at an exact tie.
inline float selection_margin(const float* s, int64_t n, int64_t k) {
  std::vector<float> fin;
  fin.reserve(size_t(n));
  int64_t pinned = 0;
  float scale = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = s[i];
    if (std::isnan(v)) continue;
    if (v == INFINITY) {
      ++pinned;
    } else if (v != -INFINITY) {
      fin.push_back(v);
      scale = std::max(scale, std::fabs(v));
    }
  }
  const int64_t kk = k - pinned;  // places left for finite scores
  if (kk <= 0 || int64_t(fin.size()) <= kk) return INFINITY;
  std::nth_element(fin.begin(), fin.begin() + kk, fin.end(), std::greater<float>());
  const float below = fin[size_t(kk)];                                               // (k+1)-th
  const float last = *std::min_element(fin.begin(), fin.begin() + kk);                // k-th
  const float gap = last - below;
  if (gap == 0.0f) return 0.0f;
  return scale > 0.0f ? gap / scale : INFINITY;
}

// The candidate pool's block selection (spec/11 §4.9, cpu CpuStep::candidate_pool): block score =
// max of its entries' scores, the newest visible block pinned, the `keep` best blocks kept.
inline float pool_margin(const float* I, int64_t n, int64_t n_vis, int64_t block, int64_t keep) {
  const int64_t nb = (n + block - 1) / block;
  std::vector<float> score(size_t(nb), -INFINITY);
  for (int64_t j = 0; j < n; ++j) score[size_t(j / block)] = std::max(score[size_t(j / block)], I[j]);
  if (n_vis > 0) score[size_t((n_vis - 1) / block)] = INFINITY;
  return selection_margin(score.data(), nb, keep);
}

// A margin is a near-tie when the gap is at most 1e-3 of the score scale (or exactly zero).
constexpr float kNearTieMargin = 1e-3f;
inline bool near_tie(float margin) { return margin <= kNearTieMargin; }

}  // namespace fb::model
