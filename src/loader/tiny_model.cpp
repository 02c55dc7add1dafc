#include "loader/tiny_model.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "base/dtype.h"
#include "base/mapped_file.h"
#include "loader/released_stats.h"
#include "loader/safetensors.h"
#include "model/config.h"
#include "model/engram_constants.h"
#include "model/schema.h"

namespace fb::loader {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// splitmix64 + Box-Muller: deterministic on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }
  float normal() {
    if (have_) {
      have_ = false;
      return float(spare_);
    }
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * M_PI * u2);
    have_ = true;
    return float(r * std::cos(2.0 * M_PI * u2));
  }

 private:
  uint64_t s_;
  double spare_ = 0;
  bool have_ = false;
};

float pow2_ceil(float t) {
  int e;
  float f = std::frexp(t, &e);  // t = f * 2^e, f in [0.5, 1)
  return f == 0.5f ? t : std::ldexp(1.0f, e);
}

// FP8 e4m3 with one power-of-two scale per 32x32 tile (the dense checkpoint format).
void quantize_fp8_blocks(const std::vector<float>& w, int64_t rows, int64_t cols, std::vector<uint8_t>& q, std::vector<uint8_t>& s) {
  const int64_t rb = (rows + 31) / 32, cb = (cols + 31) / 32;
  q.assign(size_t(rows * cols), 0);
  s.assign(size_t(rb * cb), 0);
  for (int64_t bi = 0; bi < rb; ++bi)
    for (int64_t bj = 0; bj < cb; ++bj) {
      float amax = 0;
      for (int64_t r = bi * 32; r < std::min(rows, bi * 32 + 32); ++r)
        for (int64_t c = bj * 32; c < std::min(cols, bj * 32 + 32); ++c) amax = std::max(amax, std::fabs(w[size_t(r * cols + c)]));
      const float sc = pow2_ceil(std::max(amax, 1e-4f) / 448.0f);
      s[size_t(bi * cb + bj)] = e8m0_from_pow2(sc);
      for (int64_t r = bi * 32; r < std::min(rows, bi * 32 + 32); ++r)
        for (int64_t c = bj * 32; c < std::min(cols, bj * 32 + 32); ++c) q[size_t(r * cols + c)] = e4m3_from_f32(w[size_t(r * cols + c)] / sc);
    }
}

std::vector<uint8_t> to_bytes_bf16(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t h = bf16_bits_from_f32(v[i]);
    std::memcpy(&b[i * 2], &h, 2);
  }
  return b;
}
std::vector<uint8_t> to_bytes_f32(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// The text_config keys the tiny model shares with the release: the architecture's constants
// (one KV head, three MTP/DSpark stages, rope bases and YaRN, routing, mHC, norms, the Engram pad,
// the DSpark block). Each config adds its sizes; the YaRN original context is the caller's.
// (nlohmann::json keeps keys sorted, so the written file does not depend on the order they are set.)
json shared_text_config(int64_t rope_original_positions) {
  json t;
  t["model_type"] = "deepseek_v41_text";
  t["num_nextn_predict_layers"] = 3;
  t["num_key_value_heads"] = 1;
  t["rope_theta"] = 10000;
  t["compress_rope_theta"] = 160000;
  t["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 16}, {"beta_fast", 32}, {"beta_slow", 1},
                       {"original_max_position_embeddings", rope_original_positions}};
  t["n_shared_experts"] = 1;
  t["scoring_func"] = "sqrtsoftplus";
  t["topk_method"] = "noaux_tc";
  t["norm_topk_prob"] = true;
  t["routed_scaling_factor"] = 1.5;
  t["swiglu_limit"] = 10.0;
  t["hc_mult"] = 4;
  t["hc_sinkhorn_iters"] = 20;
  t["hc_eps"] = 1e-6;
  t["rms_norm_eps"] = 1e-20;
  t["engram_pad_token_id"] = 2;
  t["dspark_block_size"] = 5;
  return t;
}

// The top-level config.json around a text_config: architecture, image token and the release's
// quantization (FP8 e4m3 with UE8M0 32x32 blocks, FP4 experts).
json model_config(const json& text_config, int64_t image_token_id) {
  json c;
  c["architectures"] = {"DeepseekV41ForCausalLM"};
  c["model_type"] = "deepseek_v41";
  c["image_token_id"] = image_token_id;
  c["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}, {"weight_block_size", {32, 32}},
                              {"scale_fmt", "ue8m0"}, {"expert_dtype", "fp4"}};
  c["text_config"] = text_config;
  return c;
}

}  // namespace

