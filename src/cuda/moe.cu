// MoE, Engram, the ratio-2 compressor pooling and the DSpark draft head of the CUDA executor.
// Mirrors cpu::route / swiglu_row, the f32 fold of CpuLayerOps::moe, CpuStep::engram,
// CpuStep::compress (pooling) and CpuDraftStep::markov_chain.
#include <algorithm>

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
constexpr int kMaxTopK = 32;

// Scores: warp per (row, expert), lanes32 dot (16-byte loads when aligned), then the CPU's
// score / biased formulas. Selection: block per row, rank-based top-k (ties toward the lower id).
__global__ void route_scores_kernel(const uint16_t* u, int64_t T, int64_t D, const uint16_t* W, int E, const float* bias, const float* bias_vl,
                                    const uint8_t* image, float gate_temp, bool vec, float* score, float* biased) {
  pdl_trigger();  // PDL (pdl.cuh): plain stream order unless launched with the attribute
  pdl_wait();
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (w >= T * E) return;  // whole warps
  const int64_t t = w / E;
  const int e = int(w % E);
  const uint16_t* ur = u + t * D;
  const uint16_t* wr = W + int64_t(e) * D;
  const float* b = (image && image[t] && bias_vl) ? bias_vl : bias;
  float z = vec ? warp_dot_bf16_vec(ur, wr, D) : warp_lanes32(D, [&](int64_t k) { return fm::mul(bf(ur[k]), bf(wr[k])); });
  z = fm::div(z, gate_temp);
  const float s = fm::sqrt_rn(fm::softplus(z));
  if ((threadIdx.x & 31) == 0) {
    score[w] = s;
    biased[w] = fm::add(s, b[e]);
  }
}

// The same scores from dots computed elsewhere (route_from_dots: a tensor-core matmul of a
// prefill step): z [T, E] f32 in `biased`, read and overwritten element by element.
__global__ void route_scores_from_dots_kernel(int64_t T, int E, const float* bias, const float* bias_vl, const uint8_t* image, float gate_temp,
                                              float* score, float* biased) {
  pdl_trigger();
  pdl_wait();
  const int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (w >= T * E) return;
  const int64_t t = w / E;
  const int e = int(w % E);
  const float* b = (image && image[t] && bias_vl) ? bias_vl : bias;
  const float s = fm::sqrt_rn(fm::softplus(fm::div(biased[w], gate_temp)));
  score[w] = s;
  biased[w] = fm::add(s, b[e]);
}

__global__ void route_kernel(const float* score_g, const float* biased_g, int E, int top_k, bool norm_topk, float route_scale, int32_t* experts,
                             float* weights) {
  pdl_trigger();  // PDL (pdl.cuh): plain stream order unless launched with the attribute
  pdl_wait();
  extern __shared__ float sm[];
  float* score = sm;
  float* biased = sm + E;
  __shared__ int32_t pick[kMaxTopK];
  const int64_t t = blockIdx.x;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    score[e] = score_g[t * E + e];
    biased[e] = biased_g[t * E + e];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int rank = 0;
    for (int i = 0; i < E; ++i) rank += biased[i] > biased[e] || (biased[i] == biased[e] && i < e);
    if (rank < top_k) pick[rank] = e;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  float w[kMaxTopK];
  float sum = 0.0f;
  for (int k = 0; k < top_k; ++k) {
    w[k] = score[pick[k]];
    sum = fm::add(sum, w[k]);
  }
  if (norm_topk && top_k > 1)
    for (int k = 0; k < top_k; ++k) w[k] = fm::div(w[k], fm::add(sum, 1e-20f));
  for (int k = 0; k < top_k; ++k) w[k] = fm::mul(w[k], route_scale);
  int32_t ids[kMaxTopK];
  for (int k = 0; k < top_k; ++k) ids[k] = pick[k];
  // ascending expert id: the order of the f32 fold
  for (int i = 1; i < top_k; ++i)
    for (int j = i; j > 0 && ids[j - 1] > ids[j]; --j) {
      const int32_t ti = ids[j];
      ids[j] = ids[j - 1];
      ids[j - 1] = ti;
      const float tw = w[j];
      w[j] = w[j - 1];
      w[j - 1] = tw;
    }
  for (int k = 0; k < top_k; ++k) {
    experts[t * top_k + k] = ids[k];
    weights[t * top_k + k] = w[k];
  }
}

