#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "base/mapped_file.h"

namespace fb::model {

namespace {

using json = nlohmann::json;

// Typed field readers: a wrong type or an out-of-range value is a Status naming the key.
class Reader {
 public:
  Reader(const json& j, std::string where) : j_(j), where_(std::move(where)) {}

  const json* find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const char* key) const { return find(key) != nullptr; }

  Status integer(const char* key, int64_t* out, bool required, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) const {
    const json* v = find(key);
    if (!v) return required ? missing(key) : Status();
    int64_t x;
    if (v->is_number_integer()) {
      x = v->get<int64_t>();
    } else if (v->is_number_float() && std::isfinite(v->get<double>()) && v->get<double>() == std::floor(v->get<double>()) &&
               std::fabs(v->get<double>()) < 9e15) {
      x = int64_t(v->get<double>());
    } else {
      return bad(key, "an integer");
    }
    if (x < lo || x > hi) return FB_ERROR(kInvalidArgument) << where_ << "." << key << " = " << x << " is out of range [" << lo << ", " << hi << "]";
    *out = x;
    return Status();
  }
  template <typename T>
  Status small(const char* key, T* out, bool required, int64_t lo = 0, int64_t hi = (1LL << 30)) const {
    int64_t x = int64_t(*out);
    FB_RETURN_IF_ERROR(integer(key, &x, required, lo, hi));
    *out = T(x);
    return Status();
  }
  Status number(const char* key, double* out, bool required) const {
    const json* v = find(key);
    if (!v) return required ? missing(key) : Status();
    if (!v->is_number() || !std::isfinite(v->get<double>())) return bad(key, "a finite number");
    *out = v->get<double>();
    return Status();
  }
  Status number_f(const char* key, float* out, bool required) const {
    double d = *out;
    FB_RETURN_IF_ERROR(number(key, &d, required));
    *out = float(d);
    return Status();
  }
  Status boolean(const char* key, bool* out, bool required) const {
    const json* v = find(key);
    if (!v) return required ? missing(key) : Status();
    if (!v->is_boolean()) return bad(key, "a boolean");
    *out = v->get<bool>();
    return Status();
  }
  Status string(const char* key, std::string* out, bool required) const {
    const json* v = find(key);
    if (!v) return required ? missing(key) : Status();
    if (!v->is_string()) return bad(key, "a string");
    *out = v->get<std::string>();
    return Status();
  }
  template <typename T>
  Status int_list(const char* key, std::vector<T>* out, bool required, int64_t lo, int64_t hi, size_t max_len = 4096) const {
    const json* v = find(key);
    if (!v) return required ? missing(key) : Status();
    if (!v->is_array() || v->size() > max_len) return bad(key, "a list of integers");
    out->clear();
    for (const json& e : *v) {
      if (!e.is_number_integer()) return bad(key, "a list of integers");
      int64_t x = e.get<int64_t>();
      if (x < lo || x > hi) return FB_ERROR(kInvalidArgument) << where_ << "." << key << " holds " << x << ", out of range [" << lo << ", " << hi << "]";
      out->push_back(T(x));
    }
    return Status();
  }

