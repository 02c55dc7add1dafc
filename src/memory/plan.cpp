#include "memory/plan.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "model/schema.h"

namespace fb::memory {

namespace {

uint64_t align4k(uint64_t n) { return (n + 4095) & ~uint64_t(4095); }

std::string gib(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(kGiB));
  return buf;
}

}  // namespace

uint64_t session_kv_bytes(const model::Config& c, int64_t context_tokens, bool dspark) {
  const uint64_t row = uint64_t(c.head_dim) + uint64_t(c.head_dim) / 32;                  // e4m3 + e8m0
  const uint64_t entry = uint64_t(c.head_dim) / 2 + uint64_t(c.head_dim) / 16;             // e2m1 + e4m3/16
  const uint64_t key = uint64_t(c.index_head_dim) / 2 + uint64_t(c.index_head_dim) / 32;   // e2m1 + e8m0
  uint64_t b = uint64_t(c.n_layers) * uint64_t(c.window_size) * row;
  for (int l : c.kv_source_layers) {
    const int r = std::max(1, c.roles[size_t(l)].ratio);
    b += (entry + key) * uint64_t(context_tokens) / uint64_t(r);
    if (r == 2) b += 2 * 4 * uint64_t(c.head_dim);  // pending f32 (k, g) tail
  }
  if (dspark) b += uint64_t(c.n_mtp_layers) * uint64_t(c.window_size) * row;
  return b + 64;  // position, Engram history
}

uint64_t MemoryPlan::mandatory_bytes(Tier t) const {
  uint64_t s = 0;
  for (const PlanItem& i : items)
    if (i.tier == t && i.kind == Kind::kMandatory) s += i.bytes;
  return s;
}

uint64_t MemoryPlan::elastic_bytes(Tier t) const {
  uint64_t s = 0;
  for (const PlanItem& i : items)
    if (i.tier == t && i.kind == Kind::kElastic) s += i.bytes;
  return s;
}

