#include "vision/tower.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "base/dtype.h"
#include "base/fmath.h"
#include "base/thread_pool.h"

namespace fb::vision {

namespace {

inline float bf(bf16_t b) { return bf16_to_f32(b); }
inline bf16_t to_bf(float f) { return bf16_bits_from_f32(f); }
const bf16_t* bfp(const TensorView& t) { return t.as<bf16_t>(); }

std::vector<float> f32_copy(const TensorView& t) {
  std::vector<float> v(size_t(t.numel()));
  if (t.dtype == DType::kF32) {
    std::copy(t.as<float>(), t.as<float>() + t.numel(), v.begin());
  } else {
    FB_CHECK(t.dtype == DType::kBF16) << "vision norm weight dtype " << dtype_name(t.dtype);
    for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = bf(t.as<bf16_t>()[i]);
  }
  return v;
}

}  // namespace

void linear_bf16(const bf16_t* x, int64_t M, int64_t K, const bf16_t* w, const bf16_t* bias, int64_t N, bf16_t* y) {
  parallel_for(0, M, [&](int64_t m) {
    const bf16_t* xr = x + m * K;
    for (int64_t n = 0; n < N; ++n) {
      const bf16_t* wr = w + n * K;
      float acc = fm::lanes32_sum(K, [&](int64_t k) { return fm::mul(bf(xr[k]), bf(wr[k])); });
      if (bias) acc = fm::add(acc, bf(bias[n]));
      y[m * N + n] = to_bf(acc);
    }
  });
}

void rms_norm_f32w(const bf16_t* x, int64_t n, const float* w, float eps, bf16_t* y) {
  const float ss = fm::lanes32_sum(n, [&](int64_t i) { return fm::mul(bf(x[i]), bf(x[i])); });
  const float r = fm::rsqrt(fm::add(fm::div(ss, float(n)), eps));
  for (int64_t i = 0; i < n; ++i) y[i] = to_bf(fm::mul(w[i], fm::mul(bf(x[i]), r)));
}

VitRope vit_rope(int nvh, int nvw, int head_dim, double theta) {
  // Reference get_vision_cos_sin(n_h, n_w, dim = head_dim/2, theta): inv_freq over dim/2 entries
  // (f32 pow, f32 reciprocal), angles f32(pos) * inv_freq, cos/sin rounded from double
  // [reference-defining: torch's f32 cos/sin agree to the last ulp except rarely].
  VitRope r;
  r.half = head_dim / 2;
  const int q = r.half / 2;
  std::vector<float> inv(static_cast<size_t>(q));
  for (int j = 0; j < q; ++j) inv[size_t(j)] = 1.0f / std::pow(float(theta), float(2 * j) / float(r.half));
  const int64_t N = int64_t(nvh) * nvw;
  r.cos.resize(size_t(N) * size_t(r.half));
  r.sin.resize(size_t(N) * size_t(r.half));
  for (int pr = 0; pr < nvh; ++pr)
    for (int pc = 0; pc < nvw; ++pc) {
      const size_t base = (size_t(pr) * size_t(nvw) + size_t(pc)) * size_t(r.half);
      for (int j = 0; j < r.half; ++j) {
        const float a = fm::mul(float(j < q ? pr : pc), inv[size_t(j % q)]);
        r.cos[base + size_t(j)] = float(std::cos(double(a)));
        r.sin[base + size_t(j)] = float(std::sin(double(a)));
      }
    }
  return r;
}

void rope_rotate_half(bf16_t* x, int head_dim, const float* cos, const float* sin) {
  const int h = head_dim / 2;
  for (int d = 0; d < h; ++d) {
    const float x1 = bf(x[d]), x2 = bf(x[d + h]);
    const float a = fm::add(fm::mul(x1, cos[d]), -fm::mul(x2, sin[d]));
    const float b = fm::add(fm::mul(x2, cos[d]), fm::mul(x1, sin[d]));
    x[d] = to_bf(a);
    x[d + h] = to_bf(b);
  }
}

void attention_head(const bf16_t* q, const bf16_t* k, const bf16_t* v, int64_t N, int d, int64_t ld, float scale, bf16_t* out) {
  parallel_for(0, N, [&](int64_t i) {
    std::vector<float> s(static_cast<size_t>(N));
    const bf16_t* qi = q + i * ld;
    float mx = -INFINITY;
    for (int64_t j = 0; j < N; ++j) {
      const bf16_t* kj = k + j * ld;
      s[size_t(j)] = fm::mul(fm::lanes32_sum(d, [&](int64_t e) { return fm::mul(bf(qi[e]), bf(kj[e])); }), scale);
      mx = std::max(mx, s[size_t(j)]);
    }
    for (int64_t j = 0; j < N; ++j) s[size_t(j)] = fm::exp(fm::add(s[size_t(j)], -mx));
    const float l = fm::lanes32_sum(N, [&](int64_t j) { return s[size_t(j)]; });
    for (int e = 0; e < d; ++e) {
      const float o = fm::lanes32_sum(N, [&](int64_t j) { return fm::mul(bf(to_bf(s[size_t(j)])), bf(v[j * ld + e])); });
      out[i * ld + e] = to_bf(fm::div(o, l));
    }
  });
}

bf16_t gelu_erf_bf16(bf16_t xb) {
  const double x = bf(xb);
  return to_bf(float(0.5 * x * (1.0 + std::erf(x * 0.70710678118654752440))));
}

VisionTower::VisionTower(const model::Config& cfg, const model::VisionWeights& w) : c_(cfg), w_(w) {
  for (const auto& b : w_.blocks) {
    norm1_.push_back(f32_copy(b.norm1));
    norm2_.push_back(f32_copy(b.norm2));
  }
  norm_ = f32_copy(w_.norm);
}

std::vector<bf16_t> VisionTower::vit(const std::vector<bf16_t>& patches, int nvh, int nvw) const {
  const auto& vc = c_.vision;
  const int64_t N = int64_t(nvh) * nvw, D = vc.dim, H = vc.n_heads, hd = D / H, I = vc.inter_dim;
  const int64_t P = 3LL * vc.patch_size * vc.patch_size;
  FB_CHECK_EQ(int64_t(patches.size()), N * P);
  constexpr float kEps = 1e-6f;
  std::vector<bf16_t> x(size_t(N * D)), a(size_t(N * D)), qkv(size_t(N * 3 * D)), o(size_t(N * D)), y(size_t(N * D));
  std::vector<bf16_t> gu(size_t(N * 2 * I)), h(size_t(N * I));
  linear_bf16(patches.data(), N, P, bfp(w_.patch_w), bfp(w_.patch_b), D, x.data());  // [N, D]
  const VitRope rope = vit_rope(nvh, nvw, int(hd), vc.rope_theta);
  const float scale = float(1.0 / std::sqrt(double(hd)));
  for (size_t l = 0; l < w_.blocks.size(); ++l) {
    const auto& b = w_.blocks[l];
    parallel_for(0, N, [&](int64_t t) { rms_norm_f32w(&x[size_t(t * D)], D, norm1_[l].data(), kEps, &a[size_t(t * D)]); });
    linear_bf16(a.data(), N, D, bfp(b.wqkv_w), bfp(b.wqkv_b), 3 * D, qkv.data());  // [N, 3D]: q | k | v
    parallel_for(0, N, [&](int64_t t) {
      for (int64_t hh = 0; hh < H; ++hh)
        for (int part = 0; part < 2; ++part)  // q and k rotate; v does not
          rope_rotate_half(&qkv[size_t(t * 3 * D + part * D + hh * hd)], int(hd), &rope.cos[size_t(t * rope.half)], &rope.sin[size_t(t * rope.half)]);
    });
    // o [N, D] head-major: column 64h + d (the reference's transpose back + reshape)
    for (int64_t hh = 0; hh < H; ++hh)
      attention_head(&qkv[size_t(hh * hd)], &qkv[size_t(D + hh * hd)], &qkv[size_t(2 * D + hh * hd)], N, int(hd), 3 * D, scale,
                     &qkv[size_t(hh * hd)]);  // q of a row is read only by that row's query: overwrite in place
    parallel_for(0, N, [&](int64_t t) { std::copy_n(&qkv[size_t(t * 3 * D)], D, &o[size_t(t * D)]); });
    linear_bf16(o.data(), N, D, bfp(b.wo_w), bfp(b.wo_b), D, y.data());
    for (int64_t i = 0; i < N * D; ++i) x[size_t(i)] = to_bf(fm::add(bf(x[size_t(i)]), bf(y[size_t(i)])));
    parallel_for(0, N, [&](int64_t t) { rms_norm_f32w(&x[size_t(t * D)], D, norm2_[l].data(), kEps, &a[size_t(t * D)]); });
    linear_bf16(a.data(), N, D, bfp(b.w1), nullptr, 2 * I, gu.data());  // [N, 2I]: gate | up
    parallel_for(0, N, [&](int64_t t) {
      for (int64_t i = 0; i < I; ++i) {
        const bf16_t g = to_bf(fm::silu(bf(gu[size_t(t * 2 * I + i)])));  // F.silu on bf16: one rounding
        h[size_t(t * I + i)] = to_bf(fm::mul(bf(g), bf(gu[size_t(t * 2 * I + I + i)])));
      }
    });
    linear_bf16(h.data(), N, I, bfp(b.w2), nullptr, D, y.data());
    for (int64_t i = 0; i < N * D; ++i) x[size_t(i)] = to_bf(fm::add(bf(x[size_t(i)]), bf(y[size_t(i)])));
  }
  parallel_for(0, N, [&](int64_t t) { rms_norm_f32w(&x[size_t(t * D)], D, norm_.data(), kEps, &a[size_t(t * D)]); });
  return a;
}

std::vector<bf16_t> VisionTower::align(const std::vector<bf16_t>& f, int nvh, int nvw) const {
  const auto& vc = c_.vision;
  const int64_t D = vc.dim, r = vc.downsample, out = c_.dim;
  const int64_t nlh = (nvh + r - 1) / r, nlw = (nvw + r - 1) / r, M = nlh * nlw, K = D * r * r;
  FB_CHECK_EQ(int64_t(f.size()), int64_t(nvh) * nvw * D);
  // F.unfold order: feature c*r*r + kh*r + kw of cell (i, j) = f[3i+kh, 3j+kw, c]; zero outside.
  std::vector<bf16_t> z(size_t(M * K), 0);
  for (int64_t i = 0; i < nlh; ++i)
    for (int64_t j = 0; j < nlw; ++j)
      for (int64_t kh = 0; kh < r; ++kh)
        for (int64_t kw = 0; kw < r; ++kw) {
          const int64_t y = i * r + kh, x = j * r + kw;
          if (y >= nvh || x >= nvw) continue;
          for (int64_t c = 0; c < D; ++c) z[size_t((i * nlw + j) * K + c * r * r + kh * r + kw)] = f[size_t((y * nvw + x) * D + c)];
        }
  std::vector<bf16_t> y1(size_t(M * out)), y2(size_t(M * out));
  linear_bf16(z.data(), M, K, bfp(w_.aligner_w1), bfp(w_.aligner_b1), out, y1.data());
  for (auto& v : y1) v = gelu_erf_bf16(v);
  linear_bf16(y1.data(), M, out, bfp(w_.aligner_w2), bfp(w_.aligner_b2), out, y2.data());
  return y2;
}

}  // namespace fb::vision
