// Sampling pipeline (spec/16 §2): greedy ties, temperature, top-k, top-p, min-p, seeded
// reproducibility, empirical frequencies against the processed distribution; the speculative
// acceptance rule (spec/13 §6.2) against its target distributions and the analytical acceptance
// rate; stop strings. Statistical tests use fixed seeds: deterministic, they cannot flake.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <vector>

#include "engine/sampler.h"
#include "engine/stop_strings.h"

namespace fb::engine {
namespace {

TEST(Sampler, GreedyTiesGoToLowestId) {
  const float z[] = {1.0f, 3.0f, 2.0f, 3.0f, NAN};
  EXPECT_EQ(argmax(z, 5), 1);
  SamplingParams p;
  p.temperature = 0;
  Rng rng(1);
  EXPECT_EQ(sample(z, 5, p, rng), 1);
  const float nan_first[] = {NAN, -1.0f, -1.0f};
  EXPECT_EQ(argmax(nan_first, 3), 1);
}

// Logit processing (OpenAI semantics): bias added to the raw logit; presence subtracted once per
// generated id, frequency times its count; `extra` tokens count as generated; untouched otherwise.
TEST(Sampler, LogitBiasAndPenalties) {
  const std::vector<float> x = {1.0f, 2.0f, 3.0f, 4.0f};
  SamplingParams p;
  std::vector<float> out;
  process_logits(x.data(), 4, p, {}, {}, &out);
  EXPECT_EQ(out, x);
  EXPECT_FALSE(p.processes_logits());
  p.logit_bias = {{0, 10.0f}, {3, -100.0f}, {99, 5.0f}};  // an id outside the row is ignored here (the server rejects it)
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  GeneratedTokens counts;
  counts.counts = {{1, 2}, {2, 0}};
  const int32_t extra[] = {1, 2};
  process_logits(x.data(), 4, p, counts, extra, &out);
  EXPECT_FLOAT_EQ(out[0], 11.0f);
  EXPECT_FLOAT_EQ(out[1], 2.0f - 0.5f - 0.25f * 3);  // generated twice before, once more in `extra`
  EXPECT_FLOAT_EQ(out[2], 3.0f - 0.5f - 0.25f * 1);
  EXPECT_FLOAT_EQ(out[3], -96.0f);
  EXPECT_EQ(argmax(out.data(), 4), 0);
  EXPECT_EQ(counts.counts.at(1), 2) << "extra must not change the caller's counts";
}

// Phrase bias (issue 27): the token continuing a phrase is biased where the generated tokens (the
// request's, then `extra`) end with a proper prefix of it; the first token alone is not; a
// one-token phrase is biased everywhere; each continuation once per phrase; phrases add up.
TEST(Sampler, PhraseBiasFollowsTheGeneratedPrefix) {
  const std::vector<float> x(8, 0.0f);
  SamplingParams p;
  p.phrase_bias = {{{1, 2, 3}, -5.0f}};
  EXPECT_TRUE(p.processes_logits());
  std::vector<float> out;
  auto row = [&](std::vector<int32_t> gen_ids, std::vector<int32_t> extra) {
    GeneratedTokens g;
    for (int32_t t : gen_ids) g.add(t);
    process_logits(x.data(), 8, p, g, extra, &out);
    return out;
  };
  auto only = [](std::vector<std::pair<int, float>> set) {
    std::vector<float> v(8, 0.0f);
    for (auto [i, b] : set) v[size_t(i)] = b;
    return v;
  };
  EXPECT_EQ(row({}, {}), only({})) << "nothing generated: the first token is not biased";
  EXPECT_EQ(row({7, 1}, {}), only({{2, -5.0f}}));
  EXPECT_EQ(row({1, 2}, {}), only({{3, -5.0f}}));
  EXPECT_EQ(row({1}, {2}), only({{3, -5.0f}})) << "a prefix across the generated tokens and extra";
  EXPECT_EQ(row({}, {1, 2}), only({{3, -5.0f}}));
  EXPECT_EQ(row({1, 3}, {}), only({})) << "3 after 1 breaks the prefix";
  EXPECT_EQ(row({1, 2, 3}, {}), only({})) << "a whole phrase: nothing left to continue";
  // Self-overlapping phrase 4 4 4 5: after "4 4" both k=1 and k=2 continue with 4 (biased once);
  // after "4 4 4" k=3 continues with 5 and k=1, 2 with 4.
  p.phrase_bias = {{{4, 4, 4, 5}, 2.0f}};
  EXPECT_EQ(row({4, 4}, {}), only({{4, 2.0f}}));
  EXPECT_EQ(row({4, 4, 4}, {}), only({{4, 2.0f}, {5, 2.0f}}));
  // One-token phrase: everywhere, like logit_bias; two phrases continuing with the same token add.
  p.phrase_bias = {{{6}, 1.5f}, {{1, 2}, -1.0f}, {{0, 2}, -2.0f}};
  EXPECT_EQ(row({}, {}), only({{6, 1.5f}}));
  EXPECT_EQ(row({0}, {}), only({{6, 1.5f}, {2, -2.0f}}));
  p.phrase_bias.push_back({{0, 2, 9}, -4.0f});  // an id outside the row is ignored here (the server checks ids)
  EXPECT_EQ(row({0}, {}), only({{6, 1.5f}, {2, -6.0f}}));
  EXPECT_EQ(row({0, 2}, {}), only({{6, 1.5f}}));
}

// Cost of phrase bias per row on the released vocabulary (129,280): 256 phrases of 16 tokens, 200
// generated tokens ending in a prefix of each (the worst case: every phrase matches at every k).
// Printed for the history; the bound only catches a pathological slowdown.
TEST(Sampler, PhraseBiasCostPerRow) {
  const int64_t n = 129280;
  std::vector<float> x(size_t(n), 0.5f), out;
  SamplingParams p;
  for (int i = 0; i < 256; ++i) p.phrase_bias.push_back({std::vector<int32_t>(16, 1000), -3.0f});
  GeneratedTokens g;
  for (int i = 0; i < 200; ++i) g.add(1000);
  process_logits(x.data(), n, p, g, {}, &out);
  const int reps = 50;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) process_logits(x.data(), n, p, g, {}, &out);
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
  SamplingParams none;
  none.logit_bias = {{5, 1.0f}};
  const auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) process_logits(x.data(), n, none, g, {}, &out);
  const double copy_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t1).count() / reps;
  std::printf("phrase bias: 256 phrases x 16 tokens, worst-case match: %.1f us per row (the row copy with logit_bias alone: %.1f us)\n", us, copy_us);
  EXPECT_FLOAT_EQ(out[5], 1.5f);
  EXPECT_LT(us, 50000.0);
}

