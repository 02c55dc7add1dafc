// Sparse attention of prefill rows on tensor cores (tc_gemm.h: tc_sparse_attention). The CPU's
// online softmax over 64-key blocks (spec/11 §1.7) splits into pieces that only the dots and the
// P.V sums feed:
//   z_j = dot(q_h, k_j) * c             batched matmul S = Q . K^T per row (all heads)
//   m_b, alpha_b, p_j, bf16(p_j), psum  the CPU's sequence per (row, head), block by block
//   S_b = sum_j bf16(p_j) k_j           batched matmul per (row, block): P_b . K_b
//   acc = acc * alpha_b + S_b           the fold in block order, then o = bf16(acc / l)
// Every step except the two matmuls is the CPU's arithmetic in the CPU's order (fm:: ops).
// Blocks past a row's last key are all-empty: alpha = exp(0) = 1 and S_b = 0, so they leave acc
// and l bit for bit unchanged, which lets every row of a batch use the same block count.
#include "base/check.h"
#include "cuda/numerics.cuh"
#include "cuda/tc_gemm.h"

namespace fb::cuda {

using namespace dev;

namespace {

inline unsigned grid_of(int64_t n, int per) { return unsigned((n + per - 1) / per); }

// Thread per 8 dims of one (row, key slot): the key's exact bf16 values (as key_val in
// attention.cu), zeros for empty entries and padding; valid[r, j] = 1 for a real key.
__global__ void tc_attn_gather_kernel(AttnKeys keys, int64_t t0, int64_t R, int NK, int d, uint16_t* __restrict__ Kg,
                                      uint8_t* __restrict__ valid) {
  const int64_t per_key = d / 8, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= R * NK * per_key) return;
  const int64_t r = i / (NK * per_key), j = (i / per_key) % NK, c0 = (i % per_key) * 8, t = t0 + r;
  const int w0 = keys.win_off[t], n_win = keys.win_off[t + 1] - w0;
  const int n = n_win + (keys.sel ? keys.sel_count[t] : 0);
  if (n > NK) __trap();  // the host's max_keys was wrong: never drop keys
  const uint8_t* p = nullptr;
  bool fp4 = false;
  if (j < n_win) {
    p = reinterpret_cast<const uint8_t*>(keys.win[w0 + j]);
  } else if (j < n) {
    const int32_t id = keys.sel[t * keys.sel_ld + (j - n_win)];
    if (id >= 0) {
      p = reinterpret_cast<const uint8_t*>(keys.comp_base[t]) + int64_t(id) * (d / 2 + d / 16);
      fp4 = true;
    }
  }
  uint16_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (p && !fp4) {
    const float s = e8m0_val(p[d + c0 / 32]);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = to_bf(fm::mul(e4m3_val(p[c0 + e]), s));
  } else if (p) {
    const float s = e4m3_val(p[d / 2 + c0 / 16]);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = to_bf(fm::mul(e2m1_val(e2m1_code_at(p, c0 + e)), s));
  }
  store_bf16x8(Kg + (r * NK + j) * d + c0, v);
  if (c0 == 0) valid[r * NK + j] = p ? 1 : 0;
}

constexpr int kSoftmaxWarps = 8;

// Warp per (row, head): the CPU's update sequence block by block. Lanes hold keys lane and
// lane + 32 of the block; the block max is an smax butterfly (order-free, docs/numerics.md rule
// 8); the p-sum runs sequentially in j on lane 0, as on the CPU.
__global__ void __launch_bounds__(32 * kSoftmaxWarps) tc_attn_softmax_kernel(const float* __restrict__ S, const uint8_t* __restrict__ valid,
                                                                             int64_t R, int H, int NK, float scale, const float* __restrict__ sinks,
                                                                             uint16_t* __restrict__ P, float* __restrict__ alpha,
                                                                             float* __restrict__ lsum) {
  __shared__ float pf[kSoftmaxWarps][64];
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31);
  const int64_t w = int64_t(blockIdx.x) * kSoftmaxWarps + warp;
  if (w >= R * H) return;  // whole warps
  const int64_t r = w / H;
  const int h = int(w % H), NB = NK / 64;
  const float* srow = S + (r * H + h) * int64_t(NK);
  const uint8_t* vrow = valid + r * NK;
  float m = -1e30f, l = 0.0f;
  for (int b = 0; b < NB; ++b) {
    float z[2], a = -INFINITY;
    bool ok[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int j = b * 64 + lane + 32 * u;
      ok[u] = vrow[j] != 0;
      z[u] = ok[u] ? fm::mul(srow[j], scale) : -INFINITY;
      if (ok[u]) a = smax(a, z[u]);
    }
    for (int off = 16; off >= 1; off >>= 1) a = smax(a, __shfl_xor_sync(0xFFFFFFFFu, a, off));
    const float m2 = smax(m, a);
    const float al = fm::exp(fm::add(m, -m2));
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int j = lane + 32 * u;
      const float p = ok[u] ? fm::exp(fm::add(z[u], -m2)) : 0.0f;
      pf[warp][j] = p;
      P[((r * NB + b) * H + h) * 64 + j] = to_bf(p);
    }
    __syncwarp();
    if (lane == 0) {
      float psum = 0.0f;
      for (int j = 0; j < 64; ++j) psum = fm::add(psum, pf[warp][j]);  // padding adds +0: no change
      l = fm::add(fm::mul(l, al), psum);
      alpha[(r * H + h) * NB + b] = al;
    }
    __syncwarp();
    m = m2;
  }
  if (lane == 0) lsum[r * H + h] = fm::add(l, fm::exp(fm::add(sinks[h], -m)));
}

