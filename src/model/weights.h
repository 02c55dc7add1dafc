// ModelWeights: every tensor of the checkpoint bound by role (views into the mapped shards).
// Backend-free: executors read these views (CPU directly, CUDA by uploading). Routed experts are
// NOT here: they come through an ExpertSource so the math never knows where bytes live.
#pragma once

#include <memory>
#include <vector>

#include "base/tensor_view.h"
#include "model/config.h"
#include "model/executor_stats.h"

namespace fb::model {

struct Fp8Linear {  // e4m3 [N, K] + e8m0 [ceil(N/32), ceil(K/32)]
  TensorView w, scale;
  int64_t n() const { return w.dim(0); }
  int64_t k() const { return w.dim(1); }
};

struct Fp4Linear {  // packed e2m1 [N, K/2] + e8m0 [N, K/32]
  TensorView w, scale;
};

struct ExpertWeights {
  Fp4Linear w1, w2, w3;  // gate [inter, D], down [D, inter], up [inter, D]
};

struct LayerWeights {
  TensorView hc_attn_fn, hc_attn_base, hc_attn_scale, hc_ffn_fn, hc_ffn_base, hc_ffn_scale;  // f32
  TensorView attn_norm, ffn_norm;  // bf16 [D]
  TensorView attn_sink;            // f32 [H]
  Fp8Linear wq_a, wq_b, wkv, wo_a, wo_b;
  TensorView q_norm, kv_norm;      // bf16
  // compressor (KV sources)
  TensorView comp_wkv, comp_wgate, comp_norm;  // bf16; wgate only for ratio 2
  // indexer
  TensorView idx_wk, idx_k_norm;   // KV sources
  Fp8Linear idx_wq_b;              // index sources
  TensorView idx_weights_proj;     // bf16 [index_n_heads, D]
  // MoE
  TensorView gate_w, gate_bias, gate_bias_vl;  // bias_vl only with vision
  Fp8Linear sh_w1, sh_w2, sh_w3;
  // Engram
  TensorView engram_table, engram_table_scale;  // e4m3 [rows, head_dim], e8m0 [rows, head_dim/32]
  Fp8Linear engram_wkv;
  TensorView engram_q, engram_k;   // bf16 [hc, D]
};

// Whether the checkpoint must hold a tensor (kOptional: absent on layers or models without the
// feature: compressor, indexer, Engram, vision bias).
enum class Presence { kRequired, kOptional };

// Every tensor of a layer, listed once (issue 23): calls f(name, presence, l.member...) for each
// member of LayerWeights, over one or more structs with the same member names (LayerWeights, the
// CUDA executor's DevLayer). `name` is the checkpoint name below the layer's prefix; an FP8 linear
// is named without its ".weight" / ".scale" suffix.
template <class F, class... L>
void for_each_layer_tensor(F&& f, L&... l) {
  constexpr Presence kReq = Presence::kRequired, kOpt = Presence::kOptional;
  f("hc_attn_fn", kReq, l.hc_attn_fn...);
  f("hc_attn_base", kReq, l.hc_attn_base...);
  f("hc_attn_scale", kReq, l.hc_attn_scale...);
  f("hc_ffn_fn", kReq, l.hc_ffn_fn...);
  f("hc_ffn_base", kReq, l.hc_ffn_base...);
  f("hc_ffn_scale", kReq, l.hc_ffn_scale...);
  f("attn_norm.weight", kReq, l.attn_norm...);
  f("ffn_norm.weight", kReq, l.ffn_norm...);
  f("attn.attn_sink", kReq, l.attn_sink...);
  f("attn.wq_a", kReq, l.wq_a...);
  f("attn.wq_b", kReq, l.wq_b...);
  f("attn.wkv", kReq, l.wkv...);
  f("attn.wo_a", kReq, l.wo_a...);
  f("attn.wo_b", kReq, l.wo_b...);
  f("attn.q_norm.weight", kReq, l.q_norm...);
  f("attn.kv_norm.weight", kReq, l.kv_norm...);
  f("attn.compressor.wkv.weight", kOpt, l.comp_wkv...);
  f("attn.compressor.wgate.weight", kOpt, l.comp_wgate...);
  f("attn.compressor.norm.weight", kOpt, l.comp_norm...);
  f("attn.indexer.wk.weight", kOpt, l.idx_wk...);
  f("attn.indexer.k_norm.weight", kOpt, l.idx_k_norm...);
  f("attn.indexer.wq_b", kOpt, l.idx_wq_b...);
  f("attn.indexer.weights_proj.weight", kOpt, l.idx_weights_proj...);
  f("ffn.gate.weight", kReq, l.gate_w...);
  f("ffn.gate.bias", kReq, l.gate_bias...);
  f("ffn.gate.bias_vl", kOpt, l.gate_bias_vl...);
  f("ffn.shared_experts.w1", kReq, l.sh_w1...);
  f("ffn.shared_experts.w2", kReq, l.sh_w2...);
  f("ffn.shared_experts.w3", kReq, l.sh_w3...);
  f("engram.embed.weight", kOpt, l.engram_table...);
  f("engram.embed.scale", kOpt, l.engram_table_scale...);
  f("engram.wkv", kOpt, l.engram_wkv...);
  f("engram.q_weight", kOpt, l.engram_q...);
  f("engram.k_weight", kOpt, l.engram_k...);
}

struct DraftWeights {
  Fp8Linear main_proj;
  TensorView main_norm, norm, markov_embed, markov_head, confidence;  // bf16
};

struct VisionWeights {
  TensorView patch_w, patch_b;
  struct Block {
    TensorView norm1, wqkv_w, wqkv_b, wo_w, wo_b, norm2, w1, w2;
  };
  std::vector<Block> blocks;
  TensorView norm, aligner_w1, aligner_b1, aligner_w2, aligner_b2, image_start, image_end, image_newline;
};

struct ModelWeights {
  TensorView embed, norm, head;  // bf16
  std::vector<LayerWeights> layers;  // n_layers + n_mtp_layers
  DraftWeights draft;
  VisionWeights vision;
};

// Where routed experts come from (DESIGN-AHEAD item 3). The CPU reference reads the mapped
// snapshot; tiered stores (HBM slots, pinned RAM, drives) implement the same interface.
class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  virtual ExpertWeights expert(int layer, int e) const = 0;
  // A hint, given the moment the router has chosen a layer's experts and before their expert()
  // calls: a source whose bytes come from slow storage starts reading them now (issue 22).
  // `experts`: the distinct experts the caller will ask for (its own resident ones left out).
  virtual void prefetch(int layer, const std::vector<int>& experts) const {
    (void)layer;
    (void)experts;
  }
  // How long a view expert() returns stays valid: 0, for good (the snapshot's mapped tensors, the
  // bench's pool); N, through N layer epochs (a tiered source pins a layer's records until calls
  // for N other layers began; storage::TieredOptions::epochs_kept).
  virtual int view_layers() const { return 0; }
  // Whether expert(layer, e) would return without waiting for a drive read.
  virtual bool ready(int layer, int e) const {
    (void)layer;
    (void)e;
    return true;
  }
  // Lookups by the tier that supplied them (issue 24), for a source that has tiers; false: it
  // does not count (the snapshot's mapped tensors, the bench's pinned pool).
  virtual bool traffic(ExpertTraffic* out) const {
    (void)out;
    return false;
  }
  // Host memory the source holds of its own for expert bytes (tier buffers, host cache records);
  // 0 for one that reads them in place (the snapshot's mapped tensors).
  virtual uint64_t host_bytes() const { return 0; }
};

// Routed experts computed on the host CPU where their bytes are (issue 22): a tiered layer's
// chosen misses, each one (row, expert) pair. The CUDA executor hands them to this interface;
// cpu::host_expert_compute() implements it (cuda and cpu never link each other: the engine, the
// bench and the parity tests wire the two).
struct HostExpertJob {
  const uint16_t* u = nullptr;  // [D] the row's expert input (bf16)
  ExpertWeights ex;
  float weight = 1.0f;          // the routing weight (applied before w2, as the executors do)
  uint16_t* ye = nullptr;       // [D] the output (bf16)
};
class HostExpertCompute {
 public:
  virtual ~HostExpertCompute() = default;
  // The CPU reference's bits for every job (jobs of one call share D and I).
  virtual void run(const std::vector<HostExpertJob>& jobs, float swiglu_limit) const = 0;
  // One token through one expert of these dimensions on this host, ms (measured once, kept).
  virtual double ms_per_expert(int64_t D, int64_t I) const = 0;
};

}  // namespace fb::model