 private:
  Status missing(const char* key) const { return FB_ERROR(kInvalidArgument) << where_ << ": missing key \"" << key << "\""; }
  Status bad(const char* key, const char* want) const {
    return FB_ERROR(kInvalidArgument) << where_ << "." << key << " must be " << want;
  }
  const json& j_;
  std::string where_;
};

constexpr int64_t kMaxDim = 1 << 20;

Status parse_text(const json& t, Config& c) {
  Reader r(t, "text_config");
  FB_RETURN_IF_ERROR(r.integer("vocab_size", &c.vocab_size, true, 1, 1LL << 26));
  FB_RETURN_IF_ERROR(r.small("hidden_size", &c.dim, true, 32, kMaxDim));
  FB_RETURN_IF_ERROR(r.small("num_hidden_layers", &c.n_layers, true, 1, 1024));
  FB_RETURN_IF_ERROR(r.small("num_nextn_predict_layers", &c.n_mtp_layers, false, 0, 16));
  FB_RETURN_IF_ERROR(r.small("num_attention_heads", &c.n_heads, true, 1, 4096));
  int64_t kv_heads = 1;
  FB_RETURN_IF_ERROR(r.integer("num_key_value_heads", &kv_heads, false, 1, 1));
  FB_RETURN_IF_ERROR(r.small("head_dim", &c.head_dim, true, 16, 1 << 16));
  FB_RETURN_IF_ERROR(r.small("qk_rope_head_dim", &c.rope_head_dim, true, 2, 1 << 16));
  FB_RETURN_IF_ERROR(r.small("q_lora_rank", &c.q_lora_rank, true, 32, kMaxDim));
  FB_RETURN_IF_ERROR(r.small("o_groups", &c.o_groups, true, 1, 4096));
  FB_RETURN_IF_ERROR(r.small("o_lora_rank", &c.o_lora_rank, true, 1, kMaxDim));
  FB_RETURN_IF_ERROR(r.small("sliding_window", &c.window_size, true, 1, 1 << 20));
  FB_RETURN_IF_ERROR(r.int_list("compress_ratios", &c.compress_ratios, true, 0, 2));
  FB_RETURN_IF_ERROR(r.int_list("kv_source_layer_ids", &c.kv_source_layers, false, 0, 1023));
  FB_RETURN_IF_ERROR(r.int_list("index_source_layer_ids", &c.index_source_layers, false, 0, 1023));
  FB_RETURN_IF_ERROR(r.small("candidate_source_layer_id", &c.candidate_source_layer, false, -1000, 1023));
  FB_RETURN_IF_ERROR(r.small("candidate_topk_blocks", &c.candidate_topk_blocks, false, 0, 1 << 24));
  FB_RETURN_IF_ERROR(r.small("candidate_block_size", &c.candidate_block_size, false, 0, 1 << 16));
  FB_RETURN_IF_ERROR(r.small("index_n_heads", &c.index_n_heads, false, 0, 4096));
  FB_RETURN_IF_ERROR(r.small("index_head_dim", &c.index_head_dim, false, 0, 1 << 16));
  FB_RETURN_IF_ERROR(r.small("index_topk", &c.index_topk, false, 0, 1 << 24));
  FB_RETURN_IF_ERROR(r.number("rope_theta", &c.rope_theta, true));
  FB_RETURN_IF_ERROR(r.number("compress_rope_theta", &c.compress_rope_theta, false));
  if (const json* rs = r.find("rope_scaling")) {
    if (!rs->is_object()) return FB_ERROR(kInvalidArgument) << "text_config.rope_scaling must be an object";
    Reader y(*rs, "text_config.rope_scaling");
    std::string type = "yarn";
    FB_RETURN_IF_ERROR(y.string("rope_type", &type, false));
    if (type != "yarn") return FB_ERROR(kUnsupported) << "rope_scaling.rope_type \"" << type << "\" (only yarn)";
    FB_RETURN_IF_ERROR(y.number("factor", &c.rope_factor, true));
    FB_RETURN_IF_ERROR(y.number("beta_fast", &c.beta_fast, false));
    FB_RETURN_IF_ERROR(y.number("beta_slow", &c.beta_slow, false));
    FB_RETURN_IF_ERROR(y.integer("original_max_position_embeddings", &c.original_seq_len, true, 0, 1LL << 40));
  }
  FB_RETURN_IF_ERROR(r.integer("max_position_embeddings", &c.max_position_embeddings, false, 1, 1LL << 40));
  FB_RETURN_IF_ERROR(r.small("moe_intermediate_size", &c.moe_inter_dim, true, 32, kMaxDim));
  FB_RETURN_IF_ERROR(r.small("n_routed_experts", &c.n_routed_experts, true, 1, 1 << 16));
  FB_RETURN_IF_ERROR(r.small("n_shared_experts", &c.n_shared_experts, false, 1, 1));
  FB_RETURN_IF_ERROR(r.small("num_experts_per_tok", &c.n_activated_experts, true, 1, 1 << 16));
  std::string s;
  FB_RETURN_IF_ERROR(r.string("scoring_func", &s, false));
  if (!s.empty() && s != "sqrtsoftplus") return FB_ERROR(kUnsupported) << "text_config.scoring_func \"" << s << "\" (only sqrtsoftplus)";
  s.clear();
  FB_RETURN_IF_ERROR(r.string("topk_method", &s, false));
  if (!s.empty() && s != "noaux_tc") return FB_ERROR(kUnsupported) << "text_config.topk_method \"" << s << "\" (only noaux_tc)";
  FB_RETURN_IF_ERROR(r.boolean("norm_topk_prob", &c.norm_topk_prob, false));
  FB_RETURN_IF_ERROR(r.number_f("routed_scaling_factor", &c.route_scale, false));
  FB_RETURN_IF_ERROR(r.number_f("swiglu_limit", &c.swiglu_limit, false));
  FB_RETURN_IF_ERROR(r.number_f("gate_temp", &c.gate_temp, false));
  FB_RETURN_IF_ERROR(r.small("hc_mult", &c.hc_mult, false, 1, 64));
  FB_RETURN_IF_ERROR(r.small("hc_sinkhorn_iters", &c.hc_sinkhorn_iters, false, 1, 1000));
  FB_RETURN_IF_ERROR(r.number_f("hc_eps", &c.hc_eps, false));
  FB_RETURN_IF_ERROR(r.number_f("rms_norm_eps", &c.norm_eps, false));
  bool attention_bias = false;
  FB_RETURN_IF_ERROR(r.boolean("attention_bias", &attention_bias, false));
  if (attention_bias) return FB_ERROR(kUnsupported) << "text_config.attention_bias = true";
  FB_RETURN_IF_ERROR(r.int_list("engram_layer_ids", &c.engram_layer_ids, false, 0, 1023));
  FB_RETURN_IF_ERROR(r.int_list("engram_num_embeddings", &c.engram_num_embeddings, false, 1, 1LL << 40));
  FB_RETURN_IF_ERROR(r.small("engram_max_ngram_size", &c.engram_max_ngram, false, 0, 64));
  FB_RETURN_IF_ERROR(r.integer("engram_vocab_size", &c.engram_vocab_size, false, 0, 1LL << 40));
  FB_RETURN_IF_ERROR(r.small("engram_n_heads", &c.engram_n_heads, false, 0, 4096));
  FB_RETURN_IF_ERROR(r.small("engram_head_dim", &c.engram_head_dim, false, 0, 1 << 16));
  // Released config.json says engram_pad_token_id; the HF port and the reference say engram_pad_id.
  if (r.has("engram_pad_token_id")) {
    FB_RETURN_IF_ERROR(r.small("engram_pad_token_id", &c.engram_pad_id, false, 0, 1 << 30));
  } else {
    FB_RETURN_IF_ERROR(r.small("engram_pad_id", &c.engram_pad_id, false, 0, 1 << 30));
  }
  FB_RETURN_IF_ERROR(r.integer("engram_compressed_vocab_size", &c.engram_compressed_vocab, false, 0, 1LL << 31));
  FB_RETURN_IF_ERROR(r.small("dspark_block_size", &c.dspark_block_size, false, 0, 64));
  FB_RETURN_IF_ERROR(r.small("dspark_noise_token_id", &c.dspark_noise_token_id, false, 0, 1 << 30));
  FB_RETURN_IF_ERROR(r.int_list("dspark_target_layer_ids", &c.dspark_target_layer_ids, false, 0, 1023));
  FB_RETURN_IF_ERROR(r.small("dspark_markov_rank", &c.dspark_markov_rank, false, 0, 1 << 16));
  FB_RETURN_IF_ERROR(r.small("dspark_n_routed_experts", &c.dspark_n_routed_experts, false, 0, 1 << 16));
  if (r.has("dspark_num_experts_per_tok")) {
    FB_RETURN_IF_ERROR(r.small("dspark_num_experts_per_tok", &c.dspark_n_activated_experts, false, 0, 1 << 16));
  } else {
    FB_RETURN_IF_ERROR(r.small("dspark_n_activated_experts", &c.dspark_n_activated_experts, false, 0, 1 << 16));
  }
  return Status();
}

Status parse_vision(const json& v, Config& c) {
  Reader r(v, "vision_config");
  auto& vc = c.vision;
  FB_RETURN_IF_ERROR(r.small("num_hidden_layers", &vc.n_layers, true, 0, 1024));
  if (vc.n_layers == 0) return Status();
  FB_RETURN_IF_ERROR(r.small("hidden_size", &vc.dim, true, 1, kMaxDim));
  FB_RETURN_IF_ERROR(r.small("num_attention_heads", &vc.n_heads, true, 1, 4096));
  FB_RETURN_IF_ERROR(r.small("intermediate_size", &vc.inter_dim, true, 1, kMaxDim));
  FB_RETURN_IF_ERROR(r.small("patch_size", &vc.patch_size, false, 1, 4096));
  FB_RETURN_IF_ERROR(r.small("downsample_ratio", &vc.downsample, false, 1, 64));
  FB_RETURN_IF_ERROR(r.number("rope_theta", &vc.rope_theta, false));
  FB_RETURN_IF_ERROR(r.small("max_image_tokens", &vc.max_image_tokens, false, 1, 1 << 24));
  FB_RETURN_IF_ERROR(r.integer("min_pixels", &vc.min_pixels, false, 1, 1LL << 40));
  if (r.has("max_wh_ratio")) {
    double x = 0;
    FB_RETURN_IF_ERROR(r.number("max_wh_ratio", &x, false));
    vc.max_wh_ratio = x;
  }
  if (vc.dim % vc.n_heads != 0) return FB_ERROR(kInvalidArgument) << "vision_config: hidden_size not divisible by num_attention_heads";
  if ((vc.dim / vc.n_heads) % 4 != 0) return FB_ERROR(kInvalidArgument) << "vision_config: head dim must be a multiple of 4 (2-D RoPE)";
  return Status();
}

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

}  // namespace

