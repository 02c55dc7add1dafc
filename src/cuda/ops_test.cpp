// Op-level parity, CPU reference vs CUDA, at the released shapes (hidden 5120, 64 heads x 512,
// 384 experts, expert width 2304, index 32 x 128) and edge shapes (1 row, ragged rows and key
// lists, long key lists). Tolerance: none — every output must be bit-identical (NaN masks
// compared first), because the CUDA kernels reproduce the CPU's rounding points and orders
// (docs/numerics.md). Outputs are poisoned (0xFF bytes) before each run. Label: gpu.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/fmath.h"
#include "cpu/ops.h"
#include "cuda/device.h"
#include "cuda/executor.h"
#include "cuda/gpu_test_util.h"
#include "cuda/ops.h"
#include "cuda/ops_test_util.h"
#include "cuda/step_arena.h"
#include "cuda/tc_gemm.h"
#include "model/rope.h"
#include "model/step.h"

namespace fb::cuda {
namespace {

using namespace ops_test_util;  // bf16_t, Dev, have_gpu, Rng, expect_same, ...
#define NEED_GPU() FB_NEED_GPU()


// ---- quantisers and GEMMs --------------------------------------------------------------------

// copy_from_pinned (CudaRunOptions::sm_uploads): the bytes cudaMemcpyAsync would deliver, for
// sizes around the 16-byte pieces and for sources and destinations off 16-byte alignment.
TEST(CudaOps, CopyFromPinnedEqualsMemcpy) {
  NEED_GPU();
  void* host = nullptr;
  ASSERT_EQ(cudaMallocHost(&host, 8192), cudaSuccess);
  auto* h = static_cast<uint8_t*>(host);
  for (int i = 0; i < 8192; ++i) h[i] = uint8_t(i * 131 + 7);
  Dev<uint8_t> dst(8192);
  for (size_t off : {size_t(0), size_t(3)})
    for (size_t n : {size_t(1), size_t(15), size_t(16), size_t(17), size_t(4099)}) {
      dst.poison();
      ASSERT_TRUE(copy_from_pinned(dst.p() + off, h + off, n, nullptr).ok());
      const auto got = dst.get();
      for (size_t i = 0; i < got.size(); ++i) {
        const uint8_t want = i >= off && i < off + n ? h[i] : uint8_t(0xFF);
        ASSERT_EQ(got[i], want) << "byte " << i << " of a " << n << "-byte copy at offset " << off;
      }
    }
  cudaFreeHost(host);
}

TEST(CudaOps, Fp8GemmReleasedAndRagged) {
  NEED_GPU();
  Rng rng(1);
  struct Case { int64_t M, K, N; bool nan; };
  // Row tiles of 1, 2, 4 and 8, partial chunks (K = 2080: 65 blocks), wide N, NaN weight codes
  // and a NaN activation (its act_quant code is a NaN code).
  for (Case cs : {Case{1, 5120, 1536, false}, Case{5, 5120, 544, false}, Case{3, 1024, 5120, false}, Case{2, 8192, 96, false},
                  Case{4, 2080, 36, false}, Case{1, 2048, 64, true}, Case{3, 1024, 68, true}, Case{1, 1024, 30, true},
                  Case{1, 1024, 16384, true}, Case{2, 512, 16384, false}}) {
    const int64_t KB = cs.K / 32;
    auto x = rng.act(cs.M * cs.K);
    auto w = rng.e4m3_codes(cs.N * cs.K);
    if (cs.nan) {
      for (int i = 0; i < 12; ++i) w[size_t(rng.uniform(0, int(cs.N * cs.K) - 1))] = uint8_t(i % 2 ? 0x7F : 0xFF);
      x[size_t(rng.uniform(0, int(cs.M * cs.K) - 1))] = 0x7FC0;  // bf16 NaN: its act_quant code is a NaN code
    }
    auto ws = rng.bytes(((cs.N + 31) / 32) * KB, 118, 132);
    std::vector<bf16_t> want(static_cast<size_t>(cs.M * cs.N));
    cpu::fp8_gemm(x.data(), cs.M, view(DType::kF8E4M3, {cs.N, cs.K}, w.data()), view(DType::kF8E8M0, {(cs.N + 31) / 32, KB}, ws.data()),
                  want.data());
    Dev<bf16_t> dx(x), dy(want.size());
    Dev<uint8_t> dw(w), dws(ws), qc(static_cast<size_t>(cs.M * cs.K));
    Dev<float> qs(static_cast<size_t>(cs.M * KB));
    QuantBuf q{qc.p(), qs.p(), cs.M * cs.K};
    // Both forms of the per-element step (fused multiply-add of the exact e4m3 products, and the
    // CPU's separate multiply and add) must give the CPU's bits.
    for (bool fma : {false, true}) {
      set_fp8_gemv_fma(fma);
      ASSERT_TRUE(fp8_gemm(dx.p(), cs.M, Fp8W{dw.p(), dws.p(), cs.N, cs.K}, dy.p(), q, nullptr).ok());
      expect_same(dy.get(), want, fma ? "fp8_gemm (fma)" : "fp8_gemm (mul, add)");
    }
    set_fp8_gemv_fma(true);
    // act_quant itself
    std::vector<uint8_t> codes(static_cast<size_t>(cs.M * cs.K));
    std::vector<float> scales(static_cast<size_t>(cs.M * KB));
    for (int64_t m = 0; m < cs.M; ++m) cpu::act_quant_row(&x[size_t(m * cs.K)], cs.K, &codes[size_t(m * cs.K)], &scales[size_t(m * KB)]);
    expect_same(qc.get(), codes, "act_quant codes");
    expect_same(qs.get(), scales, "act_quant scales");
  }
}

TEST(CudaOps, Fp4ExpertGemm) {
  NEED_GPU();
  Rng rng(2);
  struct Case { int64_t T, K, N; int E, topk; };
  // The last two: six verify-like rows over 16 experts (top-6), and 12 rows of one expert.
  for (Case cs : {Case{1, 5120, 2304, 3, 2}, Case{3, 2304, 5120, 4, 3}, Case{2, 2080, 77, 3, 2}, Case{6, 5120, 256, 16, 6},
                  Case{12, 1024, 96, 1, 1}}) {
    const int64_t KB = cs.K / 32, M = cs.T * cs.topk;
    auto x = rng.act(cs.T * cs.K);
    const int64_t wb = cs.N * cs.K / 2, sb = cs.N * KB;
    auto w = rng.bytes(wb * cs.E);
    auto ws = rng.bytes(sb * cs.E, 118, 130);
    auto w3 = rng.bytes(wb * cs.E);
    auto ws3 = rng.bytes(sb * cs.E, 118, 130);
    std::vector<int32_t> ex(static_cast<size_t>(M));
    for (auto& e : ex) e = rng.uniform(0, cs.E - 1);
    std::vector<bf16_t> want(static_cast<size_t>(M * cs.N));
    for (int64_t m = 0; m < M; ++m) {
      const int e = ex[size_t(m)];
      cpu::fp4_gemm(&x[size_t((m / cs.topk) * cs.K)], 1, view(DType::kI8, {cs.N, cs.K / 2}, &w[size_t(e * wb)]),
                    view(DType::kF8E8M0, {cs.N, KB}, &ws[size_t(e * sb)]), &want[size_t(m * cs.N)]);
    }
    Dev<bf16_t> dx(x), dy(want.size());
    Dev<uint8_t> dw(w), dws(ws), qc(static_cast<size_t>(cs.T * cs.K));
    Dev<float> qs(static_cast<size_t>(cs.T * KB));
    Dev<int32_t> dex(ex);
    QuantBuf q{qc.p(), qs.p(), cs.T * cs.K};
    ASSERT_TRUE(act_quant(dx.p(), cs.T, cs.K, q, nullptr).ok());
    ASSERT_TRUE(fp4_gemm_q(q, M, cs.topk, Fp4W{dw.p(), dws.p(), cs.N, cs.K, wb, sb}, dex.p(), dy.p(), nullptr).ok());
    expect_same(dy.get(), want, "fp4_gemm");
    // w1 and w3 in one pass (fp4_gemm2_q): each output as fp4_gemm_q
    std::vector<bf16_t> want3(want.size());
    for (int64_t m = 0; m < M; ++m) {
      const int e = ex[size_t(m)];
      cpu::fp4_gemm(&x[size_t((m / cs.topk) * cs.K)], 1, view(DType::kI8, {cs.N, cs.K / 2}, &w3[size_t(e * wb)]),
                    view(DType::kF8E8M0, {cs.N, KB}, &ws3[size_t(e * sb)]), &want3[size_t(m * cs.N)]);
    }
    Dev<uint8_t> dw3(w3), dws3(ws3);
    Dev<bf16_t> dya(want.size()), dyb(want.size());
    ASSERT_TRUE(fp4_gemm2_q(q, M, cs.topk, Fp4W{dw.p(), dws.p(), cs.N, cs.K, wb, sb}, Fp4W{dw3.p(), dws3.p(), cs.N, cs.K, wb, sb}, dex.p(),
                            dya.p(), dyb.p(), nullptr)
                    .ok());
    expect_same(dya.get(), want, "fp4_gemm2 a");
    expect_same(dyb.get(), want3, "fp4_gemm2 b");
  }
}

TEST(CudaOps, Bf16GemmGroupedAndF32) {
  NEED_GPU();
  Rng rng(3);
  const GroupedWoA c(rng, 2);
  const int64_t M = c.M, G = c.G, GI = c.GI, OR = c.OR, QD = c.QD;
  const auto& want = c.want;
  Dev<bf16_t> dx(c.o), dw(c.w), dy(want.size());
  ASSERT_TRUE(bf16_gemm(dx.p(), M, GI, QD, dw.p(), OR, dy.p(), G * OR, GemmOut::kBf16, G, GI, OR * GI, OR, nullptr).ok());
  expect_same(dy.get(), want, "bf16_gemm grouped");
  // f32 output (compressor projections, head): x bf16 promoted exactly, as cpu::f32_gemm_bf16w
  const int64_t D = 5120, N = 700;
  auto u = rng.act(3 * D);
  auto wh = rng.act(N * D, 0.02f);
  std::vector<float> uf(u.size()), wantf(static_cast<size_t>(3 * N));
  for (size_t i = 0; i < u.size(); ++i) uf[i] = bf16_to_f32(u[i]);
  cpu::f32_gemm_bf16w(uf.data(), 3, D, wh.data(), N, wantf.data());
  Dev<bf16_t> du(u), dwh(wh);
  Dev<float> dyf(wantf.size());
  ASSERT_TRUE(bf16_gemm(du.p(), 3, D, D, dwh.p(), N, dyf.p(), N, GemmOut::kF32, 1, 0, 0, 0, nullptr).ok());
  expect_same(dyf.get(), wantf, "bf16_gemm f32");
}

// A compact-cache QDQ of M rows of K: the CUDA op's compact rows (codes at 0, scales at
// code_bytes, rb bytes a row) and bf16 values equal the CPU row function's bit for bit.
template <typename CpuRow, typename CudaQdq>
void expect_qdq_same(Rng& rng, int64_t M, int64_t K, int64_t code_bytes, int64_t rb, CpuRow cpu_row, CudaQdq cuda_qdq,
                     const std::string& name) {
  auto x = rng.act(M * K);
  std::vector<uint8_t> want_c(static_cast<size_t>(M * rb));
  std::vector<bf16_t> want(static_cast<size_t>(M * K));
  for (int64_t m = 0; m < M; ++m)
    cpu_row(&x[size_t(m * K)], K, &want_c[size_t(m * rb)], &want_c[size_t(m * rb + code_bytes)], &want[size_t(m * K)]);
  Dev<bf16_t> dx(x), dy(want.size());
  Dev<uint8_t> dc(want_c.size());
  ASSERT_TRUE(cuda_qdq(dx.p(), M, K, dc.p(), rb, dy.p(), nullptr).ok()) << name;
  expect_same(dc.get(), want_c, (name + " compact").c_str());
  expect_same(dy.get(), want, (name + " value").c_str());
}

TEST(CudaOps, Quantisers) {
  NEED_GPU();
  Rng rng(4);
  const int64_t M = 7;
  // FP8 window rows, head_dim 512
  expect_qdq_same(rng, M, 512, 512, 512 + 512 / 32, cpu::fp8_qdq_row, fp8_qdq, "fp8_qdq");
  // FP4 e8m0 (index keys / queries), 128
  expect_qdq_same(rng, M, 128, 128 / 2, 128 / 2 + 128 / 32, cpu::fp4_e8m0_qdq_row, fp4_e8m0_qdq, "fp4_e8m0");
  // FP4 e4m3/16 (compressed KV), 512
  expect_qdq_same(rng, M, 512, 512 / 2, 512 / 2 + 512 / 16, cpu::fp4_e4m3_qdq_row, fp4_e4m3_qdq, "fp4_e4m3");
}

// ---- norms, RoPE, mHC -------------------------------------------------------------------------

TEST(CudaOps, RmsNormAndRope) {
  NEED_GPU();
  Rng rng(5);
  for (int64_t n : {5120, 1536, 512, 96}) {
    const int64_t M = 3;
    auto x = rng.act(M * n);
    auto w = rng.act(n);
    std::vector<bf16_t> want(static_cast<size_t>(M * n));
    for (int64_t m = 0; m < M; ++m) cpu::rms_norm(&x[size_t(m * n)], n, w.data(), 1e-6f, &want[size_t(m * n)]);
    Dev<bf16_t> dx(x), dw(w), dy(want.size());
    ASSERT_TRUE(rms_norm(dx.p(), M, n, dw.p(), 1e-6f, dy.p(), nullptr).ok());
    expect_same(dy.get(), want, "rms_norm");
  }
  // RoPE on 64 heads x 512 (rope 64) at far positions, both tables, forward and inverse.
  const std::vector<int64_t> pos{0, 1, 4095, 65537, 1048575};
  const int64_t M = int64_t(pos.size()), H = 64, W = 512;
  const int rd = 64, half = rd / 2;
  for (bool yarn : {false, true})
    for (bool inverse : {false, true}) {
      const model::RopeTable t = model::make_rope_table(rd, yarn ? 160000.0 : 10000.0, yarn, 16.0, 65536, 32.0, 1.0);
      std::vector<float> ct(static_cast<size_t>(M * half)), stt(static_cast<size_t>(M * half));
      std::vector<int64_t> idx(static_cast<size_t>(M));
      for (int64_t m = 0; m < M; ++m) {
        t.at(pos[size_t(m)], &ct[size_t(m * half)], &stt[size_t(m * half)]);
        idx[size_t(m)] = m;  // table row m holds position pos[m]
      }
      auto x = rng.act(M * H * W);
      auto want = x;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t h = 0; h < H; ++h) cpu::apply_rope(&want[size_t((m * H + h) * W)], W, t, pos[size_t(m)], inverse);
      Dev<bf16_t> dx(x);
      Dev<float> dc(ct), ds(stt);
      Dev<int64_t> dp(idx);
      ASSERT_TRUE(rope(dx.p(), M, int(H), W, rd, dp.p(), dc.p(), ds.p(), inverse, nullptr).ok());
      expect_same(dx.get(), want, "rope");
    }
}

TEST(CudaOps, HcMixesSinkhornPrePost) {
  NEED_GPU();
  Rng rng(6);
  const HcCase c(rng, 3);
  const int hc = c.hc;
  const int64_t D = c.D, T = c.T, n = c.n;
  const auto& x = c.x;
  const auto &fn = c.fn, &sc = c.sc, &base = c.base;
  const auto& want = c.want;
  Dev<bf16_t> dx(x);
  Dev<float> dfn(fn), dsc(sc), dbase(base);
  Dev<HcMix> dmix(static_cast<size_t>(T));
  ASSERT_TRUE(hc_mixes(dx.p(), T, hc, D, dfn.p(), 1e-6f, dsc.p(), dbase.p(), 20, 1e-6f, dmix.p(), nullptr).ok());
  auto got = dmix.get();
  std::vector<float> g, w;
  for (int64_t t = 0; t < T; ++t) {
    for (int i = 0; i < hc; ++i) {
      g.push_back(got[size_t(t)].pre[i]), w.push_back(want[size_t(t)].pre[i]);
      g.push_back(got[size_t(t)].post[i]), w.push_back(want[size_t(t)].post[i]);
    }
    for (int i = 0; i < hc * hc; ++i) g.push_back(got[size_t(t)].comb[i]), w.push_back(want[size_t(t)].comb[i]);
  }
  expect_same(g, w, "hc mixes + sinkhorn");
  // collapse and expand with the CPU's mixes
  std::vector<bf16_t> want_pre(static_cast<size_t>(T * D)), y = rng.act(T * D), want_post(static_cast<size_t>(T * n));
  std::vector<float> pre_flat;
  for (int64_t t = 0; t < T; ++t) {
    cpu::hc_pre(&x[size_t(t * n)], hc, D, want[size_t(t)].pre, &want_pre[size_t(t * D)]);
    cpu::hc_post(&y[size_t(t * D)], &x[size_t(t * n)], hc, D, want[size_t(t)], &want_post[size_t(t * n)]);
    for (int i = 0; i < hc; ++i) pre_flat.push_back(want[size_t(t)].pre[i]);
  }
  Dev<float> dpre(pre_flat);
  Dev<bf16_t> dh(static_cast<size_t>(T * D)), dy(y), dout(static_cast<size_t>(T * n));
  Dev<HcMix> dwant(want);
  ASSERT_TRUE(hc_pre(dx.p(), T, nullptr, hc, D, dpre.p(), hc, dh.p(), nullptr).ok());
  ASSERT_TRUE(hc_post(dy.p(), dx.p(), T, hc, D, dwant.p(), dout.p(), nullptr).ok());
  expect_same(dh.get(), want_pre, "hc_pre");
  expect_same(dout.get(), want_post, "hc_post");
}

// hc_pre + rms_norm + act_quant fused (the sublayer input u and its FP8 codes) vs the three CPU ops.
TEST(CudaOps, HcPreNormQuantFused) {
  NEED_GPU();
  Rng rng(21);
  for (int64_t D : {int64_t(5120), int64_t(64), int64_t(4128)}) {
    for (int64_t T : {int64_t(1), int64_t(3), int64_t(300)}) {  // 300 rows: the unfused fallback
      const int hc = 4;
      const int64_t KB = D / 32;
      auto x = rng.act(T * hc * D, 3.0f);
      auto w = rng.act(D, 1.0f);
      std::vector<float> pre(static_cast<size_t>(T * hc));
      for (auto& p : pre) p = rng.normal(0.6f);
      std::vector<bf16_t> h(static_cast<size_t>(D)), want(static_cast<size_t>(T * D));
      std::vector<uint8_t> want_codes(static_cast<size_t>(T * D));
      std::vector<float> want_scales(static_cast<size_t>(T * KB));
      for (int64_t t = 0; t < T; ++t) {
        cpu::hc_pre(&x[size_t(t * hc * D)], hc, D, &pre[size_t(t * hc)], h.data());
        cpu::rms_norm(h.data(), D, w.data(), 1e-6f, &want[size_t(t * D)]);
        cpu::act_quant_row(&want[size_t(t * D)], D, &want_codes[size_t(t * D)], &want_scales[size_t(t * KB)]);
      }
      Dev<bf16_t> dx(x), dw(w), dtmp(static_cast<size_t>(T * D)), dy(want.size());
      Dev<float> dpre(pre), qs(want_scales.size());
      Dev<uint8_t> qc(want_codes.size());
      QuantBuf q{qc.p(), qs.p(), T * D};
      ASSERT_TRUE(hc_pre_norm_quant(dx.p(), T, hc, D, dpre.p(), hc, dw.p(), 1e-6f, dtmp.p(), dy.p(), q, nullptr).ok());
      expect_same(dy.get(), want, "hc_pre_norm_quant u");
      expect_same(qc.get(), want_codes, "hc_pre_norm_quant codes");
      expect_same(qs.get(), want_scales, "hc_pre_norm_quant scales");
    }
  }
}

// ---- attention --------------------------------------------------------------------------------

// Key lists per row: window FP8 rows (some empty), then selected FP4 entries (some -1).
void attention_case(Rng& rng, const std::vector<int>& n_win, const std::vector<int>& n_sel, int64_t n_comp) {
  const int H = 64, d = 512;
  const int64_t T = int64_t(n_win.size()), rb8 = d + d / 32;
  const int total_win = std::accumulate(n_win.begin(), n_win.end(), 0);
  // FP8 rows from real QDQ of random latents; FP4 rows likewise.
  QdqRows win = fp8_window_rows(rng, total_win, d);
  QdqRows cmp = fp4_comp_rows(rng, n_comp, d);
  const std::vector<uint8_t>& win_rows = win.rows;
  const std::vector<uint8_t>& comp = cmp.rows;
  const std::vector<bf16_t>& win_val = win.values;
  const std::vector<bf16_t>& comp_val = cmp.values;
  auto q = rng.act(T * H * d, 1.0f);
  auto sinks = rng.f32(H, 1.0f);
  const int64_t sel_ld = *std::max_element(n_sel.begin(), n_sel.end()) + 1;
  std::vector<int32_t> sel(static_cast<size_t>(T * sel_ld), -1), cnt(static_cast<size_t>(T));
  Dev<uint8_t> dwin(win_rows), dcomp(comp);
  std::vector<uint64_t> win_ptr;
  std::vector<int32_t> off{0};
  std::vector<uint64_t> comp_base(static_cast<size_t>(T), reinterpret_cast<uint64_t>(dcomp.p()));
  std::vector<bf16_t> want(static_cast<size_t>(T * H * d));
  int w0 = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<const bf16_t*> keys;
    for (int i = 0; i < n_win[size_t(t)]; ++i) {
      const bool empty = rng.uniform(0, 9) == 0;
      const int r = w0 + i;
      win_ptr.push_back(empty ? 0 : reinterpret_cast<uint64_t>(dwin.p() + size_t(r) * size_t(rb8)));
      keys.push_back(empty ? nullptr : &win_val[size_t(r) * d]);
    }
    w0 += n_win[size_t(t)];
    off.push_back(int32_t(win_ptr.size()));
    cnt[size_t(t)] = n_sel[size_t(t)];
    for (int i = 0; i < n_sel[size_t(t)]; ++i) {
      const int32_t id = rng.uniform(0, 7) == 0 ? -1 : rng.uniform(0, int(n_comp) - 1);
      sel[size_t(t * sel_ld + i)] = id;
      keys.push_back(id < 0 ? nullptr : &comp_val[size_t(id) * d]);
    }
    cpu::sparse_attention(&q[size_t(t * H * d)], H, d, keys, sinks.data(), 1.0f / std::sqrt(float(d)), &want[size_t(t * H * d)]);
  }
  Dev<uint64_t> dwp(win_ptr), dcb(comp_base);
  Dev<int32_t> doff(off), dsel(sel), dcnt(cnt);
  Dev<bf16_t> dq(q), dout(want.size());
  Dev<float> dsink(sinks);
  AttnKeys k{dwp.p(), doff.p(), dsel.p(), dcnt.p(), sel_ld, dcb.p()};
  ASSERT_TRUE(sparse_attention(dq.p(), T, H, d, k, dsink.p(), 1.0f / std::sqrt(float(d)), dout.p(), nullptr).ok());
  expect_same(dout.get(), want, "sparse_attention");
  // The key-block split (few rows): blocks in parallel, folded in the CPU's order.
  const int max_keys = *std::max_element(n_win.begin(), n_win.end()) + int(sel_ld);
  const int64_t nf = attention_split_floats(T, H, d, max_keys);
  if (T <= 16 && max_keys > 64) EXPECT_GT(nf, 0) << "split path not taken";
  if (nf > 0) {
    Dev<float> scratch(static_cast<size_t>(nf));
    Dev<bf16_t> dout2(want.size());
    k.max_keys = max_keys;
    k.split = scratch.p();
    // Key tiles dequantised once into the scratch (default), or inside every head group's CTA.
    for (bool pre : {true, false}) {
      k.predequant = pre;
      ASSERT_TRUE(sparse_attention(dq.p(), T, H, d, k, dsink.p(), 1.0f / std::sqrt(float(d)), dout2.p(), nullptr).ok());
      expect_same(dout2.get(), want, pre ? "sparse_attention (key-block split, keys dequantised once)" : "sparse_attention (key-block split)");
    }
    k.predequant = true;
  }
  // Tensor-core path of prefill steps ([reference-defining]: dots and P.V sums in the tensor
  // cores' order, the rest as the CPU). Tolerance per output, written down: one bf16 rounding of
  // the element, plus 2^-8 of the head's largest |o| (score errors of ~d 2^-24 sum|q k| move
  // p = exp(z - m) by a relative ~1e-5; bf16(p) can then round the other way, 2^-9 relative).
  k.split = nullptr;
  k.max_keys = max_keys;
  static std::unique_ptr<TcGemm> tc = make_tc();
  ASSERT_TRUE(tc);
  Dev<bf16_t> dout3(want.size());
  ASSERT_TRUE(tc_sparse_attention(*tc, dq.p(), T, H, d, k, dsink.p(), 1.0f / std::sqrt(float(d)), dout3.p(), nullptr).ok());
  const auto got = dout3.get();
  double worst = 0;
  size_t over = 0, nan_diff = 0;
  for (int64_t th = 0; th < T * H; ++th) {
    double hmax = 0;
    for (int i = 0; i < d; ++i) hmax = std::max(hmax, std::fabs(double(bf16_to_f32(want[size_t(th * d + i)]))));
    for (int i = 0; i < d; ++i) {
      const float a = bf16_to_f32(got[size_t(th * d + i)]), b = bf16_to_f32(want[size_t(th * d + i)]);
      if (std::isnan(a) != std::isnan(b)) {
        ++nan_diff;
        continue;
      }
      const double tol = std::ldexp(std::fabs(double(b)), -7) + std::ldexp(hmax, -8) + 1e-30;
      const double r = std::fabs(double(a) - double(b)) / tol;
      worst = std::max(worst, r);
      if (r > 1) ++over;
    }
  }
  EXPECT_EQ(nan_diff, 0u) << "tc attention NaN masks";
  EXPECT_EQ(over, 0u) << "tc attention: " << over << " outputs outside the tolerance (worst " << worst << " x tol)";
  std::printf("[ tc ] sparse attention T=%lld max_keys=%d: worst |tc - cpu| = %.3g x tolerance\n", (long long)T, max_keys, worst);
}

