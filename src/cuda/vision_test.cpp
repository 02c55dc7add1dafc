// The vision tower on the GPU (cuda/vision.cu) against the CPU tower (vision/tower.cpp, which
// defines the numerics): ViT and aligner outputs bit-identical on the tiny-vision fixture's
// patches, on make-tiny --vision models at several grid sizes (unfold padding, > 48 KB of
// attention scores), and check-fixture tiny-vision with the CPU reference in lockstep: the span
// rows, the prefill with image rows (bias_vl, DEAD Engram history) and the decode all IDENTICAL.
// Fixtures: $FB_FIXTURES_DIR, else FB_SHARED_DIR/fixtures. Label: gpu.
#include <gtest/gtest.h>

#include "cuda/gpu_test_util.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <unistd.h>

#include "base/dtype.h"
#include "base/mapped_file.h"
#include "cpu/executor.h"
#include "cuda/executor.h"
#include "engine/fixture_check.h"
#include "loader/tiny_model.h"

namespace fb::cuda {
namespace {

using test_util::fixtures_dir;
using test_util::have_gpu;

namespace fs = std::filesystem;

int64_t count_diff(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  if (a.size() != b.size()) return -1;
  int64_t d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += a[i] != b[i];
  return d;
}

// Both towers on the same patches: ViT output and aligner rows bit for bit (and poisoned outputs
// would show: the vectors are filled from the device, never pre-initialised to the CPU's).
void expect_same_tower(model::Executor& gpu, model::Executor& cpu, const std::vector<uint16_t>& patches, int nvh, int nvw) {
  std::vector<uint16_t> gv(7, 0xFFFF), cv;
  auto ga = gpu.encode_image(patches, nvh, nvw, &gv);
  auto ca = cpu.encode_image(patches, nvh, nvw, &cv);
  ASSERT_TRUE(ga.ok()) << ga.status().to_string();
  ASSERT_TRUE(ca.ok()) << ca.status().to_string();
  const int r = cpu.config().vision.downsample;
  EXPECT_EQ(ca->size(), size_t((nvh + r - 1) / r) * size_t((nvw + r - 1) / r) * size_t(cpu.config().dim));
  EXPECT_EQ(cv.size(), size_t(nvh) * size_t(nvw) * size_t(cpu.config().vision.dim));
  EXPECT_EQ(count_diff(gv, cv), 0) << "ViT output differs, grid " << nvh << "x" << nvw;
  EXPECT_EQ(count_diff(*ga, *ca), 0) << "aligner output differs, grid " << nvh << "x" << nvw;
  std::printf("tower %dx%d: vit %zu values, aligned %zu values, bit-identical=%d\n", nvh, nvw, cv.size(), ca->size(),
              int(gv == cv && *ga == *ca));
}

TEST(CudaVision, TinyVisionFixturePatches) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const fs::path dir = fs::path(fixtures_dir()) / "tiny-vision";
  if (!fs::exists(dir)) GTEST_SKIP() << dir << " not present";
  auto gpu = CudaExecutor::load((dir / "checkpoint").string());
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  auto cpu = cpu::CpuModel::load((dir / "checkpoint").string());
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  auto steps = nlohmann::json::parse(*read_file_bytes((dir / "steps.json").string()));
  const int nvh = steps["image"]["n_vit_h"].get<int>(), nvw = steps["image"]["n_vit_w"].get<int>();
  auto bytes = read_file_bytes((dir / "patches.bf16").string());
  ASSERT_TRUE(bytes.ok());
  std::vector<uint16_t> patches(bytes->size() / 2);
  std::memcpy(patches.data(), bytes->data(), patches.size() * 2);
  expect_same_tower(**gpu, **cpu, patches, nvh, nvw);
}

TEST(CudaVision, MakeTinyVisionGrids) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const fs::path dir = fs::temp_directory_path() / ("fb_cuda_vision_" + std::to_string(::getpid()));
  const loader::TinyModelOptions o{.out_dir = dir.string(), .vision = true};
  ASSERT_TRUE(loader::write_tiny_model(o).ok());
  const std::vector<int32_t> map = loader::modular_engram_map(o.vocab_size, o.engram_compressed_vocab);
  auto gpu = CudaExecutor::load(dir.string(), map);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  auto cpu = cpu::CpuModel::load(dir.string(), map);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  const auto& vc = (*cpu)->config().vision;
  const int P = 3 * vc.patch_size * vc.patch_size;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  // grids: not multiples of the downsample (zero-padded unfold), 1x1, and one whose attention
  // scores (N f32) exceed 48 KB of shared memory
  for (auto [nvh, nvw] : std::vector<std::pair<int, int>>{{7, 11}, {12, 5}, {1, 1}, {111, 111}}) {
    std::vector<uint16_t> patches(size_t(nvh) * size_t(nvw) * size_t(P));
    for (auto& p : patches) p = bf16_bits_from_f32(u(rng));
    expect_same_tower(**gpu, **cpu, patches, nvh, nvw);
  }
  // wrong patch count: an error, not a crash
  EXPECT_FALSE((*gpu)->encode_image(std::vector<uint16_t>(5), 2, 2).ok());
  // the span's START / NEWLINE / END rows the engine assembles spans with: the same from both
  auto gm = (*gpu)->image_span_markers();
  auto cm = (*cpu)->image_span_markers();
  ASSERT_TRUE(gm.ok()) << gm.status().to_string();
  ASSERT_TRUE(cm.ok()) << cm.status().to_string();
  EXPECT_EQ(gm->size(), 3 * size_t((*cpu)->config().dim));
  EXPECT_EQ(*gm, *cm);
  fs::remove_all(dir);
}

