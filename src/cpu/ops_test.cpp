// The CPU primitives against the official op vectors at the released constants (fixtures/ops).
#include "cpu/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "base/mapped_file.h"

namespace fb::cpu {
namespace {

std::string ops_dir() { return std::string(FB_SHARED_DIR) + "/fixtures/ops/"; }

template <typename T>
std::vector<T> load(const std::string& name) {
  auto b = read_file_bytes(ops_dir() + name);
  EXPECT_TRUE(b.ok()) << name;
  std::vector<T> v(b->size() / sizeof(T));
  std::memcpy(v.data(), b->data(), v.size() * sizeof(T));
  return v;
}

class OpVectors : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(ops_dir() + "manifest.json")) GTEST_SKIP() << "no op vectors";
  }
};

TEST_F(OpVectors, ActQuant) {
  auto x = load<uint16_t>("act_quant.x.bf16");
  auto q = load<uint8_t>("act_quant.q.e4m3");
  auto s = load<float>("act_quant.scale.f32");
  auto qdq = load<uint16_t>("act_quant.qdq.bf16");
  const int rows = 7, K = 512;
  std::vector<uint8_t> codes(K), e8(K / 32);
  std::vector<float> sc(K / 32);
  std::vector<uint16_t> out(K);
  for (int r = 0; r < rows; ++r) {
    act_quant_row(&x[r * K], K, codes.data(), sc.data());
    for (int i = 0; i < K; ++i) ASSERT_EQ(codes[i], q[r * K + i]) << r << "," << i;
    for (int b = 0; b < K / 32; ++b) ASSERT_EQ(sc[b], s[r * 16 + b]);
    fp8_qdq_row(&x[r * K], K, codes.data(), e8.data(), out.data());
    for (int i = 0; i < K; ++i) ASSERT_EQ(out[i], qdq[r * K + i]) << r << "," << i;
  }
}

// One FP4 quantiser against its vectors: rows of K elements, packed codes, one scale byte per
// `block` elements, the dequantised bf16 row (spec/11 §1.5a, §1.5b).
template <typename Qdq>
void expect_fp4_vectors(const std::string& name, const std::string& scale_file, int K, int block, Qdq qdq) {
  auto x = load<uint16_t>(name + ".x.bf16");
  auto packed = load<uint8_t>(name + ".packed.u8");
  auto scale = load<uint8_t>(name + scale_file);
  auto want = load<uint16_t>(name + ".qdq.bf16");
  std::vector<uint8_t> p(size_t(K / 2)), s(size_t(K / block));
  std::vector<uint16_t> out(static_cast<size_t>(K));
  for (int r = 0; r < 7; ++r) {
    qdq(&x[size_t(r * K)], K, p.data(), s.data(), out.data());
    for (int i = 0; i < K / 2; ++i) ASSERT_EQ(p[size_t(i)], packed[size_t(r * K / 2 + i)]) << r << "," << i;
    for (int i = 0; i < K / block; ++i) ASSERT_EQ(s[size_t(i)], scale[size_t(r * K / block + i)]);
    for (int i = 0; i < K; ++i) ASSERT_EQ(out[size_t(i)], want[size_t(r * K + i)]);
  }
}

TEST_F(OpVectors, Fp4E8m0) { expect_fp4_vectors("fp4_e8m0", ".scale.e8m0", 128, 32, fp4_e8m0_qdq_row); }

TEST_F(OpVectors, Fp4E4m3) { expect_fp4_vectors("fp4_e4m3", ".scale.e4m3", 512, 16, fp4_e4m3_qdq_row); }

// Max |a-b| in units of the bf16 ulp of the reference value.
double bf16_ulps(uint16_t a, uint16_t b) {
  double fa = bf(a), fb = bf(b);
  if (fa == fb) return 0;
  int e;
  std::frexp(std::max(std::fabs(fa), std::fabs(fb)), &e);
  return std::fabs(fa - fb) / std::ldexp(1.0, e - 8);
}

