// /metrics without a server: the Prometheus text (exposition format 0.0.4) built from engine
// counters. A small reader of the format checks every line (HELP and TYPE once per family and
// before its samples, sample names of the family, label syntax, values that parse), then the values
// themselves: exact integers past 2^53, expert traffic by tier, op times by family, the ledger,
// and the families left out when a backend or configuration lacks them.
// Against a running server: tests/server/test_metrics.py.
#include <gtest/gtest.h>

#include <charconv>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "server/metrics_text.h"
#include "server/test_engine_stats.h"

namespace fb::server {
namespace {

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  std::string value;  // as written
};

struct Exposition {
  std::map<std::string, std::string> type;  // family -> type
  std::vector<Sample> samples;
  std::vector<std::string> errors;  // format violations, one line each

  // The one sample named `name` with these labels ("" when absent; an error when repeated).
  std::string value(const std::string& name, const std::map<std::string, std::string>& labels = {}) const {
    std::string v;
    int n = 0;
    for (const auto& s : samples)
      if (s.name == name && s.labels == labels) v = s.value, ++n;
    return n == 1 ? v : "";
  }
  bool has_family(const std::string& f) const { return type.count(f) > 0; }
};

bool metric_name(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != ':') return false;
  return true;
}

bool value_ok(const std::string& v) {
  if (v == "NaN" || v == "+Inf" || v == "-Inf") return true;
  double d = 0;
  const auto r = std::from_chars(v.data(), v.data() + v.size(), d);
  return r.ec == std::errc() && r.ptr == v.data() + v.size();
}

// Reads the text format; violations go to errors.
Exposition read_exposition(const std::string& text) {
  Exposition e;
  std::set<std::string> helped;
  std::set<std::string> sampled;  // families whose samples have started
  std::string current;            // the family of the last TYPE line
  std::istringstream in(text);
  std::string line;
  int no = 0;
  auto err = [&](const std::string& m) { e.errors.push_back("line " + std::to_string(no) + ": " + m + ": " + line); };
  while (std::getline(in, line)) {
    ++no;
    if (line.empty()) {
      err("empty line");
      continue;
    }
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
      const bool help = line[2] == 'H';
      const size_t sp = line.find(' ', 7);
      const std::string fam = line.substr(7, sp == std::string::npos ? std::string::npos : sp - 7);
      if (!metric_name(fam)) err("bad family name");
      if (sampled.count(fam)) err("HELP/TYPE after the family's samples");
      if (help) {
        if (!helped.insert(fam).second) err("second HELP");
        if (sp == std::string::npos || sp + 1 >= line.size()) err("empty HELP");
      } else {
        const std::string t = sp == std::string::npos ? "" : line.substr(sp + 1);
        if (t != "counter" && t != "gauge" && t != "summary" && t != "histogram" && t != "untyped") err("bad type");
        if (e.type.count(fam)) err("second TYPE");
        if (!helped.count(fam)) err("TYPE before HELP");
        e.type[fam] = t;
        current = fam;
      }
      continue;
    }
    if (line[0] == '#') {
      err("unexpected comment");
      continue;
    }
    Sample s;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    s.name = line.substr(0, i);
    if (!metric_name(s.name)) err("bad sample name");
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        const size_t eq = line.find('=', i);
        if (eq == std::string::npos || eq + 1 >= line.size() || line[eq + 1] != '"') {
          err("bad label");
          break;
        }
        const std::string key = line.substr(i, eq - i);
        if (!metric_name(key) || key.find(':') != std::string::npos) err("bad label name");
        std::string val;
        size_t j = eq + 2;
        for (; j < line.size() && line[j] != '"'; ++j) {
          if (line[j] == '\\' && j + 1 < line.size()) {
            const char c = line[++j];
            if (c == 'n') val += '\n';
            else if (c == '\\' || c == '"') val += c;
            else err("bad escape");
          } else {
            val += line[j];
          }
        }
        if (j >= line.size()) {
          err("unterminated label value");
          break;
        }
        if (s.labels.count(key)) err("repeated label");
        s.labels[key] = val;
        i = j + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
      if (i >= line.size()) {
        err("unterminated labels");
        continue;
      }
      ++i;  // '}'
    }
    if (i >= line.size() || line[i] != ' ') {
      err("no value");
      continue;
    }
    s.value = line.substr(i + 1);
    if (!value_ok(s.value)) err("bad value");
    // The sample belongs to the family of the last TYPE line: its name, or name_sum / name_count
    // for a summary or a histogram, or name_bucket with an `le` label for a histogram. Counters
    // are named *_total.
    const std::string& t = e.type.count(current) ? e.type.at(current) : "";
    const bool own = s.name == current ||
                     ((t == "summary" || t == "histogram") && (s.name == current + "_sum" || s.name == current + "_count")) ||
                     (t == "histogram" && s.name == current + "_bucket" && s.labels.count("le") == 1 && value_ok(s.labels.at("le")));
    if (!own) err("sample outside its family (" + current + ")");
    if (t == "counter" && (current.size() < 6 || current.compare(current.size() - 6, 6, "_total") != 0) &&
        current != "flashbox_dspark_accepted_rounds")  // a per-bucket count of rounds, kept as named before
      err("counter not named *_total");
    sampled.insert(current);
    e.samples.push_back(std::move(s));
  }
  for (const auto& [fam, t] : e.type) {
    (void)t;
    bool any = false;
    for (const auto& s : e.samples) any = any || s.name.rfind(fam, 0) == 0;
    if (!any && fam != "flashbox_session_tokens_per_second") e.errors.push_back("family without samples: " + fam);
  }
  return e;
}

