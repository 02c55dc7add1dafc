// Quantisers and GEMMs of the CUDA executor: act_quant, the FP8/FP4 QDQ of the caches, and the
// block-scaled FP8 / MXFP4 / bf16 GEMMs (one warp per output element, GEMV-style: correctness
// first). Mirrors cpu/ops.cpp; reduction orders blocks16 / lanes32 (base/fmath.h).
#include "base/check.h"
#include "cuda/device.h"
#include "cuda/numerics.cuh"
#include "cuda/ops.h"

namespace fb::cuda {

using namespace dev;

namespace {

constexpr int kWarps = 8;  // warps per block for warp-per-output kernels

inline unsigned blocks_for(int64_t n, int per) { return unsigned((n + per - 1) / per); }

// ---- quantisers --------------------------------------------------------------------------------

// One thread per (row, 32-block): cpu::act_quant_row.
__global__ void act_quant_kernel(const uint16_t* x, int64_t M, int64_t K, uint8_t* codes, float* scales) {
  const int64_t KB = K / 32, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M * KB) return;
  const int64_t m = i / KB, b = i % KB;
  const uint16_t* xb = x + m * K + b * 32;
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = smax(amax, fabsf(bf(xb[j])));
  const float s = fp8_block_scale(amax);
  scales[m * KB + b] = s;
  uint8_t* cb = codes + m * K + b * 32;
  for (int j = 0; j < 32; ++j) {
    float v = fm::div(bf(xb[j]), s);
    v = smin(smax(v, -448.0f), 448.0f);
    cb[j] = e4m3_code(v);
  }
}

__global__ void fp8_qdq_kernel(const uint16_t* x, int64_t M, int64_t K, uint8_t* compact, int64_t ld, uint16_t* out) {
  const int64_t KB = K / 32, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M * KB) return;
  const int64_t m = i / KB, b = i % KB;
  const uint16_t* xb = x + m * K + b * 32;
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = smax(amax, fabsf(bf(xb[j])));
  const float s = fp8_block_scale(amax);
  const uint8_t sc = e8m0_code(s);
  const float sv = e8m0_val(sc);
  uint8_t codes[32];
  for (int j = 0; j < 32; ++j) codes[j] = e4m3_code(smin(smax(fm::div(bf(xb[j]), s), -448.0f), 448.0f));
  if (compact) {
    uint8_t* row = compact + m * ld;
    for (int j = 0; j < 32; ++j) row[b * 32 + j] = codes[j];
    row[K + b] = sc;
  }
  if (out)
    for (int j = 0; j < 32; ++j) out[m * K + b * 32 + j] = to_bf(fm::mul(e4m3_val(codes[j]), sv));
}

__global__ void fp4_e8m0_qdq_kernel(const uint16_t* x, int64_t M, int64_t K, uint8_t* compact, int64_t ld, uint16_t* out) {
  const int64_t KB = K / 32, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M * KB) return;
  const int64_t m = i / KB, b = i % KB;
  const uint16_t* xb = x + m * K + b * 32;
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = smax(amax, fabsf(bf(xb[j])));
  amax = smax(amax, fm::mul(6.0f, fm::pow2i(-126)));
  const float s = pow2_ceil_bits(fm::mul(amax, __uint_as_float(0x3E2AAAABu)));  // f32(1/6)
  const uint8_t sc = e8m0_code(s);
  const float sv = e8m0_val(sc);
  uint8_t packed[16];
  for (int j = 0; j < 32; j += 2) {
    const float v0 = smin(smax(fm::div(bf(xb[j]), s), -6.0f), 6.0f);
    const float v1 = smin(smax(fm::div(bf(xb[j + 1]), s), -6.0f), 6.0f);
    packed[j / 2] = uint8_t(e2m1_code(v0) | (e2m1_code(v1) << 4));
  }
  if (compact) {
    uint8_t* row = compact + m * ld;
    for (int j = 0; j < 16; ++j) row[b * 16 + j] = packed[j];
    row[K / 2 + b] = sc;
  }
  if (out)
    for (int j = 0; j < 32; ++j) out[m * K + b * 32 + j] = to_bf(fm::mul(e2m1_val(e2m1_code_at(packed, j)), sv));
}

