// DSpark on the GPU (issue 11): through the engine's Generator with the CUDA executor, greedy
// output with DSpark (forced full blocks and the measured-cost scheduler) equals greedy without
// it and equals the CPU executor's greedy output, on the official fixtures; the forced-acceptance
// harness reports tokens per round and tok/s against plain decode. Label: gpu.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "base/mapped_file.h"
#include "cpu/executor.h"
#include "cuda/executor.h"
#include "engine/dspark_harness.h"
#include "engine/generator.h"
#include "tiny_model_util.h"

namespace fb {
namespace {

namespace fs = std::filesystem;

std::string fixtures_dir() {
  if (const char* d = std::getenv("FB_FIXTURES_DIR")) return d;
  return std::string(FB_SHARED_DIR) + "/fixtures";
}

std::vector<int32_t> prompt_of(const std::string& dir) {
  auto b = read_file_bytes(dir + "/prompt.i32");
  EXPECT_TRUE(b.ok());
  std::vector<int32_t> v(b->size() / 4);
  std::memcpy(v.data(), b->data(), v.size() * 4);
  return v;
}

std::vector<int32_t> greedy(model::Executor& ex, const std::vector<int32_t>& prompt, int n, engine::GeneratorOptions opt) {
  engine::Generator g(ex, opt);
  EXPECT_TRUE(g.prefill(prompt).ok());
  engine::SamplingParams sp;
  sp.temperature = 0;
  engine::Rng rng(0);
  std::vector<int32_t> out;
  while (int(out.size()) < n) {
    Status st = g.next(sp, rng, &out);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) break;
  }
  out.resize(size_t(std::min<size_t>(out.size(), size_t(n))));
  return out;
}

class CudaDspark : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaDspark, GreedyWithDsparkEqualsWithoutAndEqualsCpu) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) GTEST_SKIP() << "no CUDA device";
  const std::string dir = fixtures_dir() + "/" + GetParam();
  if (!fs::exists(dir)) GTEST_SKIP() << dir << " not present";
  cuda::CudaLoadOptions lo;
  lo.run.numerics = cuda::Numerics::kExact;  // the exact class, so that greedy output can equal the CPU's
  auto cu = cuda::CudaExecutor::load(dir + "/checkpoint", {}, lo);
  auto cp = cpu::CpuModel::load(dir + "/checkpoint");
  ASSERT_TRUE(cu.ok() && cp.ok());
  const auto prompt = prompt_of(dir);
  engine::GeneratorOptions plain, full, sched;
  plain.dspark = false;
  full.dspark_verify = (*cu)->config().dspark_block_size;
  const auto a = greedy(**cu, prompt, 48, plain);
  const auto b = greedy(**cu, prompt, 48, full);
  const auto c = greedy(**cu, prompt, 48, sched);
  const auto d = greedy(**cp, prompt, 48, plain);
  EXPECT_EQ(a, b) << "DSpark (full blocks) changed greedy output on the GPU";
  EXPECT_EQ(a, c) << "DSpark (scheduled) changed greedy output on the GPU";
  EXPECT_EQ(a, d) << "CUDA greedy differs from the CPU executor's";
}

TEST_P(CudaDspark, ForcedAcceptanceSweep) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) GTEST_SKIP() << "no CUDA device";
  const std::string dir = fixtures_dir() + "/" + GetParam();
  if (!fs::exists(dir)) GTEST_SKIP() << dir << " not present";
  auto cu = cuda::CudaExecutor::load(dir + "/checkpoint");
  ASSERT_TRUE(cu.ok());
  const auto prompt = prompt_of(dir);
  engine::GeneratorOptions opt;
  opt.dspark_verify = (*cu)->config().dspark_block_size;
  const double ps[] = {0.0, 0.5, 0.9, 1.0};
  auto rep = engine::run_forced_acceptance(**cu, prompt, 60, ps, opt);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  for (const auto& r : *rep) {
    std::printf("cuda forced acceptance %s p=%.2f: tokens/round %.3f (model %.3f), %.1f tok/s vs plain %.1f tok/s, equal=%d\n", GetParam(), r.p,
                r.tokens_per_round, r.expected_tokens_per_round, r.tok_per_s, r.plain_tok_per_s, int(r.matches_plain));
    EXPECT_TRUE(r.matches_plain);
    EXPECT_NEAR(r.tokens_per_round, r.expected_tokens_per_round, 0.35 * r.expected_tokens_per_round);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaDspark, ::testing::Values("tiny-s0", "tiny-s1-long"));

// Gate 4 of the fast class (CLARIFICATIONS "Numerics classes"): greedy output with DSpark on
// equals plain greedy output bit for bit on the fast path over >= 256 tokens. Verify rows go
// through the same row-invariant kernels as decode rows, so every accepted token is the token
// plain decoding would have produced. The built-in tiny model (make-tiny) allows long outputs.
TEST(CudaDsparkFast, GreedyWithDsparkEqualsPlainOverLongOutput) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) GTEST_SKIP() << "no CUDA device";
  auto made = testing_util::write_test_tiny_model("fb_cuda_dspark_fast_tiny", 3, false);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  const std::string dir = *made;
  auto cu = cuda::CudaExecutor::load(dir);  // default options: the fast class
  ASSERT_TRUE(cu.ok()) << cu.status().to_string();
  ASSERT_EQ((*cu)->run_options().numerics, cuda::Numerics::kFast);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 37; ++i) prompt.push_back(1000 + 97 * i);
  engine::GeneratorOptions plain, full, sched;
  plain.dspark = false;
  full.dspark_verify = (*cu)->config().dspark_block_size;
  const int n = 288;
  const auto a = greedy(**cu, prompt, n, plain);
  const auto b = greedy(**cu, prompt, n, full);
  const auto c = greedy(**cu, prompt, n, sched);
  ASSERT_EQ(int(a.size()), n);
  EXPECT_EQ(a, b) << "DSpark (full blocks) changed greedy output on the fast path";
  EXPECT_EQ(a, c) << "DSpark (scheduled) changed greedy output on the fast path";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fb
