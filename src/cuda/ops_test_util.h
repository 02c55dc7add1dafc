// Shared helpers of the CUDA op tests (ops_test.cpp: bit-identical parity; tc_ops_test.cpp and
// fast_small_test.cpp: the tensor-core paths and the fused fast ops within written-down
// tolerances): a seeded generator of released-shape operands, the NaN-aware bitwise comparison,
// and the CPU-side references reused by these files.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "cpu/ops.h"
#include "cuda/gpu_test_util.h"
#include "cuda/ops.h"
#include "cuda/tc_gemm.h"

namespace fb::cuda::ops_test_util {

using bf16_t = uint16_t;
using test_util::Dev;
using test_util::have_gpu;

inline bool isnan_bits(uint16_t b) { return (b & 0x7FFF) > 0x7F80; }
inline bool isnan_bits(float f) { return std::isnan(f); }
inline bool isnan_bits(uint8_t) { return false; }
inline bool isnan_bits(int32_t) { return false; }

// NaN masks first, then every other element bit for bit.
template <typename T>
void expect_same(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t nan_diff = 0, bit_diff = 0, first = size_t(-1);
  for (size_t i = 0; i < got.size(); ++i) {
    if (isnan_bits(got[i]) != isnan_bits(want[i])) {
      ++nan_diff;
      if (first == size_t(-1)) first = i;
    } else if (!isnan_bits(got[i]) && std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      ++bit_diff;
      if (first == size_t(-1)) first = i;
    }
  }
  EXPECT_EQ(nan_diff, 0u) << what << ": NaN masks differ, first at " << first;
  EXPECT_EQ(bit_diff, 0u) << what << ": " << bit_diff << " of " << got.size() << " elements differ, first at " << first;
}

struct Rng {
  std::mt19937_64 g;
  explicit Rng(uint64_t seed) : g(seed) {}
  float normal(float s = 1.0f) { return std::normal_distribution<float>(0.0f, s)(g); }
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g); }
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(g); }
  // bf16 activations with varied block magnitudes: normal, sub-floor, exact powers, ties.
  std::vector<bf16_t> act(int64_t n, float s = 1.0f) {
    std::vector<bf16_t> v(static_cast<size_t>(n));
    for (int64_t b = 0; b < n; b += 32) {
      const int kind = uniform(0, 9);
      for (int64_t i = b; i < std::min(n, b + 32); ++i) {
        float x = normal(s);
        if (kind == 0) x *= 1e-7f;                                      // below the 1e-4 amax floor
        if (kind == 1) x = std::ldexp(1.0f, uniform(-8, 8)) * (uniform(0, 1) ? 1.f : -1.f);  // exact powers
        if (kind == 2) x = float(uniform(-8, 8)) * 0.5f;                // many ties
        v[size_t(i)] = bf16_bits_from_f32(x);
      }
    }
    return v;
  }
  // bf16 normals whose per-32-block magnitudes differ by powers of two (act_quant scales).
  std::vector<bf16_t> bf16(int64_t n, float s = 1.0f) {
    std::vector<bf16_t> v(static_cast<size_t>(n));
    for (int64_t b = 0; b < n; b += 32) {
      const float blk = s * std::ldexp(1.0f, uniform(-3, 3));
      for (int64_t i = b; i < std::min(n, b + 32); ++i) v[size_t(i)] = bf16_bits_from_f32(normal(blk));
    }
    return v;
  }
  std::vector<uint8_t> e4m3_codes(int64_t n) {
    std::vector<uint8_t> v(static_cast<size_t>(n));
    for (auto& c : v) {
      do c = uint8_t(uniform(0, 255));
      while ((c & 0x7F) == 0x7F);
    }
    return v;
  }
  std::vector<uint8_t> bytes(int64_t n, int lo = 0, int hi = 255) {
    std::vector<uint8_t> v(static_cast<size_t>(n));
    for (auto& c : v) c = uint8_t(uniform(lo, hi));
    return v;
  }
  std::vector<float> f32(int64_t n, float s = 1.0f) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = normal(s);
    return v;
  }
};

