// Our deterministic transcendentals stay within a few ulp of libm over their working ranges.
#include "base/fmath.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace fb {
namespace {

double ulp_err(float got, double want) {
  if (want == 0) return got == 0 ? 0 : 1e9;
  int e;
  std::frexp(want, &e);
  return std::fabs(double(got) - want) / std::ldexp(1.0, e - 24);
}

TEST(Fmath, ExpAccuracy) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-87.0f, 88.0f);
  double worst = 0;
  for (int i = 0; i < 400000; ++i) {
    float x = u(rng);
    worst = std::max(worst, ulp_err(fm::exp(x), std::exp(double(x))));
  }
  EXPECT_LT(worst, 3.0);
  EXPECT_EQ(fm::exp(0.0f), 1.0f);
  EXPECT_EQ(fm::exp(-INFINITY), 0.0f);
  EXPECT_TRUE(std::isinf(fm::exp(100.0f)));
  EXPECT_GT(fm::exp(-100.0f), 0.0f);  // subnormal result
  EXPECT_LT(ulp_err(fm::exp(-100.0f), std::exp(-100.0)), 1e6);  // subnormal: absolute error tiny
}

TEST(Fmath, Log1pAndSoftplus) {
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(-30.0f, 30.0f);
  double worst = 0;
  for (int i = 0; i < 200000; ++i) {
    float y = std::exp(u(rng));
    worst = std::max(worst, ulp_err(fm::log1p(y), std::log1p(double(y))));
  }
  EXPECT_LT(worst, 4.0);
  EXPECT_EQ(fm::softplus(25.0f), 25.0f);
  EXPECT_NEAR(fm::softplus(0.0f), std::log(2.0f), 1e-7f);
}

TEST(Fmath, CanonicalSumsAreOrderDefined) {
  // lanes32 differs from a sequential sum in general; check the lane assignment on a case where
  // only one lane is populated (then the sum is that lane's sequential sum).
  float v[64];
  for (int i = 0; i < 64; ++i) v[i] = (i % 32) < 8 ? float(i) : 0.0f;
  float s = fm::lanes32_sum(64, [&](int64_t k) { return v[k]; });
  EXPECT_EQ(s, 0 + 1 + 2 + 3 + 4 + 5 + 6 + 7 + 32 + 33 + 34 + 35 + 36 + 37 + 38 + 39);
  // blocks16: scale applied per block
  float b = fm::blocks16_sum(2, [&](int64_t k) { return 1.0f; }, [&](int64_t blk) { return blk == 0 ? 1.0f : 2.0f; });
  EXPECT_EQ(b, 32.0f + 64.0f);
}

}  // namespace
}  // namespace fb
