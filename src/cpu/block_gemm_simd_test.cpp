// The vector block GEMMs (block_gemm_simd.h) against the scalar reference, bit for bit: every
// code of both formats, special scales (2^-127, NaN), zero and negative-zero activations, K with
// a partial last group of 16 blocks, and the released dimensions. Plus their speed (printed).
#include "cpu/block_gemm_simd.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "base/fmath.h"
#include "base/tensor_view.h"
#include "cpu/ops.h"

namespace fb::cpu {
namespace {

struct Case {
  int64_t N, K;
};

std::vector<uint16_t> random_x(std::mt19937& rng, int64_t M, int64_t K) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> x(size_t(M * K));
  for (size_t i = 0; i < x.size(); ++i) {
    float v = nd(rng) * (i % 97 == 0 ? 300.0f : 1.0f);  // a few outliers: blocks of very different scale
    if (i % 53 == 0) v = 0.0f;
    if (i % 59 == 0) v = -0.0f;
    x[i] = to_bf(v);
  }
  // A whole block of negative zeros (its scale floors) and one of zeros.
  if (K >= 64)
    for (int i = 0; i < 32; ++i) {
      x[size_t(i)] = to_bf(-0.0f);
      x[size_t(32 + i)] = 0;
    }
  // The last row's blocks: large positive elements among tiny ones of random sign (act_quant
  // keeps those as e4m3 codes near the bottom of the range). Against the all-maximum weight row
  // (output 0, max_weight_row) a half sum grows past 2^14 while tiny products still carry 2^-10,
  // so it rounds and its order shows in the bits: e2m1 x e4m3 products of ordinary rows add
  // exactly in any order and would hide a reordered sum.
  std::uniform_real_distribution<float> tiny(0.002f, 0.02f);
  for (int64_t b = 0; b < K / 32; ++b)
    for (int i = 0; i < 32; ++i) {
      const bool large = i % 2 == 0 || i % 16 == int(b % 16);
      const float v = large ? 448.0f : ((rng() & 1) ? -tiny(rng) : tiny(rng));
      x[size_t((M - 1) * K + b * 32 + i)] = to_bf(v);
    }
  return x;
}

// Output row 0's weights all the largest positive code (see random_x's last row).
void max_weight_row(uint8_t* w, int64_t row_bytes, uint8_t code) {
  for (int64_t i = 0; i < row_bytes; ++i) w[i] = code;
}

// Scales near 1 (118..136), with 2^-127 (0) and NaN (255) sprinkled in when `special`.
std::vector<uint8_t> random_scales(std::mt19937& rng, size_t n, bool special) {
  std::uniform_int_distribution<int> d(118, 136);
  std::vector<uint8_t> s(n);
  for (size_t i = 0; i < n; ++i) s[i] = uint8_t(d(rng));
  if (special && n > 8) {
    s[1] = 0;
    s[n / 2] = 255;
    s[n - 1] = 0;
  }
  return s;
}

// Both paths on the same operands; the outputs' bits must agree.
template <typename Gemm>
void expect_same_bits(const char* what, const std::vector<uint16_t>& x, int64_t M, const TensorView& w, const TensorView& s, int64_t N, Gemm gemm) {
  std::vector<uint16_t> ref(size_t(M * N), 0xDEAD), vec(size_t(M * N), 0xBEEF);
  simd::set_enabled(false);
  gemm(x.data(), M, w, s, ref.data());
  simd::set_enabled(true);
  ASSERT_TRUE(simd::enabled());
  gemm(x.data(), M, w, s, vec.data());
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    if (ref[i] != vec[i] && differ++ == 0) first = i;
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << ref.size() << " outputs differ, first at " << first << " (ref 0x" << std::hex
                        << ref[first] << ", simd 0x" << vec[first] << ")";
}

// The f32 sums of the reference's definition (ops.cpp block_scaled_gemm before its bf16
// rounding) for row m of x, against the kernel's f32 sums, bit for bit. fp4: W packed [N, K / 2],
// one scale per row and block; fp8: W [N, K], one scale per 32 x 32.
void expect_same_f32(const char* what, bool fp4, const std::vector<uint16_t>& x, int64_t M, const std::vector<uint8_t>& W,
                     const std::vector<uint8_t>& S, int64_t N, int64_t K) {
  const int64_t KB = K / 32;
  std::vector<uint8_t> codes(static_cast<size_t>(K));
  std::vector<float> qv(static_cast<size_t>(K)), qs(static_cast<size_t>(KB)), got(static_cast<size_t>(N));
  simd::QuantRowT qt;
  size_t differ = 0;
  for (int64_t m = 0; m < M; ++m) {
    act_quant_row(x.data() + m * K, K, codes.data(), qs.data());
    for (int64_t k = 0; k < K; ++k) qv[size_t(k)] = e4m3_to_f32(codes[size_t(k)]);
    qt.set(qv.data(), qs.data(), K);
    if (fp4) simd::fp4_rows_f32(qt, W.data(), S.data(), 0, N, got.data());
    else simd::fp8_rows_f32(qt, W.data(), S.data(), 0, N, got.data());
    for (int64_t n = 0; n < N; ++n) {
      auto weight = [&](int64_t k) {
        return fp4 ? e2m1_to_f32(e2m1_code_at(W.data() + n * (K / 2), k)) : e4m3_to_f32(W[size_t(n * K + k)]);
      };
      const uint8_t* srow = fp4 ? S.data() + n * KB : S.data() + (n / 32) * KB;
      const float want = fm::blocks16_sum(
          KB, [&](int64_t k) { return fm::mul(qv[size_t(k)], weight(k)); }, [&](int64_t b) { return fm::mul(qs[size_t(b)], e8m0_to_f32(srow[b])); });
      // A NaN's sign and payload follow the compiler's operand order in the scalar loop; the
      // bf16 rounding makes every NaN 0x7FC0, so NaN == NaN here.
      const bool same = bits_from_f32(want) == bits_from_f32(got[size_t(n)]) || (std::isnan(want) && std::isnan(got[size_t(n)]));
      if (!same && differ++ < 3)
        ADD_FAILURE() << what << " row " << m << " output " << n << ": reference " << want << " (0x" << std::hex << bits_from_f32(want)
                      << "), simd " << got[size_t(n)] << " (0x" << bits_from_f32(got[size_t(n)]) << ")" << std::dec;
    }
  }
  EXPECT_EQ(differ, 0u) << what << ": f32 sums that differ";
}

// Both checks on M rows of x: the bf16 outputs of the two paths, and the f32 sums.
template <typename Gemm>
void expect_both(const char* what, bool fp4, const std::vector<uint16_t>& x, int64_t M, const TensorView& wv, const TensorView& sv,
                 const std::vector<uint8_t>& w, const std::vector<uint8_t>& s, Case c, Gemm gemm) {
  expect_same_bits(what, x, M, wv, sv, c.N, gemm);
  expect_same_f32(what, fp4, x, M, w, s, c.N, c.K);
}

class BlockGemmSimd : public ::testing::Test {
 protected:
  void SetUp() override {
    simd::set_enabled(true);
    if (!simd::enabled()) GTEST_SKIP() << "no AVX-512F on this CPU: the scalar reference runs everywhere";
  }
  void TearDown() override { simd::set_enabled(true); }
};

TEST_F(BlockGemmSimd, Fp4SameBitsAsTheReference) {
  std::mt19937 rng(7);
  for (Case c : {Case{1, 32}, Case{3, 64}, Case{17, 544}, Case{40, 2304}, Case{33, 5120}}) {
    for (bool special : {false, true}) {
      SCOPED_TRACE("N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) + (special ? " special scales" : ""));
      std::vector<uint8_t> w(size_t(c.N * c.K / 2));
      for (size_t i = 0; i < w.size(); ++i) w[i] = uint8_t(rng());  // every e2m1 code, both signs
      max_weight_row(w.data(), c.K / 2, 0x17);                          // +6 (even elements), +0.5 (odd)
      const std::vector<uint8_t> s = random_scales(rng, size_t(c.N * (c.K / 32)), special);
      const TensorView wv{DType::kI8, {c.N, c.K / 2}, w.data()}, sv{DType::kU8, {c.N, c.K / 32}, s.data()};
      expect_both("fp4", true, random_x(rng, 3, c.K), 3, wv, sv, w, s, c, fp4_gemm);
    }
  }
}

TEST_F(BlockGemmSimd, Fp8SameBitsAsTheReference) {
  std::mt19937 rng(8);
  for (Case c : {Case{1, 32}, Case{5, 96}, Case{33, 544}, Case{70, 1024}, Case{64, 5120}}) {
    for (bool special : {false, true}) {
      SCOPED_TRACE("N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) + (special ? " special scales" : ""));
      std::vector<uint8_t> w(size_t(c.N * c.K));
      for (size_t i = 0; i < w.size(); ++i) w[i] = uint8_t(rng());  // every e4m3 code, NaNs among them when special
      if (!special)
        for (auto& b : w)
          if ((b & 0x7F) == 0x7F) b &= 0xFE;
      max_weight_row(w.data(), c.K, 0x7E);  // +448
      const std::vector<uint8_t> s = random_scales(rng, size_t(((c.N + 31) / 32) * (c.K / 32)), special);
      const TensorView wv{DType::kF8E4M3, {c.N, c.K}, w.data()}, sv{DType::kU8, {(c.N + 31) / 32, c.K / 32}, s.data()};
      expect_both("fp8", false, random_x(rng, 2, c.K), 2, wv, sv, w, s, c, fp8_gemm);
    }
  }
}

// The LM head's lanes32 dots (simd::lanes32_dot_bf16) against fm::lanes32_sum, bit for bit, on
// rows with NaN / infinite / subnormal bf16 weights, +-0 terms and D with a partial last chunk of
// 256; and rows whose lane sums round so that a reordered sum shows (large terms among tiny ones).
TEST_F(BlockGemmSimd, Lanes32DotSameBitsAsTheReference) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t D : {8, 64, 256, 264, 1000, 4096, 7168}) {
    std::vector<float> x(static_cast<size_t>(D));
    for (auto& v : x) v = round_bf16(nd(rng));
    x[0] = -0.0f;
    std::vector<uint16_t> w(static_cast<size_t>(D * 9));
    for (auto& b : w) b = to_bf(nd(rng) * ((rng() % 5 == 0) ? 1e4f : 1e-3f));  // mixed magnitudes: sums round
    w[size_t(D + 1)] = 0x7FC0;   // row 1: NaN
    w[size_t(2 * D + 3)] = 0x7F80;  // row 2: +inf
    w[size_t(3 * D + 5)] = 0x0001;  // row 3: a subnormal
    for (int64_t k = 0; k < D; ++k) w[size_t(4 * D + k)] = 0x8000;  // row 4: -0 terms throughout
    simd::Lanes32Row xr;
    xr.set(x.data(), D);
    for (int64_t r = 0; r < 9; ++r) {
      const uint16_t* wr = w.data() + r * D;
      const float want = fm::lanes32_sum(D, [&](int64_t k) { return fm::mul(x[size_t(k)], bf16_to_f32(wr[k])); });
      const float got = simd::lanes32_dot_bf16(xr, wr);
      EXPECT_TRUE(bits_from_f32(want) == bits_from_f32(got) || (std::isnan(want) && std::isnan(got)))
          << "D=" << D << " row " << r << ": reference " << want << ", simd " << got;
    }
  }
}

// The shortest of `reps` runs of fn, in ms, with the vector kernels on or off.
template <typename F>
double best_ms(bool vec, int reps, F fn) {
  simd::set_enabled(vec);
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// One token through one routed expert at the released dimensions (w1 and w3 [2304, 5120], w2
// [5120, 2304]), on one thread, both paths: the time is printed (not a gate).
TEST_F(BlockGemmSimd, ReleasedExpertOneTokenSpeed) {
  std::mt19937 rng(9);
  const int64_t D = 5120, I = 2304;
  std::vector<uint8_t> w13(size_t(I * D / 2)), w2(size_t(D * I / 2));
  for (auto& b : w13) b = uint8_t(rng());
  for (auto& b : w2) b = uint8_t(rng());
  const std::vector<uint8_t> s13 = random_scales(rng, size_t(I * (D / 32)), false), s2 = random_scales(rng, size_t(D * (I / 32)), false);
  const TensorView v13{DType::kI8, {I, D / 2}, w13.data()}, vs13{DType::kU8, {I, D / 32}, s13.data()};
  const TensorView v2{DType::kI8, {D, I / 2}, w2.data()}, vs2{DType::kU8, {D, I / 32}, s2.data()};
  const std::vector<uint16_t> x = random_x(rng, 1, D), h = random_x(rng, 1, I);
  std::vector<uint16_t> a(static_cast<size_t>(I)), y(static_cast<size_t>(D));
  auto expert = [&] {
    fp4_gemm(x.data(), 1, v13, vs13, a.data());  // w1
    fp4_gemm(x.data(), 1, v13, vs13, a.data());  // w3 (same shape)
    fp4_gemm(h.data(), 1, v2, vs2, y.data());    // w2
  };
  const double scalar = best_ms(false, 1, expert), vec = best_ms(true, 5, expert);
  const double bytes = double(2 * w13.size() + w2.size() + 2 * s13.size() + s2.size());
  std::printf("[ bench ] one released-dim expert, one token, one thread: scalar reference %.1f ms, AVX-512 %.2f ms (%.1fx; %.2f GB/s of weights)\n",
              scalar, vec, scalar / vec, bytes / vec / 1e6);
  RecordProperty("expert_ms_avx512", std::to_string(vec));
  // The shared expert's FP8 projections at the same shapes (the CPU executor's dense GEMVs).
  std::vector<uint8_t> f13(size_t(I * D)), f2(size_t(D * I));
  for (auto& b : f13) b = uint8_t(rng() & 0x7E);
  for (auto& b : f2) b = uint8_t(rng() & 0x7E);
  const std::vector<uint8_t> g13 = random_scales(rng, size_t((I / 32) * (D / 32)), false), g2 = random_scales(rng, size_t((D / 32) * (I / 32)), false);
  const TensorView u13{DType::kF8E4M3, {I, D}, f13.data()}, us13{DType::kU8, {I / 32, D / 32}, g13.data()};
  const TensorView u2{DType::kF8E4M3, {D, I}, f2.data()}, us2{DType::kU8, {D / 32, I / 32}, g2.data()};
  auto shared = [&] {
    fp8_gemm(x.data(), 1, u13, us13, a.data());
    fp8_gemm(x.data(), 1, u13, us13, a.data());
    fp8_gemm(h.data(), 1, u2, us2, y.data());
  };
  const double fs = best_ms(false, 1, shared), fv = best_ms(true, 3, shared);
  std::printf("[ bench ] the same shapes in FP8 (a shared expert), one thread: scalar %.1f ms, AVX-512 %.2f ms (%.1fx)\n", fs, fv, fs / fv);
}

}  // namespace
}  // namespace fb::cpu
