// RMSNorm, RoPE, mHC (mixes + Sinkhorn, collapse, expand), embedding and row plumbing of the
// CUDA executor. Mirrors cpu/ops.cpp rms_norm / apply_rope / hc_* and the row loops of
// cpu/executor.cpp; lanes32 order for every long sum, per-element formulas copied verbatim.
#include "base/check.h"
#include "cuda/device.h"
#include "cuda/numerics.cuh"
#include "cuda/fast_small.h"
#include "cuda/pdl.cuh"
#include "cuda/ops.h"
#include "cuda/launch.cuh"

namespace fb::cuda {

using namespace dev;

namespace {

inline unsigned blocks_for(int64_t n, int per) { return unsigned((n + per - 1) / per); }

__global__ void rms_norm_kernel(const uint16_t* x, int64_t M, int64_t n, const uint16_t* w, float eps, uint16_t* y) {
  const int64_t m = int64_t(blockIdx.x) * 4 + threadIdx.x / 32;
  if (m >= M) return;
  const uint16_t* xr = x + m * n;
  const float ss = warp_lanes32(n, [&](int64_t i) { return fm::mul(bf(xr[i]), bf(xr[i])); });
  const float r = fm::rsqrt(fm::add(fm::div(ss, float(n)), eps));
  for (int64_t i = threadIdx.x & 31; i < n; i += 32) y[m * n + i] = to_bf(fm::mul(bf(w[i]), fm::mul(bf(xr[i]), r)));
}

// Few rows (decode): a block per row. The row is staged in shared memory as f32 (coalesced), warp
// 0 runs the 32 lane-sequential chains of the lanes32 sum over it, the whole block writes y.
constexpr int kNormBlockThreads = 256;
constexpr int64_t kNormBlockMaxN = 12288;  // 48 KB of f32
constexpr int64_t kNormBlockMaxRows = 256;
__global__ void __launch_bounds__(kNormBlockThreads) rms_norm_block_kernel(const uint16_t* x, int64_t n, const uint16_t* w, float eps, uint16_t* y) {
  pdl_trigger();  // PDL (pdl.cuh): plain stream order unless launched with the attribute
  pdl_wait();
  extern __shared__ __align__(16) float xs[];
  __shared__ float s_r;
  const int64_t m = blockIdx.x;
  const uint16_t* xr = x + m * n;
  uint16_t* yr = y + m * n;
  // 16-byte loads, several in flight per thread (a one-row norm is latency-bound otherwise).
  const bool vec = (n & 7) == 0 && ((reinterpret_cast<uintptr_t>(xr) | reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(yr)) & 15) == 0;
  const int tid = int(threadIdx.x), nthr = int(blockDim.x);
  if (vec) {
    const int n8 = int(n / 8);
    for (int c0 = tid; c0 < n8; c0 += 4 * nthr) {
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (c0 + u * nthr < n8) v[u] = __ldg(reinterpret_cast<const uint4*>(xr) + c0 + u * nthr);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int c = c0 + u * nthr;
        if (c >= n8) continue;
        const uint32_t q[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
        float4* d = reinterpret_cast<float4*>(xs + int64_t(c) * 8);
        d[0] = make_float4(__uint_as_float(q[0] << 16), __uint_as_float(q[0] & 0xFFFF0000u), __uint_as_float(q[1] << 16),
                           __uint_as_float(q[1] & 0xFFFF0000u));
        d[1] = make_float4(__uint_as_float(q[2] << 16), __uint_as_float(q[2] & 0xFFFF0000u), __uint_as_float(q[3] << 16),
                           __uint_as_float(q[3] & 0xFFFF0000u));
      }
    }
  } else {
    for (int64_t i = tid; i < n; i += nthr) xs[i] = bf(xr[i]);
  }
  __syncthreads();
  if (tid < 32) {
    const float ss = warp_lanes32_smem(xs, n, [](float v) { return fm::mul(v, v); });
    if (tid == 0) s_r = fm::rsqrt(fm::add(fm::div(ss, float(n)), eps));
  }
  __syncthreads();
  const float r = s_r;
  if (vec) {
    const int n8 = int(n / 8);
    for (int c0 = tid; c0 < n8; c0 += 4 * nthr) {
      uint4 wv[4];
#pragma unroll
      for (int u = 0; u < 4; ++u)
        if (c0 + u * nthr < n8) wv[u] = __ldg(reinterpret_cast<const uint4*>(w) + c0 + u * nthr);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int c = c0 + u * nthr;
        if (c >= n8) continue;
        const uint32_t q[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
        uint32_t o[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float lo = fm::mul(__uint_as_float(q[e] << 16), fm::mul(xs[int64_t(c) * 8 + 2 * e], r));
          const float hi = fm::mul(__uint_as_float(q[e] & 0xFFFF0000u), fm::mul(xs[int64_t(c) * 8 + 2 * e + 1], r));
          o[e] = uint32_t(to_bf(lo)) | uint32_t(to_bf(hi)) << 16;
        }
        reinterpret_cast<uint4*>(yr)[c] = make_uint4(o[0], o[1], o[2], o[3]);
      }
    }
  } else {
    for (int64_t i = tid; i < n; i += nthr) yr[i] = to_bf(fm::mul(bf(w[i]), fm::mul(xs[i], r)));
  }
}

// hc_pre + rms_norm + act_quant of one row per block, fused (the attention/FFN input u of a
// sublayer): h[d] = bf16(sum_a pre[a] X_a[d]) (a ascending, as hc_pre_kernel), staged in shared
// memory as f32; the lanes32 sum of squares in warp 0; y = bf16(w * (h * r)); then each 32-block
// of y is quantised as act_quant_warp_kernel does (amax: smax from +0 over the block, any order;
// scale, codes). Threads own 8-element chunks; the 4 chunks of a 32-block sit in 4 adjacent
// lanes, whose amaxes combine by shuffles. Every value is the unfused kernels' value.
__global__ void __launch_bounds__(kNormBlockThreads) hc_pre_norm_quant_kernel(const uint16_t* x, int hc, int64_t dim, const float* pre,
                                                                             int64_t pre_stride, const uint16_t* w, float eps, uint16_t* y,
                                                                             uint8_t* codes, float* scales) {
  extern __shared__ __align__(16) float xs[];
  __shared__ float s_r;
  __shared__ float s_pre[16];
  const int64_t t = blockIdx.x;
  const int tid = int(threadIdx.x), nthr = int(blockDim.x);
  if (tid < hc) s_pre[tid] = pre[t * pre_stride + tid];
  __syncthreads();
  const uint16_t* xr = x + t * hc * dim;
  const int n8 = int(dim / 8);
  for (int c = tid; c < n8; c += nthr) {
    float acc[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
    for (int a = 0; a < hc; ++a) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(xr + a * dim) + c);
      const uint32_t q[4] = {v.x, v.y, v.z, v.w};
      const float pa = s_pre[a];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[2 * e] = fm::add(acc[2 * e], fm::mul(pa, __uint_as_float(q[e] << 16)));
        acc[2 * e + 1] = fm::add(acc[2 * e + 1], fm::mul(pa, __uint_as_float(q[e] & 0xFFFF0000u)));
      }
    }
    float4* d = reinterpret_cast<float4*>(xs + int64_t(c) * 8);
    d[0] = make_float4(bf(to_bf(acc[0])), bf(to_bf(acc[1])), bf(to_bf(acc[2])), bf(to_bf(acc[3])));
    d[1] = make_float4(bf(to_bf(acc[4])), bf(to_bf(acc[5])), bf(to_bf(acc[6])), bf(to_bf(acc[7])));
  }
  __syncthreads();
  if (tid < 32) {
    const float ss = warp_lanes32_smem(xs, dim, [](float v) { return fm::mul(v, v); });
    if (tid == 0) s_r = fm::rsqrt(fm::add(fm::div(ss, float(dim)), eps));
  }
  __syncthreads();
  const float r = s_r;
  uint16_t* yr = y + t * dim;
  const int64_t KB = dim / 32;
  // Every lane of a warp runs the same number of passes (the shuffles need the whole warp).
  for (int c0 = 0; c0 < n8; c0 += nthr) {
    const int c = c0 + tid;
    const bool on = c < n8;
    float v[8];
    float amax = 0.0f;
    if (on) {
      const uint4 wv = __ldg(reinterpret_cast<const uint4*>(w) + c);
      const uint32_t q[4] = {wv.x, wv.y, wv.z, wv.w};
      uint32_t o[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint16_t lo = to_bf(fm::mul(__uint_as_float(q[e] << 16), fm::mul(xs[int64_t(c) * 8 + 2 * e], r)));
        const uint16_t hi = to_bf(fm::mul(__uint_as_float(q[e] & 0xFFFF0000u), fm::mul(xs[int64_t(c) * 8 + 2 * e + 1], r)));
        o[e] = uint32_t(lo) | uint32_t(hi) << 16;
        v[2 * e] = bf(lo);
        v[2 * e + 1] = bf(hi);
      }
      reinterpret_cast<uint4*>(yr)[c] = make_uint4(o[0], o[1], o[2], o[3]);
#pragma unroll
      for (int e = 0; e < 8; ++e) amax = smax(amax, fabsf(v[e]));
    }
    amax = smax(amax, __shfl_xor_sync(kFull, amax, 1));
    amax = smax(amax, __shfl_xor_sync(kFull, amax, 2));
    if (on) {
      const float sc = fp8_block_scale(amax);
      const int64_t b = c / 4;
      if ((c & 3) == 0) scales[t * KB + b] = sc;
      uint32_t lo = 0, hi = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        lo |= uint32_t(e4m3_code(smin(smax(fm::div(v[e], sc), -448.0f), 448.0f))) << (8 * e);
        hi |= uint32_t(e4m3_code(smin(smax(fm::div(v[4 + e], sc), -448.0f), 448.0f))) << (8 * e);
      }
      *reinterpret_cast<uint2*>(codes + t * dim + int64_t(c) * 8) = make_uint2(lo, hi);
    }
  }
}