Result<MemoryPlan> plan_memory(const model::Config& c, const PlanInputs& in) {
  MemoryPlan p;
  p.hbm_target_bytes = in.hbm_target_bytes;
  p.host_target_bytes = in.host_target_bytes;
  uint64_t dense_hbm = 0, draft = 0, embed = 0, engram_tables = 0, vision = 0, wo_a_bf16 = 0;
  uint64_t stride = 0;
  for (const model::TensorSpec& s : model::expected_tensors(c)) {
    const uint64_t n = uint64_t(s.nbytes());
    if (s.expert >= 0) {
      if (s.layer == 0 && s.expert == 0) {
        p.expert_bytes += n;
        stride += align4k(n);
      }
      continue;
    }
    // The CUDA executor also holds wo_a dequantised to BF16 (the reference's weight; prefill and
    // the exact class read it, decode rows the checkpoint's FP8 copy): 2 bytes per element more.
    const bool is_wo_a = s.name.size() >= 16 && s.name.compare(s.name.size() - 16, 16, "attn.wo_a.weight") == 0;
    if (is_wo_a && (s.klass != model::ByteClass::kDraft || in.dspark)) wo_a_bf16 += uint64_t(s.shape[0]) * uint64_t(s.shape[1]) * 2;
    switch (s.klass) {
      case model::ByteClass::kEngramTables: engram_tables += n; break;
      case model::ByteClass::kEmbed: embed += n; break;  // one row per token: gathered on the host
      case model::ByteClass::kDraft: draft += n; break;
      case model::ByteClass::kVision: vision += n; break;
      default: dense_hbm += n;
    }
  }
  p.expert_stride_bytes = in.expert_stride_bytes ? in.expert_stride_bytes : stride;
  for (int l = 0; l < c.n_total_layers(); ++l) {
    if (c.roles[size_t(l)].n_experts == 0) continue;
    if (c.roles[size_t(l)].is_draft && !in.dspark) continue;
    ++p.n_expert_layers;
    p.n_experts_per_layer = std::max(p.n_experts_per_layer, c.roles[size_t(l)].n_experts);
    p.n_experts_total += c.roles[size_t(l)].n_experts;
  }

  // Mandatory state first (spec/12 for KV; DSpark dense weights are mandatory when it is on).
  const uint64_t kv = uint64_t(in.n_sessions) * session_kv_bytes(c, in.context_tokens, in.dspark);
  p.items.push_back({"dense weights (attention, shared experts, router, mHC, indexer, head)", Tier::kHbm, Kind::kMandatory, dense_hbm});
  if (wo_a_bf16) p.items.push_back({"wo_a BF16 copies (prefill, exact class)", Tier::kHbm, Kind::kMandatory, wo_a_bf16});
  if (vision) p.items.push_back({"vision tower", Tier::kHbm, Kind::kMandatory, vision});
  if (in.dspark && draft) p.items.push_back({"DSpark draft weights (dense)", Tier::kHbm, Kind::kMandatory, draft});
  p.items.push_back({"session KV (" + std::to_string(in.n_sessions) + " x " + std::to_string(in.context_tokens) + " tokens)",
                     Tier::kHbm, Kind::kMandatory, kv});
  p.items.push_back({"workspaces", Tier::kHbm, Kind::kMandatory, in.hbm_workspace_bytes});
  const int max_active = std::max(c.n_activated_experts, c.dspark_n_activated_experts);
  const uint64_t staging =
      in.host_staging_bytes ? in.host_staging_bytes : uint64_t(2 * 2 * std::max(1, max_active)) * p.expert_stride_bytes;
  p.items.push_back({"embedding table (row gather)", Tier::kHost, Kind::kMandatory, embed});
  p.items.push_back({"read staging (pinned, double-buffered)", Tier::kHost, Kind::kMandatory, staging});

  const uint64_t hbm_m = p.mandatory_bytes(Tier::kHbm), host_m = p.mandatory_bytes(Tier::kHost);
  if (hbm_m > in.hbm_target_bytes)
    return FB_ERROR(kResourceExhausted) << "mandatory HBM state " << gib(hbm_m) << " exceeds the HBM target " << gib(in.hbm_target_bytes)
                                        << " by " << gib(hbm_m - in.hbm_target_bytes) << " (fewer sessions or a shorter context)";
  if (host_m > in.host_target_bytes)
    return FB_ERROR(kResourceExhausted) << "mandatory host state " << gib(host_m) << " exceeds the pinned host target "
                                        << gib(in.host_target_bytes) << " by " << gib(host_m - in.host_target_bytes);

  // Elastic state from the remainder: HBM expert slots per layer (equal per layer), then the host
  // cache for the experts that are not in HBM, prefix KV from its share of the host remainder.
  const uint64_t per_slot_row = uint64_t(std::max(1, p.n_expert_layers)) * p.expert_stride_bytes;
  int slots = int(std::min<uint64_t>(uint64_t(p.n_experts_per_layer), (in.hbm_target_bytes - hbm_m) / per_slot_row));
  if (in.expert_slots >= 0) {
    if (uint64_t(in.expert_slots) * per_slot_row > in.hbm_target_bytes - hbm_m)
      return FB_ERROR(kResourceExhausted) << "--expert-slots " << in.expert_slots << " needs " << gib(uint64_t(in.expert_slots) * per_slot_row)
                                          << " of HBM; " << gib(in.hbm_target_bytes - hbm_m) << " remain after mandatory state";
    slots = std::min(in.expert_slots, p.n_experts_per_layer);
  }
  p.hbm_slots_per_layer = slots;
  const int64_t beyond_hbm = p.n_experts_total - int64_t(slots) * p.n_expert_layers;
  const uint64_t host_rest = in.host_target_bytes - host_m;
  const uint64_t prefix = uint64_t(double(host_rest) * std::clamp(in.host_prefix_kv_share, 0.0, 1.0));
  int64_t host_n = std::min<int64_t>(beyond_hbm, int64_t((host_rest - prefix) / p.expert_stride_bytes));
  if (in.host_experts >= 0) {
    if (uint64_t(in.host_experts) * p.expert_stride_bytes > host_rest - prefix)
      return FB_ERROR(kResourceExhausted) << "--host-experts " << in.host_experts << " needs "
                                          << gib(uint64_t(in.host_experts) * p.expert_stride_bytes) << "; " << gib(host_rest - prefix)
                                          << " remain in the pinned host target";
    host_n = std::min(in.host_experts, beyond_hbm);
  }
  p.host_cache_experts = host_n;
  p.drive_only_experts = beyond_hbm - host_n;
  p.items.push_back({"expert slots (" + std::to_string(slots) + " per layer x " + std::to_string(p.n_expert_layers) + " layers)",
                     Tier::kHbm, Kind::kElastic, uint64_t(slots) * per_slot_row});
  p.items.push_back({"host expert cache (" + std::to_string(host_n) + " experts)", Tier::kHost, Kind::kElastic,
                     uint64_t(host_n) * p.expert_stride_bytes});
  if (prefix) p.items.push_back({"prefix KV (host)", Tier::kHost, Kind::kElastic, prefix});
  if (engram_tables) p.off_tier.push_back("Engram tables " + gib(engram_tables) + ": drives (row reads), OS page cache");
  if (p.drive_only_experts > 0)
    p.off_tier.push_back(std::to_string(p.drive_only_experts) + " experts (" + gib(uint64_t(p.drive_only_experts) * p.expert_stride_bytes) +
                         "): drives only");
  return p;
}

