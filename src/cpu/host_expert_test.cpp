// The host expert (host_expert.h) against the CPU executor's own sequence of calls, bit for bit,
// on the thread pool, with and without the vector kernels.
#include "cpu/host_expert.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "base/thread_pool.h"
#include "cpu/block_gemm_simd.h"
#include "cpu/ops.h"

namespace fb::cpu {
namespace {

TEST(HostExpert, SameBitsAsTheExecutorsExpert) {
  std::mt19937 rng(3);
  const int64_t D = 1024, I = 544;  // I / 32 = 17 blocks: a partial group of 16 in w2's rows
  std::vector<uint8_t> w1(size_t(I * D / 2)), w3(w1.size()), w2(size_t(D * I / 2)), s1(size_t(I * D / 32)), s3(s1.size()), s2(size_t(D * I / 32));
  for (auto* v : {&w1, &w3, &w2}) for (auto& b : *v) b = uint8_t(rng());
  for (auto* v : {&s1, &s3, &s2}) for (auto& b : *v) b = uint8_t(118 + rng() % 16);
  model::ExpertWeights ex;
  ex.w1 = {TensorView{DType::kI8, {I, D / 2}, w1.data()}, TensorView{DType::kU8, {I, D / 32}, s1.data()}};
  ex.w3 = {TensorView{DType::kI8, {I, D / 2}, w3.data()}, TensorView{DType::kU8, {I, D / 32}, s3.data()}};
  ex.w2 = {TensorView{DType::kI8, {D, I / 2}, w2.data()}, TensorView{DType::kU8, {D, I / 32}, s2.data()}};
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> u(static_cast<size_t>(D));
  for (auto& x : u) x = to_bf(nd(rng));
  const float limit = 10.0f, weight = 0.37f;
  // The executor's sequence (cpu/layer_ops.h, the routed experts of one row).
  std::vector<uint16_t> a(static_cast<size_t>(I)), b(static_cast<size_t>(I)), h(static_cast<size_t>(I)), want(static_cast<size_t>(D));
  simd::set_enabled(false);
  fp4_gemm(u.data(), 1, ex.w1.w, ex.w1.scale, a.data());
  fp4_gemm(u.data(), 1, ex.w3.w, ex.w3.scale, b.data());
  swiglu_row(a.data(), b.data(), I, limit, weight, true, h.data());
  fp4_gemm(h.data(), 1, ex.w2.w, ex.w2.scale, want.data());
  // On the pool as the process has it (the hardware's threads; the rows are cut in chunks of
  // their own either way).
  for (bool vec : {false, true}) {
    simd::set_enabled(vec);
    std::vector<uint16_t> got(static_cast<size_t>(D), 0xFFFF);
    expert_one_token(u.data(), ex, limit, weight, got.data());
    EXPECT_EQ(got, want) << "pool of " << thread_count() << (vec ? ", vector kernels" : ", scalar");
  }
  simd::set_enabled(true);
}

}  // namespace
}  // namespace fb::cpu
