// The register-streamed GEMVs (rs_gemv.h) against the exact launchers of ops.h, with the checks of
// fast_gemv_test.cpp ((1) accuracy, (2) row invariance, (3) determinism; helpers in
// fast_gemv_test_util.h). Split from fast_gemv_test.cpp; the same test binary. Label: gpu.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "base/dtype.h"
#include "cuda/device.h"
#include "cuda/fast_gemv.h"
#include "cuda/fast_gemv_test_util.h"
#include "cuda/gpu_test_util.h"
#include "cuda/ops.h"
#include "cuda/rs_gemv.h"
#include "cuda/tc_gemv.h"

namespace fb::cuda {
namespace {

using namespace gemv_test;
using test_util::have_gpu;
#define NEED_GPU() FB_NEED_GPU()

// ---- register-streamed GEMVs (rs_gemv.h): (1)-(3) against the exact launchers ---------------------

TEST(FastGemv, RsFp8MatchesExact) {
  NEED_GPU();
  Rng rng(41);
  struct Case { int64_t N, K; };
  // released shapes (wq_a, wq_b, shared w2) and small ones: one stripe, K of one step, N = 48
  // (a stripe inside a 32-row scale block's second half)
  for (Case cs : {Case{1280, 5120}, Case{32768, 1280}, Case{5120, 2304}, Case{16, 64}, Case{48, 192}}) {
    SCOPED_TRACE("N=" + std::to_string(cs.N) + " K=" + std::to_string(cs.K));
    const int64_t N = cs.N, K = cs.K, KB = K / 32, T = 13;  // 13 rows: two CTA row groups
    const Fp8Set set(rng, N, K, T);
    const QuantBuf& q = set.q;
    const Fp8W& w = set.w;
    Dev<bf16_t> dy(size_t(T * N));
    ASSERT_TRUE(fp8_gemm_q(q, T, w, dy.p(), nullptr).ok());
    const auto want = dy.get();
    RsWeight rw;
    ASSERT_TRUE(rs_pack_fp8(w, &rw, nullptr).ok());
    dy.poison();
    ASSERT_TRUE(rs_fp8_gemv(q, T, rw, dy.p(), nullptr).ok());
    const auto got = dy.get();
    expect_close(got, want, N, {}, "rs fp8 M=13 vs exact");
    dy.poison();
    ASSERT_TRUE(rs_fp8_gemv(q, T, rw, dy.p(), nullptr, false).ok());
    expect_rows_same(dy.get(), got, N, 0, T, "rs fp8 determinism (and without PDL)");
    dy.poison();
    for (int64_t m = 0; m < T; ++m) {
      const QuantBuf q1{set.qc.p() + m * K, set.qs.p() + m * KB, K};
      ASSERT_TRUE(rs_fp8_gemv(q1, 1, rw, dy.p() + m * N, nullptr).ok());
    }
    expect_rows_same(dy.get(), got, N, 0, T, "rs fp8 M=1 (each row alone) vs M=13");
    dy.poison();
    ASSERT_TRUE(rs_fp8_gemv(q, 3, rw, dy.p(), nullptr).ok());
    const auto part = dy.get();
    expect_rows_same(part, got, N, 0, 3, "rs fp8 M=3 vs M=13");
    EXPECT_TRUE(std::all_of(part.begin() + 3 * N, part.end(), [](bf16_t b) { return b == 0xFFFF; })) << "rs fp8 wrote past M";
  }
  RsWeight bad;
  EXPECT_FALSE(rs_pack_fp8(Fp8W{nullptr, nullptr, 100, 64}, &bad, nullptr).ok()) << "N % 16 != 0 is refused";
}

// Two weights in one launch (other stripes, other warps per CTA) = the single calls.
TEST(FastGemv, RsFp8PairEqualsSingles) {
  NEED_GPU();
  Rng rng(44);
  const int64_t K = 5120, T = 7, Na = 8192, Nb = 512;
  const Fp8Set a(rng, Na, K, T);
  const Fp8Set b(rng, Nb, K, T);
  EXPECT_NE(rs_warps(Na, K, false), rs_warps(Nb, K, false)) << "the case should mix warp counts";
  RsWeight ra, rb;
  ASSERT_TRUE(rs_pack_fp8(a.w, &ra, nullptr).ok());
  ASSERT_TRUE(rs_pack_fp8(b.w, &rb, nullptr).ok());
  Dev<bf16_t> ya(size_t(T * Na)), yb(size_t(T * Nb)), y1(size_t(T * Na)), y2(size_t(T * Nb));
  ASSERT_TRUE(rs_fp8_gemv(a.q, T, ra, y1.p(), nullptr).ok());
  ASSERT_TRUE(rs_fp8_gemv(a.q, T, rb, y2.p(), nullptr).ok());
  ASSERT_TRUE(rs_fp8_gemv2(a.q, T, ra, ya.p(), &rb, yb.p(), nullptr).ok());
  expect_rows_same(ya.get(), y1.get(), Na, 0, T, "rs fp8 pair: a");
  expect_rows_same(yb.get(), y2.get(), Nb, 0, T, "rs fp8 pair: b");
}

TEST(FastGemv, RsFp4MatchesExact) {
  NEED_GPU();
  Rng rng(42);
  struct Case { int64_t N, K, x_div; };
  // released w1/w3 (N = I = 2304, K = D = 5120) and w2, 6 rows a token; a small case of one stripe
  for (Case cs : {Case{2304, 5120, 6}, Case{5120, 2304, 1}, Case{16, 128, 4}}) {
    SCOPED_TRACE("N=" + std::to_string(cs.N) + " K=" + std::to_string(cs.K) + " x_div=" + std::to_string(cs.x_div));
    constexpr int kExperts = 8;
    const Fp4Set set(rng, cs.N, cs.K, cs.x_div, kExperts);
    const int64_t N = cs.N, K = cs.K, KB = K / 32;
    const std::vector<int32_t> ex = expert_rows(rng, kExperts);
    const std::vector<bool> keep = kept_rows(ex);
    Dev<int32_t> dex(ex);
    Dev<bf16_t> ya(size_t(kRows * N)), yb(size_t(kRows * N));
    ASSERT_TRUE(fp4_gemm2_q(set.q, kRows, cs.x_div, set.A, set.B, dex.p(), ya.p(), yb.p(), nullptr).ok());
    const auto want_a = ya.get(), want_b = yb.get();
    RsWeight ra, rb;
    ASSERT_TRUE(rs_pack_fp4(set.A, kExperts, &ra, nullptr).ok());
    ASSERT_TRUE(rs_pack_fp4(set.B, kExperts, &rb, nullptr).ok());
    ya.poison();
    yb.poison();
    ASSERT_TRUE(rs_fp4_gemv(set.q, kRows, cs.x_div, ra, ya.p(), &rb, yb.p(), dex.p(), nullptr).ok());
    const auto got_a = ya.get(), got_b = yb.get();
    expect_close(got_a, want_a, N, keep, "rs fp4 a vs exact");
    expect_close(got_b, want_b, N, keep, "rs fp4 b vs exact");
    for (int64_t m = 0; m < kRows; ++m)
      if (!keep[size_t(m)]) expect_rows_same(got_a, want_a, N, m, 1, "rs fp4 skipped row untouched");
    // a alone = a of the pair; determinism
    ya.poison();
    ASSERT_TRUE(rs_fp4_gemv(set.q, kRows, cs.x_div, ra, ya.p(), nullptr, nullptr, dex.p(), nullptr, false).ok());
    expect_rows_same(ya.get(), got_a, N, 0, kRows, "rs fp4 single weight (no PDL) vs the pair's a");
    // each row alone: its own x row, expert and output row
    ya.poison();
    for (int64_t m = 0; m < kRows; ++m) {
      const int64_t xm = m / cs.x_div;
      const QuantBuf q1{set.qc.p() + xm * K, set.qs.p() + xm * KB, K};
      ASSERT_TRUE(rs_fp4_gemv(q1, 1, 1, ra, ya.p() + m * N, nullptr, nullptr, dex.p() + m, nullptr).ok());
    }
    expect_rows_same(ya.get(), got_a, N, 0, kRows, "rs fp4 M=1 vs M=64");
    // rows grouped by expert (the verify steps' form): each row's bits are the ungrouped launch's
    ya.poison();
    yb.poison();
    ASSERT_TRUE(rs_fp4_gemv(set.q, kRows, cs.x_div, ra, ya.p(), &rb, yb.p(), dex.p(), nullptr, true, true).ok());
    expect_rows_same(ya.get(), got_a, N, 0, kRows, "rs fp4 grouped vs ungrouped (a)");
    expect_rows_same(yb.get(), got_b, N, 0, kRows, "rs fp4 grouped vs ungrouped (b)");
    for (int y : {1, 3, 64}) {  // CTAs per stripe (each every y-th group): the same bits
      rs_set_group_ctas(y);
      ya.poison();
      ASSERT_TRUE(rs_fp4_gemv(set.q, kRows, cs.x_div, ra, ya.p(), nullptr, nullptr, dex.p(), nullptr, true, true).ok());
      expect_rows_same(ya.get(), got_a, N, 0, kRows, "rs fp4 grouped, 1 / 3 / 64 CTAs a stripe, vs ungrouped");
    }
    rs_set_group_ctas(0);
    // <= 8 tokens (x_div > 1): the tokens' rows staged once per CTA, or per group: the same bits
    for (bool tok : {true, false})
      for (int64_t m : {int64_t(13), int64_t(36)}) {
        rs_set_token_staging(tok);
        ya.poison();
        ASSERT_TRUE(rs_fp4_gemv(set.q, m, cs.x_div, ra, ya.p(), nullptr, nullptr, dex.p(), nullptr, true, true).ok());
        expect_rows_same(ya.get(), got_a, N, 0, m, tok ? "rs fp4 grouped, tokens staged once, vs ungrouped" : "rs fp4 grouped, rows staged per group, vs ungrouped");
      }
    rs_set_token_staging(true);
    rs_set_group_rows(8);  // groups of up to 8 rows: the same bits
    ya.poison();
    ASSERT_TRUE(rs_fp4_gemv(set.q, kRows, cs.x_div, ra, ya.p(), nullptr, nullptr, dex.p(), nullptr, true, true).ok());
    expect_rows_same(ya.get(), got_a, N, 0, kRows, "rs fp4 grouped by 8 vs ungrouped");
    rs_set_group_rows(4);
    ya.poison();
    ASSERT_TRUE(rs_fp4_gemv(set.q, 13, cs.x_div, ra, ya.p(), nullptr, nullptr, dex.p(), nullptr, false, true).ok());
    const auto g13 = ya.get();
    expect_rows_same(g13, got_a, N, 0, 13, "rs fp4 grouped M=13 vs ungrouped M=64");
    EXPECT_TRUE(std::all_of(g13.begin() + 13 * N, g13.end(), [](bf16_t b) { return b == 0xFFFF; })) << "rs fp4 grouped wrote past M";
    // every knob setting computes the same products; the warps per CTA change the order only
    for (int depth : {2, 8}) {
      rs_set_tuning(0, 0, depth);
      ya.poison();
      ASSERT_TRUE(rs_fp4_gemv(set.q, kRows, cs.x_div, ra, ya.p(), nullptr, nullptr, dex.p(), nullptr).ok());
      expect_rows_same(ya.get(), got_a, N, 0, kRows, "rs fp4 depth 2 / 8 vs 4 (same warps: same bits)");
    }
    rs_set_tuning(0, 0, 0);
    // expert == nullptr is expert 0
    std::vector<int32_t> zeros(kRows, 0);
    dex.set(zeros);
    ASSERT_TRUE(rs_fp4_gemv(set.q, 7, cs.x_div, ra, ya.p(), nullptr, nullptr, dex.p(), nullptr).ok());
    const auto with_zero = ya.get();
    ya.poison();
    ASSERT_TRUE(rs_fp4_gemv(set.q, 7, cs.x_div, ra, ya.p(), nullptr, nullptr, nullptr, nullptr).ok());
    expect_rows_same(ya.get(), with_zero, N, 0, 7, "rs fp4 expert nullptr vs zeros");
    // 64 rows of one expert: 8 groups of 8 (a leader every 8th row)
    ya.poison();
    ASSERT_TRUE(rs_fp4_gemv(set.q, kRows, cs.x_div, ra, ya.p(), nullptr, nullptr, dex.p(), nullptr).ok());
    const auto all_zero = ya.get();
    ya.poison();
    ASSERT_TRUE(rs_fp4_gemv(set.q, kRows, cs.x_div, ra, ya.p(), nullptr, nullptr, dex.p(), nullptr, true, true).ok());
    expect_rows_same(ya.get(), all_zero, N, 0, kRows, "rs fp4 grouped: 64 rows of one expert vs ungrouped");
    rs_set_group_rows(8);
    ya.poison();
    ASSERT_TRUE(rs_fp4_gemv(set.q, kRows, cs.x_div, ra, ya.p(), nullptr, nullptr, dex.p(), nullptr, true, true).ok());
    expect_rows_same(ya.get(), all_zero, N, 0, kRows, "rs fp4 grouped by 8: 64 rows of one expert vs ungrouped");
    rs_set_group_rows(4);
  }
}

// e8m0 scales 0 and 255 (2^-127 and NaN) take the exact conversion: an expert holding one is
// flagged at packing, and its rows agree with the exact kernel (NaN rows NaN in both).
TEST(FastGemv, RsFp4SpecialScales) {
  NEED_GPU();
  Rng rng(43);
  const int64_t N = 32, K = 256, KB = K / 32;
  constexpr int kExperts = 3;
  Fp4Set set(rng, N, K, 1, kExperts);
  std::vector<uint8_t> sa = set.sa.get();
  sa[size_t(1 * N * KB + 5 * KB + 2)] = 0;     // expert 1, row 5, block 2: 2^-127
  sa[size_t(2 * N * KB + 17 * KB + 7)] = 255;  // expert 2, row 17, block 7: NaN
  set.sa.set(sa);
  std::vector<int32_t> ex(kRows);
  for (int64_t m = 0; m < kRows; ++m) ex[size_t(m)] = int32_t(m % kExperts);
  Dev<int32_t> dex(ex);
  Dev<bf16_t> want(size_t(kRows * N)), got(size_t(kRows * N));
  ASSERT_TRUE(fp4_gemm_q(set.q, kRows, 1, set.A, dex.p(), want.p(), nullptr).ok());
  RsWeight ra;
  ASSERT_TRUE(rs_pack_fp4(set.A, kExperts, &ra, nullptr).ok());
  ASSERT_TRUE(rs_fp4_gemv(set.q, kRows, 1, ra, got.p(), nullptr, nullptr, dex.p(), nullptr).ok());
  const auto w = want.get(), g = got.get();
  std::vector<bool> finite_rows(kRows, true);
  for (int64_t m = 0; m < kRows; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const bool wn = std::isnan(to_double(w[size_t(m * N + n)])), gn = std::isnan(to_double(g[size_t(m * N + n)]));
      EXPECT_EQ(wn, gn) << "NaN where the exact kernel has one, row " << m << " col " << n;
      if (wn) finite_rows[size_t(m)] = false;
    }
  for (int64_t m = 0; m < kRows; ++m) {
    if (ex[size_t(m)] == 2) {
      EXPECT_FALSE(finite_rows[size_t(m)]) << "expert 2's row 17 holds a NaN scale";
    }
  }
  // the NaN column alone is NaN: compare the other columns of expert 2's rows and every row of 0 and 1
  std::vector<bf16_t> wf = w, gf = g;
  for (int64_t m = 0; m < kRows; ++m)
    if (ex[size_t(m)] == 2) wf[size_t(m * N + 17)] = gf[size_t(m * N + 17)] = 0x3F80;
  expect_close(gf, wf, N, {}, "rs fp4 with e8m0 0 and 255 vs exact");
}

TEST(FastGemv, RsBench) {
  NEED_GPU();
  ASSERT_TRUE(rs_gemv_bench().ok());
}

}  // namespace
}  // namespace fb::cuda
