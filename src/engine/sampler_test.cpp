// Sampling pipeline (spec/16 §2): greedy ties, temperature, top-k, top-p, min-p, seeded
// reproducibility, empirical frequencies against the processed distribution; stop strings.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

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