TEST(CudaOps, SparseAttentionReleased) {
  NEED_GPU();
  Rng rng(7);
  attention_case(rng, {128}, {512}, 2048);            // one decode row: window 128 + top-512
  attention_case(rng, {5, 128, 77}, {0, 512, 33}, 600);  // ragged rows
  attention_case(rng, {3}, {0}, 16);                     // one partial block
  attention_case(rng, {128, 128, 128, 128, 128, 128}, {512, 500, 1, 0, 64, 512}, 1024);  // DSpark-verify-like rows
}

TEST(CudaOps, SparseAttentionLongList) {
  NEED_GPU();
  Rng rng(8);
  attention_case(rng, {4096}, {1024}, 8192);
}

// ---- router, SwiGLU ----------------------------------------------------------------------------

TEST(CudaOps, Route384) {
  NEED_GPU();
  Rng rng(9);
  const int E = 384, K = 6;
  const int64_t D = 5120, T = 4;
  auto u = rng.act(T * D);
  auto gw = rng.act(E * D, 0.02f);
  // an exact tie: experts 17 and 200 share weights and bias -> the lower id first
  std::copy(gw.begin() + 17 * D, gw.begin() + 18 * D, gw.begin() + 200 * D);
  auto bias = rng.f32(E, 0.01f);
  bias[200] = bias[17] = 5.0f;
  std::vector<int32_t> want_e;
  std::vector<float> want_w;
  for (int64_t t = 0; t < T; ++t) {
    cpu::Routing r = cpu::route(&u[size_t(t * D)], D, view(DType::kBF16, {E, D}, gw.data()), bias.data(), K, 1.0f, true, 2.5f);
    std::vector<std::pair<int, float>> picks;
    for (int k = 0; k < K; ++k) picks.push_back({r.experts[size_t(k)], r.weights[size_t(k)]});
    std::sort(picks.begin(), picks.end());
    for (auto [e, w] : picks) want_e.push_back(e), want_w.push_back(w);
  }
  Dev<bf16_t> du(u), dgw(gw);
  Dev<float> db(bias), dw(static_cast<size_t>(T * K));
  Dev<int32_t> de(static_cast<size_t>(T * K));
  Dev<float> scratch(static_cast<size_t>(2 * T * E));
  ASSERT_TRUE(route(du.p(), T, D, dgw.p(), E, db.p(), nullptr, nullptr, K, 1.0f, true, 2.5f, de.p(), dw.p(), scratch.p(), nullptr).ok());
  expect_same(de.get(), want_e, "route experts");
  expect_same(dw.get(), want_w, "route weights");
}