// The /metrics text of these counters, read back; a format violation fails the calling test.
Exposition read_metrics(const engine::EngineStats& s, const StatsSource& src = {}) {
  Exposition e = read_exposition(metrics_text(s, src));
  for (const auto& m : e.errors) ADD_FAILURE() << m;
  return e;
}

TEST(MetricsReader, CatchesBadText) {  // the reader above must be able to fail
  EXPECT_TRUE(read_exposition("# HELP a_total x\n# TYPE a_total counter\na_total 1\n").errors.empty());
  EXPECT_FALSE(read_exposition("a_total 1\n").errors.empty());                                             // no family
  EXPECT_FALSE(read_exposition("# HELP a x\n# TYPE a counter\na 1\n").errors.empty());                     // counter name
  EXPECT_FALSE(read_exposition("# HELP a x\n# TYPE a gauge\na 1e\n").errors.empty());                      // value
  EXPECT_FALSE(read_exposition("# HELP a x\n# TYPE a gauge\na{b=\"c} 1\n").errors.empty());                // label
  EXPECT_FALSE(read_exposition("# HELP a x\n# TYPE a gauge\nb 1\n").errors.empty());                       // foreign sample
  EXPECT_FALSE(read_exposition("# HELP a x\n# TYPE a gauge\na 1\n# HELP a x\n").errors.empty());           // HELP again
  EXPECT_FALSE(read_exposition("# HELP a x\n# TYPE a summary\na_sum 1\na_max 2\n").errors.empty());        // summary part
}

engine::EngineStats busy_stats() {
  engine::EngineStats s;
  s.requests_total = 7;
  s.requests_failed = 1;
  s.requests_cancelled = 2;
  s.queue_depth = 3;
  s.active = 2;
  s.max_sessions = 8;
  s.queue_rejected = 4;
  s.prompt_tokens = 1000;
  s.generated_tokens = 500;
  s.emitted_tokens = 520;
  s.steps = 60;
  s.step_rows = 1200;
  s.step_s = 0.1;
  s.queue_wait_s = 0.25;
  s.queue_waits = 5;
  s.ttft_s = 1.5;
  s.ttfts = 5;
  s.active_rates = {{11, 12.5, 40, 10, 10, 300.0}, {12, 0, 0, 3, 20, 50.0}};  // the second still prefilling
  s.dspark.steps = 10;
  s.dspark.accepted = 17;
  s.dspark.accepted_hist = {1, 2, 7};
  s.kv.hits = 9007199254740993LL;  // 2^53 + 1: not a double
  return s;
}

