// The dashboard's pieces without a server: /v1/stats JSON from engine counters (derived values,
// null where a backend or configuration lacks the counter), the embedded files, the key check.
// The live page against a running server: tests/server/test_dashboard.py.
#include <gtest/gtest.h>

#include <array>

#include <initializer_list>
#include <string>

#include "server/dashboard_files.h"
#include "server/http_status.h"
#include "server/stats_json.h"
#include "server/test_engine_stats.h"

namespace fb::server {
namespace {

const EmbeddedFile* find(const std::string& url) {
  for (size_t i = 0; i < kDashboardFileCount; ++i)
    if (url == kDashboardFiles[i].url) return &kDashboardFiles[i];
  return nullptr;
}

// An embedded file's text ("" when it is absent, so the caller's checks fail).
std::string text(const std::string& url) {
  const EmbeddedFile* f = find(url);
  return f ? std::string(reinterpret_cast<const char*>(f->data), f->size) : std::string();
}

// Every id names an element of the page.
void expect_ids(std::initializer_list<const char*> ids) {
  const std::string html = text("/");
  for (const char* id : ids) EXPECT_NE(html.find(std::string("id=\"") + id + "\""), std::string::npos) << id;
}

TEST(Dashboard, EmbeddedFiles) {
  const EmbeddedFile* page = find("/");
  ASSERT_NE(page, nullptr);
  const std::string html(reinterpret_cast<const char*>(page->data), page->size);
  EXPECT_NE(html.find("/dashboard/dashboard.js"), std::string::npos);
  EXPECT_NE(html.find("id=\"v_decode_tok_s\""), std::string::npos);
  EXPECT_EQ(page->data[page->size], 0);  // NUL after the bytes, not counted
  EXPECT_EQ(std::string(page->content_type).rfind("text/html", 0), 0u);
  const EmbeddedFile* js = find("/dashboard/dashboard.js");
  ASSERT_NE(js, nullptr);
  EXPECT_NE(std::string(reinterpret_cast<const char*>(js->data), js->size).find("/v1/stats"), std::string::npos);
  ASSERT_NE(find("/dashboard/dashboard.css"), nullptr);
  const EmbeddedFile* chart = find("/dashboard/chart.js");
  ASSERT_NE(chart, nullptr);  // Chart.js, or a stub that says the page draws its own charts
  const std::string c(reinterpret_cast<const char*>(chart->data), chart->size);
  if (kDashboardHasChartJs)
    EXPECT_NE(c.find("Chart.js"), std::string::npos);
  else
    EXPECT_LT(c.size(), 200u);
  // Nothing on the page comes from the network.
  for (size_t i = 0; i < kDashboardFileCount; ++i) {
    if (std::string(kDashboardFiles[i].url) == "/dashboard/chart.js") continue;
    const std::string body(reinterpret_cast<const char*>(kDashboardFiles[i].data), kDashboardFiles[i].size);
    EXPECT_EQ(body.find("http://"), std::string::npos) << kDashboardFiles[i].url;
    EXPECT_EQ(body.find("https://"), std::string::npos) << kDashboardFiles[i].url;
  }
}

TEST(Dashboard, ApiKey) {
  EXPECT_TRUE(api_key_ok("", "", ""));
  EXPECT_TRUE(api_key_ok("k", "Bearer k", ""));
  EXPECT_TRUE(api_key_ok("k", "", "k"));
  EXPECT_FALSE(api_key_ok("k", "", ""));
  EXPECT_FALSE(api_key_ok("k", "Bearer x", "y"));
  EXPECT_FALSE(api_key_ok("k", "k", ""));
}

// The /v1/stats tests: engine counters `s` and the server's facts `src`, empty until a test sets
// them; json() is what the endpoint answers for them as they are now.
class StatsJson : public ::testing::Test {
 protected:
  nlohmann::json json() const { return stats_json(s, src); }