TEST(CudaOps, SwiGlu) {
  NEED_GPU();
  Rng rng(10);
  const int64_t M = 3, n = 2304;
  auto a = rng.act(M * n, 6.0f), b = rng.act(M * n, 6.0f);
  std::vector<float> wt{0.25f, 1.5f, 0.7f};
  for (bool weighted : {false, true}) {
    std::vector<bf16_t> want(static_cast<size_t>(M * n));
    for (int64_t m = 0; m < M; ++m)
      cpu::swiglu_row(&a[size_t(m * n)], &b[size_t(m * n)], n, 10.0f, wt[size_t(m)], weighted, &want[size_t(m * n)]);
    Dev<bf16_t> da(a), dbb(b), dh(want.size());
    Dev<float> dwt(wt);
    ASSERT_TRUE(swiglu(da.p(), dbb.p(), M, n, 10.0f, weighted ? dwt.p() : nullptr, dh.p(), nullptr).ok());
    expect_same(dh.get(), want, "swiglu");
    // fused with act_quant: the codes and scales of act_quant(swiglu)
    std::vector<uint8_t> codes(static_cast<size_t>(M * n));
    std::vector<float> scales(static_cast<size_t>(M * n / 32));
    for (int64_t m = 0; m < M; ++m) cpu::act_quant_row(&want[size_t(m * n)], n, &codes[size_t(m * n)], &scales[size_t(m * n / 32)]);
    Dev<uint8_t> qc(codes.size());
    Dev<float> qs(scales.size());
    ASSERT_TRUE(swiglu_quant(da.p(), dbb.p(), M, n, 10.0f, weighted ? dwt.p() : nullptr, QuantBuf{qc.p(), qs.p(), M * n}, nullptr).ok());
    expect_same(qc.get(), codes, "swiglu_quant codes");
    expect_same(qs.get(), scales, "swiglu_quant scales");
  }
}

