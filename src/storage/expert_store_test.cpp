#include "storage/expert_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <filesystem>
#include <fstream>

#include "loader/bind.h"
#include "loader/tiny_model.h"
#include "storage/drive_probe.h"
#include "storage/record_file.h"
#include "storage/route_sim.h"
#include "storage/tiered_experts.h"

namespace fb::storage {
namespace {

namespace fs = std::filesystem;

struct Tmp {
  fs::path p = fs::temp_directory_path() / ("fb_store_" + std::to_string(getpid()));
  Tmp() { fs::create_directories(p); }
  ~Tmp() { fs::remove_all(p); }
};

std::string checkpoint(const Tmp& t) {
  const fs::path fixture = fs::path(FB_SHARED_DIR) / "fixtures/tiny-s0/checkpoint";
  if (fs::exists(fixture)) {
    fs::copy(fixture, t.p / "snap");
  } else {
    loader::TinyModelOptions o;
    o.out_dir = (t.p / "snap").string();
    EXPECT_TRUE(loader::write_tiny_model(o).ok());
  }
  return (t.p / "snap").string();
}

// Every case starts from the tiny checkpoint copied into a temporary folder and opened.
class OpenCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = checkpoint(t);
    auto s = loader::Snapshot::open(dir);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    snap = std::move(*s);
  }
  Tmp t;
  std::string dir;
  std::unique_ptr<loader::Snapshot> snap;
};
using ExpertStoreTest = OpenCheckpoint;
using TieredExpertsTest = OpenCheckpoint;
using RecordFileTest = OpenCheckpoint;

bool same(const model::ExpertWeights& a, const model::ExpertWeights& b) {
  auto eq = [](const TensorView& x, const TensorView& y) {
    return x.dtype == y.dtype && x.shape == y.shape && std::memcmp(x.data, y.data, x.nbytes()) == 0;
  };
  return eq(a.w1.w, b.w1.w) && eq(a.w1.scale, b.w1.scale) && eq(a.w2.w, b.w2.w) && eq(a.w2.scale, b.w2.scale) && eq(a.w3.w, b.w3.w) &&
         eq(a.w3.scale, b.w3.scale);
}

