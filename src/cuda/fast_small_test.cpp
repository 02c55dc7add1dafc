// The fused small ops of the fast class (fast_small.h) against the exact kernels of ops.h (which
// equal the CPU reference bit for bit, ops_test.cpp), at the released shapes (dim 5,120, hc 4,
// 20 Sinkhorn iterations, q_lora_rank 1,280, o_groups x o_lora_rank 8,192, moe_inter 2,304):
//  (1) accuracy: bf16 / f32 outputs NMSE <= 1e-5; act_quant outputs compared as dequantised values
//      with NMSE <= 5e-4 (a 1-ulp difference of an input can move an e4m3 code by one step, ~6%
//      of that element; docs/numerics.md), and on IDENTICAL inputs the codes and scales must be
//      the exact kernels' bit for bit (fast_act_quant);
//  (2) row invariance: a row's bits are the same alone and among 7 or 64 rows;
//  (3) determinism, and the same bits with programmatic dependent launch on and off, also inside
//      a chain with the fast GEMVs (pdl.cuh's ordering rules).
// Label: gpu (skipped without a device).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "cuda/device.h"
#include "cuda/fast_gemv.h"
#include "cuda/fast_small.h"
#include "cuda/gpu_test_util.h"
#include "cuda/ops.h"
#include "cuda/ops_test_util.h"