__global__ void swiglu_kernel(const uint16_t* a, const uint16_t* b, int64_t M, int64_t n, float limit, const float* weight, uint16_t* h) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M * n) return;
  float av = bf(a[i]), bv = bf(b[i]);
  if (limit > 0.0f) {
    bv = smin(smax(bv, -limit), limit);
    av = smin(av, limit);
  }
  float v = fm::mul(fm::silu(av), bv);
  if (weight) v = fm::mul(v, weight[i / n]);
  h[i] = to_bf(v);
}

// swiglu + act_quant: warp per (row, 32-block), lane = element; h = bf16(swiglu) exactly as
// swiglu_kernel, then the block's amax (smax from +0, any order), scale and e4m3 codes exactly as
// act_quant (cuda/gemm.cu act_quant_warp_kernel). h itself is not stored.
__global__ void swiglu_quant_kernel(const uint16_t* a, const uint16_t* b, int64_t M, int64_t n, float limit, const float* weight, uint8_t* codes,
                                    float* scales) {
  const int64_t NB = n / 32, w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (w >= M * NB) return;  // whole warps
  const int lane = int(threadIdx.x & 31);
  const int64_t m = w / NB, blk = w % NB, i = m * n + blk * 32 + lane;
  float av = bf(a[i]), bv = bf(b[i]);
  if (limit > 0.0f) {
    bv = smin(smax(bv, -limit), limit);
    av = smin(av, limit);
  }
  float v = fm::mul(fm::silu(av), bv);
  if (weight) v = fm::mul(v, weight[m]);
  const float h = bf(to_bf(v));
  float amax = smax(0.0f, fabsf(h));
  for (int off = 16; off >= 1; off >>= 1) amax = smax(amax, __shfl_xor_sync(kFull, amax, off));
  const float s = fp8_block_scale(amax);
  if (lane == 0) scales[m * NB + blk] = s;
  codes[i] = e4m3_code(smin(smax(fm::div(h, s), -448.0f), 448.0f));
}

__global__ void moe_combine_kernel(const uint16_t* ye, int K, const uint16_t* ys, int64_t T, int64_t D, uint16_t* y) {
  pdl_trigger();  // PDL (pdl.cuh): plain stream order unless launched with the attribute
  pdl_wait();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * D) return;
  const int64_t t = i / D, d = i % D;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) acc = fm::add(acc, bf(ye[(t * K + k) * D + d]));
  y[i] = to_bf(fm::add(acc, bf(ys[i])));
}

__global__ void engram_gather_kernel(const uint8_t* table, const uint8_t* table_scale, const int64_t* hashes, int64_t ld_hash, int64_t T,
                                     int n_cols, int hd, uint16_t* E) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * n_cols * hd) return;
  const int64_t t = i / (int64_t(n_cols) * hd), col = (i / hd) % n_cols, k = i % hd;
  const int64_t row = hashes[t * ld_hash + col];
  E[i] = to_bf(fm::mul(e4m3_val(table[row * hd + k]), e8m0_val(table_scale[row * (hd / 32) + k / 32])));
}

