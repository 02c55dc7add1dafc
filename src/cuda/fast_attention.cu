// The fast sparse attention of fast_attention.h. Shared-memory layout of the tile kernel: the
// key tile [64][d] and the query group [16][d] as bf16 rows of 16-byte chunks, chunk c of row r
// stored at (c & ~7) | ((c ^ r) & 7), so the 8 rows of every ldmatrix read hit 8 different bank
// groups (the same XOR swizzle as tc_gemv.cu); the probabilities [16][64] bf16 likewise.
#include "cuda/fast_attention.h"

#include <algorithm>
#include <atomic>

#include "base/check.h"
#include "cuda/device.h"
#include "cuda/fast_small.h"
#include "cuda/numerics.cuh"
#include "cuda/pdl.cuh"
#include "cuda/launch.cuh"

namespace fb::cuda {

using namespace dev;

namespace {

constexpr int kThreads = 256;  // 8 warps: 8 keys each for the dots, d / 8 dims each for P.V
constexpr int kKeys = 64;      // keys per block (one CTA)
constexpr int kGroup = 16;     // heads per CTA (the m16 of the tensor-core tiles)
constexpr int kMaxD = 512;

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ int swz(int r, int c) { return (c & ~7) | ((c ^ r) & 7); }

__device__ __forceinline__ void ldsm_x4(uint32_t a, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldsm_x2_trans(uint32_t a, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(a));
}
// d[4] += A (16 x 16 bf16, a[4]) . B (16 x 8 bf16, b0 b1), f32 accumulation.
__device__ __forceinline__ void mma_bf16(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, float (&d)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, off));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  return v;
}

// Key count of row t (window entries, then selected entries).
__device__ __forceinline__ int row_key_count(const AttnKeys& keys, int64_t t, int& w0, int& n_win) {
  w0 = keys.win_off[t];
  n_win = keys.win_off[t + 1] - w0;
  return n_win + (keys.sel ? keys.sel_count[t] : 0);
}

// RoPE of the bf16 pairs packed in w (word j = dims e0 + 2j, e0 + 2j + 1; e0 even) that fall in the
// head's last 2 half dims, at table row p: norm_hc.cu rope_kernel's arithmetic, the same bits.
template <int N>
__device__ __forceinline__ void rope_words(uint32_t (&w)[N], int e0, int d, const AttnRope& rp, int64_t p, bool inverse) {
  const int r0 = d - 2 * rp.half;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const int e = e0 + 2 * j;
    if (e < r0) continue;
    const int k = (e - r0) >> 1;
    const float c = rp.cos[p * rp.half + k], sn = rp.sin[p * rp.half + k];
    const float a = bf(uint16_t(w[j])), b = bf(uint16_t(w[j] >> 16));
    uint32_t lo, hi;
    if (!inverse) {
      lo = to_bf(fm::add(fm::mul(a, c), -fm::mul(b, sn)));
      hi = to_bf(fm::add(fm::mul(a, sn), fm::mul(b, c)));
    } else {
      lo = to_bf(fm::add(fm::mul(a, c), fm::mul(b, sn)));
      hi = to_bf(fm::add(fm::mul(b, c), -fm::mul(a, sn)));
    }
    w[j] = lo | hi << 16;
  }
}

// Scratch: partial outputs [T][H][NB][d], then (m_b, l_b) pairs [T][H][NB].
struct Partials {
  float* o;
  float* ml;
};
__host__ __device__ __forceinline__ Partials partials_at(float* base, int64_t T, int H, int NB, int d) {
  return {base, base + T * int64_t(H) * NB * d};
}

