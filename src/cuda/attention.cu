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
#include "cuda/fast_small.h"
#include "cuda/pdl.cuh"
#include "cuda/ops.h"
#include "cuda/launch.cuh"

namespace fb::cuda {

using namespace dev;

namespace {

constexpr int kThreads = 256;

struct KeyRef {
  const uint8_t* p;  // nullptr = empty entry
  int fp4;           // 0: FP8 row (d codes + d/32 e8m0), 1: FP4 row (d/2 packed + d/16 e4m3)
};

// Row t's key list: w0 / n_win its window rows, the count of all its keys returned.
__device__ __forceinline__ int row_keys(const AttnKeys& keys, int64_t t, int& w0, int& n_win) {
  w0 = keys.win_off[t];
  n_win = keys.win_off[t + 1] - w0;
  return n_win + (keys.sel ? keys.sel_count[t] : 0);
}

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

// Head h of row t's query into qf as f32 and acc zeroed, threads [tid, d) by nthr.
__device__ __forceinline__ void stage_query(const uint16_t* q, int64_t t, int h, int n_heads, int d, int tid, int nthr, float* qf, float* acc) {
  const uint16_t* qh = q + (t * n_heads + h) * int64_t(d);
  for (int i = tid; i < d; i += nthr) {
    qf[i] = bf(qh[i]);
    acc[i] = 0.0f;
  }
}

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
  stage_query(q, t, h, n_heads, d, int(threadIdx.x), kThreads, qf, acc);
  if (threadIdx.x == 0) {
    s_m = -1e30f;
    s_l = 0.0f;
  }
  int w0, n_win;
  const int n = row_keys(keys, t, w0, n_win);
  const int64_t comp_bytes = d / 2 + d / 16;
  const int warp = int(threadIdx.x / 32);
  __syncthreads();
  for (int b0 = 0; b0 < n; b0 += 64) {
    const int nb = n - b0 < 64 ? n - b0 : 64;
    if (threadIdx.x < nb) kr[threadIdx.x] = key_ref(keys, t, w0, n_win, comp_bytes, b0 + int(threadIdx.x));
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

// Threads 0..63 (warps 0 and 1 whole) resolve keys b0 .. b0 + nb - 1 of row t; s_valid gets the
// ballot of non-empty entries. The caller synchronises before use.
__device__ __forceinline__ void stage_key_refs(const AttnKeys& keys, int64_t t, int w0, int n_win, int64_t comp_bytes, int b0, int nb,
                                               const uint8_t** kp, int* kfp4, unsigned* s_valid) {
  const int tid = int(threadIdx.x);
  if (tid < 64) {
    KeyRef k{nullptr, 0};
    if (tid < nb) k = key_ref(keys, t, w0, n_win, comp_bytes, b0 + tid);
    kp[tid] = k.p;
    kfp4[tid] = k.fp4;
    const unsigned bal = __ballot_sync(kFull, k.p != nullptr);
    if ((tid & 31) == 0) s_valid[tid >> 5] = bal;
  }
}

// Dequantise nb staged keys into the bf16 tile [64][d]: chunk c = (key j, dims i0..i0+7), one
// 16-byte store each; empty keys become zeros. The caller synchronises before use.
// Chunks [c_begin, c_end) only (a CTA's share of a tile that several CTAs dequantise).
__device__ __forceinline__ void dequant_key_chunks(const uint8_t* const* kp, const int* kfp4, int d, const float* lut8, uint16_t* tile,
                                                   int c_begin, int total) {
  const int tid = int(threadIdx.x), nthr = int(blockDim.x), cpr = d / 8;
  constexpr int kBatch = 4;  // chunks whose loads a thread issues before converting the first
  for (int c0 = c_begin + tid; c0 < total; c0 += kBatch * nthr) {
    uint2 raw[kBatch];
    uint8_t sraw[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int c = c0 + u * nthr;
      raw[u] = make_uint2(0u, 0u);
      sraw[u] = 0;
      if (c >= total) continue;
      const int j = c / cpr, i0 = (c - j * cpr) * 8;
      const uint8_t* p = kp[j];
      if (!p) continue;
      if (!kfp4[j]) {  // 8 e4m3 codes + the block's e8m0
        if ((reinterpret_cast<uintptr_t>(p + i0) & 7) == 0) {
          raw[u] = __ldg(reinterpret_cast<const uint2*>(p + i0));
        } else {
          uint32_t lo = 0, hi = 0;
#pragma unroll
          for (int e = 0; e < 4; ++e) lo |= uint32_t(p[i0 + e]) << (8 * e), hi |= uint32_t(p[i0 + 4 + e]) << (8 * e);
          raw[u] = make_uint2(lo, hi);
        }
        sraw[u] = p[d + i0 / 32];
      } else {  // 8 e2m1 nibbles + the 16-block's e4m3 scale
        const uint8_t* pk = p + i0 / 2;
        uint32_t v;
        if ((reinterpret_cast<uintptr_t>(pk) & 3) == 0) v = __ldg(reinterpret_cast<const uint32_t*>(pk));
        else v = uint32_t(pk[0]) | uint32_t(pk[1]) << 8 | uint32_t(pk[2]) << 16 | uint32_t(pk[3]) << 24;
        raw[u] = make_uint2(v, 0u);
        sraw[u] = p[d / 2 + i0 / 16];
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int c = c0 + u * nthr;
      if (c >= total) continue;
      const int j = c / cpr, i0 = (c - j * cpr) * 8;
      uint32_t w[4] = {0u, 0u, 0u, 0u};
      if (kp[j]) {
        float v[8];
        if (!kfp4[j]) {
          const float sc = e8m0_val(sraw[u]);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            v[e] = fm::mul(lut8[(raw[u].x >> (8 * e)) & 0xFF], sc);
            v[4 + e] = fm::mul(lut8[(raw[u].y >> (8 * e)) & 0xFF], sc);
          }
        } else {
          const float sc = lut8[sraw[u]];
#pragma unroll
          for (int e = 0; e < 8; ++e) v[e] = fm::mul(e2m1_val(uint8_t((raw[u].x >> (4 * e)) & 0xF)), sc);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) w[e] = uint32_t(to_bf(v[2 * e])) | uint32_t(to_bf(v[2 * e + 1])) << 16;
      }
      *reinterpret_cast<uint4*>(tile + size_t(j) * d + i0) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}
__device__ __forceinline__ void dequant_key_tile(const uint8_t* const* kp, const int* kfp4, int nb, int d, const float* lut8, uint16_t* tile) {
  dequant_key_chunks(kp, kfp4, d, lut8, tile, 0, nb * (d / 8));
}


// z[j] = scale * (q . key j) in the lanes32 order for the nb keys of the tile (-inf for empty
// keys): keys j0, j0 + nw, j0 + 2 nw, j0 + 3 nw per warp pass sharing the q loads.
__device__ __forceinline__ void tile_dots(const float* qf, const uint16_t* tile, const uint8_t* const* kp, int nb, int d, float scale, float* z) {
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5, nw = int(blockDim.x) >> 5;
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
  const int tid = int(threadIdx.x), nthr = int(blockDim.x), lane = tid & 31, warp = tid >> 5;
  const int64_t t = blockIdx.x / n_heads;
  const int h = int(blockIdx.x % n_heads);
  stage_query(q, t, h, n_heads, d, tid, nthr, qf, acc);
  if (tid < 256) lut8[tid] = e4m3_val(uint8_t(tid));
  if (tid == 0) {
    s_m = -1e30f;
    s_l = 0.0f;
  }
  int w0, n_win;
  const int n = row_keys(keys, t, w0, n_win);
  const int64_t comp_bytes = d / 2 + d / 16;
  __syncthreads();
  for (int b0 = 0; b0 < n; b0 += 64) {
    const int nb = n - b0 < 64 ? n - b0 : 64;
    stage_key_refs(keys, t, w0, n_win, comp_bytes, b0, nb, kp, kfp4, s_valid);
    __syncthreads();
    dequant_key_tile(kp, kfp4, nb, d, lut8, tile);
    __syncthreads();
    // Dots: keys j0, j0 + nw, j0 + 2 nw, j0 + 3 nw per warp pass, each in the lanes32 order.
    tile_dots(qf, tile, kp, nb, d, scale, z);
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


// ---- key-block split (few rows) ---------------------------------------------------------------
// The CPU's online softmax folds block b as  m_b = max(m_{b-1}, bmax_b),  alpha_b =
// exp(m_{b-1} - m_b),  l = l * alpha_b + psum_b,  acc = acc * alpha_b + S_b  where psum_b and
// S_b (the block's P.V sums) depend only on z of block b and m_b. m_b is a prefix max of the
// block maxima, so: (1) scores of every block in parallel, (2) per block m_b, p, psum_b and S_b
// in parallel, (3) the fold over blocks per (row, head, dim) in block order. Every value is formed
// by the same operations in the same order as the CPU: exact.
constexpr int kSplitHeads = 2;  // heads per CTA (the key tile is dequantised once per CTA)

struct SplitScratch {
  float *z, *bmax, *alpha, *psum, *pv;
  uint16_t* keys;  // [T][nblk][64][d] bf16: every key tile dequantised ONCE per step, shared by all head groups
  int nblk;        // block capacity per row
};

// CTA (t, block b, head group g) of the split kernels: row t's keys (n of them; w0 / n_win as
// row_keys gives), block b's first key b0 and its nb keys, the group's first head h0 and its hn
// heads. A CTA whose block starts past the row's keys (b0 >= n) has nothing to do.
struct SplitCta {
  int64_t t;
  int b, w0, n_win, n, b0, nb, h0, hn;
  struct At {
    int64_t t;
    int b, w0, n_win, b0, nb, h0, hn;
  };
  __device__ At at() const { return {t, b, w0, n_win, b0, nb, h0, hn}; }
};

// Floats before the key tiles (rounded up to 16 bytes) and in all.
__host__ __device__ __forceinline__ int64_t split_head_floats(int64_t T, int H, int d, int nblk) {
  const int64_t rows = T * H * int64_t(nblk);
  return (rows * (64 + 3 + d) + 3) / 4 * 4;
}
__host__ __device__ __forceinline__ int64_t split_total_floats(int64_t T, int H, int d, int nblk) {
  return split_head_floats(T, H, d, nblk) + T * int64_t(nblk) * 64 * d / 2;
}

__device__ __forceinline__ SplitScratch split_scratch(float* base, int64_t T, int H, int d, int max_keys) {
  SplitScratch s;
  s.nblk = (max_keys + 63) / 64;
  const int64_t rows = T * H * int64_t(s.nblk);
  s.z = base;
  s.bmax = s.z + rows * 64;
  s.alpha = s.bmax + rows;
  s.psum = s.alpha + rows;
  s.pv = s.psum + rows;
  s.keys = reinterpret_cast<uint16_t*>(base + split_head_floats(T, H, d, s.nblk));
  return s;
}

// The dequantised tile of (row t, block b), nb keys, into shared memory (16-byte copies).
__device__ __forceinline__ void load_key_tile(const SplitScratch& sc, int64_t t, int b, int nb, int d, uint16_t* tile) {
  const uint4* src = reinterpret_cast<const uint4*>(sc.keys + (t * sc.nblk + b) * int64_t(64) * d);
  uint4* dst = reinterpret_cast<uint4*>(tile);
  const int n16 = nb * d / 8;
  for (int i = int(threadIdx.x); i < n16; i += int(blockDim.x)) dst[i] = src[i];
}

constexpr int kKeyParts = 16;  // CTAs per 64-key tile in the dequantisation pass (one 8-element chunk per thread)

// CTA (t, block b, part): dequantises its share of the tile's chunks into sc.keys (the same
// values dequant_key_tile writes to shared memory: same function, same bits).
__global__ void __launch_bounds__(256) attn_split_keys_kernel(int64_t T, int n_heads, int d, AttnKeys keys) {
  pdl_trigger();  // PDL (pdl.cuh): plain stream order unless launched with the attribute
  pdl_wait();
  __shared__ float lut8[256];
  __shared__ const uint8_t* kp[64];
  __shared__ int kfp4[64];
  __shared__ unsigned s_valid[2];
  const SplitScratch sc = split_scratch(keys.split, T, n_heads, d, keys.max_keys);
  const int part = int(blockIdx.x % kKeyParts);
  const int b = int((blockIdx.x / kKeyParts) % sc.nblk);
  const int64_t t = int64_t(blockIdx.x / kKeyParts / sc.nblk);
  int w0, n_win;
  const int n = row_keys(keys, t, w0, n_win), b0 = b * 64;
  if (b0 >= n) return;  // whole CTA
  const int nb = n - b0 < 64 ? n - b0 : 64;
  lut8[threadIdx.x] = e4m3_val(uint8_t(threadIdx.x));
  stage_key_refs(keys, t, w0, n_win, int64_t(d / 2 + d / 16), b0, nb, kp, kfp4, s_valid);
  __syncthreads();
  const int total = nb * (d / 8), per = (total + kKeyParts - 1) / kKeyParts;
  const int c_begin = part * per, c_end = c_begin + per < total ? c_begin + per : total;
  dequant_key_chunks(kp, kfp4, d, lut8, sc.keys + (t * sc.nblk + b) * int64_t(64) * d, c_begin, c_end);
}

__device__ __forceinline__ SplitCta split_cta(const AttnKeys& keys, const SplitScratch& sc, int n_heads) {
  const int groups = (n_heads + kSplitHeads - 1) / kSplitHeads;
  SplitCta c;
  const int g = int(blockIdx.x % groups);
  c.b = int((blockIdx.x / groups) % sc.nblk);
  c.t = int64_t(blockIdx.x / groups / sc.nblk);
  c.n = row_keys(keys, c.t, c.w0, c.n_win);
  c.b0 = c.b * 64;
  c.nb = c.n - c.b0 < 64 ? c.n - c.b0 : 64;
  c.h0 = g * kSplitHeads;
  c.hn = n_heads - c.h0 < kSplitHeads ? n_heads - c.h0 : kSplitHeads;
  return c;
}

// CTA (t, block b, head group g): tile of keys 64b.., dots for kSplitHeads heads, block maxima.
template <bool kPre>
__global__ void __launch_bounds__(kTiledThreads) attn_split_scores_kernel(const uint16_t* q, int64_t T, int n_heads, int d, AttnKeys keys,
                                                                          float scale) {
  pdl_trigger();  // PDL (pdl.cuh): plain stream order unless launched with the attribute
  pdl_wait();
  extern __shared__ __align__(16) unsigned char smraw[];
  uint16_t* tile = reinterpret_cast<uint16_t*>(smraw);                       // [64][d]
  float* qf = reinterpret_cast<float*>(smraw + size_t(64) * size_t(d) * 2);  // [kSplitHeads][d]
  __shared__ float lut8[kPre ? 1 : 256];
  __shared__ const uint8_t* kp[64];
  __shared__ int kfp4[64];
  __shared__ float z[kSplitHeads][64];
  __shared__ unsigned s_valid[2];
  const SplitScratch sc = split_scratch(keys.split, T, n_heads, d, keys.max_keys);
  const SplitCta cta = split_cta(keys, sc, n_heads);
  if (cta.b0 >= cta.n) return;  // whole CTA
  const auto [t, b, w0, n_win, b0, nb, h0, hn] = cta.at();
  const int tid = int(threadIdx.x), nthr = int(blockDim.x);
  for (int i = tid; i < hn * d; i += nthr) qf[i] = bf(q[(t * n_heads + h0) * int64_t(d) + i]);
  stage_key_refs(keys, t, w0, n_win, int64_t(d / 2 + d / 16), b0, nb, kp, kfp4, s_valid);
  if (kPre) {
    load_key_tile(sc, t, b, nb, d, tile);
  } else {
    if (tid < 256) lut8[tid] = e4m3_val(uint8_t(tid));
    __syncthreads();
    dequant_key_tile(kp, kfp4, nb, d, lut8, tile);
  }
  __syncthreads();
  for (int hh = 0; hh < hn; ++hh) tile_dots(qf + int64_t(hh) * d, tile, kp, nb, d, scale, z[hh]);
  __syncthreads();
  const uint64_t valid = uint64_t(s_valid[0]) | uint64_t(s_valid[1]) << 32;
  for (int i = tid; i < hn * nb; i += nthr) {
    const int hh = i / nb, j = i - hh * nb;
    sc.z[((t * n_heads + h0 + hh) * sc.nblk + b) * 64 + j] = z[hh][j];
  }
  if (tid < hn) {
    float bmax = -INFINITY;
    for (int j = 0; j < nb; ++j)
      if ((valid >> j) & 1) bmax = smax(bmax, z[tid][j]);
    sc.bmax[(t * n_heads + h0 + tid) * sc.nblk + b] = bmax;
  }
}

// Same CTAs: m_b from the prefix of block maxima, exps, p-sum (sequential in j), the block's P.V
// sums S_b[i] (sequential in j), alpha_b.
template <bool kPre>
__global__ void __launch_bounds__(kTiledThreads) attn_split_pv_kernel(int64_t T, int n_heads, int d, AttnKeys keys) {
  pdl_trigger();  // PDL (pdl.cuh): plain stream order unless launched with the attribute
  pdl_wait();
  extern __shared__ __align__(16) unsigned char smraw[];
  uint16_t* tile = reinterpret_cast<uint16_t*>(smraw);  // [64][d]
  __shared__ float lut8[kPre ? 1 : 256];
  __shared__ const uint8_t* kp[64];
  __shared__ int kfp4[64];
  __shared__ float pf[kSplitHeads][64], pr[kSplitHeads][64];
  __shared__ float s_m2[kSplitHeads];
  __shared__ unsigned s_valid[2];
  const SplitScratch sc = split_scratch(keys.split, T, n_heads, d, keys.max_keys);
  const SplitCta cta = split_cta(keys, sc, n_heads);
  if (cta.b0 >= cta.n) return;  // whole CTA
  const auto [t, b, w0, n_win, b0, nb, h0, hn] = cta.at();
  const int tid = int(threadIdx.x), nthr = int(blockDim.x);
  stage_key_refs(keys, t, w0, n_win, int64_t(d / 2 + d / 16), b0, nb, kp, kfp4, s_valid);
  if (kPre) load_key_tile(sc, t, b, nb, d, tile);
  else if (tid < 256) lut8[tid] = e4m3_val(uint8_t(tid));
  if (tid < hn) {
    const float* bm = sc.bmax + (t * n_heads + h0 + tid) * sc.nblk;
    float m = -1e30f;
    for (int bb = 0; bb < b; ++bb) m = smax(m, bm[bb]);
    const float m2 = smax(m, bm[b]);
    s_m2[tid] = m2;
    sc.alpha[(t * n_heads + h0 + tid) * sc.nblk + b] = fm::exp(fm::add(m, -m2));
  }
  __syncthreads();
  if (!kPre) dequant_key_tile(kp, kfp4, nb, d, lut8, tile);  // read after the next barrier
  const uint64_t valid = uint64_t(s_valid[0]) | uint64_t(s_valid[1]) << 32;
  for (int i = tid; i < hn * nb; i += nthr) {
    const int hh = i / nb, j = i - hh * nb;
    const float zz = sc.z[((t * n_heads + h0 + hh) * sc.nblk + b) * 64 + j];
    const float p = ((valid >> j) & 1) ? fm::exp(fm::add(zz, -s_m2[hh])) : 0.0f;
    pf[hh][j] = p;
    pr[hh][j] = round_bf16(p);
  }
  __syncthreads();
  if (tid < hn) {
    float psum = 0.0f;
    for (int j = 0; j < nb; ++j) psum = fm::add(psum, pf[tid][j]);
    sc.psum[(t * n_heads + h0 + tid) * sc.nblk + b] = psum;
  }
  for (int i = tid; i < hn * d; i += nthr) {
    const int hh = i / d, c = i - hh * d;
    float s = 0.0f;
    const uint16_t* col = tile + c;
#pragma unroll 8
    for (int j = 0; j < nb; ++j)
      if ((valid >> j) & 1) s = fm::add(s, fm::mul(pr[hh][j], bf(col[size_t(j) * d])));
    sc.pv[((t * n_heads + h0 + hh) * sc.nblk + b) * int64_t(d) + c] = s;
  }
}

// CTA (t, h): the fold over the row's blocks in order, the sink, the division.
__global__ void __launch_bounds__(kTiledThreads) attn_split_fold_kernel(int64_t T, int n_heads, int d, AttnKeys keys, const float* sinks,
                                                                        uint16_t* out) {
  pdl_trigger();  // PDL (pdl.cuh): plain stream order unless launched with the attribute
  pdl_wait();
  __shared__ float s_l;
  const SplitScratch sc = split_scratch(keys.split, T, n_heads, d, keys.max_keys);
  const int64_t t = blockIdx.x / n_heads;
  const int h = int(blockIdx.x % n_heads);
  int w0, n_win;
  const int n = row_keys(keys, t, w0, n_win), nblk = (n + 63) / 64;
  if (nblk > sc.nblk) __trap();  // the host's max_keys was wrong: never fold a partial row
  const int64_t r = (t * n_heads + h) * sc.nblk;
  if (threadIdx.x == 0) {
    float l = 0.0f, m = -1e30f;
    for (int bb = 0; bb < nblk; ++bb) {
      l = fm::add(fm::mul(l, sc.alpha[r + bb]), sc.psum[r + bb]);
      m = smax(m, sc.bmax[r + bb]);
    }
    s_l = fm::add(l, fm::exp(fm::add(sinks[h], -m)));
  }
  __syncthreads();
  const float l = s_l;
  uint16_t* o = out + (t * n_heads + h) * int64_t(d);
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float acc = 0.0f;
    for (int bb = 0; bb < nblk; ++bb) acc = fm::add(fm::mul(acc, sc.alpha[r + bb]), sc.pv[(r + bb) * int64_t(d) + i]);
    o[i] = to_bf(fm::div(acc, l));
  }
}

constexpr int64_t kSplitMaxRows = 16;

}  // namespace

int64_t attention_split_floats(int64_t T, int n_heads, int d, int max_keys) {
  if (T <= 0 || T > kSplitMaxRows || d > kTiledMaxD || max_keys <= 64) return 0;
  return split_total_floats(T, n_heads, d, (max_keys + 63) / 64);
}

Status sparse_attention(const uint16_t* q, int64_t T, int n_heads, int d, const AttnKeys& keys, const float* sinks, float scale, uint16_t* out,
                        cudaStream_t st) {
  FB_CHECK(d % 32 == 0 && keys.win && keys.win_off) << "attention head_dim " << d;
  if (T == 0) return Status();
  if (keys.split && attention_split_floats(T, n_heads, d, keys.max_keys) > 0) {
    const int groups = (n_heads + kSplitHeads - 1) / kSplitHeads, nblk = (keys.max_keys + 63) / 64;
    const unsigned grid = unsigned(T * nblk * groups);
    const size_t smem_a = size_t(64) * size_t(d) * 2 + size_t(kSplitHeads) * size_t(d) * sizeof(float);
    const size_t smem_b = size_t(64) * size_t(d) * 2;
    auto scores = keys.predequant ? attn_split_scores_kernel<true> : attn_split_scores_kernel<false>;
    auto pv = keys.predequant ? attn_split_pv_kernel<true> : attn_split_pv_kernel<false>;
    FB_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(scores), smem_a));
    FB_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(pv), smem_b));
    if (keys.predequant) {
      FB_CUDA_TRY(launch_pdl(fast_pdl(), attn_split_keys_kernel, dim3(unsigned(T * nblk * kKeyParts)), dim3(256), 0, st, T, n_heads, d, keys));
      FB_CUDA_LAUNCHED("attn_split_keys_kernel");
    }
    const bool pdl = fast_pdl();
    FB_CUDA_TRY(launch_pdl(pdl, scores, dim3(grid), dim3(kTiledThreads), smem_a, st, q, T, n_heads, d, keys, scale));
    FB_CUDA_LAUNCHED("attn_split_scores_kernel");
    FB_CUDA_TRY(launch_pdl(pdl, pv, dim3(grid), dim3(kTiledThreads), smem_b, st, T, n_heads, d, keys));
    FB_CUDA_LAUNCHED("attn_split_pv_kernel");
    FB_CUDA_TRY(launch_pdl(pdl, attn_split_fold_kernel, dim3(unsigned(T * n_heads)), dim3(kTiledThreads), 0, st, T, n_heads, d, keys, sinks, out));
    FB_CUDA_LAUNCHED("attn_split_fold_kernel");
    return Status();
  }
  if (d <= kTiledMaxD) {
    const size_t smem = size_t(64) * size_t(d) * 2 + size_t(2 * d) * sizeof(float);
    FB_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(sparse_attention_tiled_kernel), smem));
    return launch_op("sparse_attention_tiled_kernel", sparse_attention_tiled_kernel, unsigned(T * n_heads), kTiledThreads, smem, st, q, n_heads, d,
                     keys, sinks, scale, out);
  }
  const size_t smem = size_t(2 * d) * sizeof(float);
  FB_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(sparse_attention_kernel), smem));
  return launch_op("sparse_attention_kernel", sparse_attention_kernel, unsigned(T * n_heads), kThreads, smem, st, q, n_heads, d, keys, sinks, scale,
                   out);
}

}  // namespace fb::cuda
