// The fused small ops of fast_small.h. Conventions shared by the kernels:
//  * threads own 8-element chunks of a row (one 16-byte load of bf16); the 4 chunks of a 32-block
//    sit in 4 adjacent lanes, whose amaxes combine by two xor shuffles; the scale rule and the
//    clamp are the reference's (numerics.cuh fp8_block_scale), the e4m3 rounding is the
//    hardware's RNE conversion (the same code for every clamped finite value);
//  * sums of a row: per-thread FMA chains in a fixed element order, then fixed xor butterflies
//    and a fixed order over warps / CTAs: the same tree for any number of rows;
//  * every kernel starts with pdl_trigger() (the next kernel may launch and issue its weight
//    loads) and pdl_wait() before its first read of step data.
#include "cuda/fast_small.h"

#include <atomic>

#include "base/check.h"
#include "cuda/device.h"
#include "cuda/numerics.cuh"
#include "cuda/pdl.cuh"
#include "cuda/launch.cuh"

namespace fb::cuda {

using dev::kFull;
using dev::to_bf;

namespace {

std::atomic<bool> g_pdl{false};

__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }
__device__ __forceinline__ void unpack8(const uint4& v, float* f) {
  const uint32_t q[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    f[2 * e] = bf_lo(q[e]);
    f[2 * e + 1] = bf_hi(q[e]);
  }
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi) { return uint32_t(to_bf(lo)) | uint32_t(to_bf(hi)) << 16; }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(kFull, v, off));
  return v;
}

// Two e4m3 codes (RNE, the value already clamped to +-448) in the low 16 bits.
__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

// act_quant of the 8 values v of chunk c (8-element chunk index in the row) held by this lane:
// amax over the 32-block (the 4 lanes of the block), scale, codes. Every lane of the warp calls it
// (on = false: a lane past the row's end, contributing nothing).
__device__ __forceinline__ void quant8(const float* v, bool on, int64_t c, uint8_t* codes_row, float* scales_row) {
  float amax = 0.0f;
  if (on)
#pragma unroll
    for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(v[e]));
  amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, 2));
  if (!on) return;
  const float s = dev::fp8_block_scale(amax);
  if ((c & 3) == 0) scales_row[c / 4] = s;
  uint32_t w[4];
#pragma unroll
  for (int e = 0; e < 4; ++e)
    w[e] = e4m3x2(fminf(fmaxf(__fdiv_rn(v[2 * e], s), -448.0f), 448.0f), fminf(fmaxf(__fdiv_rn(v[2 * e + 1], s), -448.0f), 448.0f));
  *reinterpret_cast<uint2*>(codes_row + c * 8) = make_uint2(w[0] | w[1] << 16, w[2] | w[3] << 16);
}

// ---- mHC site -----------------------------------------------------------------------------------
// Two kernels, the second launched with PDL behind the first:
//  * partial, grid (dim / kPartDims, T), kSiteThreads threads: CTA (c, t) owns dims
//    [c * kPartDims, +kPartDims) of all HC streams of row t; 8 lanes of 4 dims each times 16
//    groups, group g forming mixes g and g + 16. It writes partials[t][c] = the CTA's sums of the
//    NV values of the row (X's sum of squares, the NMIX dots with fn, the collapsed row's sum of
//    squares) and the collapsed bf16 values h[t][dims]. fn is a weight: its 24 KB per CTA are in
//    flight before the PDL wait (the whole 2 MB of a site at once: 160 CTAs at dim 5,120);
//  * finish, grid (dim / kFinishDims, T): every CTA sums the row's partials in one fixed tree
//    (4 chunk classes per value, then in class order: the same bits in every CTA and for any T),
//    CTA 0 of the row runs the Sinkhorn in registers and writes mix[t], and every CTA normalises
//    and quantises its own dims.
// (One kernel with the last CTA finishing the row, the first design, ran ~20 us: the whole row's
// norm and the Sinkhorn in one CTA are a long dependent chain. One dim per thread and 128 dims per
// partial CTA, the second, ran ~25 us per site: 40 CTAs with 96 scalar loads per thread.)
constexpr int kSiteThreads = 128;
constexpr int kPartDims = 32;     // dims per partial CTA: 8 lanes x 4 dims
constexpr int kFinishDims = 128;  // dims per finish CTA: 16 chunks of 8 on warp 0
constexpr int kFinishThreads = 512;  // 16 chunk classes summing the partials (4 independent loads in flight each)
constexpr int kSiteNV = 40;       // partial stride: NV = (2 + HC) HC + 2 <= 26 for HC <= 4

