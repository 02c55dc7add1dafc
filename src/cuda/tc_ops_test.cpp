// The tensor-core paths of prefill steps (tc_gemm.h) against the CPU reference, within the
// written-down tolerances below (split from ops_test.cpp; the same test binary). Label: gpu.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "base/fmath.h"
#include "cpu/ops.h"
#include "cuda/device.h"
#include "cuda/gpu_test_util.h"
#include "cuda/ops.h"
#include "cuda/ops_test_util.h"
#include "cuda/tc_gemm.h"

namespace fb::cuda {
namespace {

using namespace ops_test_util;  // bf16_t, Dev, have_gpu, Rng, expect_same, ...
#define NEED_GPU() FB_NEED_GPU()

// ---- tensor-core GEMMs of prefill steps (tc_gemm.h) -------------------------------------------
// Not bit-identical by design: the products are the reference's (operands expanded exactly to
// bf16, checked bit for bit below), the f32 sum over K runs in the tensor cores' order. Written-down
// tolerance per output, with S = the CPU's f32 result and A = sum_k |x_k w_k| (exact, in double):
//   |tc - cpu| <= 2^-7 * max(|tc|, |cpu|)  (one bf16 rounding on each side)
//               + K * 2^-22 * A           (two f32 sums of K terms in different orders; 4x the
//                                          textbook (K-1) u A bound for the hardware's accumulator)
// NaN masks must match exactly. The measured worst case (in units of that bound) is printed.
struct TcCheck {
  double worst = 0;  // max |tc - cpu| / tol
  size_t nan_diff = 0, over = 0, n = 0;
  void add(float tc, float cpu, double A, int64_t K) {
    ++n;
    if (std::isnan(tc) != std::isnan(cpu)) {
      ++nan_diff;
      return;
    }
    if (std::isnan(tc)) return;
    const double tol = std::ldexp(std::max(std::fabs(double(tc)), std::fabs(double(cpu))), -7) + double(K) * std::ldexp(A, -22) + 1e-30;
    const double r = std::fabs(double(tc) - double(cpu)) / tol;
    worst = std::max(worst, r);
    if (r > 1.0) ++over;
  }
  void expect(const char* what) const {
    EXPECT_EQ(nan_diff, 0u) << what << ": NaN masks differ";
    EXPECT_EQ(over, 0u) << what << ": " << over << " of " << n << " outputs outside the tolerance (worst " << worst << " x tol)";
    std::printf("[ tc ] %s: %zu outputs, worst |tc - cpu| = %.3g x tolerance\n", what, n, worst);
  }
};

// TcCheck of an FP8 GEMM's outputs (got) against the CPU's (want), x [M, K] bf16 activations,
// w [N, K] e4m3 codes with 32x32 e8m0 block scales ws: the bound A of each output sums |x w| over
// the act_quant values of x and the exact weight values.
void check_fp8_gemm(const std::vector<bf16_t>& x, const std::vector<uint8_t>& w, const std::vector<uint8_t>& ws, int64_t M, int64_t N,
                    int64_t K, const std::vector<bf16_t>& got, const std::vector<bf16_t>& want, const char* what) {
  const int64_t KB = K / 32;
  std::vector<uint8_t> codes(static_cast<size_t>(M * K));
  std::vector<float> scales(static_cast<size_t>(M * KB));
  for (int64_t m = 0; m < M; ++m) cpu::act_quant_row(&x[size_t(m * K)], K, &codes[size_t(m * K)], &scales[size_t(m * KB)]);
  TcCheck chk;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double A = 0;
      for (int64_t k = 0; k < K; ++k)
        A += std::fabs(double(e4m3_to_f32(codes[size_t(m * K + k)])) * scales[size_t(m * KB + k / 32)] * e4m3_to_f32(w[size_t(n * K + k)]) *
                       e8m0_to_f32(ws[size_t((n / 32) * KB + k / 32)]));
      chk.add(bf16_to_f32(got[size_t(m * N + n)]), bf16_to_f32(want[size_t(m * N + n)]), A, K);
    }
  chk.expect(what);
}

TEST(CudaOps, TensorCoreFp8Gemm) {
  NEED_GPU();
  auto tc = make_tc();
  ASSERT_TRUE(tc);
  Rng rng(11);
  struct Case { int64_t M, K, N; bool nan; };
  // Prefill-sized row counts (ragged), released K, a wide N, NaN codes.
  for (Case cs : {Case{192, 5120, 1536, false}, Case{65, 1536, 4096, false}, Case{130, 4096, 544, true}, Case{7, 2048, 96, false}}) {
    const int64_t KB = cs.K / 32;
    auto x = rng.act(cs.M * cs.K);
    auto w = rng.e4m3_codes(cs.N * cs.K);
    if (cs.nan) {
      for (int i = 0; i < 6; ++i) w[size_t(rng.uniform(0, int(cs.N * cs.K) - 1))] = 0x7F;
      x[size_t(rng.uniform(0, int(cs.M * cs.K) - 1))] = 0x7FC0;
    }
    auto ws = rng.bytes(((cs.N + 31) / 32) * KB, 118, 132);
    std::vector<bf16_t> want(static_cast<size_t>(cs.M * cs.N));
    cpu::fp8_gemm(x.data(), cs.M, view(DType::kF8E4M3, {cs.N, cs.K}, w.data()), view(DType::kF8E8M0, {(cs.N + 31) / 32, KB}, ws.data()),
                  want.data());
    Dev<bf16_t> dx(x), dy(want.size()), dwb(static_cast<size_t>(cs.N * cs.K));
    Dev<uint8_t> dw(w), dws(ws), qc(static_cast<size_t>(cs.M * cs.K));
    Dev<float> qs(static_cast<size_t>(cs.M * KB));
    QuantBuf q{qc.p(), qs.p(), cs.M * cs.K};
    const Fp8W fw{dw.p(), dws.p(), cs.N, cs.K};
    ASSERT_TRUE(tc_fp8_gemm(*tc, dx.p(), cs.M, fw, dy.p(), q, nullptr).ok());
    const auto got = dy.get();
    // The expanded weight is exact: e4m3 value times the block scale, as bf16 bits.
    ASSERT_TRUE(tc_dequant_fp8(fw, dwb.p(), nullptr).ok());
    const auto wb = dwb.get();
    std::vector<bf16_t> wb_want(wb.size());
    for (int64_t n = 0; n < cs.N; ++n)
      for (int64_t k = 0; k < cs.K; ++k)
        wb_want[size_t(n * cs.K + k)] =
            bf16_bits_from_f32(e4m3_to_f32(w[size_t(n * cs.K + k)]) * e8m0_to_f32(ws[size_t((n / 32) * KB + k / 32)]));
    expect_same(wb, wb_want, "tc_dequant_fp8");
    check_fp8_gemm(x, w, ws, cs.M, cs.N, cs.K, got, want, "tc_fp8_gemm");  // tolerance against the CPU reference
  }
}

TEST(CudaOps, TensorCoreFp4ExpertGroups) {
  NEED_GPU();
  auto tc = make_tc();
  ASSERT_TRUE(tc);
  Rng rng(12);
  // One expert's group as the routed path runs it: gathered activation rows (src / topk), the
  // expert's exact bf16 weight, one matmul; vs cpu::fp4_gemm row by row.
  const int64_t T = 96, topk = 3, K = 5120, N = 2304, E = 2, KB = K / 32;
  auto x = rng.act(T * K);
  const int64_t wbytes = N * K / 2, sbytes = N * KB;
  auto w = rng.bytes(wbytes * E);
  auto ws = rng.bytes(sbytes * E, 118, 130);
  std::vector<int32_t> src;  // (row, slot) pairs of expert 1: every third pair
  for (int64_t i = 1; i < T * topk; i += 3) src.push_back(int32_t(i));
  const int64_t n = int64_t(src.size());
  Dev<bf16_t> dx(x), xg(static_cast<size_t>(n * K)), wb(static_cast<size_t>(N * K)), dy(static_cast<size_t>(n * N));
  Dev<uint8_t> dw(w), dws(ws), qc(static_cast<size_t>(T * K));
  Dev<float> qs(static_cast<size_t>(T * KB));
  Dev<int32_t> dsrc(src);
  QuantBuf q{qc.p(), qs.p(), T * K};
  const Fp4W fw{dw.p(), dws.p(), N, K, wbytes, sbytes};
  ASSERT_TRUE(act_quant(dx.p(), T, K, q, nullptr).ok());
  ASSERT_TRUE(tc_dequant_act(q, K, dsrc.p(), topk, n, xg.p(), nullptr).ok());
  ASSERT_TRUE(tc_dequant_fp4(fw, 1, wb.p(), nullptr).ok());
  ASSERT_TRUE(tc->matmul(xg.p(), n, K, K, wb.p(), N, dy.p(), N, GemmOut::kBf16, 1, 0, 0, 0, nullptr).ok());
  const auto got = dy.get(), wbh = wb.get(), xgh = xg.get();
  // Both expansions exact.
  std::vector<uint8_t> codes(static_cast<size_t>(T * K));
  std::vector<float> scales(static_cast<size_t>(T * KB));
  for (int64_t t = 0; t < T; ++t) cpu::act_quant_row(&x[size_t(t * K)], K, &codes[size_t(t * K)], &scales[size_t(t * KB)]);
  std::vector<bf16_t> xg_want(xgh.size()), wb_want(wbh.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t t = src[size_t(i)] / topk;
      xg_want[size_t(i * K + k)] = bf16_bits_from_f32(e4m3_to_f32(codes[size_t(t * K + k)]) * scales[size_t(t * KB + k / 32)]);
    }
  const uint8_t* w1 = &w[size_t(wbytes)];
  const uint8_t* s1 = &ws[size_t(sbytes)];
  for (int64_t r = 0; r < N; ++r)
    for (int64_t k = 0; k < K; ++k)
      wb_want[size_t(r * K + k)] = bf16_bits_from_f32(e2m1_to_f32(e2m1_code_at(w1 + r * (K / 2), k)) * e8m0_to_f32(s1[size_t(r * KB + k / 32)]));
  expect_same(xgh, xg_want, "tc_dequant_act (gathered)");
  expect_same(wbh, wb_want, "tc_dequant_fp4");
  TcCheck chk;
  std::vector<bf16_t> want(static_cast<size_t>(N));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = src[size_t(i)] / topk;
    cpu::fp4_gemm(&x[size_t(t * K)], 1, view(DType::kI8, {N, K / 2}, w1), view(DType::kF8E8M0, {N, KB}, s1), want.data());
    for (int64_t r = 0; r < N; ++r) {
      double A = 0;
      for (int64_t k = 0; k < K; ++k) A += std::fabs(double(bf16_to_f32(xg_want[size_t(i * K + k)])) * bf16_to_f32(wb_want[size_t(r * K + k)]));
      chk.add(bf16_to_f32(got[size_t(i * N + r)]), bf16_to_f32(want[size_t(r)]), A, K);
    }
  }
  chk.expect("tc fp4 expert group");
  // Scatter back and gather of routing weights.
  Dev<bf16_t> back(static_cast<size_t>(T * topk * N));
  ASSERT_TRUE(tc_scatter_rows(dy.p(), dsrc.p(), n, N, back.p(), nullptr).ok());
  const auto bh = back.get();
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(0, std::memcmp(&bh[size_t(src[size_t(i)] * N)], &got[size_t(i * N)], size_t(N) * 2)) << "scatter row " << i;
  std::vector<float> wts = rng.f32(T * topk);
  Dev<float> dwts(wts), dwp(static_cast<size_t>(n));
  ASSERT_TRUE(tc_gather_f32(dwts.p(), dsrc.p(), n, dwp.p(), nullptr).ok());
  const auto wp = dwp.get();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(wp[size_t(i)], wts[size_t(src[size_t(i)])]);
}