// The exact class: this test holds the CUDA executor to the CPU's bits (the fast class is held to
// the fixture gates by FixtureGates in cuda_fixture_parity_test).
Result<std::unique_ptr<model::Executor>> make_cuda(const std::string& ckpt) {
  CudaLoadOptions lo;
  lo.run.numerics = Numerics::kExact;
  auto m = CudaExecutor::load(ckpt, {}, lo);
  if (!m.ok()) return m.status();
  return std::unique_ptr<model::Executor>(std::move(m.value()));
}
Result<std::unique_ptr<model::Executor>> make_cpu(const std::string& ckpt) {
  auto m = cpu::CpuModel::load(ckpt);
  if (!m.ok()) return m.status();
  return std::unique_ptr<model::Executor>(std::move(m.value()));
}

TEST(CudaVision, CheckFixtureTinyVisionMatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = fixtures_dir() + "/tiny-vision";
  if (!fs::exists(dir)) GTEST_SKIP() << dir << " not present";
  for (int64_t chunk : {int64_t(0), int64_t(4)}) {
    engine::FixtureCheckOptions opt;
    opt.make_reference = make_cpu;
    opt.chunk = chunk;
    auto rep = engine::check_fixture(dir, make_cuda, opt);
    ASSERT_TRUE(rep.ok()) << rep.status().to_string();
    std::printf("chunk %lld: %s\n%s\n", (long long)chunk, rep->reference.line().c_str(), rep->summary_line().c_str());
    const engine::ReferenceComparison& c = rep->reference;
    EXPECT_EQ(c.vision_images, 1);
    EXPECT_EQ(c.vision_bitwise, c.vision_images) << "tower output differs from the CPU tower";
    EXPECT_EQ(c.ids_same, c.rows);
    EXPECT_EQ(c.rows_bitwise, c.rows) << "max |dlogit| " << c.max_dlogit;
    EXPECT_EQ(c.tap_layers_bitwise, c.tap_layers) << "max tap |d| " << c.tap_max;
    EXPECT_EQ(c.draft_rows_bitwise, c.draft_rows) << "draft max |dlogit| " << c.draft_max_dlogit;
    EXPECT_EQ(c.draft_ids_same, c.draft_ids_total);
  }
}

}  // namespace
}  // namespace fb::cuda