TEST(MetricsText, FormatAndCounters) {
  const engine::EngineStats s = busy_stats();
  StatsSource src;
  src.backend = "cpu";
  src.model = "deep\"seek\\v4\nflash";
  src.uptime_s = 12.25;
  const Exposition e = read_metrics(s, src);
  EXPECT_EQ(e.value("flashbox_info", {{"backend", "cpu"}, {"model", "deep\"seek\\v4\nflash"}}), "1") << "labels escaped and read back";
  EXPECT_EQ(e.value("flashbox_uptime_seconds"), "12.25");
  EXPECT_EQ(e.value("flashbox_requests_total"), "7");
  EXPECT_EQ(e.value("flashbox_requests_failed_total"), "1");
  EXPECT_EQ(e.value("flashbox_requests_cancelled_total"), "2");
  EXPECT_EQ(e.value("flashbox_queue_depth"), "3");
  EXPECT_EQ(e.value("flashbox_queue_rejected_total"), "4");
  EXPECT_EQ(e.value("flashbox_requests_active"), "2");
  EXPECT_EQ(e.value("flashbox_prompt_tokens_total"), "1000");
  EXPECT_EQ(e.value("flashbox_generated_tokens_total"), "500");
  EXPECT_EQ(e.value("flashbox_emitted_tokens_total"), "520");
  EXPECT_EQ(e.value("flashbox_steps_total"), "60");
  EXPECT_EQ(e.value("flashbox_step_rows_total"), "1200");
  EXPECT_EQ(e.value("flashbox_step_seconds_total"), "0.1") << "shortest round-trip text";
  EXPECT_EQ(e.type.at("flashbox_queue_wait_seconds"), "summary");
  EXPECT_EQ(e.value("flashbox_queue_wait_seconds_sum"), "0.25");
  EXPECT_EQ(e.value("flashbox_queue_wait_seconds_count"), "5");
  EXPECT_EQ(e.value("flashbox_time_to_first_token_seconds_sum"), "1.5");
  EXPECT_EQ(e.value("flashbox_session_tokens_per_second", {{"request", "11"}}), "12.5");
  EXPECT_EQ(e.value("flashbox_session_tokens_per_second", {{"request", "12"}}), "") << "not decoding yet";
  EXPECT_EQ(e.value("flashbox_dspark_rounds_total"), "10");
  EXPECT_EQ(e.value("flashbox_dspark_accepted_total"), "17");
  EXPECT_EQ(e.value("flashbox_dspark_accepted_rounds", {{"accepted", "2"}}), "7");
  EXPECT_EQ(e.value("flashbox_kv_cache_hits_total"), "9007199254740993") << "integers exact past 2^53";
  // Without expert tiers, op times or a KV ledger those families are absent, not zero.
  for (const char* f : {"flashbox_expert_lookups_total", "flashbox_expert_bytes_total", "flashbox_expert_slot_hits_total",
                        "flashbox_op_seconds_total", "flashbox_op_steps_total", "flashbox_ledger_bytes", "flashbox_engram_rows_total",
                        "flashbox_engram_bytes_total", "flashbox_engram_exposed_seconds_total", "flashbox_engram_drive_read_bytes_total"})
    EXPECT_FALSE(e.has_family(f)) << f;
}