// CTA (block b, head group g, row t).
// hpc heads per CTA (<= kGroup): the tiles' rows past hpc are zero queries, never written (fewer
// heads per CTA = more CTAs for one row: 8 doubles them at the price of idle mma rows).
__global__ void __launch_bounds__(kThreads) fast_attn_tile_kernel(const uint16_t* __restrict__ q, int64_t t0, int H, int d, int NB, AttnKeys keys,
                                                                  float scale, float* scratch, int hpc, AttnRope rope) {
  pdl_trigger();
  pdl_wait();
  extern __shared__ __align__(16) unsigned char smraw[];
  uint16_t* tile = reinterpret_cast<uint16_t*>(smraw);         // [64][d]
  uint16_t* qs = tile + kKeys * d;                              // [16][d]
  uint16_t* ps = qs + kGroup * d;                               // [16][64]
  float* zs = reinterpret_cast<float*>(ps + kGroup * kKeys);    // [16][65]
  __shared__ const uint8_t* kp[kKeys];
  __shared__ int kf[kKeys];
  __shared__ float lut8[256], lut4[16];
  __shared__ unsigned s_valid[2];
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int b = int(blockIdx.x), h0 = int(blockIdx.y) * hpc;
  const int64_t r_loc = blockIdx.z, R = gridDim.z, t = t0 + r_loc;  // partials by batch row, keys by step row
  int w0, n_win;
  const int n = row_key_count(keys, t, w0, n_win), b0 = b * kKeys;
  if (n > NB * kKeys) __trap();  // the host's max_keys was wrong: never drop keys
  if (b0 >= n) return;           // whole CTA
  const int nb = n - b0 < kKeys ? n - b0 : kKeys;
  const int cpr = d / 8;  // 16-byte chunks per row
  // Key references (as attention.cu's key_ref), the conversion tables, the query group.
  if (tid < kKeys) {
    const uint8_t* p = nullptr;
    int fp4 = 0;
    const int e = b0 + tid;
    if (tid < nb) {
      if (e < n_win) {
        p = reinterpret_cast<const uint8_t*>(keys.win[w0 + e]);
      } else {
        const int32_t id = keys.sel[t * keys.sel_ld + (e - n_win)];
        if (id >= 0) p = reinterpret_cast<const uint8_t*>(keys.comp_base[t]) + int64_t(id) * (d / 2 + d / 16), fp4 = 1;
      }
    }
    kp[tid] = p;
    kf[tid] = fp4;
    const unsigned bal = __ballot_sync(kFull, p != nullptr);
    if (lane == 0) s_valid[tid >> 5] = bal;
  }
  lut8[tid] = e4m3_val(uint8_t(tid));
  if (tid < 16) lut4[tid] = e2m1_val(uint8_t(tid));
  for (int i = tid; i < kGroup * cpr; i += kThreads) {
    const int r = i / cpr, c = i - r * cpr, h = h0 + r;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r < hpc && h < H) v = __ldg(reinterpret_cast<const uint4*>(q + (t * H + h) * int64_t(d)) + c);
    if (rope.q && 8 * c + 8 > d - 2 * rope.half && r < hpc && h < H) {  // the chunk holds rotated dims
      uint32_t w[4] = {v.x, v.y, v.z, v.w};
      rope_words(w, 8 * c, d, rope, rope.pos[t], false);
      v = make_uint4(w[0], w[1], w[2], w[3]);
    }
    *reinterpret_cast<uint4*>(qs + r * d + swz(r, c) * 8) = v;
  }
  __syncthreads();
  // Dequantise the block's keys into the tile: chunk i = (key j, dims 8c..8c+7), exact bf16
  // values (the products of an e4m3 / e2m1 code and a power-of-two / e4m3 scale are exact).
  constexpr int kBatch = 8;
  const int total = kKeys * cpr;
  for (int i0 = tid; i0 < total; i0 += kBatch * kThreads) {
    uint2 raw[kBatch];
    uint8_t sb[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = i0 + u * kThreads, j = i / cpr, c = i - j * cpr;
      raw[u] = make_uint2(0u, 0u);
      sb[u] = 0;
      const uint8_t* p = i < total ? kp[j] : nullptr;
      if (!p) continue;
      if (!kf[j]) {
        const uint8_t* src = p + c * 8;
        if ((reinterpret_cast<uintptr_t>(src) & 7) == 0) {
          raw[u] = __ldg(reinterpret_cast<const uint2*>(src));
        } else {
          uint32_t lo = 0, hi = 0;
#pragma unroll
          for (int e = 0; e < 4; ++e) lo |= uint32_t(src[e]) << (8 * e), hi |= uint32_t(src[4 + e]) << (8 * e);
          raw[u] = make_uint2(lo, hi);
        }
        sb[u] = p[d + c / 4];
      } else {
        const uint8_t* src = p + c * 4;
        if ((reinterpret_cast<uintptr_t>(src) & 3) == 0) raw[u].x = __ldg(reinterpret_cast<const uint32_t*>(src));
        else raw[u].x = uint32_t(src[0]) | uint32_t(src[1]) << 8 | uint32_t(src[2]) << 16 | uint32_t(src[3]) << 24;
        sb[u] = p[d / 2 + c / 2];
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = i0 + u * kThreads;
      if (i >= total) continue;
      const int j = i / cpr, c = i - j * cpr;
      uint32_t w[4] = {0u, 0u, 0u, 0u};
      if (kp[j]) {
        float v[8];
        if (!kf[j]) {
          const float s = e8m0_val(sb[u]);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            v[e] = lut8[(raw[u].x >> (8 * e)) & 0xFF] * s;
            v[4 + e] = lut8[(raw[u].y >> (8 * e)) & 0xFF] * s;
          }
        } else {
          const float s = lut8[sb[u]];
#pragma unroll
          for (int e = 0; e < 8; ++e) v[e] = lut4[(raw[u].x >> (4 * e)) & 0xF] * s;
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) w[e] = uint32_t(to_bf(v[2 * e])) | uint32_t(to_bf(v[2 * e + 1])) << 16;
      }
      *reinterpret_cast<uint4*>(tile + j * d + swz(j, c) * 8) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
  __syncthreads();
  // S = Q K^T: warp w owns keys 8w..8w+7 (one n8 tile), k over d in steps of 16.
  {
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const int key = warp * 8 + (lane & 7), qrow = (lane & 7) + 8 * ((lane >> 3) & 1);
    const uint32_t kbase = smem_addr(tile + key * d), qbase = smem_addr(qs + qrow * d);
    for (int c = 0; c < cpr; c += 4) {  // 4 chunks = two k16 steps
      uint32_t bk[4], a0[4], a1[4];
      ldsm_x4(kbase + uint32_t(swz(key, c + (lane >> 3)) * 16), bk);
      ldsm_x4(qbase + uint32_t(swz(qrow, c + (lane >> 4)) * 16), a0);
      ldsm_x4(qbase + uint32_t(swz(qrow, c + 2 + (lane >> 4)) * 16), a1);
      mma_bf16(a0, bk[0], bk[1], acc);
      mma_bf16(a1, bk[2], bk[3], acc);
    }
    const uint64_t valid = uint64_t(s_valid[0]) | uint64_t(s_valid[1]) << 32;
    const int g = lane >> 2, j0 = warp * 8 + 2 * (lane & 3);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = g + 8 * (e >> 1), j = j0 + (e & 1);
      zs[r * (kKeys + 1) + j] = (j < nb && ((valid >> j) & 1)) ? acc[e] * scale : -INFINITY;
    }
  }
  __syncthreads();
  // Block softmax: warp w owns heads 2w, 2w + 1 of the group; lanes keys lane and lane + 32.
  const Partials part = partials_at(scratch, R, H, NB, d);
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int r = 2 * warp + rr, h = r < hpc ? h0 + r : H;  // H: a padding row, not written
    const float z0 = zs[r * (kKeys + 1) + lane], z1 = zs[r * (kKeys + 1) + lane + 32];
    const float m = warp_max(fmaxf(z0, z1));
    const float p0 = z0 == -INFINITY ? 0.0f : __expf(z0 - m), p1 = z1 == -INFINITY ? 0.0f : __expf(z1 - m);
    const float l = warp_sum(p0 + p1);
    ps[r * kKeys + (((lane >> 3) ^ (r & 7)) << 3) + (lane & 7)] = to_bf(p0);
    ps[r * kKeys + ((((lane + 32) >> 3) ^ (r & 7)) << 3) + (lane & 7)] = to_bf(p1);
    if (lane == 0 && h < H) {
      float* ml = part.ml + ((r_loc * H + h) * NB + b) * 2;
      ml[0] = m;
      ml[1] = l;
    }
  }
  __syncthreads();
  // O_b = P V: warp w owns dims [w d/8, (w + 1) d/8) (d/64 n8 tiles), k over the 64 keys.
  {
    constexpr int kMaxTiles = kMaxD / 64;
    const int nt_count = d / 64, c0 = warp * nt_count;
    float acc[kMaxTiles][4];
#pragma unroll
    for (int nt = 0; nt < kMaxTiles; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    const int prow = (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) {
      uint32_t a[4];
      ldsm_x4(smem_addr(ps + prow * kKeys + (((2 * ks + (lane >> 4)) ^ (prow & 7)) << 3)), a);
      const int vkey = 16 * ks + prow;  // lanes 0-15 address keys 16ks .. 16ks + 15
#pragma unroll
      for (int nt = 0; nt < kMaxTiles; ++nt) {
        if (nt >= nt_count) break;
        uint32_t b0, b1;
        ldsm_x2_trans(smem_addr(tile + vkey * d + swz(vkey, c0 + nt) * 8), b0, b1);
        mma_bf16(a, b0, b1, acc[nt]);
      }
    }
    const int g = lane >> 2;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = g + 8 * half, h = h0 + r;
      if (r >= hpc || h >= H) continue;
      float* o = part.o + ((r_loc * H + h) * NB + b) * int64_t(d);
#pragma unroll
      for (int nt = 0; nt < kMaxTiles; ++nt) {
        if (nt >= nt_count) break;
        *reinterpret_cast<float2*>(o + (c0 + nt) * 8 + 2 * (lane & 3)) = make_float2(acc[nt][2 * half], acc[nt][2 * half + 1]);
      }
    }
  }
}