std::string tiny_config_json(const TinyModelOptions& o) {
  // 8 backbone layers: window-only (0, 1), ratio-2 KV+index source (2) and Reuse (3), ratio-1
  // KV+index+candidate source (4), Reuse (5), Reindex restricted to the pool (6), Reuse (7);
  // Engram on 1 and 3; three DSpark stages tapping layers 5-7.
  json t = shared_text_config(1024);
  t["vocab_size"] = o.vocab_size;
  t["hidden_size"] = 256;
  t["num_hidden_layers"] = 8;
  t["num_attention_heads"] = 4;
  t["head_dim"] = 64;
  t["qk_rope_head_dim"] = 16;
  t["q_lora_rank"] = 64;
  t["o_groups"] = 2;
  t["o_lora_rank"] = 64;
  t["sliding_window"] = 32;
  t["compress_ratios"] = {0, 0, 2, 2, 1, 1, 1, 1, 0, 0, 0};
  t["kv_source_layer_ids"] = {2, 4};
  t["index_source_layer_ids"] = {2, 4, 6};
  t["candidate_source_layer_id"] = 4;
  t["candidate_topk_blocks"] = 8;
  t["candidate_block_size"] = 4;
  t["index_n_heads"] = 4;
  t["index_head_dim"] = 64;
  t["index_topk"] = 16;
  t["max_position_embeddings"] = 16384;
  t["moe_intermediate_size"] = 128;
  t["n_routed_experts"] = 8;
  t["num_experts_per_tok"] = 2;
  t["hidden_act"] = "silu";
  t["attention_bias"] = false;
  t["engram_layer_ids"] = {1, 3};
  t["engram_max_ngram_size"] = 3;
  t["engram_vocab_size"] = 1000;
  t["engram_n_heads"] = 2;
  t["engram_head_dim"] = 32;
  t["engram_compressed_vocab_size"] = o.engram_compressed_vocab;
  auto k = model::engram_constants({1, 3}, 1000, 3, 2, o.engram_compressed_vocab);
  t["engram_num_embeddings"] = {k[0].rows, k[1].rows};
  t["dspark_noise_token_id"] = o.vocab_size == 129280 ? 128799 : o.vocab_size - 1;
  t["dspark_target_layer_ids"] = {5, 6, 7};
  t["dspark_markov_rank"] = 32;
  t["dspark_n_routed_experts"] = 4;
  t["dspark_num_experts_per_tok"] = 2;
  t["tie_word_embeddings"] = false;
  if (o.smooth) {
    t["hidden_size"] = 1024;
    t["num_experts_per_tok"] = 8;  // of 8
    t["dspark_num_experts_per_tok"] = 4;  // of 4
    t["index_topk"] = 4096;  // >= entries of any context up to 4,096 (ratio 1)
    t["candidate_topk_blocks"] = 1024;  // >= blocks of 4 entries up to 4,096 entries
  }
  json c = model_config(t, o.vocab_size == 129280 ? 129264 : o.vocab_size - 2);
  c["dtype"] = "bfloat16";
  c["bos_token_id"] = 0;
  c["eos_token_id"] = 1;
  c["pad_token_id"] = 2;
  c["tie_word_embeddings"] = false;
  if (o.vision) {
    c["vision_config"] = {{"model_type", "deepseek_v41_vision"}, {"hidden_size", 64}, {"intermediate_size", 96}, {"num_hidden_layers", 2},
                          {"num_attention_heads", 4}, {"patch_size", 14}, {"downsample_ratio", 3}, {"rope_theta", 10000},
                          {"max_image_tokens", 64}, {"min_pixels", 84 * 84}, {"max_wh_ratio", nullptr}};
  }
  return c.dump(1);
}

