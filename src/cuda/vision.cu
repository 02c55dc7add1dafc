// The ViT + aligner on the GPU, op by op as src/vision/tower.cpp (which defines the numerics):
// lanes32 dots (bf16_gemm and dev::warp_lanes32), f32 RMSNorm with f32 weights, host RoPE tables,
// one-pass bidirectional attention per image with a sequential max, the SwiGLU and residual
// roundings, the 3x3 unfold and a host-built GELU table. Every output equals the CPU tower's bits.
#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "cuda/device.h"
#include "cuda/executor.h"
#include "cuda/numerics.cuh"
#include "cuda/ops.h"
#include "cuda/vision.h"
#include "cuda/launch.cuh"
#include "vision/span.h"
#include "vision/tower.h"

namespace fb::cuda {

using namespace dev;

namespace {

inline unsigned blocks_of(int64_t n, int per) { return unsigned((n + per - 1) / per); }

__global__ void bias_round_kernel(const float* acc, const uint16_t* bias, int64_t M, int64_t N, uint16_t* y) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M * N) return;
  y[i] = to_bf(fm::add(acc[i], bf(bias[i % N])));
}

// Warp per row: ss = lanes32(x^2), r = rsqrt(ss / n + eps), y = bf16(w * (x * r)).
__global__ void vit_rms_norm_kernel(const uint16_t* x, int64_t M, int64_t n, const float* w, float eps, uint16_t* y) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= M) return;  // whole warps leave together
  const uint16_t* xr = x + row * n;
  const float ss = warp_lanes32(n, [&](int64_t k) {
    const float v = bf(xr[k]);
    return fm::mul(v, v);
  });
  const float r = fm::rsqrt(fm::add(fm::div(ss, float(n)), eps));
  for (int64_t i = threadIdx.x & 31; i < n; i += 32) y[row * n + i] = to_bf(fm::mul(w[i], fm::mul(bf(xr[i]), r)));
}

// Thread per (row t, part q/k, head, pair d).
__global__ void vit_rope_kernel(uint16_t* qkv, int64_t N, int H, int hd, const float* cos_t, const float* sin_t) {
  const int h = hd / 2;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * 2 * H * h) return;
  const int d = int(i % h);
  const int64_t head = (i / h) % (2 * H), t = i / (int64_t(h) * 2 * H);
  const int64_t D = int64_t(H) * hd;
  uint16_t* x = qkv + t * 3 * D + head * hd;  // head < H: q; H..2H-1: k (columns D + ...)
  const float c = cos_t[t * h + d], s = sin_t[t * h + d];
  const float x1 = bf(x[d]), x2 = bf(x[d + h]);
  const float a = fm::add(fm::mul(x1, c), -fm::mul(x2, s));
  const float b = fm::add(fm::mul(x2, c), fm::mul(x1, s));
  x[d] = to_bf(a);
  x[d + h] = to_bf(b);
}

// Block per (query i, head): scores (warp per key, lanes32 over hd) into shared memory, max
// sequential in key order (std::max), exps one per thread, l = lanes32 over keys (warp 0), then
// warp per output dim: lanes32 over keys of bf16(p) * v, divided by l, one rounding.
__global__ void vit_attention_kernel(const uint16_t* qkv, int64_t N, int H, int hd, float scale, uint16_t* o) {
  extern __shared__ float s[];  // [N]
  __shared__ float mx_s, l_s;
  const int64_t i = blockIdx.x;
  const int hh = int(blockIdx.y), lane = int(threadIdx.x & 31), warp = int(threadIdx.x / 32), nw = int(blockDim.x / 32);
  const int64_t D = int64_t(H) * hd, ld = 3 * D;
  const uint16_t* qi = qkv + i * ld + int64_t(hh) * hd;
  for (int64_t j = warp; j < N; j += nw) {
    const uint16_t* kj = qkv + j * ld + D + int64_t(hh) * hd;
    const float dot = warp_lanes32(hd, [&](int64_t e) { return fm::mul(bf(qi[e]), bf(kj[e])); });
    if (lane == 0) s[j] = fm::mul(dot, scale);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = -INFINITY;
    for (int64_t j = 0; j < N; ++j) m = smax(m, s[j]);
    mx_s = m;
  }
  __syncthreads();
  const float mx = mx_s;
  for (int64_t j = threadIdx.x; j < N; j += blockDim.x) s[j] = fm::exp(fm::add(s[j], -mx));
  __syncthreads();
  if (warp == 0) {
    const float l = warp_lanes32(N, [&](int64_t j) { return s[j]; });
    if (lane == 0) l_s = l;
  }
  __syncthreads();
  const float l = l_s;
  const uint16_t* vb = qkv + 2 * D + int64_t(hh) * hd;
  for (int e = warp; e < hd; e += nw) {
    const float acc = warp_lanes32(N, [&](int64_t j) { return fm::mul(round_bf16(s[j]), bf(vb[j * ld + e])); });
    if (lane == 0) o[i * D + int64_t(hh) * hd + e] = to_bf(fm::div(acc, l));
  }
}