// Block per (row, stream): three lanes32 sums (warps 0-2), then the gated update.
__global__ void engram_gate_kernel(uint16_t* X, const uint16_t* kv, const uint16_t* q_w, const uint16_t* k_w, int hc, int64_t D, float eps,
                                   float inv_sqrt_d, const uint8_t* image) {
  __shared__ float sums[3];
  const int64_t t = blockIdx.x / hc;
  const int i = int(blockIdx.x % hc);
  uint16_t* xi = X + (t * hc + i) * D;
  const uint16_t* K = kv + t * (1 + hc) * D + int64_t(i) * D;
  const uint16_t* V = kv + t * (1 + hc) * D + int64_t(hc) * D;
  const uint16_t* qw = q_w + int64_t(i) * D;
  const uint16_t* kw = k_w + int64_t(i) * D;
  const int warp = int(threadIdx.x / 32);
  float v = 0.0f;
  if (warp == 0) v = warp_lanes32(D, [&](int64_t d) { return fm::mul(bf(xi[d]), bf(xi[d])); });
  if (warp == 1) v = warp_lanes32(D, [&](int64_t d) { return fm::mul(bf(K[d]), bf(K[d])); });
  if (warp == 2)
    v = warp_lanes32(D, [&](int64_t d) {
      const float omega = fm::mul(bf(qw[d]), bf(kw[d]));
      return fm::mul(fm::mul(bf(xi[d]), omega), bf(K[d]));
    });
  if (warp < 3 && (threadIdx.x & 31) == 0) sums[warp] = v;
  __syncthreads();
  const float hh = sums[0], kk = sums[1];
  float dot = sums[2];
  const float rho = fm::mul(fm::rsqrt(fm::add(fm::div(hh, float(D)), eps)), fm::rsqrt(fm::add(fm::div(kk, float(D)), eps)));
  dot = fm::mul(fm::mul(dot, rho), inv_sqrt_d);
  float g = fm::sigmoid(copysignf(fm::sqrt_rn(smax(fabsf(dot), 1e-6f)), dot));
  if (image && image[t]) g = 0.0f;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) xi[d] = to_bf(fm::add(bf(xi[d]), fm::mul(g, bf(V[d]))));
}

__global__ void ratio2_pool_kernel(const uint64_t* even, const uint64_t* odd, int64_t n, int64_t hd, uint16_t* pooled) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * hd) return;
  const int64_t r = i / hd, k = i % hd;
  const float* s0 = reinterpret_cast<const float*>(even[r]);
  const float* s1 = reinterpret_cast<const float*>(odd[r]);
  const float k0 = s0[k], g0 = s0[hd + k], k1 = s1[k], g1 = s1[hd + k];
  const float mx = smax(g0, g1);
  const float ea = fm::exp(fm::add(g0, -mx)), eb = fm::exp(fm::add(g1, -mx));
  const float sum = fm::add(ea, eb);
  pooled[i] = to_bf(fm::add(fm::mul(k0, fm::div(ea, sum)), fm::mul(k1, fm::div(eb, sum))));
}

// vec: r % 8 == 0 and 16-byte aligned rows: the same lanes32 dot with 16-byte loads
// (warp_dot_bf16_vec; fm::mul is commutative bit for bit).
__global__ void markov_bias_kernel(float* lk, int64_t V, int r, const uint16_t* EM, const uint16_t* HM, const int32_t* prev_id, bool vec) {
  const int64_t v = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  if (v >= V) return;
  const uint16_t* e = EM + int64_t(*prev_id) * r;
  const uint16_t* hm = HM + v * r;
  const float b = vec ? warp_dot_bf16_vec(e, hm, r) : warp_lanes32(r, [&](int64_t j) { return fm::mul(bf(e[j]), bf(hm[j])); });
  if ((threadIdx.x & 31) == 0) lk[v] = fm::add(lk[v], b);
}

