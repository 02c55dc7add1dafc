// The host expert (host_expert.h) against the CPU executor's own sequence of calls, bit for bit,
// on the thread pool, with and without the vector kernels.
#include "cpu/host_expert.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <random>
#include <vector>

#include "base/thread_pool.h"
#include "cpu/block_gemm_simd.h"
#include "cpu/ops.h"

namespace fb::cpu {
namespace {

struct RandomExpert {
  std::vector<uint8_t> w1, w3, w2, s1, s3, s2;
  model::ExpertWeights ex;
  RandomExpert(std::mt19937& rng, int64_t D, int64_t I)
      : w1(size_t(I * D / 2)), w3(w1.size()), w2(size_t(D * I / 2)), s1(size_t(I * D / 32)), s3(s1.size()), s2(size_t(D * I / 32)) {
    for (auto* v : {&w1, &w3, &w2})
      for (auto& b : *v) b = uint8_t(rng());
    for (auto* v : {&s1, &s3, &s2})
      for (auto& b : *v) b = uint8_t(118 + rng() % 16);
    ex.w1 = {TensorView{DType::kI8, {I, D / 2}, w1.data()}, TensorView{DType::kU8, {I, D / 32}, s1.data()}};
    ex.w3 = {TensorView{DType::kI8, {I, D / 2}, w3.data()}, TensorView{DType::kU8, {I, D / 32}, s3.data()}};
    ex.w2 = {TensorView{DType::kI8, {D, I / 2}, w2.data()}, TensorView{DType::kU8, {D, I / 32}, s2.data()}};
  }
};

// The executor's sequence (cpu/layer_ops.h, the routed experts of one row), scalar.
std::vector<uint16_t> reference_expert(const uint16_t* u, const model::ExpertWeights& ex, float limit, float weight) {
  const int64_t I = ex.w1.w.dim(0), D = ex.w2.w.dim(0);
  std::vector<uint16_t> a(static_cast<size_t>(I)), b(static_cast<size_t>(I)), h(static_cast<size_t>(I)), want(static_cast<size_t>(D));
  simd::set_enabled(false);
  fp4_gemm(u, 1, ex.w1.w, ex.w1.scale, a.data());
  fp4_gemm(u, 1, ex.w3.w, ex.w3.scale, b.data());
  swiglu_row(a.data(), b.data(), I, limit, weight, true, h.data());
  fp4_gemm(h.data(), 1, ex.w2.w, ex.w2.scale, want.data());
  simd::set_enabled(true);
  return want;
}

std::vector<uint16_t> random_row(std::mt19937& rng, int64_t D) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> u(static_cast<size_t>(D));
  for (auto& x : u) x = to_bf(nd(rng));
  return u;
}

TEST(HostExpert, SameBitsAsTheExecutorsExpert) {
  std::mt19937 rng(3);
  const int64_t D = 1024, I = 544;  // I / 32 = 17 blocks: a partial group of 16 in w2's rows
  RandomExpert e(rng, D, I);
  const std::vector<uint16_t> u = random_row(rng, D);
  const float limit = 10.0f, weight = 0.37f;
  const std::vector<uint16_t> want = reference_expert(u.data(), e.ex, limit, weight);
  // On the pool as the process has it (the hardware's threads; the rows are cut in chunks of
  // their own either way).
  for (bool vec : {false, true}) {
    simd::set_enabled(vec);
    std::vector<uint16_t> got(static_cast<size_t>(D), 0xFFFF);
    expert_one_token(u.data(), e.ex, limit, weight, got.data());
    EXPECT_EQ(got, want) << "pool of " << thread_count() << (vec ? ", vector kernels" : ", scalar");
  }
  simd::set_enabled(true);
}

// A batch as a tiered layer hands it over: two tokens' rows, three experts, one expert used by
// both rows, each job with its own routing weight; on the pool and on one thread, with the pool's
// threads spinning and not. Every job's output equals the reference's for its row alone.
TEST(HostExpert, BatchOfJobsSameBitsAsEachAlone) {
  std::mt19937 rng(7);
  const int64_t D = 512, I = 288;
  std::vector<std::unique_ptr<RandomExpert>> ex;
  for (int i = 0; i < 3; ++i) ex.push_back(std::make_unique<RandomExpert>(rng, D, I));
  const std::vector<uint16_t> u0 = random_row(rng, D), u1 = random_row(rng, D);
  struct Pair {
    const std::vector<uint16_t>* u;
    int e;
    float weight;
  };
  const std::vector<Pair> pairs = {{&u0, 0, 0.5f}, {&u0, 2, 0.125f}, {&u1, 2, 1.75f}, {&u1, 1, 0.3f}};
  const float limit = 7.0f;
  std::vector<std::vector<uint16_t>> want;
  for (const Pair& p : pairs) want.push_back(reference_expert(p.u->data(), ex[size_t(p.e)]->ex, limit, p.weight));
  const int spin = pool_spin_us();
  for (int spin_us : {0, 50})
    for (bool parallel : {true, false}) {
      set_pool_spin_us(spin_us);
      std::vector<std::vector<uint16_t>> got(pairs.size(), std::vector<uint16_t>(size_t(D), 0xFFFF));
      std::vector<HostExpertJob> jobs;
      for (size_t i = 0; i < pairs.size(); ++i) jobs.push_back({pairs[i].u->data(), ex[size_t(pairs[i].e)]->ex, pairs[i].weight, got[i].data()});
      experts_on_host(jobs, limit, parallel);
      for (size_t i = 0; i < pairs.size(); ++i) EXPECT_EQ(got[i], want[i]) << "job " << i << " spin " << spin_us << " parallel " << parallel;
    }
  set_pool_spin_us(spin);
}

TEST(ThreadPool, EveryItemOnceAcrossManyCalls) {
  const int spin = pool_spin_us();
  for (int spin_us : {0, 50}) {
    set_pool_spin_us(spin_us);
    std::vector<std::atomic<int>> hits(1000);
    for (int round = 0; round < 200; ++round) parallel_for(0, int64_t(hits.size()), [&](int64_t i) { hits[size_t(i)].fetch_add(1); });
    for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i].load(), 200) << "item " << i << " spin " << spin_us;
  }
  set_pool_spin_us(spin);
}

}  // namespace
}  // namespace fb::cpu
