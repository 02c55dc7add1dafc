// Sparse attention with a sink (cpu::sparse_attention) over each row's key list: window rows
// (FP8 compact, from the ring or this step) then the selected compressed entries (FP4 compact),
// dequantised to the bf16 values the CPU builds. One block per (row, head); blocks of 64 keys in
// list order, online softmax with the CPU's exact update sequence.
// Tiled kernel (head_dim <= kTiledMaxD): each 64-key block is dequantised once into shared
// memory (bf16, 16-byte stores, e4m3 through a shared table of e4m3_val), the 64 dots run four
// per warp over the staged tile (lanes32 order, q in shared memory), the running max / exps /
// p-sum stay in the CPU's sequence (warp 0), and the P.V step gives each thread its own output
// dims, summing the tile's column over j sequentially. Only who computes what changed.
#include "base/check.h"
#include "cuda/device.h"
#include "cuda/numerics.cuh"
#include "cuda/ops.h"

namespace fb::cuda {

using namespace dev;

namespace {

constexpr int kThreads = 256;

struct KeyRef {
  const uint8_t* p;  // nullptr = empty entry
  int fp4;           // 0: FP8 row (d codes + d/32 e8m0), 1: FP4 row (d/2 packed + d/16 e4m3)
};

__device__ __forceinline__ float key_val(const KeyRef& k, int d, int64_t i) {
  if (!k.fp4) return round_bf16(fm::mul(e4m3_val(k.p[i]), e8m0_val(k.p[d + i / 32])));
  return round_bf16(fm::mul(e2m1_val(e2m1_code_at(k.p, i)), e4m3_val(k.p[d / 2 + i / 16])));
}

__global__ void sparse_attention_kernel(const uint16_t* q, int n_heads, int d, AttnKeys keys, const float* sinks, float scale, uint16_t* out) {
  extern __shared__ float sm[];
  float* qf = sm;        // [d]
  float* acc = sm + d;   // [d]
  __shared__ KeyRef kr[64];
  __shared__ float z[64], pr[64], pf[64];
  __shared__ float s_m, s_l, s_alpha, s_m2;
  const int64_t t = blockIdx.x / n_heads;
  const int h = int(blockIdx.x % n_heads);
  const uint16_t* qh = q + (t * n_heads + h) * int64_t(d);
  for (int i = threadIdx.x; i < d; i += kThreads) {
    qf[i] = bf(qh[i]);
    acc[i] = 0.0f;
  }
  if (threadIdx.x == 0) {
    s_m = -1e30f;
    s_l = 0.0f;
  }
  const int w0 = keys.win_off[t], n_win = keys.win_off[t + 1] - w0;
  const int n_sel = keys.sel ? keys.sel_count[t] : 0;
  const int n = n_win + n_sel;
  const int64_t comp_bytes = d / 2 + d / 16;
  const int warp = int(threadIdx.x / 32);
  __syncthreads();
  for (int b0 = 0; b0 < n; b0 += 64) {
    const int nb = n - b0 < 64 ? n - b0 : 64;
    if (threadIdx.x < nb) {
      const int e = b0 + int(threadIdx.x);
      KeyRef k{nullptr, 0};
      if (e < n_win) {
        k.p = reinterpret_cast<const uint8_t*>(keys.win[w0 + e]);
      } else {
        const int32_t id = keys.sel[t * keys.sel_ld + (e - n_win)];
        if (id >= 0) k = KeyRef{reinterpret_cast<const uint8_t*>(keys.comp_base[t]) + int64_t(id) * comp_bytes, 1};
      }
      kr[threadIdx.x] = k;
    }
    __syncthreads();
    for (int j = warp; j < nb; j += kThreads / 32) {
      const KeyRef k = kr[j];
      float v = -INFINITY;
      if (k.p) v = fm::mul(warp_lanes32(d, [&](int64_t i) { return fm::mul(qf[i], key_val(k, d, i)); }), scale);
      if ((threadIdx.x & 31) == 0) z[j] = v;
    }
    __syncthreads();
    // The CPU's update sequence; the exps run one per thread, the sums stay sequential in j.
    if (threadIdx.x == 0) {
      float bmax = -INFINITY;
      for (int j = 0; j < nb; ++j)
        if (kr[j].p) bmax = smax(bmax, z[j]);
      const float m2 = smax(s_m, bmax);
      s_alpha = fm::exp(fm::add(s_m, -m2));
      s_m2 = m2;
    }
    __syncthreads();
    if (threadIdx.x < nb) {
      const int j = int(threadIdx.x);
      const float p = kr[j].p ? fm::exp(fm::add(z[j], -s_m2)) : 0.0f;
      pf[j] = p;
      pr[j] = round_bf16(p);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float psum = 0.0f;
      for (int j = 0; j < nb; ++j) psum = fm::add(psum, pf[j]);
      s_l = fm::add(fm::mul(s_l, s_alpha), psum);
      s_m = s_m2;
    }
    __syncthreads();
    const float alpha = s_alpha;
    for (int i = threadIdx.x; i < d; i += kThreads) {
      float s = 0.0f;
      for (int j = 0; j < nb; ++j)
        if (kr[j].p) s = fm::add(s, fm::mul(pr[j], key_val(kr[j], d, i)));
      acc[i] = fm::add(fm::mul(acc[i], alpha), s);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) s_l = fm::add(s_l, fm::exp(fm::add(sinks[h], -s_m)));
  __syncthreads();
  const float l = s_l;
  uint16_t* o = out + (t * n_heads + h) * int64_t(d);
  for (int i = threadIdx.x; i < d; i += kThreads) o[i] = to_bf(fm::div(acc[i], l));
}

constexpr int kTiledThreads = 512;
constexpr int kTiledMaxD = 1024;  // 64 x d bf16 tile + 2 x d f32 <= 136 KB

// Resolves key e of row t (nullptr = empty entry).
__device__ __forceinline__ KeyRef key_ref(const AttnKeys& keys, int64_t t, int w0, int n_win, int64_t comp_bytes, int e) {
  KeyRef k{nullptr, 0};
  if (e < n_win) {
    k.p = reinterpret_cast<const uint8_t*>(keys.win[w0 + e]);
  } else {
    const int32_t id = keys.sel[t * keys.sel_ld + (e - n_win)];
    if (id >= 0) k = KeyRef{reinterpret_cast<const uint8_t*>(keys.comp_base[t]) + int64_t(id) * comp_bytes, 1};
  }
  return k;
}

__global__ void __launch_bounds__(kTiledThreads) sparse_attention_tiled_kernel(const uint16_t* q, int n_heads, int d, AttnKeys keys,
                                                                               const float* sinks, float scale, uint16_t* out) {
  extern __shared__ __align__(16) unsigned char smraw[];
  uint16_t* tile = reinterpret_cast<uint16_t*>(smraw);                          // [64][d] bf16 key values
  float* qf = reinterpret_cast<float*>(smraw + size_t(64) * size_t(d) * 2);     // [d]
  float* acc = qf + d;                                                          // [d]
  __shared__ float lut8[256];
  __shared__ const uint8_t* kp[64];
  __shared__ int kfp4[64];
  __shared__ float z[64], pf[64], pr[64];
  __shared__ unsigned s_valid[2];
  __shared__ float s_m, s_l, s_alpha, s_m2;
  const int tid = int(threadIdx.x), nthr = int(blockDim.x), lane = tid & 31, warp = tid >> 5, nw = nthr >> 5;
  const int64_t t = blockIdx.x / n_heads;
  const int h = int(blockIdx.x % n_heads);
  const uint16_t* qh = q + (t * n_heads + h) * int64_t(d);
  for (int i = tid; i < d; i += nthr) {
    qf[i] = bf(qh[i]);
    acc[i] = 0.0f;
  }
  if (tid < 256) lut8[tid] = e4m3_val(uint8_t(tid));
  if (tid == 0) {
    s_m = -1e30f;
    s_l = 0.0f;
  }
  const int w0 = keys.win_off[t], n_win = keys.win_off[t + 1] - w0;
  const int n_sel = keys.sel ? keys.sel_count[t] : 0;
  const int n = n_win + n_sel;
  const int64_t comp_bytes = d / 2 + d / 16;
  const int cpr = d / 8;  // 8-element chunks per key row
  __syncthreads();
  for (int b0 = 0; b0 < n; b0 += 64) {
    const int nb = n - b0 < 64 ? n - b0 : 64;
    if (tid < 64) {  // warps 0 and 1 whole
      KeyRef k{nullptr, 0};
      if (tid < nb) k = key_ref(keys, t, w0, n_win, comp_bytes, b0 + tid);
      kp[tid] = k.p;
      kfp4[tid] = k.fp4;
      const unsigned bal = __ballot_sync(kFull, k.p != nullptr);
      if (lane == 0) s_valid[warp] = bal;
    }
    __syncthreads();
    // Dequantise the tile: chunk c = (key j, dims i0..i0+7), one 16-byte store each.
    for (int c = tid; c < nb * cpr; c += nthr) {
      const int j = c / cpr, i0 = (c - j * cpr) * 8;
      const uint8_t* p = kp[j];
      uint32_t w[4] = {0u, 0u, 0u, 0u};
      if (p) {
        float v[8];
        if (!kfp4[j]) {
          const float sc = e8m0_val(p[d + i0 / 32]);
          uint8_t cd[8];
          if ((reinterpret_cast<uintptr_t>(p + i0) & 7) == 0) {
            const uint2 u = *reinterpret_cast<const uint2*>(p + i0);
#pragma unroll
            for (int e = 0; e < 4; ++e) cd[e] = uint8_t(u.x >> (8 * e)), cd[4 + e] = uint8_t(u.y >> (8 * e));
          } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) cd[e] = p[i0 + e];
          }
#pragma unroll
          for (int e = 0; e < 8; ++e) v[e] = fm::mul(lut8[cd[e]], sc);
        } else {
          const float sc = lut8[p[d / 2 + i0 / 16]];
          const uint8_t* pk = p + i0 / 2;
          uint32_t u;
          if ((reinterpret_cast<uintptr_t>(pk) & 3) == 0) u = *reinterpret_cast<const uint32_t*>(pk);
          else u = uint32_t(pk[0]) | uint32_t(pk[1]) << 8 | uint32_t(pk[2]) << 16 | uint32_t(pk[3]) << 24;
#pragma unroll
          for (int e = 0; e < 8; ++e) v[e] = fm::mul(e2m1_val(uint8_t((u >> (4 * e)) & 0xF)), sc);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) w[e] = uint32_t(to_bf(v[2 * e])) | uint32_t(to_bf(v[2 * e + 1])) << 16;
      }
      *reinterpret_cast<uint4*>(tile + size_t(j) * d + i0) = make_uint4(w[0], w[1], w[2], w[3]);
    }
    __syncthreads();
    // Dots: keys j0, j0 + nw, j0 + 2 nw, j0 + 3 nw per warp pass, each in the lanes32 order.
    for (int j0 = warp; j0 < nb; j0 += 4 * nw) {
      float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      for (int base = lane * 8; base < d; base += 256) {
        const float4 qa = *reinterpret_cast<const float4*>(qf + base), qb = *reinterpret_cast<const float4*>(qf + base + 4);
        const float qv[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int j = j0 + u * nw;
          if (j < nb) {
            const uint4 kv = *reinterpret_cast<const uint4*>(tile + size_t(j) * d + base);
            const uint32_t kw[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              v[u] = fm::add(v[u], fm::mul(qv[2 * e], __uint_as_float(kw[e] << 16)));
              v[u] = fm::add(v[u], fm::mul(qv[2 * e + 1], __uint_as_float(kw[e] & 0xFFFF0000u)));
            }
          }
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u)
        for (int off = 16; off >= 1; off >>= 1) v[u] = fm::add(v[u], __shfl_xor_sync(kFull, v[u], off));
      if (lane == 0) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int j = j0 + u * nw;
          if (j < nb) z[j] = kp[j] ? fm::mul(v[u], scale) : -INFINITY;
        }
      }
    }
    __syncthreads();
    // The CPU's update sequence (warp 0): max, alpha, exps one per lane, p-sum sequential in j.
    if (warp == 0) {
      const uint64_t valid = uint64_t(s_valid[0]) | uint64_t(s_valid[1]) << 32;
      if (lane == 0) {
        float bmax = -INFINITY;
        for (int j = 0; j < nb; ++j)
          if ((valid >> j) & 1) bmax = smax(bmax, z[j]);
        const float m2 = smax(s_m, bmax);
        s_alpha = fm::exp(fm::add(s_m, -m2));
        s_m2 = m2;
      }
      __syncwarp();
      const float m2 = s_m2;
      for (int j = lane; j < nb; j += 32) {
        const float p = ((valid >> j) & 1) ? fm::exp(fm::add(z[j], -m2)) : 0.0f;
        pf[j] = p;
        pr[j] = round_bf16(p);
      }
      __syncwarp();
      if (lane == 0) {
        float psum = 0.0f;
        for (int j = 0; j < nb; ++j) psum = fm::add(psum, pf[j]);
        s_l = fm::add(fm::mul(s_l, s_alpha), psum);
        s_m = m2;
      }
    }
    __syncthreads();
    {
      const uint64_t valid = uint64_t(s_valid[0]) | uint64_t(s_valid[1]) << 32;
      const float alpha = s_alpha;
      for (int i = tid; i < d; i += nthr) {
        float s = 0.0f;
        const uint16_t* col = tile + i;
#pragma unroll 8
        for (int j = 0; j < nb; ++j)
          if ((valid >> j) & 1) s = fm::add(s, fm::mul(pr[j], bf(col[size_t(j) * d])));
        acc[i] = fm::add(fm::mul(acc[i], alpha), s);
      }
    }
    __syncthreads();
  }
  if (tid == 0) s_l = fm::add(s_l, fm::exp(fm::add(sinks[h], -s_m)));
  __syncthreads();
  const float l = s_l;
  uint16_t* o = out + (t * n_heads + h) * int64_t(d);
  for (int i = tid; i < d; i += nthr) o[i] = to_bf(fm::div(acc[i], l));
}

}  // namespace

