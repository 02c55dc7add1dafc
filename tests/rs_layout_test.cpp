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

namespace fb::cuda::rs {
namespace {

// ---- the MXFP4 kernel's data flow, emulated lane by lane on the host ----------------------------
// A second reading of rs_gemv.cu's rs_pack_fp4_kernel, rs_pack_fp4_scales_kernel, stage_rows and
// fp4_warp/fp4_step (their index arithmetic ported as written), with mma.m16n8k16 evaluated from
// the PTX fragment layout (A row-major: a0 (g, 2t..), a1 (g + 8, 2t..), a2 (g, 2t + 8..), a3 (g + 8,
// 2t + 8..); B: b0 (k 2t.., n g), b1 (k 2t + 8.., n g); D: d0 (g, 2t), d1 (g, 2t + 1), d2 (g + 8,
// 2t), d3 (g + 8, 2t + 1)). Catches a packing, staging or scale-byte mismatch without a GPU.

float e4m3_val(uint8_t c) {
  const int e = (c >> 3) & 15, m = c & 7;
  const float v = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(1.0f + float(m) / 8.0f, e - 7);
  return (c & 0x80) ? -v : v;
}

// rs_gemv.cu's stage_rows as it runs: per 16-code piece (row r, step j, mma q) its four words of
// code pairs stored at word offsets 0, 8, 16, 24 (h 0; t 0..3) and 1, 9, 17, 25 (h 1) from
// r * steps * 32 + 32 j + 2 q. Two floats per word (the f16 pair; every e4m3 value is exact in
// f16). The kernels' reading of a word w = ((j * 4 + t) * 4 + q) * 2 + h as k = 64 j + 16 q +
// 8 h + 2 t and k + 1 is the emulations' (they index bs that way), so a wrong store offset fails.
std::vector<float> stage_rows_host(const std::vector<uint8_t>& xc, int rows, int64_t K) {
  const int steps = int(K / 64);
  std::vector<float> bs(size_t(rows) * steps * 32 * 2, std::nanf(""));
  const int offs[8] = {0, 8, 16, 24, 1, 9, 17, 25};
  for (int r = 0; r < rows; ++r)
    for (int pr = 0; pr < steps * 4; ++pr) {
      const int j = pr >> 2, q = pr & 3;
      const size_t base = size_t(r) * steps * 32 + size_t(j) * 32 + size_t(q) * 2;
      for (int i = 0; i < 8; ++i) {  // pair i of the piece: codes 2i, 2i + 1
        const uint8_t* c = &xc[size_t(r * K + 16 * pr + 2 * i)];
        bs[2 * (base + size_t(offs[i]))] = e4m3_val(c[0]);
        bs[2 * (base + size_t(offs[i])) + 1] = e4m3_val(c[1]);
      }
    }
  for (float v : bs) EXPECT_FALSE(std::isnan(v)) << "stage_rows left a word unwritten";
  return bs;
}


// n e4m3 codes without the NaN codes.
std::vector<uint8_t> e4m3_codes(std::mt19937& rng, int n) {
  std::vector<uint8_t> v(static_cast<size_t>(n));
  for (auto& c : v) {
    do c = uint8_t(rng());
    while ((c & 0x7F) == 0x7F);
  }
  return v;
}

// A step's four mma.m16n8k16 on the operands the lanes hold (A [q][16][16], B [q][16][8]): d[0]
// sums mmas 0 and 1 (the step's first 32-block), d[1] mmas 2 and 3.
void step_mmas(const float (&A)[4][16][16], const float (&B)[4][16][8], float (&d)[2][16][8]) {
  for (int q = 0; q < 4; ++q)
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 8; ++c) {
        double acc = 0;
        for (int k = 0; k < 16; ++k) acc += double(A[q][r][k]) * double(B[q][k][c]);
        d[q / 2][r][c] += float(acc);
      }
}

TEST(RsLayout, Fp4KernelDataFlowEmulated) {
  std::mt19937 rng(9);
  const int E = 3, N = 32, K = 256, KB = K / 32, stripes = N / kStripe, steps = K / kStepK;
  // checkpoint layout: codes [E][N][K / 2] (element 2j in the low nibble), e8m0 [E][N][K / 32]
  std::vector<uint8_t> W(size_t(E * N * K / 2)), S(size_t(E * N * KB));
  for (auto& b : W) b = uint8_t(rng());
  for (auto& b : S) b = uint8_t(120 + rng() % 12);
  const int64_t w_stride = N * K / 2, s_stride = N * KB;
  auto code_at = [&](int e, int row, int k) {
    const uint8_t b = W[size_t(e * w_stride + row * (K / 2) + k / 2)];
    return (k & 1) ? uint8_t(b >> 4) : uint8_t(b & 15);
  };
  // rs_pack_fp4_kernel / rs_pack_fp4_scales_kernel
  const int64_t units = int64_t(E) * stripes * steps;
  std::vector<uint32_t> pw(size_t(units * 128)), ps(size_t(units * 8));
  for (int64_t idx = 0; idx < units * 128; ++idx) {
    const int64_t unit = idx / 128;
    const int within = int(idx % 128), lane = within / 4, i = within % 4;
    const int j = int(unit % steps), s = int((unit / steps) % stripes), e = int(unit / (int64_t(steps) * stripes));
    uint8_t codes[8];
    for (int p = 0; p < 4; ++p)
      for (int which = 0; which < 2; ++which) {
        const Src src = fragment_src(lane, i, p, which);
        codes[2 * p + which] = code_at(e, s * 16 + src.row, j * 64 + src.k);
      }
    pw[size_t(idx)] = fp4_pack_word(codes);
  }
  for (int64_t idx = 0; idx < units * 8; ++idx) {
    const int64_t unit = idx / 8;
    const int g = int(idx % 8), j = int(unit % steps), s = int((unit / steps) % stripes), e = int(unit / (int64_t(steps) * stripes));
    uint32_t word = 0;
    for (int b = 0; b < 4; ++b)
      word |= uint32_t(S[size_t(e * s_stride + (s * 16 + fp4_scale_row(g, b)) * KB + j * 2 + fp4_scale_block(b))]) << (8 * b);
    ps[size_t(idx)] = word;
  }
  // one activation row: e4m3 codes (no NaN) and power-of-two scales
  const std::vector<uint8_t> xc = e4m3_codes(rng, K);
  std::vector<float> xs(static_cast<size_t>(KB));
  for (auto& v : xs) v = std::ldexp(1.0f, int(rng() % 9) - 4);
  const std::vector<float> bs = stage_rows_host(xc, 1, K);
  std::vector<float> as(static_cast<size_t>(KB));
  for (int b = 0; b < KB; ++b) as[size_t(b)] = xs[size_t(b)] * 16384.0f;
  auto half = [](uint32_t reg, int which) { return f16_to_f32(uint16_t(which ? reg >> 16 : reg & 0xFFFF)); };
  for (int e = 0; e < E; ++e)
    for (int stripe = 0; stripe < stripes; ++stripe) {
      const int64_t u0 = (int64_t(e) * stripes + stripe) * steps;
      double out[16] = {};
      for (int jj = 0; jj < steps; ++jj) {  // (the warp split only regroups the same per-step terms)
        // per lane: the A registers of the four mmas, the scale word, the B registers
        float A[4][16][16], B[4][16][8];
        uint32_t sw[32];
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane >> 2, t = lane & 3;
          for (int i = 0; i < 4; ++i) {
            const uint32_t word = pw[size_t((u0 + jj) * 128 + lane * 4 + i)];  // uint4 (u0 + jj) * 32 + lane, component i
            for (int p = 0; p < 4; ++p)
              for (int which = 0; which < 2; ++which) {
                const float v = half(fp4_pair_f16x2(word, p), which);
                const int r = g + 8 * (p & 1), k = 2 * t + 8 * (p >> 1) + which;
                A[i][r][k] = v;
              }
          }
          sw[lane] = ps[size_t((u0 + jj) * 8 + g)];
          // B: lane g == 0 reads 8 words at (jj * 4 + t) * 8: mma q's b0, b1 = words 2q, 2q + 1
          for (int q = 0; q < 4; ++q)
            for (int h = 0; h < 2; ++h)
              for (int which = 0; which < 2; ++which) {
                const float v = g == 0 ? bs[size_t(2 * ((jj * 4 + t) * 8 + 2 * q + h) + which)] : 0.0f;
                B[q][2 * t + 8 * h + which][g] = v;
              }
        }
        float d[2][16][8] = {};
        step_mmas(A, B, d);
        for (int g = 0; g < 8; ++g) {  // lanes t == 0: column 0 of rows g and g + 8
          const uint32_t w = sw[4 * g];
          const float w00 = std::ldexp(1.0f, int(w & 255) - 127), w01 = std::ldexp(1.0f, int((w >> 8) & 255) - 127);
          const float w10 = std::ldexp(1.0f, int((w >> 16) & 255) - 127), w11 = std::ldexp(1.0f, int(w >> 24) - 127);
          out[g] += double(d[0][g][0]) * w00 * as[size_t(2 * jj)] + double(d[1][g][0]) * w01 * as[size_t(2 * jj + 1)];
          out[g + 8] += double(d[0][g + 8][0]) * w10 * as[size_t(2 * jj)] + double(d[1][g + 8][0]) * w11 * as[size_t(2 * jj + 1)];
        }
      }
      for (int r = 0; r < 16; ++r) {
        const int row = stripe * 16 + r;
        double want = 0;
        for (int k = 0; k < K; ++k)
          want += double(e2m1(code_at(e, row, k))) * std::ldexp(1.0, int(S[size_t(e * s_stride + row * KB + k / 32)]) - 127) *
                  double(e4m3_val(xc[size_t(k)])) * double(xs[size_t(k / 32)]);
        ASSERT_NEAR(out[r], want, 1e-4 * (1.0 + std::fabs(want))) << "expert " << e << " row " << row;
      }
    }
}