__global__ void fp4_e4m3_qdq_kernel(const uint16_t* x, int64_t M, int64_t K, uint8_t* compact, int64_t ld, uint16_t* out) {
  const int64_t KB = K / 16, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M * KB) return;
  const int64_t m = i / KB, b = i % KB;
  const uint16_t* xb = x + m * K + b * 16;
  float amax = 0.0f;
  for (int j = 0; j < 16; ++j) amax = smax(amax, fabsf(bf(xb[j])));
  amax = smax(amax, fm::mul(6.0f, fm::pow2i(-9)));
  const uint8_t sc = e4m3_code(fm::div(amax, 6.0f));
  const float s = e4m3_val(sc);
  uint8_t packed[8];
  for (int j = 0; j < 16; j += 2) {
    const float v0 = smin(smax(fm::div(bf(xb[j]), s), -6.0f), 6.0f);
    const float v1 = smin(smax(fm::div(bf(xb[j + 1]), s), -6.0f), 6.0f);
    packed[j / 2] = uint8_t(e2m1_code(v0) | (e2m1_code(v1) << 4));
  }
  if (compact) {
    uint8_t* row = compact + m * ld;
    for (int j = 0; j < 8; ++j) row[b * 8 + j] = packed[j];
    row[K / 2 + b] = sc;
  }
  if (out)
    for (int j = 0; j < 16; ++j) out[m * K + b * 16 + j] = to_bf(fm::mul(e2m1_val(e2m1_code_at(packed, j)), s));
}

__global__ void fp8_dequant_rows_kernel(const uint64_t* rows, int64_t n, int64_t K, uint16_t* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * K) return;
  const int64_t r = i / K, k = i % K;
  const uint8_t* row = reinterpret_cast<const uint8_t*>(rows[r]);
  out[i] = to_bf(fm::mul(e4m3_val(row[k]), e8m0_val(row[K + k / 32])));
}

// ---- GEMMs ---------------------------------------------------------------------------------------

__global__ void fp8_gemm_kernel(const uint8_t* xc, const float* xs, int64_t M, const uint8_t* W, const uint8_t* S, int64_t N, int64_t K,
                                uint16_t* y) {
  const int64_t o = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (o >= M * N) return;  // whole warps leave together
  const int64_t m = o / N, n = o % N, KB = K / 32;
  const uint8_t* xr = xc + m * K;
  const float* xsr = xs + m * KB;
  const uint8_t* wr = W + n * K;
  const uint8_t* sr = S + (n / 32) * KB;
  const float acc = warp_blocks16(
      KB, [&](int64_t k) { return fm::mul(e4m3_val(xr[k]), e4m3_val(wr[k])); },
      [&](int64_t b) { return fm::mul(xsr[b], e8m0_val(sr[b])); });
  if ((threadIdx.x & 31) == 0) y[o] = to_bf(acc);
}

__global__ void fp4_gemm_kernel(const uint8_t* xc, const float* xs, int64_t M, int64_t x_div, const uint8_t* W, const uint8_t* S, int64_t N,
                                int64_t K, int64_t w_stride, int64_t s_stride, const int32_t* expert, uint16_t* y) {
  const int64_t o = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (o >= M * N) return;
  const int64_t m = o / N, n = o % N, KB = K / 32, xm = m / x_div;
  const int64_t e = expert ? expert[m] : 0;
  const uint8_t* xr = xc + xm * K;
  const float* xsr = xs + xm * KB;
  const uint8_t* wr = W + e * w_stride + n * (K / 2);
  const uint8_t* sr = S + e * s_stride + n * KB;
  const float acc = warp_blocks16(
      KB, [&](int64_t k) { return fm::mul(e4m3_val(xr[k]), e2m1_val(e2m1_code_at(wr, k))); },
      [&](int64_t b) { return fm::mul(xsr[b], e8m0_val(sr[b])); });
  if ((threadIdx.x & 31) == 0) y[o] = to_bf(acc);
}

__global__ void bf16_gemm_kernel(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const uint16_t* w, int64_t N, void* y, int64_t ldy,
                                 int mode, int64_t G, int64_t gx, int64_t gw, int64_t gy) {
  const int64_t o = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (o >= M * G * N) return;
  const int64_t n = o % N, g = (o / N) % G, m = o / (N * G);
  const uint16_t* xr = x + g * gx + m * ldx;
  const uint16_t* wr = w + g * gw + n * K;
  const float acc = warp_lanes32(K, [&](int64_t k) { return fm::mul(bf(xr[k]), bf(wr[k])); });
  if ((threadIdx.x & 31) != 0) return;
  const int64_t at = g * gy + m * ldy + n;
  if (mode == 0) static_cast<uint16_t*>(y)[at] = to_bf(acc);
  else if (mode == 1) static_cast<float*>(y)[at] = acc;
  else static_cast<float*>(y)[at] = fm::add(static_cast<float*>(y)[at], acc);
}

__global__ void scale_bf16_kernel(uint16_t* x, int64_t n, float s) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = to_bf(fm::mul(bf(x[i]), s));
}

}  // namespace

Status act_quant(const uint16_t* x, int64_t M, int64_t K, const QuantBuf& q, cudaStream_t st) {
  FB_CHECK(K % 32 == 0 && M * K <= q.capacity) << "act_quant M=" << M << " K=" << K << " capacity=" << q.capacity;
  if (M == 0) return Status();
  act_quant_kernel<<<blocks_for(M * (K / 32), 128), 128, 0, st>>>(x, M, K, q.codes, q.scales);
  FB_CUDA_LAUNCHED("act_quant_kernel");
  return Status();
}

