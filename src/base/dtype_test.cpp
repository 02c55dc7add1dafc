// Exhaustive checks of the number formats against independent formulas (brute-force nearest
// value search, ldexp decoding), over every code and every bf16 input.
#include "base/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace fb {
namespace {

// Independent e4m3 decode: by the OCP definition, using integer arithmetic on the fields.
double e4m3_ref(int code) {
  int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return NAN;
  double v = e == 0 ? std::ldexp(double(m), -9) : std::ldexp(double(8 + m), e - 10);
  return s ? -v : v;
}

TEST(Bf16, RoundTripEveryCode) {
  for (uint32_t b = 0; b < 65536; ++b) {
    float f = bf16_to_f32(uint16_t(b));
    if (std::isnan(f)) {
      EXPECT_EQ(bf16_bits_from_f32(f), 0x7FC0);
    } else {
      EXPECT_EQ(bf16_bits_from_f32(f), b) << b;
    }
  }
}

TEST(Bf16, RoundToNearestEvenAgainstNeighbours) {
  std::mt19937 rng(1);
  for (int i = 0; i < 2000000; ++i) {
    float f = f32_from_bits(rng());
    if (std::isnan(f)) continue;
    uint16_t got = bf16_bits_from_f32(f);
    // Independent: the two bf16 candidates bracketing f (truncation and next), nearest wins,
    // ties to the even code; beyond the largest finite value RNE gives infinity.
    uint32_t u = bits_from_f32(f);
    uint16_t lo = uint16_t(u >> 16), hi = uint16_t(lo + 1);
    double dlo = std::fabs(double(bf16_to_f32(lo)) - f);
    double dhi = std::fabs(double(bf16_to_f32(hi)) - f);
    uint16_t want;
    if ((u & 0xFFFF) == 0) want = lo;
    else if ((lo & 0x7FFF) == 0x7F7F && (u & 0xFFFF) >= 0x8000) want = hi;  // overflow to inf
    else if (dlo < dhi) want = lo;
    else if (dhi < dlo) want = hi;
    else want = (lo & 1) ? hi : lo;
    ASSERT_EQ(got, want) << f;
  }
}

TEST(E4M3, DecodeEveryCode) {
  for (int c = 0; c < 256; ++c) {
    double want = e4m3_ref(c);
    float got = e4m3_to_f32(uint8_t(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(double(got), want) << c;
      EXPECT_EQ(std::signbit(got), bool(c & 0x80)) << c;
    }
  }
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), 0x1p-9f);
}

// Brute force: nearest finite e4m3 value, ties to the even code, saturating at 448.
uint8_t e4m3_brute(float f) {
  if (std::isnan(f)) return std::signbit(f) ? 0xFF : 0x7F;
  int best = -1;
  double best_d = INFINITY;
  for (int c = 0; c < 128; ++c) {  // magnitudes
    double v = e4m3_ref(c);
    if (std::isnan(v)) continue;
    double d = std::fabs(v - std::fabs(double(f)));
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best_d = d;
      best = c;
    }
  }
  return uint8_t(best | (std::signbit(f) ? 0x80 : 0));
}

TEST(E4M3, EncodeEveryBf16Input) {
  for (uint32_t b = 0; b < 65536; ++b) {
    float f = bf16_to_f32(uint16_t(b));
    uint8_t got = e4m3_from_f32(f);
    uint8_t want = e4m3_brute(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(e4m3_to_f32(got)));
      continue;
    }
    ASSERT_EQ(got, want) << "input " << f << " bits " << b;
  }
}

TEST(E4M3, EncodeRandomF32) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-600.0f, 600.0f);
  std::uniform_int_distribution<int> ex(-14, 9);
  for (int i = 0; i < 300000; ++i) {
    float f = std::ldexp(u(rng) / 600.0f, ex(rng));
    ASSERT_EQ(e4m3_from_f32(f), e4m3_brute(f)) << f;
  }
  EXPECT_EQ(e4m3_from_f32(INFINITY), 0x7E);
  EXPECT_EQ(e4m3_from_f32(-1e9f), 0xFE);
  EXPECT_EQ(e4m3_from_f32(-0.0f), 0x80);
  EXPECT_EQ(e4m3_from_f32(-0x1p-11f), 0x80);  // rounds to -0, sign kept (spec/11 §1.4)
}

TEST(E8M0, EveryCode) {
  for (int c = 0; c < 255; ++c) {
    float v = e8m0_to_f32(uint8_t(c));
    EXPECT_EQ(double(v), std::ldexp(1.0, c - 127)) << c;
    EXPECT_EQ(e8m0_from_pow2(v), c);
  }
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xFF)));
}

TEST(E2M1, DecodeEveryCode) {
  const double mags[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    float v = e2m1_to_f32(uint8_t(c));
    EXPECT_EQ(std::fabs(double(v)), mags[c & 7]);
    EXPECT_EQ(std::signbit(v), bool(c & 8));
  }
}

TEST(E2M1, EncodeEveryBf16InRangeAgainstBruteForce) {
  const double mags[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (uint32_t b = 0; b < 65536; ++b) {
    float f = bf16_to_f32(uint16_t(b));
    if (!(std::fabs(f) <= 6.0f)) continue;
    int best = 0;
    double bd = INFINITY;
    for (int m = 0; m < 8; ++m) {
      double d = std::fabs(mags[m] - std::fabs(double(f)));
      if (d < bd || (d == bd && (m & 1) == 0)) {
        bd = d;
        best = m;
      }
    }
    uint8_t want = uint8_t(best | (std::signbit(f) ? 8 : 0));
    ASSERT_EQ(e2m1_from_f32(f), want) << f;
  }
}

TEST(E2M1, NibbleOrder) {
  const uint8_t packed[2] = {0x21, 0xF8};  // elements: 1, 2, 8, 15
  EXPECT_EQ(e2m1_code_at(packed, 0), 1);
  EXPECT_EQ(e2m1_code_at(packed, 1), 2);
  EXPECT_EQ(e2m1_code_at(packed, 2), 8);
  EXPECT_EQ(e2m1_code_at(packed, 3), 15);
}

TEST(DType, NamesRoundTrip) {
  for (const char* n : {"BF16", "F32", "F8_E4M3", "F8_E8M0", "I8", "I64"}) {
    DType t;
    ASSERT_TRUE(parse_dtype(n, &t));
    EXPECT_STREQ(dtype_name(t), n);
  }
  DType t;
  EXPECT_FALSE(parse_dtype("F8_E5M2", &t));
}

}  // namespace
}  // namespace fb