// POST: the previous site's hc_post first (FastHcPost, fast_small.h): every group computes the new
// X of its CTA's dims from the old X exactly as fast_hc_post_kernel does (the same FMAs, one
// rounding), all groups read the old X before group 0 writes the new one (a CTA owns its dims), and
// the site's sums run on the new values.
template <int HC, bool POST>
__global__ void __launch_bounds__(kSiteThreads) fast_hc_partial_kernel(const uint16_t* X, int64_t dim, const float* __restrict__ fn,
                                                                      const float* __restrict__ pre, int64_t pre_stride, float* partials,
                                                                      uint16_t* hbuf, FastHcPost post) {
  constexpr int NMIX = (2 + HC) * HC, NV = NMIX + 2;
  static_assert(NMIX <= 32 && NV <= kSiteNV, "mixes must fit two passes of 16 groups");
  pdl_trigger();
  const int tid = int(threadIdx.x), ql = tid & 7, g = tid >> 3;
  const int64_t t = blockIdx.y, chunks = gridDim.x, n = HC * dim;
  const int64_t d0 = int64_t(blockIdx.x) * kPartDims + ql * 4;
  float4 w[2][HC];
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int a = 0; a < HC; ++a)
      w[k][a] = g + 16 * k < NMIX ? __ldg(reinterpret_cast<const float4*>(fn + int64_t(g + 16 * k) * n + a * dim + d0)) : make_float4(0.f, 0.f, 0.f, 0.f);
  pdl_wait();
  const uint16_t* xr = X + t * n;
  float x[HC][4];
  if constexpr (POST) {
    float xo[HC][4], yv[4];
#pragma unroll
    for (int a = 0; a < HC; ++a) {
      const uint2 raw = *reinterpret_cast<const uint2*>(xr + a * dim + d0);  // written below: no read-only path
      xo[a][0] = bf_lo(raw.x), xo[a][1] = bf_hi(raw.x), xo[a][2] = bf_lo(raw.y), xo[a][3] = bf_hi(raw.y);
    }
    const auto load4 = [](const uint16_t* p, float* v) {
      const uint2 raw = __ldg(reinterpret_cast<const uint2*>(p));
      v[0] = bf_lo(raw.x), v[1] = bf_hi(raw.x), v[2] = bf_lo(raw.y), v[3] = bf_hi(raw.y);
    };
    if (post.ye) {  // moe_combine_kernel's sum: experts in order from 0, the shared expert last, one rounding
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, v[4];
      for (int k = 0; k < post.K; ++k) {
        load4(post.ye + (t * post.K + k) * dim + d0, v);
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[e] = __fadd_rn(acc[e], v[e]);
      }
      load4(post.ys + t * dim + d0, v);
#pragma unroll
      for (int e = 0; e < 4; ++e) yv[e] = __uint_as_float(uint32_t(to_bf(__fadd_rn(acc[e], v[e]))) << 16);
    } else {
      load4(post.y + t * dim + d0, yv);
    }
    const HcMix& m = post.mix[t];
    uint32_t o[HC][2];
#pragma unroll
    for (int b = 0; b < HC; ++b) {
      const float pb = m.post[b];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float sum = 0.0f;
#pragma unroll
        for (int a = 0; a < HC; ++a) sum = __fmaf_rn(m.comb[a * HC + b], xo[a][e], sum);
        const uint16_t h = to_bf(__fmaf_rn(pb, yv[e], sum));
        x[b][e] = __uint_as_float(uint32_t(h) << 16);
        if (e & 1) o[b][e >> 1] |= uint32_t(h) << 16;
        else o[b][e >> 1] = h;
      }
    }
    __syncthreads();  // every group has read the old X
    if (g == 0) {
      uint16_t* xw = post.X + t * n;
#pragma unroll
      for (int b = 0; b < HC; ++b) *reinterpret_cast<uint2*>(xw + b * dim + d0) = make_uint2(o[b][0], o[b][1]);
    }
    if (post.pre_out && blockIdx.x == 0 && tid < HC) post.pre_out[t * HC + tid] = m.pre[tid];
  } else {
#pragma unroll
    for (int a = 0; a < HC; ++a) {
      const uint2 raw = __ldg(reinterpret_cast<const uint2*>(xr + a * dim + d0));
      x[a][0] = bf_lo(raw.x), x[a][1] = bf_hi(raw.x), x[a][2] = bf_lo(raw.y), x[a][3] = bf_hi(raw.y);
    }
  }
  float v[2] = {0.0f, 0.0f};
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int a = 0; a < HC; ++a) {
      v[k] = __fmaf_rn(w[k][a].x, x[a][0], v[k]);
      v[k] = __fmaf_rn(w[k][a].y, x[a][1], v[k]);
      v[k] = __fmaf_rn(w[k][a].z, x[a][2], v[k]);
      v[k] = __fmaf_rn(w[k][a].w, x[a][3], v[k]);
    }
  // The 8 lanes of a group in a fixed butterfly.
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int off = 1; off < 8; off <<= 1) v[k] = __fadd_rn(v[k], __shfl_xor_sync(kFull, v[k], off));
  float* pt = partials + (t * chunks + blockIdx.x) * kSiteNV;
  if (ql == 0)