TEST(Sampler, TemperatureSoftmax) {
  const float z[] = {0.0f, std::log(3.0f)};
  SamplingParams p;
  p.temperature = 1.0f;
  auto c = sampling_distribution(z, 2, p);
  ASSERT_EQ(c.ids.size(), 2u);
  EXPECT_NEAR(c.probs[0], 0.25, 1e-6);
  EXPECT_NEAR(c.probs[1], 0.75, 1e-6);
  p.temperature = 2.0f;  // p ~ sqrt(3) : 1
  c = sampling_distribution(z, 2, p);
  EXPECT_NEAR(c.probs[1], std::sqrt(3.0) / (1 + std::sqrt(3.0)), 1e-7);
}

TEST(Sampler, TopKKeepsLargestWithLowIdTies) {
  const float z[] = {1, 5, 3, 5, 2};
  SamplingParams p;
  p.top_k = 2;
  auto c = sampling_distribution(z, 5, p);
  EXPECT_EQ(c.ids, (std::vector<int32_t>{1, 3}));
  EXPECT_NEAR(c.probs[0], 0.5, 1e-12);
}

TEST(Sampler, TopPShortestPrefix) {
  // probs 0.5, 0.3, 0.2 (as logits of their logs)
  const float z[] = {std::log(0.2f), std::log(0.5f), std::log(0.3f)};
  SamplingParams p;
  p.top_p = 0.75f;
  auto c = sampling_distribution(z, 3, p);
  EXPECT_EQ(c.ids, (std::vector<int32_t>{1, 2}));  // 0.5 + 0.3 >= 0.75
  EXPECT_NEAR(c.probs[0], 0.5 / 0.8, 1e-5);
  p.top_p = 0.4f;  // the first token alone already covers it
  c = sampling_distribution(z, 3, p);
  EXPECT_EQ(c.ids, (std::vector<int32_t>{1}));
}

