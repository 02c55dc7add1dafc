// Indexer of the CUDA executor (cpu::CpuStep::index_select): the bf16 score chain over FP4 index
// keys, the candidate block pool, and the top-k selection with exact ties toward the lower
// index. Selection is the top k under the total order (score desc, index asc), which is what the
// CPU's partial_sort yields, found by an MSB-first radix select on order-preserving keys (passes
// of 8 bits; 2 when every key is a bf16 value's) by the CTAs of a cluster (one per 4,096 entries,
// up to 8), plus an in-order emission with ties toward the lower index: O(n) per row, no size
// limit (docs/numerics.md). NaN scores have no defined place in that order (neither the CPU's).
#include <cooperative_groups.h>

#include <algorithm>

#include "base/check.h"
#include "cuda/device.h"
#include "cuda/numerics.cuh"
#include "cuda/ops.h"
#include "cuda/launch.cuh"

namespace fb::cuda {

using namespace dev;
namespace cg = cooperative_groups;

namespace {

constexpr int kWarps = 8;
constexpr int kSelThreads = 1024;

// Order-preserving key: larger float -> larger key; -0 == +0 (they compare equal).
__device__ __forceinline__ uint32_t fkey(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7FFFFFFFu) == 0) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exact top-k under (key desc, index asc) over entries [0, n) of key(j) (k <= n), by the C CTAs of
// a thread-block cluster (C = 1: one CTA), CTA rank r owning the contiguous range select_range
// gives it: emit(j, selected, pos) once for every j of its range, pos = the rank of j among the
// selected entries by index (valid when selected). Every thread of every CTA must call it.
//  1. MSB-first radix select of the k-th key tau, 8 bits a pass: each CTA counts its range
//     (per-warp aggregated shared atomics: lanes with the same digit add once), the cluster
//     barrier, then warp 0 of every CTA sums the C histograms through distributed shared memory
//     and finds the digit (each lane 8 bins, suffix sums by shuffles), the same in every CTA.
//     When every key is a bf16 value's (the low 16 bits of the f32 zero: the indexer's scores,
//     -inf and the pool's block maxima), the two low passes cannot split a digit and are skipped
//     (their digit is the keys' common low half).
//  2. Emission over contiguous ranges per warp (coalesced, 32 entries a step): counts (> tau,
//     == tau) per warp, bases from the earlier warps and the earlier CTAs, then ballots give each
//     lane its tie rank and output position in index order.
// The selected set and positions are those of the definition, whatever the decomposition.
__device__ __forceinline__ void select_range(int64_t n, int C, int rank, int64_t* lo, int64_t* hi) {
  const int64_t per = (n + C - 1) / C;
  *lo = min(n, int64_t(rank) * per);
  *hi = min(n, *lo + per);
}

template <typename KeyF, typename EmitF>
__device__ void cluster_select(int64_t n, int64_t k, KeyF key, EmitF emit) {
  cg::cluster_group cl = cg::this_cluster();
  const int C = int(cl.num_blocks()), rank = int(cl.block_rank());
  __shared__ uint32_t hist[256];
  __shared__ uint32_t s_prefix, s_mask, s_wide;
  __shared__ int64_t s_k;
  __shared__ uint32_t w_gt[32], w_eq[32], c_tot[2];
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5, nwarps = int(blockDim.x) >> 5;
  int64_t lo = 0, hi = 0;
  select_range(n, C, rank, &lo, &hi);
  if (tid == 0) {
    s_prefix = 0;
    s_mask = 0;
    s_k = k;
  }
  __syncthreads();
  if (k > 0) {
    bool wide = false;  // a key of this thread's with a non-bf16 low half
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      const uint32_t pre = s_prefix, msk = s_mask;
      // whole warps iterate together (the match below needs every lane)
      for (int64_t j0 = lo + int64_t(warp) * 32; j0 < hi; j0 += blockDim.x) {
        const int64_t j = j0 + lane;
        uint32_t digit = 256u;  // not a candidate
        if (j < hi) {
          const uint32_t u = key(j);
          if (shift == 24) wide |= (u & 0xFFFFu) != ((u >> 31) ? 0u : 0xFFFFu);
          if ((u & msk) == pre) digit = (u >> shift) & 0xFFu;
        }
        const unsigned same = __match_any_sync(kFull, digit);
        if (digit < 256u && lane == __ffs(same) - 1) atomicAdd(&hist[digit], uint32_t(__popc(same)));
      }
      if (shift == 24) {
        const int any_wide = __syncthreads_or(wide);
        if (tid == 0) s_wide = uint32_t(any_wide);
      }
      cl.sync();  // every CTA's histogram (and wide flag) complete and visible
      if (warp == 0) {
        // lane l: bins 8l .. 8l + 7 summed over the cluster; above = the count in higher bins
        uint32_t h[8], tot = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) h[i] = 0;
        for (int c = 0; c < C; ++c) {
          const uint32_t* hc = cl.map_shared_rank(hist, c);
#pragma unroll
          for (int i = 0; i < 8; ++i) h[i] += hc[8 * lane + i];
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) tot += h[i];
        uint32_t suf = tot;  // sum over lanes >= this one
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
          const uint32_t o = __shfl_down_sync(kFull, suf, off);
          if (lane + off < 32) suf += o;
        }
        const int64_t kk = s_k;
        int64_t above = int64_t(suf - tot);
        int found_d = -1;
        int64_t found_above = 0;
#pragma unroll
        for (int i = 7; i >= 0; --i) {
          const int d = 8 * lane + i;
          if (found_d < 0 && d >= 1 && above + int64_t(h[i]) >= kk) {
            found_d = d;
            found_above = above;
          }
          above += h[i];
        }
        const unsigned any = __ballot_sync(kFull, found_d >= 0);
        // the highest digit whose inclusive count from the top reaches kk; none: digit 0 with
        // every candidate of digits 1..255 above it (the sequential walk's result)
        const int src = any ? 31 - __clz(any) : 0;
        int d = __shfl_sync(kFull, found_d, src);
        int64_t ab = __shfl_sync(kFull, found_above, src);
        const uint32_t h0 = __shfl_sync(kFull, h[0], 0), all = __shfl_sync(kFull, suf, 0);
        if (!any) {
          d = 0;
          ab = int64_t(all - h0);
        }
        uint32_t wide_all = 0;
        if (shift == 16)
          for (int c = 0; c < C; ++c) wide_all |= *cl.map_shared_rank(&s_wide, c);
        if (lane == 0) {
          s_k = kk - ab;
          s_prefix = pre | (uint32_t(d) << shift);
          s_mask = msk | (0xFFu << shift);
          if (shift == 16 && !wide_all) {  // every key's low half is its sign's: the candidates' low half
            s_prefix |= (s_prefix >> 31) ? 0u : 0xFFFFu;
            s_mask = ~0u;
          }
        }
      }
      cl.sync();  // the digit is set, every CTA has read every histogram (zeroed next pass)
      if (s_mask == ~0u) break;
    }
  }
  const uint32_t tau = s_prefix;
  const int64_t take_eq = k > 0 ? s_k : 0;  // entries equal to tau to take, lowest index first
  const int64_t len = hi - lo, wper = ((len + nwarps - 1) / nwarps + 31) / 32 * 32;
  const int64_t wlo = min(hi, lo + int64_t(warp) * wper), whi = min(hi, wlo + wper);
  const unsigned lt = (1u << lane) - 1u;
  uint32_t n_gt = 0, n_eq = 0;
  if (k > 0)
    for (int64_t j0 = wlo; j0 < whi; j0 += 32) {
      const int64_t j = j0 + lane;
      const uint32_t u = j < whi ? key(j) : 0u;
      n_gt += __popc(__ballot_sync(kFull, j < whi && u > tau));
      n_eq += __popc(__ballot_sync(kFull, j < whi && u == tau));
    }
  if (lane == 0) {
    w_gt[warp] = n_gt;
    w_eq[warp] = n_eq;
  }
  __syncthreads();
  if (tid == 0) {
    uint32_t g = 0, e = 0;
    for (int w = 0; w < nwarps; ++w) {
      g += w_gt[w];
      e += w_eq[w];
    }
    c_tot[0] = g;
    c_tot[1] = e;
  }
  cl.sync();  // every CTA's totals visible
  // bases: the earlier CTAs', then the earlier warps' selected and tied entries, in index order
  int64_t eq_rank = 0, pos = 0;
  const auto add = [&](uint32_t g, uint32_t e) {
    const int64_t want = take_eq - eq_rank, et = want <= 0 ? 0 : want < int64_t(e) ? want : int64_t(e);
    pos += int64_t(g) + et;
    eq_rank += e;
  };
  for (int c = 0; c < rank; ++c) {
    const uint32_t* t = cl.map_shared_rank(c_tot, c);
    add(t[0], t[1]);
  }
  for (int w = 0; w < warp; ++w) add(w_gt[w], w_eq[w]);
  for (int64_t j0 = wlo; j0 < whi; j0 += 32) {
    const int64_t j = j0 + lane;
    bool gt = false, eq = false;
    if (j < whi && k > 0) {
      const uint32_t u = key(j);
      gt = u > tau;
      eq = u == tau;
    }
    const unsigned em = __ballot_sync(kFull, eq);
    const bool sel = gt || (eq && eq_rank + __popc(em & lt) < take_eq);
    const unsigned sm = __ballot_sync(kFull, sel);
    if (j < whi) emit(j, sel, pos + __popc(sm & lt));
    eq_rank += __popc(em);
    pos += __popc(sm);
  }
  cl.sync();  // the other CTAs have read this one's totals
}