#pragma unroll
    for (int k = 0; k < 2; ++k)
      if (g + 16 * k < NMIX) pt[1 + g + 16 * k] = v[k];
  if (g == 0) {  // lanes 0-7: X's sum of squares, the collapsed row and its sum of squares
    constexpr unsigned kLow8 = 0xFFu;
    float ss = 0.0f, hh = 0.0f;
    const float* p = pre + t * pre_stride;
    float pa[HC];
#pragma unroll
    for (int a = 0; a < HC; ++a) pa[a] = __ldg(p + a);
    uint16_t hb[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float hs = 0.0f;
#pragma unroll
      for (int a = 0; a < HC; ++a) {
        ss = __fmaf_rn(x[a][e], x[a][e], ss);
        hs = __fmaf_rn(pa[a], x[a][e], hs);
      }
      hb[e] = to_bf(hs);
      const float hf = __uint_as_float(uint32_t(hb[e]) << 16);
      hh = __fmaf_rn(hf, hf, hh);
    }
    *reinterpret_cast<uint2*>(hbuf + t * dim + d0) = make_uint2(uint32_t(hb[0]) | uint32_t(hb[1]) << 16, uint32_t(hb[2]) | uint32_t(hb[3]) << 16);
#pragma unroll
    for (int off = 1; off < 8; off <<= 1) {
      ss = __fadd_rn(ss, __shfl_xor_sync(kLow8, ss, off));
      hh = __fadd_rn(hh, __shfl_xor_sync(kLow8, hh, off));
    }
    if (ql == 0) {
      pt[0] = ss;
      pt[NV - 1] = hh;
    }
  }
}

// One Sinkhorn normalisation of the HC x HC matrix C: each of the HC lines starting at C[o * SO]
// (entries C[o * SO + i * SI], i ascending) summed from 0, its sum + eps inverted, the line scaled.
// <HC, 1, HC>: the columns; <HC, HC, 1>: the rows.
template <int HC, int SO, int SI>
__device__ __forceinline__ void sinkhorn_normalize(float* C, float eps) {
#pragma unroll
  for (int o = 0; o < HC; ++o) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < HC; ++i) s = __fadd_rn(s, C[o * SO + i * SI]);
    const float r = __frcp_rn(__fadd_rn(s, eps));
#pragma unroll
    for (int i = 0; i < HC; ++i) C[o * SO + i * SI] = __fmul_rn(C[o * SO + i * SI], r);
  }
}

// Sinkhorn of one row in one thread's registers (hc_split_sinkhorn's steps; a reciprocal per
// row / column instead of a division per element), pre and post; m = the scaled mixes.
template <int HC>
__device__ __forceinline__ void sinkhorn_thread(const float* m, const float* sc, const float* base, int iters, float eps, float* pre, float* post,
                                                float* comb) {
  constexpr int HH = HC * HC;
  float C[HH];
#pragma unroll
  for (int i = 0; i < HC; ++i) {
    pre[i] = __fadd_rn(__frcp_rn(__fadd_rn(1.0f, expf(-__fmaf_rn(m[i], sc[0], base[i])))), eps);
    post[i] = __fmul_rn(2.0f, __frcp_rn(__fadd_rn(1.0f, expf(-__fmaf_rn(m[HC + i], sc[1], base[HC + i])))));
  }
#pragma unroll
  for (int a = 0; a < HC; ++a) {
    float mx = -INFINITY;
#pragma unroll
    for (int b = 0; b < HC; ++b) {
      C[a * HC + b] = __fmaf_rn(m[2 * HC + a * HC + b], sc[2], base[2 * HC + a * HC + b]);
      mx = fmaxf(mx, C[a * HC + b]);
    }
    float sum = 0.0f;
#pragma unroll
    for (int b = 0; b < HC; ++b) {
      C[a * HC + b] = expf(__fsub_rn(C[a * HC + b], mx));
      sum = __fadd_rn(sum, C[a * HC + b]);
    }
    const float r = __frcp_rn(sum);
#pragma unroll
    for (int b = 0; b < HC; ++b) C[a * HC + b] = __fmaf_rn(C[a * HC + b], r, eps);
  }
  const int n_norm = iters > 1 ? 2 * iters - 1 : 1;  // col, then (row, col) x (iters - 1)
  for (int it = 0; it < n_norm; ++it) {
    if ((it & 1) == 0) {
      sinkhorn_normalize<HC, 1, HC>(C, eps);  // columns
    } else {
      sinkhorn_normalize<HC, HC, 1>(C, eps);  // rows
    }
  }
#pragma unroll
  for (int e = 0; e < HH; ++e) comb[e] = C[e];
}