__global__ void rope_kernel(uint16_t* x, int64_t M, int heads, int64_t width, int half, const int64_t* pos, const float* cos_t,
                            const float* sin_t, bool inverse) {
  pdl_trigger();  // PDL (pdl.cuh): plain stream order unless launched with the attribute
  pdl_wait();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M * heads * half) return;
  const int64_t m = i / (int64_t(heads) * half);
  const int h = int((i / half) % heads), k = int(i % half);
  uint16_t* r = x + (m * heads + h) * width + (width - 2 * half);
  const float c = cos_t[pos[m] * half + k], s = sin_t[pos[m] * half + k];
  const float a = bf(r[2 * k]), b = bf(r[2 * k + 1]);
  if (!inverse) {
    r[2 * k] = to_bf(fm::add(fm::mul(a, c), -fm::mul(b, s)));
    r[2 * k + 1] = to_bf(fm::add(fm::mul(a, s), fm::mul(b, c)));
  } else {
    r[2 * k] = to_bf(fm::add(fm::mul(a, c), fm::mul(b, s)));
    r[2 * k + 1] = to_bf(fm::add(fm::mul(b, c), -fm::mul(a, s)));
  }
}

// model::hc_split_sinkhorn (the shared FB_HD code), one thread per row.
__device__ void split_sinkhorn(const float* m, int hc, const float* sc, const float* base, int iters, float eps, HcMix* out) {
  model::hc_split_sinkhorn(m, hc, sc, base, iters, eps, out);
}

