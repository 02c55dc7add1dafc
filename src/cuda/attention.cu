// Sparse attention with a sink (cpu::sparse_attention) over each row's key list: window rows
// (FP8 compact, from the ring or this step) then the selected compressed entries (FP4 compact),
// dequantised on the fly to the bf16 values the CPU builds. One block per (row, head); blocks
// of 64 keys in list order, online softmax with the CPU's exact update sequence.
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

}  // namespace

Status sparse_attention(const uint16_t* q, int64_t T, int n_heads, int d, const AttnKeys& keys, const float* sinks, float scale, uint16_t* out,
                        cudaStream_t st) {
  FB_CHECK(d % 32 == 0 && keys.win && keys.win_off) << "attention head_dim " << d;
  if (T == 0) return Status();
  const size_t smem = size_t(2 * d) * sizeof(float);
  if (smem > 48 * 1024) FB_CUDA_TRY(cudaFuncSetAttribute(sparse_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  sparse_attention_kernel<<<unsigned(T * n_heads), kThreads, smem, st>>>(q, n_heads, d, keys, sinks, scale, out);
  FB_CUDA_LAUNCHED("sparse_attention_kernel");
  return Status();
}

}  // namespace fb::cuda
