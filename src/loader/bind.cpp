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
  void bind(const std::string& n, Presence need, TensorView& out) const { out = need == Presence::kRequired ? t(n) : opt(n); }
  void bind(const std::string& n, Presence need, Fp8Linear& out) const { out = need == Presence::kRequired ? fp8(n) : opt_fp8(n); }
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
    for_each_layer_tensor([&](const char* name, Presence need, auto& field) { b.bind(p + name, need, field); }, w);
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
