// flashbox inspect DIR: config summary, layer roles, bytes per class, validation result.
#include <cstdio>
#include <memory>

#include "cmd/commands.h"
#include "loader/snapshot.h"
#include "model/engram_constants.h"
#include "model/schema.h"

namespace fb::cmd {

namespace {

std::string human(int64_t b) {
  char buf[64];
  if (b >= (1LL << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(1LL << 30));
  else if (b >= (1LL << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", double(b) / double(1LL << 20));
  else std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024.0);
  return buf;
}

int run_inspect(const std::string& dir) {
  auto snap_or = loader::Snapshot::open(dir);
  if (!snap_or.ok()) {
    std::fprintf(stderr, "inspect: %s\n", snap_or.status().to_string().c_str());
    return 1;
  }
  const auto& snap = *snap_or.value();
  const model::Config& c = snap.config();
  std::printf("snapshot %s\n", dir.c_str());
  std::printf("  vocab %lld, hidden %d, layers %d + %d draft, heads %d x %d (rope %d), q_lora %d, o %d x %d, window %d\n",
              (long long)c.vocab_size, c.dim, c.n_layers, c.n_mtp_layers, c.n_heads, c.head_dim, c.rope_head_dim, c.q_lora_rank, c.o_groups,
              c.o_lora_rank, c.window_size);
  std::printf("  MoE: %d routed (top-%d) + %d shared, inter %d; indexer %d x %d top-%d; candidate pool %d x %d from layer %d\n",
              c.n_routed_experts, c.n_activated_experts, c.n_shared_experts, c.moe_inter_dim, c.index_n_heads, c.index_head_dim, c.index_topk,
              c.candidate_topk_blocks, c.candidate_block_size, c.candidate_source_layer);
  std::printf("  Engram layers:");
  for (int l : c.engram_layer_ids) std::printf(" %d", l);
  std::printf(" (orders 2..%d, %d heads x %d, compressed vocab %lld); DSpark block %d, taps", c.engram_max_ngram, c.engram_n_heads,
              c.engram_head_dim, (long long)c.engram_compressed_vocab, c.dspark_block_size);
  for (int l : c.dspark_target_layer_ids) std::printf(" %d", l);
  std::printf("; vision %s\n", c.has_vision() ? "on" : "off");
  std::printf("\n  layer ratio role                          kv  idx engram tap experts\n");
  for (int l = 0; l < c.n_total_layers(); ++l) {
    const auto& r = c.roles[size_t(l)];
    std::string role = r.is_draft ? "draft" : r.ratio == 0 ? "window" : "";
    if (!r.is_draft && r.ratio > 0) {
      if (r.kv_source) role += "KV-source ";
      if (r.candidate_source) role += "candidate-source ";
      if (r.index_source && !r.kv_source) role += r.pool_restricted ? "reindex(pool) " : "reindex ";
      if (!r.index_source) role += "reuse";
    }
    std::printf("  %5d %5d %-29s %3d %4d %6s %3s %d/top-%d\n", l, r.ratio, role.c_str(), r.kv_layer, r.index_layer,
                r.engram_table >= 0 ? std::to_string(r.engram_table).c_str() : "-", r.dspark_tap >= 0 ? std::to_string(r.dspark_tap).c_str() : "-",
                r.n_experts, r.n_active);
  }
  const auto specs = model::expected_tensors(c);
  const auto inv = model::inventory(specs);
  std::printf("\n  bytes per class (%lld tensors expected):\n", (long long)inv.n_tensors);
  for (int k = 0; k < int(model::ByteClass::kCount); ++k)
    if (inv.bytes[k]) std::printf("    %-20s %16lld  %s\n", model::byte_class_name(model::ByteClass(k)), (long long)inv.bytes[k], human(inv.bytes[k]).c_str());
  std::printf("    %-20s %16lld  %s\n", "total", (long long)inv.total(), human(inv.total()).c_str());

  auto rep = snap.validate();
  // Engram row counts must be the sums of the prime walk (spec/10 §7.1 rule 8).
  if (!c.engram_layer_ids.empty()) {
    auto k = model::engram_constants(c.engram_layer_ids, c.engram_vocab_size, c.engram_max_ngram, c.engram_n_heads, c.engram_compressed_vocab);
    for (size_t i = 0; i < k.size(); ++i)
      if (k[i].rows != c.engram_num_embeddings[i])
        rep.other.push_back("engram_num_embeddings[" + std::to_string(i) + "] = " + std::to_string(c.engram_num_embeddings[i]) +
                            " but the prime walk gives " + std::to_string(k[i].rows));
    if (snap.engram_token_map().empty()) std::printf("\n  note: no engram_token_map.i32; the map comes from the tokenizer\n");
  }
  if (rep.ok()) {
    std::printf("\nvalid: %zu tensors match the schema\n", snap.tensor_names().size());
    return 0;
  }
  std::printf("\nINVALID:\n%s", rep.to_string().c_str());
  return 1;
}

}  // namespace

Runner add_inspect(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  app.add_option("dir", *dir, "snapshot directory (config.json, index, shards)")->required();
  return [dir] { return run_inspect(*dir); };
}

}  // namespace fb::cmd
