// Indexer of the CUDA executor (cpu::CpuStep::index_select): the bf16 score chain over FP4 index
// keys, the candidate block pool, and the top-k selection with exact ties toward the lower
// index. Selection is the top k under the total order (score desc, index asc), which is what the
// CPU's partial_sort yields, found by an MSB-first radix select on order-preserving keys (4 passes
// of 8 bits) plus an in-order block scan for the ties: O(n) per row, no size limit
// (docs/numerics.md). NaN scores have no defined place in that order (neither the CPU's).
#include "base/check.h"
#include "cuda/device.h"
#include "cuda/numerics.cuh"
#include "cuda/ops.h"

namespace fb::cuda {

using namespace dev;

namespace {

constexpr int kWarps = 8;
constexpr int kSelThreads = 1024;

// Order-preserving key: larger float -> larger key; -0 == +0 (they compare equal).
__device__ __forceinline__ uint32_t fkey(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7FFFFFFFu) == 0) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Block-wide exact top-k under (key desc, index asc) over entries [0, n) of key(j) (k <= n):
// emit(j, selected, pos) once for every j, pos = the rank of j among the selected entries by
// index (valid when selected). Every thread of the block must call it.
//  1. MSB-first radix select of the k-th key tau, 8 bits a pass: per-warp aggregated shared
//     atomics (lanes with the same digit add once: the top digits of similar scores are few, and
//     per-lane atomics on them serialised), then warp 0 finds the digit in parallel (each lane 8
//     bins, suffix sums by shuffles) instead of one thread walking 256 bins.
//  2. Emission over contiguous ranges per thread: count (> tau, == tau) in its range, block scans
//     of those counts give each thread its first tie rank and first output position, and a second
//     walk of the range emits in index order (two reads of each key instead of a block-wide
//     ballot/scan round with four barriers per blockDim entries).
// The selected set and positions are those of the definition, whatever the decomposition.
__device__ __forceinline__ uint32_t warp_incl_scan(uint32_t v, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const uint32_t o = __shfl_up_sync(kFull, v, off);
    if (lane >= off) v += o;
  }
  return v;
}

// Exclusive prefix over the block of one uint32 per thread (every thread calls it); total out.
__device__ __forceinline__ uint32_t block_excl_scan(uint32_t v, uint32_t* warp_tot, uint32_t* total) {
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5, nw = int(blockDim.x) >> 5;
  const uint32_t incl = warp_incl_scan(v, lane);
  if (lane == 31) warp_tot[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const uint32_t c = lane < nw ? warp_tot[lane] : 0u;
    const uint32_t wi = warp_incl_scan(c, lane);
    if (lane < nw) warp_tot[lane] = wi - c;
    if (lane == 31) warp_tot[32] = wi;
  }
  __syncthreads();
  const uint32_t r = warp_tot[warp] + incl - v;
  *total = warp_tot[32];
  __syncthreads();  // warp_tot is reused by the next scan
  return r;
}

template <typename KeyF, typename EmitF>
__device__ void block_select(int64_t n, int64_t k, KeyF key, EmitF emit) {
  __shared__ uint32_t hist[256];
  __shared__ uint32_t s_prefix, s_mask;
  __shared__ int64_t s_k;
  __shared__ uint32_t warp_tot[33];
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  if (tid == 0) {
    s_prefix = 0;
    s_mask = 0;
    s_k = k;
  }
  __syncthreads();
  if (k > 0) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      const uint32_t pre = s_prefix, msk = s_mask;
      // whole warps iterate together (the match below needs every lane)
      for (int64_t j0 = int64_t(warp) * 32; j0 < n; j0 += blockDim.x) {
        const int64_t j = j0 + lane;
        uint32_t digit = 256u;  // not a candidate
        if (j < n) {
          const uint32_t u = key(j);
          if ((u & msk) == pre) digit = (u >> shift) & 0xFFu;
        }
        const unsigned same = __match_any_sync(kFull, digit);
        if (digit < 256u && lane == __ffs(same) - 1) atomicAdd(&hist[digit], uint32_t(__popc(same)));
      }
      __syncthreads();
      if (warp == 0) {
        // lane l: bins 8l .. 8l + 7; above = the count of candidates in higher bins
        uint32_t h[8], tot = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          h[i] = hist[8 * lane + i];
          tot += h[i];
        }
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
        if (lane == 0) {
          s_k = kk - ab;
          s_prefix = pre | (uint32_t(d) << shift);
          s_mask = msk | (0xFFu << shift);
        }
      }
      __syncthreads();
    }
  }
  const uint32_t tau = s_prefix;
  const int64_t take_eq = k > 0 ? s_k : 0;  // entries equal to tau to take, lowest index first
  const int64_t per = (n + int64_t(blockDim.x) - 1) / int64_t(blockDim.x);
  const int64_t j_lo = int64_t(tid) * per < n ? int64_t(tid) * per : n, j_hi = j_lo + per < n ? j_lo + per : n;
  uint32_t n_gt = 0, n_eq = 0;
  if (k > 0)
    for (int64_t j = j_lo; j < j_hi; ++j) {
      const uint32_t u = key(j);
      n_gt += u > tau;
      n_eq += u == tau;
    }
  uint32_t total = 0;
  const int64_t eq_base = block_excl_scan(n_eq, warp_tot, &total);
  const int64_t want_eq = take_eq - eq_base, eq_take = want_eq <= 0 ? 0 : want_eq < int64_t(n_eq) ? want_eq : int64_t(n_eq);
  const int64_t out_base = block_excl_scan(uint32_t(n_gt + eq_take), warp_tot, &total);
  int64_t eq_rank = eq_base, pos = out_base;
  for (int64_t j = j_lo; j < j_hi; ++j) {
    bool sel = false;
    if (k > 0) {
      const uint32_t u = key(j);
      const bool eq = u == tau;
      sel = u > tau || (eq && eq_rank < take_eq);
      eq_rank += eq;
    }
    emit(j, sel, pos);
    pos += sel;
  }
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

