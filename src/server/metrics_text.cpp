#include "server/metrics_text.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "memory/ledger.h"

namespace fb::server {

namespace {

using Labels = std::initializer_list<std::pair<const char*, std::string>>;

// A sample value: integers exactly (a uint64 counter past 2^53 keeps every digit), floating point
// as the shortest text that reads back to the same double, NaN / +Inf / -Inf as the format spells them.
template <class T>
std::string value_text(T v) {
  static_assert(std::is_arithmetic_v<T>);
  if constexpr (std::is_integral_v<T>) {
    return std::to_string(v);
  } else {
    const double d = double(v);
    if (std::isnan(d)) return "NaN";
    if (std::isinf(d)) return d > 0 ? "+Inf" : "-Inf";
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof(buf), d);
    return std::string(buf, r.ptr);
  }
}

// Label values: backslash, double quote and line feed escaped (the format's three escapes).
std::string escape_label(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    if (c == '\\') o += "\\\\";
    else if (c == '"') o += "\\\"";
    else if (c == '\n') o += "\\n";
    else o += c;
  }
  return o;
}

class Writer {
 public:
  // `# HELP` and `# TYPE` of a family; its samples follow.
  void family(const char* name, const char* type, const char* help) {
    o_ += "# HELP ";
    o_ += name;
    o_ += ' ';
    o_ += help;  // plain text of ours: no backslash or line feed to escape
    o_ += "\n# TYPE ";
    o_ += name;
    o_ += ' ';
    o_ += type;
    o_ += '\n';
  }
  template <class T>
  void sample(const std::string& name, Labels labels, T v) {
    o_ += name;
    if (labels.size() > 0) {
      o_ += '{';
      bool first = true;
      for (const auto& [k, val] : labels) {
        if (!first) o_ += ',';
        first = false;
        o_ += k;
        o_ += "=\"";
        o_ += escape_label(val);
        o_ += '"';
      }
      o_ += '}';
    }
    o_ += ' ';
    o_ += value_text(v);
    o_ += '\n';
  }
  // A family of one unlabelled sample.
  template <class T>
  void one(const char* name, const char* type, const char* help, T v) {
    family(name, type, help);
    sample(name, {}, v);
  }
  // A summary kept as a sum and a count (no quantiles).
  void summary(const char* name, const char* help, double sum, int64_t count) {
    family(name, "summary", help);
    sample(std::string(name) + "_sum", {}, sum);
    sample(std::string(name) + "_count", {}, count);
  }
  // A histogram from per-bucket counts (not cumulative): counts[i] for values <= bounds[i] above
  // the bound before, counts[n] above the last; written cumulative with `le`, then sum and count.
  void histogram(const char* name, const char* help, const double* bounds, const int64_t* counts, size_t n, double sum) {
    family(name, "histogram", help);
    const std::string b = std::string(name) + "_bucket";
    int64_t cum = 0;
    for (size_t i = 0; i <= n; ++i) {
      cum += counts[i];
      sample(b, {{"le", i < n ? value_text(bounds[i]) : std::string("+Inf")}}, cum);
    }
    sample(std::string(name) + "_sum", {}, sum);
    sample(std::string(name) + "_count", {}, cum);
  }
  std::string take() { return std::move(o_); }

 private:
  std::string o_;
};

}  // namespace