// CTA (row t, head h): the blocks combined in order with the sink, divided, rounded to bf16.
// Thread 0 forms the common max and the denominator; every thread forms the block weights itself
// (the same expression, the same bits) while it sums its 4 dims over the blocks.
__global__ void __launch_bounds__(128) fast_attn_combine_kernel(int64_t t0, int64_t R, int H, int d, int NB, AttnKeys keys,
                                                                const float* __restrict__ sinks, const float* scratch, uint16_t* __restrict__ out,
                                                                AttnRope rope) {
  pdl_trigger();
  pdl_wait();
  __shared__ float s_m, s_inv;
  const int64_t r_loc = blockIdx.x / H, t = t0 + r_loc;
  const int h = int(blockIdx.x % H);
  int w0, n_win;
  const int n = row_key_count(keys, t, w0, n_win), nbk = (n + kKeys - 1) / kKeys;
  const Partials part = partials_at(const_cast<float*>(scratch), R, H, NB, d);
  const float* ml = part.ml + (r_loc * H + h) * NB * 2;
  if (threadIdx.x == 0) {
    float m = -1e30f;  // the reference's starting max: a row without keys weighs only the sink
    for (int bb = 0; bb < nbk; ++bb) m = fmaxf(m, ml[2 * bb]);
    float l = 0.0f;
    for (int bb = 0; bb < nbk; ++bb) {
      const float w = ml[2 * bb] == -INFINITY ? 0.0f : __expf(ml[2 * bb] - m);
      l = fmaf(w, ml[2 * bb + 1], l);
    }
    s_m = m;
    s_inv = 1.0f / (l + __expf(sinks[h] - m));
  }
  __syncthreads();
  const float m = s_m, inv = s_inv;
  const float* o = part.o + (r_loc * H + h) * NB * int64_t(d);
  uint16_t* y = out + (t * H + h) * int64_t(d);
  for (int i = int(threadIdx.x) * 4; i < d; i += int(blockDim.x) * 4) {
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int bb = 0; bb < nbk; ++bb) {
      const float mb = ml[2 * bb];
      const float w = mb == -INFINITY ? 0.0f : __expf(mb - m);
      const float4 v = *reinterpret_cast<const float4*>(o + bb * int64_t(d) + i);
      acc.x = fmaf(w, v.x, acc.x);
      acc.y = fmaf(w, v.y, acc.y);
      acc.z = fmaf(w, v.z, acc.z);
      acc.w = fmaf(w, v.w, acc.w);
    }
    uint32_t w[2] = {uint32_t(to_bf(acc.x * inv)) | uint32_t(to_bf(acc.y * inv)) << 16,
                     uint32_t(to_bf(acc.z * inv)) | uint32_t(to_bf(acc.w * inv)) << 16};
    if (rope.o && i + 4 > d - 2 * rope.half) rope_words(w, i, d, rope, rope.pos[t], true);  // inverse RoPE of the rounded output
    *reinterpret_cast<uint2*>(y + i) = make_uint2(w[0], w[1]);
  }
}