// tc_dequant_fp4 by 32-blocks (set_tc_dequant_x32, the default) and by 8 elements: the CPU's bits
// for every e8m0 scale byte (0..255: the integer path for 2..252, the float path for the rest, NaN
// for 255) and every e2m1 code, an expert past the first, and an expert whose codes are not
// 16-byte aligned (the 8-element kernel either way).
TEST(CudaOps, DequantFp4EveryScale) {
  NEED_GPU();
  Rng rng(31);
  const int64_t N = 64, K = 256, KB = K / 32, E = 2, wbytes = N * K / 2, sbytes = N * KB;
  auto w = rng.bytes(wbytes * E + 16);
  std::vector<uint8_t> sc(size_t(sbytes * E));
  for (size_t i = 0; i < sc.size(); ++i) sc[i] = uint8_t(i % 256);  // N * KB = 512 blocks an expert: every byte twice
  Dev<uint8_t> dw(w), ds(sc);
  Dev<bf16_t> out(size_t(N * K));
  for (int64_t shift : {int64_t(0), int64_t(4)}) {  // 4: codes 4 bytes off 16-byte alignment
    const Fp4W fw{dw.p() + shift, ds.p(), N, K, wbytes, sbytes};
    std::vector<bf16_t> want(size_t(N * K));
    const uint8_t* w1 = &w[size_t(wbytes + shift)];
    const uint8_t* s1 = &sc[size_t(sbytes)];
    for (int64_t r = 0; r < N; ++r)
      for (int64_t k = 0; k < K; ++k)
        want[size_t(r * K + k)] = bf16_bits_from_f32(e2m1_to_f32(e2m1_code_at(w1 + r * (K / 2), k)) * e8m0_to_f32(s1[size_t(r * KB + k / 32)]));
    for (bool x32 : {true, false}) {
      set_tc_dequant_x32(x32);
      out.poison();
      ASSERT_TRUE(tc_dequant_fp4(fw, 1, out.p(), nullptr).ok());
      const std::string what = std::string("tc_dequant_fp4 ") + (x32 ? "by 32-blocks" : "by 8") + (shift ? ", unaligned codes" : "");
      expect_same(out.get(), want, what.c_str());
    }
  }
  set_tc_dequant_x32(true);
}