__global__ void vit_residual_kernel(uint16_t* x, const uint16_t* y, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = to_bf(fm::add(bf(x[i]), bf(y[i])));
}

__global__ void vit_swiglu_kernel(const uint16_t* gu, int64_t N, int64_t I, uint16_t* h) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * I) return;
  const int64_t t = i / I, k = i % I;
  const float g = round_bf16(fm::silu(bf(gu[t * 2 * I + k])));
  h[i] = to_bf(fm::mul(g, bf(gu[t * 2 * I + I + k])));
}

__global__ void vit_unfold_kernel(const uint16_t* f, int nvh, int nvw, int64_t D, int r, int nlw, int64_t M, uint16_t* z) {
  const int64_t K = D * r * r, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M * K) return;
  const int64_t cell = i / K, feat = i % K;
  const int64_t c = feat / (r * r), kh = (feat / r) % r, kw = feat % r;
  const int64_t y = (cell / nlw) * r + kh, x = (cell % nlw) * r + kw;
  z[i] = (y < nvh && x < nvw) ? f[(y * nvw + x) * D + c] : uint16_t(0);
}

__global__ void bf16_lut_kernel(uint16_t* x, int64_t n, const uint16_t* lut) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = lut[x[i]];
}

}  // namespace

Status vit_linear(const uint16_t* x, int64_t M, int64_t K, const uint16_t* w, const uint16_t* bias, int64_t N, uint16_t* y, float* scratch,
                  cudaStream_t st) {
  if (!bias) return bf16_gemm(x, M, K, K, w, N, y, N, GemmOut::kBf16, 1, 0, 0, 0, st);
  FB_RETURN_IF_ERROR(bf16_gemm(x, M, K, K, w, N, scratch, N, GemmOut::kF32, 1, 0, 0, 0, st));
  if (M * N == 0) return Status();
  return launch_op("bias_round_kernel", bias_round_kernel, blocks_of(M * N, 256), 256, 0, st, scratch, bias, M, N, y);
}

Status vit_rms_norm(const uint16_t* x, int64_t M, int64_t n, const float* w, float eps, uint16_t* y, cudaStream_t st) {
  if (M == 0) return Status();
  return launch_op("vit_rms_norm_kernel", vit_rms_norm_kernel, blocks_of(M, 8), 256, 0, st, x, M, n, w, eps, y);
}

Status vit_rope(uint16_t* qkv, int64_t N, int H, int hd, const float* cos_t, const float* sin_t, cudaStream_t st) {
  const int64_t n = N * 2 * H * (hd / 2);
  if (n == 0) return Status();
  return launch_op("vit_rope_kernel", vit_rope_kernel, blocks_of(n, 256), 256, 0, st, qkv, N, H, hd, cos_t, sin_t);
}

Status vit_attention(const uint16_t* qkv, int64_t N, int H, int hd, float scale, uint16_t* o, cudaStream_t st) {
  if (N == 0 || H == 0) return Status();
  const size_t smem = size_t(N) * sizeof(float);
  FB_CHECK(smem <= 227 * 1024) << "vit_attention: " << N << " patches exceed one block's shared memory";
  FB_CHECK(N <= 2147483647) << "vit_attention: grid";
  FB_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(vit_attention_kernel), smem));
  return launch_op("vit_attention_kernel", vit_attention_kernel, dim3(unsigned(N), unsigned(H)), 256, smem, st, qkv, N, H, hd, scale, o);
}

Status vit_residual(uint16_t* x, const uint16_t* y, int64_t n, cudaStream_t st) {
  if (n == 0) return Status();
  return launch_op("vit_residual_kernel", vit_residual_kernel, blocks_of(n, 256), 256, 0, st, x, y, n);
}