// ---- indexer ------------------------------------------------------------------------------------

// The CPU's score chain, candidate pool and top-k (copied from cpu::CpuStep::index_select, whose
// loops are private to the step).
struct IndexRef {
  static std::vector<float> scores(const bf16_t* iq, const bf16_t* wts, int IH, int ihd, const std::vector<bf16_t>& keys, int64_t n_vis,
                                   int64_t n_scored) {
    std::vector<float> I(static_cast<size_t>(n_scored), -INFINITY);
    for (int64_t j = 0; j < n_vis; ++j) {
      const bf16_t* kj = &keys[size_t(j * ihd)];
      float tot = 0.0f;
      for (int h = 0; h < IH; ++h) {
        const float d = fm::lanes32_sum(ihd, [&](int64_t i) { return fm::mul(bf16_to_f32(iq[h * ihd + i]), bf16_to_f32(kj[i])); });
        const float db = std::max(round_bf16(d), 0.0f);
        tot = fm::add(tot, round_bf16(fm::mul(db, bf16_to_f32(wts[h]))));
      }
      I[size_t(j)] = round_bf16(tot);
    }
    return I;
  }
  static std::vector<int32_t> topk(std::vector<float> I, const std::vector<uint8_t>* mask, int64_t n_vis, int64_t topk) {
    const int64_t n = int64_t(I.size());
    if (mask)
      for (int64_t j = 0; j < n; ++j)
        if (j >= int64_t(mask->size()) || !(*mask)[size_t(j)]) I[size_t(j)] = -INFINITY;
    const int64_t k = std::min<int64_t>(topk, n);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
      if (I[size_t(a)] != I[size_t(b)]) return I[size_t(a)] > I[size_t(b)];
      return a < b;
    });
    ids.resize(size_t(k));
    std::sort(ids.begin(), ids.end());
    for (int32_t& id : ids)
      if (id >= n_vis) id = -1;
    return ids;
  }
};

