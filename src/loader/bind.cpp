#include "loader/bind.h"

#include "loader/snapshot.h"
#include "model/schema.h"

namespace fb::loader {

using namespace fb::model;

namespace {

struct Binder {
  const Snapshot& s;
  TensorView t(const std::string& n) const { return s.get(n); }
  TensorView opt(const std::string& n) const { return s.has(n) ? s.get(n) : TensorView{}; }
  Fp8Linear fp8(const std::string& n) const { return {s.get(n + ".weight"), s.get(n + ".scale")}; }
  Fp8Linear opt_fp8(const std::string& n) const { return s.has(n + ".weight") ? fp8(n) : Fp8Linear{}; }
  Fp4Linear fp4(const std::string& n) const { return {s.get(n + ".weight"), s.get(n + ".scale")}; }
};

}  // namespace

ModelWeights bind_weights(const Snapshot& snap) {
  const Config& c = snap.config();
  Binder b{snap};
  ModelWeights m;
  m.embed = b.t("embed.weight");
  m.norm = b.t("norm.weight");
  m.head = b.t("head.weight");
  m.layers.resize(size_t(c.n_total_layers()));
  for (int l = 0; l < c.n_total_layers(); ++l) {
    const std::string p = layer_prefix(c, l);
    LayerWeights& w = m.layers[size_t(l)];
    w.hc_attn_fn = b.t(p + "hc_attn_fn");
    w.hc_attn_base = b.t(p + "hc_attn_base");
    w.hc_attn_scale = b.t(p + "hc_attn_scale");
    w.hc_ffn_fn = b.t(p + "hc_ffn_fn");
    w.hc_ffn_base = b.t(p + "hc_ffn_base");
    w.hc_ffn_scale = b.t(p + "hc_ffn_scale");
    w.attn_norm = b.t(p + "attn_norm.weight");
    w.ffn_norm = b.t(p + "ffn_norm.weight");
    w.attn_sink = b.t(p + "attn.attn_sink");
    w.wq_a = b.fp8(p + "attn.wq_a");
    w.wq_b = b.fp8(p + "attn.wq_b");
    w.wkv = b.fp8(p + "attn.wkv");
    w.wo_a = b.fp8(p + "attn.wo_a");
    w.wo_b = b.fp8(p + "attn.wo_b");
    w.q_norm = b.t(p + "attn.q_norm.weight");
    w.kv_norm = b.t(p + "attn.kv_norm.weight");
    w.comp_wkv = b.opt(p + "attn.compressor.wkv.weight");
    w.comp_wgate = b.opt(p + "attn.compressor.wgate.weight");
    w.comp_norm = b.opt(p + "attn.compressor.norm.weight");
    w.idx_wk = b.opt(p + "attn.indexer.wk.weight");
    w.idx_k_norm = b.opt(p + "attn.indexer.k_norm.weight");
    w.idx_wq_b = b.opt_fp8(p + "attn.indexer.wq_b");
    w.idx_weights_proj = b.opt(p + "attn.indexer.weights_proj.weight");
    w.gate_w = b.t(p + "ffn.gate.weight");
    w.gate_bias = b.t(p + "ffn.gate.bias");
    w.gate_bias_vl = b.opt(p + "ffn.gate.bias_vl");
    w.sh_w1 = b.fp8(p + "ffn.shared_experts.w1");
    w.sh_w2 = b.fp8(p + "ffn.shared_experts.w2");
    w.sh_w3 = b.fp8(p + "ffn.shared_experts.w3");
    w.engram_table = b.opt(p + "engram.embed.weight");
    w.engram_table_scale = b.opt(p + "engram.embed.scale");
    w.engram_wkv = b.opt_fp8(p + "engram.wkv");
    w.engram_q = b.opt(p + "engram.q_weight");
    w.engram_k = b.opt(p + "engram.k_weight");
  }
  if (c.n_mtp_layers > 0) {
    const std::string p0 = layer_prefix(c, c.n_layers);
    const std::string pl = layer_prefix(c, c.n_total_layers() - 1);
    m.draft.main_proj = b.fp8(p0 + "main_proj");
    m.draft.main_norm = b.t(p0 + "main_norm.weight");
    m.draft.norm = b.t(pl + "norm.weight");
    m.draft.markov_embed = b.t(pl + "markov_head.embed.weight");
    m.draft.markov_head = b.t(pl + "markov_head.head.weight");
    m.draft.confidence = b.t(pl + "confidence_head.proj.weight");
  }
  if (c.has_vision()) {
    auto& v = m.vision;
    v.patch_w = b.t("vision.patch_embed.proj.weight");
    v.patch_b = b.t("vision.patch_embed.proj.bias");
    for (int i = 0; i < c.vision.n_layers; ++i) {
      const std::string p = "vision.blocks." + std::to_string(i) + ".";
      v.blocks.push_back({b.t(p + "norm1.weight"), b.t(p + "attn.wqkv.weight"), b.t(p + "attn.wqkv.bias"), b.t(p + "attn.wo.weight"),
                          b.t(p + "attn.wo.bias"), b.t(p + "norm2.weight"), b.t(p + "mlp.w1.weight"), b.t(p + "mlp.w2.weight")});
    }
    v.norm = b.t("vision.norm.weight");
    v.aligner_w1 = b.t("aligner.w1.weight");
    v.aligner_b1 = b.t("aligner.w1.bias");
    v.aligner_w2 = b.t("aligner.w2.weight");
    v.aligner_b2 = b.t("aligner.w2.bias");
    v.image_start = b.t("image_start");
    v.image_end = b.t("image_end");
    v.image_newline = b.t("image_newline");
  }
  return m;
}

SnapshotExperts::SnapshotExperts(const Snapshot& snap) {
  const Config& c = snap.config();
  Binder b{snap};
  experts_.resize(size_t(c.n_total_layers()));
  for (int l = 0; l < c.n_total_layers(); ++l) {
    const std::string p = layer_prefix(c, l) + "ffn.experts.";
    for (int e = 0; e < c.roles[size_t(l)].n_experts; ++e) {
      const std::string ep = p + std::to_string(e) + ".";
      experts_[size_t(l)].push_back({b.fp4(ep + "w1"), b.fp4(ep + "w2"), b.fp4(ep + "w3")});
    }
  }
}

ExpertWeights SnapshotExperts::expert(int layer, int e) const { return experts_.at(size_t(layer)).at(size_t(e)); }

}  // namespace fb::loader