TEST(CudaOps, TensorCoreBf16GroupedAndF32) {
  NEED_GPU();
  auto tc = make_tc();
  ASSERT_TRUE(tc);
  Rng rng(13);
  // grouped wo_a at prefill size, as the executor calls it
  const GroupedWoA c(rng, 80);
  const int64_t M = c.M, G = c.G, GI = c.GI, OR = c.OR, QD = c.QD;
  const auto &o = c.o, &w = c.w, &want = c.want;
  Dev<bf16_t> dx(o), dw(w), dy(want.size());
  ASSERT_TRUE(tc_bf16_gemm(*tc, dx.p(), M, GI, QD, dw.p(), OR, dy.p(), G * OR, GemmOut::kBf16, G, GI, OR * GI, OR, nullptr).ok());
  const auto got = dy.get();
  TcCheck chk;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t r = 0; r < OR; ++r) {
        double A = 0;
        for (int64_t k = 0; k < GI; ++k)
          A += std::fabs(double(bf16_to_f32(o[size_t(m * QD + g * GI + k)])) * bf16_to_f32(w[size_t(g * OR * GI + r * GI + k)]));
        const size_t at = size_t(m * G * OR + g * OR + r);
        chk.add(bf16_to_f32(got[at]), bf16_to_f32(want[at]), A, GI);
      }
  chk.expect("tc bf16 grouped");
  // f32 output and f32 accumulate-into (compressor, head), with a strided output (ldy = 2N)
  const int64_t D = 5120, N = 704, R = 72;
  auto u = rng.act(R * D);
  auto wh = rng.act(N * D, 0.02f);
  std::vector<float> uf(u.size()), wantf(static_cast<size_t>(R * N));
  for (size_t i = 0; i < u.size(); ++i) uf[i] = bf16_to_f32(u[i]);
  cpu::f32_gemm_bf16w(uf.data(), R, D, wh.data(), N, wantf.data());
  std::vector<float> init = rng.f32(R * 2 * N);
  Dev<bf16_t> du(u), dwh(wh);
  Dev<float> dyf(init);
  ASSERT_TRUE(tc_bf16_gemm(*tc, du.p(), R, D, D, dwh.p(), N, dyf.p(), 2 * N, GemmOut::kF32, 1, 0, 0, 0, nullptr).ok());
  ASSERT_TRUE(tc_bf16_gemm(*tc, du.p(), R, D, D, dwh.p(), N, dyf.p() + N, 2 * N, GemmOut::kF32Add, 1, 0, 0, 0, nullptr).ok());
  const auto gf = dyf.get();
  TcCheck cf, ca;
  for (int64_t m = 0; m < R; ++m)
    for (int64_t r = 0; r < N; ++r) {
      double A = 0;
      for (int64_t k = 0; k < D; ++k) A += std::fabs(double(uf[size_t(m * D + k)]) * bf16_to_f32(wh[size_t(r * D + k)]));
      const float s = wantf[size_t(m * N + r)];
      // f32 outputs carry no bf16 rounding: the 2^-7 term is generous there; the sum term rules.
      cf.add(gf[size_t(m * 2 * N + r)], s, A, D);
      ca.add(gf[size_t(m * 2 * N + N + r)], init[size_t(m * 2 * N + N + r)] + s, A + std::fabs(init[size_t(m * 2 * N + N + r)]), D);
    }
  cf.expect("tc bf16 f32 out");
  ca.expect("tc bf16 f32 add");
}