// topk_select over the scores dI [T, ld] (scored / visible counts dns / dnv, optional mask) against
// the expected ids and counts; ids past a row's count are not compared.
void expect_topk(Dev<float>& dI, int64_t T, int64_t ld, const Dev<int64_t>& dns, const Dev<int64_t>& dnv, const uint8_t* mask, int64_t topk,
                 const std::vector<int32_t>& want_sel, const std::vector<int32_t>& want_cnt) {
  Dev<int32_t> dsel(static_cast<size_t>(T * topk)), dcnt(static_cast<size_t>(T));
  ASSERT_TRUE(topk_select(dI.p(), T, ld, dns.p(), dnv.p(), mask, ld, dns.p(), topk, dsel.p(), dcnt.p(), nullptr).ok());
  auto sel = dsel.get();
  const auto cnt = dcnt.get();
  expect_same(cnt, want_cnt, "top-k count");
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = cnt[size_t(t)]; i < topk; ++i) sel[size_t(t * topk + i)] = 0;
  expect_same(sel, want_sel, "top-k ids");
}

void indexer_case(Rng& rng, const std::vector<int64_t>& n_vis, const std::vector<int64_t>& n_scored, bool with_pool) {
  const int IH = 32, ihd = 128;
  const int64_t T = int64_t(n_vis.size()), kb = ihd / 2 + ihd / 32, topk = 512, bs = 64, keep = 8;
  const int64_t n_keys = *std::max_element(n_vis.begin(), n_vis.end()) + 1;
  const int64_t ld = *std::max_element(n_scored.begin(), n_scored.end());
  std::vector<uint8_t> keys(static_cast<size_t>(n_keys * kb));
  std::vector<bf16_t> key_val(static_cast<size_t>(n_keys * ihd));
  auto raw = rng.act(n_keys * ihd);
  for (int64_t j = 0; j < n_keys; ++j)
    cpu::fp4_e8m0_qdq_row(&raw[size_t(j * ihd)], ihd, &keys[size_t(j * kb)], &keys[size_t(j * kb + ihd / 2)], &key_val[size_t(j * ihd)]);
  auto iq = rng.act(T * IH * ihd);
  for (int64_t r = 0; r < T * IH; ++r) {  // the queries are FP4-QDQ'd too
    std::vector<uint8_t> pk(ihd / 2), ps(ihd / 32);
    cpu::fp4_e8m0_qdq_row(&iq[size_t(r * ihd)], ihd, pk.data(), ps.data(), &iq[size_t(r * ihd)]);
  }
  auto wts = rng.act(T * IH, 0.3f);
  std::vector<int32_t> want_sel(static_cast<size_t>(T * topk), 0), want_cnt(static_cast<size_t>(T));
  std::vector<float> want_I;
  for (int64_t t = 0; t < T; ++t) {
    auto I = IndexRef::scores(&iq[size_t(t * IH * ihd)], &wts[size_t(t * IH)], IH, ihd, key_val, n_vis[size_t(t)], n_scored[size_t(t)]);
    std::vector<uint8_t> mask;
    if (with_pool) mask = cpu::candidate_pool(I, n_vis[size_t(t)], bs, keep);
    auto ids = IndexRef::topk(I, with_pool ? &mask : nullptr, n_vis[size_t(t)], topk);
    want_cnt[size_t(t)] = int32_t(ids.size());
    std::copy(ids.begin(), ids.end(), want_sel.begin() + t * topk);
    want_I.insert(want_I.end(), I.begin(), I.end());
  }
  Dev<uint8_t> dkeys(keys), dmask(static_cast<size_t>(T * ld));
  std::vector<uint64_t> base(static_cast<size_t>(T), reinterpret_cast<uint64_t>(dkeys.p()));
  Dev<uint64_t> dbase(base);
  Dev<bf16_t> diq(iq), dwts(wts);
  Dev<int64_t> dnv(n_vis), dns(n_scored);
  Dev<float> dI(static_cast<size_t>(T * ld));
  ASSERT_TRUE(index_scores(diq.p(), dwts.p(), T, IH, ihd, dbase.p(), kb, dnv.p(), dns.p(), dI.p(), ld, nullptr).ok());
  {
    auto I = dI.get();
    std::vector<float> got;
    for (int64_t t = 0; t < T; ++t) got.insert(got.end(), I.begin() + t * ld, I.begin() + t * ld + n_scored[size_t(t)]);
    expect_same(got, want_I, "index scores");
  }
  {
    // Tensor-core scores of prefill steps: the 128-term dots in the tensor cores' order, the head
    // chain as the CPU. Tolerance per entry, written down: a dot may round to the neighbouring
    // bf16, moving its term by 2^-7 relative, and the chain's roundings follow:
    //   |tc - cpu| <= 2^-6 * (|cpu| + sum_h |bf16(relu(bf16(d_h)) * w_h)|);  -inf entries equal.
    static std::unique_ptr<TcGemm> tc = make_tc();
    ASSERT_TRUE(tc);
    Dev<float> dI2(static_cast<size_t>(T * ld));
    ASSERT_TRUE(tc_index_scores(*tc, diq.p(), dwts.p(), T, IH, ihd, base, n_vis, n_scored, kb, dnv.p(), dns.p(), dI2.p(), ld, nullptr).ok());
    const auto I2 = dI2.get();
    double worst = 0;
    size_t over = 0, inf_diff = 0, at = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < n_scored[size_t(t)]; ++j, ++at) {
        const float a = I2[size_t(t * ld + j)], b = want_I[at];
        if (std::isinf(a) || std::isinf(b)) {
          inf_diff += a != b;
          continue;
        }
        double mag = 0;
        for (int h = 0; h < IH; ++h) {
          const float d = fm::lanes32_sum(ihd, [&](int64_t i) {
            return fm::mul(bf16_to_f32(iq[size_t((t * IH + h) * ihd + i)]), bf16_to_f32(key_val[size_t(j * ihd + i)]));
          });
          mag += std::fabs(double(round_bf16(fm::mul(std::max(round_bf16(d), 0.0f), bf16_to_f32(wts[size_t(t * IH + h)])))));
        }
        const double tol = std::ldexp(std::fabs(double(b)) + mag, -6) + 1e-30;
        const double r = std::fabs(double(a) - double(b)) / tol;
        worst = std::max(worst, r);
        over += r > 1;
      }
    EXPECT_EQ(inf_diff, 0u) << "tc index scores: -inf entries differ";
    EXPECT_EQ(over, 0u) << "tc index scores: " << over << " entries outside the tolerance (worst " << worst << " x tol)";
    std::printf("[ tc ] index scores T=%lld n_vis<=%lld: worst |tc - cpu| = %.3g x tolerance\n", (long long)T, (long long)(n_keys - 1), worst);
  }
  if (with_pool) ASSERT_TRUE(candidate_pool(dI.p(), T, ld, dns.p(), dnv.p(), bs, keep, dmask.p(), nullptr).ok());
  expect_topk(dI, T, ld, dns, dnv, with_pool ? dmask.p() : nullptr, topk, want_sel, want_cnt);
}

