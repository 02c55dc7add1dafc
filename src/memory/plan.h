// MemoryPlan: what one model needs per tier, derived from its Config (model/schema.h) and the
// two byte targets: mandatory state first, then elastic state (HBM expert slots per layer, the
// pinned host expert cache, prefix KV) from the remainder. Pure arithmetic: probe prints it, the
// engine admits it into a Ledger. Never allocates.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "memory/ledger.h"
#include "model/config.h"

namespace fb::memory {

constexpr uint64_t kGiB = 1ull << 30;

struct PlanInputs {
  uint64_t hbm_target_bytes = 0;
  uint64_t host_target_bytes = 0;   // pinned host RAM
  int n_sessions = 1;
  int64_t context_tokens = 131072;  // per session
  bool dspark = true;
  // activations, GEMM scratch, one prefill step: a 2,048-row tensor-core prefill step at the
  // released dimensions needs about 3.3 GiB by count (step buffers ~0.6, the largest op's
  // temporaries ~0.6, tc_gemm scratch <= 2 x 1 GiB + expanded weights; not yet measured)
  uint64_t hbm_workspace_bytes = 4 * kGiB;
  uint64_t host_staging_bytes = 0;          // 0: double-buffered reads of two layers' picks
  double host_prefix_kv_share = 0.0;        // share of the host remainder kept for prefix KV
  int expert_slots = -1;                    // per layer in HBM; -1: from the remainder
  int64_t host_experts = -1;                // host cache size in experts; -1: from the remainder
  uint64_t expert_stride_bytes = 0;         // bytes of one expert in a slot; 0: schema, 4 KiB aligned per tensor
};

struct PlanItem {
  std::string name;
  Tier tier;
  Kind kind;
  uint64_t bytes = 0;
};

struct MemoryPlan {
  std::vector<PlanItem> items;       // mandatory first, then elastic
  std::vector<std::string> off_tier; // state that stays on drives, in words
  int n_expert_layers = 0;
  int n_experts_per_layer = 0;
  int64_t n_experts_total = 0;
  uint64_t expert_bytes = 0;         // raw payload + scales of one expert
  uint64_t expert_stride_bytes = 0;  // what one slot takes
  int hbm_slots_per_layer = 0;
  int64_t host_cache_experts = 0;
  int64_t drive_only_experts = 0;
  uint64_t hbm_target_bytes = 0, host_target_bytes = 0;
  uint64_t mandatory_bytes(Tier t) const;
  uint64_t elastic_bytes(Tier t) const;
  std::string to_string() const;
};

// kResourceExhausted when mandatory state alone exceeds a target (the message says by how much).
Result<MemoryPlan> plan_memory(const model::Config& c, const PlanInputs& in);

// The executor's default expert placement on a GPU with `hbm_free` bytes free and a host budget:
// every expert resident when the plan fits them all (slots 0), else the plan's HBM slots per layer
// and host cache records. `reserve` stays unplanned (allocator slack, embedding and head copies
// the plan counts elsewhere). kResourceExhausted when the mandatory state alone does not fit.
struct ExpertPlacement {
  int expert_slots = 0;     // 0: every expert resident
  int64_t host_experts = 0;
  MemoryPlan plan;
};
Result<ExpertPlacement> auto_expert_placement(const model::Config& c, uint64_t hbm_free, uint64_t host_budget, int64_t context_tokens,
                                              uint64_t reserve = 3 * kGiB);

// Admits the plan into `ledger`, mandatory items first; the grants hold the bytes.
Result<std::vector<Grant>> admit_plan(Ledger& ledger, const MemoryPlan& plan);

// Bytes of KV state one session holds at `context_tokens` (spec/12 §1): 890 B per token for the
// released shape (derived from the config here), window rings, tails, draft rings.
uint64_t session_kv_bytes(const model::Config& c, int64_t context_tokens, bool dspark);

}  // namespace fb::memory