TEST_F(ExpertStoreTest, ConvertValidateAndServeEveryExpert) {
  const std::string out = (t.p / "store0").string(), rep = (t.p / "store1").string();
  ASSERT_TRUE(write_expert_store(*snap, out, {rep}).ok());
  EXPECT_FALSE(fs::exists(out + "/experts.fbx.tmp"));
  const uint64_t id = *model_identity(dir);
  auto store = ExpertStore::open(out, id);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  EXPECT_EQ((*store)->layout().stride_bytes % 4096, 0u);
  EXPECT_FALSE(ExpertStore::open(out, id ^ 1).ok());  // another model's store is refused

  loader::SnapshotExperts direct(*snap);
  std::shared_ptr<const ExpertStore> shared(std::move(store.value()));
  for (int from_store = 0; from_store < 2; ++from_store) {
    TieredOptions o;
    o.slots_per_layer = 1;
    o.host_experts = 3;
    std::unique_ptr<ExpertLocator> loc = from_store ? store_locator(shared) : std::move(shard_locator(*snap).value());
    std::vector<std::string> roots = from_store ? std::vector<std::string>{out, rep} : std::vector<std::string>{dir};
    memory::Ledger ledger({1ull << 30, 1ull << 30});
    {
      auto tiers = TieredExperts::create(std::move(loc), roots, o, &ledger);
      ASSERT_TRUE(tiers.ok()) << tiers.status().to_string();
      const model::Config& c = snap->config();
      for (int pass = 0; pass < 2; ++pass)
        for (int l = 0; l < c.n_total_layers(); ++l)
          for (int e = 0; e < c.roles[size_t(l)].n_experts; e += 1 + pass) {
            ASSERT_TRUE(same((*tiers)->expert(l, e), direct.expert(l, e))) << "layer " << l << " expert " << e;
            auto lease = (*tiers)->acquire(l, e);
            if (lease.ok()) {
              ASSERT_TRUE(same(lease->weights(), direct.expert(l, e)));
            }
          }
      const TierStats s = (*tiers)->stats();
      EXPECT_GT(s.slot_misses, 0u);
      EXPECT_GT(s.drive_reads, 0u);
      EXPECT_LE(ledger.usage(memory::Tier::kHost).elastic_bytes, 3 * shared->layout().stride_bytes);
    }
    EXPECT_EQ(ledger.usage(memory::Tier::kHost).used_bytes(), 0u);
  }

  // host_views (the CUDA executor's source): views straight into the host cache records, valid
  // for the whole layer epoch (all of a layer's experts held at once, more than the cache has
  // records: the rest come from overflow buffers), the page-lock hooks called once per record.
  {
    TieredOptions o;
    o.slots_per_layer = 1;
    o.host_experts = 3;
    o.host_views = true;
    int64_t allocs = 0, frees = 0;
    o.on_host_alloc = [&](void*, size_t n) {
      ++allocs;
      EXPECT_EQ(n, shared->layout().stride_bytes);
    };
    o.on_host_free = [&](void*, size_t) { ++frees; };
    {
      auto tiers = TieredExperts::create(store_locator(shared), {out, rep}, o);
      ASSERT_TRUE(tiers.ok()) << tiers.status().to_string();
      const model::Config& c = snap->config();
      for (int pass = 0; pass < 2; ++pass)
        for (int l = 0; l < c.n_total_layers(); ++l) {
          std::vector<model::ExpertWeights> held;
          for (int e = 0; e < c.roles[size_t(l)].n_experts; ++e) held.push_back((*tiers)->expert(l, e));
          held.push_back((*tiers)->expert(l, 0));  // again in the same epoch: a host hit, pinned twice
          for (int e = 0; e < c.roles[size_t(l)].n_experts; ++e)
            ASSERT_TRUE(same(held[size_t(e)], direct.expert(l, e))) << "layer " << l << " expert " << e << " pass " << pass;
          ASSERT_TRUE(same(held.back(), direct.expert(l, 0)));
        }
      const TierStats s = (*tiers)->stats();
      EXPECT_EQ(s.slot_hits + s.slot_misses, 0u) << "host views never touch the first tier";
      EXPECT_GT(s.host_hits, 0u);
      EXPECT_GT(s.overflow, 0u);
      EXPECT_EQ(allocs, 3);
    }
    EXPECT_EQ(frees, allocs);
  }

  // epochs_kept = 2 (the CUDA executor's copies ahead of a predicted use): a layer's views stay
  // valid through the next layer's calls, which then find fewer free records (more overflow), and
  // are let go once a third layer's calls begin. ready() says whether a lookup would read a drive.
  {
    const model::Config& c = snap->config();
    ASSERT_GE(c.n_total_layers(), 3);
    uint64_t overflow[2] = {0, 0};
    for (int kept : {1, 2}) {
      TieredOptions o;
      o.slots_per_layer = 1;
      o.host_experts = 4;
      o.host_views = true;
      o.epochs_kept = kept;
      auto tiers = TieredExperts::create(store_locator(shared), {out, rep}, o);
      ASSERT_TRUE(tiers.ok()) << tiers.status().to_string();
      EXPECT_EQ((*tiers)->view_layers(), kept);
      for (int pass = 0; pass < 2; ++pass)
        for (int l = 0; l + 1 < c.n_total_layers(); ++l) {
          std::vector<model::ExpertWeights> held;
          for (int e = 0; e < 2; ++e) held.push_back((*tiers)->expert(l, e));
          EXPECT_TRUE((*tiers)->ready(l, 0));
          std::vector<model::ExpertWeights> next;  // the next layer's calls while `held` may still be read
          for (int e = 0; e < c.roles[size_t(l + 1)].n_experts; ++e) next.push_back((*tiers)->expert(l + 1, e));
          if (kept == 2)
            for (int e = 0; e < 2; ++e) ASSERT_TRUE(same(held[size_t(e)], direct.expert(l, e))) << "layer " << l << " expert " << e;
          for (int e = 0; e < c.roles[size_t(l + 1)].n_experts; ++e) ASSERT_TRUE(same(next[size_t(e)], direct.expert(l + 1, e)));
        }
      overflow[kept - 1] = (*tiers)->stats().overflow;
    }
    EXPECT_GT(overflow[1], overflow[0]) << "two layers' pins leave fewer records to the next layer";
  }

  // A corrupted record fails its checksum; a truncated copy fails on open.
  {
    std::fstream f(rep + "/experts.fbx", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(shared->record_offset(0, 1) + 10));
    f.put('\x5a');
  }
  auto reader = ReplicaReader::open({rep});
  auto rep_store = ExpertStore::open(rep, id);
  ASSERT_TRUE(rep_store.ok());
  EXPECT_EQ((*rep_store)->verify_all(**reader).code(), StatusCode::kCorrupt);
  fs::resize_file(rep + "/experts.fbx", fs::file_size(rep + "/experts.fbx") - 4096);
  EXPECT_EQ(ExpertStore::open(rep, id).status().code(), StatusCode::kCorrupt);
}