// Block per row, 8 warps: task 0 = sum of squares, task 1 + j = raw mix j (cpu::hc_mixes_raw).
__global__ void hc_mixes_kernel(const uint16_t* x, int hc, int64_t dim, const float* fn, float norm_eps, const float* scale, const float* base,
                                int iters, float eps, HcMix* out) {
  __shared__ float dots[1 + 18 * 16];
  const int64_t t = blockIdx.x, n = int64_t(hc) * dim;
  const int n_mix = (2 + hc) * hc, warp = int(threadIdx.x / 32);
  const uint16_t* xr = x + t * n;
  for (int task = warp; task < 1 + n_mix; task += int(blockDim.x / 32)) {
    float v;
    if (task == 0) {
      v = warp_lanes32(n, [&](int64_t c) { return fm::mul(bf(xr[c]), bf(xr[c])); });
    } else {
      const float* f = fn + int64_t(task - 1) * n;
      v = warp_lanes32(n, [&](int64_t c) { return fm::mul(f[c], bf(xr[c])); });
    }
    if ((threadIdx.x & 31) == 0) dots[task] = v;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  const float rho = fm::rsqrt(fm::add(fm::div(dots[0], float(n)), norm_eps));
  float m[18 * 16];
  for (int j = 0; j < n_mix; ++j) m[j] = fm::mul(dots[1 + j], rho);
  HcMix mix;
  split_sinkhorn(m, hc, scale, base, iters, eps, &mix);
  out[t] = mix;
}

// hc_mixes for any T, spread out: block (row t, task) with task 0 = sum of squares, 1 + j = raw
// mix j. The block forms the n products in shared memory (all threads, 16-byte loads), warp 0
// sums them in the lanes32 order; the raw value goes to float slot `task` of out[t] (scratch,
// overwritten by hc_sinkhorn_kernel). 1 + n_mix <= 288 floats of HcMix.
constexpr int kHcDotThreads = 512;
__global__ void __launch_bounds__(kHcDotThreads) hc_dots_kernel(const uint16_t* x, int64_t n, int n_task, const float* fn, HcMix* out) {
  extern __shared__ __align__(16) float prod[];
  const int64_t t = blockIdx.x / n_task;
  const int task = int(blockIdx.x % n_task);
  const uint16_t* xr = x + t * n;
  const float* f = task == 0 ? nullptr : fn + int64_t(task - 1) * n;
  const bool vec = (n & 3) == 0 && (reinterpret_cast<uintptr_t>(xr) & 7) == 0 && (!f || (reinterpret_cast<uintptr_t>(f) & 15) == 0);
  if (vec) {
    const int64_t n4 = n / 4;
#pragma unroll 4
    for (int64_t c = threadIdx.x; c < n4; c += blockDim.x) {
      const uint2 xv = *reinterpret_cast<const uint2*>(xr + 4 * c);
      const float x0 = bf(uint16_t(xv.x)), x1 = bf(uint16_t(xv.x >> 16)), x2 = bf(uint16_t(xv.y)), x3 = bf(uint16_t(xv.y >> 16));
      float4 r;
      if (!f) {
        r = make_float4(fm::mul(x0, x0), fm::mul(x1, x1), fm::mul(x2, x2), fm::mul(x3, x3));
      } else {
        const float4 fv = *reinterpret_cast<const float4*>(f + 4 * c);
        r = make_float4(fm::mul(fv.x, x0), fm::mul(fv.y, x1), fm::mul(fv.z, x2), fm::mul(fv.w, x3));
      }
      *reinterpret_cast<float4*>(prod + 4 * c) = r;
    }
  } else {
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) prod[c] = f ? fm::mul(f[c], bf(xr[c])) : fm::mul(bf(xr[c]), bf(xr[c]));
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const float v = warp_lanes32_smem(prod, n, [](float p) { return p; });
    if (threadIdx.x == 0) reinterpret_cast<float*>(out + t)[task] = v;
  }
}