size_t tile_smem(int d) { return size_t(kKeys + kGroup) * d * 2 + size_t(kGroup) * kKeys * 2 + size_t(kGroup) * (kKeys + 1) * 4; }

}  // namespace

bool fast_attention_ok(int64_t T, int d) { return T >= 1 && T <= kFastAttnMaxRows && d % 64 == 0 && d >= 64 && d <= kMaxD; }

// Rows per launch pair: the partials of a batch stay within kScratchFloats (a decode step of 64
// rows at the released shape, 640 keys each, is one batch of 84 MB; long key lists split the rows,
// which changes no row's arithmetic).
constexpr int64_t kScratchFloats = int64_t(32) << 20;
static std::atomic<int64_t> g_batch_floats{kScratchFloats};
static std::atomic<int> g_heads_per_cta{kGroup};
static int64_t batch_rows(int64_t T, int n_heads, int d, int max_keys) {
  const int64_t NB = (std::max(max_keys, 1) + kKeys - 1) / kKeys, per_row = int64_t(n_heads) * NB * (d + 2);
  return std::max<int64_t>(1, std::min<int64_t>(T, g_batch_floats.load() / per_row));
}

int64_t fast_attention_floats(int64_t T, int n_heads, int d, int max_keys) {
  const int64_t NB = (std::max(max_keys, 1) + kKeys - 1) / kKeys;
  return batch_rows(T, n_heads, d, max_keys) * n_heads * NB * (d + 2);
}