// First index of the maximum (the CPU's `if (x[v] > x[best])` scan from best = 0).
__global__ void argmax_kernel(const float* x, int64_t n, int32_t* out) {
  __shared__ float bv[1024];
  __shared__ int64_t bi[1024];
  float v = 0.0f;
  int64_t idx = -1;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float xi = x[i];
    if (xi != xi) continue;
    if (idx < 0 || xi > v) {
      v = xi;
      idx = i;
    }
  }
  bv[threadIdx.x] = v;
  bi[threadIdx.x] = idx;
  __syncthreads();
  for (int off = int(blockDim.x) / 2; off > 0; off >>= 1) {
    if (int(threadIdx.x) < off) {
      const float ov = bv[threadIdx.x + off];
      const int64_t oi = bi[threadIdx.x + off];
      const int64_t mi = bi[threadIdx.x];
      if (oi >= 0 && (mi < 0 || ov > bv[threadIdx.x] || (ov == bv[threadIdx.x] && oi < mi))) {
        bv[threadIdx.x] = ov;
        bi[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = (n == 0 || x[0] != x[0] || bi[0] < 0) ? 0 : int32_t(bi[0]);
}

__global__ void confidence_kernel(const uint16_t* hH, int64_t D, const uint16_t* EM, int r, const int32_t* prev_id, const uint16_t* wc,
                                  float* out) {
  const uint16_t* e = EM + int64_t(*prev_id) * r;
  const float z = warp_lanes32(D + r, [&](int64_t i) {
    const float a = i < D ? bf(hH[i]) : bf(e[i - D]);
    return fm::mul(a, bf(wc[i]));
  });
  if (threadIdx.x == 0) *out = z;
}

// One token of the Markov chain in one launch (markov_step): the bias of markov_bias_kernel, the
// argmax of argmax_kernel and the confidence of confidence_kernel, the same operations in the same
// order per value (so the same bits): each warp takes kMarkovRows vocabulary rows at a time, their
// 16-byte loads issued together (lane L holds elements [L*8 + 256c, +8) of chunk c, as
// warp_dot_bf16_vec), e(prev) in registers once. The first index of the maximum is found as
// (value, index) pairs: per lane, per CTA, then by the last CTA to arrive over the CTAs' pairs (the
// maximum with the lower index on ties is order-free, so the grid's shape changes no result).
constexpr int kMarkovRows = 8;
constexpr int kMarkovThreads = 256;

__device__ __forceinline__ void argmax_merge(float& v, int64_t& i, float ov, int64_t oi) {
  if (oi >= 0 && (i < 0 || ov > v || (ov == v && oi < i))) {
    v = ov;
    i = oi;
  }
}

template <int NC>
__global__ void __launch_bounds__(kMarkovThreads) markov_step_kernel(float* lk, int64_t V, int r, const uint16_t* EM, const uint16_t* HM,
                                                                     const int32_t* prev_id, const uint16_t* hH, int64_t D, const uint16_t* wc,
                                                                     int32_t* next_id, float* conf, float* part_v, int64_t* part_i,
                                                                     unsigned* counter) {
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5), nwarp = kMarkovThreads / 32;
  const int32_t prev = *prev_id;
  const uint16_t* e = EM + int64_t(prev) * r;
  uint4 ev[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) ev[c] = lane * 8 + 256 * c < r ? __ldg(reinterpret_cast<const uint4*>(e + lane * 8 + 256 * c)) : make_uint4(0, 0, 0, 0);
  float best = 0.0f;
  int64_t best_i = -1;
  const int64_t gw = int64_t(blockIdx.x) * nwarp + warp, stride = int64_t(gridDim.x) * nwarp * kMarkovRows;
  for (int64_t v0 = gw * kMarkovRows; v0 < V; v0 += stride) {
    uint4 h[kMarkovRows][NC];
#pragma unroll
    for (int j = 0; j < kMarkovRows; ++j)
#pragma unroll
      for (int c = 0; c < NC; ++c)
        h[j][c] = v0 + j < V && lane * 8 + 256 * c < r ? __ldg(reinterpret_cast<const uint4*>(HM + (v0 + j) * r + lane * 8 + 256 * c)) : make_uint4(0, 0, 0, 0);
    const float old = lane < kMarkovRows && v0 + lane < V ? lk[v0 + lane] : 0.0f;
    float mine = 0.0f;
#pragma unroll
    for (int j = 0; j < kMarkovRows; ++j) {
      float s = 0.0f;
#pragma unroll
      for (int c = 0; c < NC; ++c)
        if (lane * 8 + 256 * c < r) bf16x8_acc(s, ev[c], h[j][c]);
      for (int off = 16; off >= 1; off >>= 1) s = fm::add(s, __shfl_xor_sync(kFull, s, off));
      if (lane == j) mine = s;
    }
    if (lane < kMarkovRows && v0 + lane < V) {
      const float x = fm::add(old, mine);
      lk[v0 + lane] = x;
      if (x == x) argmax_merge(best, best_i, x, v0 + lane);
    }
  }
  for (int off = 16; off >= 1; off >>= 1) {
    const float ov = __shfl_xor_sync(kFull, best, off);
    const int64_t oi = __shfl_xor_sync(kFull, best_i, off);
    argmax_merge(best, best_i, ov, oi);
  }
  __shared__ float sv[kMarkovThreads / 32];
  __shared__ int64_t si[kMarkovThreads / 32];
  __shared__ bool last;
  if (lane == 0) {
    sv[warp] = best;
    si[warp] = best_i;
  }
  __threadfence();  // this thread's lk stores before the arrival count (the last CTA reads lk[0])
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < nwarp; ++w) argmax_merge(best, best_i, sv[w], si[w]);
    part_v[blockIdx.x] = best;
    part_i[blockIdx.x] = best_i;
    __threadfence();
    last = atomicAdd(counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (warp == 0) {
    float v = 0.0f;
    int64_t i = -1;
    for (int b = lane; b < int(gridDim.x); b += 32) argmax_merge(v, i, __ldcg(part_v + b), __ldcg(part_i + b));
    for (int off = 16; off >= 1; off >>= 1) {
      const float ov = __shfl_xor_sync(kFull, v, off);
      const int64_t oi = __shfl_xor_sync(kFull, i, off);
      argmax_merge(v, i, ov, oi);
    }
    if (lane == 0) {
      const float x0 = V > 0 ? __ldcg(lk) : 0.0f;
      *next_id = (V == 0 || x0 != x0 || i < 0) ? 0 : int32_t(i);
      *counter = 0;  // for the next launch on the stream
    }
  } else if (warp == 1) {  // confidence_kernel's dot
    const float z = warp_lanes32(D + r, [&](int64_t k) {
      const float a = k < D ? bf(hH[k]) : bf(e[k - D]);
      return fm::mul(a, bf(wc[k]));
    });
    if (lane == 0) *conf = z;
  }
}

// model::logits_argmax of each row (one CTA a row): the first index of the largest non-NaN value,
// 0 when all are NaN. Per thread a strided scan (strict >: its first), then the (value, index)
// pairs merged with the lower index on ties: the same result as the sequential scan.
__global__ void rows_argmax_kernel(const float* x, int64_t V, int32_t* out) {
  const float* r = x + int64_t(blockIdx.x) * V;
  float v = 0.0f;
  int64_t idx = -1;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    const float xi = r[i];
    if (xi == xi && (idx < 0 || xi > v)) {
      v = xi;
      idx = i;
    }
  }
  for (int off = 16; off >= 1; off >>= 1) {
    const float ov = __shfl_xor_sync(kFull, v, off);
    const int64_t oi = __shfl_xor_sync(kFull, idx, off);
    argmax_merge(v, idx, ov, oi);
  }
  __shared__ float sv[32];
  __shared__ int64_t si[32];
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31), nw = int(blockDim.x >> 5);
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = idx;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < nw; ++w) argmax_merge(v, idx, sv[w], si[w]);
    out[blockIdx.x] = idx < 0 ? 0 : int32_t(idx);
  }
}

}  // namespace