Status derive_roles(Config& c) {
  auto err = [](auto&&... parts) {
    StatusBuilder b(StatusCode::kInvalidArgument);
    b << "config: ";
    (b << ... << parts);
    return Status(b);
  };
  const int L = c.n_layers, T = c.n_total_layers();
  // spec/10 §7.1 rule 9
  if (int(c.compress_ratios.size()) != T)
    return err("compress_ratios has ", c.compress_ratios.size(), " entries, want num_hidden_layers + num_nextn_predict_layers = ", T);
  for (int l = L; l < T; ++l)
    if (c.compress_ratios[size_t(l)] != 0) return err("draft layer ", l, " must have compress ratio 0");
  // rules 1-4: shapes that the quantisers and projections need
  if (c.dim % 32) return err("hidden_size ", c.dim, " is not a multiple of 32");
  if (c.q_lora_rank % 32) return err("q_lora_rank ", c.q_lora_rank, " is not a multiple of 32");
  if (c.moe_inter_dim % 32) return err("moe_intermediate_size ", c.moe_inter_dim, " is not a multiple of 32");
  if ((c.o_groups * c.o_lora_rank) % 32) return err("o_groups x o_lora_rank is not a multiple of 32");
  if (c.head_dim % 32) return err("head_dim ", c.head_dim, " is not a multiple of 32");
  if (c.rope_head_dim % 2 || c.rope_head_dim > c.head_dim) return err("qk_rope_head_dim must be even and <= head_dim");
  if (c.n_heads % c.o_groups) return err("num_attention_heads is not divisible by o_groups");
  if ((c.n_heads * c.head_dim / c.o_groups) % 32) return err("o_groups input width is not a multiple of 32");
  if (c.n_activated_experts > c.n_routed_experts) return err("num_experts_per_tok > n_routed_experts");
  if (c.hc_mult < 1 || c.hc_mult > 16) return err("hc_mult must be in 1..16");

  std::set<int> seen;
  for (int s : c.kv_source_layers) {
    if (s >= L || c.compress_ratios[size_t(s)] == 0) return err("kv source layer ", s, " must be a backbone layer with ratio > 0");
    if (!seen.insert(s).second) return err("kv source layer ", s, " listed twice");
  }
  seen.clear();
  for (int s : c.index_source_layers) {
    if (s >= L || c.compress_ratios[size_t(s)] == 0) return err("index source layer ", s, " must be a backbone layer with ratio > 0");
    if (!seen.insert(s).second) return err("index source layer ", s, " listed twice");
  }
  for (int s : c.kv_source_layers)
    if (!contains(c.index_source_layers, s)) return err("kv source layer ", s, " must also be an index source (spec/10 §7.1 rule 6)");
  bool any_compressed = false;
  for (int l = 0; l < L; ++l) any_compressed |= c.compress_ratios[size_t(l)] > 0;
  if (any_compressed) {
    if (c.index_head_dim % 32 || c.index_head_dim < c.rope_head_dim) return err("index_head_dim must be a multiple of 32 and >= qk_rope_head_dim");
    if (c.head_dim % 16) return err("head_dim must be a multiple of 16");
    if (c.index_n_heads <= 0 || c.index_topk <= 0) return err("index_n_heads and index_topk must be positive");
  }
  if (c.candidate_source_layer >= 0) {
    if (!contains(c.index_source_layers, c.candidate_source_layer)) return err("candidate_source_layer_id must be an index source");
    if (c.candidate_topk_blocks <= 0 || c.candidate_block_size <= 0) return err("candidate_topk_blocks and candidate_block_size must be positive");
  }
  if (!c.engram_layer_ids.empty()) {
    if (c.engram_num_embeddings.size() != c.engram_layer_ids.size()) return err("engram_num_embeddings must have one entry per engram layer");
    if (c.engram_max_ngram < 2 || c.engram_n_heads <= 0 || c.engram_head_dim <= 0 || c.engram_head_dim % 32)
      return err("engram: max_ngram >= 2, n_heads > 0 and head_dim a positive multiple of 32 are required");
    if (c.engram_cat_dim() % 32) return err("engram concatenated width is not a multiple of 32");
    if (c.engram_vocab_size < 2) return err("engram_vocab_size must be >= 2");
    if (c.engram_compressed_vocab <= 0) return err("engram_compressed_vocab_size must be positive");
    seen.clear();
    for (int l : c.engram_layer_ids) {
      if (l >= L) return err("engram layer ", l, " is not a backbone layer");
      if (!seen.insert(l).second) return err("engram layer ", l, " listed twice");
    }
  }
  if (c.n_mtp_layers > 0) {
    if (c.dspark_block_size <= 0) return err("dspark_block_size must be positive when draft layers exist");
    if (c.dspark_target_layer_ids.empty()) return err("dspark_target_layer_ids is empty");
    for (int l : c.dspark_target_layer_ids)
      if (l >= L) return err("dspark target layer ", l, " is not a backbone layer");
    if ((int64_t(c.dspark_target_layer_ids.size()) * c.dim) % 32) return err("dspark main_proj width is not a multiple of 32");
    if (c.dspark_markov_rank <= 0) return err("dspark_markov_rank must be positive");
    if (c.dspark_noise_token_id < 0 || c.dspark_noise_token_id >= c.vocab_size) return err("dspark_noise_token_id is not a vocabulary id");
  }
  if (c.dspark_n_routed_experts == 0) c.dspark_n_routed_experts = c.n_routed_experts;
  if (c.dspark_n_activated_experts == 0) c.dspark_n_activated_experts = c.n_activated_experts;
  if (c.dspark_n_activated_experts > c.dspark_n_routed_experts) return err("dspark top-k > dspark experts");

  c.roles.assign(size_t(T), LayerRole{});
  int kv = -1, idx = -1, kv_ratio = 0;
  for (int l = 0; l < T; ++l) {
    LayerRole& r = c.roles[size_t(l)];
    r.ratio = c.compress_ratios[size_t(l)];
    r.is_draft = l >= L;
    r.n_experts = r.is_draft ? c.dspark_n_routed_experts : c.n_routed_experts;
    r.n_active = r.is_draft ? c.dspark_n_activated_experts : c.n_activated_experts;
    if (r.is_draft) continue;
    r.kv_source = contains(c.kv_source_layers, l);
    r.index_source = contains(c.index_source_layers, l);
    r.candidate_source = l == c.candidate_source_layer;
    if (r.kv_source) {
      kv = l;
      kv_ratio = r.ratio;
    }
    if (r.ratio > 0) {
      // rule 5: a compressed layer reads the latest KV source, which must share its ratio
      if (kv < 0) return err("layer ", l, " has ratio ", r.ratio, " but no KV source at or before it");
      if (kv_ratio != r.ratio) return err("layer ", l, " has ratio ", r.ratio, " but its KV source ", kv, " has ratio ", kv_ratio);
      if (r.index_source) idx = l;
      if (idx < 0 || idx < kv) {
        // rule 6: the first compressed layer after a KV source must have a selection to reuse
        if (idx < 0) return err("layer ", l, " has ratio > 0 but no index source at or before it");
      }
      r.kv_layer = kv;
      r.index_layer = idx;
      if (r.index_source && c.candidate_source_layer >= 0 && l > c.candidate_source_layer) {
        r.pool_restricted = true;
        // rule 7: a restricted indexer scores the same entries as the candidate source
        const LayerRole& cs = c.roles[size_t(c.candidate_source_layer)];
        if (cs.kv_layer != r.kv_layer) return err("index layer ", l, " is restricted by the candidate pool but reads another KV source");
      }
    }
  }
  // The decoder begins at the last KV source: every later compressed layer reads that source's
  // cache (rule 5 picks the latest source), and the source fills it from its own input.
  c.decoder_start = -1;
  for (int l = 1; l < L; ++l)
    if (c.roles[size_t(l)].kv_source) c.decoder_start = l;
  for (size_t i = 0; i < c.engram_layer_ids.size(); ++i) c.roles[size_t(c.engram_layer_ids[i])].engram_table = int(i);
  for (size_t i = 0; i < c.dspark_target_layer_ids.size(); ++i) {
    int l = c.dspark_target_layer_ids[i];
    if (c.roles[size_t(l)].dspark_tap >= 0) return err("dspark target layer ", l, " listed twice");
    c.roles[size_t(l)].dspark_tap = int(i);
  }
  return Status();
}

