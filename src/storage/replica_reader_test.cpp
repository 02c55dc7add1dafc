#include "storage/replica_reader.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "storage/drive_probe.h"
#include "storage/slot_cache.h"

namespace fb::storage {
namespace {

namespace fs = std::filesystem;

struct TempDrives {
  fs::path root;
  std::vector<std::string> drives;
  std::vector<uint8_t> bytes;
  TempDrives(int n, size_t size, const fs::path& base = fs::temp_directory_path()) {
    root = base / ("fb_reader_" + std::to_string(getpid()) + "_" + std::to_string(std::random_device{}()));
    std::mt19937_64 rng(99);
    bytes.resize(size);
    for (auto& b : bytes) b = uint8_t(rng());
    for (int i = 0; i < n; ++i) {
      fs::path d = root / ("drive" + std::to_string(i));
      fs::create_directories(d / "sub");
      std::ofstream(d / "sub/data.bin", std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(size));
      drives.push_back(d.string());
    }
  }
  ~TempDrives() { fs::remove_all(root); }
};

void expect_range(const TempDrives& t, ReplicaReader& r, uint64_t off, uint64_t n, bool aligned_dst) {
  AlignedBuffer buf(n + 4096);
  uint8_t* dst = buf.data() + (aligned_dst ? 0 : 3);
  ASSERT_TRUE(r.read({{"sub/data.bin", off, n, dst}}).ok());
  ASSERT_EQ(std::memcmp(dst, t.bytes.data() + off, n), 0) << "off " << off << " n " << n;
}

class Reader : public ::testing::TestWithParam<bool> {
 protected:
  // Every case runs on both engines (the parameter: io_uring or the thread pool).
  ReaderOptions options(uint32_t chunk_bytes) const {
    ReaderOptions o;
    o.use_uring = GetParam();
    o.chunk_bytes = chunk_bytes;
    return o;
  }
  // A reader over t's drives that sends every chunk to drive 0 first (where a case injects faults).
  Result<std::unique_ptr<ReplicaReader>> open_drive0_first(const TempDrives& t, uint32_t chunk_bytes) const {
    auto r = ReplicaReader::open(t.drives, options(chunk_bytes));
    if (r.ok()) (*r)->set_rate(0, 1e12);
    return r;
  }
};

TEST_P(Reader, ReadsAlignedAndUnalignedRanges) {
  TempDrives t(3, (8u << 20) + 12345);
  auto r = ReplicaReader::open(t.drives, options(256 << 10));
  ASSERT_TRUE(r.ok());
  expect_range(t, **r, 0, 4 << 20, true);
  expect_range(t, **r, 4096 * 5, 1 << 20, true);
  expect_range(t, **r, 17, 1000003, false);
  expect_range(t, **r, t.bytes.size() - 777, 777, false);  // a tail past the last aligned block
  // Several ranges in one call; chunks spread over the drives.
  AlignedBuffer a(1 << 20), b(1 << 20);
  ASSERT_TRUE((*r)->read({{"sub/data.bin", 0, 1 << 20, a.data()}, {"sub/data.bin", 3 << 20, 1 << 20, b.data()}}).ok());
  EXPECT_EQ(std::memcmp(b.data(), t.bytes.data() + (3 << 20), 1 << 20), 0);
  uint64_t total = 0;
  for (int d = 0; d < 3; ++d) total += (*r)->stats(d).bytes_read;
  EXPECT_GT(total, 7u << 20);
  for (int d = 0; d < 3; ++d) EXPECT_GT((*r)->stats(d).bytes_per_s, 0);
}

TEST_P(Reader, SurvivesAnInjectedErrorAndFailsWhenNoReplicaRemains) {
  TempDrives t(2, 4u << 20);
  auto r = open_drive0_first(t, 64 << 10);
  ASSERT_TRUE(r.ok());
  (*r)->inject_error(0, 3);
  expect_range(t, **r, 0, 4 << 20, true);
  EXPECT_TRUE((*r)->stats(0).failed);
  EXPECT_FALSE((*r)->stats(1).failed);
  (*r)->inject_error(1, 2);
  AlignedBuffer buf(1 << 20);
  Status st = (*r)->read({{"sub/data.bin", 0, 1 << 20, buf.data()}});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kIo);
  EXPECT_NE(st.message().find("no replica left"), std::string::npos) << st.message();
}

TEST_P(Reader, SurvivesAFileRemovedMidRead) {
  TempDrives t(3, 6u << 20);
  ReaderOptions o = options(64 << 10);
  bool removed = false;
  o.on_complete = [&](int drive, uint64_t n) {
    if (drive == 0 && n == 2 && !removed) {
      fs::remove(fs::path(t.drives[0]) / "sub/data.bin");
      removed = true;
    }
  };
  auto r = ReplicaReader::open(t.drives, o);
  ASSERT_TRUE(r.ok());
  (*r)->set_rate(0, 1e12);
  expect_range(t, **r, 0, 6 << 20, true);
  EXPECT_TRUE(removed);
  EXPECT_TRUE((*r)->stats(0).failed);
  EXPECT_NE((*r)->stats(0).last_error.find("vanished"), std::string::npos) << (*r)->stats(0).last_error;
  // A whole drive gone before the read: the open fails, the other replicas serve.
  fs::remove_all(t.drives[1]);
  expect_range(t, **r, 1 << 20, 2 << 20, true);
  EXPECT_TRUE((*r)->stats(1).failed);
}

TEST_P(Reader, HedgesOverdueChunksAndKeepsBytesRight) {
  TempDrives t(2, 8u << 20);
  ReaderOptions o = options(128 << 10);
  o.hedge_factor = 0;
  o.hedge_min_us = 0;  // every chunk still in flight at the first wait is hedged
  auto r = ReplicaReader::open(t.drives, o);
  ASSERT_TRUE(r.ok());
  // Whether a chunk is still in flight at the first wait depends on timing (a loaded machine can
  // complete a whole range in one wait), so read until hedging happened, bytes checked each time.
  uint64_t hedges = 0;
  for (int round = 0; round < 50 && hedges == 0; ++round) {
    for (int i = 0; i < 4; ++i) expect_range(t, **r, uint64_t(i) << 20, 2 << 20, true);
    hedges = (*r)->stats(0).n_hedges + (*r)->stats(1).n_hedges;
  }
  if (std::string((*r)->engine_name()) == "io_uring") EXPECT_GT(hedges, 0u);
  AlignedBuffer buf(1 << 20);
  ASSERT_TRUE((*r)->drain(buf.data(), buf.size()).ok());
}

TEST_P(Reader, FallsBackWhenODirectIsRefused) {
  if (!fs::exists("/dev/shm")) GTEST_SKIP() << "no tmpfs";
  TempDrives t(1, 1u << 20, "/dev/shm");
  ReaderOptions o;
  o.use_uring = GetParam();
  auto r = ReplicaReader::open(t.drives, o);
  ASSERT_TRUE(r.ok());
  expect_range(t, **r, 5, 100000, false);
  expect_range(t, **r, 0, 1 << 20, true);
}

// A replica truncated mid-run (the real file, through the fault hook): reads past its new end
// fail on that drive and are served by the other replica, bytes unchanged.
TEST_P(Reader, SurvivesAReplicaTruncatedMidRead) {
  TempDrives t(2, 4u << 20);
  auto r = open_drive0_first(t, 64 << 10);
  ASSERT_TRUE(r.ok());
  (*r)->inject(*parse_reader_fault("0@2:truncate"));
  expect_range(t, **r, 0, 4 << 20, true);
  EXPECT_EQ(fs::file_size(fs::path(t.drives[0]) / "sub/data.bin"), (4u << 20) / 2);
  EXPECT_TRUE((*r)->stats(0).failed);
  EXPECT_GE((*r)->stats(0).n_errors, 1u);
  EXPECT_NE((*r)->stats(0).last_error.find("truncated"), std::string::npos) << (*r)->stats(0).last_error;
  EXPECT_GT((*r)->stats(1).bytes_read, 0u);
  // The same fault through unlink: the third replica serves.
  TempDrives u(3, 2u << 20);
  auto r2 = ReplicaReader::open(u.drives, options(64 << 10));
  ASSERT_TRUE(r2.ok());
  (*r2)->set_rate(1, 1e12);
  (*r2)->inject(*parse_reader_fault("1@1:unlink"));
  expect_range(u, **r2, 0, 2 << 20, true);
  EXPECT_FALSE(fs::exists(fs::path(u.drives[1]) / "sub/data.bin"));
  EXPECT_TRUE((*r2)->stats(1).failed);
}

// A slow drive (each read takes 40 ms, simulated by holding its completions back): with hedging
// its overdue chunks are read from the other replica and the read finishes long before the slow
// drive would have; its rate estimate falls so that new chunks go elsewhere. Without hedging the
// same read waits for the slow drive (the simulation really delays).
TEST_P(Reader, HedgesAroundASlowDrive) {
  TempDrives t(2, 2u << 20);
  auto timed_read = [&](bool hedge, double* slow_rate, double* fast_rate, uint64_t* won) {
    ReaderOptions o = options(128 << 10);
    o.hedge = hedge;
    o.hedge_min_us = 1000;
    o.caller_drains = true;
    auto r = ReplicaReader::open(t.drives, o);
    EXPECT_TRUE(r.ok());
    (*r)->inject(*parse_reader_fault("0@0:delay=40000"));
    // A buffer per read: reading into memory a straggler still targets would wait for it.
    std::vector<AlignedBuffer> bufs;
    for (int i = 0; i < 3; ++i) bufs.emplace_back(2 << 20);
    const auto t0 = std::chrono::steady_clock::now();
    for (AlignedBuffer& buf : bufs) {
      EXPECT_TRUE((*r)->read({{"sub/data.bin", 0, 2 << 20, buf.data()}}).ok());
      EXPECT_EQ(std::memcmp(buf.data(), t.bytes.data(), 2 << 20), 0);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    *won = (*r)->stats(1).n_hedges_won;
    for (AlignedBuffer& buf : bufs) EXPECT_TRUE((*r)->drain(buf.data(), buf.size()).ok());  // late reads land before the buffers go
    *slow_rate = (*r)->stats(0).bytes_per_s;  // the late reads measured the slow drive too
    *fast_rate = (*r)->stats(1).bytes_per_s;
    return s;
  };
  double slow = 0, fast = 0, slow_nh = 0, fast_nh = 0;
  uint64_t won = 0, won_nh = 0;
  const double hedged = timed_read(true, &slow, &fast, &won);
  const double unhedged = timed_read(false, &slow_nh, &fast_nh, &won_nh);
  EXPECT_GT(won, 0u);
  EXPECT_EQ(won_nh, 0u);
  EXPECT_LT(slow, 128e3 / 0.040 * 1.5) << "the slow drive's estimate (128 KiB per 40 ms)";
  EXPECT_LT(slow, fast) << "the slow drive's estimate";
  EXPECT_LT(slow_nh, fast_nh) << "the slow drive's estimate, no hedging";
  EXPECT_GE(unhedged, 0.2) << "at least 5 reads waited 40 ms on the slow drive";
  EXPECT_LT(hedged, unhedged / 2) << "hedged " << hedged << " s, unhedged " << unhedged << " s";
}

// Jobs run side by side: three submitted, waited for in reverse order; an only_drive read uses
// that drive alone and fails when it has failed (no retry elsewhere).
TEST_P(Reader, AsyncJobsAndSingleDriveReads) {
  TempDrives t(2, 6u << 20);
  auto r = ReplicaReader::open(t.drives, options(256 << 10));
  ASSERT_TRUE(r.ok());
  std::vector<AlignedBuffer> bufs;
  std::vector<ReplicaReader::Job> jobs;
  for (int i = 0; i < 3; ++i) {
    bufs.emplace_back(2 << 20);
    auto j = (*r)->submit({{"sub/data.bin", uint64_t(i) << 21, 2 << 20, bufs.back().data()}});
    ASSERT_TRUE(j.ok());
    jobs.push_back(*j);
  }
  bool polled = false;
  for (int k = 0; k < 100000 && !polled; ++k) polled = (*r)->poll(jobs[0]);
  EXPECT_TRUE(polled);
  for (int i = 2; i >= 0; --i) {
    ASSERT_TRUE((*r)->wait(jobs[size_t(i)]).ok());
    EXPECT_EQ(std::memcmp(bufs[size_t(i)].data(), t.bytes.data() + (size_t(i) << 21), 2 << 20), 0) << i;
  }
  const uint64_t b0 = (*r)->stats(0).bytes_read, b1 = (*r)->stats(1).bytes_read;
  expect_range(t, **r, 0, 0, true);
  AlignedBuffer one(1 << 20);
  ASSERT_TRUE((*r)->read({{"sub/data.bin", 1 << 20, 1 << 20, one.data()}}, /*only_drive=*/1).ok());
  EXPECT_EQ(std::memcmp(one.data(), t.bytes.data() + (1 << 20), 1 << 20), 0);
  EXPECT_EQ((*r)->stats(0).bytes_read, b0);
  EXPECT_EQ((*r)->stats(1).bytes_read, b1 + (1 << 20));
  (*r)->mark_failed(1, "checksum mismatch (test)");
  EXPECT_FALSE((*r)->read({{"sub/data.bin", 0, 1 << 20, one.data()}}, 1).ok());
  EXPECT_TRUE((*r)->read({{"sub/data.bin", 0, 1 << 20, one.data()}}).ok());
  EXPECT_GT((*r)->wait_ns(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Engines, Reader, ::testing::Values(true, false),
                         [](const auto& i) { return std::string(i.param ? "io_uring" : "pread"); });

TEST(SlotCache, LruAndLfuEvictionWithPins) {
  SlotCache lru(2, EvictionPolicy::kLru);
  auto a = lru.acquire(1);
  lru.release(a.slot);
  auto b = lru.acquire(2);
  lru.release(b.slot);
  lru.release(lru.acquire(1).slot);  // 1 is now more recent than 2
  auto c = lru.acquire(3);
  EXPECT_FALSE(c.hit);
  EXPECT_EQ(c.evicted_key, 2);
  // Both slots pinned: no slot for a fourth key.
  auto d = lru.acquire(1);
  EXPECT_TRUE(d.hit);
  EXPECT_EQ(lru.acquire(4).slot, -1);
  lru.release(c.slot);
  lru.release(d.slot);

  SlotCache lfu(2, EvictionPolicy::kLfu);
  for (int i = 0; i < 5; ++i) lfu.release(lfu.acquire(7).slot);
  lfu.release(lfu.acquire(8).slot);
  auto e = lfu.acquire(9);  // 8 (one use) goes, not 7 (five uses, less recent)
  EXPECT_EQ(e.evicted_key, 8);
  EXPECT_EQ(lfu.hits(), 4u);
  EXPECT_EQ(lfu.misses(), 3u);
}

// Admission: a cold key is served around the cache (bypass) until its uses pass the coldest
// resident's; the resident set does not move meanwhile.
TEST(SlotCache, LfuAdmissionBypassesColderKeys) {
  SlotCache lfu(2, EvictionPolicy::kLfu);
  for (int i = 0; i < 3; ++i) lfu.release(lfu.acquire(1).slot);
  for (int i = 0; i < 2; ++i) lfu.release(lfu.acquire(2).slot);
  auto a = lfu.acquire(5, /*admit_colder=*/false);  // 1 use < 2's 2 uses
  EXPECT_TRUE(a.bypass);
  EXPECT_EQ(a.slot, -1);
  EXPECT_EQ(lfu.find(5), -1);
  EXPECT_GE(lfu.find(2), 0);
  auto b = lfu.acquire(5, false);  // 2 uses: not fewer than 2's, admitted in its place
  EXPECT_FALSE(b.bypass);
  EXPECT_EQ(b.evicted_key, 2);
  lfu.release(b.slot);
  auto c = lfu.acquire(6, true);  // admit_colder: the old behaviour
  EXPECT_FALSE(c.bypass);
  EXPECT_GE(c.slot, 0);
  lfu.release(c.slot);
}

// The wave of a MoE call shared by the CUDA slots and SlotSim: cache slots while unpinned ones
// remain, then staging entries numbered after the cache slots; the next wave starts after them.
TEST(SlotCache, TakeWaveFillsSlotsThenStaging) {
  SlotCache c(2, EvictionPolicy::kLfu);
  c.release(c.acquire(7).slot);
  std::vector<int32_t> want{3, 7, 9, 11, 12};
  resident_first(c, want);
  EXPECT_EQ(want, (std::vector<int32_t>{7, 3, 9, 11, 12}));
  std::vector<int> pinned;
  std::vector<WaveTake> w;
  size_t next = take_wave(c, want, 0, 2, pinned, w);
  ASSERT_EQ(next, 4u);  // 2 cache slots + 2 staging entries
  ASSERT_EQ(w.size(), 4u);
  EXPECT_TRUE(w[0].hit);
  EXPECT_FALSE(w[0].staged);
  // 3 takes the empty slot; 9 and 11 find both slots pinned and are staged as entries 2 and 3.
  EXPECT_FALSE(w[1].staged);
  EXPECT_TRUE(w[2].staged);
  EXPECT_EQ(w[2].entry, 2);
  EXPECT_EQ(w[3].entry, 3);
  EXPECT_EQ(pinned.size(), 2u);
  for (int s : pinned) c.release(s);
  pinned.clear();
  next = take_wave(c, want, next, 0, pinned, w);
  EXPECT_EQ(next, want.size());
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].expert, 12);
  EXPECT_FALSE(w[0].staged);  // no staging: admitted, evicting an unpinned slot
  for (int s : pinned) c.release(s);
}

// LFU keeps the use history of evicted keys: hot key 1 (6 uses) pushed out once by a cold key
// and brought back is not the next victim; with per-residency counts it would be (1 use).
TEST(SlotCache, LfuHistorySurvivesEviction) {
  SlotCache lfu(2, EvictionPolicy::kLfu);
  for (int i = 0; i < 5; ++i) lfu.release(lfu.acquire(1).slot);
  for (int i = 0; i < 5; ++i) lfu.release(lfu.acquire(2).slot);
  auto c1 = lfu.acquire(10);  // tie 5 / 5: the older (1) goes
  EXPECT_EQ(c1.evicted_key, 1);
  lfu.release(c1.slot);
  auto back = lfu.acquire(1);  // the cold key goes, not hot 2
  EXPECT_EQ(back.evicted_key, 10);
  lfu.release(back.slot);
  auto c2 = lfu.acquire(11);  // 1 has 6 uses, 2 has 5
  EXPECT_EQ(c2.evicted_key, 2);
  lfu.release(c2.slot);
}

// A use served outside the cache (a cold expert computed on the host) counts as a miss and a
// use, admits nothing, and its uses then decide admission as acquire()'s would have.
TEST(SlotCache, UsesServedElsewhereCountWithoutAdmitting) {
  SlotCache lfu(1, EvictionPolicy::kLfu);
  for (int i = 0; i < 3; ++i) lfu.release(lfu.acquire(4).slot);
  lfu.count_elsewhere(9);
  EXPECT_EQ(lfu.find(9), -1);
  EXPECT_EQ(lfu.uses_of(9), 1u);
  EXPECT_EQ(lfu.uses_of(4), 3u);
  EXPECT_EQ(lfu.misses(), 2u);                 // 4's first lookup and 9's
  EXPECT_TRUE(lfu.acquire(9, false).bypass);   // 2 uses, fewer than 4's 3: ...
  lfu.count_elsewhere(9);                      // ... a third use elsewhere ...
  auto a = lfu.acquire(9, false);              // ... and 9 (4 uses) is admitted over 4 (3)
  EXPECT_FALSE(a.bypass);
  EXPECT_EQ(a.evicted_key, 4);
  lfu.release(a.slot);
  SlotCache lru(1, EvictionPolicy::kLru);
  lru.count_elsewhere(3);
  EXPECT_EQ(lru.uses_of(3), 0u);
  EXPECT_EQ(lru.find(3), -1);
}

// place(): a predicted key goes where acquire() would put it, unpinned, with no access counted:
// the later acquire() is a hit that counts as any lookup does, and a key placed but never used is
// the next LFU victim. Resident keys and fully pinned caches place nothing; LFU admission holds.
TEST(SlotCache, PlaceAheadOfUseCountsNothing) {
  SlotCache lfu(2, EvictionPolicy::kLfu);
  for (int i = 0; i < 3; ++i) lfu.release(lfu.acquire(1).slot);
  lfu.release(lfu.acquire(2).slot);  // 1: 3 uses, 2: 1 use
  const uint64_t hits = lfu.hits(), misses = lfu.misses();
  EXPECT_EQ(lfu.place(1), -1);  // resident
  const int s = lfu.place(7);
  ASSERT_GE(s, 0);
  EXPECT_EQ(lfu.key_of(s), 7);
  EXPECT_EQ(lfu.find(2), -1);  // the victim: fewer uses than 1
  EXPECT_EQ(lfu.pins(s), 0);
  EXPECT_EQ(lfu.uses_of(7), 0u);
  EXPECT_EQ(lfu.hits(), hits);
  EXPECT_EQ(lfu.misses(), misses);
  auto a = lfu.acquire(7);  // the predicted use
  EXPECT_TRUE(a.hit);
  EXPECT_EQ(a.slot, s);
  EXPECT_EQ(lfu.uses_of(7), 1u);
  const int one = lfu.find(1);
  EXPECT_EQ(lfu.place(8), one);  // 7's slot is pinned: the only unpinned slot is 1's
  EXPECT_EQ(lfu.find(1), -1);
  lfu.release(a.slot);
  // A key placed but never used is the next victim.
  SlotCache c(2, EvictionPolicy::kLfu);
  for (int i = 0; i < 2; ++i) c.release(c.acquire(1).slot), c.release(c.acquire(2).slot);
  const int p = c.place(5);
  ASSERT_GE(p, 0);
  auto m = c.acquire(6);  // a miss evicts 5 (0 uses), not 1 or 2 (2 uses each)
  EXPECT_EQ(m.evicted_key, 5);
  c.release(m.slot);
  // Every slot pinned: nothing placed.
  SlotCache pinned(1, EvictionPolicy::kLru);
  auto q = pinned.acquire(3);
  EXPECT_EQ(pinned.place(4), -1);
  pinned.release(q.slot);
  // LFU admission: a colder key than the victim is not placed.
  SlotCache adm(1, EvictionPolicy::kLfu);
  adm.release(adm.acquire(1).slot);
  EXPECT_EQ(adm.place(9, /*admit_colder=*/false), -1);
  EXPECT_EQ(adm.find(1), 0);
  EXPECT_EQ(adm.place(9), 0);
}

// The rate estimate is bytes over busy time: a read that took 8 ms and seven more that landed
// within microseconds of it (a burst, or one reap of several completions) are 8 MiB in ~8 ms, about
// 1 GB/s; a mean of per-read rates would say hundreds of GB/s. Reads reaped together (0 ns) add
// their bytes; nothing is estimated before 2 ms of busy time; a steady 2 GB/s stream reads as
// 2 GB/s; the estimate follows a drive that slows.
TEST(RateEstimate, BytesOverBusyTime) {
  const double mib = 1 << 20;
  RateEstimate r;
  EXPECT_FALSE(r.valid());
  r.add(mib, 0);  // reaped with an earlier read: no time of its own yet
  r.add(mib, 1e6);
  EXPECT_FALSE(r.valid());
  for (int burst = 0; burst < 20; ++burst) {
    r.add(mib, 8e6 - 7 * 1.4e3);
    for (int i = 0; i < 7; ++i) r.add(mib, 1.4e3);
  }
  EXPECT_GT(r.bytes_per_s(), 0.8e9);
  EXPECT_LT(r.bytes_per_s(), 1.6e9);
  RateEstimate steady;
  for (int i = 0; i < 50; ++i) steady.add(mib, mib / 2e9 * 1e9);
  EXPECT_NEAR(steady.bytes_per_s(), 2e9, 1e6);
  for (int i = 0; i < 50; ++i) steady.add(mib, mib / 0.5e9 * 1e9);  // the drive slows to 0.5 GB/s
  EXPECT_NEAR(steady.bytes_per_s(), 0.5e9, 0.05e9);
}

TEST(ReaderFault, Parses) {
  auto f = parse_reader_fault("1@40:truncate");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->drive, 1);
  EXPECT_EQ(f->after, 40u);
  EXPECT_EQ(f->kind, ReaderFault::Kind::kTruncate);
  f = parse_reader_fault("0@0:delay=1500");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->kind, ReaderFault::Kind::kDelay);
  EXPECT_EQ(f->delay_us, 1500);
  EXPECT_EQ(parse_reader_fault("0@1:eio")->kind, ReaderFault::Kind::kEio);
  EXPECT_EQ(parse_reader_fault("0@1:unlink")->kind, ReaderFault::Kind::kUnlink);
  EXPECT_FALSE(parse_reader_fault("0:eio").ok());
  EXPECT_FALSE(parse_reader_fault("0@x:eio").ok());
  EXPECT_FALSE(parse_reader_fault("0@1:melt").ok());
}

