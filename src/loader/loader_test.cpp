// Snapshot open + validation on the official fixtures, and rejection of corrupted copies.
#include "loader/snapshot.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <type_traits>
#include <nlohmann/json.hpp>

#include "loader/bind.h"
#include "loader/read_in.h"
#include "loader/safetensors.h"

namespace fb::loader {
namespace {

namespace fs = std::filesystem;
std::string fixture_dir() { return std::string(FB_SHARED_DIR) + "/fixtures/tiny-s0/checkpoint"; }

class CorruptCopy : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = fixture_dir();
    if (!fs::exists(src_)) GTEST_SKIP() << "fixture not present: " << src_;
    dir_ = fs::temp_directory_path() / ("fb_loader_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (auto& e : fs::directory_iterator(src_)) {
      fs::copy_file(e.path(), dir_ / e.path().filename());
      fs::permissions(dir_ / e.path().filename(), fs::perms::owner_write, fs::perm_options::add);
    }
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string first_shard() { return (dir_ / "model-00001-of-00003.safetensors").string(); }
  std::string src_;
  fs::path dir_;
};

TEST(Snapshot, FixturesValidate) {
  for (const char* c : {"tiny-s0", "tiny-s1-long", "tiny-vision"}) {
    std::string d = std::string(FB_SHARED_DIR) + "/fixtures/" + c + "/checkpoint";
    if (!fs::exists(d)) GTEST_SKIP();
    auto s = Snapshot::open(d);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    auto rep = (*s)->validate();
    EXPECT_TRUE(rep.ok()) << c << "\n" << rep.to_string();
    EXPECT_EQ((*s)->engram_token_map().size(), size_t((*s)->config().vocab_size));
  }
}

// model::for_each_layer_tensor is the one list of a layer's tensors: binding through it leaves
// no tensor of a layer unbound (routed experts come through an ExpertSource) and binds each to
// its own checkpoint bytes.
TEST(BindWeights, EveryLayerTensorBoundOnce) {
  for (const char* c : {"tiny-s0", "tiny-vision"}) {
    std::string d = std::string(FB_SHARED_DIR) + "/fixtures/" + c + "/checkpoint";
    if (!fs::exists(d)) GTEST_SKIP();
    auto s = Snapshot::open(d);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    const model::Config& cfg = (*s)->config();
    const model::ModelWeights w = bind_weights(**s);
    for (int l = 0; l < cfg.n_total_layers(); ++l) {
      std::set<const uint8_t*> bound;
      int views = 0;
      auto add = [&](const TensorView& v) {
        if (!v.valid()) return;
        ++views;
        EXPECT_TRUE(bound.insert(v.data).second) << c << " layer " << l << ": two members bound to one tensor";
      };
      model::for_each_layer_tensor(
          [&](const char*, model::Presence need, const auto& field) {
            if constexpr (std::is_same_v<std::decay_t<decltype(field)>, model::Fp8Linear>) {
              add(field.w);
              add(field.scale);
              if (need == model::Presence::kRequired) {
                EXPECT_TRUE(field.w.valid());
              }
            } else {
              add(field);
              if (need == model::Presence::kRequired) {
                EXPECT_TRUE(field.valid());
              }
            }
          },
          w.layers[size_t(l)]);
      const std::string prefix = model::layer_prefix(cfg, l);
      int in_file = 0;
      for (const std::string& n : (*s)->tensor_names()) {
        if (n.rfind(prefix, 0) != 0 || n.find(".experts.") != std::string::npos) continue;
        const std::string rest = n.substr(prefix.size());
        if (l == cfg.n_layers && (rest == "main_proj.weight" || rest == "main_proj.scale" || rest == "main_norm.weight")) continue;  // the draft's
        if (l == cfg.n_total_layers() - 1 && (rest == "norm.weight" || rest.rfind("markov_head.", 0) == 0 || rest.rfind("confidence_head.", 0) == 0))
          continue;
        ++in_file;
        EXPECT_TRUE(bound.count((*s)->get(n).data)) << c << ": " << n << " is not bound";
      }
      EXPECT_EQ(views, in_file) << c << " layer " << l;
    }
  }
}

TEST_F(CorruptCopy, Intact) {
  auto s = Snapshot::open(dir_.string());
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_TRUE((*s)->validate().ok());
}

TEST_F(CorruptCopy, TruncatedShard) {
  auto sz = fs::file_size(first_shard());
  fs::resize_file(first_shard(), sz - 1000);
  auto s = Snapshot::open(dir_.string());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("model-00001-of-00003.safetensors"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("truncated"), std::string::npos) << s.status().message();
}

TEST_F(CorruptCopy, DtypeChangedToAnotherValidOne) {
  // Rewrite one header entry's dtype BF16 -> F16 (same size, so the container stays valid).
  std::string path = first_shard();
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t n;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string h(n, '\0');
  f.read(h.data(), std::streamsize(n));
  size_t p = h.find("\"BF16\"");
  ASSERT_NE(p, std::string::npos);
  h.replace(p, 6, "\"F16\" ");
  f.seekp(8);
  f.write(h.data(), std::streamsize(n));
  f.close();
  auto s = Snapshot::open(dir_.string());
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  auto rep = (*s)->validate();
  ASSERT_FALSE(rep.ok());
  ASSERT_EQ(rep.mismatched.size(), 1u) << rep.to_string();
  EXPECT_NE(rep.mismatched[0].find("want BF16"), std::string::npos);
}

TEST_F(CorruptCopy, TensorMissingFromIndex) {
  std::string path = (dir_ / "model.safetensors.index.json").string();
  auto j = nlohmann::json::parse(std::ifstream(path));
  j["weight_map"].erase("layers.2.attn.wq_a.weight");
  std::ofstream(path) << j.dump();
  auto s = Snapshot::open(dir_.string());
  ASSERT_TRUE(s.ok());
  auto rep = (*s)->validate();
  ASSERT_FALSE(rep.ok());
  ASSERT_FALSE(rep.other.empty());
  EXPECT_NE(rep.other[0].find("layers.2.attn.wq_a.weight"), std::string::npos);
}

TEST_F(CorruptCopy, GarbageConfig) {
  std::ofstream(dir_ / "config.json") << "{\"text_config\": {\"hidden_size\": [}";
  auto s = Snapshot::open(dir_.string());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("config.json"), std::string::npos);
}