std::string metrics_text(const engine::EngineStats& s, const StatsSource& src) {
  Writer w;
  w.family("flashbox_info", "gauge", "the served model and the executor backend (value 1)");
  w.sample("flashbox_info", {{"backend", src.backend}, {"model", src.model}}, int64_t(1));
  w.one("flashbox_uptime_seconds", "gauge", "time since the server started", src.uptime_s);
  // Requests and the queue.
  w.one("flashbox_requests_total", "counter", "requests accepted by the engine", s.requests_total);
  w.one("flashbox_requests_failed_total", "counter", "requests that ended in an error", s.requests_failed);
  w.one("flashbox_requests_cancelled_total", "counter", "requests cancelled (client disconnect)", s.requests_cancelled);
  w.one("flashbox_queue_rejected_total", "counter", "requests refused with 429 because the queue was full", s.queue_rejected);
  w.one("flashbox_queue_depth", "gauge", "requests waiting for the engine", s.queue_depth);
  w.one("flashbox_requests_active", "gauge", "requests being generated", s.active);
  w.one("flashbox_max_sessions", "gauge", "requests generated at once (--max-sessions)", s.max_sessions);
  w.one("flashbox_sessions_cached", "gauge", "sessions holding a KV cache (active or kept for prefix reuse)", s.sessions_cached);
  // Tokens.
  w.one("flashbox_prompt_tokens_total", "counter", "prompt tokens", s.prompt_tokens);
  w.one("flashbox_prompt_cached_tokens_total", "counter", "prompt tokens reused from a cached session", s.cached_tokens);
  w.one("flashbox_prefill_tokens_total", "counter", "prompt rows run through prefill (prompt minus cached)", s.prefill_tokens);
  w.one("flashbox_generated_tokens_total", "counter", "generated tokens of finished requests", s.generated_tokens);
  w.one("flashbox_decode_tokens_total", "counter", "tokens emitted by decode steps (plain or DSpark) of finished requests", s.generated_tokens);
  w.one("flashbox_emitted_tokens_total", "counter", "tokens delivered so far, counted as they come (generated: finished requests)", s.emitted_tokens);
  // Images.
  w.one("flashbox_images_total", "counter", "images in accepted requests", s.images);
  w.one("flashbox_images_encoded_total", "counter", "vision tower runs (an image whose KV is reused is not encoded again)", s.images_encoded);
  w.one("flashbox_image_rows_total", "counter", "image-span rows in accepted requests", s.image_rows);
  w.one("flashbox_image_encode_seconds_total", "counter", "time in the vision tower (engine thread)", s.image_encode_s);
  // Steps and their time.
  w.one("flashbox_steps_total", "counter", "forward steps run by the engine", s.steps);
  w.one("flashbox_step_rows_total", "counter", "rows in those steps (rows per step = this / steps)", s.step_rows);
  w.one("flashbox_step_prefill_rows_total", "counter", "prompt rows in those steps", s.step_prefill_rows);
  w.one("flashbox_step_decode_rows_total", "counter", "decode and DSpark verify rows in those steps", s.step_decode_rows);
  w.one("flashbox_step_sessions_total", "counter", "sessions in those steps (sessions per step = this / steps)", s.step_sessions);
  w.one("flashbox_step_seconds_total", "counter", "time in forward steps", s.step_s);
  w.one("flashbox_prefill_seconds_total", "counter", "time in engine rounds whose step carried prompt rows", s.prefill_s);
  w.one("flashbox_decode_seconds_total", "counter", "time in engine rounds of decode rows only (drafting included)", s.decode_s);
  // Latency and speed.
  w.summary("flashbox_queue_wait_seconds", "time from submission to admission", s.queue_wait_s, s.queue_waits);
  w.summary("flashbox_time_to_first_token_seconds", "time from submission to the first generated token", s.ttft_s, s.ttfts);
  w.summary("flashbox_request_tokens_per_second", "decode rate of finished requests (tokens after the first over the time since it)",
            s.session_tok_s, s.session_rates);
  w.family("flashbox_session_tokens_per_second", "gauge", "decode rate of each active request so far");
  for (const auto& r : s.active_rates)
    if (r.decoding()) w.sample("flashbox_session_tokens_per_second", {{"request", std::to_string(r.id)}}, r.tok_s);
  // Several sessions (issue 20): the sessions' drafts in shared calls, the prefill policy, the
  // inter-token gaps.
  w.one("flashbox_draft_calls_total", "counter", "executor draft calls (one per round that drafts)", s.draft_calls);
  w.one("flashbox_draft_blocks_total", "counter", "the sessions' draft blocks in those calls (blocks per call = this / calls)", s.draft_blocks);
  w.one("flashbox_packed_prompt_steps_total", "counter", "steps carrying rows of two or more prompts", s.packed_prompt_steps);
  w.one("flashbox_mixed_prefill_rows", "gauge", "the prefill policy's last prompt chunk beside decode rows", s.mixed_prefill_rows);
  w.one("flashbox_prefill_policy_decode_step_seconds", "gauge", "the prefill policy's decode-only step time (0: not measured yet)",
        s.policy_decode_step_s);
  w.one("flashbox_prefill_policy_reference_steps_total", "counter", "decode-only steps the prefill policy ran while a prompt waited",
        s.reference_steps);
  w.histogram("flashbox_inter_token_seconds", "time between two deliveries of tokens to one request (a DSpark round delivers several)",
              engine::EngineStats::kGapBuckets.data(), s.gap_hist.data(), engine::EngineStats::kGapBuckets.size(), s.gap_s);
  w.one("flashbox_inter_token_max_seconds", "gauge", "the longest of those gaps", s.gap_max_s);
  // DSpark.
  const engine::DsparkCounters& d = s.dspark;
  w.one("flashbox_dspark_rounds_total", "counter", "DSpark draft+verify rounds", d.steps);
  w.one("flashbox_dspark_proposals_total", "counter", "drafted tokens verified", d.proposals);
  w.one("flashbox_dspark_accepted_total", "counter", "drafted tokens accepted", d.accepted);
  w.one("flashbox_dspark_verify_rows_total", "counter", "target rows run by verification", d.verify_rows);
  w.one("flashbox_dspark_backoff_steps_total", "counter", "plain decode steps taken because drafting did not pay", d.backoff_steps);
  w.one("flashbox_dspark_draft_seconds_total", "counter", "time drafting", d.draft_s);
  w.one("flashbox_dspark_verify_seconds_total", "counter", "time verifying", d.verify_s);
  if (!d.accepted_hist.empty()) {  // empty before the first DSpark round
    w.family("flashbox_dspark_accepted_rounds", "counter", "rounds by number of accepted drafts");
    for (size_t i = 0; i < d.accepted_hist.size(); ++i)
      w.sample("flashbox_dspark_accepted_rounds", {{"accepted", std::to_string(i)}}, d.accepted_hist[i]);
  }
  // The disk KV cache (--kv-cache; zeros without it, as before).
  w.one("flashbox_kv_cache_restored_tokens_total", "counter", "prompt positions restored from the disk KV cache", s.kv_restored_tokens);
  w.one("flashbox_kv_cache_hits_total", "counter", "disk KV cache lookups that restored a prefix", s.kv.hits);
  w.one("flashbox_kv_cache_misses_total", "counter", "disk KV cache lookups without a stored prefix", s.kv.misses);
  w.one("flashbox_kv_cache_rejected_total", "counter", "damaged or unreadable checkpoint files dropped", s.kv.rejected);
  w.one("flashbox_kv_cache_evicted_total", "counter", "checkpoints evicted to stay within --kv-cache-bytes", s.kv.evicted);
  w.one("flashbox_kv_cache_entries", "gauge", "checkpoints in the disk KV cache", s.kv.entries);
  w.one("flashbox_kv_cache_bytes", "gauge", "bytes of checkpoints on disk", s.kv.bytes);
  w.one("flashbox_kv_cache_delta_entries", "gauge", "checkpoints stored as deltas of a shorter one", s.kv.deltas);
  w.one("flashbox_kv_cache_written_bytes_total", "counter", "bytes of checkpoint files written", s.kv.written);
  // KV admission (--kv-budget-bytes) and its ledger by tier.
  w.one("flashbox_kv_budget_bytes", "gauge", "KV admission budget (--kv-budget-bytes; 0: none)", s.kv_budget_bytes);
  w.one("flashbox_kv_admitted_bytes", "gauge", "KV estimate granted to active requests", s.kv_admitted_bytes);
  if (s.has_kv_ledger) {
    const std::string tier = memory::tier_name(s.kv_ledger_tier);
    w.family("flashbox_ledger_bytes", "gauge", "the session KV ledger by tier: target, mandatory and elastic bytes");
    w.sample("flashbox_ledger_bytes", {{"tier", tier}, {"kind", "target"}}, s.kv_ledger.target_bytes);
    w.sample("flashbox_ledger_bytes", {{"tier", tier}, {"kind", "mandatory"}}, s.kv_ledger.mandatory_bytes);
    w.sample("flashbox_ledger_bytes", {{"tier", tier}, {"kind", "elastic"}}, s.kv_ledger.elastic_bytes);
  }
  // Routed experts: the host tiers' own counters (--expert-slots), then the executor's traffic by
  // the tier that supplied each lookup's bytes (model/executor_stats.h).
  if (s.has_expert_tiers) {
    const storage::TierStats& x = s.expert_tiers;
    w.one("flashbox_expert_slot_hits_total", "counter", "routed-expert lookups found in a first-tier slot (host tiers' count)", x.slot_hits);
    w.one("flashbox_expert_slot_misses_total", "counter", "routed-expert lookups that missed the first-tier slots", x.slot_misses);
    w.one("flashbox_expert_host_hits_total", "counter", "slot misses served from the host-RAM cache", x.host_hits);
    w.one("flashbox_expert_host_misses_total", "counter", "slot misses the host-RAM cache did not hold", x.host_misses);
    w.one("flashbox_expert_drive_reads_total", "counter", "expert records read from the drives", x.drive_reads);
    w.one("flashbox_expert_drive_read_bytes_total", "counter", "bytes read from the drives for experts", x.drive_bytes);
    w.one("flashbox_expert_slot_overflow_total", "counter", "misses served from a spare buffer (every slot of the layer pinned)", x.overflow);
    w.one("flashbox_expert_drive_wait_seconds_total", "counter",
          "exposed drive time: wall time expert lookups waited for drive reads (reads that landed before they were needed cost none)",
          double(x.drive_wait_ns) / 1e9);
    w.one("flashbox_expert_prefetch_reads_total", "counter", "expert reads started when the router had run", x.prefetch_reads);
    w.one("flashbox_expert_prefetch_unused_total", "counter", "prefetched expert reads nobody asked for (bytes read for nothing)",
          x.prefetch_unused);
    w.one("flashbox_expert_checksum_failovers_total", "counter", "expert records re-read from another replica after a bad checksum",
          x.checksum_failovers);
    if (!x.drives.empty()) {
      w.family("flashbox_expert_drive_errors_total", "counter", "read errors per replica drive (I/O errors, vanished or truncated files, bad checksums)");
      for (size_t i = 0; i < x.drives.size(); ++i) w.sample("flashbox_expert_drive_errors_total", {{"drive", std::to_string(i)}}, x.drives[i].n_errors);
      w.family("flashbox_expert_drive_hedges_total", "counter", "hedged reads issued to each replica drive (a chunk overdue on another drive)");
      for (size_t i = 0; i < x.drives.size(); ++i) w.sample("flashbox_expert_drive_hedges_total", {{"drive", std::to_string(i)}}, x.drives[i].n_hedges);
      w.family("flashbox_expert_drive_failed", "gauge", "1 when the replica drive failed and gets no further reads");
      for (size_t i = 0; i < x.drives.size(); ++i) w.sample("flashbox_expert_drive_failed", {{"drive", std::to_string(i)}}, uint64_t(x.drives[i].failed));
      w.family("flashbox_expert_drive_rate_bytes_per_second", "gauge", "the reader's estimate of each replica drive's rate (EWMA)");
      for (size_t i = 0; i < x.drives.size(); ++i)
        w.sample("flashbox_expert_drive_rate_bytes_per_second", {{"drive", std::to_string(i)}}, x.drives[i].bytes_per_s);
    }
  }
  const model::ExecutorStats& ex = s.executor;
  if (ex.has_expert_traffic) {
    const std::pair<const char*, const model::TierTraffic*> tiers[] = {
        {"hbm", &ex.experts.hbm}, {"host", &ex.experts.host}, {"drive", &ex.experts.drive}};
    w.family("flashbox_expert_lookups_total", "counter", "routed-expert lookups by the tier that supplied their bytes (hbm, host, drive)");
    for (const auto& [name, t] : tiers) w.sample("flashbox_expert_lookups_total", {{"tier", name}}, t->lookups);
    w.family("flashbox_expert_bytes_total", "counter", "routed-expert bytes by the tier that supplied them (hbm, host, drive)");
    for (const auto& [name, t] : tiers) w.sample("flashbox_expert_bytes_total", {{"tier", name}}, t->bytes);
  }
  if (ex.has_engram) {
    const model::EngramRows& eg = ex.engram;
    w.family("flashbox_engram_rows_total", "counter",
             "Engram table rows the steps read, by fetch: hidden (fetched before their layer), exposed (the layer waited), in_place (read where the op runs)");
    w.sample("flashbox_engram_rows_total", {{"fetch", "hidden"}}, eg.hidden);
    w.sample("flashbox_engram_rows_total", {{"fetch", "exposed"}}, eg.exposed);
    w.sample("flashbox_engram_rows_total", {{"fetch", "in_place"}}, eg.in_place());
    w.one("flashbox_engram_bytes_total", "counter", "bytes of the Engram rows read (codes and scales)", eg.bytes);
    w.one("flashbox_engram_exposed_seconds_total", "counter", "time steps waited for exposed Engram rows", eg.exposed_s);
    if (ex.memory.drive.has_engram)
      w.one("flashbox_engram_drive_read_bytes_total", "counter",
            "bytes of Engram rows read from the drives (the row cache's misses; --engram-cache-bytes)", ex.memory.drive.engram_bytes_read);
  }
  if (ex.has_op_times) {
    w.one("flashbox_op_steps_total", "counter", "forward steps whose ops were timed", ex.ops.steps);
    w.family("flashbox_op_seconds_total", "counter", "time in the forward pass's ops by family (host clock around each op)");
    for (int f = 0; f < model::kOpFamilyCount; ++f)
      w.sample("flashbox_op_seconds_total", {{"family", model::op_family_name(model::OpFamily(f))}}, ex.ops.s[size_t(f)]);
    w.family("flashbox_op_calls_total", "counter", "op calls timed, by family");
    for (int f = 0; f < model::kOpFamilyCount; ++f)
      w.sample("flashbox_op_calls_total", {{"family", model::op_family_name(model::OpFamily(f))}}, ex.ops.calls[size_t(f)]);
  }
  return w.take();
}

}  // namespace fb::server
