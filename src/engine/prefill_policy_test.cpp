// PrefillPolicy against simulated step costs (no clock): a CPU-like cost (every row costs the same,
// attention grows with the prompt position) and a GPU-like cost (rows nearly free until the step
// turns compute-bound). Mixed steps must stay within the step factor of a decode-only step once
// the estimate has settled (and never far beyond it before), use most of that budget (prompts
// progress), and take a reference step about every refresh_rounds; a fixed row count and steps
// without decode rows bypass it.
#include "engine/prefill_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>

namespace fb::engine {
namespace {

struct SimRun {
  std::vector<double> ratio;  // mixed step time / decode-only step time, in order
  int64_t rounds = 0, refs = 0;
};

// Prefills a prompt of `prompt` rows beside decode rows whose step costs `decode_s`; `cost(p, pos)`
// is the time of a step carrying p prompt rows starting at prompt position pos.
SimRun simulate(PrefillPolicy& pol, int64_t prompt, double decode_s, const std::function<double(int64_t, int64_t)>& cost) {
  SimRun r;
  int64_t pos = 0;
  while (pos < prompt && r.rounds < 100000) {
    ++r.rounds;
    const int64_t want = pol.rows(true);
    const int64_t p = std::min(want, prompt - pos);
    const double t = p == 0 ? decode_s : cost(p, pos);
    if (p == 0) ++r.refs;
    else r.ratio.push_back(t / decode_s);
    pol.observe(8, p, t);
    pos += p;
  }
  return r;
}

TEST(PrefillPolicy, LinearCostStaysWithinTheFactor) {
  PrefillPolicyOptions o;
  o.chunk = 512;
  o.step_factor = 2.0;
  PrefillPolicy pol(o);
  const double D = 0.080;  // 8 decode rows at 10 ms each (CPU: every row costs; a prompt row less)
  auto cost = [&](int64_t p, int64_t pos) { return D + double(p) * 0.002 * (1.0 + double(pos) / 8192.0); };
  const SimRun r = simulate(pol, 20000, D, cost);
  ASSERT_GT(r.ratio.size(), 20u);
  double worst = 0, settled_min = 1e9;
  for (size_t i = 0; i < r.ratio.size(); ++i) {
    worst = std::max(worst, r.ratio[i]);
    if (i >= 10 && i + 1 < r.ratio.size()) settled_min = std::min(settled_min, r.ratio[i]);  // the prompt's tail is short
  }
  std::printf("linear: %zu mixed steps, %lld reference steps, worst %.3fx, settled min %.3fx\n", r.ratio.size(), (long long)r.refs,
              worst, settled_min);
  EXPECT_LE(worst, 2.05) << "a mixed step took " << worst << "x a decode step";
  // Most of the budget is used: the prompt is not starved.
  EXPECT_GE(settled_min, 1.8);
  // One reference step per refresh_rounds mixed steps (plus the first).
  EXPECT_LE(r.refs, int64_t(r.ratio.size()) / o.refresh_rounds + 2);
  EXPECT_GE(r.refs, int64_t(r.ratio.size()) / o.refresh_rounds);
  EXPECT_NEAR(pol.decode_step_s(), D, 1e-12);
}

TEST(PrefillPolicy, KneeCostIsNotOvershotMuch) {
  PrefillPolicyOptions o;
  o.chunk = 2048;
  o.step_factor = 2.0;
  PrefillPolicy pol(o);
  const double D = 0.013;  // a GPU decode step: weight bytes; prompt rows ride along until compute-bound
  auto cost = [&](int64_t p, int64_t) { return std::max(D, 0.2 * D + 0.00025 * double(p)); };
  const SimRun r = simulate(pol, 32768, D, cost);
  double worst = 0, settled_min = 1e9;
  for (size_t i = 0; i < r.ratio.size(); ++i) {
    worst = std::max(worst, r.ratio[i]);
    if (i >= 20 && i + 1 < r.ratio.size()) settled_min = std::min(settled_min, r.ratio[i]);
  }
  std::printf("knee: %lld rounds, worst %.3fx, settled min %.3fx\n", (long long)r.rounds, worst, settled_min);
  EXPECT_LE(worst, 2.5) << "the chunk overshot the knee";
  EXPECT_GE(settled_min, 1.6);
  // Rounds to fill 32K rows: the bound leaves about 93 rows per step at this cost.
  EXPECT_LT(r.rounds, 32768 / 80 + 32768 / 80 / o.refresh_rounds + 30);
}

TEST(PrefillPolicy, FindsTheNewCostWhenStepsGetDearer) {
  PrefillPolicyOptions o;
  o.chunk = 512;
  PrefillPolicy pol(o);
  double per_row = 0.001;
  const double D = 0.020;
  auto cost = [&](int64_t p, int64_t) { return D + per_row * double(p); };
  simulate(pol, 3000, D, cost);
  per_row = 0.004;  // e.g. the next prompt lands at a longer context
  const SimRun r = simulate(pol, 3000, D, cost);
  ASSERT_GT(r.ratio.size(), 10u);
  // The first step after the change runs the old chunk at four times the cost; the next one is
  // back within the bound.
  EXPECT_LE(r.ratio.front(), 5.0 + 1e-9);
  for (size_t i = 1; i < r.ratio.size(); ++i) EXPECT_LE(r.ratio[i], 2.0 + 1e-9) << "mixed step " << i;
}

TEST(PrefillPolicy, ReferenceStepFirstThenMinRows) {
  PrefillPolicyOptions o;
  o.chunk = 256;
  o.min_rows = 4;
  PrefillPolicy pol(o);
  EXPECT_EQ(pol.rows(false), 256) << "no decode rows: the whole chunk";
  EXPECT_EQ(pol.rows(true), 0) << "no decode-only step measured yet";
  pol.observe(3, 0, 0.01);
  EXPECT_EQ(pol.rows(true), 4);
  pol.observe(3, 4, 0.01);  // free rows: grow by half
  EXPECT_EQ(pol.rows(true), 6);
  pol.observe(3, 6, 0.01);
  EXPECT_EQ(pol.rows(true), 9);
  pol.observe(3, 9, 0.5);  // far too dear: down to the floor
  EXPECT_EQ(pol.rows(true), 4);
  // A step of prompt rows alone changes nothing.
  pol.observe(0, 256, 5.0);
  EXPECT_EQ(pol.rows(true), 4);
}

TEST(PrefillPolicy, FixedRowsBypassMeasuring) {
  PrefillPolicyOptions o;
  o.chunk = 64;
  o.fixed_rows = 5;
  PrefillPolicy pol(o);
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(pol.rows(true), 5);
    pol.observe(2, 5, 1.0);
  }
  EXPECT_EQ(pol.rows(false), 64);
  EXPECT_EQ(pol.reference_steps(), 0);
  o.fixed_rows = 1000;
  PrefillPolicy big(o);
  EXPECT_EQ(big.rows(true), 64) << "never more than a chunk";
}

}  // namespace
}  // namespace fb::engine