  engine::EngineStats s;
  StatsSource src;
};

TEST_F(StatsJson, FreshEngineHasNoAverages) {
  src.backend = "cpu";
  src.has_dspark = true;
  const auto j = json();
  EXPECT_EQ(j["backend"], "cpu");
  EXPECT_TRUE(j["derived"]["step_ms"].is_null());
  EXPECT_TRUE(j["derived"]["decode_tok_s"].is_null());
  EXPECT_TRUE(j["derived"]["dspark_tokens_per_round"].is_null());
  EXPECT_TRUE(j["dspark"].is_object());
  // Absent subsystems are null, so the page shows "n/a" rather than a fake 0.
  EXPECT_TRUE(j["kv_cache"].is_null());
  EXPECT_TRUE(j["expert_tiers"].is_null());
  EXPECT_TRUE(j["ledger"]["HBM"].is_null());
  EXPECT_TRUE(j["ledger"]["host"].is_null());
  EXPECT_TRUE(j["kv_budget"].is_null());
  EXPECT_TRUE(j["derived"]["expert_slot_hit_rate"].is_null());
}

TEST_F(StatsJson, CountersAndDerivedValues) {
  s.requests_total = 3;
  s.active = 1;
  s.queue_depth = 2;
  s.emitted_tokens = 42;
  s.ttfts = 2;
  s.ttft_s = 0.5;
  s.decode_s = 4.0;
  s.prefill_s = 2.0;
  s.steps = 10;
  s.step_rows = 30;
  s.step_prefill_rows = 100;
  s.step_sessions = 15;
  s.step_s = 0.25;
  s.dspark.steps = 4;
  s.dspark.accepted = 6;
  s.dspark.proposals = 12;
  s.dspark.backoff_steps = 7;
  s.has_kv_cache = true;
  s.kv.hits = 3;
  s.kv.misses = 1;
  s.has_kv_ledger = true;
  s.kv_ledger_tier = memory::Tier::kHost;
  s.kv_ledger.target_bytes = 1000;
  s.kv_ledger.mandatory_bytes = 250;
  s.has_expert_tiers = true;
  s.expert_tiers.slot_hits = 9;
  s.expert_tiers.slot_misses = 1;
  s.expert_tiers.host_hits = 1;
  s.expert_tiers.host_misses = 0;
  s.active_rates.push_back({7, 12.5, 5, 64, 64, 300.0});
  s.active_rates.push_back({8, 0, 0, 16, 64, 80.0});
  src.has_dspark = true;
  src.uptime_s = 9.5;
  const auto j = json();
  EXPECT_EQ(j["uptime_s"], 9.5);
  EXPECT_EQ(j["requests"]["queued"], 2);
  EXPECT_EQ(j["tokens"]["emitted"], 42);
  const auto& d = j["derived"];
  EXPECT_DOUBLE_EQ(d["decode_tok_s"].get<double>(), 40.0 / 4.0);  // first tokens come from prefill rounds
  EXPECT_DOUBLE_EQ(d["prefill_tok_s"].get<double>(), 50.0);
  EXPECT_DOUBLE_EQ(d["step_ms"].get<double>(), 25.0);
  EXPECT_DOUBLE_EQ(d["rows_per_step"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(d["sessions_per_step"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(d["ttft_ms"].get<double>(), 250.0);
  EXPECT_DOUBLE_EQ(d["dspark_tokens_per_round"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(d["dspark_accept_rate"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(d["kv_cache_hit_rate"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(d["expert_slot_hit_rate"].get<double>(), 0.9);
  EXPECT_DOUBLE_EQ(d["expert_host_hit_rate"].get<double>(), 1.0);
  EXPECT_EQ(j["dspark"]["backoff_steps"], 7);
  EXPECT_EQ(j["ledger"]["host"]["mandatory_bytes"], 250);
  EXPECT_TRUE(j["ledger"]["HBM"].is_null());
  ASSERT_EQ(j["sessions"].size(), 2u);
  EXPECT_EQ(j["sessions"][0]["id"], 7);
  EXPECT_DOUBLE_EQ(j["sessions"][0]["tok_s"].get<double>(), 12.5);
  EXPECT_TRUE(j["sessions"][1]["tok_s"].is_null());  // still prefilling
  EXPECT_EQ(j["sessions"][1]["prefill_done"], 16);
}

TEST_F(StatsJson, ExecutorTrafficAndOpTimes) {
  auto j = json();
  EXPECT_TRUE(j["expert_traffic"].is_null());  // every expert resident
  EXPECT_TRUE(j["op_time"].is_null());         // the executor does not time its ops
  EXPECT_TRUE(j["derived"]["expert_bytes_per_token"].is_null());
  EXPECT_TRUE(j["derived"]["op_ms_per_step"].is_null());
  s.step_rows = 8;
  s.executor.has_expert_traffic = true;
  s.executor.experts.hbm = {30, 3000};
  s.executor.experts.host = {6, 600};
  s.executor.experts.drive = {4, 480};
  s.executor.has_op_times = true;
  s.executor.ops.steps = 4;
  s.executor.ops.s[size_t(model::OpFamily::kMoe)] = 0.02;
  s.executor.ops.s[size_t(model::OpFamily::kAttention)] = 0.01;
  s.executor.ops.calls[size_t(model::OpFamily::kMoe)] = 8;
  j = json();
  EXPECT_EQ(j["expert_traffic"]["hbm"]["lookups"], 30);
  EXPECT_EQ(j["expert_traffic"]["drive"]["bytes"], 480);
  EXPECT_EQ(j["op_time"]["steps"], 4);
  EXPECT_EQ(j["op_time"]["calls"]["moe"], 8);
  EXPECT_DOUBLE_EQ(j["op_time"]["seconds"]["attention"].get<double>(), 0.01);
  EXPECT_EQ(j["op_time"]["seconds"].size(), size_t(model::kOpFamilyCount));
  const auto& d = j["derived"];
  EXPECT_DOUBLE_EQ(d["expert_bytes_per_token"]["hbm"].get<double>(), 375.0);
  EXPECT_DOUBLE_EQ(d["expert_bytes_per_token"]["host"].get<double>(), 75.0);
  EXPECT_DOUBLE_EQ(d["expert_bytes_per_token"]["drive"].get<double>(), 60.0);
  EXPECT_DOUBLE_EQ(d["expert_hbm_hit_rate"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(d["expert_host_tier_hit_rate"].get<double>(), 0.6);
  EXPECT_DOUBLE_EQ(d["op_ms_per_step"]["moe"].get<double>(), 5.0);
  EXPECT_DOUBLE_EQ(d["op_ms_per_step"]["head"].get<double>(), 0.0);
  // No lookups yet: rates are null, not 0 or 1.
  s.executor.experts = {};
  j = json();
  EXPECT_TRUE(j["derived"]["expert_hbm_hit_rate"].is_null());
  EXPECT_TRUE(j["derived"]["expert_host_tier_hit_rate"].is_null());
  EXPECT_DOUBLE_EQ(j["derived"]["expert_bytes_per_token"]["drive"].get<double>(), 0.0);
}

TEST(Dashboard, PageHasTheBreakdowns) {
  expect_ids({"op_table", "op_stack", "tier_table", "tier_stack", "v_bpt_total"});
  const std::string code = text("/dashboard/dashboard.js");
  ASSERT_FALSE(code.empty());
  // Every op family the JSON reports has a row on the page.
  for (int f = 0; f < model::kOpFamilyCount; ++f)
    EXPECT_NE(code.find(std::string("['") + model::op_family_name(model::OpFamily(f)) + "'"), std::string::npos)
        << model::op_family_name(model::OpFamily(f));
}

TEST_F(StatsJson, NoDsparkHead) {
  s.dspark.steps = 3;
  src.has_dspark = false;
  const auto j = json();
  EXPECT_TRUE(j["dspark"].is_null());
  EXPECT_TRUE(j["derived"]["dspark_tokens_per_round"].is_null());
}

// Issue 20's counters: shared draft calls, the prefill policy, and the inter-token gap histogram
// as cumulative buckets with their bounds.
TEST_F(StatsJson, SessionsDraftsPolicyAndGaps) {
  s = sessions_and_gaps_stats();
  auto j = json();
  EXPECT_EQ(j["steps"]["draft_calls"], 4);
  EXPECT_EQ(j["steps"]["draft_blocks"], 11);
  EXPECT_EQ(j["steps"]["mixed_prefill_rows"], 23);
  EXPECT_EQ(j["steps"]["reference_steps"], 2);
  EXPECT_TRUE(j["steps"]["policy_decode_step_s"].is_null()) << "not measured yet";
  const auto& b = j["latency"]["gap_buckets"];
  ASSERT_EQ(b.size(), 11u);
  EXPECT_DOUBLE_EQ(b[0]["le"].get<double>(), 0.005);
  EXPECT_EQ(b[0]["count"], 3);
  EXPECT_EQ(b[2]["count"], 3);
  EXPECT_EQ(b[3]["count"], 5);
  EXPECT_EQ(b[9]["count"], 5);
  EXPECT_EQ(b[10]["le"], "+Inf");
  EXPECT_EQ(b[10]["count"], 6);
  EXPECT_EQ(j["latency"]["gap_count"], 6);
  EXPECT_DOUBLE_EQ(j["latency"]["gap_max_s"].get<double>(), 7.0);
  s.policy_decode_step_s = 0.013;
  j = json();
  EXPECT_DOUBLE_EQ(j["steps"]["policy_decode_step_s"].get<double>(), 0.013);
}

// Engram rows (issue 24): null for a model without Engram layers; the counts and the derived
// shares and per-token / per-step figures otherwise; the page has the card.
TEST_F(StatsJson, EngramRows) {
  auto j = json();
  EXPECT_TRUE(j["engram"].is_null());
  EXPECT_TRUE(j["derived"]["engram_hidden_share"].is_null());
  s.executor.has_engram = true;
  j = json();
  EXPECT_EQ(j["engram"]["rows"], 0);
  EXPECT_TRUE(j["derived"]["engram_hidden_share"].is_null()) << "no rows yet: null, not 0";
  s.steps = 5;
  s.step_rows = 20;
  s.executor.engram = {160, 160 * 33, 120, 30, 0.004};
  j = json();
  EXPECT_EQ(j["engram"]["hidden"], 120);
  EXPECT_EQ(j["engram"]["exposed"], 30);
  EXPECT_EQ(j["engram"]["in_place"], 10);
  EXPECT_EQ(j["engram"]["bytes"], 5280);
  const auto& d = j["derived"];
  EXPECT_DOUBLE_EQ(d["engram_rows_per_token"].get<double>(), 8.0);
  EXPECT_DOUBLE_EQ(d["engram_hidden_share"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(d["engram_exposed_share"].get<double>(), 0.1875);
  EXPECT_DOUBLE_EQ(d["engram_exposed_ms_per_step"].get<double>(), 0.8);
  expect_ids({"v_engram_hidden", "v_engram_exposed", "v_engram_in_place", "v_engram_rows_tok", "v_engram_wait_ms"});
}

// The executor's memory by tier (model::MemoryByTier): null tiers until reported, then each
// tier's parts and total (the host tier on the CPU, HBM and host on CUDA), the drives' bytes read;
// the page's ledger cards have an id for every part the JSON reports of HBM and host alike.
TEST_F(StatsJson, MemoryByTier) {
  auto j = json();
  ASSERT_TRUE(j["memory"].is_object());
  EXPECT_TRUE(j["memory"]["hbm"].is_null());
  EXPECT_TRUE(j["memory"]["host"].is_null());
  EXPECT_TRUE(j["memory"]["drive"].is_null());
  model::MemoryByTier& m = s.executor.memory;
  m.has_host = true;
  m.host = {1000, 200, 300, 2, 40, 5};
  m.has_drive = true;
  m.drive.expert_bytes_read = 777;
  // One tier's JSON: its parts in TierMemory's order (weights, weight copies, sessions, session
  // count, scratch, experts), then the total written out (not derived from the same numbers).
  const auto expect_tier = [](const nlohmann::json& t, const std::array<int64_t, 6>& parts, int64_t total, const char* tier) {
    SCOPED_TRACE(tier);
    const char* keys[6] = {"weights_bytes", "weight_copies_bytes", "sessions_bytes", "sessions", "scratch_bytes", "experts_bytes"};
    for (size_t i = 0; i < parts.size(); ++i) EXPECT_EQ(t[keys[i]], parts[i]) << keys[i];
    EXPECT_EQ(t["total_bytes"], total);
  };
  j = json();
  expect_tier(j["memory"]["host"], {1000, 200, 300, 2, 40, 5}, 1545, "host");
  EXPECT_EQ(j["memory"]["drive"]["expert_bytes_read"], 777);
  EXPECT_TRUE(j["memory"]["drive"]["engram_bytes_read"].is_null()) << "no Engram drive tier";
  EXPECT_TRUE(j["memory"]["hbm"].is_null());
  // HBM as the CUDA executor reports it: every part, not only the total.
  m.has_hbm = true;
  m.hbm = {70000, 6000, 500, 3, 40, 1};
  j = json();
  expect_tier(j["memory"]["hbm"], {70000, 6000, 500, 3, 40, 1}, 76541, "hbm");
  EXPECT_EQ(j["memory"]["host"]["total_bytes"], 1545) << "the tiers are kept apart";
  expect_ids({"v_mem_hbm", "v_mem_hbm_weights", "v_mem_hbm_weight_copies", "v_mem_hbm_sessions", "v_mem_hbm_n_sessions",
              "v_mem_hbm_scratch", "v_mem_hbm_experts", "v_ledger_hbm", "v_mem_host", "v_mem_host_weights", "v_mem_host_weight_copies",
              "v_mem_host_sessions", "v_mem_host_n_sessions", "v_mem_host_scratch", "v_mem_host_experts", "v_ledger_host", "v_mem_drive"});
  // Each NAME_bytes part of a tier is shown at v_mem_TIER_NAME (dashboard.js MEM_PARTS), so a part
  // added to the JSON without a place on the page fails here.
  const std::string html = text("/"), code = text("/dashboard/dashboard.js");
  ASSERT_FALSE(code.empty());
  for (const char* t : {"hbm", "host"}) {
    for (const auto& el : j["memory"][t].items()) {
      const std::string& key = el.key();
      if (key == "total_bytes" || key == "sessions") continue;  // v_mem_TIER and v_mem_TIER_n_sessions
      ASSERT_TRUE(key.ends_with("_bytes")) << key;
      const std::string part = key.substr(0, key.size() - std::string("_bytes").size());
      EXPECT_NE(html.find("id=\"v_mem_" + std::string(t) + "_" + part + "\""), std::string::npos) << t << " " << part;
      EXPECT_NE(code.find("'" + part + "'"), std::string::npos) << part << " is not in dashboard.js's MEM_PARTS";
    }
  }
  for (const char* key : {"total_bytes", "expert_bytes_read"}) EXPECT_NE(code.find(key), std::string::npos) << key;
}

}  // namespace
}  // namespace fb::server