void fast_attention_set_batch_floats(int64_t floats) { g_batch_floats = floats > 0 ? floats : kScratchFloats; }
void fast_attention_set_heads_per_cta(int heads) { g_heads_per_cta = heads >= 1 && heads <= kGroup ? heads : kGroup; }

Status fast_sparse_attention(const uint16_t* q, int64_t T, int n_heads, int d, const AttnKeys& keys, const float* sinks, float scale, float* scratch,
                             uint16_t* out, cudaStream_t st, const AttnRope& rope) {
  FB_CHECK(fast_attention_ok(T, d) && keys.win && keys.win_off && keys.max_keys > 0 && scratch)
      << "fast attention T=" << T << " d=" << d << " max_keys=" << keys.max_keys;
  FB_CHECK(!(rope.q || rope.o) || (rope.pos && rope.cos && rope.sin && rope.half > 0 && 2 * rope.half <= d))
      << "fast attention rope: half=" << rope.half << " d=" << d;
  const int NB = (keys.max_keys + kKeys - 1) / kKeys;
  const size_t smem = tile_smem(d);
  FB_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(fast_attn_tile_kernel), smem));
  const bool pdl = fast_pdl();
  const int64_t B = batch_rows(T, n_heads, d, keys.max_keys);
  for (int64_t t0 = 0; t0 < T; t0 += B) {
    const int64_t R = std::min(B, T - t0);
    const int hpc = std::clamp(g_heads_per_cta.load(), 1, kGroup);
    const dim3 grid{unsigned(NB), unsigned((n_heads + hpc - 1) / hpc), unsigned(R)};
    FB_CUDA_TRY(launch_pdl(pdl, fast_attn_tile_kernel, grid, dim3(kThreads), smem, st, q, t0, n_heads, d, NB, keys, scale, scratch, hpc, rope));
    FB_CUDA_LAUNCHED("fast_attn_tile_kernel");
    FB_CUDA_TRY(launch_pdl(pdl, fast_attn_combine_kernel, dim3(unsigned(R * n_heads)), dim3(128), 0, st, t0, R, n_heads, d, NB, keys, sinks,
                           static_cast<const float*>(scratch), out, rope));
    FB_CUDA_LAUNCHED("fast_attn_combine_kernel");
  }
  return Status();
}

}  // namespace fb::cuda