// The same Sinkhorn on the lanes of one warp (every lane calls it): lane l < HC * HC holds comb
// entry (a, b) = (l / HC, l % HC); a row or column sum gathers its HC entries by shuffles and adds
// them in the single-thread order (from 0, a or b ascending), so every value, every sum and every
// reciprocal is the one sinkhorn_thread computes: the same bits (test HcSiteWarpSinkhornSameBits),
// with a dependent chain ~HC times shorter. m(j) returns mix j (any lane, any j).
template <int HC, typename MixF>
__device__ __forceinline__ void sinkhorn_warp(MixF m, const float* sc, const float* base, int iters, float eps, float* pre, float* post,
                                              float* comb) {
  constexpr int HH = HC * HC;
  const int lane = int(threadIdx.x & 31), a = lane / HC, b = lane % HC;
  const bool on = lane < HH;
  if (lane < HC) {
    pre[lane] = __fadd_rn(__frcp_rn(__fadd_rn(1.0f, expf(-__fmaf_rn(m(lane), sc[0], base[lane])))), eps);
    post[lane] = __fmul_rn(2.0f, __frcp_rn(__fadd_rn(1.0f, expf(-__fmaf_rn(m(HC + lane), sc[1], base[HC + lane])))));
  }
  float c = on ? __fmaf_rn(m(2 * HC + lane), sc[2], base[2 * HC + lane]) : 0.0f;
  float v[HC];
  const auto row = [&](float x) {
#pragma unroll
    for (int k = 0; k < HC; ++k) v[k] = __shfl_sync(kFull, x, (a * HC + k) & 31);
  };
  const auto col = [&](float x) {
#pragma unroll
    for (int k = 0; k < HC; ++k) v[k] = __shfl_sync(kFull, x, (k * HC + b) & 31);
  };
  const auto sum = [&] {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < HC; ++k) s = __fadd_rn(s, v[k]);
    return s;
  };
  row(c);
  float mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < HC; ++k) mx = fmaxf(mx, v[k]);
  c = expf(__fsub_rn(c, mx));
  row(c);
  c = __fmaf_rn(c, __frcp_rn(sum()), eps);
  const int n_norm = iters > 1 ? 2 * iters - 1 : 1;  // col, then (row, col) x (iters - 1)
  for (int it = 0; it < n_norm; ++it) {
    if ((it & 1) == 0) col(c);
    else row(c);
    c = __fmul_rn(c, __frcp_rn(__fadd_rn(sum(), eps)));
  }
  if (on) comb[lane] = c;
}

template <int HC>
__global__ void __launch_bounds__(kFinishThreads) fast_hc_finish_kernel(int64_t dim, int64_t chunks, float norm_eps, const float* __restrict__ sc,
                                                                     const float* __restrict__ base, int iters, float hc_eps,
                                                                     const uint16_t* __restrict__ norm_w, const float* partials,
                                                                     const uint16_t* hbuf, HcMix* mix, uint16_t* u, uint8_t* codes, float* scales,
                                                                     float* tot_out) {
  constexpr int NMIX = (2 + HC) * HC, NV = NMIX + 2, HH = HC * HC, NW = kFinishThreads / 32;
  pdl_trigger();
  pdl_wait();
  static_assert(NV <= 32, "one lane per value");
  __shared__ float tot[NV], red[NW][32];
  __shared__ float s_pre[HC], s_post[HC], s_comb[HH];
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid / 32;
  const int64_t t = blockIdx.y, n = HC * dim;
  const float* pp = partials + t * chunks * kSiteNV;
  // Value `lane`, chunks of class `warp` (c = warp mod NW): four interleaved running sums (their
  // loads independent, ~chunks / (4 NW) rounds of L2 latency instead of chunks / NW), added in a
  // fixed order; then the classes in order. (One running sum per thread, 160 chunks in 4 classes,
  // ran 15.6 us under ncu: a chain of 40 dependent load-adds.)
  if (lane < NV) {
    float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t c0 = warp; c0 < chunks; c0 += 4 * NW) {
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t c = c0 + int64_t(u) * NW;
        if (c < chunks) a[u] = __fadd_rn(a[u], pp[c * kSiteNV + lane]);
      }
    }
    red[warp][lane] = __fadd_rn(__fadd_rn(a[0], a[1]), __fadd_rn(a[2], a[3]));
  }
  __syncthreads();
  if (tid < NV) {
    float s = red[0][tid];
#pragma unroll
    for (int w = 1; w < NW; ++w) s = __fadd_rn(s, red[w][tid]);
    tot[tid] = s;
  }
  __syncthreads();
  if (blockIdx.x == 0 && tot_out) {
    // deferred: the row's sums for fast_hc_sinkhorn (a kernel off this stream's critical path)
    if (tid < NV) tot_out[t * kSiteNV + tid] = tot[tid];
  } else if (blockIdx.x == 0) {
    if (warp == 0) {
      const float rho = rsqrtf(__fadd_rn(__fdiv_rn(tot[0], float(n)), norm_eps));
      sinkhorn_warp<HC>([&](int j) { return __fmul_rn(tot[1 + j], rho); }, sc, base, iters, hc_eps, s_pre, s_post, s_comb);
    }
    __syncthreads();
    HcMix* o = mix + t;
    if (tid < 16) {
      o->pre[tid] = tid < HC ? s_pre[tid] : 0.0f;
      o->post[tid] = tid < HC ? s_post[tid] : 0.0f;
    }
    for (int e = tid; e < 256; e += kFinishThreads) o->comb[e] = e < HH ? s_comb[e] : 0.0f;
  }
  // RMSNorm + act_quant of this CTA's dims (8-element chunks on warp 0; quant8 shuffles the warp).
  if (warp != 0) return;
  const float r = rsqrtf(__fadd_rn(__fdiv_rn(tot[NV - 1], float(dim)), norm_eps));
  const int64_t n8 = dim / 8;
  for (int64_t c0 = int64_t(blockIdx.x) * (kFinishDims / 8); c0 < (int64_t(blockIdx.x) + 1) * (kFinishDims / 8); c0 += 32) {
    const int64_t c = c0 + lane;
    const bool on = lane < kFinishDims / 8 && c < n8;
    float y[8];
    if (on) {
      float hv[8], wv[8];
      unpack8(__ldg(reinterpret_cast<const uint4*>(hbuf + t * dim) + c), hv);
      unpack8(__ldg(reinterpret_cast<const uint4*>(norm_w) + c), wv);
      uint32_t o[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        o[e] = pack2(__fmul_rn(wv[2 * e], __fmul_rn(hv[2 * e], r)), __fmul_rn(wv[2 * e + 1], __fmul_rn(hv[2 * e + 1], r)));
        y[2 * e] = bf_lo(o[e]);
        y[2 * e + 1] = bf_hi(o[e]);
      }
      reinterpret_cast<uint4*>(u + t * dim)[c] = make_uint4(o[0], o[1], o[2], o[3]);
    }
    quant8(y, on, c, codes + t * dim, scales + t * (dim / 32));
  }
}

