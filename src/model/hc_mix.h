// mHC coefficient split + Sinkhorn (spec/11 §1.8), written once for the CPU reference and the
// CUDA kernels (FB_HD): pre/post sigmoids, row softmax + eps, 20 column passes. hc <= 16.
#pragma once

#include "base/fmath.h"

namespace fb::model {

struct HcMix {
  float pre[16];
  float post[16];
  float comb[16 * 16];  // [source a][destination b]
};

// mixes m[j] (raw, already scaled by rsqrt(mean(v^2) + eps)) -> pre, post, comb.
FB_HD void hc_split_sinkhorn(const float* m, int hc, const float* sc, const float* base, int iters, float eps, HcMix* out) {
  for (int i = 0; i < hc; ++i) {
    out->pre[i] = fm::add(fm::sigmoid(fm::add(fm::mul(m[i], sc[0]), base[i])), eps);
    out->post[i] = fm::mul(2.0f, fm::sigmoid(fm::add(fm::mul(m[hc + i], sc[1]), base[hc + i])));
  }
  float* C = out->comb;
  for (int a = 0; a < hc; ++a) {
    float mx = -__builtin_huge_valf();
    for (int b = 0; b < hc; ++b) {
      C[a * hc + b] = fm::add(fm::mul(m[2 * hc + a * hc + b], sc[2]), base[2 * hc + a * hc + b]);
      mx = mx < C[a * hc + b] ? C[a * hc + b] : mx;  // std::max semantics
    }
    float sum = 0.0f;
    for (int b = 0; b < hc; ++b) {
      C[a * hc + b] = fm::exp(fm::add(C[a * hc + b], -mx));
      sum = fm::add(sum, C[a * hc + b]);
    }
    for (int b = 0; b < hc; ++b) C[a * hc + b] = fm::add(fm::div(C[a * hc + b], sum), eps);
  }
  auto col_norm = [&] {
    for (int b = 0; b < hc; ++b) {
      float s = 0.0f;
      for (int a = 0; a < hc; ++a) s = fm::add(s, C[a * hc + b]);
      for (int a = 0; a < hc; ++a) C[a * hc + b] = fm::div(C[a * hc + b], fm::add(s, eps));
    }
  };
  auto row_norm = [&] {
    for (int a = 0; a < hc; ++a) {
      float s = 0.0f;
      for (int b = 0; b < hc; ++b) s = fm::add(s, C[a * hc + b]);
      for (int b = 0; b < hc; ++b) C[a * hc + b] = fm::div(C[a * hc + b], fm::add(s, eps));
    }
  };
  col_norm();
  for (int it = 1; it < iters; ++it) {
    row_norm();
    col_norm();
  }
}

}  // namespace fb::model