// model::hc_split_sinkhorn on one warp per row, from the raw dots hc_dots_kernel left in out[t].
// Every element of comb is owned by one lane; each lane recomputes the row/column sums and the
// row max it needs in the CPU's order (same values as the serial loop), so no arithmetic moved.
__global__ void hc_sinkhorn_kernel(HcMix* out, int hc, int64_t n, float norm_eps, const float* sc, const float* base, int iters, float eps) {
  __shared__ float m[18 * 16];
  __shared__ float C[16 * 16], E[16 * 16];
  const int lane = int(threadIdx.x);
  const int n_mix = (2 + hc) * hc, hh = hc * hc;
  float* raw = reinterpret_cast<float*>(out + blockIdx.x);
  const float rho = fm::rsqrt(fm::add(fm::div(raw[0], float(n)), norm_eps));
  for (int j = lane; j < n_mix; j += 32) m[j] = fm::mul(raw[1 + j], rho);
  __syncwarp();
  for (int e = lane; e < hh; e += 32) C[e] = fm::add(fm::mul(m[2 * hc + e], sc[2]), base[2 * hc + e]);
  __syncwarp();
  for (int e = lane; e < hh; e += 32) {
    const int a = e / hc;
    float mx = -INFINITY;
    for (int b = 0; b < hc; ++b) mx = smax(mx, C[a * hc + b]);
    E[e] = fm::exp(fm::add(C[e], -mx));
  }
  __syncwarp();
  for (int e = lane; e < hh; e += 32) {
    const int a = e / hc;
    float sum = 0.0f;
    for (int b = 0; b < hc; ++b) sum = fm::add(sum, E[a * hc + b]);
    C[e] = fm::add(fm::div(E[e], sum), eps);
  }
  __syncwarp();
  // col_norm, then (row_norm, col_norm) x (iters - 1); E holds the new values between the
  // reading and the writing half of each normalisation.
  const int n_norm = iters > 1 ? 2 * iters - 1 : 1;
  for (int it = 0; it < n_norm; ++it) {
    const bool col = (it & 1) == 0;
    for (int e = lane; e < hh; e += 32) {
      const int a = e / hc, b = e % hc;
      float s = 0.0f;
      if (col) {
        for (int a2 = 0; a2 < hc; ++a2) s = fm::add(s, C[a2 * hc + b]);
      } else {
        for (int b2 = 0; b2 < hc; ++b2) s = fm::add(s, C[a * hc + b2]);
      }
      E[e] = fm::div(C[e], fm::add(s, eps));
    }
    __syncwarp();
    for (int e = lane; e < hh; e += 32) C[e] = E[e];
    __syncwarp();
  }
  // All raw reads happened before the first __syncwarp; now the struct is overwritten whole.
  HcMix* o = out + blockIdx.x;
  for (int i = lane; i < 16; i += 32) {
    o->pre[i] = i < hc ? fm::add(fm::sigmoid(fm::add(fm::mul(m[i], sc[0]), base[i])), eps) : 0.0f;
    o->post[i] = i < hc ? fm::mul(2.0f, fm::sigmoid(fm::add(fm::mul(m[hc + i], sc[1]), base[hc + i]))) : 0.0f;
  }
  for (int e = lane; e < 256; e += 32) o->comb[e] = e < hh ? C[e] : 0.0f;
}

