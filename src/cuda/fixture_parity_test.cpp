// End-to-end parity on the official fixtures: the CUDA executor runs the check-fixture protocol
// with the CPU reference in lockstep (engine::check_fixture + make_reference). Gate: greedy ids
// identical to the CPU executor on every row, logits, after-block taps and drafts bit-identical
// (docs/numerics.md). Fixtures: $FB_FIXTURES_DIR, else FB_SHARED_DIR/fixtures. Label: gpu.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "cpu/executor.h"
#include "cuda/executor.h"
#include "engine/fixture_check.h"

namespace fb::cuda {
namespace {

std::string fixtures_dir() {
  if (const char* d = std::getenv("FB_FIXTURES_DIR")) return d;
  return std::string(FB_SHARED_DIR) + "/fixtures";
}

Result<std::unique_ptr<model::Executor>> make_cuda(const std::string& ckpt) {
  auto m = CudaExecutor::load(ckpt);
  if (!m.ok()) return m.status();
  return std::unique_ptr<model::Executor>(std::move(m.value()));
}

Result<std::unique_ptr<model::Executor>> make_cpu(const std::string& ckpt) {
  auto m = cpu::CpuModel::load(ckpt);
  if (!m.ok()) return m.status();
  return std::unique_ptr<model::Executor>(std::move(m.value()));
}

class FixtureParity : public ::testing::TestWithParam<const char*> {};

TEST_P(FixtureParity, CudaMatchesCpuBitForBit) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  const std::string dir = fixtures_dir() + "/" + GetParam();
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " not present";
  engine::FixtureCheckOptions opt;
  opt.make_reference = make_cpu;
  auto rep = engine::check_fixture(dir, make_cuda, opt);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  std::printf("%s\n%s\n", rep->reference.line().c_str(), rep->summary_line().c_str());
  const engine::ReferenceComparison& c = rep->reference;
  EXPECT_EQ(c.ids_same, c.rows) << "greedy ids differ from the CPU executor";
  EXPECT_EQ(c.rows_bitwise, c.rows) << "max |dlogit| " << c.max_dlogit;
  EXPECT_EQ(c.tap_layers_bitwise, c.tap_layers) << "max tap |d| " << c.tap_max;
  EXPECT_EQ(c.draft_rows_bitwise, c.draft_rows) << "draft max |dlogit| " << c.draft_max_dlogit;
  EXPECT_EQ(c.draft_ids_same, c.draft_ids_total);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureParity, ::testing::Values("tiny-s0", "tiny-s1-long"));

}  // namespace
}  // namespace fb::cuda