// The FP8 kernel likewise (rs_pack_fp8_kernel, stage_rows, rs_fp8_kernel's step and its
// four accumulators): three activation rows as mma columns 0..2, a stripe in each half of a 32-row
// scale block.
TEST(RsLayout, Fp8KernelDataFlowEmulated) {
  std::mt19937 rng(10);
  const int N = 48, K = 192, KB = K / 32, stripes = N / kStripe, steps = K / kStepK, rows = 3;
  const std::vector<uint8_t> W = e4m3_codes(rng, N * K);
  std::vector<uint8_t> S(size_t(((N + 31) / 32) * KB));
  for (auto& b : S) b = uint8_t(120 + rng() % 12);
  // rs_pack_fp8_kernel
  const int64_t n_words = int64_t(stripes) * steps * 256;
  std::vector<uint32_t> pw(static_cast<size_t>(n_words));
  for (int64_t idx = 0; idx < n_words; ++idx) {
    const int64_t unit = idx / 256;
    const int within = int(idx % 256), lane = within / 8, wi = within % 8, j = int(unit % steps);
    const int64_t s = unit / steps;
    uint32_t word = 0;
    for (int b = 0; b < 4; ++b) {
      const Src src = fp8_byte_src(lane, 4 * wi + b);
      word |= uint32_t(W[size_t((s * 16 + src.row) * K + j * 64 + src.k)]) << (8 * b);
    }
    pw[size_t(idx)] = word;
  }
  const std::vector<uint8_t> xc = e4m3_codes(rng, rows * K);
  std::vector<float> xs(size_t(rows * KB));
  for (auto& v : xs) v = std::ldexp(1.0f, int(rng() % 9) - 4);
  // column r at bs + r * steps * 32 words; as [8][KB] (zeros past `rows`)
  const std::vector<float> bs = stage_rows_host(xc, rows, K);
  std::vector<float> as(size_t(8 * KB), 0.0f);
  for (int r = 0; r < rows; ++r)
    for (int b = 0; b < KB; ++b) as[size_t(r * KB + b)] = xs[size_t(r * KB + b)];
  for (int stripe = 0; stripe < stripes; ++stripe) {
    const int64_t u0 = int64_t(stripe) * steps;
    const int rb = (stripe * 16) / 32;
    double out[16][8] = {};
    for (int jj = 0; jj < steps; ++jj) {
      float A[4][16][16], B[4][16][8];
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, t = lane & 3;
        // uint4 (u0 + jj) * 64 + 2 lane and + 1: words 8 lane .. 8 lane + 7 of the unit
        uint32_t v[8];
        for (int i = 0; i < 8; ++i) v[i] = pw[size_t((u0 + jj) * 256 + 8 * lane + i)];
        for (int q = 0; q < 4; ++q) {
          // mma q: a0 = cvt(word 2q low), a1 = cvt(word 2q high), a2 = cvt(word 2q + 1 low), a3 = high
          const uint32_t regs[4][2] = {{v[2 * q] & 255, (v[2 * q] >> 8) & 255},
                                       {(v[2 * q] >> 16) & 255, v[2 * q] >> 24},
                                       {v[2 * q + 1] & 255, (v[2 * q + 1] >> 8) & 255},
                                       {(v[2 * q + 1] >> 16) & 255, v[2 * q + 1] >> 24}};
          for (int p = 0; p < 4; ++p)
            for (int which = 0; which < 2; ++which) A[q][g + 8 * (p & 1)][2 * t + 8 * (p >> 1) + which] = e4m3_val(uint8_t(regs[p][which]));
          for (int h = 0; h < 2; ++h)
            for (int which = 0; which < 2; ++which)
              B[q][2 * t + 8 * h + which][g] = g < rows ? bs[size_t(2 * (((g * steps + jj) * 4 + t) * 8 + 2 * q + h) + which)] : 0.0f;
        }
      }
      float d[2][16][8] = {};
      step_mmas(A, B, d);
      const double ws0 = std::ldexp(1.0, int(S[size_t(rb * KB + 2 * jj)]) - 127), ws1 = std::ldexp(1.0, int(S[size_t(rb * KB + 2 * jj + 1)]) - 127);
      for (int lane = 0; lane < 32; ++lane) {  // tot[0..3] = (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)
        const int g = lane >> 2, t = lane & 3;
        const float* ac = as.data() + 2 * t * KB + 2 * jj;
        const double s00 = ws0 * ac[0], s01 = ws1 * ac[1], s10 = ws0 * ac[KB], s11 = ws1 * ac[KB + 1];
        out[g][2 * t] += d[0][g][2 * t] * s00 + d[1][g][2 * t] * s01;
        out[g][2 * t + 1] += d[0][g][2 * t + 1] * s10 + d[1][g][2 * t + 1] * s11;
        out[g + 8][2 * t] += d[0][g + 8][2 * t] * s00 + d[1][g + 8][2 * t] * s01;
        out[g + 8][2 * t + 1] += d[0][g + 8][2 * t + 1] * s10 + d[1][g + 8][2 * t + 1] * s11;
      }
    }
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 8; ++c) {
        const int row = stripe * 16 + r;
        double want = 0;
        if (c < rows)
          for (int k = 0; k < K; ++k)
            want += double(e4m3_val(W[size_t(row * K + k)])) * std::ldexp(1.0, int(S[size_t((row / 32) * KB + k / 32)]) - 127) *
                    double(e4m3_val(xc[size_t(c * K + k)])) * double(xs[size_t(c * KB + k / 32)]);
        ASSERT_NEAR(out[r][c], want, 1e-4 * (1.0 + std::fabs(want))) << "row " << row << " column " << c;
      }
  }
}

}  // namespace
}  // namespace fb::cuda::rs