TEST(CudaOps, IndexerScoresPoolTopK) {
  NEED_GPU();
  Rng rng(11);
  indexer_case(rng, {1}, {1}, false);                         // one entry
  indexer_case(rng, {300, 700, 40}, {300, 900, 40}, false);   // ragged, prefill row scoring past n_vis
  indexer_case(rng, {700, 1200}, {700, 1200}, true);          // candidate pool restriction
  indexer_case(rng, {8192}, {8192}, true);                    // long context
  indexer_case(rng, {70000}, {70000}, false);                 // past the old 49,152-entry top-k limit
  indexer_case(rng, {70000}, {70000}, true);                  // pool of a long row
}

// topk_select on scores that are not bf16 values (all four radix passes) with many exact ties and
// some -0 / +0 and -inf entries, rows of 1 to 70,000 entries (1 to 8 CTAs per row), k above and
// below n, with and without a pool mask: the CPU's ids and counts.
TEST(CudaOps, TopKSelectWideKeysAndTies) {
  NEED_GPU();
  Rng rng(13);
  const int64_t topk = 512;
  for (const bool with_mask : {false, true}) {
    const std::vector<int64_t> ns = {70000, 5000, 300, 1, 33000};
    const int64_t T = int64_t(ns.size()), ld = *std::max_element(ns.begin(), ns.end());
    std::vector<float> I(static_cast<size_t>(T * ld), -INFINITY);
    std::vector<uint8_t> mask(static_cast<size_t>(T * ld), 0);
    std::vector<int64_t> nv(ns.size());
    std::vector<int32_t> want_sel(static_cast<size_t>(T * topk), 0), want_cnt(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t n = ns[size_t(t)];
      nv[size_t(t)] = n - n / 7;  // the last entries score but are not visible: ids -1
      std::vector<float> row(static_cast<size_t>(n));
      const auto vals = rng.f32(n, 1.0f);
      for (int64_t j = 0; j < n; ++j) {
        float v = vals[size_t(j)];
        if (j % 5 == 0) v = vals[size_t(j / 50)];  // exact ties, spread over the row
        if (j % 97 == 0) v = (j % 2) ? -0.0f : 0.0f;
        if (j % 131 == 0) v = -INFINITY;
        row[size_t(j)] = v;
        I[size_t(t * ld + j)] = v;
        mask[size_t(t * ld + j)] = uint8_t((j * 7 + t) % 3 != 0);
      }
      std::vector<uint8_t> m(mask.begin() + t * ld, mask.begin() + t * ld + n);
      const auto ids = IndexRef::topk(row, with_mask ? &m : nullptr, nv[size_t(t)], topk);
      want_cnt[size_t(t)] = int32_t(ids.size());
      std::copy(ids.begin(), ids.end(), want_sel.begin() + t * topk);
    }
    SCOPED_TRACE(with_mask ? "mask" : "no mask");
    Dev<float> dI(I);
    Dev<uint8_t> dmask(mask);
    Dev<int64_t> dns(ns), dnv(nv);
    expect_topk(dI, T, ld, dns, dnv, with_mask ? dmask.p() : nullptr, topk, want_sel, want_cnt);
  }
}

