// ModelConfig: the model's shape and constants, parsed from the snapshot's HF config.json
// (`text_config`, optional `vision_config`), plus the per-layer roles derived from them
// (spec/10 §1.4). Backend-free: no tensors here. Invariant: a Config that parsed OK satisfies
// every structural rule of spec/10 §7.1, so executors may rely on it without re-checking.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace fb::model {

struct VisionConfig {
  int n_layers = 0;       // vision_config.num_hidden_layers; 0 = no vision tower
  int dim = 0;            // hidden_size
  int n_heads = 0;        // num_attention_heads
  int inter_dim = 0;      // intermediate_size
  int patch_size = 14;    // patch_size
  int downsample = 3;     // downsample_ratio
  double rope_theta = 10000.0;
  int max_image_tokens = 1024;
  int64_t min_pixels = 295936;
  std::optional<double> max_wh_ratio;
};

// What one layer does (backbone layers 0..n_layers-1, then draft stages n_layers..).
struct LayerRole {
  int ratio = 0;                 // compress_ratios[l]: 0 window only, 2 pairs pooled, 1 per token
  bool is_draft = false;
  bool kv_source = false;        // owns a Compressor + indexer wk (writes compressed KV + index keys)
  bool index_source = false;     // runs an indexer (publishes a top-k selection)
  bool candidate_source = false; // publishes the candidate block pool
  bool pool_restricted = false;  // index source after the candidate source: scores masked to the pool
  int kv_layer = -1;             // layer whose compressed KV + index keys this layer reads
  int index_layer = -1;          // layer whose selection this layer uses
  int engram_table = -1;         // index into engram tables, or -1
  int dspark_tap = -1;           // index into dspark_target_layer_ids when this layer's INPUT is tapped
  int n_experts = 0;             // routed experts of this layer's MoE
  int n_active = 0;              // top-k
  bool yarn() const { return ratio > 0; }  // compressed layers use theta 160000 + YaRN
};

struct Config {
  // ---- text_config (names follow the HF keys; reference spelling in comments) ----
  int64_t vocab_size = 0;
  int dim = 0;                   // hidden_size
  int n_layers = 0;              // num_hidden_layers
  int n_mtp_layers = 0;          // num_nextn_predict_layers (DSpark stages)
  int n_heads = 0;               // num_attention_heads
  int head_dim = 0;
  int rope_head_dim = 0;         // qk_rope_head_dim
  int q_lora_rank = 0;
  int o_groups = 0;
  int o_lora_rank = 0;
  int window_size = 0;           // sliding_window (includes the current token)
  std::vector<int> compress_ratios;  // n_layers + n_mtp_layers entries
  std::vector<int> kv_source_layers;
  std::vector<int> index_source_layers;
  int candidate_source_layer = -1;
  int candidate_topk_blocks = 0;
  int candidate_block_size = 0;
  int index_n_heads = 0;
  int index_head_dim = 0;
  int index_topk = 0;
  double rope_theta = 10000.0;
  double compress_rope_theta = 160000.0;
  double rope_factor = 1.0;      // rope_scaling.factor
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  int64_t original_seq_len = 0;  // rope_scaling.original_max_position_embeddings
  int64_t max_position_embeddings = 0;
  int moe_inter_dim = 0;         // moe_intermediate_size
  int n_routed_experts = 0;
  int n_shared_experts = 1;
  int n_activated_experts = 0;   // num_experts_per_tok
  bool norm_topk_prob = true;
  float route_scale = 1.0f;      // routed_scaling_factor
  float swiglu_limit = 0.0f;
  float gate_temp = 1.0f;
  int hc_mult = 4;
  int hc_sinkhorn_iters = 20;
  float hc_eps = 1e-6f;
  float norm_eps = 1e-20f;       // rms_norm_eps
  std::vector<int> engram_layer_ids;
  std::vector<int64_t> engram_num_embeddings;
  int engram_max_ngram = 0;
  int64_t engram_vocab_size = 0;
  int engram_n_heads = 0;
  int engram_head_dim = 0;
  int engram_pad_id = 2;         // engram_pad_token_id (or engram_pad_id)
  int64_t engram_compressed_vocab = 0;
  int dspark_block_size = 0;
  int dspark_noise_token_id = 0;
  std::vector<int> dspark_target_layer_ids;
  int dspark_markov_rank = 0;
  int dspark_n_routed_experts = 0;
  int dspark_n_activated_experts = 0;
  int64_t bos_token_id = 0, eos_token_id = 1, pad_token_id = 2;
  int64_t image_token_id = 129264;
  VisionConfig vision;

  // ---- derived ----
  std::vector<LayerRole> roles;  // n_layers + n_mtp_layers
  // First "decoder" layer of spec/11 §8.1 (20 in the released model): the last backbone KV
  // source, so no later layer writes global KV and its compressed cache is a function of its
  // input alone. Bounded replay (§8.4) splits the backbone here. -1: no such layer above 0.
  int decoder_start = -1;

  bool has_vision() const { return vision.n_layers > 0; }
  int n_total_layers() const { return n_layers + n_mtp_layers; }
  int n_engram_tables() const { return int(engram_layer_ids.size()); }
  int engram_row_width() const { return engram_head_dim; }
  // Width of the concatenated Engram rows: (max_ngram - 1) orders x heads x head_dim.
  int engram_cat_dim() const { return (engram_max_ngram - 1) * engram_n_heads * engram_head_dim; }
  int q_dim() const { return n_heads * head_dim; }
  int o_group_in() const { return n_heads * head_dim / o_groups; }

  // Parses an HF config.json text (top level with text_config). Validates every rule.
  static Result<Config> from_hf_json(const std::string& json_text);
  static Result<Config> from_file(const std::string& path);
};

// Fills `roles` and checks spec/10 §7.1; called by from_hf_json, exposed for tests that
// construct configs in code.
Status derive_roles(Config& c);

}  // namespace fb::model