// The same for hc <= 4 ((2 + hc) * hc <= 32 mixes) with everything in registers: lane j holds mix
// j and, for j < hc*hc, comb element j; the row/column sums and the row max are gathered with
// shuffles in the CPU's order (same operations, same order, same bits as hc_sinkhorn_kernel).
__global__ void hc_sinkhorn_reg_kernel(HcMix* out, int hc, int64_t n, float norm_eps, const float* sc, const float* base, int iters, float eps) {
  const int lane = int(threadIdx.x);
  const int n_mix = (2 + hc) * hc, hh = hc * hc;
  const float* raw = reinterpret_cast<const float*>(out + blockIdx.x);
  const float rho = fm::rsqrt(fm::add(fm::div(raw[0], float(n)), norm_eps));
  const float mj = lane < n_mix ? fm::mul(raw[1 + lane], rho) : 0.0f;
  const float sc0 = sc[0], sc1 = sc[1], sc2 = sc[2];
  const int a = lane / hc, b = lane % hc;  // comb element (source a, destination b) for lane < hh
  const float m_comb = __shfl_sync(kFull, mj, (2 * hc + lane) & 31);
  const float m_post = __shfl_sync(kFull, mj, (hc + lane) & 31);
  float C = lane < hh ? fm::add(fm::mul(m_comb, sc2), base[2 * hc + lane]) : 0.0f;
  float mx = -INFINITY;
  for (int b2 = 0; b2 < hc; ++b2) mx = smax(mx, __shfl_sync(kFull, C, (a * hc + b2) & 31));
  const float E = fm::exp(fm::add(C, -mx));
  float sum = 0.0f;
  for (int b2 = 0; b2 < hc; ++b2) sum = fm::add(sum, __shfl_sync(kFull, E, (a * hc + b2) & 31));
  C = fm::add(fm::div(E, sum), eps);
  const int n_norm = iters > 1 ? 2 * iters - 1 : 1;
  for (int it = 0; it < n_norm; ++it) {
    float s = 0.0f;
    if ((it & 1) == 0) {
      for (int a2 = 0; a2 < hc; ++a2) s = fm::add(s, __shfl_sync(kFull, C, (a2 * hc + b) & 31));
    } else {
      for (int b2 = 0; b2 < hc; ++b2) s = fm::add(s, __shfl_sync(kFull, C, (a * hc + b2) & 31));
    }
    C = fm::div(C, fm::add(s, eps));
  }
  __syncwarp();  // every raw read is done; the struct is now overwritten whole
  HcMix* o = out + blockIdx.x;
  if (lane < 16) {
    o->pre[lane] = lane < hc ? fm::add(fm::sigmoid(fm::add(fm::mul(mj, sc0), base[lane])), eps) : 0.0f;
    o->post[lane] = lane < hc ? fm::mul(2.0f, fm::sigmoid(fm::add(fm::mul(m_post, sc1), base[hc + lane]))) : 0.0f;
  }
  for (int e = lane; e < 256; e += 32) o->comb[e] = e < hh ? C : 0.0f;
}

__global__ void hc_pre_kernel(const uint16_t* x, int64_t n, const int32_t* rows, int hc, int64_t dim, const float* pre, int64_t pre_stride,
                              uint16_t* y) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * dim) return;
  const int64_t r = i / dim, d = i % dim, t = rows ? rows[r] : r;
  const uint16_t* xr = x + t * hc * dim;
  const float* p = pre + t * pre_stride;
  float s = 0.0f;
  for (int a = 0; a < hc; ++a) s = fm::add(s, fm::mul(p[a], bf(xr[a * dim + d])));
  y[i] = to_bf(s);
}