std::string released_synthetic_config_json(int n_routed_experts, int draft_experts, int64_t engram_vocab_size) {
  json t = shared_text_config(65536);
  t["vocab_size"] = 129280;
  t["hidden_size"] = 5120;
  t["num_hidden_layers"] = 40;
  t["num_attention_heads"] = 64;
  t["head_dim"] = 512;
  t["qk_rope_head_dim"] = 64;
  t["q_lora_rank"] = 1280;
  t["o_groups"] = 8;
  t["o_lora_rank"] = 1024;
  t["sliding_window"] = 128;
  std::vector<int> ratios = {0, 0};
  for (int i = 0; i < 18; ++i) ratios.push_back(2);
  for (int i = 0; i < 20; ++i) ratios.push_back(1);
  for (int i = 0; i < 3; ++i) ratios.push_back(0);
  t["compress_ratios"] = ratios;
  t["kv_source_layer_ids"] = {2, 8, 14, 20};
  t["index_source_layer_ids"] = {2, 8, 14, 20, 24, 28, 32, 36};
  t["candidate_source_layer_id"] = 20;
  t["candidate_topk_blocks"] = 2048;
  t["candidate_block_size"] = 8;
  t["index_n_heads"] = 32;
  t["index_head_dim"] = 128;
  t["index_topk"] = 512;
  t["max_position_embeddings"] = 1048576;
  t["moe_intermediate_size"] = 2304;
  t["n_routed_experts"] = n_routed_experts;
  t["num_experts_per_tok"] = 6;
  t["engram_layer_ids"] = {1, 14};
  t["engram_max_ngram_size"] = 4;
  t["engram_vocab_size"] = engram_vocab_size;
  t["engram_n_heads"] = 8;
  t["engram_head_dim"] = 256;
  t["engram_compressed_vocab_size"] = 99092;
  auto k = model::engram_constants({1, 14}, engram_vocab_size, 4, 8, 99092);
  t["engram_num_embeddings"] = {k[0].rows, k[1].rows};
  t["dspark_noise_token_id"] = 128799;
  t["dspark_target_layer_ids"] = {37, 38, 39};
  t["dspark_markov_rank"] = 256;
  t["dspark_n_routed_experts"] = draft_experts;
  t["dspark_num_experts_per_tok"] = 3;
  return model_config(t, 129264).dump(1);
}

std::vector<int32_t> modular_engram_map(int64_t vocab_size, int64_t n_classes) {
  std::vector<int32_t> map(static_cast<size_t>(vocab_size));
  for (size_t t = 0; t < map.size(); ++t) map[t] = int32_t(t % size_t(std::max<int64_t>(1, n_classes)));
  return map;
}