TEST(Sampler, MinPRelativeToTop) {
  const float z[] = {std::log(0.6f), std::log(0.3f), std::log(0.1f)};
  SamplingParams p;
  p.min_p = 0.2f;  // threshold 0.12: drops 0.1
  auto c = sampling_distribution(z, 3, p);
  EXPECT_EQ(c.ids, (std::vector<int32_t>{0, 1}));
  EXPECT_NEAR(c.probs[0], 0.6 / 0.9, 1e-6);
}

TEST(Sampler, SeededDrawsReproduceAndMatchDistribution) {
  std::vector<float> z = {0.0f, 1.0f, 2.0f, -1.0f, 0.5f};
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 4;
  p.top_p = 0.95f;
  const auto c = sampling_distribution(z.data(), 5, p);
  Rng a(42), b(42), d(43);
  std::vector<int32_t> sa, sb, sd;
  for (int i = 0; i < 64; ++i) {
    sa.push_back(sample(z.data(), 5, p, a));
    sb.push_back(sample(z.data(), 5, p, b));
    sd.push_back(sample(z.data(), 5, p, d));
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sd);
  // Chi-square against the processed distribution.
  const int n = 200000;
  std::map<int32_t, int> count;
  Rng r(7);
  for (int i = 0; i < n; ++i) ++count[sample(z.data(), 5, p, r)];
  double chi2 = 0;
  for (size_t i = 0; i < c.ids.size(); ++i) {
    const double e = c.probs[i] * n;
    const double o = count[c.ids[i]];
    chi2 += (o - e) * (o - e) / e;
    count.erase(c.ids[i]);
  }
  EXPECT_TRUE(count.empty()) << "sampled an id outside the kept set";
  EXPECT_LT(chi2, 20.0);  // df <= 4: p < 0.001
}

TEST(Sampler, RawLogprobs) {
  const float z[] = {0.0f, std::log(3.0f), -INFINITY};
  auto t = token_logprob(z, 3, 1, 2);
  EXPECT_NEAR(t.logprob, std::log(0.75), 1e-6);
  ASSERT_EQ(t.top.size(), 2u);
  EXPECT_EQ(t.top[0].first, 1);
  EXPECT_EQ(t.top[1].first, 0);
}

// Upper 1e-3 quantile of chi-square with df degrees of freedom (Wilson-Hilferty).
double chi2_crit(int df) {
  const double z = 3.090, k = double(df);
  const double t = 1.0 - 2.0 / (9.0 * k) + z * std::sqrt(2.0 / (9.0 * k));
  return k * t * t * t;
}

// Pearson statistic of counts against a distribution over ids 0..V-1; returns df via *df.
double chi2_of(const std::vector<int64_t>& counts, const std::vector<double>& probs, int* df) {
  int64_t n = 0;
  for (auto c : counts) n += c;
  double x = 0;
  *df = -1;
  for (size_t v = 0; v < probs.size(); ++v) {
    const double e = probs[v] * double(n);
    if (e == 0) {
      EXPECT_EQ(counts[v], 0) << "drew id " << v << " of probability 0";
      continue;
    }
    x += (double(counts[v]) - e) * (double(counts[v]) - e) / e;
    ++*df;
  }
  return x;
}

std::vector<double> dense(const Candidates& c, int64_t V) {
  std::vector<double> d(size_t(V), 0.0);
  for (size_t i = 0; i < c.ids.size(); ++i) d[size_t(c.ids[i])] = c.probs[i];
  return d;
}

Candidates dist_of(const std::vector<float>& z, const SamplingParams& sp) { return sampling_distribution(z.data(), int64_t(z.size()), sp); }