Status sparse_attention(const uint16_t* q, int64_t T, int n_heads, int d, const AttnKeys& keys, const float* sinks, float scale, uint16_t* out,
                        cudaStream_t st) {
  FB_CHECK(d % 32 == 0 && keys.win && keys.win_off) << "attention head_dim " << d;
  if (T == 0) return Status();
  if (d <= kTiledMaxD) {
    const size_t smem = size_t(64) * size_t(d) * 2 + size_t(2 * d) * sizeof(float);
    if (smem > 48 * 1024) FB_CUDA_TRY(cudaFuncSetAttribute(sparse_attention_tiled_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    sparse_attention_tiled_kernel<<<unsigned(T * n_heads), kTiledThreads, smem, st>>>(q, n_heads, d, keys, sinks, scale, out);
    FB_CUDA_LAUNCHED("sparse_attention_tiled_kernel");
    return Status();
  }
  const size_t smem = size_t(2 * d) * sizeof(float);
  if (smem > 48 * 1024) FB_CUDA_TRY(cudaFuncSetAttribute(sparse_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  sparse_attention_kernel<<<unsigned(T * n_heads), kThreads, smem, st>>>(q, n_heads, d, keys, sinks, scale, out);
  FB_CUDA_LAUNCHED("sparse_attention_kernel");
  return Status();
}

}  // namespace fb::cuda
