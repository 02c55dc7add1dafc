// DSpark beyond greedy (spec/13 §4.7, §6.2, §7): the verify-length scheduler as a pure function
// (flat cost -> full block, steep cost -> shorter, early stop is a stopping time of the draft
// chain); exact speculative sampling end to end through the Generator on a synthetic Markov model
// (chi-square of the emitted tokens against the exact target distribution, mean accepted drafts
// against the analytical sum_v min(pi, q) recursion); the forced-acceptance harness's tokens per
// round against 1 + sum p^j. Fixed seeds throughout: deterministic, cannot flake.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>

#include "engine/dspark_harness.h"
#include "engine/dspark_schedule.h"
#include "engine/generator.h"
#include "engine/sampler.h"

namespace fb::engine {
namespace {

// ---------------------------------------------------------------------------------------------
// Scheduler

TEST(DsparkSchedule, SurvivalIsThePrefixProductOfSigmoids) {
  const std::vector<float> z = {0.0f, std::log(3.0f), NAN, -INFINITY};
  const auto S = dspark_survival(z);
  ASSERT_EQ(S.size(), 4u);
  EXPECT_NEAR(S[0], 0.5, 1e-12);
  EXPECT_NEAR(S[1], 0.375, 1e-7);
  EXPECT_NEAR(S[2], 0.375, 1e-7);  // missing confidence: c = 1
  EXPECT_EQ(S[3], 0.0);
  const std::vector<double> T = {1.0, 2.0};  // c_2 = sigmoid(log 3 / 2) = sqrt3 / (1 + sqrt3)
  EXPECT_NEAR(dspark_survival(z, T)[1], 0.5 * std::sqrt(3.0) / (1 + std::sqrt(3.0)), 1e-7);
}

TEST(DsparkSchedule, FlatCostAlwaysVerifiesTheFullBlock) {
  const VerifyCostTable flat = VerifyCostTable::flat(6);
  for (double c : {0.999, 0.5, 0.01, 1e-9}) {
    std::vector<double> S;
    double s = 1;
    for (int j = 0; j < 5; ++j) S.push_back(s *= c);
    EXPECT_EQ(choose_verify_len(S, flat, 5, ScheduleRule::kArgmax), 5) << c;
    EXPECT_EQ(choose_verify_len(S, flat, 5, ScheduleRule::kEarlyStop), 5) << c;
    EXPECT_EQ(choose_verify_len(S, VerifyCostTable{}, 5, ScheduleRule::kEarlyStop), 5) << c;  // no table
    EXPECT_EQ(choose_verify_len(S, flat, 3, ScheduleRule::kArgmax), 3) << c;                 // capped
  }
}

TEST(DsparkSchedule, SteepCostVerifiesShorterBlocks) {
  // Each extra row costs 20 % of a one-row step: Theta(b) = (1 + sum S) / (1 + 0.2 b).
  VerifyCostTable steep;
  for (int n = 1; n <= 6; ++n) steep.steps_per_s.push_back(1.0 / (1.0 + 0.2 * (n - 1)));
  auto geo = [](double p) {
    std::vector<double> S;
    double s = 1;
    for (int j = 0; j < 5; ++j) S.push_back(s *= p);
    return S;
  };
  EXPECT_EQ(choose_verify_len(geo(0.9), steep, 5, ScheduleRule::kArgmax), 5);
  EXPECT_EQ(choose_verify_len(geo(0.5), steep, 5, ScheduleRule::kArgmax), 2);  // Theta 1.25, 1.25, 1.17: tie -> longer
  EXPECT_EQ(choose_verify_len(geo(0.1), steep, 5, ScheduleRule::kArgmax), 0);
  // Every row costs as much as the first (compute-bound): drafts never pay.
  VerifyCostTable linear;
  for (int n = 1; n <= 6; ++n) linear.steps_per_s.push_back(1.0 / n);
  EXPECT_EQ(choose_verify_len(geo(0.95), linear, 5, ScheduleRule::kArgmax), 0);
  // Beyond the table: linear extrapolation of the last row cost.
  EXPECT_NEAR(steep.sps(12), steep.sps(6) * 6 / 12, 1e-12);
}

TEST(DsparkSchedule, DraftingPaysCountsTheDraftBlock) {
  // One-row step 1 s, each extra row +0.2 s; a draft block of 0.25 s.
  VerifyCostTable t;
  for (int n = 1; n <= 6; ++n) t.steps_per_s.push_back(1.0 / (1.0 + 0.2 * (n - 1)));
  t.draft_s = 0.25;
  auto geo = [](double p) {
    std::vector<double> S;
    double s = 1;
    for (int j = 0; j < 5; ++j) S.push_back(s *= p);
    return S;
  };
  EXPECT_FALSE(drafting_pays(geo(0.99), t, 0));  // nothing verified: the draft was pure cost
  // L = 1: (1 + p) / (1.2 + 0.25) >= 1  <=>  p >= 0.45
  EXPECT_TRUE(drafting_pays(geo(0.46), t, 1));
  EXPECT_FALSE(drafting_pays(geo(0.44), t, 1));
  // L = 5, p = 0.9: 1 + 4.095 tokens in 2.25 s
  EXPECT_TRUE(drafting_pays(geo(0.9), t, 5));
  EXPECT_FALSE(drafting_pays(geo(0.2), t, 5));
  // Draft time unknown: any verified draft counts as paying.
  t.draft_s = 0;
  EXPECT_TRUE(drafting_pays(geo(0.01), t, 1));
  EXPECT_FALSE(drafting_pays(geo(0.01), t, 0));
}

TEST(DsparkSchedule, ArgmaxIsTheBestPrefixAndEarlyStopIsAStoppingTime) {
  Rng rng(5);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<float> z(5);
    for (float& v : z) v = float(rng.uniform() * 8 - 3);
    VerifyCostTable t;  // random, not necessarily monotone (tile effects)
    for (int n = 1; n <= 6; ++n) t.steps_per_s.push_back(1.0 / (1.0 + 0.5 * rng.uniform() * (n - 1)));
    const auto S = dspark_survival(z);
    // kArgmax = brute-force arg-max of Theta (ties to the longer block).
    int best = 0;
    double best_theta = -1;
    for (int b = 0; b <= 5; ++b) {
      const double th = expected_tokens_per_round(S, b) * t.sps(1 + b);
      if (th >= best_theta) best_theta = th, best = b;
    }
    EXPECT_EQ(choose_verify_len(S, t, 5, ScheduleRule::kArgmax), best);
    // kEarlyStop: whether draft j is verified depends only on z_1..z_j (drafts d_<j): changing
    // every later confidence never changes that decision.
    const int L = choose_verify_len(S, t, 5, ScheduleRule::kEarlyStop);
    EXPECT_LE(L, best);
    for (int j = 1; j <= 5; ++j) {
      std::vector<float> z2 = z;
      for (int k = j; k < 5; ++k) z2[size_t(k)] = float(rng.uniform() * 16 - 8);
      const int L2 = choose_verify_len(dspark_survival(z2), t, 5, ScheduleRule::kEarlyStop);
      EXPECT_EQ(L >= j, L2 >= j) << "trial " << trial << " j " << j;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// A synthetic first-order Markov model: the target's row for token c is T[c]; the draft's chain
// row for predecessor x is D[x] (a different table), its confidence logit C[x]. V = 6, B = 4.

constexpr int64_t kV = 6;
constexpr int kB = 4;

class MarkovExecutor final : public model::Executor {
 public:
  // own_chain = false leaves draft_sampled to the interface default (greedy draft, cut at the
  // first differing pick), the path an executor without a sampled chain takes.
  explicit MarkovExecutor(bool own_chain = true) : own_chain_(own_chain) {
    cfg_.vocab_size = kV;
    cfg_.dim = 1;
    cfg_.n_mtp_layers = 1;
    cfg_.dspark_block_size = kB;
    cfg_.dspark_target_layer_ids = {0};
    cfg_.window_size = 16;
    cfg_.max_position_embeddings = 1 << 20;
    cfg_.eos_token_id = -1;
    T_ = {{1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -1.0f}, {0.1f, 1.5f, 0.3f, -0.2f, 0.9f, -2.0f}, {-1.0f, 0.0f, 2.2f, 0.4f, 0.4f, 1.0f},
          {0.5f, 0.5f, 0.5f, 1.5f, -1.0f, 0.0f},  {2.0f, -0.3f, 0.0f, 0.6f, 0.1f, 0.8f},  {0.0f, 0.4f, 1.1f, -0.6f, 1.3f, 0.2f}};
    D_ = {{0.6f, 0.9f, -0.5f, 1.2f, 0.4f, 0.3f},  {0.0f, 1.9f, -0.4f, 0.2f, 0.2f, 0.1f}, {-0.5f, 0.5f, 1.0f, 1.4f, 0.0f, 0.8f},
          {0.9f, 0.1f, 0.7f, 1.0f, -0.5f, 0.3f},  {1.2f, 0.3f, 0.1f, 0.2f, 0.6f, 0.4f}, {0.3f, 0.0f, 0.9f, 0.1f, 1.5f, -0.2f}};
    C_ = {2.0f, 0.5f, -0.5f, 1.0f, 0.0f, 3.0f};
  }
  const model::Config& config() const override { return cfg_; }
  const char* name() const override { return "markov"; }
  std::unique_ptr<model::SessionState> new_session() const override { return std::make_unique<Session>(); }
  Result<model::StepOutput> forward(const model::Step& st, const std::vector<model::SessionState*>& ss, model::Taps*) override {
    auto& s = static_cast<Session&>(*ss[0]);
    model::StepOutput o;
    for (size_t i = 0; i < st.rows.size(); ++i) {
      const model::Row& r = st.rows[i];
      if (r.pos != int64_t(s.tokens.size())) return FB_ERROR(kInvalidArgument) << "row at " << r.pos << ", session at " << s.tokens.size();
      s.tokens.push_back(r.token);
      o.taps.push_back(0);
      if (!r.want_logits) continue;
      o.logit_rows.push_back(int(i));
      o.logits.insert(o.logits.end(), T_[size_t(r.token)].begin(), T_[size_t(r.token)].end());
    }
    return o;
  }
  Status draft_commit(model::SessionState&, int64_t, const uint16_t*, int64_t) override { return Status(); }
  Result<model::DraftOutput> draft(model::SessionState& s, int32_t anchor, const uint16_t*, int64_t) override {
    return chain(s, anchor, [](int64_t, const float* row) { return argmax(row, kV); });
  }
  Result<model::DraftOutput> draft_sampled(model::SessionState& s, int32_t anchor, const uint16_t* tap, int64_t p,
                                           const model::DraftPicker& pick) override {
    if (!own_chain_) return model::Executor::draft_sampled(s, anchor, tap, p, pick);
    return chain(s, anchor, pick);
  }

  std::vector<std::vector<float>> T_, D_;
  std::vector<float> C_;
  std::vector<int32_t> anchors;  // of every draft call (one per DSpark round)

 private:
  struct Session final : model::SessionState {
    std::vector<int32_t> tokens;
    int64_t n_pos() const override { return int64_t(tokens.size()); }
    Status rollback(int64_t p) override {
      tokens.resize(size_t(p));
      return Status();
    }
  };
  model::DraftOutput chain(model::SessionState&, int32_t anchor, const model::DraftPicker& pick) {
    anchors.push_back(anchor);
    model::DraftOutput d;
    d.ids.push_back(anchor);
    for (int k = 1; k <= kB; ++k) {
      const int32_t prev = d.ids.back();
      const auto& row = D_[size_t(prev)];
      d.logits.insert(d.logits.end(), row.begin(), row.end());
      d.confidence.push_back(C_[size_t(prev)]);
      d.ids.push_back(pick(k, row.data()));
    }
    return d;
  }
  model::Config cfg_;
  bool own_chain_;
};

SamplingParams request_params() {
  SamplingParams sp;
  sp.temperature = 0.9f;
  sp.top_k = 5;
  sp.top_p = 0.97f;
  return sp;
}

// pi(. | c) and q(. | x) as dense rows.
std::vector<std::vector<double>> dense_rows(const std::vector<std::vector<float>>& z, const SamplingParams& sp) {
  std::vector<std::vector<double>> out;
  for (const auto& row : z) {
    const Candidates c = sampling_distribution(row.data(), kV, sp);
    std::vector<double> d(size_t(kV), 0.0);
    for (size_t i = 0; i < c.ids.size(); ++i) d[size_t(c.ids[i])] = c.probs[i];
    out.push_back(std::move(d));
  }
  return out;
}

double chi2_crit(int df) {  // upper 1e-3 quantile (Wilson-Hilferty)
  const double z = 3.090, k = double(df);
  const double t = 1.0 - 2.0 / (9.0 * k) + z * std::sqrt(2.0 / (9.0 * k));
  return k * t * t * t;
}

// Pearson chi-square of observed counts against expected probabilities; bins under 5 expected
// counts are pooled into one.
double chi2(const std::map<int64_t, int64_t>& obs, const std::map<int64_t, double>& prob, int64_t n, int* df) {
  double x = 0, pool_e = 0, pool_o = 0;
  int bins = 0;
  for (const auto& [key, pr] : prob) {
    const double e = pr * double(n);
    const auto it = obs.find(key);
    const double o = it == obs.end() ? 0.0 : double(it->second);
    if (e < 5) {
      pool_e += e;
      pool_o += o;
      continue;
    }
    x += (o - e) * (o - e) / e;
    ++bins;
  }
  if (pool_e > 0) {
    x += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
    ++bins;
  }
  for (const auto& [key, o] : obs) EXPECT_TRUE(prob.count(key) && prob.at(key) > 0) << "impossible outcome " << key;
  *df = bins - 1;
  return x;
}

struct SampledRun {
  std::vector<std::vector<int32_t>> seqs;  // per seed
  DsparkCounters counters;
};

// n_seeds requests of `len` tokens after the prompt {0, 1}, each with its own seed.
SampledRun run_sampled(MarkovExecutor& ex, GeneratorOptions opt, int n_seeds, int len) {
  SampledRun r;
  Generator g(ex, opt);
  const std::vector<int32_t> prompt = {0, 1};
  const SamplingParams sp = request_params();
  for (int s = 0; s < n_seeds; ++s) {
    g.reset();
    EXPECT_TRUE(g.prefill(prompt).ok());
    Rng rng(uint64_t(s) * 7919 + 17);
    std::vector<int32_t> out;
    while (int(out.size()) < len) {
      Status st = g.next(sp, rng, &out);
      EXPECT_TRUE(st.ok()) << st.to_string();
      if (!st.ok()) break;
    }
    out.resize(size_t(len));
    r.seqs.push_back(std::move(out));
  }
  r.counters = g.counters();
  return r;
}

// Checks the emitted tokens against the exact Markov chain from token 1: the marginal of every
// position and the joint of three consecutive positions at two offsets (inside a round and
// across rounds).
void expect_target_distribution(const SampledRun& run, const std::string& what) {
  const auto pi = dense_rows(MarkovExecutor().T_, request_params());
  const int len = int(run.seqs[0].size());
  const int64_t n = int64_t(run.seqs.size());
  std::vector<double> m(size_t(kV), 0.0);
  m[1] = 1.0;
  std::vector<std::vector<double>> marg;  // marg[i] = distribution of emitted token i
  for (int i = 0; i < len; ++i) {
    std::vector<double> nx(size_t(kV), 0.0);
    for (int64_t a = 0; a < kV; ++a)
      for (int64_t b = 0; b < kV; ++b) nx[size_t(b)] += m[size_t(a)] * pi[size_t(a)][size_t(b)];
    marg.push_back(m = nx);
  }
  int n_tests = 0;
  for (int i = 0; i < len; ++i) {
    std::map<int64_t, int64_t> obs;
    std::map<int64_t, double> prob;
    for (const auto& s : run.seqs) ++obs[s[size_t(i)]];
    for (int64_t v = 0; v < kV; ++v) prob[v] = marg[size_t(i)][size_t(v)];
    int df = 0;
    const double x = chi2(obs, prob, n, &df);
    EXPECT_LT(x, chi2_crit(df)) << what << ": position " << i;
    ++n_tests;
  }
  for (int i0 : {0, 4}) {
    std::map<int64_t, int64_t> obs;
    std::map<int64_t, double> prob;
    for (const auto& s : run.seqs) ++obs[(s[size_t(i0)] * kV + s[size_t(i0 + 1)]) * kV + s[size_t(i0 + 2)]];
    const std::vector<double>& m0 = marg[size_t(i0)];
    for (int64_t a = 0; a < kV; ++a)
      for (int64_t b = 0; b < kV; ++b)
        for (int64_t c = 0; c < kV; ++c) prob[(a * kV + b) * kV + c] = m0[size_t(a)] * pi[size_t(a)][size_t(b)] * pi[size_t(b)][size_t(c)];
    int df = 0;
    const double x = chi2(obs, prob, n, &df);
    std::printf("%s: joint of positions %d..%d: chi2 = %.1f, df = %d, crit(1e-3) = %.1f\n", what.c_str(), i0, i0 + 2, x, df,
                chi2_crit(df));
    EXPECT_LT(x, chi2_crit(df)) << what << ": joint at " << i0;
  }
}

constexpr int kSeeds = 100000, kLen = 8;

TEST(DsparkSampling, FullBlocksEmitTheTargetDistribution) {
  MarkovExecutor ex;
  GeneratorOptions opt;
  opt.dspark_verify = kB;
  const SampledRun r = run_sampled(ex, opt, kSeeds, kLen);
  EXPECT_EQ(r.counters.sampled_steps, r.counters.steps);
  EXPECT_GT(r.counters.residual_draws, 0);
  expect_target_distribution(r, "forced L=4");

  // Mean accepted drafts per round against the analytical rate: given the anchor a,
  // P(d_1..d_j accepted) = f_j(a), f_j(a) = sum_v min(pi(v|a), q(v|a)) f_{j-1}(v), f_0 = 1.
  const auto pi = dense_rows(ex.T_, request_params()), q = dense_rows(ex.D_, request_params());
  std::vector<std::vector<double>> f(kB + 1, std::vector<double>(size_t(kV), 1.0));
  for (int j = 1; j <= kB; ++j)
    for (int64_t a = 0; a < kV; ++a) {
      double s = 0;
      for (int64_t v = 0; v < kV; ++v) s += std::min(pi[size_t(a)][size_t(v)], q[size_t(a)][size_t(v)]) * f[size_t(j - 1)][size_t(v)];
      f[size_t(j)][size_t(a)] = s;
    }
  double mean = 0, var = 0;
  for (int32_t a : ex.anchors) {
    double e1 = 0, e2 = 0;
    for (int j = 1; j <= kB; ++j) {
      e1 += f[size_t(j)][size_t(a)];
      e2 += (2 * j - 1) * f[size_t(j)][size_t(a)];
    }
    mean += e1;
    var += e2 - e1 * e1;
  }
  ASSERT_EQ(int64_t(ex.anchors.size()), r.counters.steps);
  const double got = double(r.counters.accepted);
  std::printf("accepted drafts: %.0f over %lld rounds, analytical %.1f +- %.1f (alpha_1 per anchor:", got, (long long)r.counters.steps,
              mean, std::sqrt(var));
  for (int64_t a = 0; a < kV; ++a) std::printf(" %.3f", f[1][size_t(a)]);
  std::printf(")\n");
  EXPECT_NEAR(got, mean, 4.5 * std::sqrt(var));
}

TEST(DsparkSampling, ScheduledLengthsEmitTheTargetDistribution) {
  // A steep cost table: the confidence of each draft (C[prev], depending on the previous draw)
  // decides the length, so the early-stop rule is what keeps this exact.
  MarkovExecutor ex;
  GeneratorOptions opt;
  for (int n = 1; n <= kB + 1; ++n) opt.dspark_verify_sps.push_back(1.0 / (1.0 + 0.45 * (n - 1)));
  const SampledRun r = run_sampled(ex, opt, kSeeds, kLen);
  int lengths = 0;
  for (auto h : r.counters.verify_hist) lengths += h > 0;
  EXPECT_GE(lengths, 3) << "the schedule should vary the verify length";
  std::printf("verify lengths:");
  for (auto h : r.counters.verify_hist) std::printf(" %lld", (long long)h);
  std::printf("\n");
  expect_target_distribution(r, "scheduled");
}

TEST(DsparkSampling, BackOffKeepsTheTargetDistribution) {
  // A steep table and a costly draft block: rounds whose drafts look weak do not pay, and the
  // generator then decodes plainly for 1..8 steps. Whether a round drafts depends on earlier
  // rounds' draws only, so every emitted token still follows the target chain.
  MarkovExecutor ex;
  GeneratorOptions opt;
  for (int n = 1; n <= kB + 1; ++n) opt.dspark_verify_sps.push_back(1.0 / (1.0 + 0.3 * (n - 1)));
  opt.dspark_draft_s = 0.35;
  const SampledRun r = run_sampled(ex, opt, kSeeds, kLen);
  std::printf("back-off: %lld plain steps, %lld rounds\n", (long long)r.counters.backoff_steps, (long long)r.counters.steps);
  EXPECT_GT(r.counters.backoff_steps, r.counters.steps / 4) << "the draft cost should make some rounds back off";
  EXPECT_GT(r.counters.steps, 0);
  expect_target_distribution(r, "back-off");
}

TEST(DsparkSampling, DefaultSampledDraftOfTheInterfaceIsExact) {
  // An executor without its own sampled chain: the interface default cuts the block at the first
  // pick that differs from the greedy chain.
  MarkovExecutor ex(/*own_chain=*/false);
  GeneratorOptions opt;
  opt.dspark_verify = kB;
  const SampledRun r = run_sampled(ex, opt, kSeeds, kLen);
  EXPECT_LT(r.counters.proposals, int64_t(kB) * r.counters.steps);  // some blocks were cut
  expect_target_distribution(r, "interface default");
}

TEST(DsparkSampling, SeededTranscriptsReproduce) {
  MarkovExecutor ex;
  GeneratorOptions opt;
  opt.dspark_verify = kB;
  const SampledRun a = run_sampled(ex, opt, 20, 24), b = run_sampled(ex, opt, 20, 24);
  EXPECT_EQ(a.seqs, b.seqs);
}

TEST(DsparkSampling, GreedyStillEqualsPlain) {
  MarkovExecutor ex;
  GeneratorOptions on, off;
  on.dspark_verify_sps = {1, 0.9, 0.8, 0.7, 0.6};
  off.dspark = false;
  auto gen = [&](const GeneratorOptions& o) {
    Generator g(ex, o);
    EXPECT_TRUE(g.prefill(std::vector<int32_t>{3, 4}).ok());
    SamplingParams sp;
    sp.temperature = 0;
    Rng rng(1);
    std::vector<int32_t> out;
    while (out.size() < 50) EXPECT_TRUE(g.next(sp, rng, &out).ok());
    out.resize(50);
    return out;
  };
  EXPECT_EQ(gen(on), gen(off));
}

// Why sampled rounds use the early-stop rule: with a non-monotone cost table and confidences that
// depend on the previous draft, the arg-max rule verifies d_1 only for some values of d_1 (through
// S_2), which biases the first emitted token; the early-stop rule never looks past d_{j-1}.
TEST(DsparkSampling, ArgmaxLengthWouldBiasSampling) {
  MarkovExecutor ex;
  ex.C_ = {2.0f, -4.0f, 0.5f, -4.0f, 1.0f, 3.0f};  // d_1 in {1, 3} makes S_2 tiny
  const VerifyCostTable cost{{1.0, 0.3, 0.5, 0.5, 0.5}};
  const SamplingParams sp = request_params();
  std::vector<Candidates> pi, q;
  for (int64_t v = 0; v < kV; ++v) {
    pi.push_back(sampling_distribution(ex.T_[size_t(v)].data(), kV, sp));
    q.push_back(sampling_distribution(ex.D_[size_t(v)].data(), kV, sp));
  }
  auto first_token_chi2 = [&](ScheduleRule rule, int* df) {
    const int32_t anchor = 0;
    std::map<int64_t, int64_t> obs;
    const Rng root(77);
    const int n = 100000;
    for (int t = 0; t < n; ++t) {
      Rng dr = root.stream(t, kRngDraftDraw), ar = root.stream(t, kRngAcceptTest), fr = root.stream(t, kRngFinalDraw);
      std::vector<int32_t> chain = {anchor};
      std::vector<Candidates> qs;
      std::vector<float> z;
      for (int k = 1; k <= kB; ++k) {
        z.push_back(ex.C_[size_t(chain.back())]);
        qs.push_back(q[size_t(chain.back())]);
        chain.push_back(draw(qs.back(), dr.uniform()));
      }
      const int L = choose_verify_len(dspark_survival(z), cost, kB, rule);
      const std::vector<int32_t> drafts(chain.begin() + 1, chain.begin() + 1 + L);
      // pi_i judges draft i+1 and follows the token at row i (anchor, then the drafts).
      const SpecVerdict v = speculative_accept(L, [&](int64_t i) -> const Candidates& { return pi[size_t(chain[size_t(i)])]; }, qs,
                                               drafts, ar, fr);
      ++obs[v.accepted > 0 ? drafts[0] : v.next];
    }
    std::map<int64_t, double> prob;
    for (int64_t v = 0; v < kV; ++v) prob[v] = prob_of(pi[size_t(anchor)], int32_t(v));
    return chi2(obs, prob, n, df);
  };
  int df = 0;
  const double biased = first_token_chi2(ScheduleRule::kArgmax, &df);
  EXPECT_GT(biased, 10 * chi2_crit(df));
  const double exact = first_token_chi2(ScheduleRule::kEarlyStop, &df);
  EXPECT_LT(exact, chi2_crit(df));
  std::printf("first token chi2: arg-max rule %.0f, early stop %.1f (df %d, crit %.1f)\n", biased, exact, df, chi2_crit(df));
}

// ---------------------------------------------------------------------------------------------
// Forced acceptance: tokens per round follow the speed model 1 + sum_{j<=L} p^j.

TEST(DsparkHarness, TokensPerRoundFollowTheSpeedModel) {
  MarkovExecutor ex;
  GeneratorOptions opt;
  opt.dspark_verify = kB;
  const std::vector<int32_t> prompt = {2, 5, 1};
  const std::vector<double> ps = {0.0, 0.3, 0.6, 0.9, 1.0};
  auto r = run_forced_acceptance(ex, prompt, 6000, ps, opt, 3);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (const auto& x : *r) {
    std::printf("p=%.1f rounds=%lld tokens/round=%.3f model=%.3f\n", x.p, (long long)x.rounds, x.tokens_per_round,
                x.expected_tokens_per_round);
    EXPECT_TRUE(x.matches_plain) << "p=" << x.p;
    double model = 1, pj = 1;
    for (int j = 1; j <= kB; ++j) model += (pj *= x.p);
    EXPECT_NEAR(x.expected_tokens_per_round, model, 1e-9);
    // Per-round variance of the accepted count is below L^2 / 4.
    EXPECT_NEAR(x.tokens_per_round, model, 4.5 * (kB / 2.0) / std::sqrt(double(x.rounds)) + 1e-9) << "p=" << x.p;
  }
  EXPECT_EQ((*r)[0].tokens_per_round, 1.0);
  EXPECT_EQ((*r)[4].tokens_per_round, 1.0 + kB);
}

TEST(DsparkHarness, ScheduledRoundsUseTheConfidence) {
  // With a steep measured-style table the scheduler reads c = p from the forced confidences:
  // low p -> short verify blocks, high p -> full blocks; the model tracks the chosen lengths.
  MarkovExecutor ex;
  GeneratorOptions opt;
  for (int n = 1; n <= kB + 1; ++n) opt.dspark_verify_sps.push_back(1.0 / (1.0 + 0.2 * (n - 1)));
  const std::vector<int32_t> prompt = {2, 5, 1};
  const std::vector<double> ps = {0.1, 0.95};
  auto r = run_forced_acceptance(ex, prompt, 3000, ps, opt, 4);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)[0].verify_hist[0], (*r)[0].rounds);   // p = 0.1: drafts never pay
  EXPECT_EQ((*r)[1].verify_hist[kB], (*r)[1].rounds);  // p = 0.95: the full block
  for (const auto& x : *r) {
    EXPECT_TRUE(x.matches_plain);
    EXPECT_NEAR(x.tokens_per_round, x.expected_tokens_per_round, 4.5 * (kB / 2.0) / std::sqrt(double(x.rounds)));
  }
}

TEST(DsparkHarness, BackOffDecodesPlainlyWhileDraftsDoNotPay) {
  // A steep table and a draft block costing 0.3 of a step: at p = 0.05 the scheduler verifies
  // nothing, so the generator backs off to plain steps (1, 2, 4, 8, 8, ...); at p = 0.95 every
  // round pays and it never backs off. Greedy output equals plain decoding either way.
  MarkovExecutor ex;
  GeneratorOptions opt;
  for (int n = 1; n <= kB + 1; ++n) opt.dspark_verify_sps.push_back(1.0 / (1.0 + 0.2 * (n - 1)));
  opt.dspark_draft_s = 0.3;
  const std::vector<int32_t> prompt = {2, 5, 1};
  const std::vector<double> ps = {0.05, 0.95};
  auto r = run_forced_acceptance(ex, prompt, 400, ps, opt, 5);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const auto& low = (*r)[0];
  const auto& high = (*r)[1];
  EXPECT_TRUE(low.matches_plain);
  EXPECT_TRUE(high.matches_plain);
  // Every round at p = 0.05 is followed by up to 8 plain steps: rounds ~ 400 / 9.
  EXPECT_GT(low.backoff_steps, 300);
  EXPECT_LT(low.rounds, 60);
  EXPECT_EQ(high.backoff_steps, 0);
  // Without back-off every token costs a round.
  opt.dspark_max_backoff = 0;
  auto r0 = run_forced_acceptance(ex, prompt, 400, std::vector<double>{0.05}, opt, 5);
  ASSERT_TRUE(r0.ok());
  EXPECT_EQ((*r0)[0].backoff_steps, 0);
  EXPECT_GT((*r0)[0].rounds, 350);
  EXPECT_TRUE((*r0)[0].matches_plain);
}

}  // namespace
}  // namespace fb::engine