Result<std::vector<Grant>> admit_plan(Ledger& ledger, const MemoryPlan& plan) {
  std::vector<Grant> grants;
  for (Kind k : {Kind::kMandatory, Kind::kElastic})
    for (const PlanItem& i : plan.items)
      if (i.kind == k) grants.push_back(FB_TRY(ledger.admit(i.tier, i.kind, i.bytes, i.name)));
  return grants;
}

std::string MemoryPlan::to_string() const {
  std::ostringstream os;
  for (Tier t : {Tier::kHbm, Tier::kHost}) {
    const uint64_t target = t == Tier::kHbm ? hbm_target_bytes : host_target_bytes;
    os << tier_name(t) << " target " << gib(target) << ": mandatory " << gib(mandatory_bytes(t)) << ", elastic " << gib(elastic_bytes(t))
       << ", unassigned " << gib(target - mandatory_bytes(t) - elastic_bytes(t)) << "\n";
    for (const PlanItem& i : items)
      if (i.tier == t) os << "  " << (i.kind == Kind::kMandatory ? "mandatory" : "elastic  ") << " " << gib(i.bytes) << "  " << i.name << "\n";
  }
  os << "experts: " << n_expert_layers << " layers x " << n_experts_per_layer << ", " << expert_bytes << " B each (" << expert_stride_bytes
     << " B per slot); HBM " << int64_t(hbm_slots_per_layer) * n_expert_layers << ", host " << host_cache_experts << ", drives only "
     << drive_only_experts << "\n";
  for (const std::string& s : off_tier) os << "off-tier: " << s << "\n";
  return os.str();
}

Result<ExpertPlacement> auto_expert_placement(const model::Config& c, uint64_t hbm_free, uint64_t host_budget, int64_t context_tokens,
                                              uint64_t reserve) {
  if (hbm_free <= reserve) return FB_ERROR(kResourceExhausted) << "only " << hbm_free / kGiB << " GiB of HBM free";
  PlanInputs in;
  in.hbm_target_bytes = hbm_free - reserve;
  in.host_target_bytes = host_budget;
  in.context_tokens = context_tokens;
  ExpertPlacement out;
  out.plan = FB_TRY(plan_memory(c, in));
  if (out.plan.hbm_slots_per_layer >= out.plan.n_experts_per_layer) return out;  // all resident
  out.expert_slots = out.plan.hbm_slots_per_layer;
  out.host_experts = out.plan.host_cache_experts;
  return out;
}

}  // namespace fb::memory
