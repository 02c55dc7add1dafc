// model::Executor::stats (issue 24) on the CPU executor over the built-in tiny model: routed-expert
// traffic by supplying tier through the host tiers (--expert-slots), every lookup counted once at
// one tier and matching the tiers' own counters; step time by op family, covering the step's wall
// time with the op calls run_backbone makes. Also prints what the op clocks cost (A/B of the same
// steps with and without them), the figure docs/serving.md quotes.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "cpu/executor.h"
#include "engine/executor_factory.h"
#include "storage/tiered_experts.h"
#include "tiny_model_util.h"

namespace fb {
namespace {

const std::string& model_dir() {
  static const std::string dir = [] {
    auto d = testing_util::write_test_tiny_model("fb_executor_stats", 11, false);
    FB_CHECK(d.ok()) << d.status().to_string();
    return *d;
  }();
  return dir;
}

// Rows [p0, p0 + n) of one session: prefill rows of a prompt of `end` tokens, or one decode row.
model::Step rows(int64_t p0, int64_t n, int64_t end, bool decode) {
  model::Step st;
  for (int64_t p = p0; p < p0 + n; ++p) {
    model::Row r;
    r.pos = p;
    r.token = int32_t(100 + (p * 37) % 900);
    r.kind = decode ? model::RowKind::kDecode : model::RowKind::kPrefill;
    r.prefill_end = decode ? 0 : end;
    r.want_logits = p == p0 + n - 1;
    st.rows.push_back(r);
  }
  return st;
}

// A 24-token prompt in two steps, then `decodes` decode steps; returns the rows run.
int64_t run_session(model::Executor& ex, int decodes) {
  auto s = ex.new_session();
  std::vector<model::SessionState*> ss{s.get()};
  int64_t n = 0;
  for (const model::Step& st : {rows(0, 16, 24, false), rows(16, 8, 24, false)}) {
    auto out = ex.forward(st, ss);
    FB_CHECK(out.ok()) << out.status().to_string();
    n += int64_t(st.rows.size());
  }
  for (int k = 0; k < decodes; ++k) {
    auto out = ex.forward(rows(24 + k, 1, 0, true), ss);
    FB_CHECK(out.ok()) << out.status().to_string();
    ++n;
  }
  return n;
}

TEST(ExecutorStats, ResidentExpertsHaveNoTrafficButOpTimes) {
  auto ex = engine::make_executor("cpu", model_dir());
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  model::ExecutorStats s0 = (*ex)->stats();
  EXPECT_FALSE(s0.has_expert_traffic);  // every expert resident: nothing to split by tier
  ASSERT_TRUE(s0.has_op_times);
  EXPECT_EQ(s0.ops.steps, 0u);
  EXPECT_EQ(s0.ops.total_s(), 0.0);

  const auto t0 = std::chrono::steady_clock::now();
  run_session(**ex, 4);
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const model::ExecutorStats s = (*ex)->stats();
  const model::Config& c = (*ex)->config();
  EXPECT_EQ(s.ops.steps, 6u);
  auto calls = [&](model::OpFamily f) { return s.ops.calls[size_t(f)]; };
  EXPECT_EQ(calls(model::OpFamily::kEmbed), 6u);
  EXPECT_EQ(calls(model::OpFamily::kHead), 6u);
  EXPECT_EQ(calls(model::OpFamily::kMoe), 6u * uint64_t(c.n_layers));
  EXPECT_EQ(calls(model::OpFamily::kAttention), 6u * uint64_t(c.n_layers));
  // attn_q, attn_kv, attn_output per layer; two mixes, two collapses, two expands per layer.
  EXPECT_EQ(calls(model::OpFamily::kAttnProj), 6u * 3u * uint64_t(c.n_layers));
  EXPECT_GE(calls(model::OpFamily::kMhc), 6u * 6u * uint64_t(c.n_layers));
  if (!c.engram_layer_ids.empty()) EXPECT_EQ(calls(model::OpFamily::kEngram), 6u * (1u + uint64_t(c.engram_layer_ids.size())));
  for (int f = 0; f < model::kOpFamilyCount; ++f) EXPECT_GE(s.ops.s[size_t(f)], 0.0) << model::op_family_name(model::OpFamily(f));
  // The ops are the step: their sum is most of the wall time of the forward() calls and never more.
  EXPECT_LE(s.ops.total_s(), wall_s);
  EXPECT_GT(s.ops.total_s(), 0.5 * wall_s) << "ops " << s.ops.total_s() << " s of " << wall_s << " s";
  EXPECT_GT(s.ops.s[size_t(model::OpFamily::kMoe)], 0.0);
  EXPECT_GT(s.ops.s[size_t(model::OpFamily::kAttention)], 0.0);
}

TEST(ExecutorStats, TieredExpertsCountEachLookupAtOneTier) {
  engine::ExecutorOptions o;
  o.expert_slots = 1;  // one first-tier slot per layer: most lookups miss it
  o.host_experts = 4;  // a small host cache over the snapshot's shards
  std::shared_ptr<storage::TieredExperts> tiers;
  auto ex = engine::make_executor("cpu", model_dir(), o, &tiers);
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  ASSERT_NE(tiers, nullptr);
  EXPECT_TRUE((*ex)->stats().has_expert_traffic);
  EXPECT_EQ((*ex)->stats().experts.lookups(), 0u);

  run_session(**ex, 6);
  const model::ExecutorStats s = (*ex)->stats();
  ASSERT_TRUE(s.has_expert_traffic);
  const model::ExpertTraffic& x = s.experts;
  const storage::TierStats t = tiers->stats();
  // Every lookup of the MoE ops is counted once, at the tier that supplied it.
  EXPECT_EQ(x.lookups(), t.slot_hits + t.slot_misses);
  EXPECT_EQ(x.hbm.lookups, t.slot_hits);
  EXPECT_EQ(x.host.lookups, t.host_hits);
  EXPECT_EQ(x.drive.lookups, t.drive_reads);
  EXPECT_EQ(x.drive.bytes, t.drive_bytes);
  EXPECT_GT(x.drive.lookups, 0u);  // a cold start reads from the drives
  EXPECT_GT(x.lookups(), x.drive.lookups);  // and later steps reuse what it read
  // The first two tiers supply whole records: bytes are lookups x one record's bytes.
  if (x.hbm.lookups > 0) EXPECT_EQ(x.hbm.bytes % x.hbm.lookups, 0u);
  if (x.hbm.lookups > 0 && x.host.lookups > 0) EXPECT_EQ(x.hbm.bytes / x.hbm.lookups, x.host.bytes / x.host.lookups);
  EXPECT_GE(x.drive.bytes, x.drive.lookups * (x.host.lookups ? x.host.bytes / x.host.lookups : 1));
  // The tiers do not change the op counts.
  EXPECT_EQ(s.ops.steps, 8u);
}

// Engram rows (MISSION item 7): every step reads orders x heads table rows per row and Engram
// layer; the CPU executor fetches them in a task started when the ids are hashed, so a row is
// either hidden (staged before its layer asked) or exposed (its layer waited). With the prefetch
// off every row is exposed; the logits are the same bits either way.
// --host-compute is a tier option: refused without expert slots and outside 0..2, with the
// option's name in the message.
TEST(ExecutorStats, HostComputeNeedsSlotsAndAMode) {
  engine::ExecutorOptions o;
  o.host_compute = 1;
  auto ex = engine::make_executor("cpu", model_dir(), o);
  ASSERT_FALSE(ex.ok());
  EXPECT_EQ(ex.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(ex.status().to_string().find("--host-compute"), std::string::npos) << ex.status().to_string();
  o.expert_slots = 1;
  o.host_compute = 3;
  ex = engine::make_executor("cpu", model_dir(), o);
  ASSERT_FALSE(ex.ok());
  EXPECT_NE(ex.status().to_string().find("--host-compute takes 0, 1 or 2"), std::string::npos) << ex.status().to_string();
}

TEST(ExecutorStats, EngramRowsHiddenOrExposed) {
  auto a = engine::make_executor("cpu", model_dir());
  auto b = engine::make_executor("cpu", model_dir());
  ASSERT_TRUE(a.ok() && b.ok());
  const model::Config& c = (*a)->config();
  ASSERT_FALSE(c.engram_layer_ids.empty()) << "the tiny model has Engram layers";
  auto& off = static_cast<cpu::CpuModel&>(**b);
  off.set_engram_prefetch(false);
  EXPECT_TRUE((*a)->stats().has_engram);
  EXPECT_EQ((*a)->stats().engram.rows, 0u);

  auto sa = (*a)->new_session();
  auto sb = off.new_session();
  std::vector<model::SessionState*> va{sa.get()}, vb{sb.get()};
  int64_t n_rows = 0;
  std::vector<model::Step> steps{rows(0, 16, 24, false), rows(16, 8, 24, false)};
  for (int k = 0; k < 4; ++k) steps.push_back(rows(24 + k, 1, 0, true));
  for (const model::Step& st : steps) {
    auto oa = (*a)->forward(st, va);
    auto ob = off.forward(st, vb);
    ASSERT_TRUE(oa.ok() && ob.ok());
    EXPECT_EQ(oa->logits, ob->logits) << "the prefetch changed the logits at row " << st.rows[0].pos;
    EXPECT_EQ(oa->taps, ob->taps);
    n_rows += int64_t(st.rows.size());
  }
  const uint64_t cols = uint64_t(c.engram_max_ngram - 1) * uint64_t(c.engram_n_heads);
  const uint64_t want = uint64_t(n_rows) * uint64_t(c.engram_layer_ids.size()) * cols;
  const uint64_t row_bytes = uint64_t(c.engram_head_dim + c.engram_head_dim / 32);
  for (const model::Executor* ex : {a->get(), b->get()}) {
    const model::EngramRows e = ex->stats().engram;
    EXPECT_EQ(e.rows, want);
    EXPECT_EQ(e.bytes, want * row_bytes);
    EXPECT_EQ(e.hidden + e.exposed, e.rows) << "the CPU fetches every row, none is read in place";
    EXPECT_EQ(e.in_place(), 0u);
  }
  const model::EngramRows on = (*a)->stats().engram, no = off.stats().engram;
  EXPECT_EQ(no.hidden, 0u);
  EXPECT_EQ(no.exposed, want);
  EXPECT_GT(no.exposed_s, 0.0);
  // Layer 0 runs while the task copies: over six steps some rows arrive before their layer.
  EXPECT_GT(on.hidden, 0u) << "no Engram row was fetched ahead of its layer";
  std::printf("engram rows: %llu, prefetch on: hidden %llu, exposed %llu (%.3f ms waited); off: exposed %llu (%.3f ms)\n",
              (unsigned long long)want, (unsigned long long)on.hidden, (unsigned long long)on.exposed, on.exposed_s * 1e3,
              (unsigned long long)no.exposed, no.exposed_s * 1e3);
}

// The memory ledger by tier (issue 24) against what the CPU executor holds: host weights are the
// snapshot's tensors (routed experts left out when the tiers serve them), the copies are the
// dequantised wo_a, scratch the RoPE and Engram hashing tables, sessions the live sessions' caches
// (counted while they live); the drives' bytes are the tiers' reads; no HBM.
TEST(ExecutorStats, MemoryLedgerByTier) {
  for (const bool tiered : {false, true}) {
    SCOPED_TRACE(tiered ? "tiered experts" : "resident experts");
    engine::ExecutorOptions o;
    if (tiered) {
      o.expert_slots = 1;
      o.host_experts = 4;
    }
    std::shared_ptr<storage::TieredExperts> tiers;
    auto ex = engine::make_executor("cpu", model_dir(), o, &tiers);
    ASSERT_TRUE(ex.ok()) << ex.status().to_string();
    const auto& m = static_cast<const cpu::CpuModel&>(**ex);
    const model::Config& c = m.config();
    uint64_t all = 0, experts = 0, copies = 0;
    for (const std::string& n : m.snapshot().tensor_names()) {
      all += m.snapshot().get(n).nbytes();
      if (n.find(".ffn.experts.") != std::string::npos) experts += m.snapshot().get(n).nbytes();
    }
    ASSERT_GT(experts, 0u);
    for (int l = 0; l < c.n_total_layers(); ++l) copies += uint64_t(m.weights().layers[size_t(l)].wo_a.w.numel()) * 2;  // bf16
    uint64_t scratch = 2 * uint64_t(c.rope_head_dim / 2) * sizeof(float);  // plain and YaRN frequencies
    const uint64_t per_table = 2 * uint64_t(c.engram_max_ngram - 1) * uint64_t(c.engram_n_heads) + uint64_t(c.engram_max_ngram);
    scratch += uint64_t(c.engram_layer_ids.size()) * per_table * sizeof(int64_t);  // primes, offsets, multipliers

    const model::MemoryByTier m0 = m.stats().memory;
    EXPECT_FALSE(m0.has_hbm);
    ASSERT_TRUE(m0.has_host);
    EXPECT_EQ(m0.host.weights, tiered ? all - experts : all);
    EXPECT_EQ(m0.host.weight_copies, copies);
    EXPECT_EQ(m0.host.scratch, scratch);
    EXPECT_EQ(m0.host.n_sessions, 0);
    EXPECT_EQ(m0.host.sessions, 0u);
    EXPECT_EQ(m0.has_drive, tiered);
    EXPECT_EQ(m0.drive.expert_bytes_read, 0u);
    EXPECT_FALSE(m0.drive.has_engram);

    // Two sessions: one fresh, one after a prompt and decode steps (its caches grew).
    auto fresh = m.new_session();
    auto used = m.new_session();
    const uint64_t fresh_bytes = static_cast<const cpu::SessionCache&>(*fresh).bytes();
    // At least the window rings: slots x (head_dim e4m3 codes + head_dim/32 scales) per layer.
    EXPECT_GE(fresh_bytes, uint64_t(c.n_layers) * uint64_t(c.window_size + cpu::kRingHeadroom) * uint64_t(c.head_dim + c.head_dim / 32));
    std::vector<model::SessionState*> ss{used.get()};
    for (const model::Step& st : {rows(0, 16, 24, false), rows(16, 8, 24, false), rows(24, 1, 0, true)})
      ASSERT_TRUE((*ex)->forward(st, ss).ok());
    const uint64_t used_bytes = static_cast<const cpu::SessionCache&>(*used).bytes();
    EXPECT_GT(used_bytes, fresh_bytes);  // token history, compressed entries
    const model::MemoryByTier m1 = m.stats().memory;
    EXPECT_EQ(m1.host.n_sessions, 2);
    EXPECT_EQ(m1.host.sessions, fresh_bytes + used_bytes);
    EXPECT_EQ(m1.host.total(), m1.host.weights + copies + scratch + fresh_bytes + used_bytes + m1.host.experts);
    if (tiered) {
      ASSERT_NE(tiers, nullptr);
      EXPECT_GT(m1.host.experts, 0u);  // slots and host cache records were allocated on use
      EXPECT_EQ(m1.host.experts, tiers->host_bytes());
      EXPECT_GT(m1.drive.expert_bytes_read, 0u);
      EXPECT_EQ(m1.drive.expert_bytes_read, tiers->stats().drive_bytes);
    } else {
      EXPECT_EQ(m1.host.experts, 0u);  // the mapped snapshot holds no buffers of its own
    }
    // A session leaves the ledger when it is destroyed.
    used.reset();
    const model::MemoryByTier m2 = m.stats().memory;
    EXPECT_EQ(m2.host.n_sessions, 1);
    EXPECT_EQ(m2.host.sessions, fresh_bytes);
  }
}

// Engram tables on the drives (--engram-cache-bytes): the ledger counts the row cache instead of
// the mapped tables, and the drives' Engram bytes as the cache read them; the logits do not move.
TEST(ExecutorStats, EngramTablesOnTheDrives) {
  auto plain = engine::make_executor("cpu", model_dir());
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  engine::ExecutorOptions o;
  o.engram_cache_bytes = 4096;
  auto ex = engine::make_executor("cpu", model_dir(), o);
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  const auto& m = static_cast<const cpu::CpuModel&>(**ex);
  uint64_t tables = 0;
  for (const std::string& n : m.snapshot().tensor_names())
    if (n.find(".engram.embed.") != std::string::npos) tables += m.snapshot().get(n).nbytes();
  ASSERT_GT(tables, 4096u);
  const model::MemoryByTier p0 = (*plain)->stats().memory, m0 = m.stats().memory;
  EXPECT_TRUE(m0.has_drive);
  EXPECT_TRUE(m0.drive.has_engram);
  EXPECT_EQ(m0.drive.engram_bytes_read, 0u);
  EXPECT_GT(m0.host.weights + tables, p0.host.weights);           // the cache's bytes in, ...
  EXPECT_LE(m0.host.weights + tables, p0.host.weights + 4096);  // ... at most its budget
  auto a = (*plain)->new_session(), b = m.new_session();
  std::vector<model::SessionState*> sa{a.get()}, sb{b.get()};
  for (const model::Step& st : {rows(0, 16, 24, false), rows(16, 8, 24, false), rows(24, 1, 0, true), rows(25, 1, 0, true)}) {
    auto x = (*plain)->forward(st, sa), y = (*ex)->forward(st, sb);
    ASSERT_TRUE(x.ok() && y.ok());
    EXPECT_EQ(x->logits, y->logits);
  }
  const model::MemoryByTier m1 = m.stats().memory;
  const model::Config& c = m.config();
  EXPECT_GT(m1.drive.engram_bytes_read, 0u);
  EXPECT_EQ(m1.drive.engram_bytes_read % uint64_t(c.engram_head_dim + c.engram_head_dim / 32), 0u);  // whole rows
  EXPECT_FALSE((*plain)->stats().memory.drive.has_engram);
}

// [policy] The default: the mapping while the tables take at most half the memory, else the drives
// through a row cache of min(1 GiB, 5%).
TEST(ExecutorStats, EngramCacheDefault) {
  const uint64_t GiB = uint64_t(1) << 30;
  EXPECT_EQ(engine::auto_engram_cache_bytes(0, 100 * GiB), -1);           // no Engram layers
  EXPECT_EQ(engine::auto_engram_cache_bytes(1 << 20, 16 * GiB), -1);      // a tiny model's tables
  EXPECT_EQ(engine::auto_engram_cache_bytes(50 * GiB, 100 * GiB), -1);    // half: still mapped
  EXPECT_EQ(engine::auto_engram_cache_bytes(189 * GiB, 120 * GiB), int64_t(GiB));  // the release on a 128 GB box
  EXPECT_EQ(engine::auto_engram_cache_bytes(189 * GiB, 10 * GiB), int64_t(10 * GiB / 20));
}

// One table names the forward pass's ops for the CPU's clocks and the CUDA executor's device times
// (its profile entries carry the same names): every run_backbone op has a family, other names
// (draft-only ops, whole-step entries, per-kernel entries) none, and OpTimes::add files by name.
TEST(ExecutorStats, OpNamesAndFamilies) {
  EXPECT_EQ(model::op_family_index("embed"), int(model::OpFamily::kEmbed));
  EXPECT_EQ(model::op_family_index("engram_hash"), int(model::OpFamily::kEngram));
  EXPECT_EQ(model::op_family_index("engram"), int(model::OpFamily::kEngram));
  EXPECT_EQ(model::op_family_index("dspark_tap"), int(model::OpFamily::kMhc));
  EXPECT_EQ(model::op_family_index("hc_collapse_norm"), int(model::OpFamily::kMhc));
  EXPECT_EQ(model::op_family_index("attn_kv"), int(model::OpFamily::kAttnProj));
  EXPECT_EQ(model::op_family_index("index_select"), int(model::OpFamily::kIndex));
  EXPECT_EQ(model::op_family_index("attention"), int(model::OpFamily::kAttention));
  EXPECT_EQ(model::op_family_index("moe"), int(model::OpFamily::kMoe));
  EXPECT_EQ(model::op_family_index("head"), int(model::OpFamily::kHead));
  EXPECT_EQ(model::op_family_index("end_layer"), int(model::OpFamily::kOther));
  for (const char* other : {"markov_chain", "step.gpu", "step.wall", "step.enqueue", "k:moe/tc_gemv", "", "Moe"})
    EXPECT_EQ(model::op_family_index(other), -1) << other;
  std::array<int, model::kOpFamilyCount> per_family{};
  for (const model::OpName& o : model::kOpNames) ++per_family[size_t(o.family)];
  for (int f = 0; f < model::kOpFamilyCount; ++f) EXPECT_GT(per_family[size_t(f)], 0) << model::op_family_name(model::OpFamily(f));
  model::OpTimes t;
  EXPECT_TRUE(t.add("moe", 0.25));
  EXPECT_TRUE(t.add("moe", 0.5));
  EXPECT_TRUE(t.add("hc_mixes", 0.125));
  EXPECT_FALSE(t.add("markov_chain", 9.0));
  EXPECT_DOUBLE_EQ(t.s[size_t(model::OpFamily::kMoe)], 0.75);
  EXPECT_EQ(t.calls[size_t(model::OpFamily::kMoe)], 2u);
  EXPECT_EQ(t.calls[size_t(model::OpFamily::kMhc)], 1u);
  EXPECT_DOUBLE_EQ(t.total_s(), 0.875);
}

// The engine publishes its own steps' share: add_delta adds after - before, flags from after.
TEST(ExecutorStats, AddDelta) {
  model::ExecutorStats acc, before, after;
  acc.experts.drive = {1, 100};
  acc.ops.steps = 2;
  before.experts.hbm = {10, 1000};
  before.ops.s[size_t(model::OpFamily::kMoe)] = 1.0;
  before.ops.steps = 5;
  after = before;
  after.has_expert_traffic = after.has_op_times = true;
  after.experts.hbm = {13, 1300};
  after.experts.drive = {2, 250};
  after.ops.s[size_t(model::OpFamily::kMoe)] = 1.5;
  after.ops.calls[size_t(model::OpFamily::kMoe)] = 4;
  after.ops.steps = 6;
  after.has_engram = true;
  after.engram = {100, 3300, 70, 30, 0.25};
  before.engram = {40, 1320, 30, 10, 0.05};
  model::add_delta(acc, before, after);
  EXPECT_TRUE(acc.has_engram);
  EXPECT_EQ(acc.engram.rows, 60u);
  EXPECT_EQ(acc.engram.bytes, 1980u);
  EXPECT_EQ(acc.engram.hidden, 40u);
  EXPECT_EQ(acc.engram.exposed, 20u);
  EXPECT_DOUBLE_EQ(acc.engram.exposed_s, 0.2);
  EXPECT_TRUE(acc.has_expert_traffic && acc.has_op_times);
  EXPECT_EQ(acc.experts.hbm.lookups, 3u);
  EXPECT_EQ(acc.experts.hbm.bytes, 300u);
  EXPECT_EQ(acc.experts.drive.lookups, 3u);
  EXPECT_EQ(acc.experts.drive.bytes, 350u);
  EXPECT_DOUBLE_EQ(acc.ops.s[size_t(model::OpFamily::kMoe)], 0.5);
  EXPECT_EQ(acc.ops.calls[size_t(model::OpFamily::kMoe)], 4u);
  EXPECT_EQ(acc.ops.steps, 3u);
  // The memory ledger is what `after` holds; the drives' bytes read add up like the counters.
  acc.memory.has_host = true;
  acc.memory.host.sessions = 999;
  acc.memory.drive.expert_bytes_read = 7;
  before.memory.drive.expert_bytes_read = 100;
  after.memory.has_host = after.memory.has_drive = true;
  after.memory.host = {10, 20, 30, 2, 40, 50};
  after.memory.drive.expert_bytes_read = 160;
  model::add_delta(acc, before, after);
  EXPECT_TRUE(acc.memory.has_host && acc.memory.has_drive);
  EXPECT_FALSE(acc.memory.has_hbm);
  EXPECT_EQ(acc.memory.host.sessions, 30u);
  EXPECT_EQ(acc.memory.host.n_sessions, 2);
  EXPECT_EQ(acc.memory.host.total(), 150u);
  EXPECT_EQ(acc.memory.drive.expert_bytes_read, 67u);
}

// What the op clocks cost: the same steps with and without them, interleaved (printed; the
// assertion only guards against a gross regression such as a clock that syscalls per op).
TEST(ExecutorStats, OpClockCost) {
  auto ex = engine::make_executor("cpu", model_dir());
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  auto& m = static_cast<cpu::CpuModel&>(**ex);
  model::OpTimes sink;
  double with_s = 0, without_s = 0;
  int64_t n_steps = 0;
  for (int k = 0; k < 2; ++k) {  // warm-up (page faults of the mapped weights), not counted
    cpu::SessionCache s(m.config());
    ASSERT_TRUE(m.forward_cpu(rows(0, 8, 8, false), {&s}, nullptr, nullptr).ok());
  }
  for (int rep = 0; rep < 6; ++rep) {
    for (bool timed : {rep % 2 == 0, rep % 2 != 0}) {
      cpu::SessionCache s(m.config());
      const auto t0 = std::chrono::steady_clock::now();
      ASSERT_TRUE(m.forward_cpu(rows(0, 8, 8, false), {&s}, nullptr, timed ? &sink : nullptr).ok());
      for (int k = 0; k < 8; ++k) ASSERT_TRUE(m.forward_cpu(rows(8 + k, 1, 0, true), {&s}, nullptr, timed ? &sink : nullptr).ok());
      (timed ? with_s : without_s) += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (timed) n_steps += 9;
    }
  }
  uint64_t calls = 0;
  for (uint64_t c : sink.calls) calls += c;
  // The clock itself: two reads per op.
  const int kReads = 200000;
  const auto c0 = std::chrono::steady_clock::now();
  int64_t acc = 0;
  for (int i = 0; i < kReads; ++i) acc += std::chrono::steady_clock::now().time_since_epoch().count() & 1;
  const double read_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - c0).count() / kReads;
  const double step_ms = 1e3 * with_s / double(n_steps);
  const double clock_us_per_step = 2.0 * read_ns * double(calls) / double(n_steps) / 1e3;
  std::printf("op clocks: %.2f ops/step, %.1f ns per clock read -> %.2f us per step = %.4f%% of a %.3f ms tiny step; "
              "A/B wall: timed %.3f s, untimed %.3f s (%+.2f%%) [acc %lld]\n",
              double(calls) / double(n_steps), read_ns, clock_us_per_step, 100.0 * clock_us_per_step / (1e3 * step_ms), step_ms, with_s,
              without_s, 100.0 * (with_s - without_s) / without_s, (long long)acc);
  EXPECT_LT(clock_us_per_step, 0.02 * 1e3 * step_ms);  // under 2% even on the tiny model
}

}  // namespace
}  // namespace fb