// The deferred half of a site (fast_hc_site with scratch.tot): thread t computes row t's mixes
// from the sums the finish kernel left in tot with sinkhorn_thread, the one-thread form the finish
// kernel's warp form is tested against (the same bits). A Sinkhorn kernel on a side stream lost
// its A/B (4K decode 11.41 -> 12.21 ms/token: the cross-stream joins cost more than the 12 us
// one-thread chain per site they hid); the warp form shortened the chain instead.
template <int HC>
__global__ void fast_hc_sinkhorn_kernel(int64_t T, int64_t dim, float norm_eps, const float* __restrict__ sc, const float* __restrict__ base,
                                        int iters, float hc_eps, const float* __restrict__ tot, HcMix* mix) {
  constexpr int NMIX = (2 + HC) * HC, HH = HC * HC;
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const float* tt = tot + t * kSiteNV;
  const float rho = rsqrtf(__fadd_rn(__fdiv_rn(tt[0], float(HC * dim)), norm_eps));
  float m[NMIX], pre[HC], post[HC], comb[HH];
#pragma unroll
  for (int j = 0; j < NMIX; ++j) m[j] = __fmul_rn(tt[1 + j], rho);
  sinkhorn_thread<HC>(m, sc, base, iters, hc_eps, pre, post, comb);
  HcMix* o = mix + t;
  for (int i = 0; i < 16; ++i) {
    o->pre[i] = i < HC ? pre[i] : 0.0f;
    o->post[i] = i < HC ? post[i] : 0.0f;
  }
  for (int e = 0; e < 256; ++e) o->comb[e] = e < HH ? comb[e] : 0.0f;
}

// ---- hc_post in place ---------------------------------------------------------------------------
// Thread per (row, 8-dim chunk): reads the HC streams' chunk and y's, writes the HC new chunks.
template <int HC>
__global__ void fast_hc_post_kernel(const uint16_t* __restrict__ y, uint16_t* X, int64_t T, int64_t dim, const HcMix* __restrict__ mix,
                                    float* pre_out) {
  pdl_trigger();
  pdl_wait();
  const int64_t n8 = dim / 8, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * n8) return;
  const int64_t t = i / n8, c = i % n8;
  const HcMix& m = mix[t];
  uint16_t* xr = X + t * HC * dim;
  float x[HC][8], yv[8];
#pragma unroll
  for (int a = 0; a < HC; ++a) unpack8(*reinterpret_cast<const uint4*>(xr + a * dim + c * 8), x[a]);
  unpack8(__ldg(reinterpret_cast<const uint4*>(y + t * dim) + c), yv);
  float comb[HC * HC], post[HC];
#pragma unroll
  for (int e = 0; e < HC * HC; ++e) comb[e] = m.comb[e];
#pragma unroll
  for (int b = 0; b < HC; ++b) post[b] = m.post[b];
