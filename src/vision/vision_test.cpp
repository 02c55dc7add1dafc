// fb_vision unit tests: spec/14 §3.5 size table, span layout, Pillow parity (bit-exact patch
// hashes from src/vision/testdata, written by make_pillow_cases.py with the reference), the
// tiny-vision fixture (patches bit-exact, ViT/aligner within tolerance) and decoder failures.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/dtype.h"
#include "base/mapped_file.h"
#include "loader/bind.h"
#include "loader/snapshot.h"
#include "vision/image.h"
#include "vision/preprocess.h"
#include "vision/span.h"
#include "vision/tower.h"

namespace fb::vision {
namespace {

namespace fs = std::filesystem;

// The vision_config of the released config.json (tests/data): 32 layers of 1024, patch 14,
// downsample 3, 1024 tokens, min_pixels 544^2.
model::VisionConfig release_config() {
  auto c = model::Config::from_file(std::string(FB_SOURCE_DIR) + "/tests/data/released_config.json");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? c->vision : model::VisionConfig{};
}

TEST(VisionPlan, WorkedExamplesOfSpec14) {
  struct Case {
    int w, h, bw, bh, nvw, nvh, nlw, nlh, tokens;
  } cases[] = {
      {1, 1, 546, 546, 39, 39, 13, 13, 184},          {100, 100, 546, 546, 39, 39, 13, 13, 184},
      {544, 544, 546, 546, 39, 39, 13, 13, 184},      {640, 480, 644, 490, 46, 35, 16, 12, 206},
      {896, 896, 896, 896, 64, 64, 22, 22, 508},      {1008, 1008, 1008, 1008, 72, 72, 24, 24, 602},
      {1024, 768, 1036, 770, 74, 55, 25, 19, 496},    {1280, 720, 1288, 728, 92, 52, 31, 18, 578},
      {1920, 1080, 1708, 966, 122, 69, 41, 23, 968},  {2000, 2000, 1302, 1302, 93, 93, 31, 31, 994},
      {4000, 4000, 1302, 1302, 93, 93, 31, 31, 994},  {3000, 200, 3010, 210, 215, 15, 72, 5, 367},
      {200, 3000, 210, 3010, 15, 215, 5, 72, 434},    {10000, 50, 10010, 56, 715, 4, 239, 2, 482},
      {50, 10000, 56, 10010, 4, 715, 2, 239, 719},
  };
  for (const Case& c : cases) {
    auto p = plan_image(c.w, c.h, release_config());
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    EXPECT_EQ(p->bw, c.bw) << c.w << "x" << c.h;
    EXPECT_EQ(p->bh, c.bh) << c.w << "x" << c.h;
    EXPECT_EQ(p->nvw, c.nvw) << c.w << "x" << c.h;
    EXPECT_EQ(p->nvh, c.nvh) << c.w << "x" << c.h;
    EXPECT_EQ(p->nlw, c.nlw) << c.w << "x" << c.h;
    EXPECT_EQ(p->nlh, c.nlh) << c.w << "x" << c.h;
    EXPECT_EQ(p->span_tokens(), c.tokens) << c.w << "x" << c.h;
  }
  // The very-wide and very-tall fallbacks (§3.5 closing note).
  auto wide = plan_image(1000000, 100, release_config());
  ASSERT_TRUE(wide.ok());
  EXPECT_EQ(wide->bw, 1021 * 42);
  EXPECT_EQ(wide->bh, 42);
  EXPECT_EQ(wide->span_tokens(), 1024);
  auto tall = plan_image(10, 100000, release_config());
  ASSERT_TRUE(tall.ok());
  EXPECT_EQ(tall->bw, 42);
  EXPECT_EQ(tall->bh, 511 * 42);
  EXPECT_LE(tall->span_tokens(), 1024);
}

TEST(VisionSpan, TypesAndEmbeddings) {
  EXPECT_EQ(span_types(2, 3), (std::vector<int32_t>{0, 1, 1, 1, 2, 1, 1, 1, 2, 3}));
  EXPECT_EQ(normalized_pixel_bf16(127), bf16_bits_from_f32(-0.003936767578125f));
  EXPECT_EQ(normalized_pixel_bf16(0), bf16_bits_from_f32(-1.0f));
  EXPECT_EQ(normalized_pixel_bf16(255), bf16_bits_from_f32(1.0f));
  for (int p = 0; p < 256; ++p) EXPECT_EQ(normalized_pixel_bf16(uint8_t(p)), bf16_bits_from_f32(float(p) / 127.5f - 1.0f));
}

uint64_t fnv64(const std::vector<uint16_t>& v) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (uint16_t x : v)
    for (int b = 0; b < 2; ++b) {
      h ^= uint8_t(x >> (8 * b));
      h *= 0x100000001B3ull;
    }
  return h;
}

TEST(VisionPreprocess, PillowParityOnSyntheticImages) {
  const fs::path dir = fs::path(FB_SOURCE_DIR) / "src/vision/testdata";
  auto text = read_file_bytes((dir / "pillow_cases.json").string());
  ASSERT_TRUE(text.ok());
  auto j = nlohmann::json::parse(*text);
  int checked = 0;
  for (const auto& c : j["cases"]) {
    const auto& cfg = j["configs"][c["config"].get<std::string>()];
    model::VisionConfig vc = release_config();
    vc.patch_size = cfg["vision_patch_size"];
    vc.downsample = cfg["vision_downsample_ratio"];
    vc.max_image_tokens = cfg["vision_max_n_token"];
    vc.min_pixels = cfg["vision_min_pixels"];
    if (!cfg["vision_max_wh_ratio"].is_null()) vc.max_wh_ratio = cfg["vision_max_wh_ratio"].get<double>();
    const std::string file = c["file"];
    auto bytes = read_file_bytes((dir / file).string());
    ASSERT_TRUE(bytes.ok());
    auto img = decode_image(*bytes);
    ASSERT_TRUE(img.ok()) << file << ": " << img.status().to_string();
    auto pre = preprocess(*img, vc);
    ASSERT_TRUE(pre.ok()) << file;
    const std::string tag = file + " / " + c["config"].get<std::string>();
    EXPECT_EQ(pre->plan.nvh, c["nvh"].get<int>()) << tag;
    EXPECT_EQ(pre->plan.nvw, c["nvw"].get<int>()) << tag;
    EXPECT_EQ(pre->plan.nlh, c["nlh"].get<int>()) << tag;
    EXPECT_EQ(pre->plan.nlw, c["nlw"].get<int>()) << tag;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv64(pre->patches)));
    EXPECT_EQ(std::string(hex), c["fnv64"].get<std::string>()) << tag << " patches differ from Pillow";
    ++checked;
  }
  EXPECT_GT(checked, 30);
}