// Compact cache rows made by the CPU's QDQ of `n` random latents (Rng::act, scale 2), with their
// exact bf16 values [n, d]: FP8 window rows (d e4m3 codes + d/32 e8m0 scales each) or FP4
// compressed entries (d/2 packed e2m1 + d/16 e4m3 scales each).
struct QdqRows {
  std::vector<uint8_t> rows;
  std::vector<bf16_t> values;
};
inline QdqRows fp8_window_rows(Rng& rng, int64_t n, int d) {
  const int64_t rb = d + d / 32;
  QdqRows r{std::vector<uint8_t>(static_cast<size_t>(n * rb)), std::vector<bf16_t>(static_cast<size_t>(n * d))};
  auto lat = rng.act(n * d, 2.0f);
  for (int64_t i = 0; i < n; ++i)
    cpu::fp8_qdq_row(&lat[size_t(i * d)], d, &r.rows[size_t(i * rb)], &r.rows[size_t(i * rb + d)], &r.values[size_t(i * d)]);
  return r;
}
inline QdqRows fp4_comp_rows(Rng& rng, int64_t n, int d) {
  const int64_t rb = d / 2 + d / 16;
  QdqRows r{std::vector<uint8_t>(static_cast<size_t>(n * rb)), std::vector<bf16_t>(static_cast<size_t>(n * d))};
  auto lat = rng.act(n * d, 2.0f);
  for (int64_t i = 0; i < n; ++i)
    cpu::fp4_e4m3_qdq_row(&lat[size_t(i * d)], d, &r.rows[size_t(i * rb)], &r.rows[size_t(i * rb + d / 2)], &r.values[size_t(i * d)]);
  return r;
}

inline TensorView view(DType t, std::vector<int64_t> shape, const void* p) { return TensorView{t, std::move(shape), static_cast<const uint8_t*>(p)}; }

// grouped wo_a: 64 heads x 512 = 32768 wide o, 16 groups of 2048 -> 1024 each; M rows of o, the
// group weights, and the CPU's outputs.
struct GroupedWoA {
  static constexpr int64_t G = 16, GI = 2048, OR = 1024, QD = G * GI;
  int64_t M;
  std::vector<bf16_t> o, w, want;
  GroupedWoA(Rng& rng, int64_t rows) : M(rows), o(rng.act(rows * QD, 0.5f)), w(rng.act(G * OR * GI, 0.02f)) {
    want.resize(static_cast<size_t>(M * G * OR));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t g = 0; g < G; ++g)
        cpu::bf16_gemm(&o[size_t(m * QD + g * GI)], 1, GI, &w[size_t(g * OR * GI)], OR, &want[size_t(m * G * OR + g * OR)]);
  }
};

// mHC at hc 4 x 5120 for T rows: streams, mix weights, scales, biases and the CPU's mixes.
struct HcCase {
  static constexpr int hc = 4;
  static constexpr int64_t D = 5120, n = hc * D, n_mix = (2 + hc) * hc;
  int64_t T;
  std::vector<bf16_t> x;
  std::vector<float> fn, sc, base;
  std::vector<HcMix> want;
  HcCase(Rng& rng, int64_t rows)
      : T(rows), x(rng.act(rows * n)), fn(rng.f32(n_mix * n, 0.01f)), sc(rng.f32(3, 0.5f)), base(rng.f32(n_mix, 0.5f)) {
    want.resize(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      float m[n_mix];
      cpu::hc_mixes_raw(&x[size_t(t * n)], hc, D, fn.data(), 1e-6f, m);
      model::hc_split_sinkhorn(m, hc, sc.data(), base.data(), 20, 1e-6f, &want[size_t(t)]);
    }
  }
};

inline std::unique_ptr<TcGemm> make_tc() {
  auto t = TcGemm::create();
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? std::move(*t) : nullptr;
}

}  // namespace fb::cuda::ops_test_util