// A GEMM of 5 rows against the reference's output: every element within one bf16 ulp.
template <typename Gemm>
int expect_gemm_vectors(const std::string& name, const std::string& w_file, DType w_dtype, std::vector<int64_t> w_shape,
                        std::vector<int64_t> s_shape, int64_t N, Gemm gemm) {
  auto x = load<uint16_t>(name + ".x.bf16");
  auto w = load<uint8_t>(name + w_file);
  auto ws = load<uint8_t>(name + ".w_scale.e8m0");
  auto y = load<uint16_t>(name + ".y.bf16");
  TensorView W{w_dtype, std::move(w_shape), w.data()}, S{DType::kF8E8M0, std::move(s_shape), ws.data()};
  std::vector<uint16_t> out(size_t(5 * N));
  gemm(x.data(), 5, W, S, out.data());
  double worst = 0;
  int exact = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    worst = std::max(worst, bf16_ulps(out[i], y[i]));
    exact += out[i] == y[i];
  }
  EXPECT_LE(worst, 1.0) << "exact " << exact << "/" << out.size();
  return exact;
}

TEST_F(OpVectors, Fp8Gemm) {
  const int exact = expect_gemm_vectors("fp8_gemm", ".w.e4m3", DType::kF8E4M3, {96, 5120}, {3, 160}, 96, fp8_gemm);
  RecordProperty("fp8_gemm_exact", exact);
}

TEST_F(OpVectors, Fp4Gemm) { expect_gemm_vectors("fp4_gemm", ".w.e2m1x2", DType::kI8, {64, 2560}, {64, 160}, 64, fp4_gemm); }

TEST_F(OpVectors, HcSinkhorn) {
  auto mixes = load<float>("hc_sinkhorn.mixes.f32");
  auto scale = load<float>("hc_sinkhorn.scale.f32");
  auto base = load<float>("hc_sinkhorn.base.f32");
  auto pre = load<float>("hc_sinkhorn.pre.f32");
  auto post = load<float>("hc_sinkhorn.post.f32");
  auto comb = load<float>("hc_sinkhorn.comb.f32");
  for (int r = 0; r < 9; ++r) {
    model::HcMix m;
    model::hc_split_sinkhorn(&mixes[r * 24], 4, scale.data(), base.data(), 20, 1e-6f, &m);
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(m.pre[i], pre[r * 4 + i], 2e-7f * std::fabs(pre[r * 4 + i]) + 1e-12f);
      EXPECT_NEAR(m.post[i], post[r * 4 + i], 2e-7f * std::fabs(post[r * 4 + i]) + 1e-12f);
    }
    for (int i = 0; i < 16; ++i) EXPECT_NEAR(m.comb[i], comb[r * 16 + i], 1e-6f * std::fabs(comb[r * 16 + i]) + 1e-9f) << r << "," << i;
  }
}

TEST_F(OpVectors, Rope) {
  auto pos = load<int64_t>("rope.positions.i64");
  // The largest |difference| of a table's cos and sin at the fixture's positions from the
  // reference's rope.<name>_cos / _sin rows.
  auto worst_of = [&](const model::RopeTable& table, const std::string& name) {
    auto want_cos = load<float>("rope." + name + "_cos.f32"), want_sin = load<float>("rope." + name + "_sin.f32");
    double worst = 0;
    for (size_t r = 0; r < pos.size(); ++r) {
      float c[32], s[32];
      table.at(pos[r], c, s);
      for (int i = 0; i < 32; ++i) {
        worst = std::max(worst, double(std::fabs(c[i] - want_cos[r * 32 + i])));
        worst = std::max(worst, double(std::fabs(s[i] - want_sin[r * 32 + i])));
      }
    }
    return worst;
  };
  // cos/sin of angles up to ~1e6 rad: a 1-ulp difference in the angle moves the result ~6e-8 * angle.
  EXPECT_LE(worst_of(model::make_rope_table(64, 160000, true, 16, 65536, 32, 1), "compressed"), 2e-6);
  EXPECT_LE(worst_of(model::make_rope_table(64, 10000, false, 1, 0, 32, 1), "window"), 2e-6);
}

