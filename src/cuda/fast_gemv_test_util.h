// Helpers of the fast GEMV tests (fast_gemv_test.cpp, rs_gemv_test.cpp; one test binary): random
// operands, the accuracy / row-invariance checks, the FP8 and MXFP4 operand sets. Test-only.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "cuda/gpu_test_util.h"
#include "cuda/ops.h"
#include "cuda/tc_gemv.h"

namespace fb::cuda::gemv_test {

using bf16_t = uint16_t;
using test_util::Dev;

struct Rng {
  std::mt19937_64 g;
  explicit Rng(uint64_t seed) : g(seed) {}
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g); }
  // bf16 activations, normal with a per-32-block magnitude spread (act_quant scales differ).
  std::vector<bf16_t> act(int64_t n, float s = 1.0f) {
    std::vector<bf16_t> v(static_cast<size_t>(n));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int64_t b = 0; b < n; b += 32) {
      const float blk = s * std::ldexp(1.0f, uniform(-3, 3));
      for (int64_t i = b; i < std::min(n, b + 32); ++i) v[size_t(i)] = bf16_bits_from_f32(blk * nd(g));
    }
    return v;
  }
  // e4m3 codes without the NaN codes (0x7F, 0xFF).
  std::vector<uint8_t> e4m3(int64_t n) {
    std::vector<uint8_t> v(static_cast<size_t>(n));
    for (auto& c : v) {
      do c = uint8_t(g());
      while ((c & 0x7F) == 0x7F);
    }
    return v;
  }
  std::vector<uint8_t> bytes(int64_t n, int lo = 0, int hi = 255) {
    std::vector<uint8_t> v(static_cast<size_t>(n));
    if (lo == 0 && hi == 255) {
      for (size_t i = 0; i < v.size(); i += 8) {
        const uint64_t r = g();
        std::memcpy(&v[i], &r, std::min<size_t>(8, v.size() - i));
      }
    } else {
      for (auto& c : v) c = uint8_t(uniform(lo, hi));
    }
    return v;
  }
  // Many bf16 weights quickly (the head is 530M of them): uniform in (-a, a) from one xorshift.
  std::vector<bf16_t> bf16_uniform(int64_t n, float a) {
    std::vector<bf16_t> v(static_cast<size_t>(n));
    uint64_t s = g() | 1;
    for (auto& x : v) {
      s ^= s << 13;
      s ^= s >> 7;
      s ^= s << 17;
      x = bf16_bits_from_f32(a * (float(int32_t(uint32_t(s >> 32))) * 0x1p-31f));
    }
    return v;
  }
};

inline double to_double(bf16_t b) { return bf16_to_f32(b); }
inline double to_double(float f) { return f; }

// (1): over the rows with keep[m] (all when keep is empty), rows of n values.
template <typename T>
void expect_close(const std::vector<T>& got, const std::vector<T>& want, int64_t n, const std::vector<bool>& keep, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double se = 0.0, ss = 0.0, max_err = 0.0;
  int64_t count = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!keep.empty() && !keep[i / size_t(n)]) continue;
    const double a = to_double(got[i]), b = to_double(want[i]);
    ASSERT_TRUE(std::isfinite(a) && std::isfinite(b)) << what << " at " << i;
    se += (a - b) * (a - b);
    ss += b * b;
    max_err = std::max(max_err, std::fabs(a - b));
    ++count;
  }
  ASSERT_GT(count, 0) << what;
  ASSERT_GT(ss, 0.0) << what;
  const double nmse = se / ss, rms = std::sqrt(ss / double(count));
  EXPECT_LE(nmse, 1e-5) << what;
  EXPECT_LE(max_err, 0.05 * rms) << what << " (rms " << rms << ")";
  std::printf("  %-44s nmse %.3g  max|err|/rms %.3g\n", what, nmse, max_err / rms);
}

// (2), (3): bit for bit, over row range [m0, m0 + rows) of `a` against the same rows of `b`.
template <typename T>
void expect_rows_same(const std::vector<T>& a, const std::vector<T>& b, int64_t n, int64_t m0, int64_t rows, const char* what) {
  ASSERT_GE(a.size(), size_t((m0 + rows) * n)) << what;
  ASSERT_GE(b.size(), size_t((m0 + rows) * n)) << what;
  EXPECT_EQ(std::memcmp(&a[size_t(m0 * n)], &b[size_t(m0 * n)], size_t(rows * n) * sizeof(T)), 0) << what << " rows " << m0 << ".." << m0 + rows;
}

// The rows of a call with M rows, read back from a [64, n] output.
template <typename T>
std::vector<T> head_rows(const std::vector<T>& v, int64_t n, int64_t rows) {
  return std::vector<T>(v.begin(), v.begin() + rows * n);
}

constexpr int64_t kRows = 64;