// Thread per (row, head, dim): acc = acc * alpha_b + S_b in block order, o = bf16(acc / l).
__global__ void tc_attn_fold_kernel(const float* __restrict__ Y, const float* __restrict__ alpha, const float* __restrict__ lsum, int64_t t0,
                                    int64_t R, int H, int NB, int d, uint16_t* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= R * H * d) return;
  const int64_t r = i / (int64_t(H) * d);
  const int h = int((i / d) % H), c = int(i % d);
  const float* al = alpha + (r * H + h) * NB;
  float acc = 0.0f;
  for (int b = 0; b < NB; ++b) acc = fm::add(fm::mul(acc, al[b]), Y[((r * NB + b) * H + h) * int64_t(d) + c]);
  out[((t0 + r) * H + h) * int64_t(d) + c] = to_bf(fm::div(acc, lsum[r * H + h]));
}

size_t align256(size_t b) { return (b + 255) & ~size_t(255); }

// FP4 e8m0 index keys [n, ihd] -> exact bf16 values [N, ihd] (rows n..N-1 zero): thread per 8.
__global__ void tc_index_keys_kernel(const uint8_t* __restrict__ kb, int64_t key_bytes, int64_t n, int64_t N, int ihd, uint16_t* __restrict__ out) {
  const int64_t per = ihd / 8, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * per) return;
  const int64_t j = i / per, c0 = (i % per) * 8;
  uint16_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (j < n) {
    const uint8_t* k = kb + j * key_bytes;
    const float s = e8m0_val(k[ihd / 2 + c0 / 32]);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = to_bf(fm::mul(e2m1_val(e2m1_code_at(k, c0 + e)), s));
  }
  store_bf16x8(out + j * ihd + c0, v);
}

// Thread per (row t0 + y, entry j): the CPU's head chain over the bf16 dots Dots [(y, h), N].
__global__ void tc_index_reduce_kernel(const uint16_t* __restrict__ dots, int64_t N, const uint16_t* __restrict__ wts, int IH, int64_t t0,
                                       const int64_t* __restrict__ n_vis, const int64_t* __restrict__ n_scored, float* __restrict__ I, int64_t ld,
                                       const uint8_t* __restrict__ mask, int64_t mask_ld, const int64_t* __restrict__ mask_len) {
  const int64_t y = blockIdx.y, t = t0 + y, j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n_scored[t]) return;
  float score = -INFINITY;
  const bool pooled = !mask || (j < mask_len[t] && mask[t * mask_ld + j]);
  if (pooled && j < n_vis[t]) {
    const uint16_t* d = dots + y * int64_t(IH) * N + j;
    const uint16_t* w = wts + t * IH;
    float tot = 0.0f;
    for (int h = 0; h < IH; ++h) {
      const float db = smax(bf(d[int64_t(h) * N]), 0.0f);
      tot = fm::add(tot, round_bf16(fm::mul(db, bf(w[h]))));
    }
    score = round_bf16(tot);
  }
  I[t * ld + j] = score;
}

}  // namespace