TEST_F(OpVectors, SparseAttention) {
  auto q = load<uint16_t>("sparse_attn.q.bf16");
  auto kv = load<uint16_t>("sparse_attn.kv.bf16");
  auto sink = load<float>("sparse_attn.sink.f32");
  auto idx = load<int32_t>("sparse_attn.idx.i32");
  auto want = load<uint16_t>("sparse_attn.out.bf16");
  const int H = 4, d = 512, L = 140;
  double worst = 0;
  for (int t = 0; t < 3; ++t) {
    std::vector<const uint16_t*> keys;
    for (int j = 0; j < L; ++j) {
      int i = idx[t * L + j];
      keys.push_back(i < 0 ? nullptr : &kv[size_t(i) * d]);
    }
    std::vector<uint16_t> out(H * d);
    sparse_attention(&q[t * H * d], H, d, keys, sink.data(), float(0.04419417382415922), out.data());
    for (int i = 0; i < H * d; ++i) worst = std::max(worst, bf16_ulps(out[i], want[t * H * d + i]));
  }
  EXPECT_LE(worst, 1.0);
}

TEST_F(OpVectors, Router) {
  auto x = load<uint16_t>("router.x.bf16");
  auto w = load<uint16_t>("router.weight.bf16");
  auto bias = load<float>("router.bias.f32");
  auto weights = load<float>("router.weights.f32");
  auto indices = load<int64_t>("router.indices.i64");
  TensorView W{DType::kBF16, {384, 256}, reinterpret_cast<const uint8_t*>(w.data())};
  for (int t = 0; t < 6; ++t) {
    Routing r = route(&x[t * 256], 256, W, bias.data(), 6, 1.0f, true, 1.5f);
    for (int k = 0; k < 6; ++k) {
      EXPECT_EQ(r.experts[k], indices[t * 6 + k]) << t << "," << k;
      EXPECT_NEAR(r.weights[k], weights[t * 6 + k], 1e-6f * weights[t * 6 + k]);
    }
  }
}

// Cache-conditional routing (prefer_resident): the weakest non-resident chosen expert gives way
// first, to the best unchosen resident one when within the margin; it stops at the first that is
// not; a resident chosen expert stays; each resident expert is taken once; margin 0 changes
// nothing; the result is in descending biased score.
TEST(PreferResident, SwapsWithinTheMarginWeakestFirst) {
  const float b[8] = {0.90f, 0.80f, 0.75f, 0.70f, 0.50f, 0.45f, 0.20f, 0.10f};
  const std::vector<int> top = {0, 1, 2};
  const auto resident = [](std::set<int> r) { return [r](int e) { return r.count(e) > 0; }; };
  RoutePreference p;
  p.resident = resident({0, 3, 4});
  int swaps = -1;
  EXPECT_EQ(prefer_resident(top, b, 8, p, &swaps), top);  // margin 0: off
  EXPECT_EQ(swaps, 0);
  p.margin = 0.06f;  // 2 (0.75) -> 3 (0.70); 1 (0.80) vs 4 (0.50): too far, stop
  EXPECT_EQ(prefer_resident(top, b, 8, p, &swaps), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(swaps, 1);
  p.margin = 0.31f;  // 2 -> 3, 1 -> 4 (0.50 >= 0.49)
  EXPECT_EQ(prefer_resident(top, b, 8, p, &swaps), (std::vector<int>{0, 3, 4}));
  EXPECT_EQ(swaps, 2);
  p.margin = 1.0f;
  p.resident = resident({2, 5});  // 2 stays; 1 -> 5; 0 has no candidate left
  EXPECT_EQ(prefer_resident(top, b, 8, p, &swaps), (std::vector<int>{0, 2, 5}));
  EXPECT_EQ(swaps, 1);
}

}  // namespace
}  // namespace fb::cpu
