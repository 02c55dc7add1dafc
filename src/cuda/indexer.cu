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
// emit(j, selected, pos) for every j in index order, pos = the rank of j among the selected
// entries by index (valid when selected). Every thread of the block must call it.
template <typename KeyF, typename EmitF>
__device__ void block_select(int64_t n, int64_t k, KeyF key, EmitF emit) {
  __shared__ uint32_t hist[256];
  __shared__ uint32_t s_prefix, s_mask;
  __shared__ int64_t s_k, s_eq_base, s_out_base;
  __shared__ uint32_t w_eq[kSelThreads / 32], w_sel[kSelThreads / 32];
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5, nw = int(blockDim.x) >> 5;
  if (tid == 0) {
    s_prefix = 0;
    s_mask = 0;
    s_k = k;
    s_eq_base = 0;
    s_out_base = 0;
  }
  __syncthreads();
  if (k > 0) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
      __syncthreads();
      const uint32_t pre = s_prefix, msk = s_mask;
      for (int64_t j = tid; j < n; j += blockDim.x) {
        const uint32_t u = key(j);
        if ((u & msk) == pre) atomicAdd(&hist[(u >> shift) & 0xFFu], 1u);
      }
      __syncthreads();
      if (tid == 0) {
        const int64_t kk = s_k;
        int64_t above = 0;
        int d = 255;
        for (; d > 0; --d) {
          if (above + int64_t(hist[d]) >= kk) break;
          above += hist[d];
        }
        s_k = kk - above;
        s_prefix = pre | (uint32_t(d) << shift);
        s_mask = msk | (0xFFu << shift);
      }
      __syncthreads();
    }
  }
  const uint32_t tau = s_prefix;
  const int64_t take_eq = k > 0 ? s_k : 0;  // entries equal to tau to take, lowest index first
  const unsigned lt = (1u << lane) - 1u;
  for (int64_t base = 0; base < n; base += blockDim.x) {
    const int64_t j = base + tid;
    const uint32_t u = j < n ? key(j) : 0u;
    const bool in = j < n && k > 0;
    const bool gt = in && u > tau, eq = in && u == tau;
    const unsigned beq = __ballot_sync(kFull, eq);
    if (lane == 0) w_eq[warp] = __popc(beq);
    __syncthreads();
    if (warp == 0) {  // exclusive scan of the warp counts
      const uint32_t c = lane < nw ? w_eq[lane] : 0u;
      uint32_t incl = c;
      for (int off = 1; off < 32; off <<= 1) {
        const uint32_t o = __shfl_up_sync(kFull, incl, off);
        if (lane >= off) incl += o;
      }
      if (lane < nw) w_eq[lane] = incl - c;
    }
    __syncthreads();
    const int64_t eq_rank = s_eq_base + w_eq[warp] + __popc(beq & lt);
    const bool sel = gt || (eq && eq_rank < take_eq);
    const unsigned bsel = __ballot_sync(kFull, sel);
    if (lane == 0) w_sel[warp] = __popc(bsel);
    __syncthreads();
    uint32_t eq_total = 0, sel_total = 0;
    if (warp == 0) {
      const uint32_t c = lane < nw ? w_sel[lane] : 0u;
      uint32_t incl = c;
      for (int off = 1; off < 32; off <<= 1) {
        const uint32_t o = __shfl_up_sync(kFull, incl, off);
        if (lane >= off) incl += o;
      }
      if (lane < nw) w_sel[lane] = incl - c;
      sel_total = __shfl_sync(kFull, incl, 31);
    }
    if (tid == 0) eq_total = w_eq[nw - 1];  // exclusive prefix of the last warp ...
    __syncthreads();
    const int64_t pos = s_out_base + w_sel[warp] + __popc(bsel & lt);
    if (j < n) emit(j, sel, pos);
    if (tid == nw * 32 - 1) eq_total = w_eq[warp] + __popc(beq);  // ... plus its own count
    __syncthreads();
    if (tid == nw * 32 - 1) s_eq_base += eq_total;
    if (tid == 0) s_out_base += sel_total;
    __syncthreads();
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