Status fp8_qdq(const uint16_t* x, int64_t M, int64_t K, uint8_t* compact, int64_t ld, uint16_t* out, cudaStream_t st) {
  FB_CHECK(K % 32 == 0);
  if (M == 0) return Status();
  fp8_qdq_kernel<<<blocks_for(M * (K / 32), 128), 128, 0, st>>>(x, M, K, compact, ld, out);
  FB_CUDA_LAUNCHED("fp8_qdq_kernel");
  return Status();
}

Status fp4_e8m0_qdq(const uint16_t* x, int64_t M, int64_t K, uint8_t* compact, int64_t ld, uint16_t* out, cudaStream_t st) {
  FB_CHECK(K % 32 == 0);
  if (M == 0) return Status();
  fp4_e8m0_qdq_kernel<<<blocks_for(M * (K / 32), 128), 128, 0, st>>>(x, M, K, compact, ld, out);
  FB_CUDA_LAUNCHED("fp4_e8m0_qdq_kernel");
  return Status();
}

Status fp4_e4m3_qdq(const uint16_t* x, int64_t M, int64_t K, uint8_t* compact, int64_t ld, uint16_t* out, cudaStream_t st) {
  FB_CHECK(K % 16 == 0);
  if (M == 0) return Status();
  fp4_e4m3_qdq_kernel<<<blocks_for(M * (K / 16), 128), 128, 0, st>>>(x, M, K, compact, ld, out);
  FB_CUDA_LAUNCHED("fp4_e4m3_qdq_kernel");
  return Status();
}

Status fp8_dequant_rows(const uint64_t* rows, int64_t n, int64_t K, uint16_t* out, cudaStream_t st) {
  if (n == 0) return Status();
  fp8_dequant_rows_kernel<<<blocks_for(n * K, 256), 256, 0, st>>>(rows, n, K, out);
  FB_CUDA_LAUNCHED("fp8_dequant_rows_kernel");
  return Status();
}

Status fp8_gemm_q(const QuantBuf& q, int64_t M, const Fp8W& w, uint16_t* y, cudaStream_t st) {
  FB_CHECK(w.K % 32 == 0 && w.w && w.s) << "fp8 gemm K=" << w.K;
  if (M == 0 || w.N == 0) return Status();
  fp8_gemm_kernel<<<blocks_for(M * w.N, kWarps), 32 * kWarps, 0, st>>>(q.codes, q.scales, M, w.w, w.s, w.N, w.K, y);
  FB_CUDA_LAUNCHED("fp8_gemm_kernel");
  return Status();
}

Status fp8_gemm(const uint16_t* x, int64_t M, const Fp8W& w, uint16_t* y, const QuantBuf& q, cudaStream_t st) {
  FB_RETURN_IF_ERROR(act_quant(x, M, w.K, q, st));
  return fp8_gemm_q(q, M, w, y, st);
}

Status fp4_gemm_q(const QuantBuf& q, int64_t M, int64_t x_div, const Fp4W& w, const int32_t* expert, uint16_t* y, cudaStream_t st) {
  FB_CHECK(w.K % 32 == 0 && x_div >= 1 && w.w && w.s) << "fp4 gemm K=" << w.K;
  if (M == 0 || w.N == 0) return Status();
  fp4_gemm_kernel<<<blocks_for(M * w.N, kWarps), 32 * kWarps, 0, st>>>(q.codes, q.scales, M, x_div, w.w, w.s, w.N, w.K, w.w_stride,
                                                                       w.s_stride, expert, y);
  FB_CUDA_LAUNCHED("fp4_gemm_kernel");
  return Status();
}

Status bf16_gemm(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const uint16_t* w, int64_t N, void* y, int64_t ldy, GemmOut out,
                 int64_t G, int64_t gx, int64_t gw, int64_t gy, cudaStream_t st) {
  if (M == 0 || N == 0 || G == 0) return Status();
  bf16_gemm_kernel<<<blocks_for(M * G * N, kWarps), 32 * kWarps, 0, st>>>(x, M, K, ldx, w, N, y, ldy, int(out), G, gx, gw, gy);
  FB_CUDA_LAUNCHED("bf16_gemm_kernel");
  return Status();
}

Status scale_bf16(uint16_t* x, int64_t n, float s, cudaStream_t st) {
  if (n == 0) return Status();
  scale_bf16_kernel<<<blocks_for(n, 256), 256, 0, st>>>(x, n, s);
  FB_CUDA_LAUNCHED("scale_bf16_kernel");
  return Status();
}

}  // namespace fb::cuda
