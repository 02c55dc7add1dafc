// The fast GEMVs (fast_gemv.h) against the exact launchers of ops.h (which equal the CPU
// reference bit for bit, ops_test.cpp), at released decode shapes. Not bit-exact by design, so:
//  (1) accuracy: NMSE = sum (a - b)^2 / sum b^2 <= 1e-5 and max |a - b| <= 5% of the output RMS
//      (a few bf16 ulps of the largest outputs);
//  (2) row invariance: row m's bits are the same whether it runs alone (M = 1), among M = 3, 7 or
//      64 rows;
//  (3) determinism: the same call twice gives the same bits;
// plus the semantics of the exact launchers: skipped expert rows untouched (outputs are poisoned
// with 0xFF bytes first), x_div, expert == nullptr, grouped bf16 with f32 and f32-add outputs.
// Label: gpu (skipped without a device). FastGemv.Bench prints GB/s and never fails on speed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "base/dtype.h"
#include "cuda/device.h"
#include "cuda/gpu_test_util.h"
#include "cuda/fast_gemv.h"
#include "cuda/rs_gemv.h"
#include "cuda/tc_gemv.h"
#include "cuda/ops.h"
#include "cuda/fast_gemv_test_util.h"

namespace fb::cuda {
namespace {

using namespace gemv_test;  // Rng, expect_close, expect_rows_same, Fp8Set, Fp4Set, ...
using test_util::have_gpu;
#define NEED_GPU() FB_NEED_GPU()

// ---- FP8 ----------------------------------------------------------------------------------------

// Switches the FP8 / MXFP4 calls to the tensor-core kernels (tc_gemv.h) for a scope.
struct TcOn {
  TcOn() { set_fast_gemv_tc(true); }
  ~TcOn() { set_fast_gemv_tc(false); }
};

void fp8_cases() {
  Rng rng(11);
  struct Case { int64_t N, K; };
  // Released-like shapes: square 4096, hidden 5120 in and out, q_b (1536 -> 32768), N not a
  // multiple of 32 (partial scale rows), narrow N (split K) and a partial last step (K = 2080).
  for (Case cs : {Case{1024, 4096}, Case{4096, 4096}, Case{1536, 5120}, Case{5120, 4096}, Case{32768, 1536}, Case{1000, 4096},
                  Case{96, 2080}, Case{512, 5120}}) {
    SCOPED_TRACE("N=" + std::to_string(cs.N) + " K=" + std::to_string(cs.K));
    const int64_t N = cs.N, K = cs.K, KB = K / 32;
    const Fp8Set set(rng, N, K, kRows);
    const Dev<uint8_t>& qc = set.qc;
    const Dev<float>& qs = set.qs;
    const QuantBuf& q = set.q;
    const Fp8W& w = set.w;
    Dev<bf16_t> dy(size_t(kRows * N));
    ASSERT_TRUE(fp8_gemm_q(q, kRows, w, dy.p(), nullptr).ok());
    const auto want = dy.get();
    dy.poison();
    ASSERT_TRUE(fast_fp8_gemv_q(q, kRows, w, dy.p(), nullptr).ok());
    const auto got = dy.get();
    expect_close(got, want, N, {}, "fp8 M=64 vs exact");
    dy.poison();
    ASSERT_TRUE(fast_fp8_gemv_q(q, kRows, w, dy.p(), nullptr).ok());
    expect_rows_same(dy.get(), got, N, 0, kRows, "fp8 determinism");
    // The register-capped variant (set_fast_gemv_occupancy) computes the same bits.
    dy.poison();
    set_fast_gemv_occupancy(true);
    ASSERT_TRUE(fast_fp8_gemv_q(q, kRows, w, dy.p(), nullptr).ok());
    set_fast_gemv_occupancy(false);
    expect_rows_same(dy.get(), got, N, 0, kRows, "fp8 occupancy variant");
    for (int64_t M : {3, 7}) {
      dy.poison();
      ASSERT_TRUE(fast_fp8_gemv_q(q, M, w, dy.p(), nullptr).ok());
      const auto part = dy.get();
      expect_rows_same(part, got, N, 0, M, "fp8 M=3/7 vs M=64");
      // rows past M untouched
      EXPECT_TRUE(std::all_of(part.begin() + M * N, part.end(), [](bf16_t b) { return b == 0xFFFF; })) << "fp8 wrote past M";
    }
    dy.poison();
    for (int64_t m = 0; m < kRows; ++m) {
      const QuantBuf q1{qc.p() + m * K, qs.p() + m * KB, K};
      ASSERT_TRUE(fast_fp8_gemv_q(q1, 1, w, dy.p() + m * N, nullptr).ok());
    }
    expect_rows_same(dy.get(), got, N, 0, kRows, "fp8 M=1 (each row alone) vs M=64");
  }
}

TEST(FastGemv, Fp8) {
  NEED_GPU();
  fp8_cases();
}

TEST(FastGemv, TcFp8) {
  NEED_GPU();
  TcOn tc;
  fp8_cases();
}

// Two weights of one K over the same codes in one launch (wq_a + wkv, shared w1 + w3): each
// output bit for bit the single call's, for shapes whose split-K factors differ, at 1, 7, 64 rows.
void fp8_pair_cases() {
  Rng rng(12);
  const int64_t K = 5120, KB = K / 32, Na = 1280, Nb = 512;
  Dev<bf16_t> dx(rng.act(kRows * K));
  Dev<uint8_t> qc(size_t(kRows * K));
  Dev<float> qs(size_t(kRows * KB));
  const QuantBuf q{qc.p(), qs.p(), kRows * K};
  ASSERT_TRUE(act_quant(dx.p(), kRows, K, q, nullptr).ok());
  Dev<uint8_t> wa(rng.e4m3(Na * K)), sa(rng.bytes(((Na + 31) / 32) * KB, 118, 132)), wb(rng.e4m3(Nb * K)), sb(rng.bytes(((Nb + 31) / 32) * KB, 118, 132));
  const Fp8W A{wa.p(), sa.p(), Na, K}, B{wb.p(), sb.p(), Nb, K};
  Dev<bf16_t> ya(size_t(kRows * Na)), yb(size_t(kRows * Nb));
  for (int64_t M : {int64_t(1), int64_t(7), kRows}) {
    SCOPED_TRACE("M=" + std::to_string(M));
    ya.poison();
    yb.poison();
    ASSERT_TRUE(fast_fp8_gemv_q(q, M, A, ya.p(), nullptr).ok());
    ASSERT_TRUE(fast_fp8_gemv_q(q, M, B, yb.p(), nullptr).ok());
    const auto want_a = ya.get(), want_b = yb.get();
    ya.poison();
    yb.poison();
    ASSERT_TRUE(fast_fp8_gemv2_q(q, M, A, ya.p(), B, yb.p(), nullptr).ok());
    expect_rows_same(ya.get(), want_a, Na, 0, M, "fp8 pair: a");
    expect_rows_same(yb.get(), want_b, Nb, 0, M, "fp8 pair: b");
  }
}

TEST(FastGemv, Fp8PairEqualsTwoCalls) {
  NEED_GPU();
  fp8_pair_cases();
}

TEST(FastGemv, TcFp8PairEqualsTwoCalls) {
  NEED_GPU();
  TcOn tc;
  fp8_pair_cases();
}

// ---- MXFP4 experts ------------------------------------------------------------------------------


void fp4_expert_cases() {
  Rng rng(12);
  struct Case { int64_t N, K, x_div; };
  // w1/w3 (N = I, K = D) and w2 (N = D, K = I) of D = 4096 / I = 2048 and D = 5120 / I = 3072;
  // 8 experts; x_div 8 (8 tokens x top-8 rows) or 1 (one x row per row); a ragged small case.
  for (Case cs : {Case{2048, 4096, 8}, Case{4096, 2048, 1}, Case{3072, 5120, 8}, Case{5120, 3072, 1}, Case{77, 2080, 4}}) {
    SCOPED_TRACE("N=" + std::to_string(cs.N) + " K=" + std::to_string(cs.K) + " x_div=" + std::to_string(cs.x_div));
    constexpr int kExperts = 8;
    const Fp4Set set(rng, cs.N, cs.K, cs.x_div, kExperts);
    const int64_t N = cs.N, K = cs.K, KB = K / 32;
    const QuantBuf& q = set.q;
    const Fp4W &wa = set.A, &wbw = set.B;
    const Dev<uint8_t>& qc = set.qc;
    const Dev<float>& qs = set.qs;
    const std::vector<int32_t> ex = expert_rows(rng, kExperts);
    const std::vector<bool> keep = kept_rows(ex);
    Dev<int32_t> dex(ex);
    Dev<bf16_t> ya(size_t(kRows * N)), yb(size_t(kRows * N));
    // exact references (skipped rows stay poisoned in both)
    ASSERT_TRUE(fp4_gemm2_q(q, kRows, cs.x_div, wa, wbw, dex.p(), ya.p(), yb.p(), nullptr).ok());
    const auto want_a = ya.get(), want_b = yb.get();
    ya.poison();
    ASSERT_TRUE(fast_fp4_gemv_q(q, kRows, cs.x_div, wa, dex.p(), ya.p(), nullptr).ok());
    const auto got = ya.get();
    expect_close(got, want_a, N, keep, "fp4 M=64 vs exact");
    for (int64_t m = 0; m < kRows; ++m)
      if (!keep[size_t(m)]) expect_rows_same(got, want_a, N, m, 1, "fp4 skipped row untouched");
    ya.poison();
    ASSERT_TRUE(fast_fp4_gemv_q(q, kRows, cs.x_div, wa, dex.p(), ya.p(), nullptr).ok());
    expect_rows_same(ya.get(), got, N, 0, kRows, "fp4 determinism");
    set_fast_gemv_occupancy(true);  // the register-capped variant: the same bits
    ASSERT_TRUE(fast_fp4_gemv_q(q, kRows, cs.x_div, wa, dex.p(), ya.p(), nullptr).ok());
    set_fast_gemv_occupancy(false);
    expect_rows_same(ya.get(), got, N, 0, kRows, "fp4 occupancy variant");
    // gemv2: a as the single-weight call bit for bit, b close to the exact
    ya.poison();
    yb.poison();
    ASSERT_TRUE(fast_fp4_gemv2_q(q, kRows, cs.x_div, wa, wbw, dex.p(), ya.p(), yb.p(), nullptr).ok());
    expect_rows_same(ya.get(), got, N, 0, kRows, "fp4 gemv2 a vs fp4 gemv");
    const auto got_b = yb.get();
    expect_close(got_b, want_b, N, keep, "fp4 gemv2 b vs exact");
    for (int64_t M : {3, 7}) {
      ya.poison();
      yb.poison();
      ASSERT_TRUE(fast_fp4_gemv2_q(q, M, cs.x_div, wa, wbw, dex.p(), ya.p(), yb.p(), nullptr).ok());
      expect_rows_same(ya.get(), got, N, 0, M, "fp4 gemv2 a M=3/7 vs M=64");
      expect_rows_same(yb.get(), got_b, N, 0, M, "fp4 gemv2 b M=3/7 vs M=64");
    }
    // each row alone: its own x row (x_div applied by hand), expert and output row
    ya.poison();
    yb.poison();
    for (int64_t m = 0; m < kRows; ++m) {
      const int64_t xm = m / cs.x_div;
      const QuantBuf q1{qc.p() + xm * K, qs.p() + xm * KB, K};
      ASSERT_TRUE(fast_fp4_gemv2_q(q1, 1, 1, wa, wbw, dex.p() + m, ya.p() + m * N, yb.p() + m * N, nullptr).ok());
    }
    expect_rows_same(ya.get(), got, N, 0, kRows, "fp4 gemv2 a M=1 vs M=64");
    expect_rows_same(yb.get(), got_b, N, 0, kRows, "fp4 gemv2 b M=1 vs M=64");
    // expert == nullptr is expert 0 for every row
    std::vector<int32_t> zeros(kRows, 0);
    dex.set(zeros);
    ASSERT_TRUE(fast_fp4_gemv_q(q, 7, cs.x_div, wa, dex.p(), ya.p(), nullptr).ok());
    const auto with_zero = ya.get();
    ya.poison();
    ASSERT_TRUE(fast_fp4_gemv_q(q, 7, cs.x_div, wa, nullptr, ya.p(), nullptr).ok());
    expect_rows_same(ya.get(), with_zero, N, 0, 7, "fp4 expert nullptr vs zeros");
  }
}

TEST(FastGemv, Fp4Experts) {
  NEED_GPU();
  fp4_expert_cases();
}

TEST(FastGemv, TcFp4Experts) {
  NEED_GPU();
  TcOn tc;
  fp4_expert_cases();
}

// Rows of several tokens grouped by expert (tc_fp4_gemv group_rows) compute every output bit for
// bit as ungrouped, for w1 + w3 pairs and single weights: few experts (groups of more than 8 rows,
// so several leaders per expert), skipped rows untouched, x_div 1 and 6, M up to 64, 2 K chunks.
TEST(FastGemv, TcFp4GroupedEqualsUngrouped) {
  NEED_GPU();
  TcOn tc;
  Rng rng(31);
  struct Case { int64_t N, K, x_div; int experts; };
  for (Case c : {Case{2304, 5120, 6, 3}, Case{5120, 2304, 1, 2}, Case{200, 1024, 6, 16}, Case{77, 2080, 1, 5}}) {
    SCOPED_TRACE("N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) + " x_div=" + std::to_string(c.x_div) + " experts=" + std::to_string(c.experts));
    const Fp4Set set(rng, c.N, c.K, c.x_div, c.experts);
    const int64_t N = c.N;
    const QuantBuf& q = set.q;
    const Fp4W &A = set.A, &B = set.B;
    std::vector<int32_t> ex(kRows);
    for (auto& e : ex) e = rng.uniform(-1, c.experts - 1);
    ex[5] = -1;
    Dev<int32_t> dex(ex);
    Dev<bf16_t> ya(size_t(kRows * N)), yb(size_t(kRows * N));
    for (int64_t M : {2, 7, 36, 64}) {
      SCOPED_TRACE("M=" + std::to_string(M));
      std::vector<bf16_t> out[2][2];
      for (int grouped = 0; grouped < 2; ++grouped) {
        ya.poison();
        yb.poison();
        ASSERT_TRUE(tc_fp4_gemv(q, M, c.x_div, A, ya.p(), &B, yb.p(), dex.p(), nullptr, grouped == 1).ok());
        out[grouped][0] = ya.get();
        out[grouped][1] = yb.get();
      }
      EXPECT_TRUE(out[1][0] == out[0][0]) << "w1 grouped != ungrouped";
      EXPECT_TRUE(out[1][1] == out[0][1]) << "w3 grouped != ungrouped";
      ya.poison();
      ASSERT_TRUE(tc_fp4_gemv(q, M, c.x_div, A, ya.p(), nullptr, nullptr, dex.p(), nullptr, true).ok());
      EXPECT_TRUE(ya.get() == out[0][0]) << "single weight grouped != ungrouped";
      for (int64_t m = 0; m < M; ++m)
        if (ex[size_t(m)] < 0) expect_rows_same(out[1][0], std::vector<bf16_t>(size_t(kRows * N), 0xFFFF), N, m, 1, "skipped row untouched");
    }
  }
}

// The tensor-core kernels' K chunks (a cluster of nk CTAs): a function of K alone, every chunk
// non-empty and 32-aligned, at most 8, the tile <= 32 KB for released K.
TEST(FastGemv, TcChunks) {
  for (bool fp4 : {false, true})
    for (int64_t K = 32; K <= 20000; K += 32) {
      const TcChunks c = tc_chunks(K, fp4);
      SCOPED_TRACE("K=" + std::to_string(K) + (fp4 ? " fp4" : " fp8"));
      ASSERT_GE(c.nk, 1);
      ASSERT_LE(c.nk, 8);
      ASSERT_EQ(c.kc % (fp4 ? 256 : 128), 0);
      ASSERT_GT(K - int64_t(c.nk - 1) * c.kc, 0);  // the last chunk is not empty
      ASSERT_LE(K, int64_t(c.nk) * c.kc);
      if (K <= 8 * (fp4 ? 4096 : 2048)) {
        ASSERT_LE(c.kc, fp4 ? 4096 : 2048);
      }
    }
  EXPECT_EQ(tc_chunks(5120, false).nk, 3);
  EXPECT_EQ(tc_chunks(5120, true).nk, 2);
  EXPECT_EQ(tc_chunks(2304, true).nk, 1);
  EXPECT_EQ(tc_chunks(8192, false).kc, 2048);
}

// ---- FP8 weights x bf16 activations (grouped wo_a) --------------------------------------------

// tc_fp8_bf16x_gemv against the exact bf16 GEMV over the dequantised weight (the reference's BF16
// wo_a: e4m3 x e8m0, exact in bf16): G groups of x [M, K] (row stride G * K) times w [N, K].
void fp8_bf16x_case(Rng& rng, int64_t G, int64_t K, int64_t N) {
  SCOPED_TRACE("G=" + std::to_string(G) + " K=" + std::to_string(K) + " N=" + std::to_string(N));
  const int64_t ldx = G * K, NT = G * N, KB = K / 32;
  const auto codes = rng.e4m3(NT * K);
  const auto scales = rng.bytes((NT / 32) * KB, 118, 124);  // 2^-9 .. 2^-3
  std::vector<bf16_t> wbf(static_cast<size_t>(NT * K));
  for (int64_t n = 0; n < NT; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const float v = e4m3_to_f32(codes[size_t(n * K + k)]) * e8m0_to_f32(scales[size_t((n / 32) * KB + k / 32)]);
      wbf[size_t(n * K + k)] = bf16_bits_from_f32(v);
      ASSERT_EQ(bf16_to_f32(wbf[size_t(n * K + k)]), v) << "the dequantised weight is exact in bf16";
    }
  Dev<bf16_t> dx(rng.act(kRows * ldx, 0.5f)), dw(wbf);
  Dev<uint8_t> dc(codes), ds(scales);
  const Fp8W w8{dc.p(), ds.p(), NT, K};
  auto run = [&](bool fast, int64_t M, bool each_row) {
    Dev<bf16_t> y(static_cast<size_t>(kRows * NT));
    for (int64_t m = 0; m < (each_row ? M : 1); ++m) {
      const int64_t rows = each_row ? 1 : M;
      const bf16_t* x = dx.p() + m * ldx;
      bf16_t* yo = y.p() + m * NT;
      EXPECT_TRUE((fast ? tc_fp8_bf16x_gemv(x, rows, ldx, N, K, w8, yo, nullptr)
                        : bf16_gemm(x, rows, K, ldx, dw.p(), N, yo, NT, GemmOut::kBf16, G, K, N * K, N, nullptr))
                      .ok());
    }
    return y.get();
  };
  const auto want = run(false, kRows, false), got = run(true, kRows, false);
  expect_close(got, want, NT, {}, "fp8 x bf16 gemv M=64 vs exact bf16");
  expect_rows_same(run(true, kRows, false), got, NT, 0, kRows, "fp8 x bf16 determinism");
  expect_rows_same(run(true, 3, false), got, NT, 0, 3, "fp8 x bf16 M=3 vs M=64");
  expect_rows_same(run(true, 7, false), got, NT, 0, 7, "fp8 x bf16 M=7 vs M=64");
  expect_rows_same(run(true, kRows, true), got, NT, 0, kRows, "fp8 x bf16 M=1 (each row) vs M=64");
}

TEST(FastGemv, TcFp8Bf16xGrouped) {
  NEED_GPU();
  Rng rng(17);
  fp8_bf16x_case(rng, 8, 4096, 1024);  // wo_a at the released dims: 8 x (4096 -> 1024), 2 K chunks
  fp8_bf16x_case(rng, 2, 256, 64);     // the tiny fixtures' shape class
  fp8_bf16x_case(rng, 1, 5120, 96);    // ungrouped, 3 K chunks
}

// ---- scales by cp.async against plain loads ------------------------------------------------------

// set_tc_async_scales for a scope (the previous value restored).
struct AsyncScalesAs {
  bool was;
  explicit AsyncScalesAs(bool on) : was(tc_async_scales()) { set_tc_async_scales(on); }
  ~AsyncScalesAs() { set_tc_async_scales(was); }
};

// The kernels compute every output bit for bit the same whichever way their scales are staged
// (4-byte cp.async or plain loads) and whatever their shared memory holds (tc_lean_smem), for FP8 pairs and MXFP4 experts with skipped rows, at row
// counts that stage 1, 3, 8 and 8 + 1 activation rows (zeros past M); shapes with 1, 2, 3 and 4 K
// chunks, N not a multiple of 16, and Ks that are not a multiple of 128 (MXFP4: plain loads).
TEST(FastGemv, TcAsyncScalesEqualPlainLoads) {
  NEED_GPU();
  TcOn tc;
  Rng rng(19);
  // plain loads, then cp.async (lean shared memory), then cp.async with lean off (8 staged rows,
  // f32 MXFP4 scale copies): all three the same bits; returns (plain, each of the others in turn)
  auto both = [](auto call) {
    std::vector<bf16_t> out[3];
    for (int v = 0; v < 3; ++v) {
      AsyncScalesAs as(v >= 1);
      set_tc_lean_smem(v != 2);
      out[v] = call();
    }
    set_tc_lean_smem(true);
    EXPECT_TRUE(out[2] == out[1]) << "lean shared memory off != on";
    return std::make_pair(out[0], out[1]);
  };
  struct Fp8Case { int64_t Na, Nb, K; };
  for (Fp8Case c : {Fp8Case{1280, 512, 5120}, Fp8Case{2048, 0, 1280}, Fp8Case{5120, 0, 8192}, Fp8Case{1000, 72, 2304}, Fp8Case{96, 0, 2080}}) {
    SCOPED_TRACE("fp8 Na=" + std::to_string(c.Na) + " Nb=" + std::to_string(c.Nb) + " K=" + std::to_string(c.K));
    Fp8PairSet set(rng, c.Na, c.Nb, c.K);
    for (int64_t M : {1, 3, 8, 9, 64}) {
      SCOPED_TRACE("M=" + std::to_string(M));
      const auto [plain, async] = both([&] { return set.gemv(M); });
      ASSERT_EQ(plain.size(), async.size());
      EXPECT_TRUE(plain == async) << "cp.async scales != plain loads";
    }
  }
  struct Fp4Case { int64_t N, K, x_div; };
  for (Fp4Case c : {Fp4Case{2304, 5120, 6}, Fp4Case{5120, 2304, 1}, Fp4Case{200, 1024, 2}, Fp4Case{77, 2080, 4}}) {
    SCOPED_TRACE("fp4 N=" + std::to_string(c.N) + " K=" + std::to_string(c.K));
    constexpr int kExperts = 8;
    const Fp4Set set(rng, c.N, c.K, c.x_div, kExperts);
    const int64_t N = c.N;
    const QuantBuf& q = set.q;
    const Fp4W &A = set.A, &B = set.B;
    std::vector<int32_t> ex(kRows);
    for (auto& e : ex) e = rng.uniform(-1, kExperts - 1);
    ex[1] = -1;
    Dev<int32_t> dex(ex);
    Dev<bf16_t> ya(size_t(kRows * N)), yb(size_t(kRows * N));
    for (int64_t M : {1, 6, 64}) {
      SCOPED_TRACE("M=" + std::to_string(M));
      const auto [plain, async] = both([&] {
        ya.poison();
        yb.poison();
        EXPECT_TRUE(tc_fp4_gemv(q, M, c.x_div, A, ya.p(), &B, yb.p(), dex.p(), nullptr).ok());
        auto v = ya.get();
        const auto vb = yb.get();
        v.insert(v.end(), vb.begin(), vb.end());
        return v;
      });
      EXPECT_TRUE(plain == async) << "cp.async scales != plain loads";
    }
  }
}

// ---- split K folded through global memory against the cluster fold -----------------------------

// set_tc_global_fold for a scope (the previous value restored).
struct GlobalFoldAs {
  bool was;
  explicit GlobalFoldAs(bool on) : was(tc_global_fold()) { set_tc_global_fold(on); }
  ~GlobalFoldAs() { set_tc_global_fold(was); }
};

// Every tensor-core GEMV over a sweep of shapes, for the tests that compare two ways of running
// them bit for bit: same(what, call) runs call (which returns the outputs of one launch, poisoned
// first) under each variant and compares. FP8 pairs at fp8 shapes and rows 1, 9, 64; MXFP4
// experts at fp4 shapes, rows 1, 6, 64, grouped by expert or not, some rows skipped (expert -1);
// with special_scales one MXFP4 expert's weight scales hold the e8m0 codes 0 (2^-127) and 255
// (NaN); with bf16x, FP8 x bf16 at the released grouped wo_a (8 x (4096 -> 1024), 2 K chunks).
struct TcSweep {
  struct Fp8Case { int64_t Na, Nb, K; };
  struct Fp4Case { int64_t N, K, x_div; };
  std::vector<Fp8Case> fp8;
  std::vector<Fp4Case> fp4;
  bool special_scales = false;
  bool bf16x = true;
};
template <typename Same>
void tc_sweep(Rng& rng, const TcSweep& sw, Same same) {
  for (TcSweep::Fp8Case c : sw.fp8) {
    SCOPED_TRACE("fp8 Na=" + std::to_string(c.Na) + " Nb=" + std::to_string(c.Nb) + " K=" + std::to_string(c.K));
    Fp8PairSet set(rng, c.Na, c.Nb, c.K);
    for (int64_t M : {1, 9, 64}) {
      SCOPED_TRACE("M=" + std::to_string(M));
      same("fp8", [&] { return set.gemv(M); });
    }
  }
  for (TcSweep::Fp4Case c : sw.fp4) {
    SCOPED_TRACE("fp4 N=" + std::to_string(c.N) + " K=" + std::to_string(c.K));
    constexpr int kExperts = 8;
    Fp4Set set(rng, c.N, c.K, c.x_div, kExperts);
    if (sw.special_scales) {  // expert 0 of A: 2^-127 and NaN scales in its first stripe, 2^-127 further on
      std::vector<uint8_t> sc = rng.bytes(c.N * (c.K / 32) * kExperts, 118, 130);
      sc[0] = 0;
      sc[3] = 255;
      sc[size_t(c.K / 32) * 5 + 1] = 0;
      sc[size_t(c.K / 32) * std::min<int64_t>(c.N - 1, 40)] = 0;
      set.sa.set(sc);
    }
    std::vector<int32_t> ex(kRows);
    for (auto& e : ex) e = rng.uniform(-1, kExperts - 1);
    ex[1] = -1;
    ex[2] = 0;
    Dev<int32_t> dex(ex);
    Dev<bf16_t> ya(size_t(kRows * c.N)), yb(size_t(kRows * c.N));
    for (int64_t M : {1, 6, 64})
      for (bool grouped : {false, true}) {
        SCOPED_TRACE("M=" + std::to_string(M) + (grouped ? " grouped" : ""));
        same("fp4", [&] {
          ya.poison();
          yb.poison();
          EXPECT_TRUE(tc_fp4_gemv(set.q, M, c.x_div, set.A, ya.p(), &set.B, yb.p(), dex.p(), nullptr, grouped).ok());
          auto v = ya.get();
          const auto vb = yb.get();
          v.insert(v.end(), vb.begin(), vb.end());
          return v;
        });
      }
  }
  if (sw.bf16x) {
    const int64_t G = 8, K = 4096, N = 1024, ldx = G * K, NT = G * N;
    Dev<bf16_t> dx(rng.act(kRows * ldx, 0.5f)), y(size_t(kRows * NT));
    Dev<uint8_t> dc(rng.e4m3(NT * K)), ds(rng.bytes((NT / 32) * (K / 32), 118, 124));
    for (int64_t M : {1, 6}) {
      SCOPED_TRACE("bf16x M=" + std::to_string(M));
      same("fp8 x bf16", [&] {
        y.poison();
        EXPECT_TRUE(tc_fp8_bf16x_gemv(dx.p(), M, ldx, N, K, Fp8W{dc.p(), ds.p(), NT, K}, y.p(), nullptr).ok());
        return y.get();
      });
    }
  }
}

// The last-arriving CTA's fold through the per-stream workspace adds the same partials in the same
// order as the cluster's: the same bits for FP8 pairs, MXFP4 experts (skipped rows, rows grouped
// by expert or not) and the FP8 x bf16 kernel, at 2 to 4 K chunks and 1 to 64 rows; run twice, so
// a counter left non-zero by the first launch would break the second; and the launches did fold
// through the workspace (tc_global_fold_launches).
TEST(FastGemv, TcGlobalFoldEqualsCluster) {
  NEED_GPU();
  TcOn tc;
  Rng rng(29);
  const int64_t launches0 = tc_global_fold_launches();
  const TcSweep sw{{{5120, 0, 8192}, {1280, 512, 5120}, {96, 0, 2080}}, {{2304, 5120, 6}, {77, 8320, 4}}};
  for (const auto& c : sw.fp8) ASSERT_GT(tc_chunks(c.K, false).nk, 1);
  for (const auto& c : sw.fp4) ASSERT_GT(tc_chunks(c.K, true).nk, 1);
  ASSERT_GT(tc_chunks(4096, false).nk, 1);  // bf16x
  tc_sweep(rng, sw, [](const char* what, auto call) {
    std::vector<bf16_t> out[4];
    for (int v = 0; v < 4; ++v) {
      GlobalFoldAs g(v >= 1);
      set_tc_cluster_fold_ctas(v == 3 ? 1000 : 0);  // 3: global on, one-row launches of <= 1000 CTAs by the cluster
      out[v] = call();
    }
    set_tc_cluster_fold_ctas(0);
    EXPECT_FALSE(out[0].empty());
    EXPECT_TRUE(out[1] == out[0]) << what << ": global fold != cluster fold";
    EXPECT_TRUE(out[2] == out[0]) << what << ": a second global fold differs (a counter left behind?)";
    EXPECT_TRUE(out[3] == out[0]) << what << ": the mixed rule (tc_cluster_fold_ctas) differs";
  });
  EXPECT_GT(tc_global_fold_launches(), launches0) << "no launch folded through the workspace";
}

// The MXFP4 lean loop (set_tc_lean_loop) computes every output bit for bit as the plain loop:
// experts at the released w1 / w3 and w2 shapes (2 and 1 K chunks), a one-chunk and a 3-chunk
// ragged shape, 1 to 64 rows grouped by expert or not, and weight scales with the e8m0 special
// codes 0 and 255 (the loop's exact widening path); a K that is not a multiple of 128 keeps the
// plain loop (no raw scales) and is covered by TcAsyncScalesEqualPlainLoads.
TEST(FastGemv, TcLeanLoopSameBits) {
  NEED_GPU();
  TcOn tc;
  Rng rng(31);
  const bool was = tc_lean_loop();
  const auto same = [](const char* what, auto call) {
    set_tc_lean_loop(false);
    const std::vector<bf16_t> plain = call();
    set_tc_lean_loop(true);
    const std::vector<bf16_t> lean = call();
    EXPECT_FALSE(plain.empty());
    EXPECT_TRUE(plain == lean) << what << ": lean loop != plain loop";
  };
  tc_sweep(rng, TcSweep{{}, {{2304, 5120, 6}, {5120, 2304, 1}, {200, 1024, 2}, {77, 8320, 4}}, false, false}, same);
  tc_sweep(rng, TcSweep{{}, {{2304, 5120, 6}, {200, 1024, 2}}, true, false}, same);
  set_tc_lean_loop(was);
}

// Several stripes per CTA (set_tc_stripes: the next stripe's tile copied while this one computes)
// give every output bit for bit as one stripe per CTA: FP8 pairs with 1 to 4 K chunks, MXFP4
// experts at the released w1 / w3 and w2 shapes and a ragged 5-stripe shape (a CTA's last group
// short of S stripes), rows 1 to 64, grouped or not, folded through the workspace or the cluster;
// both kinds on (the product runs grouped MXFP4 launches only).
TEST(FastGemv, TcStripesSameBits) {
  NEED_GPU();
  TcOn tc;
  Rng rng(37);
  const int64_t launches0 = tc_stripes_launches();
  const TcSweep sw{{{5120, 0, 8192}, {1280, 512, 5120}, {96, 0, 2080}}, {{2304, 5120, 6}, {5120, 2304, 1}, {77, 8320, 4}}, true, false};
  tc_sweep(rng, sw, [](const char* what, auto call) {
    set_tc_stripes(0, 3);
    const std::vector<bf16_t> one = call();
    EXPECT_FALSE(one.empty());
    for (int64_t s : {2, 3, 7})
      for (bool global : {true, false}) {
        GlobalFoldAs g(global);
        set_tc_stripes(s, 3);
        EXPECT_TRUE(call() == one) << what << ": " << s << " stripes per CTA (" << (global ? "global" : "cluster") << " fold) != one";
      }
  });
  set_tc_stripes(4, 2);  // the product's
  EXPECT_GT(tc_stripes_launches(), launches0) << "no launch ran several stripes per CTA";
}

// ---- bf16 ---------------------------------------------------------------------------------------

// One grouped case: G groups of x [M, K] (row stride ldx = G * K) times w [N, K], y [M, G * N].
void bf16_case(Rng& rng, int64_t G, int64_t K, int64_t N, GemmOut out) {
  SCOPED_TRACE("G=" + std::to_string(G) + " K=" + std::to_string(K) + " N=" + std::to_string(N) + " out=" + std::to_string(int(out)));
  const int64_t ldx = G * K, ldy = G * N;
  Dev<bf16_t> dx(rng.act(kRows * ldx, 0.5f)), dw(rng.bf16_uniform(G * N * K, 0.05f));
  const bool f32 = out != GemmOut::kBf16;
  auto call = [&](bool fast, int64_t M, int64_t m0, void* y) {
    const bf16_t* x = dx.p() + m0 * ldx;
    return fast ? fast_bf16_gemv(x, M, K, ldx, dw.p(), N, y, ldy, out, G, K, N * K, N, nullptr)
                : bf16_gemm(x, M, K, ldx, dw.p(), N, y, ldy, out, G, K, N * K, N, nullptr);
  };
  // f32-add adds onto a prefilled y: the same prefill for every call
  std::vector<float> base(size_t(kRows * ldy));
  for (size_t i = 0; i < base.size(); ++i) base[i] = float(int(i % 17) - 8) * 0.125f;
  auto run = [&](auto tag, bool fast, int64_t M, bool each_row) {
    using T = decltype(tag);
    Dev<T> y(size_t(kRows * ldy));
    if constexpr (std::is_same_v<T, float>)
      if (out == GemmOut::kF32Add) y.set(base);
    if (each_row) {
      for (int64_t m = 0; m < M; ++m) EXPECT_TRUE(call(fast, 1, m, y.p() + m * ldy).ok());
    } else {
      EXPECT_TRUE(call(fast, M, 0, y.p()).ok());
    }
    return y.get();
  };
  auto check = [&](auto tag) {
    const auto want = run(tag, false, kRows, false);
    const auto got = run(tag, true, kRows, false);
    expect_close(got, want, ldy, {}, f32 ? "bf16 gemv (f32 out) M=64 vs exact" : "bf16 gemv M=64 vs exact");
    expect_rows_same(run(tag, true, kRows, false), got, ldy, 0, kRows, "bf16 determinism");
    set_fast_gemv_occupancy(true);  // the register-capped variant: the same bits
    expect_rows_same(run(tag, true, kRows, false), got, ldy, 0, kRows, "bf16 occupancy variant");
    set_fast_gemv_occupancy(false);
    expect_rows_same(run(tag, true, 3, false), got, ldy, 0, 3, "bf16 M=3 vs M=64");
    expect_rows_same(run(tag, true, 7, false), got, ldy, 0, 7, "bf16 M=7 vs M=64");
    expect_rows_same(run(tag, true, kRows, true), got, ldy, 0, kRows, "bf16 M=1 (each row) vs M=64");
  };
  if (f32) check(float{});
  else check(bf16_t{});
}

TEST(FastGemv, Bf16Grouped) {
  NEED_GPU();
  Rng rng(13);
  bf16_case(rng, 16, 512, 1024, GemmOut::kBf16);   // grouped, 16 x (512 -> 1024)
  bf16_case(rng, 16, 2048, 1024, GemmOut::kBf16);  // wo_a: 16 x (2048 -> 1024)
  bf16_case(rng, 1, 5120, 700, GemmOut::kF32);     // compressor-like f32 projection (split K)
  bf16_case(rng, 2, 1024, 96, GemmOut::kF32Add);   // f32 accumulate onto y
}

TEST(FastGemv, Bf16Head) {
  NEED_GPU();
  Rng rng(14);
  bf16_case(rng, 1, 4096, 129280, GemmOut::kF32);  // the LM head (1 GB of weight)
}

// For a profiler (tools/device_ncu_gemv.sh runs it under Nsight Compute): three launches each of
// the tensor-core GEMVs at released decode shapes, one row (MXFP4: 6 expert rows); disabled in
// normal runs. Checks only that the calls succeed.
TEST(FastGemv, DISABLED_ProfileShapes) {
  NEED_GPU();
  TcOn tc;
  Rng rng(23);
  const int64_t D = 5120, I = 2304, Q = 32768, QL = 1280, O = 8192;
  Dev<uint8_t> w(rng.bytes(Q * QL)), ws(rng.bytes(Q * QL / 8, 118, 130)), qc(size_t(8 * O));  // scales: 6 experts of I x D / 32
  Dev<float> qs(rng.act(8 * O / 32).size());
  Dev<bf16_t> dx(rng.act(8 * O)), y(size_t(8 * Q));
  const QuantBuf q{qc.p(), qs.p(), 8 * O};
  ASSERT_TRUE(act_quant(dx.p(), 1, O, q, nullptr).ok());
  std::vector<int32_t> ex = {0, 1, 2, 3, 4, 5};
  Dev<int32_t> dex(ex);
  for (int rep = 0; rep < 3; ++rep) {
    ASSERT_TRUE(tc_fp8_gemv(q, 1, Fp8W{w.p(), ws.p(), Q, QL}, y.p(), nullptr, nullptr, nullptr).ok());  // wq_b
    ASSERT_TRUE(tc_fp8_gemv(q, 1, Fp8W{w.p(), ws.p(), D, O}, y.p(), nullptr, nullptr, nullptr).ok());   // wo_b
    const int64_t eb = I * D / 2, esb = I * D / 32;
    ASSERT_TRUE(tc_fp4_gemv(q, 6, 1, Fp4W{w.p(), ws.p(), I, D, eb, esb}, y.p(), nullptr, nullptr, dex.p(), nullptr).ok());  // experts w1
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(FastGemv, Bench) {
  NEED_GPU();
  ASSERT_TRUE(fast_gemv_bench().ok());
}

}  // namespace
}  // namespace fb::cuda
