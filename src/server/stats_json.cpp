#include "server/stats_json.h"

#include "memory/ledger.h"

namespace fb::server {

namespace {

using json = nlohmann::json;

// num / den, or null when there is nothing to divide (no steps yet, no such tier).
json ratio(double num, double den, double scale = 1.0) { return den > 0 ? json(num / den * scale) : json(nullptr); }

}  // namespace

json stats_json(const engine::EngineStats& s, const StatsSource& src) {
  json j;
  j["uptime_s"] = src.uptime_s;
  j["backend"] = src.backend;
  j["model"] = src.model;
  j["requests"] = {{"total", s.requests_total},       {"failed", s.requests_failed},   {"cancelled", s.requests_cancelled},
                   {"rejected", s.queue_rejected},    {"queued", s.queue_depth},       {"active", s.active},
                   {"max_sessions", s.max_sessions},  {"sessions_cached", s.sessions_cached}};
  j["tokens"] = {{"prompt", s.prompt_tokens},   {"cached", s.cached_tokens},   {"prefill", s.prefill_tokens},
                 {"generated", s.generated_tokens}, {"emitted", s.emitted_tokens}, {"kv_restored", s.kv_restored_tokens}};
  j["steps"] = {{"count", s.steps},
                {"rows", s.step_rows},
                {"prefill_rows", s.step_prefill_rows},
                {"decode_rows", s.step_decode_rows},
                {"sessions", s.step_sessions},
                {"seconds", s.step_s},
                {"prefill_round_seconds", s.prefill_s},
                {"decode_round_seconds", s.decode_s},
                // issue 20: the sessions' draft blocks, run in shared executor calls
                {"draft_calls", s.draft_calls},
                {"draft_blocks", s.draft_blocks},
                {"packed_prompt_steps", s.packed_prompt_steps},
                // the prefill policy (engine::PrefillPolicy): its last chunk beside decode rows,
                // its decode-only step time (null until measured), the decode-only steps it asked for
                {"mixed_prefill_rows", s.mixed_prefill_rows},
                {"policy_decode_step_s", s.policy_decode_step_s > 0 ? json(s.policy_decode_step_s) : json(nullptr)},
                {"reference_steps", s.reference_steps}};
  j["latency"] = {{"ttft_s_sum", s.ttft_s},           {"ttft_count", s.ttfts},
                  {"queue_wait_s_sum", s.queue_wait_s}, {"queue_wait_count", s.queue_waits},
                  {"finished_tok_s_sum", s.session_tok_s}, {"finished_count", s.session_rates}};
  // Inter-token gaps (between two deliveries of tokens to one request): buckets as Prometheus
  // writes them, cumulative, each with its upper bound ("+Inf" last).
  {
    json buckets = json::array();
    int64_t cum = 0;
    for (size_t i = 0; i < s.gap_hist.size(); ++i) {
      cum += s.gap_hist[i];
      buckets.push_back({{"le", i < engine::EngineStats::kGapBuckets.size() ? json(engine::EngineStats::kGapBuckets[i]) : json("+Inf")},
                         {"count", cum}});
    }
    j["latency"]["gap_s_sum"] = s.gap_s;
    j["latency"]["gap_count"] = s.gaps;
    j["latency"]["gap_max_s"] = s.gap_max_s;
    j["latency"]["gap_buckets"] = buckets;
  }
  json sessions = json::array();
  for (const auto& r : s.active_rates)
    sessions.push_back({{"id", r.id},
                        {"tokens", r.tokens},
                        {"tok_s", r.decoding() ? json(r.tok_s) : json(nullptr)},
                        {"prefill_done", r.prefill_done},
                        {"prefill_total", r.prefill_total},
                        {"prefill_tok_s", r.prefill_done > 0 ? json(r.prefill_tok_s) : json(nullptr)}});
  j["sessions"] = sessions;
  const engine::DsparkCounters& d = s.dspark;
  j["dspark"] = src.has_dspark ? json{{"rounds", d.steps},           {"proposals", d.proposals},     {"accepted", d.accepted},
                                      {"verify_rows", d.verify_rows}, {"backoff_steps", d.backoff_steps}, {"draft_s", d.draft_s},
                                      {"verify_s", d.verify_s},       {"accepted_hist", d.accepted_hist}}
                               : json(nullptr);
  j["kv_cache"] = s.has_kv_cache ? json{{"hits", s.kv.hits},       {"misses", s.kv.misses},   {"rejected", s.kv.rejected},
                                        {"evicted", s.kv.evicted}, {"entries", s.kv.entries}, {"bytes", s.kv.bytes}}
                                 : json(nullptr);
  j["kv_budget"] = s.kv_budget_bytes > 0 ? json{{"budget_bytes", s.kv_budget_bytes}, {"admitted_bytes", s.kv_admitted_bytes}} : json(nullptr);
  // The admission ledgers by tier (HBM, host): the engine's KV admission ledger
  // (--kv-budget-bytes); null for a tier without one. The executor's own bytes are "memory" below.
  json ledger = json::object();
  for (int t = 0; t < memory::kTierCount; ++t) {
    const auto tier = memory::Tier(t);
    if (s.has_kv_ledger && s.kv_ledger_tier == tier)
      ledger[memory::tier_name(tier)] = {{"owner", "session KV"},
                                         {"target_bytes", s.kv_ledger.target_bytes},
                                         {"mandatory_bytes", s.kv_ledger.mandatory_bytes},
                                         {"elastic_bytes", s.kv_ledger.elastic_bytes}};
    else
      ledger[memory::tier_name(tier)] = nullptr;
  }
  j["ledger"] = ledger;
  // The executor's own memory by tier (model::MemoryByTier, as of the engine's last step): null
  // for a tier it does not use or does not report (HBM on the CPU; the drives without tiers).
  {
    const model::MemoryByTier& m = s.executor.memory;
    const auto tier_mem = [](const model::TierMemory& t) {
      return json{{"weights_bytes", t.weights},   {"weight_copies_bytes", t.weight_copies}, {"sessions_bytes", t.sessions},
                  {"sessions", t.n_sessions},     {"scratch_bytes", t.scratch},             {"experts_bytes", t.experts},
                  {"total_bytes", t.total()}};
    };
    j["memory"] = {{"hbm", m.has_hbm ? tier_mem(m.hbm) : json(nullptr)},
                   {"host", m.has_host ? tier_mem(m.host) : json(nullptr)},
                   {"drive", m.has_drive ? json{{"expert_bytes_read", m.drive.expert_bytes_read},
                                                {"engram_bytes_read", m.drive.has_engram ? json(m.drive.engram_bytes_read) : json(nullptr)}}
                                         : json(nullptr)}};
  }
  const storage::TierStats& x = s.expert_tiers;
  j["expert_tiers"] = s.has_expert_tiers ? json{{"slot_hits", x.slot_hits},     {"slot_misses", x.slot_misses}, {"host_hits", x.host_hits},
                                                {"host_misses", x.host_misses}, {"drive_reads", x.drive_reads}, {"drive_bytes", x.drive_bytes},
                                                {"overflow", x.overflow}}
                                         : json(nullptr);
  // The executor's counters (model/executor_stats.h): routed-expert traffic by the tier that
  // supplied it, and step time by op family.
  const model::ExecutorStats& ex = s.executor;
  const model::ExpertTraffic& et = ex.experts;
  const auto tier = [](const model::TierTraffic& t) { return json{{"lookups", t.lookups}, {"bytes", t.bytes}}; };
  j["expert_traffic"] = ex.has_expert_traffic ? json{{"hbm", tier(et.hbm)}, {"host", tier(et.host)}, {"drive", tier(et.drive)}} : json(nullptr);
  if (ex.has_op_times) {
    json sec = json::object(), calls = json::object();
    for (int f = 0; f < model::kOpFamilyCount; ++f) {
      sec[model::op_family_name(model::OpFamily(f))] = ex.ops.s[size_t(f)];
      calls[model::op_family_name(model::OpFamily(f))] = ex.ops.calls[size_t(f)];
    }
    j["op_time"] = {{"steps", ex.ops.steps}, {"seconds", sec}, {"calls", calls}};
  } else {
    j["op_time"] = nullptr;
  }
  // Engram table rows the steps read, by how their fetch met the step (model::EngramRows).
  const model::EngramRows& eg = ex.engram;
  j["engram"] = ex.has_engram ? json{{"rows", eg.rows},         {"bytes", eg.bytes},         {"hidden", eg.hidden},
                                     {"exposed", eg.exposed},   {"in_place", eg.in_place()}, {"exposed_s", eg.exposed_s}}
                              : json(nullptr);
  // Lifetime averages (the page takes "now" rates from the difference of two polls).
  json dv;
  // Tokens of decode rounds: everything emitted except each request's first token (sampled from
  // its prompt's last logits in a prefill round).
  dv["decode_tok_s"] = ratio(double(s.emitted_tokens - s.ttfts), s.decode_s);
  dv["prefill_tok_s"] = ratio(double(s.step_prefill_rows), s.prefill_s);
  dv["step_ms"] = ratio(s.step_s, double(s.steps), 1e3);
  dv["rows_per_step"] = ratio(double(s.step_rows), double(s.steps));
  dv["sessions_per_step"] = ratio(double(s.step_sessions), double(s.steps));
  dv["ttft_ms"] = ratio(s.ttft_s, double(s.ttfts), 1e3);
  dv["queue_wait_ms"] = ratio(s.queue_wait_s, double(s.queue_waits), 1e3);
  dv["finished_tok_s"] = ratio(s.session_tok_s, double(s.session_rates));
  // DSpark: tokens per draft+verify round (accepted drafts + the verified token), the share of
  // drafts accepted.
  dv["dspark_tokens_per_round"] = src.has_dspark ? ratio(double(d.accepted + d.steps), double(d.steps)) : json(nullptr);
  dv["dspark_accept_rate"] = src.has_dspark ? ratio(double(d.accepted), double(d.proposals)) : json(nullptr);
  dv["kv_cache_hit_rate"] = s.has_kv_cache ? ratio(double(s.kv.hits), double(s.kv.hits + s.kv.misses)) : json(nullptr);
  dv["expert_slot_hit_rate"] = s.has_expert_tiers ? ratio(double(x.slot_hits), double(x.slot_hits + x.slot_misses)) : json(nullptr);
  dv["expert_host_hit_rate"] = s.has_expert_tiers ? ratio(double(x.host_hits), double(x.host_hits + x.host_misses)) : json(nullptr);
  // Bytes per token by tier: routed-expert bytes each tier supplied over the rows the steps ran
  // (prefill, decode and verify rows alike). Hit rates per tier: of the lookups that reached it.
  const double rows = double(s.step_rows);
  dv["expert_bytes_per_token"] = ex.has_expert_traffic ? json{{"hbm", ratio(double(et.hbm.bytes), rows)},
                                                              {"host", ratio(double(et.host.bytes), rows)},
                                                              {"drive", ratio(double(et.drive.bytes), rows)}}
                                                       : json(nullptr);
  dv["expert_hbm_hit_rate"] = ex.has_expert_traffic ? ratio(double(et.hbm.lookups), double(et.lookups())) : json(nullptr);
  dv["expert_host_tier_hit_rate"] = ex.has_expert_traffic ? ratio(double(et.host.lookups), double(et.host.lookups + et.drive.lookups)) : json(nullptr);
  // Engram: rows per token (over the steps' rows), the shares hidden / exposed of the rows read,
  // and the time steps waited for exposed rows, per step.
  dv["engram_rows_per_token"] = ex.has_engram ? ratio(double(eg.rows), rows) : json(nullptr);
  dv["engram_hidden_share"] = ex.has_engram ? ratio(double(eg.hidden), double(eg.rows)) : json(nullptr);
  dv["engram_exposed_share"] = ex.has_engram ? ratio(double(eg.exposed), double(eg.rows)) : json(nullptr);
  dv["engram_exposed_ms_per_step"] = ex.has_engram ? ratio(eg.exposed_s, double(s.steps), 1e3) : json(nullptr);
  if (ex.has_op_times) {
    json ms = json::object();
    for (int f = 0; f < model::kOpFamilyCount; ++f)
      ms[model::op_family_name(model::OpFamily(f))] = ratio(ex.ops.s[size_t(f)], double(ex.ops.steps), 1e3);
    dv["op_ms_per_step"] = ms;
  } else {
    dv["op_ms_per_step"] = nullptr;
  }
  j["derived"] = dv;
  return j;
}

}  // namespace fb::server