TEST_F(CorruptCopy, AbsurdHeaderLength) {
  std::fstream f(first_shard(), std::ios::in | std::ios::out | std::ios::binary);
  uint64_t n = 1ull << 60;
  f.write(reinterpret_cast<char*>(&n), 8);
  f.close();
  auto s = Snapshot::open(dir_.string());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("header length"), std::string::npos);
}

TEST(Safetensors, RejectsOverlapAndBadSizes) {
  auto mk = [](const std::string& header, size_t data_bytes) {
    std::string h = header;
    while (h.size() % 8) h.push_back(' ');
    std::string out(8, '\0');
    uint64_t n = h.size();
    std::memcpy(out.data(), &n, 8);
    out += h;
    out.append(data_bytes, '\0');
    return out;
  };
  auto parse = [](const std::string& b) { return parse_safetensors(reinterpret_cast<const uint8_t*>(b.data()), b.size(), "t"); };
  EXPECT_TRUE(parse(mk(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8)).ok());
  EXPECT_FALSE(parse(mk(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8)).ok());
  EXPECT_FALSE(parse(mk(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)).ok());
  EXPECT_FALSE(parse(mk(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)).ok());
  EXPECT_FALSE(parse(mk(R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8)).ok());
  EXPECT_FALSE(parse(mk(R"({"a":{"dtype":"F32","shape":[4611686018427387904, 4],"data_offsets":[0,8]}})", 8)).ok());
  EXPECT_FALSE(parse(mk(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8)).ok());
  EXPECT_FALSE(parse(mk(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8)).ok());
  EXPECT_FALSE(parse(mk("[1,2,3]", 0)).ok());
  EXPECT_FALSE(parse(std::string("abc")).ok());
}

}  // namespace
}  // namespace fb::loader

#include "loader/tiny_model.h"
#include "model/schema.h"