// Warp per (row, entry). Fast path (ihd <= 256): every lane holds its <= 8 key values, decoded
// once for all IH heads (warp_lanes32 puts element i on lane i / 8 when ihd <= 256). Entries
// outside the pool of a pool-restricted row are not scored (-inf, as the mask makes them).
__global__ void index_scores_kernel(const uint16_t* iq, const uint16_t* wts, int IH, int ihd, const uint64_t* keys_base, int64_t key_bytes,
                                    const int64_t* n_vis, const int64_t* n_scored, float* I, int64_t ld, const uint8_t* mask, int64_t mask_ld,
                                    const int64_t* mask_len) {
  const int64_t t = blockIdx.y, j = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (j >= n_scored[t]) return;
  float score = -INFINITY;
  const bool pooled = !mask || (j < mask_len[t] && mask[t * mask_ld + j]);
  if (pooled && j < n_vis[t] && ihd <= 256) {
    const int lane = int(threadIdx.x & 31);
    const uint8_t* kb = reinterpret_cast<const uint8_t*>(keys_base[t]) + j * key_bytes;
    const uint16_t* qr = iq + t * int64_t(IH) * ihd;
    const int i0 = lane * 8;
    const int cnt = i0 < ihd ? (ihd - i0 < 8 ? ihd - i0 : 8) : 0;
    float kv[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int i = i0 + e;
      kv[e] = e < cnt ? round_bf16(fm::mul(e2m1_val(e2m1_code_at(kb, i)), e8m0_val(kb[ihd / 2 + i / 32]))) : 0.0f;
    }
    float tot = 0.0f;
    for (int h = 0; h < IH; ++h) {
      const uint16_t* qh = qr + int64_t(h) * ihd;
      float v = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (e < cnt) v = fm::add(v, fm::mul(bf(qh[i0 + e]), kv[e]));
      for (int off = 16; off >= 1; off >>= 1) v = fm::add(v, __shfl_xor_sync(kFull, v, off));
      const float db = smax(round_bf16(v), 0.0f);
      tot = fm::add(tot, round_bf16(fm::mul(db, bf(wts[t * IH + h]))));
    }
    score = round_bf16(tot);
  } else if (pooled && j < n_vis[t]) {
    const uint8_t* kb = reinterpret_cast<const uint8_t*>(keys_base[t]) + j * key_bytes;
    const uint16_t* qr = iq + t * int64_t(IH) * ihd;
    float tot = 0.0f;
    for (int h = 0; h < IH; ++h) {
      const uint16_t* qh = qr + int64_t(h) * ihd;
      const float d = warp_lanes32(ihd, [&](int64_t i) {
        const float kv = round_bf16(fm::mul(e2m1_val(e2m1_code_at(kb, i)), e8m0_val(kb[ihd / 2 + i / 32])));
        return fm::mul(bf(qh[i]), kv);
      });
      const float db = smax(round_bf16(d), 0.0f);
      tot = fm::add(tot, round_bf16(fm::mul(db, bf(wts[t * IH + h]))));
    }
    score = round_bf16(tot);
  }
  if ((threadIdx.x & 31) == 0) I[t * ld + j] = score;
}