TEST(DriveProbe, MeasuresRates) {
  auto r = probe_drive(fs::temp_directory_path().string(), 32u << 20, 0.2);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_GT(r->seq_bytes_per_s, 0);
  EXPECT_GT(r->rand4k_bytes_per_s, 0);
  EXPECT_GT(r->rand1m_bytes_per_s, 0);
}

// Several dirs read together at the reader's pattern (two dirs on one file system here, as the
// released-dimension bench puts two replica files on one disk); the probe files go away.
TEST(DriveProbe, DirsTogether) {
  const fs::path base = fs::temp_directory_path() / ("fb_probe_together_" + std::to_string(::getpid()));
  fs::create_directories(base / "a");
  fs::create_directories(base / "b");
  auto r = probe_drives_together({(base / "a").string(), (base / "b").string()}, 16u << 20, 0.2, 1u << 20, 4);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_GT(*r, 0);
  EXPECT_TRUE(fs::is_empty(base / "a") && fs::is_empty(base / "b")) << "a probe file was left behind";
  EXPECT_FALSE(probe_drives_together({}, 16u << 20, 0.1, 1u << 20, 4).ok());
  EXPECT_FALSE(probe_drives_together({(base / "a").string()}, 16u << 20, 0.1, 1000, 4).ok()) << "reads not a multiple of 4 KiB";
  EXPECT_FALSE(probe_drives_together({(base / "a").string()}, 16u << 20, 0.1, 1u << 20, 0).ok());
  EXPECT_FALSE(probe_drives_together({(base / "missing").string()}, 16u << 20, 0.1, 1u << 20, 4).ok());
  fs::remove_all(base);
}