// Convert's progress covers every phase (issue 24): the experts written into the first folder,
// the replica's copy in bytes up to the file's size, then each copy's records read back, in that
// order, each phase counting up from 0 to its total.
TEST_F(ExpertStoreTest, ProgressCoversWriteCopyAndValidate) {
  const std::string a = (t.p / "pa").string(), b = (t.p / "pb").string();
  std::vector<ConvertProgress> seen;
  ASSERT_TRUE(write_expert_store(*snap, a, {b}, [&](const ConvertProgress& p) { seen.push_back(p); }).ok());
  using Phase = ConvertProgress::Phase;
  const int64_t file_bytes = int64_t(fs::file_size(b + "/experts.fbx"));
  int64_t n_experts = 0;
  for (int l = 0; l < snap->config().n_total_layers(); ++l) n_experts += snap->config().roles[size_t(l)].n_experts;
  // The phases in order, as (phase, dir) runs.
  std::vector<std::pair<Phase, std::string>> runs;
  for (const ConvertProgress& p : seen)
    if (runs.empty() || runs.back() != std::make_pair(p.phase, p.dir)) runs.push_back({p.phase, p.dir});
  const std::vector<std::pair<Phase, std::string>> want = {{Phase::kWrite, a}, {Phase::kCopy, b}, {Phase::kValidate, a}, {Phase::kValidate, b}};
  ASSERT_EQ(runs, want);
  for (const auto& run : runs) {
    int64_t last = -1, total = -1;
    for (const ConvertProgress& p : seen) {
      if (std::make_pair(p.phase, p.dir) != run) continue;
      EXPECT_GE(p.done, last) << p.dir;  // never backwards
      EXPECT_LE(p.done, p.total) << p.dir;
      last = p.done;
      total = p.total;
    }
    EXPECT_EQ(last, total) << run.second;  // each phase ends at its total
    EXPECT_EQ(total, run.first == Phase::kCopy ? file_bytes : n_experts) << run.second;
  }
}