// Tensor-core mHC mixes of prefill steps (tc_gemm.h tc_hc_mixes): fn split exactly into three bf16
// parts (checked: the split's sum restores fn bit for bit through the CPU-side check below), dots
// on tensor cores, the rest as the CPU. Tolerance, written down: |tc - cpu| <= 1e-3 on every pre,
// post and comb value (the mixes are O(1); the dots' f32 order moves them by ~1e-5 relative and the
// sigmoid / Sinkhorn steps are contractions); the worst case is printed.
TEST(CudaOps, TensorCoreHcMixes) {
  NEED_GPU();
  auto tc = make_tc();
  ASSERT_TRUE(tc);
  Rng rng(23);
  const HcCase c(rng, 70);
  const int hc = c.hc;
  const int64_t D = c.D, T = c.T;
  const auto& x = c.x;
  const auto &fn = c.fn, &sc = c.sc, &base = c.base;
  const auto& want = c.want;
  // The exact three-way split, on the host with the same operations as the kernel.
  for (float f : fn) {
    const float h = bf16_to_f32(bf16_bits_from_f32(f)), r1 = f - h, m = bf16_to_f32(bf16_bits_from_f32(r1)), r2 = r1 - m;
    ASSERT_EQ(h + (m + bf16_to_f32(bf16_bits_from_f32(r2))), f) << "split of " << f << " is not exact";
  }
  Dev<bf16_t> dx(x);
  Dev<float> dfn(fn), dsc(sc), dbase(base);
  Dev<HcMix> dmix(static_cast<size_t>(T));
  ASSERT_TRUE(tc_hc_mixes(*tc, dx.p(), T, hc, D, dfn.p(), 1e-6f, dsc.p(), dbase.p(), 20, 1e-6f, dmix.p(), nullptr).ok());
  const auto got = dmix.get();
  double worst = 0;
  for (int64_t t = 0; t < T; ++t) {
    const HcMix &a = got[size_t(t)], &b = want[size_t(t)];
    for (int i = 0; i < hc; ++i) {
      worst = std::max({worst, std::fabs(double(a.pre[i]) - b.pre[i]), std::fabs(double(a.post[i]) - b.post[i])});
      ASSERT_FALSE(std::isnan(a.pre[i]) || std::isnan(a.post[i]));
    }
    for (int i = 0; i < hc * hc; ++i) worst = std::max(worst, std::fabs(double(a.comb[i]) - b.comb[i]));
  }
  EXPECT_LE(worst, 1e-3);
  std::printf("[ tc ] hc mixes T=%lld: worst |tc - cpu| = %.3g (tolerance 1e-3)\n", (long long)T, worst);
}