TEST(MetricsText, ExpertTrafficOpTimesAndLedger) {
  engine::EngineStats s = busy_stats();
  s.executor.has_expert_traffic = true;
  s.executor.experts.hbm = {900, 9000000000ULL};
  s.executor.experts.host = {80, 800000};
  s.executor.experts.drive = {20, 18446744073709551615ULL};  // uint64 max
  s.executor.has_op_times = true;
  s.executor.ops.steps = 60;
  for (int f = 0; f < model::kOpFamilyCount; ++f) {
    s.executor.ops.s[size_t(f)] = 0.5 * (f + 1);
    s.executor.ops.calls[size_t(f)] = uint64_t(100 + f);
  }
  s.executor.has_engram = true;
  s.executor.engram = {4800, 4800 * 264, 4000, 600, 0.125};
  s.executor.memory.drive.has_engram = true;  // Engram tables on the drives
  s.executor.memory.drive.engram_bytes_read = 158400;
  s.has_expert_tiers = true;
  s.expert_tiers.slot_hits = 900;
  s.expert_tiers.slot_misses = 100;
  s.expert_tiers.host_hits = 80;
  s.expert_tiers.host_misses = 20;
  s.expert_tiers.drive_reads = 20;
  s.expert_tiers.drive_bytes = 4096;
  s.expert_tiers.drive_wait_ns = 1500000000;
  s.expert_tiers.prefetch_reads = 18;
  s.expert_tiers.prefetch_unused = 2;
  s.expert_tiers.drives.resize(2);
  s.expert_tiers.drives[1].n_errors = 3;
  s.expert_tiers.drives[1].failed = true;
  s.expert_tiers.drives[0].n_hedges = 7;
  s.has_kv_ledger = true;
  s.kv_ledger_tier = memory::Tier::kHbm;
  s.kv_ledger.target_bytes = 1 << 30;
  s.kv_ledger.mandatory_bytes = 1 << 20;
  s.kv_ledger.elastic_bytes = 0;
  StatsSource src;
  src.backend = "cuda";
  src.model = "m";
  const Exposition e = read_metrics(s, src);
  EXPECT_EQ(e.type.at("flashbox_expert_lookups_total"), "counter");
  EXPECT_EQ(e.value("flashbox_expert_lookups_total", {{"tier", "hbm"}}), "900");
  EXPECT_EQ(e.value("flashbox_expert_lookups_total", {{"tier", "host"}}), "80");
  EXPECT_EQ(e.value("flashbox_expert_lookups_total", {{"tier", "drive"}}), "20");
  EXPECT_EQ(e.value("flashbox_expert_bytes_total", {{"tier", "hbm"}}), "9000000000");
  EXPECT_EQ(e.value("flashbox_expert_bytes_total", {{"tier", "host"}}), "800000");
  EXPECT_EQ(e.value("flashbox_expert_bytes_total", {{"tier", "drive"}}), "18446744073709551615");
  EXPECT_EQ(e.value("flashbox_expert_slot_hits_total"), "900");
  EXPECT_EQ(e.value("flashbox_expert_host_misses_total"), "20");
  EXPECT_EQ(e.value("flashbox_expert_drive_read_bytes_total"), "4096");
  EXPECT_EQ(e.value("flashbox_expert_drive_wait_seconds_total"), "1.5");
  EXPECT_EQ(e.value("flashbox_expert_prefetch_reads_total"), "18");
  EXPECT_EQ(e.value("flashbox_expert_prefetch_unused_total"), "2");
  EXPECT_EQ(e.value("flashbox_expert_drive_errors_total", {{"drive", "0"}}), "0");
  EXPECT_EQ(e.value("flashbox_expert_drive_errors_total", {{"drive", "1"}}), "3");
  EXPECT_EQ(e.value("flashbox_expert_drive_failed", {{"drive", "1"}}), "1");
  EXPECT_EQ(e.value("flashbox_expert_drive_hedges_total", {{"drive", "0"}}), "7");
  EXPECT_EQ(e.value("flashbox_op_steps_total"), "60");
  EXPECT_EQ(e.value("flashbox_op_seconds_total", {{"family", "embed"}}), "0.5");
  EXPECT_EQ(e.value("flashbox_op_seconds_total", {{"family", "moe"}}), "3.5");
  EXPECT_EQ(e.value("flashbox_op_calls_total", {{"family", "other"}}), "108");
  int families = 0;
  for (const auto& smp : e.samples) families += smp.name == "flashbox_op_seconds_total";
  EXPECT_EQ(families, model::kOpFamilyCount);
  EXPECT_EQ(e.type.at("flashbox_engram_rows_total"), "counter");
  EXPECT_EQ(e.value("flashbox_engram_rows_total", {{"fetch", "hidden"}}), "4000");
  EXPECT_EQ(e.value("flashbox_engram_rows_total", {{"fetch", "exposed"}}), "600");
  EXPECT_EQ(e.value("flashbox_engram_rows_total", {{"fetch", "in_place"}}), "200");
  EXPECT_EQ(e.value("flashbox_engram_bytes_total"), "1267200");
  EXPECT_EQ(e.value("flashbox_engram_exposed_seconds_total"), "0.125");
  EXPECT_EQ(e.value("flashbox_engram_drive_read_bytes_total"), "158400");
  EXPECT_EQ(e.value("flashbox_ledger_bytes", {{"tier", "HBM"}, {"kind", "target"}}), "1073741824");
  EXPECT_EQ(e.value("flashbox_ledger_bytes", {{"tier", "HBM"}, {"kind", "mandatory"}}), "1048576");
  EXPECT_EQ(e.value("flashbox_ledger_bytes", {{"tier", "HBM"}, {"kind", "elastic"}}), "0");
}