namespace fb::cuda {
namespace {

using ops_test_util::Rng;
using test_util::Dev;

constexpr int kHc = 4, kIters = 20;
constexpr int64_t kDim = 5120, kMaxRows = 64;
constexpr float kEps = 1e-6f, kHcEps = 1e-6f;

double val(uint16_t b) { return bf16_to_f32(b); }
double val(float f) { return f; }

template <typename T>
double nmse(const std::vector<T>& got, const std::vector<T>& want, const char* what, double bound) {
  EXPECT_EQ(got.size(), want.size()) << what;
  double se = 0, ss = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double a = val(got[i]), b = val(want[i]);
    EXPECT_TRUE(std::isfinite(a) && std::isfinite(b)) << what << " at " << i;
    if (!std::isfinite(a) || !std::isfinite(b)) return INFINITY;
    se += (a - b) * (a - b);
    ss += b * b;
  }
  EXPECT_GT(ss, 0.0) << what;
  const double e = se / ss;
  EXPECT_LE(e, bound) << what;
  std::printf("  %-40s nmse %.3g\n", what, e);
  return e;
}

struct Quant {
  Dev<uint8_t> codes;
  Dev<float> scales;
  QuantBuf q;
  explicit Quant(int64_t elems) : codes(size_t(elems)), scales(size_t(elems / 32 + 1)) {
    q.codes = codes.p();
    q.scales = scales.p();
    q.capacity = elems;
  }
  // Dequantised values of the first rows * K elements.
  std::vector<float> values(int64_t rows, int64_t K) const {
    const std::vector<uint8_t> c = codes.get();
    const std::vector<float> s = scales.get();
    std::vector<float> v(size_t(rows * K));
    for (int64_t i = 0; i < rows * K; ++i) v[size_t(i)] = e4m3_to_f32(c[size_t(i)]) * s[size_t(i / 32)];
    return v;
  }
};

// Code bytes and scale bits of the first rows of two quant buffers are identical.
void expect_same_quant(const Quant& a, const Quant& b, int64_t rows, int64_t K, const char* what) {
  const auto ca = a.codes.get(), cb = b.codes.get();
  const auto sa = a.scales.get(), sb = b.scales.get();
  EXPECT_EQ(std::memcmp(ca.data(), cb.data(), size_t(rows * K)), 0) << what << " codes";
  EXPECT_EQ(std::memcmp(sa.data(), sb.data(), size_t(rows * K / 32) * 4), 0) << what << " scales";
}

template <typename T>
std::vector<T> first(const std::vector<T>& v, size_t n) {
  return std::vector<T>(v.begin(), v.begin() + std::min(n, v.size()));
}

// The HcMix fields that carry values (pre, post: hc; comb: hc * hc) of rows [0, T).
std::vector<float> mix_values(const std::vector<HcMix>& m, int64_t T) {
  std::vector<float> v;
  for (int64_t t = 0; t < T; ++t) {
    for (int i = 0; i < kHc; ++i) v.push_back(m[size_t(t)].pre[i]);
    for (int i = 0; i < kHc; ++i) v.push_back(m[size_t(t)].post[i]);
    for (int i = 0; i < kHc * kHc; ++i) v.push_back(m[size_t(t)].comb[i]);
  }
  return v;
}

// One mHC site's operands at released dimensions.
struct SiteData {
  int64_t n_mix = (2 + kHc) * kHc;
  std::vector<uint16_t> X, norm_w;
  std::vector<float> fn, scale, base, pre;
  explicit SiteData(uint64_t seed) {
    Rng r(seed);
    X = r.bf16(kMaxRows * kHc * kDim);
    fn = r.f32(n_mix * kHc * kDim, 0.01f);
    scale = {r.uniform(0.5f, 2.0f), r.uniform(0.5f, 2.0f), r.uniform(0.5f, 2.0f)};
    base = r.f32(n_mix, 0.5f);
    pre.resize(size_t(kMaxRows * kHc));
    for (auto& p : pre) p = r.uniform(0.05f, 1.0f);
    norm_w.resize(size_t(kDim));
    for (auto& w : norm_w) w = bf16_bits_from_f32(r.uniform(0.5f, 1.5f));
  }
};

struct SiteOut {
  std::vector<HcMix> mix;
  std::vector<uint16_t> u;
  Quant q{kMaxRows * kDim};
};

struct SiteRunner {
  const SiteData& d;
  Dev<uint16_t> X, norm_w, u{size_t(kMaxRows * kDim)}, tmp{size_t(kMaxRows * kDim)};
  Dev<float> fn, scale, base, pre;
  Dev<HcMix> mix{size_t(kMaxRows)};
  DeviceBuffer scratch_mem;
  FastHcScratch scratch;
  explicit SiteRunner(const SiteData& data) : d(data), X(data.X), norm_w(data.norm_w), fn(data.fn), scale(data.scale), base(data.base), pre(data.pre) {
    const size_t bytes = FastHcScratch::bytes(kDim);
    EXPECT_TRUE(scratch_mem.alloc(bytes).ok());
    EXPECT_EQ(cudaMemset(scratch_mem.get(), 0, bytes), cudaSuccess);
    scratch = FastHcScratch::at(scratch_mem.get(), kDim);
  }
  // Rows [r0, r0 + T) of the data as rows [0, T) of a call.
  // defer: the Sinkhorn by fast_hc_sinkhorn on stream `side` after the site (an event between).
  void fast(int64_t r0, int64_t T, SiteOut& o, bool defer = false, cudaStream_t side = nullptr) {
    mix.poison();
    u.poison();
    o.q.codes.poison();
    EXPECT_TRUE(fast_hc_site(X.p() + r0 * kHc * kDim, T, kHc, kDim, fn.p(), kEps, scale.p(), base.p(), kIters, kHcEps, pre.p() + r0 * kHc, kHc,
                             norm_w.p(), scratch, mix.p(), u.p(), o.q.q, nullptr, defer)
                    .ok());
    if (defer) {
      cudaEvent_t ev;
      EXPECT_EQ(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
      EXPECT_EQ(cudaEventRecord(ev, nullptr), cudaSuccess);
      EXPECT_EQ(cudaStreamWaitEvent(side, ev, 0), cudaSuccess);
      EXPECT_TRUE(fast_hc_sinkhorn(scratch, T, kHc, kEps, scale.p(), base.p(), kIters, kHcEps, mix.p(), side).ok());
      EXPECT_EQ(cudaStreamSynchronize(side), cudaSuccess);
      EXPECT_EQ(cudaEventDestroy(ev), cudaSuccess);
    }
    o.mix = first(mix.get(), size_t(T));
    o.u = first(u.get(), size_t(T * kDim));
  }
  void exact(int64_t T, SiteOut& o) {
    EXPECT_TRUE(hc_mixes(X.p(), T, kHc, kDim, fn.p(), kEps, scale.p(), base.p(), kIters, kHcEps, mix.p(), nullptr).ok());
    EXPECT_TRUE(hc_pre_norm_quant(X.p(), T, kHc, kDim, pre.p(), kHc, norm_w.p(), kEps, tmp.p(), u.p(), o.q.q, nullptr).ok());
    o.mix = first(mix.get(), size_t(T));
    o.u = first(u.get(), size_t(T * kDim));
  }
};

TEST(FastSmall, HcSiteAgainstExact) {
  FB_NEED_GPU();
  const SiteData d(11);
  SiteRunner run(d);
  for (int64_t T : {int64_t(1), int64_t(7), kMaxRows}) {
    SiteOut f, e;
    run.fast(0, T, f);
    run.exact(T, e);
    const std::string tag = "hc site T=" + std::to_string(T);
    nmse(mix_values(f.mix, T), mix_values(e.mix, T), (tag + " mixes").c_str(), 1e-5);
    nmse(f.u, e.u, (tag + " u").c_str(), 1e-5);
    nmse(f.q.values(T, kDim), e.q.values(T, kDim), (tag + " u codes (dequantised)").c_str(), 5e-4);
    // comb is doubly stochastic after Sinkhorn: columns sum to ~1
    for (int64_t t = 0; t < T; ++t)
      for (int b = 0; b < kHc; ++b) {
        double s = 0;
        for (int a = 0; a < kHc; ++a) s += f.mix[size_t(t)].comb[a * kHc + b];
        EXPECT_NEAR(s, 1.0, 1e-3) << tag << " row " << t << " column " << b;
      }
  }
}

TEST(FastSmall, HcSiteRowInvariantDeterministicAndPdl) {
  FB_NEED_GPU();
  const SiteData d(12);
  SiteRunner run(d);
  for (bool pdl : {false, true}) {
    set_fast_pdl(pdl);
    SiteOut all, again;
    run.fast(0, kMaxRows, all);
    run.fast(0, kMaxRows, again);
    EXPECT_EQ(std::memcmp(all.u.data(), again.u.data(), all.u.size() * 2), 0) << "determinism, pdl " << pdl;
    expect_same_quant(all.q, again.q, kMaxRows, kDim, "determinism");
    for (int64_t r0 : {int64_t(0), int64_t(5), int64_t(63)}) {
      for (int64_t T : {int64_t(1), int64_t(7)}) {
        if (r0 + T > kMaxRows) continue;
        SiteOut part;
        run.fast(r0, T, part);
        EXPECT_EQ(std::memcmp(part.u.data(), all.u.data() + r0 * kDim, size_t(T * kDim) * 2), 0) << "u rows " << r0 << "+" << T;
        EXPECT_EQ(std::memcmp(part.mix.data(), all.mix.data() + r0, size_t(T) * sizeof(HcMix)), 0) << "mix rows " << r0 << "+" << T;
        const auto pc = part.q.codes.get(), ac = all.q.codes.get();
        EXPECT_EQ(std::memcmp(pc.data(), ac.data() + r0 * kDim, size_t(T * kDim)), 0) << "codes rows " << r0 << "+" << T;
      }
    }
  }
  set_fast_pdl(false);
}

// The site's warp Sinkhorn against the one-thread form (the site with its Sinkhorn deferred to
// fast_hc_sinkhorn, on another stream): the same mixes, u and codes, bit for bit (the same
// operations on the same sums in the same order).
TEST(FastSmall, HcSiteWarpSinkhornSameBits) {
  FB_NEED_GPU();
  const SiteData d(13);
  SiteRunner run(d);
  cudaStream_t side;
  ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  for (bool pdl : {false, true}) {
    set_fast_pdl(pdl);
    for (int64_t T : {int64_t(1), int64_t(7), kMaxRows}) {
      SiteOut one, deferred;
      run.fast(0, T, one);
      run.fast(0, T, deferred, true, side);
      const std::string tag = "T=" + std::to_string(T) + " pdl " + std::to_string(pdl);
      EXPECT_EQ(std::memcmp(one.mix.data(), deferred.mix.data(), size_t(T) * sizeof(HcMix)), 0) << tag << " mixes";
      EXPECT_EQ(std::memcmp(one.u.data(), deferred.u.data(), one.u.size() * 2), 0) << tag << " u";
      expect_same_quant(one.q, deferred.q, T, kDim, tag.c_str());
    }
  }
  set_fast_pdl(false);
  ASSERT_EQ(cudaStreamDestroy(side), cudaSuccess);
}

// Micro-bench (prints, asserts nothing of speed): one decode row's site at the released width,
// 200 launches back to back with PDL: whole (warp Sinkhorn), with the Sinkhorn deferred (the two
// site kernels without it), and the one-thread Sinkhorn kernel alone.
TEST(FastSmall, BenchSite) {
  FB_NEED_GPU();
  const SiteData d(14);
  SiteRunner run(d);
  Quant q{kMaxRows * kDim};
  set_fast_pdl(true);
  cudaEvent_t a, b;
  ASSERT_EQ(cudaEventCreate(&a), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&b), cudaSuccess);
  auto time_us = [&](auto call) {
    for (int i = 0; i < 20; ++i) call();
    EXPECT_EQ(cudaEventRecord(a, nullptr), cudaSuccess);
    for (int i = 0; i < 200; ++i) call();
    EXPECT_EQ(cudaEventRecord(b, nullptr), cudaSuccess);
    EXPECT_EQ(cudaEventSynchronize(b), cudaSuccess);
    float ms = 0;
    EXPECT_EQ(cudaEventElapsedTime(&ms, a, b), cudaSuccess);
    return ms * 1e3 / 200;
  };
  auto site = [&](bool defer) {
    return fast_hc_site(run.X.p(), 1, kHc, kDim, run.fn.p(), kEps, run.scale.p(), run.base.p(), kIters, kHcEps, run.pre.p(), kHc, run.norm_w.p(),
                        run.scratch, run.mix.p(), run.u.p(), q.q, nullptr, defer);
  };
  const double whole = time_us([&] { EXPECT_TRUE(site(false).ok()); });
  const double split = time_us([&] { EXPECT_TRUE(site(true).ok()); });
  const double sk = time_us([&] { EXPECT_TRUE(fast_hc_sinkhorn(run.scratch, 1, kHc, kEps, run.scale.p(), run.base.p(), kIters, kHcEps, run.mix.p(), nullptr).ok()); });
  std::printf("[ bench ] hc site, 1 row, dim %lld: whole (warp Sinkhorn) %.2f us, Sinkhorn deferred %.2f us, one-thread Sinkhorn kernel %.2f us\n", (long long)kDim, whole,
              split, sk);
  set_fast_pdl(false);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
}

TEST(FastSmall, HcPostInPlace) {
  FB_NEED_GPU();
  const SiteData d(13);
  SiteRunner run(d);
  Rng r(14);
  const std::vector<uint16_t> y = r.bf16(kMaxRows * kDim);
  Dev<uint16_t> yd(y), out{size_t(kMaxRows * kHc * kDim)}, Xf(d.X);
  Dev<float> pre_e{size_t(kMaxRows * kHc)}, pre_f{size_t(kMaxRows * kHc)};
  for (int64_t T : {int64_t(1), int64_t(7), kMaxRows}) {
    EXPECT_TRUE(hc_mixes(run.X.p(), T, kHc, kDim, run.fn.p(), kEps, run.scale.p(), run.base.p(), kIters, kHcEps, run.mix.p(), nullptr).ok());
    EXPECT_TRUE(hc_post(yd.p(), run.X.p(), T, kHc, kDim, run.mix.p(), out.p(), nullptr).ok());
    EXPECT_TRUE(hc_take_pre(run.mix.p(), T, kHc, pre_e.p(), nullptr).ok());
    Xf.set(d.X);
    EXPECT_TRUE(fast_hc_post(yd.p(), Xf.p(), T, kHc, kDim, run.mix.p(), pre_f.p(), nullptr).ok());
    const std::string tag = "hc_post in place T=" + std::to_string(T);
    nmse(first(Xf.get(), size_t(T * kHc * kDim)), first(out.get(), size_t(T * kHc * kDim)), tag.c_str(), 1e-5);
    EXPECT_EQ(first(pre_f.get(), size_t(T * kHc)), first(pre_e.get(), size_t(T * kHc))) << tag << " pre";
    // rows past T untouched
    const auto xf = Xf.get();
    EXPECT_EQ(std::memcmp(xf.data() + T * kHc * kDim, d.X.data() + T * kHc * kDim, size_t((kMaxRows - T) * kHc * kDim) * 2), 0) << tag;
  }
}

// The previous site's hc_post inside the next site's partial kernel (FastHcPost,
// CudaRunOptions::defer_hc_post) against fast_hc_post and then the site: the same X, pre_out,
// mixes, u and codes, bit for bit; with the carried pre read from the post's mix (the FFN site's
// case: the kernel writes pre_out as the other CTAs collapse); and with y the MoE combine of
// expert and shared outputs summed inside (defer_combine) against moe_combine first.
TEST(FastSmall, HcPostInsideNextSiteSameBits) {
  FB_NEED_GPU();
  const SiteData d(15);
  SiteRunner run(d);
  Rng r(16);
  const std::vector<uint16_t> y = r.bf16(kMaxRows * kDim);
  constexpr int kK = 6;
  Dev<uint16_t> yd(y), ye(r.bf16(kMaxRows * kK * kDim)), ys(r.bf16(kMaxRows * kDim)), yc{size_t(kMaxRows * kDim)};
  Dev<HcMix> prev{size_t(kMaxRows)};
  Dev<float> pre_a{size_t(kMaxRows * kHc)}, pre_b{size_t(kMaxRows * kHc)};
  for (bool pdl : {false, true}) {
    set_fast_pdl(pdl);
    for (int64_t T : {int64_t(1), int64_t(7), kMaxRows}) {
      const std::string tag = "T=" + std::to_string(T) + " pdl " + std::to_string(pdl);
      // the previous site's mixes (from the data's X)
      EXPECT_TRUE(hc_mixes(run.X.p(), T, kHc, kDim, run.fn.p(), kEps, run.scale.p(), run.base.p(), kIters, kHcEps, prev.p(), nullptr).ok());
      const float* prev_pre = reinterpret_cast<const float*>(reinterpret_cast<const char*>(prev.p()) + offsetof(HcMix, pre));
      const int64_t prev_stride = int64_t(sizeof(HcMix) / sizeof(float));
      for (int variant = 0; variant < 3; ++variant) {
        const bool carried = variant > 0, combine = variant == 2;  // carried: the site collapses with the post's pre
        const float* pre = carried ? prev_pre : run.pre.p();
        const int64_t stride = carried ? prev_stride : kHc;
        SiteOut a, b;
        // a: fast_hc_post, then the site
        run.X.set(d.X);
        pre_a.poison();
        if (combine) EXPECT_TRUE(moe_combine(ye.p(), kK, ys.p(), T, kDim, yc.p(), nullptr).ok());
        EXPECT_TRUE(fast_hc_post(combine ? yc.p() : yd.p(), run.X.p(), T, kHc, kDim, prev.p(), carried ? pre_a.p() : nullptr, nullptr).ok());
        EXPECT_TRUE(fast_hc_site(run.X.p(), T, kHc, kDim, run.fn.p(), kEps, run.scale.p(), run.base.p(), kIters, kHcEps, pre, stride, run.norm_w.p(),
                                 run.scratch, run.mix.p(), run.u.p(), a.q.q, nullptr)
                        .ok());
        const auto xa = run.X.get();
        a.mix = first(run.mix.get(), size_t(T));
        a.u = first(run.u.get(), size_t(T * kDim));
        // b: one site with the post inside
        run.X.set(d.X);
        run.mix.poison();
        run.u.poison();
        pre_b.poison();
        const FastHcPost post = combine ? FastHcPost{nullptr, prev.p(), run.X.p(), pre_b.p(), ye.p(), kK, ys.p()}
                                        : FastHcPost{yd.p(), prev.p(), run.X.p(), carried ? pre_b.p() : nullptr};
        EXPECT_TRUE(fast_hc_site(run.X.p(), T, kHc, kDim, run.fn.p(), kEps, run.scale.p(), run.base.p(), kIters, kHcEps, pre, stride, run.norm_w.p(),
                                 run.scratch, run.mix.p(), run.u.p(), b.q.q, nullptr, false, &post)
                        .ok());
        const auto xb = run.X.get();
        b.mix = first(run.mix.get(), size_t(T));
        b.u = first(run.u.get(), size_t(T * kDim));
        const std::string t2 = tag + (carried ? " carried pre" : "") + (combine ? " combine" : "");
        EXPECT_EQ(xa, xb) << t2 << " X (rows past T untouched in both)";
        EXPECT_EQ(std::memcmp(a.mix.data(), b.mix.data(), size_t(T) * sizeof(HcMix)), 0) << t2 << " mixes";
        EXPECT_EQ(a.u, b.u) << t2 << " u";
        expect_same_quant(a.q, b.q, T, kDim, t2.c_str());
        if (carried) {
          EXPECT_EQ(first(pre_a.get(), size_t(T * kHc)), first(pre_b.get(), size_t(T * kHc))) << t2 << " pre_out";
        }
      }
    }
  }
  set_fast_pdl(false);
  run.X.set(d.X);
}

TEST(FastSmall, NormQuantAndActQuant) {
  FB_NEED_GPU();
  Rng r(15);
  for (int64_t n : {int64_t(1280), int64_t(512)}) {
    const std::vector<uint16_t> x = r.bf16(kMaxRows * n, 3.0f);
    std::vector<uint16_t> w(static_cast<size_t>(n));
    for (auto& v : w) v = bf16_bits_from_f32(r.uniform(0.5f, 1.5f));
    Dev<uint16_t> xd(x), wd(w), ye{size_t(kMaxRows * n)}, yf{size_t(kMaxRows * n)};
    Quant qe(kMaxRows * n), qf(kMaxRows * n), q1(kMaxRows * n);
    EXPECT_TRUE(rms_norm(xd.p(), kMaxRows, n, wd.p(), kEps, ye.p(), nullptr).ok());
    EXPECT_TRUE(act_quant(ye.p(), kMaxRows, n, qe.q, nullptr).ok());
    EXPECT_TRUE(fast_norm_quant(xd.p(), kMaxRows, n, wd.p(), kEps, yf.p(), qf.q, nullptr).ok());
    const std::string tag = "norm_quant n=" + std::to_string(n);
    nmse(yf.get(), ye.get(), (tag + " y").c_str(), 1e-5);
    nmse(qf.values(kMaxRows, n), qe.values(kMaxRows, n), (tag + " codes (dequantised)").c_str(), 5e-4);
    // the fast act_quant of the same bf16 rows: the exact kernel's codes and scales, bit for bit
    EXPECT_TRUE(fast_act_quant(yf.p(), kMaxRows, n, q1.q, nullptr).ok());
    EXPECT_TRUE(act_quant(yf.p(), kMaxRows, n, qe.q, nullptr).ok());
    expect_same_quant(q1, qe, kMaxRows, n, (tag + " act_quant").c_str());
    expect_same_quant(q1, qf, kMaxRows, n, (tag + " act_quant vs the fused norm's").c_str());
    // row invariance: row 9 alone
    Dev<uint16_t> y9{size_t(n)};
    Quant q9(n);
    EXPECT_TRUE(fast_norm_quant(xd.p() + 9 * n, 1, n, wd.p(), kEps, y9.p(), q9.q, nullptr).ok());
    const auto yall = yf.get(), yone = y9.get();
    EXPECT_EQ(std::memcmp(yone.data(), yall.data() + 9 * n, size_t(n) * 2), 0) << tag << " row 9 alone";
  }
  // act_quant at the wo_b input width, with edge values (zeros, tiny, huge blocks)
  const int64_t K = 8192;
  std::vector<uint16_t> x = r.bf16(7 * K, 1.0f);
  for (int64_t i = 0; i < 32; ++i) x[size_t(i)] = 0;                                        // an all-zero block
  for (int64_t i = 32; i < 64; ++i) x[size_t(i)] = bf16_bits_from_f32(1e-30f * float(i));  // tiny
  for (int64_t i = 64; i < 96; ++i) x[size_t(i)] = bf16_bits_from_f32(3e4f * float(i - 80));
  Dev<uint16_t> xd(x);
  Quant qe(7 * K), qf(7 * K);
  EXPECT_TRUE(act_quant(xd.p(), 7, K, qe.q, nullptr).ok());
  EXPECT_TRUE(fast_act_quant(xd.p(), 7, K, qf.q, nullptr).ok());
  expect_same_quant(qf, qe, 7, K, "act_quant K=8192");
}

TEST(FastSmall, SwigluQuant) {
  FB_NEED_GPU();
  Rng r(16);
  const int64_t n = 2304, M = 36;  // 6 rows x 6 experts
  const std::vector<uint16_t> a = r.bf16(M * n, 2.0f), b = r.bf16(M * n, 2.0f);
  std::vector<float> wt(static_cast<size_t>(M));
  for (auto& w : wt) w = r.uniform(0.05f, 0.6f);
  Dev<uint16_t> ad(a), bd(b);
  Dev<float> wd(wt);
  for (float limit : {0.0f, 7.0f})
    for (bool weighted : {false, true}) {
      Quant qe(M * n), qf(M * n);
      EXPECT_TRUE(swiglu_quant(ad.p(), bd.p(), M, n, limit, weighted ? wd.p() : nullptr, qe.q, nullptr).ok());
      EXPECT_TRUE(fast_swiglu_quant(ad.p(), bd.p(), M, n, limit, weighted ? wd.p() : nullptr, qf.q, nullptr).ok());
      const std::string tag = "swiglu_quant limit=" + std::to_string(int(limit)) + (weighted ? " weighted" : "");
      nmse(qf.values(M, n), qe.values(M, n), tag.c_str(), 5e-4);
    }
}

// A decode-like chain (GEMV -> norm+quant -> GEMV -> act_quant -> GEMV), 20 times over, with and
// without programmatic dependent launch: the same bits (a misplaced pdl_wait() would read stale
// activations and differ).
TEST(FastSmall, PdlChainSameBits) {
  FB_NEED_GPU();
  Rng r(17);
  const int64_t D = 5120, R = 1280, N2 = 8192;
  std::mt19937_64 g(18);
  auto codes = [&](int64_t n) {
    std::vector<uint8_t> v(static_cast<size_t>(n));
    for (auto& c : v) do c = uint8_t(g()); while ((c & 0x7F) == 0x7F || (c & 0x78) > 0x40);  // modest magnitudes, no NaN
    return v;
  };
  auto scales = [&](int64_t n) { return std::vector<uint8_t>(size_t(n), uint8_t(120)); };
  Dev<uint8_t> wa(codes(R * D)), sa(scales((R / 32) * (D / 32))), wb(codes(N2 * R)), sb(scales((N2 / 32) * (R / 32))), wc(codes(D * N2)),
      sc(scales((D / 32) * (N2 / 32)));
  const Fp8W A{wa.p(), sa.p(), R, D}, B{wb.p(), sb.p(), N2, R}, C{wc.p(), sc.p(), D, N2};
  std::vector<uint16_t> norm(size_t(R), bf16_bits_from_f32(1.0f));
  Dev<uint16_t> normd(norm), x(r.bf16(D)), a{size_t(R)}, an{size_t(R)}, b{size_t(N2)}, out{size_t(D)};
  Quant qx(D), qa(R), qb(N2);
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);  // as the executor's
  auto chain = [&]() {
    EXPECT_TRUE(act_quant(x.p(), 1, D, qx.q, st).ok());
    for (int i = 0; i < 20; ++i) {
      EXPECT_TRUE(fast_fp8_gemv_q(qx.q, 1, A, a.p(), st).ok());
      EXPECT_TRUE(fast_norm_quant(a.p(), 1, R, normd.p(), kEps, an.p(), qa.q, st).ok());
      EXPECT_TRUE(fast_fp8_gemv_q(qa.q, 1, B, b.p(), st).ok());
      EXPECT_TRUE(fast_act_quant(b.p(), 1, N2, qb.q, st).ok());
      EXPECT_TRUE(fast_fp8_gemv_q(qb.q, 1, C, out.p(), st).ok());
      EXPECT_TRUE(fast_act_quant(out.p(), 1, D, qx.q, st).ok());
    }
    EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    return out.get();
  };
  set_fast_pdl(false);
  const std::vector<uint16_t> plain = chain();
  set_fast_pdl(true);
  const std::vector<uint16_t> pdl = chain();
  set_fast_pdl(false);
  EXPECT_EQ(plain, pdl);
  cudaStreamDestroy(st);
  double ss = 0;
  for (uint16_t v : plain) ss += val(v) * val(v);
  EXPECT_TRUE(std::isfinite(ss) && ss > 0) << "the chain must carry signal";
}

}  // namespace
}  // namespace fb::cuda