// The router of tensor-core prefill steps (CudaRunOptions::tc_route): the dots u . gate_w^T as a
// bf16 matmul with f32 output (every product exact, the f32 sum in the tensor cores' order), then
// route_from_dots. (1) The scores and biased scores are route()'s formulas of the dots, bit for bit
// (checked on the host from the dots themselves, image rows on the second bias); (2) against
// route()'s own dots: scores within 1e-5 relative, the same experts except where the exact
// biased scores tie within 1e-4 at the k-th place, the weights within 1e-5 where the picks agree.
TEST(CudaOps, TensorCoreRouteFromDots) {
  NEED_GPU();
  auto tc = make_tc();
  ASSERT_TRUE(tc);
  Rng rng(31);
  const int64_t T = 96, D = 512;
  const int E = 64, K = 6;
  const float temp = 1.5f, scale = 2.5f;
  const auto u = rng.act(T * D);
  std::vector<bf16_t> gw(size_t(E) * D);
  for (auto& x : gw) x = bf16_bits_from_f32(rng.normal(0.05f));
  std::vector<float> bias(E), bias_vl(E);
  for (int e = 0; e < E; ++e) {
    bias[size_t(e)] = rng.normal(0.01f);
    bias_vl[size_t(e)] = rng.normal(0.01f);
  }
  std::vector<uint8_t> image(size_t(T), 0);
  for (int64_t t = 0; t < T; t += 5) image[size_t(t)] = 1;
  Dev<bf16_t> du(u), dw(gw);
  Dev<float> db(bias), dbv(bias_vl);
  Dev<uint8_t> dimg(image);
  Dev<float> s1(size_t(2 * T * E)), s2(size_t(2 * T * E)), w1(size_t(T * K)), w2(size_t(T * K));
  Dev<int32_t> e1(size_t(T * K)), e2(size_t(T * K));
  ASSERT_TRUE(route(du.p(), T, D, dw.p(), E, db.p(), dbv.p(), dimg.p(), K, temp, true, scale, e1.p(), w1.p(), s1.p(), nullptr).ok());
  ASSERT_TRUE(tc->matmul(du.p(), T, D, D, dw.p(), E, s2.p() + T * E, E, GemmOut::kF32, 1, 0, 0, 0, nullptr).ok());
  const auto z = s2.get();  // the dots, before route_from_dots overwrites them
  ASSERT_TRUE(route_from_dots(T, E, db.p(), dbv.p(), dimg.p(), K, temp, true, scale, e2.p(), w2.p(), s2.p(), nullptr).ok());
  const auto a = s1.get(), b = s2.get(), wa = w1.get(), wb = w2.get();
  const auto ea = e1.get(), eb = e2.get();
  // (1) the formulas, bit for bit
  for (int64_t i = 0; i < T * E; ++i) {
    const int64_t t = i / E;
    const float s = fm::sqrt_rn(fm::softplus(fm::div(z[size_t(T * E + i)], temp)));
    const float bb = fm::add(s, (image[size_t(t)] ? bias_vl : bias)[size_t(i % E)]);
    ASSERT_EQ(std::bit_cast<uint32_t>(b[size_t(i)]), std::bit_cast<uint32_t>(s)) << "score " << i;
    ASSERT_EQ(std::bit_cast<uint32_t>(b[size_t(T * E + i)]), std::bit_cast<uint32_t>(bb)) << "biased " << i;
  }
  // (2) against route()'s dots
  double worst = 0;
  int differ = 0;
  for (int64_t i = 0; i < T * E; ++i) worst = std::max(worst, std::fabs(double(a[size_t(i)]) - b[size_t(i)]) / (1.0 + std::fabs(a[size_t(i)])));
  for (int64_t t = 0; t < T; ++t) {
    bool same = true;
    for (int k = 0; k < K; ++k) same = same && ea[size_t(t * K + k)] == eb[size_t(t * K + k)];
    if (same) {
      for (int k = 0; k < K; ++k) EXPECT_NEAR(wa[size_t(t * K + k)], wb[size_t(t * K + k)], 1e-5) << "row " << t;
      continue;
    }
    ++differ;
    std::vector<float> v(a.begin() + (T + t) * E, a.begin() + (T + t + 1) * E);
    std::sort(v.begin(), v.end(), std::greater<float>());
    EXPECT_LE(v[size_t(K - 1)] - v[size_t(K)], 1e-4) << "row " << t << " picks other experts without a near tie";
  }
  EXPECT_LE(worst, 1e-5);
  std::printf("[ tc ] router from tensor-core dots T=%lld E=%d: worst score difference %.3g (relative), %d of %lld rows pick otherwise\n",
              (long long)T, E, worst, differ, (long long)T);
}