// A block of L = 3 verify rows with fixed (position-independent) target rows pi_0..pi_3 and
// draft rows q_1..q_3 over 7 ids, processed with temperature, top-k and top-p like a request.
struct Block {
  static constexpr int64_t V = 7, L = 3;
  SamplingParams sp;
  std::vector<Candidates> pi, q;
  Block() {
    sp.temperature = 0.9f;
    sp.top_k = 6;
    sp.top_p = 0.97f;
    const std::vector<std::vector<float>> zt = {{1.0f, 0.2f, -0.5f, 2.0f, 0.0f, -1.0f, 0.7f},
                                                {0.1f, 1.5f, 0.3f, -0.2f, 0.9f, -2.0f, 0.0f},
                                                {-1.0f, 0.0f, 2.2f, 0.4f, 0.4f, 1.0f, -0.3f},
                                                {0.5f, 0.5f, 0.5f, 1.5f, -1.0f, 0.0f, 0.2f}};
    const std::vector<std::vector<float>> zd = {{0.6f, 0.9f, -0.5f, 1.2f, 0.4f, 0.3f, 0.0f},
                                                {0.0f, 1.9f, -0.4f, 0.2f, 0.2f, 0.1f, 1.0f},
                                                {-0.5f, 0.5f, 1.0f, 1.4f, 0.0f, 0.8f, -1.0f}};
    for (auto& z : zt) pi.push_back(dist_of(z, sp));
    for (auto& z : zd) q.push_back(dist_of(z, sp));
  }
  double overlap(int64_t k) const {  // sum_v min(pi_{k-1}(v), q_k(v))
    const auto a = dense(pi[size_t(k - 1)], V), b = dense(q[size_t(k - 1)], V);
    double s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::min(a[size_t(v)], b[size_t(v)]);
    return s;
  }
};

// Runs n blocks; slot[j] counts the j-th emitted token (j = 0..L) where it exists.
struct BlockStats {
  std::vector<std::vector<int64_t>> slot;
  std::vector<int64_t> reached;  // blocks with a >= k, k = 0..L
};
template <class Rule>
BlockStats run_blocks(const Block& b, int n, Rule rule) {
  BlockStats st;
  st.slot.assign(size_t(Block::L + 1), std::vector<int64_t>(size_t(Block::V), 0));
  st.reached.assign(size_t(Block::L + 1), 0);
  const Rng root(2024);
  for (int t = 0; t < n; ++t) {
    Rng dr = root.stream(t, kRngDraftDraw), ar = root.stream(t, kRngAcceptTest), fr = root.stream(t, kRngFinalDraw);
    std::vector<int32_t> d;
    for (int64_t k = 0; k < Block::L; ++k) d.push_back(draw(b.q[size_t(k)], dr.uniform()));
    const SpecVerdict v = rule(d, ar, fr);
    for (int64_t j = 0; j < v.accepted; ++j) ++st.slot[size_t(j)][size_t(d[size_t(j)])];
    ++st.slot[size_t(v.accepted)][size_t(v.next)];
    for (int64_t k = 0; k <= v.accepted; ++k) ++st.reached[size_t(k)];
  }
  return st;
}

TEST(SpeculativeSampling, EmittedTokensFollowTheTarget) {
  const Block b;
  const int n = 200000;
  const BlockStats st = run_blocks(b, n, [&](const std::vector<int32_t>& d, Rng& ar, Rng& fr) {
    return speculative_accept(Block::L, [&](int64_t i) -> const Candidates& { return b.pi[size_t(i)]; }, b.q, d, ar, fr);
  });
  // Slot j exists when the first j drafts were accepted; given that, it is distributed as pi_j
  // (the rows are independent of the drafts here).
  for (int64_t j = 0; j <= Block::L; ++j) {
    int df = 0;
    const double x = chi2_of(st.slot[size_t(j)], dense(b.pi[size_t(j)], Block::V), &df);
    std::printf("slot %lld: n=%lld chi2=%.2f df=%d crit=%.2f\n", (long long)j, (long long)st.reached[size_t(j)], x, df, chi2_crit(df));
    EXPECT_LT(x, chi2_crit(df)) << "slot " << j;
  }
  // Acceptance: P(d_k accepted | d_1..d_{k-1} accepted) = sum_v min(pi_{k-1}(v), q_k(v)).
  for (int64_t k = 1; k <= Block::L; ++k) {
    const double m = double(st.reached[size_t(k - 1)]), got = double(st.reached[size_t(k)]) / m, want = b.overlap(k);
    std::printf("accept %lld: rate %.5f analytical %.5f (n=%.0f)\n", (long long)k, got, want, m);
    EXPECT_NEAR(got, want, 4.5 * std::sqrt(want * (1 - want) / m)) << "draft " << k;
  }
}