// ---- the indexer's scores on tensor cores (fast_index_scores) -----------------------------------
namespace fb::cuda {

using namespace dev;

namespace {

constexpr int kIdxEnt = 64;       // entries per CTA
constexpr int kIdxThreads = 128;  // 4 warps: 16 heads each

__device__ __forceinline__ void idx_mma_bf16(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, float (&d)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// CTA (64 entries, row t): the row's IH x ihd query and the entries' keys (dequantised to the
// exact bf16 values) in shared memory (rows padded by 8 elements: conflict-free fragment loads),
// warp w the dots of heads 16w..16w+15 with all 64 entries (mma.m16n8k16, f32), then per (head,
// entry) the reference's chain from the bf16 dot on, and thread e the head sum of entry e in head
// order. Only a row's own q, weights and keys enter its scores.
__global__ void __launch_bounds__(kIdxThreads) fast_index_scores_kernel(const uint16_t* __restrict__ iq, const uint16_t* __restrict__ wts, int IH,
                                                                       int ihd, const uint64_t* __restrict__ keys_base, int64_t key_bytes,
                                                                       const int64_t* __restrict__ n_vis, const int64_t* __restrict__ n_scored,
                                                                       float* __restrict__ I, int64_t ld, const uint8_t* __restrict__ mask,
                                                                       int64_t mask_ld, const int64_t* __restrict__ mask_len) {
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float wv[64];
  __shared__ uint8_t on_s[kIdxEnt];
  pdl_trigger();
  pdl_wait();
  const int64_t t = blockIdx.y, j0 = int64_t(blockIdx.x) * kIdxEnt, ns = n_scored[t], nv = n_vis[t];
  if (j0 >= ns) return;
  const int rs = ihd + 8;  // row stride, elements
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem);  // [IH][rs]
  uint16_t* ks = qs + IH * rs;                        // [kIdxEnt][rs]
  float* prod = reinterpret_cast<float*>(smem);       // [IH][kIdxEnt + 1], after the dots
  const int tid = int(threadIdx.x), warp = tid >> 5, lane = tid & 31, g = lane >> 2, tq = lane & 3;
  const int cpr = ihd / 8;  // 16-byte chunks per row
  const uint16_t* qr = iq + t * int64_t(IH) * ihd;
  for (int u = tid; u < IH * cpr; u += kIdxThreads) {
    const int h = u / cpr, c = u % cpr;
    *reinterpret_cast<uint4*>(qs + h * rs + c * 8) = *reinterpret_cast<const uint4*>(qr + int64_t(h) * ihd + c * 8);
  }
  if (tid < IH) wv[tid] = bf(wts[t * IH + tid]);
  if (tid < kIdxEnt) {
    const int64_t j = j0 + tid;
    on_s[tid] = j < ns && j < nv && (!mask || (j < mask_len[t] && mask[t * mask_ld + j]));
  }
  const uint8_t* kbase = reinterpret_cast<const uint8_t*>(keys_base[t]);
  for (int u = tid; u < kIdxEnt * cpr; u += kIdxThreads) {
    const int e = u / cpr, c = u % cpr;
    const int64_t j = j0 + e;
    uint32_t w[4] = {0u, 0u, 0u, 0u};
    if (j < nv) {
      const uint8_t* kb = kbase + j * key_bytes;
      const uint32_t codes = *reinterpret_cast<const uint32_t*>(kb + c * 4);  // elements 8c .. 8c + 7, one nibble each
      const float sc = e8m0_val(kb[ihd / 2 + (c * 8) / 32]);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint32_t lo = to_bf(fm::mul(e2m1_val(uint8_t((codes >> (8 * q)) & 0xFu)), sc));
        const uint32_t hi = to_bf(fm::mul(e2m1_val(uint8_t((codes >> (8 * q + 4)) & 0xFu)), sc));
        w[q] = lo | hi << 16;
      }
    }
    *reinterpret_cast<uint4*>(ks + e * rs + c * 8) = make_uint4(w[0], w[1], w[2], w[3]);
  }
  __syncthreads();
  float acc[kIdxEnt / 8][4];
#pragma unroll
  for (int n = 0; n < kIdxEnt / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  const bool heads = warp * 16 < IH;
  if (heads) {
    const uint16_t* qa = qs + (warp * 16 + g) * rs + 2 * tq;
    for (int k0 = 0; k0 < ihd; k0 += 16) {
      const uint32_t a[4] = {*reinterpret_cast<const uint32_t*>(qa + k0), *reinterpret_cast<const uint32_t*>(qa + 8 * rs + k0),
                             *reinterpret_cast<const uint32_t*>(qa + k0 + 8), *reinterpret_cast<const uint32_t*>(qa + 8 * rs + k0 + 8)};
#pragma unroll
      for (int n = 0; n < kIdxEnt / 8; ++n) {
        const uint16_t* kp = ks + (8 * n + g) * rs + k0 + 2 * tq;
        idx_mma_bf16(a, *reinterpret_cast<const uint32_t*>(kp), *reinterpret_cast<const uint32_t*>(kp + 8), acc[n]);
      }
    }
  }
  __syncthreads();  // the tiles are read; prod takes their place
  if (heads) {
#pragma unroll
    for (int n = 0; n < kIdxEnt / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int h = warp * 16 + g + (i >= 2 ? 8 : 0), e = 8 * n + 2 * tq + (i & 1);
        const float db = smax(round_bf16(acc[n][i]), 0.0f);
        prod[h * (kIdxEnt + 1) + e] = round_bf16(fm::mul(db, wv[h]));
      }
  }
  __syncthreads();
  if (tid < kIdxEnt && j0 + tid < ns) {
    float score = -INFINITY;
    if (on_s[tid]) {
      float tot = 0.0f;
      for (int h = 0; h < IH; ++h) tot = fm::add(tot, prod[h * (kIdxEnt + 1) + tid]);
      score = round_bf16(tot);
    }
    I[t * ld + j0 + tid] = score;
  }
}

size_t fast_index_smem(int IH, int ihd) {
  const size_t tiles = size_t(IH + kIdxEnt) * size_t(ihd + 8) * 2, prods = size_t(IH) * (kIdxEnt + 1) * 4;
  return tiles > prods ? tiles : prods;
}

}  // namespace

bool fast_index_scores_ok(int64_t T, int IH, int ihd, int64_t key_bytes, const std::vector<uint64_t>& keys_base) {
  if (T < 1 || T > kFastAttnMaxRows || IH < 16 || IH > 64 || IH % 16 != 0 || ihd < 32 || ihd > 128 || ihd % 32 != 0 || key_bytes % 4 != 0) return false;
  for (uint64_t b : keys_base)
    if (b % 4 != 0) return false;
  return fast_index_smem(IH, ihd) <= 48 * 1024;
}

Status fast_index_scores(const uint16_t* iq, const uint16_t* wts, int64_t T, int IH, int ihd, const uint64_t* keys_base, int64_t key_bytes,
                         const int64_t* n_vis, const int64_t* n_scored, float* I, int64_t ld, cudaStream_t st, const uint8_t* mask, int64_t mask_ld,
                         const int64_t* mask_len) {
  FB_CHECK(T <= kFastAttnMaxRows && IH % 16 == 0 && IH <= 64 && ihd % 32 == 0 && ihd <= 128 && key_bytes % 4 == 0 &&
           (reinterpret_cast<uintptr_t>(iq) & 15) == 0)
      << "fast_index_scores IH=" << IH << " ihd=" << ihd;
  if (T == 0 || ld == 0) return Status();
  const dim3 grid(unsigned((ld + kIdxEnt - 1) / kIdxEnt), unsigned(T));
  return launch_op_pdl("fast_index_scores_kernel", fast_pdl(), fast_index_scores_kernel, grid, dim3(kIdxThreads), fast_index_smem(IH, ihd), st, iq,
                       wts, IH, ihd, keys_base, key_bytes, n_vis, n_scored, I, ld, mask, mask_ld, mask_len);
}

}  // namespace fb::cuda