// Block per row: block score = max of its entries (the CPU's std::max chain), newest visible
// block pinned to +inf, top `keep` blocks (ties toward the lower block) unless -inf.
__global__ void __launch_bounds__(kSelThreads) candidate_pool_kernel(const float* I, int64_t ld, const int64_t* n_scored, const int64_t* n_vis,
                                                                     int64_t bs, int64_t keep_cfg, uint8_t* mask) {
  const int64_t t = blockIdx.x, n = n_scored[t], nb = (n + bs - 1) / bs;
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
  block_select(
      nb, keep, [&](int64_t b) { return fkey(score(b)); },
      [&](int64_t b, bool sel, int64_t) {
        const uint8_t v = sel && fkey(score(b)) != ninf;
        for (int64_t j = b * bs; j < n && j < (b + 1) * bs; ++j) mask[t * ld + j] = v;
      });
}

// Block per row: pool mask applied in place (-inf), exact top-k, ascending ids.
__global__ void __launch_bounds__(kSelThreads) topk_select_kernel(float* I, int64_t ld, const int64_t* n_scored, const int64_t* n_vis,
                                                                  const uint8_t* mask, int64_t mask_ld, const int64_t* mask_len, int64_t k_max,
                                                                  int32_t* sel, int32_t* count) {
  const int64_t t = blockIdx.x, n = n_scored[t], nv = n_vis[t];
  float* Ir = I + t * ld;
  if (mask)
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      if (j >= mask_len[t] || !mask[t * mask_ld + j]) Ir[j] = -INFINITY;
  __syncthreads();
  const int64_t k = k_max < n ? k_max : n;
  block_select(
      n, k, [&](int64_t j) { return fkey(Ir[j]); },
      [&](int64_t j, bool s, int64_t pos) {
        if (s) sel[t * k_max + pos] = j >= nv ? -1 : int32_t(j);
      });
  if (threadIdx.x == 0) count[t] = int32_t(k > 0 ? k : 0);
}

}  // namespace

Status index_scores(const uint16_t* iq, const uint16_t* wts, int64_t T, int IH, int ihd, const uint64_t* keys_base, int64_t key_bytes,
                    const int64_t* n_vis, const int64_t* n_scored, float* I, int64_t ld, cudaStream_t st, const uint8_t* mask, int64_t mask_ld,
                    const int64_t* mask_len) {
  FB_CHECK(ihd % 32 == 0);
  if (T == 0 || ld == 0) return Status();
  const dim3 grid(unsigned((ld + kWarps - 1) / kWarps), unsigned(T));
  index_scores_kernel<<<grid, 32 * kWarps, 0, st>>>(iq, wts, IH, ihd, keys_base, key_bytes, n_vis, n_scored, I, ld, mask, mask_ld, mask_len);
  FB_CUDA_LAUNCHED("index_scores_kernel");
  return Status();
}

Status candidate_pool(const float* I, int64_t T, int64_t ld, const int64_t* n_scored, const int64_t* n_vis, int64_t block, int64_t keep,
                      uint8_t* mask, cudaStream_t st) {
  if (T == 0 || ld == 0) return Status();
  candidate_pool_kernel<<<unsigned(T), kSelThreads, 0, st>>>(I, ld, n_scored, n_vis, block, keep, mask);
  FB_CUDA_LAUNCHED("candidate_pool_kernel");
  return Status();
}

Status topk_select(float* I, int64_t T, int64_t ld, const int64_t* n_scored, const int64_t* n_vis, const uint8_t* mask, int64_t mask_ld,
                   const int64_t* mask_len, int64_t k_max, int32_t* sel, int32_t* count, cudaStream_t st) {
  if (T == 0) return Status();
  topk_select_kernel<<<unsigned(T), kSelThreads, 0, st>>>(I, ld, n_scored, n_vis, mask, mask_ld, mask_len, k_max, sel, count);
  FB_CUDA_LAUNCHED("topk_select_kernel");
  return Status();
}

}  // namespace fb::cuda