Result<Config> Config::from_hf_json(const std::string& json_text) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return FB_ERROR(kCorrupt) << "config.json is not valid JSON";
  if (!j.is_object()) return FB_ERROR(kCorrupt) << "config.json must hold a JSON object";
  Config c;
  const json* text = &j;
  auto it = j.find("text_config");
  if (it != j.end()) {
    if (!it->is_object()) return FB_ERROR(kCorrupt) << "config.json: text_config must be an object";
    text = &*it;
  } else {
    return FB_ERROR(kCorrupt) << "config.json has no text_config (is this a DeepSeek-V4.1 HF snapshot?)";
  }
  if (auto mt = j.find("model_type"); mt != j.end() && mt->is_string() && mt->get<std::string>() != "deepseek_v41")
    return FB_ERROR(kUnsupported) << "config.json model_type \"" << mt->get<std::string>() << "\" (want deepseek_v41)";
  if (auto q = j.find("quantization_config"); q != j.end() && q->is_object()) {
    Reader r(*q, "quantization_config");
    std::string fmt;
    FB_RETURN_IF_ERROR(r.string("scale_fmt", &fmt, false));
    if (!fmt.empty() && fmt != "ue8m0") return FB_ERROR(kUnsupported) << "quantization_config.scale_fmt \"" << fmt << "\"";
    if (auto bs = q->find("weight_block_size"); bs != q->end()) {
      if (!bs->is_array() || bs->size() != 2 || !(*bs)[0].is_number_integer() || (*bs)[0].get<int64_t>() != 32 ||
          !(*bs)[1].is_number_integer() || (*bs)[1].get<int64_t>() != 32)
        return FB_ERROR(kUnsupported) << "quantization_config.weight_block_size must be [32, 32]";
    }
  }
  FB_RETURN_IF_ERROR(parse_text(*text, c));
  Reader top(j, "config");
  FB_RETURN_IF_ERROR(top.integer("image_token_id", &c.image_token_id, false, 0, 1LL << 31));
  FB_RETURN_IF_ERROR(top.integer("bos_token_id", &c.bos_token_id, false, 0, 1LL << 31));
  FB_RETURN_IF_ERROR(top.integer("eos_token_id", &c.eos_token_id, false, 0, 1LL << 31));
  if (auto v = j.find("vision_config"); v != j.end() && !v->is_null()) {
    if (!v->is_object()) return FB_ERROR(kCorrupt) << "config.json: vision_config must be an object";
    FB_RETURN_IF_ERROR(parse_vision(*v, c));
  }
  FB_RETURN_IF_ERROR(derive_roles(c));
  return c;
}

Result<Config> Config::from_file(const std::string& path) {
  std::string text = FB_TRY(read_file_bytes(path));
  if (text.size() > (64u << 20)) return FB_ERROR(kCorrupt) << path << ": config larger than 64 MiB";
  auto c = from_hf_json(text);
  if (!c.ok()) return c.status().with_context(path);
  return c;
}

}  // namespace fb::model
