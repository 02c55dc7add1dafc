// The vision tower on the CPU (spec/14 §4-§5, reference vision.py ViT + Aligner): patch embed,
// blocks of [RMSNorm, 2-D RoPE bidirectional attention, RMSNorm, SwiGLU], final norm, then the
// 3x3 folding aligner with exact-erf GELU. Plain loops in the canonical orders of base/fmath.h
// (lanes32 dots, no FMA) so the CUDA port can reproduce them; this file DEFINES the numerics.
// Every tensor handed between steps is BF16, as in the reference (rounding points in §4).
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace fb::vision {

using bf16_t = uint16_t;

// ---- ops (each a plain function the CUDA half mirrors) --------------------------------------
// y[m, n] = bf16(lanes32_k(x[m,k] * w[n,k]) + bias[n]); bias may be null. w bf16 [N, K].
void linear_bf16(const bf16_t* x, int64_t M, int64_t K, const bf16_t* w, const bf16_t* bias, int64_t N, bf16_t* y);
// y = bf16(w * (x * rsqrt(mean(x^2) + eps))), w f32 (the reference holds the norms in f32).
void rms_norm_f32w(const bf16_t* x, int64_t n, const float* w, float eps, bf16_t* y);
// cos/sin table of the 2-D RoPE for an nvh x nvw grid: [N, head_dim/2] each, f32.
// theta_j = pos * inv_freq[j mod head_dim/4], rows for j < head_dim/4, columns after.
struct VitRope {
  int half = 0;  // head_dim / 2
  std::vector<float> cos, sin;
};
VitRope vit_rope(int nvh, int nvw, int head_dim, double theta);
// Rotate-half over one head in f32, one bf16 rounding: [x1 c - x2 s | x2 c + x1 s].
void rope_rotate_half(bf16_t* x, int head_dim, const float* cos, const float* sin);
// Full bidirectional attention of one head: q, k, v rows at stride `ld` (bf16), out [N] rows at
// stride ld. f32 scores (lanes32), max, p = exp(s - max), l = lanes32(p), o = lanes32(bf16(p) v) / l.
void attention_head(const bf16_t* q, const bf16_t* k, const bf16_t* v, int64_t N, int d, int64_t ld, float scale, bf16_t* out);
// 0.5 x (1 + erf(x / sqrt 2)) on a bf16 input, evaluated in double, one rounding to bf16
// [reference-defining: the reference evaluates in f32; double then round agrees to the last bf16 bit
// except at astronomically rare ties].
bf16_t gelu_erf_bf16(bf16_t x);

// ---- the tower --------------------------------------------------------------------------------
class VisionTower {
 public:
  VisionTower(const model::Config& cfg, const model::VisionWeights& w);
  // patches bf16 [nvh*nvw, 3*p*p] -> ViT output bf16 [nvh*nvw, vision_dim].
  std::vector<bf16_t> vit(const std::vector<bf16_t>& patches, int nvh, int nvw) const;
  // ViT output -> aligner rows bf16 [nlh*nlw, dim] in reading order.
  std::vector<bf16_t> align(const std::vector<bf16_t>& vit_out, int nvh, int nvw) const;

 private:
  const model::Config& c_;
  const model::VisionWeights& w_;
  std::vector<std::vector<float>> norm1_, norm2_;  // f32 copies of the norm weights
  std::vector<float> norm_;
};

}  // namespace fb::vision