Status vit_swiglu(const uint16_t* gu, int64_t N, int64_t I, uint16_t* h, cudaStream_t st) {
  if (N * I == 0) return Status();
  return launch_op("vit_swiglu_kernel", vit_swiglu_kernel, blocks_of(N * I, 256), 256, 0, st, gu, N, I, h);
}

Status vit_unfold(const uint16_t* f, int nvh, int nvw, int64_t D, int r, uint16_t* z, cudaStream_t st) {
  const int nlh = (nvh + r - 1) / r, nlw = (nvw + r - 1) / r;
  const int64_t M = int64_t(nlh) * nlw, n = M * D * r * r;
  if (n == 0) return Status();
  return launch_op("vit_unfold_kernel", vit_unfold_kernel, blocks_of(n, 256), 256, 0, st, f, nvh, nvw, D, r, nlw, M, z);
}

Status bf16_lut(uint16_t* x, int64_t n, const uint16_t* lut, cudaStream_t st) {
  if (n == 0) return Status();
  return launch_op("bf16_lut_kernel", bf16_lut_kernel, blocks_of(n, 256), 256, 0, st, x, n, lut);
}

// ---- CudaExecutor::encode_image: vision::VisionTower::vit then ::align, on the device ----------

Result<std::vector<uint16_t>> CudaExecutor::encode_image(const std::vector<uint16_t>& patches, int nvh, int nvw, std::vector<uint16_t>* vit_out) {
  if (!cfg_.has_vision()) return FB_ERROR(kUnsupported) << "the checkpoint has no vision tower";
  const auto& vc = cfg_.vision;
  const int64_t N = int64_t(nvh) * nvw, D = vc.dim, H = vc.n_heads, hd = D / H, I = vc.inter_dim;
  const int64_t P = 3LL * vc.patch_size * vc.patch_size;
  const int64_t r = vc.downsample, nlh = (nvh + r - 1) / r, nlw = (nvw + r - 1) / r, M = nlh * nlw, K = D * r * r, out = cfg_.dim;
  if (nvh <= 0 || nvw <= 0 || int64_t(patches.size()) != N * P)
    return FB_ERROR(kInvalidArgument) << "encode_image: " << patches.size() << " patch values for a " << nvh << "x" << nvw << " grid of " << P;
  constexpr float kEps = 1e-6f;
  const vision::VitRope rope = vision::vit_rope(nvh, nvw, int(hd), vc.rope_theta);
  const float scale = float(1.0 / std::sqrt(double(hd)));
  cudaStream_t st = stream_;

  DeviceBuffer b_patch, b_x, b_a, b_qkv, b_o, b_y, b_gu, b_h, b_f32, b_cos, b_sin, b_z, b_y1, b_y2;
  const int64_t f32n = std::max({N * 3 * D, N * D, M * out});
  FB_RETURN_IF_ERROR(b_patch.alloc(size_t(N * P) * 2));
  FB_RETURN_IF_ERROR(b_x.alloc(size_t(N * D) * 2));
  FB_RETURN_IF_ERROR(b_a.alloc(size_t(N * D) * 2));
  FB_RETURN_IF_ERROR(b_qkv.alloc(size_t(N * 3 * D) * 2));
  FB_RETURN_IF_ERROR(b_o.alloc(size_t(N * D) * 2));
  FB_RETURN_IF_ERROR(b_y.alloc(size_t(N * D) * 2));
  FB_RETURN_IF_ERROR(b_gu.alloc(size_t(N * 2 * I) * 2));
  FB_RETURN_IF_ERROR(b_h.alloc(size_t(N * I) * 2));
  FB_RETURN_IF_ERROR(b_f32.alloc(size_t(f32n) * 4));
  FB_RETURN_IF_ERROR(b_cos.alloc(rope.cos.size() * 4));
  FB_RETURN_IF_ERROR(b_sin.alloc(rope.sin.size() * 4));
  FB_RETURN_IF_ERROR(b_z.alloc(size_t(M * K) * 2));
  FB_RETURN_IF_ERROR(b_y1.alloc(size_t(M * out) * 2));
  FB_RETURN_IF_ERROR(b_y2.alloc(size_t(M * out) * 2));
  uint16_t *x = b_x.get<uint16_t>(), *a = b_a.get<uint16_t>(), *qkv = b_qkv.get<uint16_t>(), *o = b_o.get<uint16_t>(), *y = b_y.get<uint16_t>();
  uint16_t *gu = b_gu.get<uint16_t>(), *h = b_h.get<uint16_t>(), *z = b_z.get<uint16_t>(), *y1 = b_y1.get<uint16_t>(), *y2 = b_y2.get<uint16_t>();
  float* f32 = b_f32.get<float>();

  std::vector<uint16_t> result(size_t(M * out));
  auto run = [&]() -> Status {
    FB_CUDA_TRY(cudaMemcpyAsync(b_patch.get(), patches.data(), patches.size() * 2, cudaMemcpyHostToDevice, st));
    FB_CUDA_TRY(cudaMemcpyAsync(b_cos.get(), rope.cos.data(), rope.cos.size() * 4, cudaMemcpyHostToDevice, st));
    FB_CUDA_TRY(cudaMemcpyAsync(b_sin.get(), rope.sin.data(), rope.sin.size() * 4, cudaMemcpyHostToDevice, st));
    FB_RETURN_IF_ERROR(vit_linear(b_patch.get<uint16_t>(), N, P, vision_.patch_w, vision_.patch_b, D, x, f32, st));
    for (const DevVision::Block& b : vision_.blocks) {
      FB_RETURN_IF_ERROR(vit_rms_norm(x, N, D, b.norm1, kEps, a, st));
      FB_RETURN_IF_ERROR(vit_linear(a, N, D, b.wqkv_w, b.wqkv_b, 3 * D, qkv, f32, st));
      FB_RETURN_IF_ERROR(vit_rope(qkv, N, int(H), int(hd), b_cos.get<float>(), b_sin.get<float>(), st));
      FB_RETURN_IF_ERROR(vit_attention(qkv, N, int(H), int(hd), scale, o, st));
      FB_RETURN_IF_ERROR(vit_linear(o, N, D, b.wo_w, b.wo_b, D, y, f32, st));
      FB_RETURN_IF_ERROR(vit_residual(x, y, N * D, st));
      FB_RETURN_IF_ERROR(vit_rms_norm(x, N, D, b.norm2, kEps, a, st));
      FB_RETURN_IF_ERROR(vit_linear(a, N, D, b.w1, nullptr, 2 * I, gu, f32, st));
      FB_RETURN_IF_ERROR(vit_swiglu(gu, N, I, h, st));
      FB_RETURN_IF_ERROR(vit_linear(h, N, I, b.w2, nullptr, D, y, f32, st));
      FB_RETURN_IF_ERROR(vit_residual(x, y, N * D, st));
    }
    FB_RETURN_IF_ERROR(vit_rms_norm(x, N, D, vision_.norm, kEps, a, st));  // a = ViT output
    FB_RETURN_IF_ERROR(vit_unfold(a, nvh, nvw, D, int(r), z, st));
    FB_RETURN_IF_ERROR(vit_linear(z, M, K, vision_.al_w1, vision_.al_b1, out, y1, f32, st));
    FB_RETURN_IF_ERROR(bf16_lut(y1, M * out, vision_.gelu, st));
    FB_RETURN_IF_ERROR(vit_linear(y1, M, out, vision_.al_w2, vision_.al_b2, out, y2, f32, st));
    if (vit_out) {
      vit_out->resize(size_t(N * D));
      FB_CUDA_TRY(cudaMemcpyAsync(vit_out->data(), a, size_t(N * D) * 2, cudaMemcpyDeviceToHost, st));
    }
    FB_CUDA_TRY(cudaMemcpyAsync(result.data(), y2, result.size() * 2, cudaMemcpyDeviceToHost, st));
    return Status();
  };
  const Status s = run();
  // Always drain the stream before the buffers (and the host vectors) go away.
  const cudaError_t e = cudaStreamSynchronize(st);
  FB_RETURN_IF_ERROR(s);
  FB_CUDA_TRY(e);
  return result;
}

Result<std::vector<uint16_t>> CudaExecutor::image_span_markers() const {
  if (!cfg_.has_vision()) return FB_ERROR(kUnsupported) << "the checkpoint has no vision tower";
  return vision::span_markers(w_.vision, cfg_.dim);
}

}  // namespace fb::cuda