TEST(SpeculativeSampling, TheChiSquareTestHasPower) {
  // Accepting with probability pi(d) (forgetting q) is a classic bug: the test must catch it.
  const Block b;
  const BlockStats st = run_blocks(b, 200000, [&](const std::vector<int32_t>& d, Rng& ar, Rng& fr) {
    SpecVerdict v;
    while (v.accepted < Block::L && ar.uniform() < prob_of(b.pi[size_t(v.accepted)], d[size_t(v.accepted)])) ++v.accepted;
    v.next = v.accepted == Block::L ? draw(b.pi[size_t(Block::L)], fr.uniform())
                                    : draw(residual_distribution(b.pi[size_t(v.accepted)], b.q[size_t(v.accepted)]), fr.uniform());
    return v;
  });
  int df = 0;
  const double x = chi2_of(st.slot[0], dense(b.pi[0], Block::V), &df);
  EXPECT_GT(x, 10 * chi2_crit(df));
}

TEST(SpeculativeSampling, DeterministicProposalIsExact) {
  // Greedy drafts under a sampled request (spec/13 §6.2): q one-hot at d, accept w.p. pi(d), on
  // rejection draw from pi without d.
  Block b;
  for (int64_t k = 0; k < Block::L; ++k) {
    const int32_t top = b.q[size_t(k)].ids[0];
    b.q[size_t(k)] = Candidates{{top}, {1.0}};
  }
  const BlockStats st = run_blocks(b, 100000, [&](const std::vector<int32_t>& d, Rng& ar, Rng& fr) {
    return speculative_accept(Block::L, [&](int64_t i) -> const Candidates& { return b.pi[size_t(i)]; }, b.q, d, ar, fr);
  });
  for (int64_t j = 0; j <= Block::L; ++j) {
    int df = 0;
    const double x = chi2_of(st.slot[size_t(j)], dense(b.pi[size_t(j)], Block::V), &df);
    EXPECT_LT(x, chi2_crit(df)) << "slot " << j;
  }
  EXPECT_NEAR(double(st.reached[1]) / 100000, b.overlap(1), 0.01);
}

TEST(SpeculativeSampling, ResidualEdgeCasesAndStreams) {
  const Candidates pi{{0, 2, 5}, {0.5, 0.3, 0.2}};
  const Candidates same{{5, 0, 2}, {0.2, 0.5, 0.3}};  // equal to pi, another order
  Candidates r = residual_distribution(pi, same);
  EXPECT_EQ(r.ids, pi.ids);  // empty residual: fall back to pi
  const Candidates q{{2, 7}, {0.9, 0.1}};
  r = residual_distribution(pi, q);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 5}));
  EXPECT_NEAR(r.probs[0], 0.5 / 0.7, 1e-12);
  // Streams: reproducible, and distinct across positions and purposes.
  const Rng a(9), b(9);
  EXPECT_EQ(a.stream(100, kRngAcceptTest).stream(0, 0).next_u64(), b.stream(100, kRngAcceptTest).stream(0, 0).next_u64());
  Rng x = a.stream(100, kRngAcceptTest), y = a.stream(101, kRngAcceptTest), z = a.stream(100, kRngFinalDraw), w = Rng(10).stream(100, kRngAcceptTest);
  const uint64_t vx = x.next_u64();
  EXPECT_NE(vx, y.next_u64());
  EXPECT_NE(vx, z.next_u64());
  EXPECT_NE(vx, w.next_u64());
}

TEST(StopStrings, MatchAcrossChunks) {
  StopStrings s({"END", "x"});
  std::string out;
  out += s.feed("hello E");
  EXPECT_EQ(out, "hello ");  // "E" held: could start "END"
  out += s.feed("N");
  EXPECT_EQ(out, "hello ");
  out += s.feed("D and more");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(out, "hello ");
  EXPECT_EQ(s.matched(), "END");
  EXPECT_EQ(s.feed("ignored"), "");
}

TEST(StopStrings, DivergenceReleasesHeldText) {
  StopStrings s({"<stop>"});
  std::string out = s.feed("a<st");
  EXPECT_EQ(out, "a");
  out += s.feed("ep>");
  EXPECT_EQ(out, "a<step>");
  out += s.feed("<s");
  out += s.finish();
  EXPECT_EQ(out, "a<step><s");
  EXPECT_FALSE(s.stopped());
}

TEST(StopStrings, EarliestMatchWins) {
  StopStrings s({"bc", "abcd"});
  EXPECT_EQ(s.feed("xabcd"), "x");
  EXPECT_EQ(s.matched(), "abcd");
  StopStrings none({});
  EXPECT_EQ(none.feed("abc"), "abc");
}

}  // namespace
}  // namespace fb::engine