Status route(const uint16_t* u, int64_t T, int64_t D, const uint16_t* gate_w, int E, const float* bias, const float* bias_vl,
             const uint8_t* image, int top_k, float gate_temp, bool norm_topk, float route_scale, int32_t* experts, float* weights,
             float* scratch, cudaStream_t st) {
  FB_CHECK(top_k >= 1 && top_k <= kMaxTopK && top_k <= E && scratch) << "top_k " << top_k << " of " << E;
  if (T == 0) return Status();
  const bool vec = D % 8 == 0 && (reinterpret_cast<uintptr_t>(u) & 15) == 0 && (reinterpret_cast<uintptr_t>(gate_w) & 15) == 0;
  float* score = scratch;
  float* biased = scratch + T * E;
  const bool pdl = fast_pdl();
  FB_CUDA_TRY(launch_pdl(pdl, route_scores_kernel, dim3(blocks_for(T * E, 8)), dim3(256), 0, st, u, T, D, gate_w, E, bias, bias_vl, image, gate_temp,
                         vec, score, biased));
  FB_CUDA_LAUNCHED("route_scores_kernel");
  FB_CUDA_TRY(launch_pdl(pdl, route_kernel, dim3(unsigned(T)), dim3(256), size_t(2 * E) * sizeof(float), st, score, biased, E, top_k, norm_topk,
                         route_scale, experts, weights));
  FB_CUDA_LAUNCHED("route_kernel");
  return Status();
}