// probe's drive rate (the plan's expert-from-drive rate) reads as the expert reader does: its
// chunk size and reads in flight per dir come from ReaderOptions itself, and the reads walk whole
// records, a record's chunks in order from a record-aligned offset (the last one shorter).
TEST(DriveProbe, ReaderShapeFollowsReaderOptions) {
  const ReaderOptions def;
  const DriveProbeShape s = reader_probe_shape(def, 18'800'000);
  EXPECT_EQ(s.block, def.chunk_bytes);
  EXPECT_EQ(s.depth_per_dir, def.queue_depth_per_drive);
  EXPECT_EQ(s.record_bytes, 18'800'000u);
  ReaderOptions other;
  other.chunk_bytes = 256u << 10;
  other.queue_depth_per_drive = 3;
  const DriveProbeShape o = reader_probe_shape(other, 1u << 20);
  EXPECT_EQ(o.block, 256u << 10);
  EXPECT_EQ(o.depth_per_dir, 3);
}

TEST(DriveProbe, ReadsWholeRecordsAtReaderDepth) {
  const fs::path base = fs::temp_directory_path() / ("fb_probe_records_" + std::to_string(::getpid()));
  fs::create_directories(base / "a");
  fs::create_directories(base / "b");
  ReaderOptions ro;
  ro.chunk_bytes = 1u << 20;
  ro.queue_depth_per_drive = 3;
  const uint64_t record = (5u << 20) / 2 + 4096 * 3 + 100;  // 2.5 MiB + a bit: 3 chunks, the last short
  const uint64_t stride = (record + 4095) / 4096 * 4096;
  DriveProbeShape shape = reader_probe_shape(ro, record);
  struct Read {
    uint64_t off;
    uint32_t n;
  };
  std::vector<std::vector<Read>> reads(2);
  shape.on_read = [&](size_t dir, uint64_t off, uint32_t n) { reads.at(dir).push_back({off, n}); };
  auto r = probe_drives_together({(base / "a").string(), (base / "b").string()}, 16u << 20, 0.2, shape);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_GT(*r, 0);
  for (const auto& v : reads) {
    ASSERT_GE(v.size(), size_t(ro.queue_depth_per_drive));
    // The first depth reads go out at once: the reader's depth per dir, no more.
    EXPECT_EQ(v[0].off % stride, 0u);
    EXPECT_EQ(v[1].off, v[0].off + ro.chunk_bytes);
    EXPECT_EQ(v[2].off, v[0].off + 2 * ro.chunk_bytes);
    for (size_t i = 0; i < v.size(); ++i) {
      const uint64_t in_rec = v[i].off % stride;
      EXPECT_EQ(in_rec % ro.chunk_bytes, 0u);
      EXPECT_EQ(v[i].off - in_rec + stride <= std::max<uint64_t>(16u << 20, stride * 4), true);
      const uint64_t want = std::min<uint64_t>(ro.chunk_bytes, record - in_rec);
      EXPECT_EQ(v[i].n, (want + 4095) / 4096 * 4096) << "read " << i;
      if (in_rec > 0) {
        ASSERT_GT(i, 0u);
        EXPECT_EQ(v[i].off, v[i - 1].off + ro.chunk_bytes) << "a record's chunks in order, read " << i;
      }
      if (i > 0 && v[i - 1].off % stride + ro.chunk_bytes < record) {
        EXPECT_EQ(v[i].off, v[i - 1].off + ro.chunk_bytes) << "the next chunk of an unfinished record, read " << i;
      }
    }
  }
  EXPECT_TRUE(fs::is_empty(base / "a") && fs::is_empty(base / "b")) << "a probe file was left behind";
  DriveProbeShape tiny = reader_probe_shape(ro, 4096);
  EXPECT_FALSE(probe_drives_together({(base / "a").string()}, 16u << 20, 0.1, tiny).ok()) << "a record smaller than one read";
  fs::remove_all(base);
}

}  // namespace
}  // namespace fb::storage