// T activation rows act_quant'ed into q and one FP8 weight [N, K] (random codes, scales near 1).
struct Fp8Set {
  int64_t N, K, KB, T;
  Dev<bf16_t> dx;
  Dev<uint8_t> dw, dws, qc;
  Dev<float> qs;
  QuantBuf q;
  Fp8W w;
  Fp8Set(Rng& rng, int64_t n, int64_t k, int64_t t)
      : N(n), K(k), KB(k / 32), T(t), dx(rng.act(t * k)), dw(rng.e4m3(n * k)), dws(rng.bytes(((n + 31) / 32) * (k / 32), 118, 132)),
        qc(size_t(t * k)), qs(size_t(t * (k / 32))), q{qc.p(), qs.p(), t * k}, w{dw.p(), dws.p(), n, k} {
    EXPECT_TRUE(act_quant(dx.p(), T, K, q, nullptr).ok());
  }
};

// kRows expert rows over `experts` experts of two MXFP4 weights A, B ([N, K] each, random codes,
// scales near 1): the (kRows - 1) / x_div + 1 tokens' activations act_quant'ed into q.
struct Fp4Set {
  int64_t N, K, KB, T;
  Dev<uint8_t> qc, wa, sa, wb, sb;
  Dev<float> qs;
  QuantBuf q;
  Fp4W A, B;
  Fp4Set(Rng& rng, int64_t n, int64_t k, int64_t x_div, int experts)
      : N(n), K(k), KB(k / 32), T((kRows - 1) / x_div + 1), qc(size_t(T * K)), wa(rng.bytes(N * K / 2 * experts)),
        sa(rng.bytes(N * KB * experts, 118, 130)), wb(rng.bytes(N * K / 2 * experts)), sb(rng.bytes(N * KB * experts, 118, 130)),
        qs(size_t(T * KB)), q{qc.p(), qs.p(), T * K}, A{wa.p(), sa.p(), N, K, N * K / 2, N * KB}, B{wb.p(), sb.p(), N, K, N * K / 2, N * KB} {
    Dev<bf16_t> dx(rng.act(T * K));
    EXPECT_TRUE(act_quant(dx.p(), T, K, q, nullptr).ok());
  }
};

// Two FP8 weights sharing the quantised rows of one activation: A [Na, K] and, when Nb > 0, B
// [Nb, K] (a one-row buffer otherwise), for tc_fp8_gemv's one- and two-output forms. The random
// draws in the order the tests made them before this helper (activations, A, its scales, B, its
// scales), so the cases' data did not change.
struct Fp8PairSet {
  int64_t Na, Nb, K, KB;
  Dev<bf16_t> dx;
  Dev<uint8_t> qc;
  Dev<float> qs;
  QuantBuf q;
  Dev<uint8_t> wa, sa, wb, sb;
  Fp8W A, B;
  Dev<bf16_t> ya, yb;
  Fp8PairSet(Rng& rng, int64_t na, int64_t nb, int64_t k)
      : Na(na), Nb(nb), K(k), KB(k / 32), dx(rng.act(kRows * K)), qc(size_t(kRows * K)), qs(size_t(kRows * KB)), q{qc.p(), qs.p(), kRows * K},
        wa(rng.e4m3(Na * K)), sa(rng.bytes(((Na + 31) / 32) * KB, 118, 132)), wb(rng.e4m3(std::max<int64_t>(Nb, 1) * K)),
        sb(rng.bytes(std::max<int64_t>((Nb + 31) / 32, 1) * KB, 118, 132)), A{wa.p(), sa.p(), Na, K}, B{wb.p(), sb.p(), Nb, K},
        ya(size_t(kRows * Na)), yb(size_t(kRows * std::max<int64_t>(Nb, 1))) {
    EXPECT_TRUE(act_quant(dx.p(), kRows, K, q, nullptr).ok());
  }
  // tc_fp8_gemv over the first M rows (outputs poisoned first): A's outputs, then B's buffer.
  std::vector<bf16_t> gemv(int64_t M) {
    ya.poison();
    yb.poison();
    EXPECT_TRUE((Nb ? tc_fp8_gemv(q, M, A, ya.p(), &B, yb.p(), nullptr) : tc_fp8_gemv(q, M, A, ya.p(), nullptr, nullptr, nullptr)).ok());
    auto v = ya.get();
    const auto vb = yb.get();
    v.insert(v.end(), vb.begin(), vb.end());
    return v;
  }
};

// kRows expert ids over `experts` experts, about 1 in (experts + 1) skipped (-1); row 0 uses
// expert 3, row 1 is skipped. And the rows that are not skipped.
inline std::vector<int32_t> expert_rows(Rng& rng, int experts) {
  std::vector<int32_t> ex(kRows);
  for (auto& e : ex) e = rng.uniform(-1, experts - 1);
  ex[0] = 3;
  ex[1] = -1;
  return ex;
}
inline std::vector<bool> kept_rows(const std::vector<int32_t>& ex) {
  std::vector<bool> keep(ex.size());
  for (size_t m = 0; m < ex.size(); ++m) keep[m] = ex[m] >= 0;
  return keep;
}

}  // namespace fb::cuda::gemv_test
