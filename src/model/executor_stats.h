// Counters an executor keeps for the dashboard (issue 24), in backend-free types: routed-expert
// traffic by the tier that supplied the bytes, and step time by op family. Plain values: the
// engine copies them on its own thread after each step; nothing here locks or allocates.
// Absent parts are flagged (has_*), never zero-filled, so the page can say "n/a".
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace fb::model {

struct TierTraffic {
  uint64_t lookups = 0;  // routed-expert lookups this tier supplied
  uint64_t bytes = 0;    // bytes it supplied for them
};

// Each routed-expert lookup counts once, at the tier its bytes came from: `hbm` is the first tier
// (HBM slots on CUDA; on the CPU executor the host buffers that stand in for them), `host` the
// host-RAM cache (or pinned/mapped host memory without one), `drive` the drives. A miss copied
// from the host into a slot counts at `host`, a record read from a drive at `drive`.
struct ExpertTraffic {
  TierTraffic hbm, host, drive;
  uint64_t lookups() const { return hbm.lookups + host.lookups + drive.lookups; }
  uint64_t bytes() const { return hbm.bytes + host.bytes + drive.bytes; }
};

// The forward pass's ops (model/forward.h) grouped as the dashboard shows them.
enum class OpFamily {
  kEmbed,      // embed
  kEngram,     // engram_hash, engram (gather, FP8 projection, gate)
  kMhc,        // hc_mixes, hc_collapse_norm, hc_expand, dspark_tap
  kAttnProj,   // attn_q, attn_kv, attn_output (projections, norms, RoPE, QDQ)
  kIndex,      // compress, index_select (compressor, index keys, indexer top-k)
  kAttention,  // attention (window + selected entries, sinks)
  kMoe,        // moe (router, shared and routed experts, expert fetch through the tiers)
  kHead,       // head (final collapse, norm, logits)
  kOther,      // end_layer (ring writes, taps), bounded replay bookkeeping
};
constexpr int kOpFamilyCount = 9;
// Stable short names ("embed", "engram", "mhc", "attn_proj", "index", "attention", "moe", "head",
// "other"): the /v1/stats keys.
inline const char* op_family_name(OpFamily f) {
  constexpr const char* kNames[kOpFamilyCount] = {"embed", "engram", "mhc", "attn_proj", "index", "attention", "moe", "head", "other"};
  return kNames[int(f)];
}

// The forward pass's op names (run_backbone's calls; the CUDA executor's profile names its ops
// the same) and their families: one table for the CPU's TimedOps and the CUDA device times.
struct OpName {
  std::string_view name;
  OpFamily family;
};
inline constexpr OpName kOpNames[] = {
    {"embed", OpFamily::kEmbed},        {"engram_hash", OpFamily::kEngram},      {"engram", OpFamily::kEngram},
    {"dspark_tap", OpFamily::kMhc},     {"hc_mixes", OpFamily::kMhc},            {"hc_collapse_norm", OpFamily::kMhc},
    {"hc_expand", OpFamily::kMhc},      {"attn_q", OpFamily::kAttnProj},         {"attn_kv", OpFamily::kAttnProj},
    {"attn_output", OpFamily::kAttnProj}, {"compress", OpFamily::kIndex},        {"index_select", OpFamily::kIndex},
    {"attention", OpFamily::kAttention}, {"moe", OpFamily::kMoe},                {"head", OpFamily::kHead},
    {"leave_begin", OpFamily::kOther},  {"leave_end", OpFamily::kOther},         {"end_layer", OpFamily::kOther},
};
// The family of a forward-pass op, -1 for any other name (draft-only ops, whole-step entries).
constexpr int op_family_index(std::string_view op) {
  for (const OpName& o : kOpNames)
    if (o.name == op) return int(o.family);
  return -1;
}
// At compile time: a name that is not in the table does not compile.
consteval OpFamily op_family(std::string_view op) {
  const int f = op_family_index(op);
  if (f < 0) throw "not a forward-pass op";
  return OpFamily(f);
}

// Wall time of forward() steps split by op family (host clock around each op; on the CPU the op's
// whole cost).
struct OpTimes {
  std::array<double, kOpFamilyCount> s{};        // seconds
  std::array<uint64_t, kOpFamilyCount> calls{};  // op calls timed
  uint64_t steps = 0;                            // forward() steps covered
  double total_s() const {
    double t = 0;
    for (double v : s) t += v;
    return t;
  }
  // One call of the op named `op` took `seconds` (device times by name, e.g. CUDA events);
  // false, nothing added, when the name is not a forward-pass op.
  bool add(std::string_view op, double seconds) {
    const int f = op_family_index(op);
    if (f < 0) return false;
    s[size_t(f)] += seconds;
    ++calls[size_t(f)];
    return true;
  }
};

// Engram table rows the steps read (spec/11 §6.4: per row and Engram layer, orders x heads rows of
// codes + scales), by how their fetch met the step (MISSION item 7: the rows are known from token
// ids alone, so they can be fetched before their layer runs). `hidden`: fetched from the tables
// (mapped host memory, or the drive behind it) before the layer needed them; `exposed`: fetched
// while the layer waited for them, `exposed_s` the wait; the rest (rows - hidden - exposed) were
// read in place by the op from the memory it runs on (tables resident in HBM on CUDA).
struct EngramRows {
  uint64_t rows = 0;
  uint64_t bytes = 0;  // codes + scales of those rows
  uint64_t hidden = 0;
  uint64_t exposed = 0;
  double exposed_s = 0;
  uint64_t in_place() const { return rows - hidden - exposed; }
};

// Bytes one memory tier holds for the executor, by use (issue 24's ledger by tier).
struct TierMemory {
  uint64_t weights = 0;        // weights the executor reads from this tier (on the host: the mapped
                               // snapshot's tensors, routed experts left out when tiers serve them;
                               // in HBM: the tensors uploaded in their stored formats)
  uint64_t weight_copies = 0;  // weights the executor copied into memory of its own (dequantised forms)
  uint64_t sessions = 0;       // the live sessions' caches (KV rings, compressed KV, index keys, tails,
                               // token history, draft rings), as allocated
  int64_t n_sessions = 0;      // live sessions
  uint64_t scratch = 0;        // tables and buffers kept between steps (a step's own buffers, freed
                               // when it returns, are not counted)
  uint64_t experts = 0;        // routed-expert buffers of the tiers (first-tier slots, host cache;
                               // in HBM: the expert slots and prefetch staging)
  uint64_t total() const { return weights + weight_copies + sessions + scratch + experts; }
};

// What the drives supplied (counters, like ExpertTraffic): routed-expert records read through the
// tiers, Engram table rows read from a drive tier.
struct DriveMemory {
  uint64_t expert_bytes_read = 0;
  bool has_engram = false;  // an Engram drive tier is configured
  uint64_t engram_bytes_read = 0;
};

// The executor's memory by tier, as of the stats() call (gauges; the drives' bytes are counters).
// A tier the executor does not use or does not report stays has_* = false ("n/a" on the page).
struct MemoryByTier {
  bool has_hbm = false;
  TierMemory hbm;
  bool has_host = false;
  TierMemory host;
  bool has_drive = false;  // the tiers read from drives (--expert-slots)
  DriveMemory drive;
};

struct ExecutorStats {
  bool has_expert_traffic = false;  // routed experts go through tiers (else every expert is resident)
  ExpertTraffic experts;
  bool has_op_times = false;        // the executor times its ops in production
  OpTimes ops;
  bool has_engram = false;          // the model has Engram layers and the executor counts their rows
  EngramRows engram;
  MemoryByTier memory;              // gauges: add_delta copies them from `after`
};

// acc += after - before, counter by counter, flags from `after`: what one span of work (the
// engine's own steps; executors also run steps for others, e.g. the DSpark verify-cost
// calibration) added to an executor's lifetime counters.
inline void add_delta(ExecutorStats& acc, const ExecutorStats& before, const ExecutorStats& after) {
  acc.has_expert_traffic = after.has_expert_traffic;
  acc.has_op_times = after.has_op_times;
  const auto tier = [](TierTraffic& a, const TierTraffic& t0, const TierTraffic& t1) {
    a.lookups += t1.lookups - t0.lookups;
    a.bytes += t1.bytes - t0.bytes;
  };
  tier(acc.experts.hbm, before.experts.hbm, after.experts.hbm);
  tier(acc.experts.host, before.experts.host, after.experts.host);
  tier(acc.experts.drive, before.experts.drive, after.experts.drive);
  for (size_t f = 0; f < size_t(kOpFamilyCount); ++f) {
    acc.ops.s[f] += after.ops.s[f] - before.ops.s[f];
    acc.ops.calls[f] += after.ops.calls[f] - before.ops.calls[f];
  }
  acc.ops.steps += after.ops.steps - before.ops.steps;
  acc.has_engram = after.has_engram;
  acc.engram.rows += after.engram.rows - before.engram.rows;
  acc.engram.bytes += after.engram.bytes - before.engram.bytes;
  acc.engram.hidden += after.engram.hidden - before.engram.hidden;
  acc.engram.exposed += after.engram.exposed - before.engram.exposed;
  acc.engram.exposed_s += after.engram.exposed_s - before.engram.exposed_s;
  // What is held now, not what the span added; the drives' bytes read are counters like the rest.
  const DriveMemory d = acc.memory.drive;
  acc.memory = after.memory;
  acc.memory.drive.expert_bytes_read = d.expert_bytes_read + after.memory.drive.expert_bytes_read - before.memory.drive.expert_bytes_read;
  acc.memory.drive.engram_bytes_read = d.engram_bytes_read + after.memory.drive.engram_bytes_read - before.memory.drive.engram_bytes_read;
}

}  // namespace fb::model