namespace fb::loader {
namespace {

TEST(TinyModel, WritesAValidSnapshotDeterministically) {
  const auto dir = std::filesystem::temp_directory_path() / ("fb_tiny_" + std::to_string(::getpid()));
  TinyModelOptions o;
  o.out_dir = dir.string();
  o.vocab_size = 4096;  // small vocabulary keeps the test fast; make-tiny uses 129,280
  o.engram_compressed_vocab = 3000;
  ASSERT_TRUE(write_tiny_model(o).ok());
  auto s = Snapshot::open(o.out_dir);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_TRUE((*s)->validate().ok()) << (*s)->validate().to_string();
  const auto& c = (*s)->config();
  EXPECT_EQ(c.n_layers, 8);
  EXPECT_TRUE(c.roles[2].kv_source && c.roles[4].candidate_source && c.roles[6].pool_restricted);
  EXPECT_EQ(c.n_mtp_layers, 3);
  // Deterministic: the same seed writes the same bytes.
  auto a = read_file_bytes((dir / "model-00002-of-00003.safetensors").string());
  ASSERT_TRUE(write_tiny_model(o).ok());
  auto b = read_file_bytes((dir / "model-00002-of-00003.safetensors").string());
  EXPECT_EQ(*a, *b);
  // Norm weights follow the released means (attn_norm ~ 0.025), not 1.
  const TensorView& an = (*s)->get("layers.3.attn_norm.weight");
  double mean = 0;
  for (int64_t i = 0; i < an.numel(); ++i) mean += bf16_to_f32(an.as<uint16_t>()[i]);
  EXPECT_NEAR(mean / double(an.numel()), 0.025, 0.005);
  std::filesystem::remove_all(dir);
}

// make-tiny's progress and the load-time read-in (issue 24), through a forced reporter.
TEST(TinyModel, ProgressAndReadIn) {
  const auto dir = std::filesystem::temp_directory_path() / ("fb_tiny_progress_" + std::to_string(::getpid()));
  std::vector<std::string> lines;
  ProgressOptions po;
  po.mode = ProgressOptions::Mode::kOn;
  po.sink = [&lines](std::string_view s) { lines.emplace_back(s); };
  TinyModelOptions o;
  o.out_dir = dir.string();
  o.vocab_size = 4096;
  o.engram_compressed_vocab = 3000;
  Progress mp("make-tiny", 0, ProgressUnit::kBytes, po);
  o.progress = &mp;
  ASSERT_TRUE(write_tiny_model(o).ok());
  auto s = Snapshot::open(o.out_dir);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  const auto names = (*s)->tensor_names();
  uint64_t all = 0, experts = 0;
  int64_t n_experts = 0;
  for (const auto& n : names) {
    const uint64_t b = (*s)->get(n).nbytes();
    all += b;
    if (is_routed_expert_tensor(n)) {
      experts += b;
      ++n_experts;
    }
  }
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back().rfind("\rmake-tiny: ", 0), 0u) << lines.back();
  EXPECT_NE(lines.back().find(", " + std::to_string(names.size()) + " tensors\033[K\n"), std::string::npos) << lines.back();
  EXPECT_GT(n_experts, 0);

  lines.clear();
  Progress lp("load weights", 0, ProgressUnit::kBytes, po);
  ReadInResult r = read_in(**s, {}, ~uint64_t(0), &lp);
  EXPECT_TRUE(r.read);
  EXPECT_EQ(r.bytes, all);
  EXPECT_EQ(r.tensors, int64_t(names.size()));
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines.back().find(", " + std::to_string(names.size()) + " tensors\033[K\n"), std::string::npos) << lines.back();

  // Tiered experts stay on the drive.
  r = read_in(**s, is_routed_expert_tensor, ~uint64_t(0), nullptr);
  EXPECT_TRUE(r.read);
  EXPECT_EQ(r.bytes, all - experts);
  EXPECT_EQ(r.tensors, int64_t(names.size()) - n_experts);

  // Over the memory limit: nothing read, nothing shown.
  lines.clear();
  Progress over("load weights", 0, ProgressUnit::kBytes, po);
  r = read_in(**s, {}, all - 1, &over);
  EXPECT_FALSE(r.read);
  EXPECT_EQ(r.bytes, all);
  over.finish();
  EXPECT_TRUE(lines.empty());
  std::filesystem::remove_all(dir);
}

TEST(TinyModel, ReleasedSyntheticConfig) {
  auto c = model::Config::from_hf_json(released_synthetic_config_json(64, 32, 100000));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->n_layers, 40);
  EXPECT_EQ(c->roles[24].pool_restricted, true);
  // Per-token routed bytes are the released ones (6 experts of 18,800,640 B per layer).
  int64_t e0 = 0;
  for (const auto& s : model::expected_tensors(*c))
    if (s.layer == 5 && s.expert == 0) e0 += s.nbytes();
  EXPECT_EQ(e0, 18800640);
}

}  // namespace
}  // namespace fb::loader