// ---- DSpark head ----------------------------------------------------------------------------------

TEST(CudaOps, MarkovArgmaxConfidence) {
  NEED_GPU();
  Rng rng(12);
  const int64_t V = 129280, D = 5120;
  // r = 32 and the released 256 take the 16-byte-load path, r = 36 the scalar one.
  for (const int r : {32, 256, 36}) {
    SCOPED_TRACE(r);
    auto lk = rng.f32(V, 1.0f);
    auto em = rng.act(V * r, 0.1f), hm = rng.act(V * r, 0.1f), hH = rng.act(D), wc = rng.act(D + r, 0.05f);
    const int32_t prev = 4242;
    auto want = lk;
    for (int64_t v = 0; v < V; ++v)
      want[size_t(v)] = fm::add(want[size_t(v)], fm::lanes32_sum(r, [&](int64_t j) {
                                  return fm::mul(bf16_to_f32(em[size_t(prev * r + j)]), bf16_to_f32(hm[size_t(v * r + j)]));
                                }));
    want[777] = want[90000] = 1e9f;  // exact tie: the first index wins
    int32_t best = 0;
    for (int64_t v = 1; v < V; ++v)
      if (want[size_t(v)] > want[size_t(best)]) best = int32_t(v);
    const float conf = fm::lanes32_sum(D + r, [&](int64_t i) {
      const float a = i < D ? bf16_to_f32(hH[size_t(i)]) : bf16_to_f32(em[size_t(prev * r + i - D)]);
      return fm::mul(a, bf16_to_f32(wc[size_t(i)]));
    });
    lk[777] = lk[90000] = 1e9f;  // survives the bias add (1e9 + small = 1e9 in f32)
    Dev<float> dlk(lk), dconf(1);
    Dev<bf16_t> dem(em), dhm(hm), dhH(hH), dwc(wc);
    Dev<int32_t> dprev(std::vector<int32_t>{prev}), dbest(1);
    ASSERT_TRUE(markov_bias(dlk.p(), V, r, dem.p(), dhm.p(), dprev.p(), nullptr).ok());
    ASSERT_TRUE(argmax(dlk.p(), V, dbest.p(), nullptr).ok());
    ASSERT_TRUE(confidence(dhH.p(), D, dem.p(), r, dprev.p(), dwc.p(), dconf.p(), nullptr).ok());
    auto got = dlk.get();
    got[777] = got[90000] = 1e9f;
    expect_same(got, want, "markov bias");
    EXPECT_EQ(dbest.get()[0], best);
    expect_same(dconf.get(), std::vector<float>{conf}, "confidence");
  }
}


