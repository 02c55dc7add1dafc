// The register-streamed GEMVs' weight layout (cuda/rs_layout.h) on the host: every (row, k) of a
// unit is held by exactly one (lane, byte or code), and the MXFP4 words decode, pair by pair, to
// the f16 of each e2m1 code times 2^-14 for every code in every position. No device needed.
#include "cuda/rs_layout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace fb::cuda::rs {
namespace {

float f16_to_f32(uint16_t h) {
  const uint32_t s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
  float v;
  if (e == 0) v = std::ldexp(float(m), -24);
  else if (e == 31) v = m ? NAN : INFINITY;
  else v = std::ldexp(float(m + 1024), int(e) - 25);
  return s ? -v : v;
}

float e2m1(uint8_t c) {
  static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  return (c & 8) ? -mag[c & 7] : mag[c & 7];
}

TEST(RsLayout, Fp4FragmentsCoverTheUnitOnce) {
  std::vector<int> seen(kStripe * kStepK, 0);
  for (int lane = 0; lane < 32; ++lane)
    for (int q = 0; q < 4; ++q)
      for (int p = 0; p < 4; ++p)
        for (int which = 0; which < 2; ++which) {
          const Src s = fragment_src(lane, q, p, which);
          ASSERT_TRUE(s.row >= 0 && s.row < kStripe && s.k >= 0 && s.k < kStepK);
          ++seen[size_t(s.row * kStepK + s.k)];
        }
  for (int v : seen) EXPECT_EQ(v, 1);
  // 32 lanes x 4 words x 8 codes = the unit's 1,024 values in 512 bytes
  EXPECT_EQ(32 * 4 * 8 / 2, kFp4UnitBytes);
}

TEST(RsLayout, Fp8BytesCoverTheUnitOnce) {
  std::vector<int> seen(kStripe * kStepK, 0);
  for (int lane = 0; lane < 32; ++lane)
    for (int b = 0; b < 32; ++b) {
      const Src s = fp8_byte_src(lane, b);
      ASSERT_TRUE(s.row >= 0 && s.row < kStripe && s.k >= 0 && s.k < kStepK);
      ++seen[size_t(s.row * kStepK + s.k)];
    }
  for (int v : seen) EXPECT_EQ(v, 1);
  EXPECT_EQ(32 * 32, kFp8UnitBytes);
}

// The pairs of a word are the mma's f16 A registers: low half first value, high half second.
TEST(RsLayout, Fp4WordsDecodeToEveryCodeTimesTwoToTheMinus14) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200000; ++trial) {
    uint8_t codes[8];
    for (auto& c : codes) c = uint8_t(rng() & 15);
    if (trial < 16)  // every code in every position at least once
      for (int i = 0; i < 8; ++i) codes[i] = uint8_t((trial + i) & 15);
    const uint32_t w = fp4_pack_word(codes);
    for (int p = 0; p < 4; ++p) {
      const uint32_t h = fp4_pair_f16x2(w, p);
      for (int which = 0; which < 2; ++which) {
        const uint16_t half = uint16_t(which ? h >> 16 : h & 0xFFFF);
        const float got = f16_to_f32(half) * 16384.0f, want = e2m1(codes[2 * p + which]);
        ASSERT_EQ(got, want) << "code " << int(codes[2 * p + which]) << " pair " << p << " value " << which;
        ASSERT_EQ(std::signbit(got), std::signbit(want)) << "the sign of zero";
      }
    }
  }
}

// The eight codes' bits are disjoint in a word (the packing loses nothing): 0xF.. codes fill it.
TEST(RsLayout, Fp4WordBitsAreDisjoint) {
  uint32_t all = 0;
  for (int i = 0; i < 8; ++i) {
    uint8_t codes[8] = {};
    codes[i] = 15;
    const uint32_t w = fp4_pack_word(codes);
    EXPECT_EQ(__builtin_popcount(w), 4);
    EXPECT_EQ(all & w, 0u);
    all |= w;
  }
  EXPECT_EQ(all, 0xFFFFFFFFu);
}

TEST(RsLayout, Fp4ScaleBytes) {
  std::vector<int> seen(kStripe * 2, 0);
  for (int g = 0; g < 8; ++g)
    for (int j = 0; j < 4; ++j) ++seen[size_t(fp4_scale_row(g, j) * 2 + fp4_scale_block(j))];
  for (int v : seen) EXPECT_EQ(v, 1);
}

}  // namespace
}  // namespace fb::cuda::rs