// A cluster of gridDim.x CTAs per row (blockIdx.y): block score = max of its entries (the CPU's
// std::max chain), newest visible block pinned to +inf, top `keep` blocks (ties toward the lower
// block) unless -inf.
__global__ void __launch_bounds__(kSelThreads) candidate_pool_kernel(const float* I, int64_t ld, const int64_t* n_scored, const int64_t* n_vis,
                                                                     int64_t bs, int64_t keep_cfg, uint8_t* mask) {
  const int64_t t = blockIdx.y, n = n_scored[t], nb = (n + bs - 1) / bs;
  const float* Ir = I + t * ld;
  const int64_t pinned = n_vis[t] > 0 ? (n_vis[t] - 1) / bs : -1;
  auto score = [&](int64_t b) {
    if (b == pinned) return INFINITY;
    float s = -INFINITY;
    for (int64_t j = b * bs; j < n && j < (b + 1) * bs; ++j) s = smax(s, Ir[j]);
    return s;
  };
  const int64_t keep = keep_cfg < nb ? keep_cfg : nb;
  const uint32_t ninf = fkey(-INFINITY);
  cluster_select(
      nb, keep, [&](int64_t b) { return fkey(score(b)); },
      [&](int64_t b, bool sel, int64_t) {
        const uint8_t v = sel && fkey(score(b)) != ninf;
        for (int64_t j = b * bs; j < n && j < (b + 1) * bs; ++j) mask[t * ld + j] = v;
      });
}