#pragma unroll
  for (int b = 0; b < HC; ++b) {
    uint32_t o[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
      for (int a = 0; a < HC; ++a) {
        s0 = __fmaf_rn(comb[a * HC + b], x[a][2 * e], s0);
        s1 = __fmaf_rn(comb[a * HC + b], x[a][2 * e + 1], s1);
      }
      o[e] = pack2(__fmaf_rn(post[b], yv[2 * e], s0), __fmaf_rn(post[b], yv[2 * e + 1], s1));
    }
    *reinterpret_cast<uint4*>(xr + b * dim + c * 8) = make_uint4(o[0], o[1], o[2], o[3]);
  }
  if (pre_out && c == 0)
#pragma unroll
    for (int a = 0; a < HC; ++a) pre_out[t * HC + a] = m.pre[a];
}

// ---- RMSNorm + act_quant, one CTA per row ---------------------------------------------------------
constexpr int kRowThreads = 256;
constexpr int kRowMaxChunks = 4;  // 8-element chunks per thread held in registers: n <= 8192

__global__ void __launch_bounds__(kRowThreads) fast_norm_quant_kernel(const uint16_t* __restrict__ x, int64_t n, const uint16_t* __restrict__ w,
                                                                     float eps, uint16_t* y, uint8_t* codes, float* scales) {
  pdl_trigger();
  pdl_wait();
  __shared__ float red[kRowThreads / 32];
  const int64_t m = blockIdx.x, n8 = n / 8;
  const int tid = int(threadIdx.x);
  float v[kRowMaxChunks][8];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kRowMaxChunks; ++k) {
    const int64_t c = tid + int64_t(k) * kRowThreads;
    if (c < n8) {
      unpack8(__ldg(reinterpret_cast<const uint4*>(x + m * n) + c), v[k]);
#pragma unroll
      for (int e = 0; e < 8; ++e) ss = __fmaf_rn(v[k][e], v[k][e], ss);
    }
  }
  ss = warp_sum(ss);
  if ((tid & 31) == 0) red[tid / 32] = ss;
  __syncthreads();
  float tot = red[0];
#pragma unroll
  for (int i = 1; i < kRowThreads / 32; ++i) tot = __fadd_rn(tot, red[i]);
  const float r = rsqrtf(__fadd_rn(__fdiv_rn(tot, float(n)), eps));
#pragma unroll
  for (int k = 0; k < kRowMaxChunks; ++k) {
    const int64_t c = tid + int64_t(k) * kRowThreads;
    if (int64_t(k) * kRowThreads >= n8) break;  // uniform over the CTA
    const bool on = c < n8;
    float q[8];
    if (on) {
      float wv[8];
      unpack8(__ldg(reinterpret_cast<const uint4*>(w) + c), wv);
      uint32_t o[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        o[e] = pack2(__fmul_rn(wv[2 * e], __fmul_rn(v[k][2 * e], r)), __fmul_rn(wv[2 * e + 1], __fmul_rn(v[k][2 * e + 1], r)));
        q[2 * e] = bf_lo(o[e]);
        q[2 * e + 1] = bf_hi(o[e]);
      }
      reinterpret_cast<uint4*>(y + m * n)[c] = make_uint4(o[0], o[1], o[2], o[3]);
    }
    quant8(q, on, c, codes + m * n, scales + m * (n / 32));
  }
}

// ---- act_quant and SwiGLU + act_quant: a thread per 8-element chunk ------------------------------
__global__ void fast_act_quant_kernel(const uint16_t* __restrict__ x, int64_t M, int64_t K, uint8_t* codes, float* scales) {
  pdl_trigger();
  pdl_wait();
  const int64_t k8 = K / 8, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  // whole 32-blocks per 4 lanes: the grid covers M * k8 rounded up to warps; lanes past the end
  // still shuffle (quant8 with on = false)
  const bool on = i < M * k8;
  const int64_t m = on ? i / k8 : 0, c = on ? i % k8 : 0;
  float v[8];
  if (on) unpack8(__ldg(reinterpret_cast<const uint4*>(x + m * K) + c), v);
  quant8(v, on, c, codes + m * K, scales + m * (K / 32));
}

__global__ void fast_swiglu_quant_kernel(const uint16_t* __restrict__ a, const uint16_t* __restrict__ b, int64_t M, int64_t n, float limit,
                                         const float* __restrict__ weight, uint8_t* codes, float* scales) {
  pdl_trigger();
  pdl_wait();
  const int64_t n8 = n / 8, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool on = i < M * n8;
  const int64_t m = on ? i / n8 : 0, c = on ? i % n8 : 0;
  float h[8];
  if (on) {
    float av[8], bv[8];
    unpack8(__ldg(reinterpret_cast<const uint4*>(a + m * n) + c), av);
    unpack8(__ldg(reinterpret_cast<const uint4*>(b + m * n) + c), bv);
    const float wm = weight ? __ldg(weight + m) : 1.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float x = av[e], g = bv[e];
      if (limit > 0.0f) {
        g = fminf(fmaxf(g, -limit), limit);
        x = fminf(x, limit);
      }
      float s = __fmul_rn(__fdiv_rn(x, __fadd_rn(1.0f, expf(-x))), g);
      if (weight) s = __fmul_rn(s, wm);
      h[e] = __uint_as_float(uint32_t(to_bf(s)) << 16);
    }
  }
  quant8(h, on, c, codes + m * n, scales + m * (n / 32));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