__global__ void hc_post_kernel(const uint16_t* y, const uint16_t* x, int64_t T, int hc, int64_t dim, const HcMix* mix, uint16_t* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * hc * dim) return;
  const int64_t t = i / (hc * dim), b = (i / dim) % hc, d = i % dim;
  const HcMix& mx = mix[t];
  const uint16_t* xr = x + t * hc * dim;
  float s = 0.0f;
  for (int a = 0; a < hc; ++a) s = fm::add(s, fm::mul(mx.comb[a * hc + b], bf(xr[a * dim + d])));
  out[i] = to_bf(fm::add(fm::mul(mx.post[b], bf(y[t * dim + d])), s));
}

// hc_post_kernel by 8 dims a thread (prefill chunks: tens of thousands of rows): the row's HC
// streams of x and y read as 16-byte vectors once, the HC outputs of those 8 dims written as
// 16-byte vectors; a row per blockIdx.y (no 64-bit division per element). Every output is the
// same operations in the same order as hc_post_kernel's: the same bits.
template <int HC>
__global__ void hc_post_vec_kernel(const uint16_t* __restrict__ y, const uint16_t* __restrict__ x, int64_t dim, const HcMix* __restrict__ mix,
                                   uint16_t* __restrict__ out) {
  const int64_t t = blockIdx.y;
  const int64_t d0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (d0 >= dim) return;
  const HcMix& mx = mix[t];
  const uint16_t* xr = x + t * HC * dim + d0;
  uint4 xv[HC];
#pragma unroll
  for (int a = 0; a < HC; ++a) xv[a] = __ldg(reinterpret_cast<const uint4*>(xr + a * dim));
  const uint4 yv = __ldg(reinterpret_cast<const uint4*>(y + t * dim + d0));
  const uint16_t* yh = reinterpret_cast<const uint16_t*>(&yv);
#pragma unroll
  for (int b = 0; b < HC; ++b) {
    uint4 o;
    uint16_t* oh = reinterpret_cast<uint16_t*>(&o);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float s = 0.0f;
#pragma unroll
      for (int a = 0; a < HC; ++a) s = fm::add(s, fm::mul(mx.comb[a * HC + b], bf(reinterpret_cast<const uint16_t*>(&xv[a])[j])));
      oh[j] = to_bf(fm::add(fm::mul(mx.post[b], bf(yh[j])), s));
    }
    reinterpret_cast<uint4*>(out + t * HC * dim + int64_t(b) * dim + d0)[0] = o;
  }
}

__global__ void hc_take_pre_kernel(const HcMix* mix, int64_t T, int hc, float* pre) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < T * hc) pre[i] = mix[i / hc].pre[i % hc];
}

__global__ void embed_rows_kernel(const uint64_t* src, int64_t T, int hc, int64_t D, uint16_t* X, float* pre) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * hc * D) return;
  const int64_t t = i / (hc * D), s = (i / D) % hc, d = i % D;
  X[i] = reinterpret_cast<const uint16_t*>(src[t])[d];
  if (d == 0) pre[t * hc + s] = s == 0 ? 1.0f : 0.0f;
}

__global__ void stream_mean_kernel(const uint16_t* X, int64_t T, int hc, int64_t D, uint16_t* out, int64_t ld) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * D) return;
  const int64_t t = i / D, d = i % D;
  float s = 0.0f;
  for (int a = 0; a < hc; ++a) s = fm::add(s, bf(X[(t * hc + a) * D + d]));
  out[t * ld + d] = to_bf(fm::div(s, float(hc)));
}

__global__ void copy_rows_kernel(const uint64_t* src, const uint64_t* dst, int64_t row_bytes) {
  pdl_trigger();  // PDL (pdl.cuh): plain stream order unless launched with the attribute
  pdl_wait();
  const uint8_t* s = reinterpret_cast<const uint8_t*>(src[blockIdx.x]);
  uint8_t* d = reinterpret_cast<uint8_t*>(dst[blockIdx.x]);
  for (int64_t k = threadIdx.x; k < row_bytes; k += blockDim.x) d[k] = s[k];
}

}  // namespace

Status rms_norm(const uint16_t* x, int64_t M, int64_t n, const uint16_t* w, float eps, uint16_t* y, cudaStream_t st) {
  if (M == 0) return Status();
  if (M <= kNormBlockMaxRows && n <= kNormBlockMaxN) {
    return launch_op_pdl("rms_norm_block_kernel", fast_pdl(), rms_norm_block_kernel, dim3(unsigned(M)), dim3(kNormBlockThreads),
                         size_t(n) * sizeof(float), st, x, n, w, eps, y);
  }
  return launch_op("rms_norm_kernel", rms_norm_kernel, blocks_for(M, 4), 128, 0, st, x, M, n, w, eps, y);
}