// ---- the tiny-vision fixture --------------------------------------------------------------------
struct Fixture {
  fs::path dir;
  std::unique_ptr<loader::Snapshot> snap;
  model::ModelWeights w;
  nlohmann::json steps;
};

std::vector<uint16_t> load_bf16(const fs::path& p) {
  auto b = read_file_bytes(p.string());
  EXPECT_TRUE(b.ok()) << p;
  std::vector<uint16_t> v(b->size() / 2);
  std::memcpy(v.data(), b->data(), v.size() * 2);
  return v;
}

// max |got - want| / max |want|
double max_rel(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  double md = 0, mw = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    md = std::max(md, std::fabs(double(bf16_to_f32(got[i])) - bf16_to_f32(want[i])));
    mw = std::max(mw, std::fabs(double(bf16_to_f32(want[i]))));
  }
  return mw > 0 ? md / mw : md;
}

class VisionFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    f_.dir = fs::path(FB_SHARED_DIR) / "fixtures/tiny-vision";
    if (!fs::exists(f_.dir / "patches.bf16")) GTEST_SKIP() << "no tiny-vision fixture at " << f_.dir;
    auto s = loader::Snapshot::open((f_.dir / "checkpoint").string());
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    f_.snap = std::move(s.value());
    f_.w = loader::bind_weights(*f_.snap);
    f_.steps = nlohmann::json::parse(*read_file_bytes((f_.dir / "steps.json").string()));
  }
  Fixture f_;
};

TEST_F(VisionFixture, PatchesBitExact) {
  auto img = decode_image(*read_file_bytes((f_.dir / "image.png").string()));
  ASSERT_TRUE(img.ok());
  auto pre = preprocess(*img, f_.snap->config().vision);
  ASSERT_TRUE(pre.ok());
  EXPECT_EQ(pre->plan.nvh, f_.steps["image"]["n_vit_h"].get<int>());
  EXPECT_EQ(pre->plan.nvw, f_.steps["image"]["n_vit_w"].get<int>());
  EXPECT_EQ(pre->patches, load_bf16(f_.dir / "patches.bf16"));
}