// A cluster of gridDim.x CTAs per row (blockIdx.y): pool mask applied in place (-inf, each CTA
// its own range), exact top-k, ascending ids.
__global__ void __launch_bounds__(kSelThreads) topk_select_kernel(float* I, int64_t ld, const int64_t* n_scored, const int64_t* n_vis,
                                                                  const uint8_t* mask, int64_t mask_ld, const int64_t* mask_len, int64_t k_max,
                                                                  int32_t* sel, int32_t* count) {
  const int64_t t = blockIdx.y, n = n_scored[t], nv = n_vis[t];
  float* Ir = I + t * ld;
  if (mask) {
    int64_t lo = 0, hi = 0;
    select_range(n, int(gridDim.x), int(blockIdx.x), &lo, &hi);
    for (int64_t j = lo + threadIdx.x; j < hi; j += blockDim.x)
      if (j >= mask_len[t] || !mask[t * mask_ld + j]) Ir[j] = -INFINITY;
  }
  __syncthreads();
  const int64_t k = k_max < n ? k_max : n;
  cluster_select(
      n, k, [&](int64_t j) { return fkey(Ir[j]); },
      [&](int64_t j, bool s, int64_t pos) {
        if (s) sel[t * k_max + pos] = j >= nv ? -1 : int32_t(j);
      });
  if (threadIdx.x == 0 && blockIdx.x == 0) count[t] = int32_t(k > 0 ? k : 0);
}

// CTAs per row of a select over up to n entries: one per 4,096, at most the portable cluster size.
int select_ctas(int64_t n) { return int(std::min<int64_t>(8, std::max<int64_t>(1, n / 4096))); }

template <typename Kernel, typename... Args>
Status launch_select(Kernel kernel, const char* name, int64_t T, int64_t n, cudaStream_t st, Args... args) {
  const int C = select_ctas(n);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(C), unsigned(T));
  cfg.blockDim = dim3(kSelThreads);
  cfg.stream = st;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(C);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  FB_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, args...));
  FB_CUDA_LAUNCHED(name);
  return Status();
}

}  // namespace

Status index_scores(const uint16_t* iq, const uint16_t* wts, int64_t T, int IH, int ihd, const uint64_t* keys_base, int64_t key_bytes,
                    const int64_t* n_vis, const int64_t* n_scored, float* I, int64_t ld, cudaStream_t st, const uint8_t* mask, int64_t mask_ld,
                    const int64_t* mask_len) {
  FB_CHECK(ihd % 32 == 0);
  if (T == 0 || ld == 0) return Status();
  const dim3 grid(unsigned((ld + kWarps - 1) / kWarps), unsigned(T));
  return launch_op("index_scores_kernel", index_scores_kernel, grid, 32 * kWarps, 0, st, iq, wts, IH, ihd, keys_base, key_bytes, n_vis, n_scored, I,
                   ld, mask, mask_ld, mask_len);
}

Status candidate_pool(const float* I, int64_t T, int64_t ld, const int64_t* n_scored, const int64_t* n_vis, int64_t block, int64_t keep,
                      uint8_t* mask, cudaStream_t st) {
  if (T == 0 || ld == 0) return Status();
  FB_CHECK(T <= 65535) << "candidate pool rows " << T;
  return launch_select(candidate_pool_kernel, "candidate_pool_kernel", T, ld, st, I, ld, n_scored, n_vis, block, keep, mask);
}

Status topk_select(float* I, int64_t T, int64_t ld, const int64_t* n_scored, const int64_t* n_vis, const uint8_t* mask, int64_t mask_ld,
                   const int64_t* mask_len, int64_t k_max, int32_t* sel, int32_t* count, cudaStream_t st) {
  if (T == 0) return Status();
  FB_CHECK(T <= 65535) << "top-k rows " << T;
  return launch_select(topk_select_kernel, "topk_select_kernel", T, ld, st, I, ld, n_scored, n_vis, mask, mask_ld, mask_len, k_max, sel, count);
}

}  // namespace fb::cuda
