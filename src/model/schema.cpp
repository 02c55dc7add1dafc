#include "model/schema.h"

#include "base/check.h"

namespace fb::model {

const char* byte_class_name(ByteClass c) {
  switch (c) {
    case ByteClass::kRoutedExperts: return "routed experts";
    case ByteClass::kEngramTables: return "engram tables";
    case ByteClass::kEngramOther: return "engram projections";
    case ByteClass::kAttention: return "attention";
    case ByteClass::kSharedExperts: return "shared experts";
    case ByteClass::kRouter: return "routers";
    case ByteClass::kMhc: return "mHC";
    case ByteClass::kIndexer: return "indexers";
    case ByteClass::kCompressor: return "compressors";
    case ByteClass::kEmbed: return "embedding";
    case ByteClass::kHead: return "head + final norm";
    case ByteClass::kDraft: return "DSpark draft";
    case ByteClass::kVision: return "vision";
    case ByteClass::kCount: break;
  }
  return "?";
}

int64_t TensorSpec::nbytes() const {
  int64_t n = int64_t(dtype_size(dtype));
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t ByteInventory::total() const {
  int64_t t = 0;
  for (int64_t b : bytes) t += b;
  return t;
}

ByteInventory inventory(const std::vector<TensorSpec>& specs) {
  ByteInventory inv;
  for (const auto& s : specs) {
    inv.bytes[size_t(s.klass)] += s.nbytes();
    ++inv.n_tensors;
  }
  return inv;
}

std::string layer_prefix(const Config& c, int layer) {
  if (layer < c.n_layers) return "layers." + std::to_string(layer) + ".";
  return "mtp." + std::to_string(layer - c.n_layers) + ".";
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Builder {
  std::vector<TensorSpec>& out;
  int layer = -1;
  ByteClass override_class = ByteClass::kCount;  // kDraft for mtp.* tensors

  void add(std::string name, DType t, std::vector<int64_t> shape, ByteClass k, int expert = -1) {
    if (override_class != ByteClass::kCount) k = override_class;
    out.push_back(TensorSpec{std::move(name), t, std::move(shape), k, layer, expert});
  }
  // FP8 e4m3 linear [n, k] with UE8M0 32x32 block scales.
  void fp8(const std::string& name, int64_t n, int64_t k, ByteClass cls) {
    add(name + ".weight", DType::kF8E4M3, {n, k}, cls);
    add(name + ".scale", DType::kF8E8M0, {ceil_div(n, 32), ceil_div(k, 32)}, cls);
  }
  // MXFP4 expert linear: logical [n, k] as I8 [n, k/2] + e8m0 [n, k/32].
  void fp4(const std::string& name, int64_t n, int64_t k, int expert) {
    add(name + ".weight", DType::kI8, {n, k / 2}, ByteClass::kRoutedExperts, expert);
    add(name + ".scale", DType::kF8E8M0, {n, k / 32}, ByteClass::kRoutedExperts, expert);
  }
};

void add_block(const Config& c, int l, Builder& b) {
  const LayerRole& r = c.roles[size_t(l)];
  const std::string p = layer_prefix(c, l);
  const int64_t D = c.dim, hc = c.hc_mult, mix = (2 + hc) * hc;
  b.layer = l;
  for (const char* site : {"attn", "ffn"}) {
    b.add(p + "hc_" + site + "_fn", DType::kF32, {mix, hc * D}, ByteClass::kMhc);
    b.add(p + "hc_" + site + "_base", DType::kF32, {mix}, ByteClass::kMhc);
    b.add(p + "hc_" + site + "_scale", DType::kF32, {3}, ByteClass::kMhc);
  }
  b.add(p + "attn_norm.weight", DType::kBF16, {D}, ByteClass::kAttention);
  b.add(p + "ffn_norm.weight", DType::kBF16, {D}, ByteClass::kAttention);
  b.add(p + "attn.attn_sink", DType::kF32, {c.n_heads}, ByteClass::kAttention);
  b.fp8(p + "attn.wq_a", c.q_lora_rank, D, ByteClass::kAttention);
  b.add(p + "attn.q_norm.weight", DType::kBF16, {c.q_lora_rank}, ByteClass::kAttention);
  b.fp8(p + "attn.wq_b", int64_t(c.n_heads) * c.head_dim, c.q_lora_rank, ByteClass::kAttention);
  b.fp8(p + "attn.wkv", c.head_dim, D, ByteClass::kAttention);
  b.add(p + "attn.kv_norm.weight", DType::kBF16, {c.head_dim}, ByteClass::kAttention);
  b.fp8(p + "attn.wo_a", int64_t(c.o_groups) * c.o_lora_rank, c.o_group_in(), ByteClass::kAttention);
  b.fp8(p + "attn.wo_b", D, int64_t(c.o_groups) * c.o_lora_rank, ByteClass::kAttention);
  if (r.kv_source) {
    b.add(p + "attn.compressor.wkv.weight", DType::kBF16, {c.head_dim, D}, ByteClass::kCompressor);
    if (r.ratio == 2) b.add(p + "attn.compressor.wgate.weight", DType::kBF16, {c.head_dim, D}, ByteClass::kCompressor);
    b.add(p + "attn.compressor.norm.weight", DType::kBF16, {c.head_dim}, ByteClass::kCompressor);
    b.add(p + "attn.indexer.wk.weight", DType::kBF16, {c.index_head_dim, c.head_dim}, ByteClass::kIndexer);
    b.add(p + "attn.indexer.k_norm.weight", DType::kBF16, {c.index_head_dim}, ByteClass::kIndexer);
  }
  if (r.index_source) {
    b.fp8(p + "attn.indexer.wq_b", int64_t(c.index_n_heads) * c.index_head_dim, c.q_lora_rank, ByteClass::kIndexer);
    b.add(p + "attn.indexer.weights_proj.weight", DType::kBF16, {c.index_n_heads, D}, ByteClass::kIndexer);
  }
  b.add(p + "ffn.gate.weight", DType::kBF16, {r.n_experts, D}, ByteClass::kRouter);
  b.add(p + "ffn.gate.bias", DType::kF32, {r.n_experts}, ByteClass::kRouter);
  if (c.has_vision()) b.add(p + "ffn.gate.bias_vl", DType::kF32, {r.n_experts}, ByteClass::kRouter);
  for (int e = 0; e < r.n_experts; ++e) {
    const std::string ep = p + "ffn.experts." + std::to_string(e) + ".";
    b.fp4(ep + "w1", c.moe_inter_dim, D, e);
    b.fp4(ep + "w2", D, c.moe_inter_dim, e);
    b.fp4(ep + "w3", c.moe_inter_dim, D, e);
  }
  b.fp8(p + "ffn.shared_experts.w1", c.moe_inter_dim, D, ByteClass::kSharedExperts);
  b.fp8(p + "ffn.shared_experts.w2", D, c.moe_inter_dim, ByteClass::kSharedExperts);
  b.fp8(p + "ffn.shared_experts.w3", c.moe_inter_dim, D, ByteClass::kSharedExperts);
  if (r.engram_table >= 0) {
    const int64_t rows = c.engram_num_embeddings[size_t(r.engram_table)];
    b.add(p + "engram.embed.weight", DType::kF8E4M3, {rows, c.engram_head_dim}, ByteClass::kEngramTables);
    b.add(p + "engram.embed.scale", DType::kF8E8M0, {rows, c.engram_head_dim / 32}, ByteClass::kEngramTables);
    b.fp8(p + "engram.wkv", (1 + hc) * D, c.engram_cat_dim(), ByteClass::kEngramOther);
    b.add(p + "engram.q_weight", DType::kBF16, {hc, D}, ByteClass::kEngramOther);
    b.add(p + "engram.k_weight", DType::kBF16, {hc, D}, ByteClass::kEngramOther);
  }
}

}  // namespace

std::vector<TensorSpec> expected_tensors(const Config& c) {
  FB_CHECK_EQ(int(c.roles.size()), c.n_total_layers());
  std::vector<TensorSpec> out;
  Builder b{out};
  const int64_t D = c.dim;
  b.add("embed.weight", DType::kBF16, {c.vocab_size, D}, ByteClass::kEmbed);
  b.add("norm.weight", DType::kBF16, {D}, ByteClass::kHead);
  b.add("head.weight", DType::kBF16, {c.vocab_size, D}, ByteClass::kHead);
  for (int l = 0; l < c.n_layers; ++l) add_block(c, l, b);
  b.override_class = ByteClass::kDraft;
  for (int s = 0; s < c.n_mtp_layers; ++s) {
    const int l = c.n_layers + s;
    add_block(c, l, b);
    const std::string p = layer_prefix(c, l);
    if (s == 0) {
      b.fp8(p + "main_proj", D, int64_t(c.dspark_target_layer_ids.size()) * D, ByteClass::kDraft);
      b.add(p + "main_norm.weight", DType::kBF16, {D}, ByteClass::kDraft);
    }
    if (s == c.n_mtp_layers - 1) {
      b.add(p + "norm.weight", DType::kBF16, {D}, ByteClass::kDraft);
      b.add(p + "markov_head.embed.weight", DType::kBF16, {c.vocab_size, c.dspark_markov_rank}, ByteClass::kDraft);
      b.add(p + "markov_head.head.weight", DType::kBF16, {c.vocab_size, c.dspark_markov_rank}, ByteClass::kDraft);
      b.add(p + "confidence_head.proj.weight", DType::kBF16, {1, D + c.dspark_markov_rank}, ByteClass::kDraft);
    }
  }
  b.override_class = ByteClass::kCount;
  b.layer = -1;
  if (c.has_vision()) {
    const auto& v = c.vision;
    const int64_t vd = v.dim, patch_in = 3LL * v.patch_size * v.patch_size;
    const ByteClass k = ByteClass::kVision;
    b.add("vision.patch_embed.proj.weight", DType::kBF16, {vd, patch_in}, k);
    b.add("vision.patch_embed.proj.bias", DType::kBF16, {vd}, k);
    for (int i = 0; i < v.n_layers; ++i) {
      const std::string p = "vision.blocks." + std::to_string(i) + ".";
      b.add(p + "norm1.weight", DType::kBF16, {vd}, k);
      b.add(p + "attn.wqkv.weight", DType::kBF16, {3 * vd, vd}, k);
      b.add(p + "attn.wqkv.bias", DType::kBF16, {3 * vd}, k);
      b.add(p + "attn.wo.weight", DType::kBF16, {vd, vd}, k);
      b.add(p + "attn.wo.bias", DType::kBF16, {vd}, k);
      b.add(p + "norm2.weight", DType::kBF16, {vd}, k);
      b.add(p + "mlp.w1.weight", DType::kBF16, {2LL * v.inter_dim, vd}, k);
      b.add(p + "mlp.w2.weight", DType::kBF16, {vd, v.inter_dim}, k);
    }
    b.add("vision.norm.weight", DType::kBF16, {vd}, k);
    const int64_t fold = int64_t(v.downsample) * v.downsample * vd;
    b.add("aligner.w1.weight", DType::kBF16, {D, fold}, k);
    b.add("aligner.w1.bias", DType::kBF16, {D}, k);
    b.add("aligner.w2.weight", DType::kBF16, {D, D}, k);
    b.add("aligner.w2.bias", DType::kBF16, {D}, k);
    for (const char* n : {"image_start", "image_end", "image_newline"}) b.add(n, DType::kBF16, {D}, k);
  }
  return out;
}

}  // namespace fb::model