Status write_tiny_model(const TinyModelOptions& o) {
  const std::string cfg_text = tiny_config_json(o);
  model::Config c = FB_TRY(model::Config::from_hf_json(cfg_text));
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) return FB_ERROR(kIo) << o.out_dir << ": " << ec.message();
  Rng rng(o.seed);
  const auto specs = model::expected_tensors(c);
  // Three shards like the release's split: globals, backbone layers, draft + vision.
  auto shard_of = [&](const model::TensorSpec& s) {
    if (s.klass == model::ByteClass::kDraft || s.klass == model::ByteClass::kVision) return 2;
    return s.layer >= 0 ? 1 : 0;
  };
  std::vector<SafetensorsTensor> shards[3];
  json weight_map = json::object();
  int64_t total = 0;
  std::map<std::string, size_t> fp8_owner;  // weight name -> index of its scale placeholder
  auto is_scale_name = [](const std::string& nm) { return nm.size() > 6 && nm.compare(nm.size() - 6, 6, ".scale") == 0; };
  const int64_t n_tensors = int64_t(specs.size());
  int64_t n_done = 0, all_bytes = 0, bytes_done = 0;
  for (const auto& s : specs) all_bytes += s.nbytes();
  if (o.progress) {
    o.progress->set_total(all_bytes);
    o.progress->set_items_total(n_tensors, "tensors");
  }
  for (const auto& s : specs) {
    SafetensorsTensor t{s.name, s.dtype, s.shape, {}};
    const int64_t n = s.nbytes() / int64_t(dtype_size(s.dtype));
    if (o.progress) o.progress->update(bytes_done, n_done);  // what the tensors before this one made
    bytes_done += s.nbytes();
    ++n_done;
    if (is_scale_name(s.name)) continue;  // written together with its weight
    const std::string& nm = s.name;
    if (s.dtype == DType::kF8E4M3) {
      const int64_t rows = s.shape[0], cols = s.shape[1];
      std::vector<float> w(static_cast<size_t>(rows * cols));
      const bool table = nm.find("engram.embed") != std::string::npos;
      const float sd = table ? 1.0f : float(std::pow(double(cols), -0.5)) * released_gain(nm);
      for (auto& v : w) v = rng.normal() * sd;
      std::vector<uint8_t> q, sc;
      if (table) {  // per-row groups of 32 (the Engram table format)
        q.assign(size_t(rows * cols), 0);
        sc.assign(size_t(rows * (cols / 32)), 0);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t g = 0; g < cols / 32; ++g) {
            float amax = 0;
            for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(w[size_t(r * cols + g * 32 + i)]));
            const float scl = pow2_ceil(std::max(amax, 1e-4f) / 448.0f);
            sc[size_t(r * (cols / 32) + g)] = e8m0_from_pow2(scl);
            for (int i = 0; i < 32; ++i) q[size_t(r * cols + g * 32 + i)] = e4m3_from_f32(w[size_t(r * cols + g * 32 + i)] / scl);
          }
      } else {
        quantize_fp8_blocks(w, rows, cols, q, sc);
      }
      t.bytes = std::move(q);
      const std::string scale_name = nm.substr(0, nm.size() - 6) + "scale";
      std::vector<int64_t> scale_shape = table ? std::vector<int64_t>{rows, cols / 32} : std::vector<int64_t>{(rows + 31) / 32, (cols + 31) / 32};
      const int sh = shard_of(s);
      shards[sh].push_back(std::move(t));
      shards[sh].push_back({scale_name, DType::kF8E8M0, scale_shape, std::move(sc)});
      continue;
    }
    if (s.dtype == DType::kI8) {  // MXFP4 expert: random codes, one 2^k scale per 32 inputs
      const int64_t rows = s.shape[0], fan_in = s.shape[1] * 2;
      t.bytes.resize(size_t(n));
      for (auto& b : t.bytes) b = uint8_t(rng.next() & 0xFF);
      const int e = int(std::lround(std::log2(std::pow(double(fan_in), -0.5) * released_gain(nm) / 3.2)));
      std::vector<uint8_t> sc(static_cast<size_t>(rows * (fan_in / 32)));
      for (auto& b : sc) b = uint8_t(127 + e + int(rng.next() % 3) - 1);
      const std::string scale_name = nm.substr(0, nm.size() - 6) + "scale";
      const int sh = shard_of(s);
      shards[sh].push_back(std::move(t));
      shards[sh].push_back({scale_name, DType::kF8E8M0, {rows, fan_in / 32}, std::move(sc)});
      continue;
    }
    std::vector<float> v(static_cast<size_t>(n));
    const bool is_norm = nm.find("norm") != std::string::npos && nm.find(".weight") != std::string::npos;
    if (nm == "embed.weight" || nm.find("markov_head.embed") != std::string::npos) {
      for (auto& x : v) x = rng.normal() * 0.12f;
    } else if (is_norm) {
      const float mean = released_norm_mean(nm);
      for (auto& x : v) x = mean * (1.0f + 0.1f * rng.normal());
    } else if (s.shape.size() >= 2) {
      const float sd = float(std::pow(double(s.shape.back()), -0.5)) * released_gain(nm);
      for (auto& x : v) x = rng.normal() * sd;
    } else {
      for (auto& x : v) x = 0.5f * rng.normal();
    }
    t.bytes = s.dtype == DType::kBF16 ? to_bytes_bf16(v) : to_bytes_f32(v);
    shards[shard_of(s)].push_back(std::move(t));
  }
  for (int i = 0; i < 3; ++i) {
    char fn[64];
    std::snprintf(fn, sizeof fn, "model-%05d-of-%05d.safetensors", i + 1, 3);
    for (auto& t : shards[i]) {
      weight_map[t.name] = fn;
      total += int64_t(t.bytes.size());
    }
    FB_RETURN_IF_ERROR(write_safetensors((fs::path(o.out_dir) / fn).string(), shards[i]));
  }
  json index = {{"metadata", {{"total_size", total}, {"generator", "flashbox make-tiny"}, {"seed", o.seed}}}, {"weight_map", weight_map}};
  const std::string idx = index.dump(1);
  FB_RETURN_IF_ERROR(write_file_atomic((fs::path(o.out_dir) / "model.safetensors.index.json").string(), idx.data(), idx.size()));
  // config.json last: a folder without it is not a model, so an interrupted run is never mistaken for one
  FB_RETURN_IF_ERROR(write_file_atomic((fs::path(o.out_dir) / "config.json").string(), cfg_text.data(), cfg_text.size()));
  if (o.progress) {
    o.progress->update(all_bytes, n_tensors);
    o.progress->finish();
  }
  return Status();
}

}  // namespace fb::loader