Status hc_pre_norm_quant(const uint16_t* x, int64_t T, int hc, int64_t dim, const float* pre, int64_t pre_stride, const uint16_t* w, float eps,
                         uint16_t* tmp, uint16_t* y, const QuantBuf& q, cudaStream_t st) {
  FB_CHECK(dim % 32 == 0 && T * dim <= q.capacity && hc >= 1 && hc <= 16) << "hc_pre_norm_quant dim=" << dim;
  if (T == 0) return Status();
  const bool fused = T <= kNormBlockMaxRows && dim <= kNormBlockMaxN && (reinterpret_cast<uintptr_t>(x) & 15) == 0 &&
                     (reinterpret_cast<uintptr_t>(w) & 15) == 0 && (reinterpret_cast<uintptr_t>(y) & 15) == 0 &&
                     (reinterpret_cast<uintptr_t>(q.codes) & 7) == 0;
  if (!fused) {  // the unfused sequence; tmp [T, dim] holds hc_pre's output
    FB_RETURN_IF_ERROR(hc_pre(x, T, nullptr, hc, dim, pre, pre_stride, tmp, st));
    FB_RETURN_IF_ERROR(rms_norm(tmp, T, dim, w, eps, y, st));
    return act_quant(y, T, dim, q, st);
  }
  return launch_op("hc_pre_norm_quant_kernel", hc_pre_norm_quant_kernel, unsigned(T), kNormBlockThreads, size_t(dim) * sizeof(float), st, x, hc, dim,
                   pre, pre_stride, w, eps, y, q.codes, q.scales);
}

Status rope(uint16_t* x, int64_t M, int heads, int64_t width, int rope_dim, const int64_t* pos, const float* cos_t, const float* sin_t,
            bool inverse, cudaStream_t st) {
  const int half = rope_dim / 2;
  if (M == 0 || half == 0) return Status();
  return launch_op_pdl("rope_kernel", fast_pdl(), rope_kernel, dim3(blocks_for(M * heads * half, 256)), dim3(256), 0, st, x, M, heads, width, half,
                       pos, cos_t, sin_t, inverse);
}

namespace {
// The scaling and Sinkhorn of the mixes whose raw dots (and squares' sum) sit in `out`: the
// register kernel when (2 + hc) x hc mixes fit a warp, the shared-memory one otherwise.
Status hc_sinkhorn(int64_t T, int hc, int64_t n, float norm_eps, const float* scale, const float* base, int iters, float eps, HcMix* out,
                   cudaStream_t st) {
  if ((2 + hc) * hc <= 32) {
    hc_sinkhorn_reg_kernel<<<unsigned(T), 32, 0, st>>>(out, hc, n, norm_eps, scale, base, iters, eps);
    FB_CUDA_LAUNCHED("hc_sinkhorn_reg_kernel");
  } else {
    hc_sinkhorn_kernel<<<unsigned(T), 32, 0, st>>>(out, hc, n, norm_eps, scale, base, iters, eps);
    FB_CUDA_LAUNCHED("hc_sinkhorn_kernel");
  }
  return Status();
}
}  // namespace

Status hc_mixes(const uint16_t* x, int64_t T, int hc, int64_t dim, const float* fn, float norm_eps, const float* scale, const float* base,
                int iters, float eps, HcMix* out, cudaStream_t st) {
  FB_CHECK(hc >= 1 && hc <= 16) << "hc_mult " << hc;
  if (T == 0) return Status();
  const int n_task = 1 + (2 + hc) * hc;
  const int64_t n = int64_t(hc) * dim;
  const size_t smem = size_t(n) * sizeof(float);
  if (n_task <= int(sizeof(HcMix) / sizeof(float)) && smem <= 200 * 1024) {
    FB_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(hc_dots_kernel), smem));
    hc_dots_kernel<<<unsigned(T * n_task), kHcDotThreads, smem, st>>>(x, n, n_task, fn, out);
    FB_CUDA_LAUNCHED("hc_dots_kernel");
    return hc_sinkhorn(T, hc, n, norm_eps, scale, base, iters, eps, out, st);
  }
  hc_mixes_kernel<<<unsigned(T), 256, 0, st>>>(x, hc, dim, fn, norm_eps, scale, base, iters, eps, out);
  FB_CUDA_LAUNCHED("hc_mixes_kernel");
  return Status();
}