// Issue 26: memory::prefill_step_bytes counts each scratch slot at 9/8 of its largest request
// (TcGemm::scratch_bytes' growth); scratch_held reports that, release_scratch frees every slot and
// a later request grows the slot again.
TEST(CudaOps, TensorCoreScratchHeldAndReleased) {
  NEED_GPU();
  auto tc = make_tc();
  ASSERT_TRUE(tc);
  cudaStream_t st = nullptr;
  EXPECT_EQ(tc->scratch_held(), 0u);
  ASSERT_TRUE(tc->scratch(3, 1000, st).ok());  // 2,000 bytes
  EXPECT_EQ(tc->scratch_held(), 2000u + 250u);
  ASSERT_TRUE(tc->scratch_bytes(5, 4096, st).ok());
  EXPECT_EQ(tc->scratch_held(), 2250u + 4096u + 512u);
  ASSERT_TRUE(tc->scratch(3, 1100, st).ok());  // within 9/8 of the first request: no growth
  EXPECT_EQ(tc->scratch_held(), 2250u + 4608u);
  ASSERT_TRUE(tc->scratch(3, 2000, st).ok());  // grows to 9/8 of this one, the old buffer freed first
  EXPECT_EQ(tc->scratch_held(), 4500u + 4608u);
  tc->release_scratch();
  EXPECT_EQ(tc->scratch_held(), 0u);
  auto p = tc->scratch(0, 64, st);
  ASSERT_TRUE(p.ok());
  EXPECT_NE(*p, nullptr);
  EXPECT_EQ(tc->scratch_held(), 128u + 16u);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace fb::cuda