unsigned blocks(int64_t threads, int per) { return unsigned((threads + per - 1) / per); }

}  // namespace

void set_fast_pdl(bool on) { g_pdl.store(on, std::memory_order_relaxed); }
bool fast_pdl() { return g_pdl.load(std::memory_order_relaxed); }

size_t FastHcScratch::bytes(int64_t dim) {
  const int64_t chunks = (dim + kPartDims - 1) / kPartDims;
  return size_t(kFastSmallMaxRows * chunks * kSiteNV * 4) + size_t(kFastSmallMaxRows * dim * 2) + size_t(kFastSmallMaxRows * kSiteNV * 4);
}

FastHcScratch FastHcScratch::at(void* mem, int64_t dim) {
  FastHcScratch s;
  const int64_t chunks = (dim + kPartDims - 1) / kPartDims;
  s.partials = static_cast<float*>(mem);
  s.h = reinterpret_cast<uint16_t*>(static_cast<char*>(mem) + kFastSmallMaxRows * chunks * kSiteNV * 4);
  s.tot = reinterpret_cast<float*>(static_cast<char*>(mem) + kFastSmallMaxRows * chunks * kSiteNV * 4 + kFastSmallMaxRows * dim * 2);
  s.dim = dim;
  return s;
}

bool fast_hc_site_ok(int hc, int64_t dim, int64_t T) { return hc >= 1 && hc <= 4 && dim % 32 == 0 && dim > 0 && T <= kFastSmallMaxRows; }

Status fast_hc_site(const uint16_t* X, int64_t T, int hc, int64_t dim, const float* fn, float norm_eps, const float* scale, const float* base,
                    int iters, float hc_eps, const float* pre, int64_t pre_stride, const uint16_t* norm_w, const FastHcScratch& scratch,
                    HcMix* mix, uint16_t* u, const QuantBuf& q, cudaStream_t st, bool defer_sinkhorn, const FastHcPost* post) {
  FB_CHECK(fast_hc_site_ok(hc, dim, T) && scratch.dim == dim && T * dim <= q.capacity) << "fast_hc_site hc=" << hc << " dim=" << dim << " T=" << T;
  FB_CHECK(aligned16(u) && aligned16(norm_w) && aligned16(scratch.h) && (reinterpret_cast<uintptr_t>(q.codes) & 7) == 0 &&
           (reinterpret_cast<uintptr_t>(fn) & 15) == 0)
      << "fast_hc_site alignment";
  if (T == 0) return Status();
  const int64_t chunks = dim / kPartDims;
  const dim3 grid{unsigned(chunks), unsigned(T)}, fgrid{unsigned((dim + kFinishDims - 1) / kFinishDims), unsigned(T)};
  const bool pdl = fast_pdl();
  cudaError_t e1 = cudaSuccess, e2 = cudaSuccess;
  if (post)
    FB_CHECK(post->X == X && post->mix && (post->ye ? post->ys && post->K > 0 && aligned16(post->ye) && aligned16(post->ys) : post->y && aligned16(post->y)))
        << "fast_hc_site: the pending hc_post is of another X or lacks its y";
  const FastHcPost no_post{};
  auto go = [&](auto partial, auto partial_post, auto finish) {
    e1 = post ? launch_pdl(pdl, partial_post, grid, dim3(kSiteThreads), 0, st, X, dim, fn, pre, pre_stride, scratch.partials, scratch.h, *post)
              : launch_pdl(pdl, partial, grid, dim3(kSiteThreads), 0, st, X, dim, fn, pre, pre_stride, scratch.partials, scratch.h, no_post);
    if (e1 == cudaSuccess)
      e2 = launch_pdl(pdl, finish, fgrid, dim3(kFinishThreads), 0, st, dim, chunks, norm_eps, scale, base, iters, hc_eps, norm_w, scratch.partials, scratch.h, mix,
                      u, q.codes, q.scales, defer_sinkhorn ? scratch.tot : nullptr);
  };
  switch (hc) {
    case 1: go(fast_hc_partial_kernel<1, false>, fast_hc_partial_kernel<1, true>, fast_hc_finish_kernel<1>); break;
    case 2: go(fast_hc_partial_kernel<2, false>, fast_hc_partial_kernel<2, true>, fast_hc_finish_kernel<2>); break;
    case 3: go(fast_hc_partial_kernel<3, false>, fast_hc_partial_kernel<3, true>, fast_hc_finish_kernel<3>); break;
    default: go(fast_hc_partial_kernel<4, false>, fast_hc_partial_kernel<4, true>, fast_hc_finish_kernel<4>); break;
  }
  FB_CUDA_TRY(e1);
  FB_CUDA_LAUNCHED("fast_hc_partial_kernel");
  FB_CUDA_TRY(e2);
  FB_CUDA_LAUNCHED("fast_hc_finish_kernel");
  return Status();
}