Status tc_sparse_attention(TcGemm& tc, const uint16_t* q, int64_t T, int H, int d, const AttnKeys& keys, const float* sinks, float scale,
                           uint16_t* out, cudaStream_t st) {
  FB_CHECK(d % 32 == 0 && keys.win && keys.win_off && keys.max_keys > 0) << "tc attention d=" << d << " max_keys=" << keys.max_keys;
  if (T == 0) return Status();
  const int NB = (keys.max_keys + 63) / 64, NK = NB * 64;
  // Rows per batch: the P.V partial sums (NB x H x d f32 per row) dominate; about 1 GiB in all.
  const size_t per_row = size_t(NK) * d * 2 + size_t(H) * NK * 4 + size_t(NK) * H * 2 + size_t(NB) * H * d * 4 + size_t(NK) +
                         size_t(H) * (NB + 1) * 4;
  const int64_t R = std::max<int64_t>(1, std::min<int64_t>(T, int64_t((size_t(1) << 30) / per_row)));
  uint16_t* Kg = static_cast<uint16_t*>(FB_TRY(tc.scratch_bytes(4, size_t(R) * NK * d * 2, st)));
  float* S = static_cast<float*>(FB_TRY(tc.scratch_bytes(5, size_t(R) * H * NK * 4, st)));
  const size_t p_bytes = align256(size_t(R) * NB * H * 64 * 2), a_bytes = align256(size_t(R) * H * NB * 4), l_bytes = align256(size_t(R) * H * 4);
  uint8_t* misc = static_cast<uint8_t*>(FB_TRY(tc.scratch_bytes(6, p_bytes + a_bytes + l_bytes + size_t(R) * NK, st)));
  float* Y = static_cast<float*>(FB_TRY(tc.scratch_bytes(7, size_t(R) * NB * H * d * 4, st)));
  uint16_t* P = reinterpret_cast<uint16_t*>(misc);
  float* alpha = reinterpret_cast<float*>(misc + p_bytes);
  float* lsum = reinterpret_cast<float*>(misc + p_bytes + a_bytes);
  uint8_t* valid = misc + p_bytes + a_bytes + l_bytes;
  for (int64_t t0 = 0; t0 < T; t0 += R) {
    const int64_t r = std::min(R, T - t0);
    tc_attn_gather_kernel<<<grid_of(r * NK * (d / 8), 256), 256, 0, st>>>(keys, t0, r, NK, d, Kg, valid);
    FB_CUDA_LAUNCHED("tc_attn_gather_kernel");
    // S_r [H, NK] = Q_r [H, d] . Kg_r [NK, d]^T for each row r
    FB_RETURN_IF_ERROR(tc.matmul(q + t0 * H * int64_t(d), H, d, d, Kg, NK, S, NK, GemmOut::kF32, r, int64_t(H) * d, int64_t(NK) * d,
                                 int64_t(H) * NK, st));
    tc_attn_softmax_kernel<<<grid_of(r * H, kSoftmaxWarps), 32 * kSoftmaxWarps, 0, st>>>(S, valid, r, H, NK, scale, sinks, P, alpha, lsum);
    FB_CUDA_LAUNCHED("tc_attn_softmax_kernel");
    // Y_(r,b) [H, d] = P_(r,b) [H, 64] . Kg_(r, block b) [64, d] for every (row, block)
    FB_RETURN_IF_ERROR(tc.matmul(P, H, 64, 64, Kg, d, Y, d, GemmOut::kF32, r * NB, int64_t(H) * 64, int64_t(64) * d, int64_t(H) * d, st,
                                 /*w_kn=*/true));
    tc_attn_fold_kernel<<<grid_of(r * H * int64_t(d), 256), 256, 0, st>>>(Y, alpha, lsum, t0, r, H, NB, d, out);
    FB_CUDA_LAUNCHED("tc_attn_fold_kernel");
  }
  return Status();
}

Status tc_index_scores(TcGemm& tc, const uint16_t* iq, const uint16_t* wts, int64_t T, int IH, int ihd, const std::vector<uint64_t>& keys_base_host,
                       const std::vector<int64_t>& n_vis_host, const std::vector<int64_t>& n_scored_host, int64_t key_bytes, const int64_t* n_vis,
                       const int64_t* n_scored, float* I, int64_t ld, cudaStream_t st, const uint8_t* mask, int64_t mask_ld, const int64_t* mask_len) {
  FB_CHECK(ihd % 32 == 0 && int64_t(keys_base_host.size()) == T && int64_t(n_vis_host.size()) == T && int64_t(n_scored_host.size()) == T);
  for (int64_t a = 0; a < T;) {
    // A run of rows reading the same keys (one session's rows of this step).
    int64_t b = a + 1;
    while (b < T && keys_base_host[size_t(b)] == keys_base_host[size_t(a)]) ++b;
    int64_t n = 0, ns = 0;
    for (int64_t t = a; t < b; ++t) {
      n = std::max(n, n_vis_host[size_t(t)]);
      ns = std::max(ns, n_scored_host[size_t(t)]);
    }
    const int64_t N = std::max<int64_t>(8, (n + 7) / 8 * 8);
    // Rows per matmul: the bf16 dots (IH x N per row) within about 1 GiB.
    const int64_t R = std::max<int64_t>(1, std::min<int64_t>(b - a, int64_t((size_t(1) << 30) / (size_t(IH) * N * 2))));
    uint16_t* keys = FB_TRY(tc.scratch(4, N * ihd, st));
    uint16_t* dots = FB_TRY(tc.scratch(5, R * IH * N, st));
    if (n > 0) {
      tc_index_keys_kernel<<<grid_of(N * (ihd / 8), 256), 256, 0, st>>>(reinterpret_cast<const uint8_t*>(keys_base_host[size_t(a)]), key_bytes, n, N,
                                                                          ihd, keys);
      FB_CUDA_LAUNCHED("tc_index_keys_kernel");
    }
    for (int64_t t0 = a; t0 < b; t0 += R) {
      const int64_t r = std::min(R, b - t0);
      if (n > 0) FB_RETURN_IF_ERROR(tc.matmul(iq + t0 * IH * int64_t(ihd), r * IH, ihd, ihd, keys, N, dots, N, GemmOut::kBf16, 1, 0, 0, 0, st));
      if (ns > 0) {
        tc_index_reduce_kernel<<<dim3(grid_of(ns, 256), unsigned(r)), 256, 0, st>>>(dots, N, wts, IH, t0, n_vis, n_scored, I, ld, mask, mask_ld,
                                                                                   mask_len);
        FB_CUDA_LAUNCHED("tc_index_reduce_kernel");
      }
    }
    a = b;
  }
  return Status();
}

}  // namespace fb::cuda