namespace {
// raw[1 + j] of row t = dots[t, j] (the mix dots computed elsewhere, tc_hc_mixes).
__global__ void hc_park_dots_kernel(const float* dots, int64_t T, int n_mix, HcMix* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * n_mix) return;
  reinterpret_cast<float*>(out + i / n_mix)[1 + i % n_mix] = dots[i];
}
}  // namespace

Status hc_mixes_with_dots(const uint16_t* x, int64_t T, int hc, int64_t dim, const float* dots, float norm_eps, const float* scale,
                          const float* base, int iters, float eps, HcMix* out, cudaStream_t st) {
  FB_CHECK(hc >= 1 && hc <= 16) << "hc_mult " << hc;
  if (T == 0) return Status();
  const int n_mix = (2 + hc) * hc;
  const int64_t n = int64_t(hc) * dim;
  const size_t smem = size_t(n) * sizeof(float);
  FB_CHECK(smem <= 200 * 1024 && 1 + n_mix <= int(sizeof(HcMix) / sizeof(float))) << "hc mixes n=" << n;
  // The squares' sum exactly as hc_mixes computes it (task 0 of hc_dots_kernel only).
  FB_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(hc_dots_kernel), smem));
  hc_dots_kernel<<<unsigned(T), kHcDotThreads, smem, st>>>(x, n, 1, nullptr, out);
  FB_CUDA_LAUNCHED("hc_dots_kernel");
  hc_park_dots_kernel<<<blocks_for(T * n_mix, 256), 256, 0, st>>>(dots, T, n_mix, out);
  FB_CUDA_LAUNCHED("hc_park_dots_kernel");
  return hc_sinkhorn(T, hc, n, norm_eps, scale, base, iters, eps, out, st);
}

Status hc_pre(const uint16_t* x, int64_t n, const int32_t* rows, int hc, int64_t dim, const float* pre, int64_t pre_stride, uint16_t* y,
              cudaStream_t st) {
  if (n == 0) return Status();
  hc_pre_kernel<<<blocks_for(n * dim, 256), 256, 0, st>>>(x, n, rows, hc, dim, pre, pre_stride, y);
  FB_CUDA_LAUNCHED("hc_pre_kernel");
  return Status();
}

Status hc_post(const uint16_t* y, const uint16_t* x, int64_t T, int hc, int64_t dim, const HcMix* mix, uint16_t* out, cudaStream_t st) {
  if (T == 0) return Status();
  const auto a16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  if (hc == 4 && dim % 8 == 0 && T <= 65535 && a16(y) && a16(x) && a16(out)) {
    hc_post_vec_kernel<4><<<dim3(blocks_for(dim / 8, 128), unsigned(T)), 128, 0, st>>>(y, x, dim, mix, out);
    FB_CUDA_LAUNCHED("hc_post_vec_kernel");
    return Status();
  }
  return launch_op("hc_post_kernel", hc_post_kernel, blocks_for(T * hc * dim, 256), 256, 0, st, y, x, T, hc, dim, mix, out);
}

Status hc_take_pre(const HcMix* mix, int64_t T, int hc, float* pre, cudaStream_t st) {
  if (T == 0) return Status();
  return launch_op("hc_take_pre_kernel", hc_take_pre_kernel, blocks_for(T * hc, 128), 128, 0, st, mix, T, hc, pre);
}

Status embed_rows(const uint64_t* src, int64_t T, int hc, int64_t D, uint16_t* X, float* pre, cudaStream_t st) {
  if (T == 0) return Status();
  return launch_op("embed_rows_kernel", embed_rows_kernel, blocks_for(T * hc * D, 256), 256, 0, st, src, T, hc, D, X, pre);
}

Status stream_mean(const uint16_t* X, int64_t T, int hc, int64_t D, uint16_t* out, int64_t ld, cudaStream_t st) {
  if (T == 0) return Status();
  return launch_op("stream_mean_kernel", stream_mean_kernel, blocks_for(T * D, 256), 256, 0, st, X, T, hc, D, out, ld);
}

Status copy_rows(const uint64_t* src, const uint64_t* dst, int64_t n, int64_t row_bytes, cudaStream_t st) {
  if (n == 0) return Status();
  return launch_op_pdl("copy_rows_kernel", fast_pdl(), copy_rows_kernel, dim3(unsigned(n)), dim3(128), 0, st, src, dst, row_bytes);
}

}  // namespace fb::cuda