Status route_from_dots(int64_t T, int E, const float* bias, const float* bias_vl, const uint8_t* image, int top_k, float gate_temp, bool norm_topk,
                       float route_scale, int32_t* experts, float* weights, float* scratch, cudaStream_t st) {
  FB_CHECK(top_k >= 1 && top_k <= kMaxTopK && top_k <= E && scratch) << "top_k " << top_k << " of " << E;
  if (T == 0) return Status();
  float* score = scratch;
  float* biased = scratch + T * E;
  const bool pdl = fast_pdl();
  FB_CUDA_TRY(launch_pdl(pdl, route_scores_from_dots_kernel, dim3(blocks_for(T * E, 256)), dim3(256), 0, st, T, E, bias, bias_vl, image, gate_temp,
                         score, biased));
  FB_CUDA_LAUNCHED("route_scores_from_dots_kernel");
  FB_CUDA_TRY(launch_pdl(pdl, route_kernel, dim3(unsigned(T)), dim3(256), size_t(2 * E) * sizeof(float), st, score, biased, E, top_k, norm_topk,
                         route_scale, experts, weights));
  FB_CUDA_LAUNCHED("route_kernel");
  return Status();
}

Status swiglu_quant(const uint16_t* a, const uint16_t* b, int64_t M, int64_t n, float limit, const float* weight, const QuantBuf& q, cudaStream_t st) {
  FB_CHECK(n % 32 == 0 && M * n <= q.capacity) << "swiglu_quant n=" << n;
  if (M * n == 0) return Status();
  return launch_op("swiglu_quant_kernel", swiglu_quant_kernel, blocks_for(M * (n / 32), 8), 256, 0, st, a, b, M, n, limit, weight, q.codes, q.scales);
}

Status swiglu(const uint16_t* a, const uint16_t* b, int64_t M, int64_t n, float limit, const float* weight, uint16_t* h, cudaStream_t st) {
  if (M * n == 0) return Status();
  return launch_op("swiglu_kernel", swiglu_kernel, blocks_for(M * n, 256), 256, 0, st, a, b, M, n, limit, weight, h);
}

Status moe_combine(const uint16_t* ye, int K, const uint16_t* ys, int64_t T, int64_t D, uint16_t* y, cudaStream_t st) {
  if (T == 0) return Status();
  return launch_op_pdl("moe_combine_kernel", fast_pdl(), moe_combine_kernel, dim3(blocks_for(T * D, 256)), dim3(256), 0, st, ye, K, ys, T, D, y);
}

Status engram_gather(const uint8_t* table, const uint8_t* table_scale, const int64_t* hashes, int64_t ld_hash, int64_t T, int n_cols, int hd,
                     uint16_t* E, cudaStream_t st) {
  FB_CHECK(hd % 32 == 0);
  if (T == 0) return Status();
  return launch_op("engram_gather_kernel", engram_gather_kernel, blocks_for(T * n_cols * hd, 256), 256, 0, st, table, table_scale, hashes, ld_hash, T,
                   n_cols, hd, E);
}