TEST_F(VisionFixture, VitAndAlignerMatchReference) {
  const auto& cfg = f_.snap->config();
  const int nvh = f_.steps["image"]["n_vit_h"], nvw = f_.steps["image"]["n_vit_w"];
  VisionTower tower(cfg, f_.w.vision);
  const auto vit = tower.vit(load_bf16(f_.dir / "patches.bf16"), nvh, nvw);
  const auto want_vit = load_bf16(f_.dir / "vit_hidden.bf16");
  ASSERT_EQ(vit.size(), want_vit.size());
  // Tolerance: the reference's torch CPU GEMM/SDPA sum in another order; a few bf16 ulps of the
  // largest value (bf16 ulp = 2^-8 relative) [measured, see docs/vision.md].
  EXPECT_LE(max_rel(vit, want_vit), 0.02);
  // Aligner on the reference's own ViT output isolates its error.
  const auto al = tower.align(want_vit, nvh, nvw);
  const auto want_al = load_bf16(f_.dir / "aligned.bf16");
  ASSERT_EQ(al.size(), want_al.size());
  EXPECT_LE(max_rel(al, want_al), 0.02);
  const auto types = span_types(f_.steps["image"]["n_llm_h"], f_.steps["image"]["n_llm_w"]);
  auto tt = read_file_bytes((f_.dir / "token_types.i32").string());
  std::vector<int32_t> file_types(tt->size() / 4);
  std::memcpy(file_types.data(), tt->data(), tt->size());
  const int start = f_.steps["image"]["span_start"];
  ASSERT_LE(size_t(start) + types.size(), file_types.size());
  EXPECT_EQ(std::vector<int32_t>(file_types.begin() + start, file_types.begin() + start + int(types.size())), types);
}

// ---- decoder failures are Statuses --------------------------------------------------------------
TEST(VisionDecode, MalformedInputsGiveStatus) {
  const fs::path dir = fs::path(FB_SOURCE_DIR) / "src/vision/testdata";
  const std::string png = *read_file_bytes((dir / "s73x91.png").string());
  const std::string jpg = *read_file_bytes((dir / "s97x61_q85.jpg").string());
  const std::string webp = *read_file_bytes((dir / "s64x48.webp").string());
  ASSERT_TRUE(decode_image(png).ok());
  ASSERT_TRUE(decode_image(jpg).ok());
  EXPECT_FALSE(decode_image("").ok());
  EXPECT_FALSE(decode_image("not an image at all").ok());
  EXPECT_EQ(decode_image("GIF89a....").status().code(), StatusCode::kUnsupported);
  // truncations at many points
  for (size_t n : {size_t(8), size_t(20), size_t(33), size_t(60), png.size() / 2, png.size() - 13}) EXPECT_FALSE(decode_image(png.substr(0, n)).ok()) << n;
  for (size_t n : {size_t(3), size_t(100), jpg.size() / 2, jpg.size() - 2}) EXPECT_FALSE(decode_image(jpg.substr(0, n)).ok()) << n;
  for (size_t n : {size_t(12), size_t(30), webp.size() / 2}) EXPECT_FALSE(decode_image(webp.substr(0, n)).ok()) << n;
  // corrupt bytes inside the PNG data stream (CRC / zlib errors)
  std::string bad = png;
  for (size_t i = 60; i < bad.size(); i += 97) bad[i] = char(bad[i] ^ 0x5A);
  EXPECT_FALSE(decode_image(bad).ok());
  // absurd dimensions: IHDR claims 2^30 x 2^30 (refused before any allocation)
  std::string huge = png;
  const char dims[8] = {0x40, 0, 0, 0, 0x40, 0, 0, 0};
  std::memcpy(&huge[16], dims, 8);
  EXPECT_FALSE(decode_image(huge).ok());
  // JPEG SOF claiming 60000 x 60000 (no checksum in JPEG: reaches our pixel limit)
  std::string bigj = jpg;
  for (size_t i = 2; i + 9 < bigj.size(); ++i)
    if (uint8_t(bigj[i]) == 0xFF && (uint8_t(bigj[i + 1]) == 0xC0 || uint8_t(bigj[i + 1]) == 0xC2)) {
      bigj[i + 5] = char(0xEA), bigj[i + 6] = char(0x60), bigj[i + 7] = char(0xEA), bigj[i + 8] = char(0x60);
      break;
    }
  auto r = decode_image(bigj);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().to_string();
  DecodeLimits small;
  small.max_pixels = 100;
  EXPECT_FALSE(decode_image(png, small).ok());
  // random byte flips never crash
  uint32_t s = 12345;
  for (int it = 0; it < 300; ++it) {
    std::string m = it % 3 == 0 ? png : it % 3 == 1 ? jpg : webp;
    for (int k = 0; k < 4; ++k) {
      s = s * 1664525u + 1013904223u;
      m[8 + s % (m.size() - 8)] = char(s >> 24);
    }
    (void)decode_image(m);
  }
}

TEST(VisionDecode, DataUrlsAndPaths) {
  auto b = base64_decode("aGVsbG8=");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, "hello");
  EXPECT_FALSE(base64_decode("aGV*bG8=").ok());
  auto d = load_image_bytes("data:image/png;base64,aGVs bG8=");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, "hello");
  EXPECT_FALSE(load_image_bytes("data:image/png,rawtext").ok());
  EXPECT_EQ(load_image_bytes("https://example.com/a.png").status().code(), StatusCode::kUnsupported);
  EXPECT_FALSE(load_image_bytes("/nonexistent/image.png").ok());
}

}  // namespace
}  // namespace fb::vision
