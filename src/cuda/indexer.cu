// Indexer of the CUDA executor (cpu::CpuStep::index_select): the bf16 score chain over FP4 index
// keys, the candidate block pool, and the top-k selection with exact ties toward the lower
// index. Selection is by rank under the total order (score desc, index asc), which is what the
// CPU's partial_sort yields; O(n^2) per row, correctness first (docs/numerics.md).
#include "base/check.h"
#include "cuda/device.h"
#include "cuda/numerics.cuh"
#include "cuda/ops.h"

namespace fb::cuda {

using namespace dev;

namespace {

constexpr int kWarps = 8;
constexpr int64_t kMaxSharedBytes = 48 * 1024;

__device__ __forceinline__ bool better(float a, int64_t ia, float b, int64_t ib) { return a > b || (a == b && ia < ib); }

// Warp per (row, entry).
__global__ void index_scores_kernel(const uint16_t* iq, const uint16_t* wts, int IH, int ihd, const uint64_t* keys_base, int64_t key_bytes,
                                    const int64_t* n_vis, const int64_t* n_scored, float* I, int64_t ld) {
  const int64_t t = blockIdx.y, j = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (j >= n_scored[t]) return;
  float score = -INFINITY;
  if (j < n_vis[t]) {
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

// Block per row; block scores in shared memory.
__global__ void candidate_pool_kernel(const float* I, int64_t ld, const int64_t* n_scored, const int64_t* n_vis, int64_t bs, int64_t keep_cfg,
                                      uint8_t* mask) {
  extern __shared__ float score[];
  const int64_t t = blockIdx.x, n = n_scored[t], nb = (n + bs - 1) / bs;
  const float* Ir = I + t * ld;
  for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) {
    float s = -INFINITY;
    for (int64_t j = b * bs; j < n && j < (b + 1) * bs; ++j) s = smax(s, Ir[j]);
    score[b] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0 && n_vis[t] > 0) score[(n_vis[t] - 1) / bs] = INFINITY;
  __syncthreads();
  const int64_t keep = keep_cfg < nb ? keep_cfg : nb;
  for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) {
    int64_t rank = 0;
    for (int64_t c = 0; c < nb; ++c) rank += better(score[c], c, score[b], b);
    const uint8_t sel = rank < keep && score[b] != -INFINITY;
    for (int64_t j = b * bs; j < n && j < (b + 1) * bs; ++j) mask[t * ld + j] = sel;
  }
}

// Block per row; selection flags in shared memory, then an in-order compaction.
__global__ void topk_select_kernel(float* I, int64_t ld, const int64_t* n_scored, const int64_t* n_vis, const uint8_t* mask, int64_t mask_ld,
                                   const int64_t* mask_len, int64_t k_max, int32_t* sel, int32_t* count) {
  extern __shared__ uint8_t flag[];
  const int64_t t = blockIdx.x, n = n_scored[t];
  float* Ir = I + t * ld;
  if (mask)
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      if (j >= mask_len[t] || !mask[t * mask_ld + j]) Ir[j] = -INFINITY;
  __syncthreads();
  const int64_t k = k_max < n ? k_max : n;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float v = Ir[j];
    int64_t rank = 0;
    for (int64_t i = 0; i < n && rank < k; ++i) rank += better(Ir[i], i, v, j);
    flag[j] = rank < k;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  int32_t c = 0;
  for (int64_t j = 0; j < n; ++j)
    if (flag[j]) sel[t * k_max + c++] = j >= n_vis[t] ? -1 : int32_t(j);
  count[t] = c;
}

}  // namespace

Status index_scores(const uint16_t* iq, const uint16_t* wts, int64_t T, int IH, int ihd, const uint64_t* keys_base, int64_t key_bytes,
                    const int64_t* n_vis, const int64_t* n_scored, float* I, int64_t ld, cudaStream_t st) {
  FB_CHECK(ihd % 32 == 0);
  if (T == 0 || ld == 0) return Status();
  const dim3 grid(unsigned((ld + kWarps - 1) / kWarps), unsigned(T));
  index_scores_kernel<<<grid, 32 * kWarps, 0, st>>>(iq, wts, IH, ihd, keys_base, key_bytes, n_vis, n_scored, I, ld);
  FB_CUDA_LAUNCHED("index_scores_kernel");
  return Status();
}

Status candidate_pool(const float* I, int64_t T, int64_t ld, const int64_t* n_scored, const int64_t* n_vis, int64_t block, int64_t keep,
                      uint8_t* mask, cudaStream_t st) {
  if (T == 0 || ld == 0) return Status();
  const int64_t smem = ((ld + block - 1) / block) * int64_t(sizeof(float));
  if (smem > kMaxSharedBytes)
    return FB_ERROR(kUnsupported) << "candidate pool over " << ld << " entries needs " << smem << " bytes of shared memory (limit "
                                  << kMaxSharedBytes << ")";
  candidate_pool_kernel<<<unsigned(T), 256, size_t(smem), st>>>(I, ld, n_scored, n_vis, block, keep, mask);
  FB_CUDA_LAUNCHED("candidate_pool_kernel");
  return Status();
}

Status topk_select(float* I, int64_t T, int64_t ld, const int64_t* n_scored, const int64_t* n_vis, const uint8_t* mask, int64_t mask_ld,
                   const int64_t* mask_len, int64_t k_max, int32_t* sel, int32_t* count, cudaStream_t st) {
  if (T == 0) return Status();
  if (ld > kMaxSharedBytes)
    return FB_ERROR(kUnsupported) << "top-k over " << ld << " scored entries exceeds this kernel's shared-memory limit of " << kMaxSharedBytes;
  topk_select_kernel<<<unsigned(T), 256, size_t(ld > 0 ? ld : 1), st>>>(I, ld, n_scored, n_vis, mask, mask_ld, mask_len, k_max, sel, count);
  FB_CUDA_LAUNCHED("topk_select_kernel");
  return Status();
}

}  // namespace fb::cuda