Status engram_gate(uint16_t* X, const uint16_t* kv, const uint16_t* q_w, const uint16_t* k_w, int64_t T, int hc, int64_t D, float eps,
                   float inv_sqrt_d, const uint8_t* image, cudaStream_t st) {
  if (T == 0) return Status();
  return launch_op("engram_gate_kernel", engram_gate_kernel, unsigned(T * hc), 128, 0, st, X, kv, q_w, k_w, hc, D, eps, inv_sqrt_d, image);
}

Status ratio2_pool(const uint64_t* even, const uint64_t* odd, int64_t n, int64_t hd, uint16_t* pooled, cudaStream_t st) {
  if (n == 0) return Status();
  return launch_op("ratio2_pool_kernel", ratio2_pool_kernel, blocks_for(n * hd, 256), 256, 0, st, even, odd, n, hd, pooled);
}

Status markov_bias(float* lk, int64_t V, int r, const uint16_t* EM, const uint16_t* HM, const int32_t* prev_id, cudaStream_t st) {
  if (V == 0) return Status();
  const bool vec = r % 8 == 0 && (reinterpret_cast<uintptr_t>(EM) & 15) == 0 && (reinterpret_cast<uintptr_t>(HM) & 15) == 0;
  return launch_op("markov_bias_kernel", markov_bias_kernel, blocks_for(V, 8), 256, 0, st, lk, V, r, EM, HM, prev_id, vec);
}

Status argmax(const float* x, int64_t n, int32_t* out, cudaStream_t st) {
  return launch_op("argmax_kernel", argmax_kernel, 1, 1024, 0, st, x, n, out);
}

Status rows_argmax(const float* x, int64_t rows, int64_t V, int32_t* out, cudaStream_t st) {
  if (rows == 0) return Status();
  FB_CHECK(V > 0 && rows < (int64_t(1) << 31)) << "rows_argmax V=" << V;
  return launch_op("rows_argmax_kernel", rows_argmax_kernel, unsigned(rows), 1024, 0, st, x, V, out);
}

int markov_step_ctas() {
  static const int ctas = [] {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) sms = 0;
    return sms > 0 ? 4 * sms : 528;
  }();
  return ctas;
}

bool markov_step_fits(int64_t V, int r, const uint16_t* EM, const uint16_t* HM) {
  const auto a16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  return V > 0 && r > 0 && r % 8 == 0 && r <= 4 * 256 && a16(EM) && a16(HM);
}

Status markov_step(float* lk, int64_t V, int r, const uint16_t* EM, const uint16_t* HM, const int32_t* prev_id, const uint16_t* hH, int64_t D,
                   const uint16_t* wc, int32_t* next_id, float* conf, const MarkovScratch& ws, cudaStream_t st) {
  FB_CHECK(markov_step_fits(V, r, EM, HM) && ws.part_v && ws.part_i && ws.counter && ws.ctas >= 1) << "markov_step r=" << r;
  const unsigned g = unsigned(std::min<int64_t>(ws.ctas, (V + kMarkovRows * 8 - 1) / (kMarkovRows * 8)));
  const int nc = (r + 255) / 256;
  const auto k = nc == 1 ? &markov_step_kernel<1> : nc == 2 ? &markov_step_kernel<2> : &markov_step_kernel<4>;
  return launch_op("markov_step_kernel", k, g, kMarkovThreads, 0, st, lk, V, r, EM, HM, prev_id, hH, D, wc, next_id, conf, ws.part_v, ws.part_i,
                   ws.counter);
}

Status confidence(const uint16_t* hH, int64_t D, const uint16_t* EM, int r, const int32_t* prev_id, const uint16_t* wc, float* out,
                  cudaStream_t st) {
  return launch_op("confidence_kernel", confidence_kernel, 1, 32, 0, st, hH, D, EM, r, prev_id, wc, out);
}

}  // namespace fb::cuda