Status fast_hc_sinkhorn(const FastHcScratch& scratch, int64_t T, int hc, float norm_eps, const float* scale, const float* base, int iters,
                        float hc_eps, HcMix* mix, cudaStream_t st) {
  FB_CHECK(fast_hc_site_ok(hc, scratch.dim, T)) << "fast_hc_sinkhorn hc=" << hc << " T=" << T;
  if (T == 0) return Status();
  const dim3 grid(blocks(T, 64)), block(64);
  switch (hc) {
    case 1: fast_hc_sinkhorn_kernel<1><<<grid, block, 0, st>>>(T, scratch.dim, norm_eps, scale, base, iters, hc_eps, scratch.tot, mix); break;
    case 2: fast_hc_sinkhorn_kernel<2><<<grid, block, 0, st>>>(T, scratch.dim, norm_eps, scale, base, iters, hc_eps, scratch.tot, mix); break;
    case 3: fast_hc_sinkhorn_kernel<3><<<grid, block, 0, st>>>(T, scratch.dim, norm_eps, scale, base, iters, hc_eps, scratch.tot, mix); break;
    default: fast_hc_sinkhorn_kernel<4><<<grid, block, 0, st>>>(T, scratch.dim, norm_eps, scale, base, iters, hc_eps, scratch.tot, mix); break;
  }
  FB_CUDA_LAUNCHED("fast_hc_sinkhorn_kernel");
  return Status();
}

Status fast_hc_post(const uint16_t* y, uint16_t* X, int64_t T, int hc, int64_t dim, const HcMix* mix, float* pre_out, cudaStream_t st) {
  FB_CHECK(hc >= 1 && hc <= 4 && dim % 8 == 0 && aligned16(y) && aligned16(X)) << "fast_hc_post hc=" << hc << " dim=" << dim;
  if (T == 0) return Status();
  const dim3 grid(blocks(T * (dim / 8), 128));
  const bool pdl = fast_pdl();
  cudaError_t e = cudaSuccess;
  auto go = [&](auto kernel) { e = launch_pdl(pdl, kernel, grid, dim3(128), 0, st, y, X, T, dim, mix, pre_out); };
  switch (hc) {
    case 1: go(fast_hc_post_kernel<1>); break;
    case 2: go(fast_hc_post_kernel<2>); break;
    case 3: go(fast_hc_post_kernel<3>); break;
    default: go(fast_hc_post_kernel<4>); break;
  }
  FB_CUDA_TRY(e);
  FB_CUDA_LAUNCHED("fast_hc_post_kernel");
  return Status();
}

Status fast_norm_quant(const uint16_t* x, int64_t M, int64_t n, const uint16_t* w, float eps, uint16_t* y, const QuantBuf& q, cudaStream_t st) {
  FB_CHECK(n % 32 == 0 && n <= int64_t(kRowMaxChunks) * kRowThreads * 8 && M * n <= q.capacity && aligned16(x) && aligned16(w) && aligned16(y) &&
           (reinterpret_cast<uintptr_t>(q.codes) & 7) == 0)
      << "fast_norm_quant n=" << n;
  if (M == 0) return Status();
  return launch_op_pdl("fast_norm_quant_kernel", fast_pdl(), fast_norm_quant_kernel, dim3(unsigned(M)), dim3(kRowThreads), 0, st, x, n, w, eps, y,
                       q.codes, q.scales);
}

Status fast_act_quant(const uint16_t* x, int64_t M, int64_t K, const QuantBuf& q, cudaStream_t st) {
  FB_CHECK(K % 32 == 0 && M * K <= q.capacity && aligned16(x) && (reinterpret_cast<uintptr_t>(q.codes) & 7) == 0) << "fast_act_quant K=" << K;
  if (M == 0) return Status();
  return launch_op_pdl("fast_act_quant_kernel", fast_pdl(), fast_act_quant_kernel, dim3(blocks(M * (K / 8), 128)), dim3(128), 0, st, x, M, K, q.codes,
                       q.scales);
}

Status fast_swiglu_quant(const uint16_t* a, const uint16_t* b, int64_t M, int64_t n, float limit, const float* weight, const QuantBuf& q,
                         cudaStream_t st) {
  FB_CHECK(n % 32 == 0 && M * n <= q.capacity && aligned16(a) && aligned16(b) && (reinterpret_cast<uintptr_t>(q.codes) & 7) == 0)
      << "fast_swiglu_quant n=" << n;
  if (M == 0) return Status();
  FB_CUDA_TRY(
      launch_pdl(fast_pdl(), fast_swiglu_quant_kernel, dim3(blocks(M * (n / 8), 128)), dim3(128), 0, st, a, b, M, n, limit, weight, q.codes, q.scales));
  FB_CUDA_LAUNCHED("fast_swiglu_quant_kernel");
  return Status();
}

}  // namespace fb::cuda