// DevRope::ensure grown in steps (a short context, then a long prompt's positions filled on every
// core, then a few more) holds model::RopeTable::at's values bit for bit at every position.
TEST(CudaOps, RopeTablesGrownOnEveryCoreEqualTheHost) {
  NEED_GPU();
  DevRope r;
  r.table = model::make_rope_table(64, 10000.0, true, 16.0, 4096, 32.0, 1.0);
  const int half = 32;
  for (const int64_t n : {int64_t(300), int64_t(4100), int64_t(40000), int64_t(40007)}) ASSERT_TRUE(r.ensure(n, nullptr).ok());
  const int64_t n = r.n_pos;
  std::vector<float> c(size_t(n * half)), s(c.size());
  ASSERT_EQ(cudaMemcpy(c.data(), r.cos.get(), c.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(s.data(), r.sin.get(), s.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> wc(half), ws(half);
  int64_t bad = 0;
  for (int64_t p = 0; p < n; ++p) {
    r.table.at(p, wc.data(), ws.data());
    bad += std::memcmp(wc.data(), &c[size_t(p * half)], half * sizeof(float)) != 0 || std::memcmp(ws.data(), &s[size_t(p * half)], half * sizeof(float)) != 0;
  }
  EXPECT_EQ(bad, 0) << "positions whose cos/sin differ from the host table";
}

// rows_argmax against model::logits_argmax (the sampler's greedy pick): ties, NaN entries, a NaN
// first value, an all-NaN row, -inf rows, rows of 1 and of the released vocabulary.
TEST(CudaOps, RowsArgmaxEqualsTheSampler) {
  NEED_GPU();
  Rng rng(37);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const int64_t V : {int64_t(1), int64_t(777), int64_t(129280)}) {
    const int64_t rows = 6;
    auto x = rng.f32(rows * V, 3.0f);
    for (int64_t i = 0; i < V; i += 5) x[size_t(1 * V + i)] = 7.5f;  // ties: the first wins
    for (int64_t i = 0; i < V; i += 3) x[size_t(2 * V + i)] = nan;
    x[size_t(3 * V)] = nan;
    std::fill(x.begin() + 4 * V, x.begin() + 5 * V, nan);
    std::fill(x.begin() + 5 * V, x.begin() + 6 * V, -inf);
    Dev<float> dx(x);
    Dev<int32_t> out(rows);
    ASSERT_TRUE(rows_argmax(dx.p(), rows, V, out.p(), nullptr).ok());
    const auto got = out.get();
    for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(got[size_t(r)], model::logits_argmax(&x[size_t(r * V)], V)) << "V " << V << " row " << r;
  }
}

// markov_step (one launch per chain token) against markov_bias + argmax + confidence: the same
// bits for lk, the id and the confidence; any grid (1, 3, 4 per SM CTAs); its counter returns to 0
// (two tokens in a row on one scratch); ties, NaN entries, lk[0] NaN and an all-NaN row.
TEST(CudaOps, MarkovStepSameBitsAsThreeKernels) {
  NEED_GPU();
  Rng rng(31);
  const int64_t D = 320;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const int r : {32, 256, 520}) {
    for (const int64_t V : {int64_t(17), int64_t(1000), int64_t(129280)}) {
      const auto em = rng.act(V * r, 0.1f), hm = rng.act(V * r, 0.1f), hH = rng.act(D), wc = rng.act(D + r, 0.05f);
      Dev<bf16_t> dem(em), dhm(hm), dhH(hH), dwc(wc);
      ASSERT_TRUE(markov_step_fits(V, r, dem.p(), dhm.p()));
      for (const int kind : {0, 1, 2, 3}) {  // 0 plain, 1 ties and NaNs, 2 lk[0] NaN, 3 all NaN
        for (const int ctas : {1, 3, markov_step_ctas()}) {
          SCOPED_TRACE(::testing::Message() << "r " << r << " V " << V << " kind " << kind << " ctas " << ctas);
          auto lk = rng.f32(2 * V, 1.0f);  // two chain tokens' rows
          if (kind == 1)
            for (int64_t v = 3; v < 2 * V; v += 7) lk[size_t(v)] = v % 2 ? nan : 1e9f;
          if (kind == 2) lk[0] = lk[size_t(V)] = nan;
          if (kind == 3) std::fill(lk.begin(), lk.end(), nan);
          // the three kernels, token 1 then token 2 (token 2's prev = token 1's id)
          Dev<float> a_lk(lk), a_conf(2);
          Dev<int32_t> a_ids(std::vector<int32_t>{11, 0, 0});
          for (int k = 0; k < 2; ++k) {
            ASSERT_TRUE(markov_bias(a_lk.p() + k * V, V, r, dem.p(), dhm.p(), a_ids.p() + k, nullptr).ok());
            ASSERT_TRUE(argmax(a_lk.p() + k * V, V, a_ids.p() + k + 1, nullptr).ok());
            ASSERT_TRUE(confidence(dhH.p(), D, dem.p(), r, a_ids.p() + k, dwc.p(), a_conf.p() + k, nullptr).ok());
          }
          Dev<float> b_lk(lk), b_conf(2), pv(ctas);
          Dev<int64_t> pi(ctas);
          Dev<uint32_t> counter(std::vector<uint32_t>{0});
          Dev<int32_t> b_ids(std::vector<int32_t>{11, 0, 0});
          const MarkovScratch ms{pv.p(), pi.p(), counter.p(), ctas};
          for (int k = 0; k < 2; ++k)
            ASSERT_TRUE(markov_step(b_lk.p() + k * V, V, r, dem.p(), dhm.p(), b_ids.p() + k, dhH.p(), D, dwc.p(), b_ids.p() + k + 1,
                                    b_conf.p() + k, ms, nullptr)
                            .ok());
          const auto ai = a_ids.get(), bi = b_ids.get();
          expect_same(b_lk.get(), a_lk.get(), "markov lk");
          EXPECT_EQ(bi, ai);
          expect_same(b_conf.get(), a_conf.get(), "confidence");
          EXPECT_EQ(counter.get()[0], 0u);
        }
      }
    }
  }
}

}  // namespace
}  // namespace fb::cuda