// Reads started by prefetch() (the executor's hint once the router has run) land in the host
// cache or prefetch buffers and are taken by the expert() calls; a prefetch nobody asks for is
// finished and counted unused when the next layer starts; bytes always equal the snapshot's. A
// replica unlinked mid-run (fault hook) and a record with bad bytes on one replica (checksum) are
// served by the other replica.
TEST_F(TieredExpertsTest, PrefetchFailoverAndChecksums) {
  const std::string a = (t.p / "a").string(), b = (t.p / "b").string();
  ASSERT_TRUE(write_expert_store(*snap, a, {b}).ok());
  loader::SnapshotExperts direct(*snap);
  const model::Config& c = snap->config();
  auto fresh = [&](const std::string& name) {  // replicas of their own (faults change the files)
    std::vector<std::string> d{(t.p / (name + "0")).string(), (t.p / (name + "1")).string()};
    for (const std::string& x : d) {
      fs::remove_all(x);
      fs::create_directories(x);
      fs::copy_file(a + "/experts.fbx", x + "/experts.fbx");
    }
    return d;
  };
  for (int views = 0; views < 2; ++views) {
    TieredOptions o;
    o.slots_per_layer = 1;
    o.host_experts = 3;
    o.host_views = views;
    o.prefetch_buffers = 2;
    // Drive 0 serves the run's first read (equal estimates: the lowest index); when that read
    // completes its file is unlinked, with every other read of the run still to do. (A later
    // fault is not certain to be seen: the rate estimates may send every later read to drive 1.)
    o.faults = {*parse_reader_fault("0@0:unlink")};
    const std::vector<std::string> d = fresh("p" + std::to_string(views));
    auto tiers = tiered_experts_for(*snap, d, o);
    ASSERT_TRUE(tiers.ok()) << tiers.status().to_string();
    for (int pass = 0; pass < 2; ++pass)
      for (int l = 0; l < c.n_total_layers(); ++l) {
        const int E = c.roles[size_t(l)].n_experts;
        std::vector<int> pick;
        for (int e = pass; e < E; e += 2) pick.push_back(e);
        (*tiers)->prefetch(l, pick);
        std::vector<model::ExpertWeights> held;  // views stay valid for the layer's epoch
        for (size_t i = 0; i + 1 < pick.size(); ++i) held.push_back((*tiers)->expert(l, pick[i]));  // the last one is never asked for
        for (size_t i = 0; i < held.size(); ++i)
          ASSERT_TRUE(same(held[i], direct.expert(l, pick[i]))) << "layer " << l << " expert " << pick[i] << " views " << views;
      }
    (*tiers)->expert(0, 0);  // a new epoch: the last layer's unused prefetch is retired
    const TierStats s = (*tiers)->stats();
    EXPECT_GT(s.prefetch_reads, 0u);
    EXPECT_GT(s.prefetch_used, 0u);
    EXPECT_GT(s.prefetch_unused, 0u);
    EXPECT_EQ(s.prefetch_used + s.prefetch_unused, s.prefetch_reads);
    EXPECT_TRUE((*tiers)->reader().stats(0).failed) << (*tiers)->drive_report();
    EXPECT_FALSE(fs::exists(d[0] + "/experts.fbx"));
    EXPECT_NE((*tiers)->drive_report().find("FAILED"), std::string::npos);
  }
  {  // prefetch off: same bytes, nothing prefetched
    TieredOptions o;
    o.slots_per_layer = 1;
    o.host_experts = 3;
    o.prefetch = false;
    auto tiers = tiered_experts_for(*snap, {a, b}, o);
    ASSERT_TRUE(tiers.ok());
    (*tiers)->prefetch(1, {0, 1, 2});
    ASSERT_TRUE(same((*tiers)->expert(1, 2), direct.expert(1, 2)));
    EXPECT_EQ((*tiers)->stats().prefetch_reads, 0u);
    EXPECT_GT((*tiers)->stats().drive_reads, 0u);
  }
  {  // bad bytes in drive 0's copy of expert 1 of layer 0 (the first chunk goes to drive 0)
    const std::vector<std::string> d = fresh("crc");
    auto store = ExpertStore::open(d[0]);
    ASSERT_TRUE(store.ok());
    {
      std::fstream f(d[0] + "/experts.fbx", std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(std::streamoff((*store)->record_offset(0, 1) + 10));
      const char x = char(f.peek() ^ 0x5a);
      f.seekp(std::streamoff((*store)->record_offset(0, 1) + 10));
      f.put(x);
    }
    TieredOptions o;
    o.slots_per_layer = 1;
    o.host_experts = 3;
    // no hedging: on a loaded machine drive 0's read can pass the 2 ms hedge deadline, and the good
    // copy from drive 1 then lands first and the damaged bytes are never checked (a flaky failure)
    o.reader.hedge = false;
    auto tiers = tiered_experts_for(*snap, d, o);
    ASSERT_TRUE(tiers.ok());
    ASSERT_TRUE(same((*tiers)->expert(0, 1), direct.expert(0, 1)));
    EXPECT_EQ((*tiers)->stats().checksum_failovers, 1u);
    EXPECT_TRUE((*tiers)->reader().stats(0).failed);
    EXPECT_NE((*tiers)->reader().stats(0).last_error.find("checksum"), std::string::npos);
    for (int e = 0; e < c.roles[0].n_experts; ++e) ASSERT_TRUE(same((*tiers)->expert(0, e), direct.expert(0, e)));
  }
  {  // a replica gone before start is left out; a fault named for it is moot
    const std::vector<std::string> d = fresh("gone");
    fs::remove(d[0] + "/experts.fbx");
    TieredOptions o;
    o.slots_per_layer = 1;
    o.faults = {*parse_reader_fault("0@0:eio")};
    auto tiers = tiered_experts_for(*snap, d, o);
    ASSERT_TRUE(tiers.ok()) << tiers.status().to_string();
    EXPECT_EQ((*tiers)->reader().n_drives(), 1);
    ASSERT_TRUE(same((*tiers)->expert(2, 3), direct.expert(2, 3)));
    fs::remove(d[1] + "/experts.fbx");
    EXPECT_EQ(tiered_experts_for(*snap, d, o).status().code(), StatusCode::kIo);
  }
}

// The bench's record file: a few records of real expert bytes, every (layer, expert) of the model
// mapped onto one of them; the tiers read each expert's record from two replica files.
// The drive-tier bench's warm-up (bench/drive_tier.h): host cache lookups replayed without bytes
// (replay_lookup), then the records the cache holds read from the drives (fill_host), leave the
// cache as the same lookups through the drives (expert(), reads when asked) do, for one read per
// record held, and every record then serves its expert's bytes with no drive read; a record
// replayed but not filled yet is read when asked. And the plan's model of the policy
// (storage::SlotSim's host tier) counts the host hits and drive reads these tiers count for the
// same slot misses.
TEST_F(TieredExpertsTest, ReplayedWarmUpAndTheSimulatedHostCache) {
  const std::string a = (t.p / "a").string(), b = (t.p / "b").string();
  ASSERT_TRUE(write_expert_store(*snap, a, {b}).ok());
  loader::SnapshotExperts direct(*snap);
  const model::Config& c = snap->config();
  std::vector<int> layers;
  for (int l = 0; l < c.n_layers; ++l)
    if (c.roles[size_t(l)].n_experts > 2) layers.push_back(l);
  ASSERT_GE(layers.size(), 2u);
  const int E = c.roles[size_t(layers[0])].n_experts, k = c.n_activated_experts;
  constexpr int kHost = 5;
  auto make = [&](bool views) -> std::shared_ptr<TieredExperts> {
    TieredOptions o;
    o.slots_per_layer = 1;
    o.host_experts = kHost;
    o.host_views = views;
    o.prefetch = false;
    auto x = tiered_experts_for(*snap, {a, b}, o);
    EXPECT_TRUE(x.ok()) << x.status().to_string();
    return x.ok() ? *x : nullptr;
  };
  // Slot misses of 2 LFU slots per layer over skewed routing (the executor's calls), and the
  // simulation of the same calls with the host cache under the slots.
  ZipfRouting r(c.n_total_layers(), E, 5);
  r.set_skew(0.5, 2);
  std::vector<SlotCache> hbm;
  for (int l = 0; l < c.n_total_layers(); ++l) hbm.emplace_back(2, EvictionPolicy::kLfu, 64);
  SlotSimOptions so;
  so.slots = 2;
  so.aging = 64;
  so.top_k = k;
  so.host_records = kHost;
  SlotSim sim(c.n_total_layers(), so);
  std::vector<std::pair<int, int>> misses;
  std::vector<int32_t> ids(static_cast<size_t>(k));
  for (int step = 0; step < 60; ++step)
    for (int l : layers) {
      r.draw(l, ids, 1, k);
      replay_call(hbm[size_t(l)], ids, 0, [&](const WaveTake& w) {
        if (!w.hit) misses.push_back({l, w.expert});
      });
      sim.call(l, ids);
    }
  auto real = make(true), warm = make(true);
  ASSERT_TRUE(real && warm);
  for (const auto& [l, e] : misses) (void)real->expert(l, e);
  for (const auto& [l, e] : misses) ASSERT_TRUE(warm->replay_lookup(l, e).ok());
  const TierStats rs = real->stats();
  EXPECT_GT(rs.host_hits, 0u);
  EXPECT_GT(rs.drive_reads, uint64_t(kHost));
  EXPECT_EQ(sim.host_hits(), rs.host_hits);
  EXPECT_EQ(sim.drive_reads(), rs.drive_reads);
  EXPECT_EQ(sim.lookups() - uint64_t(misses.size()), uint64_t(sim.result().hit_rate * double(sim.lookups()) + 0.5));

  EXPECT_EQ(warm->host_records_filled(), 0);
  const Result<int64_t> filled = warm->fill_host(3);
  ASSERT_TRUE(filled.ok()) << filled.status().to_string();
  int64_t held = 0;
  for (int l : layers)
    for (int e = 0; e < E; ++e) {
      EXPECT_EQ(warm->resident(l, e), real->resident(l, e)) << "layer " << l << " expert " << e;
      held += real->resident(l, e);
    }
  EXPECT_EQ(*filled, held);
  EXPECT_EQ(held, kHost);
  EXPECT_EQ(warm->host_records_filled(), held);
  TierStats ws = warm->stats();
  EXPECT_EQ(ws.drive_reads, 0u);
  EXPECT_EQ(ws.warm_reads, uint64_t(held));
  EXPECT_EQ(ws.warm_lookups, uint64_t(misses.size()));
  for (int l : layers)
    for (int e = 0; e < E; ++e)
      if (warm->resident(l, e)) {
        ASSERT_TRUE(same(warm->expert(l, e), direct.expert(l, e))) << "layer " << l << " expert " << e;
      }
  ws = warm->stats();
  EXPECT_EQ(ws.drive_reads, 0u);
  EXPECT_EQ(ws.host_hits, uint64_t(held));

  // Replayed, not filled: not resident, and read (a host miss) when asked.
  auto stale = make(true);
  ASSERT_TRUE(stale);
  const auto [l0, e0] = misses.front();
  ASSERT_TRUE(stale->replay_lookup(l0, e0).ok());
  EXPECT_FALSE(stale->resident(l0, e0));
  ASSERT_TRUE(same(stale->expert(l0, e0), direct.expert(l0, e0)));
  EXPECT_EQ(stale->stats().drive_reads, 1u);
  EXPECT_EQ(stale->stats().host_hits, 0u);
  EXPECT_TRUE(stale->resident(l0, e0));
  EXPECT_EQ(*stale->fill_host(), 0);  // nothing stale is left

  auto no_views = make(false);
  ASSERT_TRUE(no_views);
  EXPECT_EQ(no_views->replay_lookup(l0, e0).code(), StatusCode::kInvalidArgument);
}

TEST_F(RecordFileTest, CyclicRecordsThroughTheTiers) {
  const model::Config& c = snap->config();
  loader::SnapshotExperts direct(*snap);
  auto lay = expert_layout(*snap);
  ASSERT_TRUE(lay.ok());
  int first = -1;
  std::vector<int> n_experts;
  for (int l = 0; l < c.n_total_layers(); ++l) {
    n_experts.push_back(c.roles[size_t(l)].n_experts);
    if (first < 0 && n_experts.back() > 0) first = l;
  }
  const int R = 3;
  std::vector<std::string> roots;
  for (int i = 0; i < 2; ++i) {
    roots.push_back((t.p / ("rf" + std::to_string(i))).string());
    fs::create_directories(roots.back());
    ASSERT_TRUE(write_record_file(roots.back() + "/records.bin", *lay, R, [&](int r) { return direct.expert(first, r); }).ok());
  }
  EXPECT_EQ(fs::file_size(roots[0] + "/records.bin"), R * lay->stride_bytes);
  TieredOptions o;
  o.slots_per_layer = 1;
  o.host_experts = 2;
  o.host_views = true;
  auto tiers = TieredExperts::create(cyclic_locator(*lay, n_experts, R, "records.bin"), roots, o);
  ASSERT_TRUE(tiers.ok());
  for (int l = 0; l < c.n_total_layers(); ++l) {
    if (n_experts[size_t(l)] == 0) continue;
    std::vector<int> all;
    for (int e = 0; e < n_experts[size_t(l)]; ++e) all.push_back(e);
    (*tiers)->prefetch(l, all);
    for (int e = 0; e < n_experts[size_t(l)]; ++e)
      ASSERT_TRUE(same((*tiers)->expert(l, e), direct.expert(first, cyclic_record(l, e, R)))) << "layer " << l << " expert " << e;
  }
  EXPECT_GT((*tiers)->stats().prefetch_used, 0u);
  (*tiers)->set_prefetch(false);
  const uint64_t before = (*tiers)->stats().prefetch_reads;
  (*tiers)->prefetch(first, {0, 1});
  EXPECT_EQ((*tiers)->stats().prefetch_reads, before);
  std::vector<model::ExpertWeights> w;
  auto bad = write_record_file((t.p / "nodir/x.bin").string(), *lay, 1, [&](int) { return direct.expert(first, 0); });
  EXPECT_EQ(bad.code(), StatusCode::kIo);
}

// probe --store: the reader's pattern on the records the tier will read, in place. The store's
// experts.fbx on each replica (records from data_start(), its stride) and the drive bench's
// records.bin (from 0, the stride asked for) are found and read record by record, nothing
// written; a dir with neither, a records.bin without a record size or a whole record, and
// replicas laid out differently are refused.
TEST_F(ExpertStoreTest, ProbeReadsTheStoreInPlace) {
  const std::string a = (t.p / "pa").string(), b = (t.p / "pb").string(), c = (t.p / "pc").string(), none = (t.p / "pn").string();
  fs::create_directories(c);
  fs::create_directories(none);
  ASSERT_TRUE(write_expert_store(*snap, a, {b}).ok());
  auto store = ExpertStore::open(a);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  const uint64_t stride = (*store)->layout().stride_bytes, base = (*store)->data_start();
  const uint64_t n = uint64_t((*store)->n_records());
  ASSERT_GT(n, 0u);
  // data_start() and n_records() span record_offset's records exactly: the first record at base,
  // the last one ending at base + n x stride.
  int first = -1, last = -1;
  for (int l = 0; l < (*store)->n_layers(); ++l)
    if ((*store)->n_experts(l) > 0) {
      if (first < 0) first = l;
      last = l;
    }
  ASSERT_GE(first, 0);
  EXPECT_EQ((*store)->record_offset(first, 0), base);
  EXPECT_EQ((*store)->record_offset(last, (*store)->n_experts(last) - 1) + stride, base + n * stride);
  auto slurp = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  const std::string before = slurp(a + "/" + kStoreFile);
  auto files = record_files_in({a, b}, 12345);
  ASSERT_TRUE(files.ok()) << files.status().to_string();
  ASSERT_EQ(files->paths.size(), 2u);
  EXPECT_EQ(files->paths[0], a + "/" + kStoreFile);
  EXPECT_EQ(files->base, base);
  EXPECT_EQ(files->n_records, n);
  EXPECT_EQ(files->record_bytes, stride) << "a store's records are its stride, whatever size was asked";
  ReaderOptions ro;
  ro.chunk_bytes = 4096;  // several chunks a record when records are larger
  ro.queue_depth_per_drive = 3;
  DriveProbeShape shape = reader_probe_shape(ro, 1);
  size_t reads = 0;
  shape.on_read = [&](size_t f, uint64_t off, uint32_t len) {
    ++reads;
    EXPECT_LT(f, 2u);
    EXPECT_GE(off, base);
    EXPECT_LE(off + len, base + n * stride) << "a read past the records";
    EXPECT_EQ((off - base) % 4096, 0u);
  };
  auto rate = probe_record_files(*files, 0.1, shape);
  ASSERT_TRUE(rate.ok()) << rate.status().to_string();
  EXPECT_GT(*rate, 0.0);
  EXPECT_GE(reads, 6u);
  EXPECT_EQ(slurp(a + "/" + kStoreFile), before) << "the probe wrote to the store";
  // The drive bench's flat record file: from offset 0, records of the size asked (rounded to 4 KiB),
  // a partial record at the end not counted.
  {
    std::ofstream f(c + "/records.bin", std::ios::binary);
    const std::string bytes(size_t(3 * 8192 + 100), 'x');
    f.write(bytes.data(), std::streamsize(bytes.size()));
  }
  auto flat = record_files_in({c}, 8000);
  ASSERT_TRUE(flat.ok()) << flat.status().to_string();
  EXPECT_EQ(flat->paths[0], c + "/records.bin");
  EXPECT_EQ(flat->base, 0u);
  EXPECT_EQ(flat->record_bytes, 8192u);
  EXPECT_EQ(flat->n_records, 3u);
  shape.on_read = [&](size_t, uint64_t off, uint32_t len) { EXPECT_LE(off + len, 3u * 8192u); };
  EXPECT_TRUE(probe_record_files(*flat, 0.05, shape).ok());
  EXPECT_EQ(record_files_in({c}, 0).status().code(), StatusCode::kInvalidArgument) << "records.bin needs the record size";
  EXPECT_EQ(record_files_in({c}, 1 << 20).status().code(), StatusCode::kInvalidArgument) << "no whole record";
  EXPECT_EQ(record_files_in({none}, 8000).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(record_files_in({}, 8000).status().code(), StatusCode::kInvalidArgument);
  if (base != 0 || stride != 8192) EXPECT_FALSE(record_files_in({a, c}, 8000).ok()) << "replicas laid out differently";
  EXPECT_FALSE(probe_record_files(RecordFiles{}, 0.05, shape).ok());
}

// Reads started at routing time hide drive latency: a drive that serves one record per 20 ms,
// four records of a layer. Prefetched, then 120 ms of "compute", the expert() calls wait for
// (almost) nothing; read when asked, they wait about 4 x 20 ms. The exposed-wait counter tells.
TEST_F(TieredExpertsTest, PrefetchHidesASlowDrive) {
  const std::string a = (t.p / "a").string();
  ASSERT_TRUE(write_expert_store(*snap, a, {}).ok());
  const model::Config& c = snap->config();
  loader::SnapshotExperts direct(*snap);
  int layer = -1;
  for (int l = 0; l < c.n_total_layers() && layer < 0; ++l)
    if (c.roles[size_t(l)].n_experts >= 4) layer = l;
  ASSERT_GE(layer, 0);
  const std::vector<int> four{0, 1, 2, 3};
  double wait_ms[2] = {0, 0};
  for (int arm = 0; arm < 2; ++arm) {
    TieredOptions o;
    o.slots_per_layer = 1;
    o.host_experts = 8;
    o.prefetch = arm == 0;
    o.faults = {*parse_reader_fault("0@0:delay=20000")};
    auto tiers = tiered_experts_for(*snap, {a}, o);
    ASSERT_TRUE(tiers.ok()) << tiers.status().to_string();
    (*tiers)->prefetch(layer, four);
    std::this_thread::sleep_for(std::chrono::milliseconds(120));
    for (int e : four) ASSERT_TRUE(same((*tiers)->expert(layer, e), direct.expert(layer, e))) << "expert " << e << " arm " << arm;
    const TierStats s = (*tiers)->stats();
    EXPECT_EQ(s.drive_reads, 4u);
    EXPECT_EQ(s.prefetch_reads, arm == 0 ? 4u : 0u);
    wait_ms[arm] = double(s.drive_wait_ns) / 1e6;
  }
  std::fprintf(stderr, "exposed drive wait: %.1f ms prefetched, %.1f ms read when asked\n", wait_ms[0], wait_ms[1]);
  EXPECT_GE(wait_ms[1], 60.0) << "read when asked: four reads of 20 ms";
  EXPECT_LT(wait_ms[0], wait_ms[1] / 2) << "prefetched " << wait_ms[0] << " ms, asked " << wait_ms[1] << " ms";
}

}  // namespace
}  // namespace fb::storage