// Issue 20's families: shared draft calls, the prefill policy, and the inter-token gap histogram
// (cumulative buckets, +Inf equal to the count).
TEST(MetricsText, SessionsDraftsPolicyAndGaps) {
  engine::EngineStats s = sessions_and_gaps_stats();
  s.policy_decode_step_s = 0.013;
  const Exposition e = read_metrics(s);
  EXPECT_EQ(e.value("flashbox_draft_calls_total"), "4");
  EXPECT_EQ(e.value("flashbox_draft_blocks_total"), "11");
  EXPECT_EQ(e.value("flashbox_packed_prompt_steps_total"), "5");
  EXPECT_EQ(e.value("flashbox_mixed_prefill_rows"), "23");
  EXPECT_EQ(e.value("flashbox_prefill_policy_decode_step_seconds"), "0.013");
  EXPECT_EQ(e.value("flashbox_prefill_policy_reference_steps_total"), "2");
  EXPECT_EQ(e.type.at("flashbox_inter_token_seconds"), "histogram");
  EXPECT_EQ(e.value("flashbox_inter_token_seconds_bucket", {{"le", "0.005"}}), "3");
  EXPECT_EQ(e.value("flashbox_inter_token_seconds_bucket", {{"le", "0.025"}}), "3");
  EXPECT_EQ(e.value("flashbox_inter_token_seconds_bucket", {{"le", "0.05"}}), "5");
  EXPECT_EQ(e.value("flashbox_inter_token_seconds_bucket", {{"le", "5"}}), "5");
  EXPECT_EQ(e.value("flashbox_inter_token_seconds_bucket", {{"le", "+Inf"}}), "6");
  EXPECT_EQ(e.value("flashbox_inter_token_seconds_count"), "6");
  EXPECT_EQ(e.value("flashbox_inter_token_seconds_sum"), "7.5");
  EXPECT_EQ(e.value("flashbox_inter_token_max_seconds"), "7");
  // The reader refuses a bucket without its bound (so the checks above can fail).
  const Exposition bad = read_exposition("# HELP h x\n# TYPE h histogram\nh_bucket 1\nh_sum 1\nh_count 1\n");
  EXPECT_FALSE(bad.errors.empty());
}

TEST(MetricsText, NonFiniteValues) {
  engine::EngineStats s;
  s.step_s = std::nan("");
  s.decode_s = INFINITY;
  const Exposition e = read_metrics(s);
  EXPECT_EQ(e.value("flashbox_step_seconds_total"), "NaN");
  EXPECT_EQ(e.value("flashbox_decode_seconds_total"), "+Inf");
  EXPECT_EQ(e.value("flashbox_requests_total"), "0");
}

}  // namespace
}  // namespace fb::server
