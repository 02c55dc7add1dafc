// The vision tower on the GPU (spec/14 §4-§5): launchers mirroring src/vision/tower.cpp op by op,
// bit for bit (docs/vision.md, docs/numerics.md "Vision"). Host header: device pointers + stream.
// Linear layers reuse bf16_gemm (lanes32, the CPU tower's order); the bias is added to the f32 dot
// before the one rounding, as linear_bf16 does. RoPE cos/sin come from vision::vit_rope (host);
// GELU is a 65,536-entry bf16 -> bf16 table built on the host with vision::gelu_erf_bf16.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "base/status.h"

namespace fb::cuda {

// Device copies of model::VisionWeights; norm weights as f32 (the tower's f32_copy).
struct DevVision {
  const uint16_t *patch_w = nullptr, *patch_b = nullptr;
  struct Block {
    const float *norm1 = nullptr, *norm2 = nullptr;
    const uint16_t *wqkv_w = nullptr, *wqkv_b = nullptr, *wo_w = nullptr, *wo_b = nullptr, *w1 = nullptr, *w2 = nullptr;
  };
  std::vector<Block> blocks;
  const float* norm = nullptr;
  const uint16_t *al_w1 = nullptr, *al_b1 = nullptr, *al_w2 = nullptr, *al_b2 = nullptr;
  const uint16_t* gelu = nullptr;  // [65536]: gelu_erf_bf16 of every bf16 pattern
};

// y [M, N] = bf16(lanes32(x . w) + bias) (vision::linear_bf16); f32 scratch [M, N] when bias.
Status vit_linear(const uint16_t* x, int64_t M, int64_t K, const uint16_t* w, const uint16_t* bias, int64_t N, uint16_t* y, float* scratch,
                  cudaStream_t st);
// Rows of x [M, n] -> y (vision::rms_norm_f32w), warp per row.
Status vit_rms_norm(const uint16_t* x, int64_t M, int64_t n, const float* w, float eps, uint16_t* y, cudaStream_t st);
// In place on qkv [N, 3D]: q and k of every head rotated (vision::rope_rotate_half), tables [N, hd/2].
Status vit_rope(uint16_t* qkv, int64_t N, int H, int hd, const float* cos_t, const float* sin_t, cudaStream_t st);
// o [N, D] head-major from qkv [N, 3D] (vision::attention_head for every head), one image.
Status vit_attention(const uint16_t* qkv, int64_t N, int H, int hd, float scale, uint16_t* o, cudaStream_t st);
// x = bf16(x + y), elementwise.
Status vit_residual(uint16_t* x, const uint16_t* y, int64_t n, cudaStream_t st);
// h [N, I] = bf16(bf16(silu(gate)) * up) from gu [N, 2I] (gate | up).
Status vit_swiglu(const uint16_t* gu, int64_t N, int64_t I, uint16_t* h, cudaStream_t st);
// The aligner's F.unfold: z [nlh*nlw, D*r*r] from f [nvh*nvw, D], zero outside the grid.
Status vit_unfold(const uint16_t* f, int nvh, int nvw, int64_t D, int r, uint16_t* z, cudaStream_t st);
// x[i] = lut[x[i]]
Status bf16_lut(uint16_t* x, int64_t n, const uint16_t* lut, cudaStream_t st);

}  // namespace fb::cuda
