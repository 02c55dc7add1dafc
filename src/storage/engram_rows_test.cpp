#include "storage/engram_rows.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <unordered_map>

#include "loader/snapshot.h"
#include "loader/tiny_model.h"
#include "model/config.h"
#include "model/engram_staging.h"
#include "model/schema.h"

namespace fb::storage {
namespace {

namespace fs = std::filesystem;

TEST(RowIndex, AgreesWithAMapUnderRandomInsertsAndErases) {
  // A small table so probe runs wrap around its end and collide often; keys in a narrow range so
  // erases hit present keys.
  for (int64_t cap : {1, 5, 37, 300}) {
    RowIndex idx(cap);
    std::vector<uint64_t> keys(size_t(cap), ~uint64_t(0));  // slot -> key
    std::unordered_map<uint64_t, int32_t> ref;
    std::vector<int32_t> free_slots;
    for (int32_t s = 0; s < int32_t(cap); ++s) free_slots.push_back(s);
    auto key_of = [&](int32_t s) { return keys[size_t(s)]; };
    std::mt19937_64 rng{uint64_t(cap)};
    for (int op = 0; op < 20000; ++op) {
      const uint64_t k = (rng() % uint64_t(3 * cap + 3)) * 0x10001ull;
      const auto it = ref.find(k);
      ASSERT_EQ(idx.find(k, key_of), it == ref.end() ? -1 : it->second) << "cap " << cap << " op " << op;
      if (it == ref.end() && !free_slots.empty() && rng() % 3 != 0) {
        const int32_t s = free_slots.back();
        free_slots.pop_back();
        keys[size_t(s)] = k;
        idx.insert(k, s);
        ref[k] = s;
      } else if (it != ref.end() && rng() % 2 == 0) {
        idx.erase(k, key_of);
        keys[size_t(it->second)] = ~uint64_t(0);
        free_slots.push_back(it->second);
        ref.erase(it);
      }
      ASSERT_EQ(idx.size(), int64_t(ref.size()));
    }
    for (const auto& [k, s] : ref) EXPECT_EQ(idx.find(k, key_of), s);
  }
}

TEST(RowClock, FitsItsBudgetAndKeepsWhatIsAskedFor) {
  for (uint64_t budget : {0ull, 100ull, 5000ull, 1ull << 20, 3ull << 30}) {
    const int64_t cap = RowClock::fit(budget, 264);
    EXPECT_LE(uint64_t(cap) * 264 + RowClock::state_bytes(cap), budget) << budget;
    // Never less than half of what the bytes would hold without the index's rounding.
    EXPECT_GE(cap, int64_t(budget / (264 + 8 + 1 + 8)) / 2) << budget;
  }
  RowClock c(4);
  bool ev = false;
  for (uint64_t k = 0; k < 4; ++k) EXPECT_EQ(c.admit(k, &ev), int32_t(k));
  EXPECT_FALSE(ev);
  EXPECT_GE(c.lookup(2), 0);  // key 2 is used: the hand passes it once
  const int32_t s = c.admit(10, &ev);
  EXPECT_TRUE(ev);
  EXPECT_EQ(s, 0);  // key 0 went (the hand starts at slot 0)
  EXPECT_EQ(c.lookup(0), -1);
  EXPECT_EQ(c.admit(11, &ev), 1);   // then key 1
  EXPECT_EQ(c.admit(12, &ev), 3);   // key 2 is skipped once (its bit cleared) ...
  EXPECT_EQ(c.admit(13, &ev), 0);   // ... key 10 was never asked for again
  EXPECT_GE(c.lookup(2), 0);
  EXPECT_EQ(c.size(), 4);
  RowClock none(0);
  EXPECT_EQ(none.admit(1, &ev), -1);
  EXPECT_EQ(none.lookup(1), -1);
}

// The cache simulation over token streams: a document seen twice is all hits the second time in a
// cache that holds it, none without a cache; the released config's 48 rows a token.
TEST(EngramSim, ASecondReadingHitsWhatTheCacheHolds) {
  auto c = model::Config::from_file(std::string(FB_SOURCE_DIR) + "/tests/data/released_config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  std::mt19937_64 rng(5);
  std::vector<int32_t> doc(300);
  for (auto& x : doc) x = int32_t(rng() % 5000);
  const uint64_t big = 1ull << 26, small = 20 * 300;  // 64 MiB holds the document's rows; 6 KB holds ~20
  const auto r = simulate_engram_cache(*c, {doc, doc}, 7, {0, small, big}, doc.size());
  ASSERT_EQ(r.size(), 3u);
  for (const EngramSimResult& x : r) {
    EXPECT_EQ(x.tokens, 300u);
    EXPECT_EQ(x.lookups, 300u * 48u);
  }
  EXPECT_EQ(r[0].hits, 0u);
  EXPECT_EQ(r[0].capacity_rows, 0);
  EXPECT_LT(r[1].hits, r[1].lookups / 10);   // 20 rows cannot hold a document of 14,400
  EXPECT_EQ(r[2].hits, r[2].lookups);        // every row held from the first reading
  EXPECT_EQ(r[2].evictions, 0u);
  EXPECT_LE(r[2].capacity_rows, int64_t(2 * 300 * 48));  // no more rows than the streams ask for
  // The first reading alone measured (nothing warms): only repeats within it hit.
  const auto cold = simulate_engram_cache(*c, {doc}, 7, {big}, 0);
  EXPECT_LT(cold[0].hits, cold[0].lookups / 4);
}

// A table written as a shard would hold it: codes and scales at unaligned offsets of one file,
// copied under two drive roots.
struct TableFiles {
  fs::path root = fs::temp_directory_path() / ("fb_engram_rows_" + std::to_string(getpid()) + "_" + std::to_string(std::random_device{}()));
  std::vector<std::string> drives;
  std::vector<uint8_t> codes, scales;
  EngramTableFile file;
  static constexpr int kHd = 64, kSb = 2;
  explicit TableFiles(int64_t rows, int n_drives = 2) {
    std::mt19937_64 rng(7);
    codes.resize(size_t(rows) * kHd);
    scales.resize(size_t(rows) * kSb);
    for (auto& b : codes) b = uint8_t(rng());
    for (auto& b : scales) b = uint8_t(rng());
    std::vector<uint8_t> blob(1237, 0xAB);  // a header's worth of other bytes
    file.codes_offset = blob.size();
    blob.insert(blob.end(), codes.begin(), codes.end());
    blob.resize(blob.size() + 3, 0xCD);
    file.scales_offset = blob.size();
    blob.insert(blob.end(), scales.begin(), scales.end());
    file.codes_path = file.scales_path = "shard.safetensors";
    file.layer = 3;
    file.rows = rows;
    for (int d = 0; d < n_drives; ++d) {
      const fs::path dir = root / ("drive" + std::to_string(d));
      fs::create_directories(dir);
      std::ofstream(dir / file.codes_path, std::ios::binary).write(reinterpret_cast<const char*>(blob.data()), std::streamsize(blob.size()));
      drives.push_back(dir.string());
    }
  }
  ~TableFiles() { fs::remove_all(root); }
  void expect_rows(const std::vector<int64_t>& ids, const std::vector<uint8_t>& c, const std::vector<uint8_t>& s) const {
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_EQ(std::memcmp(&c[i * kHd], &codes[size_t(ids[i]) * kHd], kHd), 0) << "codes of row " << ids[i];
      ASSERT_EQ(std::memcmp(&s[i * kSb], &scales[size_t(ids[i]) * kSb], kSb), 0) << "scales of row " << ids[i];
    }
  }
};

Status read(const EngramRowCache& c, int layer, const std::vector<int64_t>& ids, std::vector<uint8_t>* codes, std::vector<uint8_t>* scales) {
  codes->assign(ids.size() * TableFiles::kHd, 0);
  scales->assign(ids.size() * TableFiles::kSb, 0);
  return c.read_rows(layer, ids.data(), int(ids.size()), codes->data(), scales->data());
}

TEST(EngramRowCache, ServesTheFilesBytesThroughASmallCache) {
  TableFiles t(500);
  EngramCacheOptions opt;
  opt.capacity_bytes = 40 * EngramRowCache::bytes_per_row(TableFiles::kHd);  // 40 of 500 rows
  auto c = EngramRowCache::create({t.file}, TableFiles::kHd, t.drives, opt);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  std::mt19937_64 rng(3);
  std::vector<uint8_t> codes, scales;
  uint64_t asked = 0;
  for (int call = 0; call < 60; ++call) {
    std::vector<int64_t> ids(24);
    for (auto& id : ids) id = (rng() % 4 == 0) ? int64_t(rng() % 500) : int64_t(rng() % 30);  // a hot set and a tail
    ASSERT_TRUE(read(**c, 3, ids, &codes, &scales).ok());
    t.expect_rows(ids, codes, scales);
    asked += ids.size();
  }
  const EngramCacheStats s = (*c)->stats();
  EXPECT_EQ(s.lookups, asked);
  EXPECT_EQ(s.hits + s.drive_rows, s.lookups);
  EXPECT_GT(s.hits, s.lookups / 3);  // the hot 30 rows fit
  EXPECT_GT(s.evictions, 0u);        // the tail does not
  EXPECT_GE(s.capacity_rows, 30);  // the index's power-of-two table takes some of the budget
  EXPECT_LE(s.capacity_rows, 40);
  EXPECT_EQ(s.resident_rows, s.capacity_rows);
  EXPECT_LE((*c)->host_bytes(), opt.capacity_bytes);
  // Asking for an unknown layer or a row past the table is an error, not a read.
  EXPECT_FALSE(read(**c, 4, {0}, &codes, &scales).ok());
  EXPECT_FALSE(read(**c, 3, {500}, &codes, &scales).ok());
}

TEST(EngramRowCache, NoCacheReadsEveryRowAndAWholeCacheReadsEachOnce) {
  TableFiles t(200, 1);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 200; ++i) ids.push_back((i * 37) % 200);
  std::vector<uint8_t> codes, scales;
  for (uint64_t cap_rows : {0, 200}) {
    EngramCacheOptions opt;
    opt.capacity_bytes = cap_rows * EngramRowCache::bytes_per_row(TableFiles::kHd);
    auto c = EngramRowCache::create({t.file}, TableFiles::kHd, t.drives, opt);
    ASSERT_TRUE(c.ok());
    for (int pass = 0; pass < 3; ++pass) {
      ASSERT_TRUE(read(**c, 3, ids, &codes, &scales).ok());
      t.expect_rows(ids, codes, scales);
    }
    const EngramCacheStats s = (*c)->stats();
    if (cap_rows == 0) {
      EXPECT_EQ(s.drive_rows, 600u);
      EXPECT_EQ(s.evictions, 0u);
    } else {
      EXPECT_GE(s.capacity_rows, 128);  // most of the 200 rows' budget holds rows
    }
    if (s.capacity_rows >= 200) {
      EXPECT_EQ(s.drive_rows, 200u);
    }
    EXPECT_EQ(s.drive_rows, 3 * 200 - s.hits);
  }
}

TEST(EngramRowCache, AReplicaThatVanishesMidRunIsServedByTheOther) {
  TableFiles t(300);
  EngramCacheOptions opt;  // no cache: every row from the drives
  opt.faults.push_back(*parse_reader_fault("0@5:unlink"));
  opt.faults.push_back(*parse_reader_fault("1@5000:eio"));  // never reached
  auto c = EngramRowCache::create({t.file}, TableFiles::kHd, t.drives, opt);
  ASSERT_TRUE(c.ok());
  std::vector<uint8_t> codes, scales;
  for (int call = 0; call < 20; ++call) {
    std::vector<int64_t> ids;
    for (int i = 0; i < 16; ++i) ids.push_back((call * 16 + i) * 7 % 300);
    ASSERT_TRUE(read(**c, 3, ids, &codes, &scales).ok()) << call;
    t.expect_rows(ids, codes, scales);
  }
  EXPECT_NE((*c)->drive_report().find("failed"), std::string::npos) << (*c)->drive_report();
}

TEST(EngramRowCache, FailsWhenNoReplicaCanServe) {
  TableFiles t(100, 1);
  EngramCacheOptions opt;
  opt.faults.push_back(*parse_reader_fault("0@2:eio"));
  auto c = EngramRowCache::create({t.file}, TableFiles::kHd, t.drives, opt);
  ASSERT_TRUE(c.ok());
  std::vector<uint8_t> codes, scales;
  Status st;
  for (int call = 0; call < 5 && st.ok(); ++call) st = read(**c, 3, {call, call + 50}, &codes, &scales);
  EXPECT_FALSE(st.ok());
}

// The staging's tasks read a step through the cache: the same bytes as the mapped tables, and a
// read error becomes the step's status.
TEST(EngramRowCache, StagingFromTheSnapshotsShardsEqualsTheMappedTables) {
  const fs::path dir = fs::temp_directory_path() / ("fb_engram_snap_" + std::to_string(getpid()));
  fs::remove_all(dir);
  const fs::path fixture = fs::path(FB_SHARED_DIR) / "fixtures/tiny-s0/checkpoint";
  if (fs::exists(fixture)) {
    fs::copy(fixture, dir, fs::copy_options::recursive);
  } else {
    loader::TinyModelOptions o;
    o.out_dir = dir.string();
    ASSERT_TRUE(loader::write_tiny_model(o).ok());
  }
  auto snap = loader::Snapshot::open(dir.string());
  ASSERT_TRUE(snap.ok()) << snap.status().to_string();
  const model::Config& c = (*snap)->config();
  EngramCacheOptions opt;
  opt.capacity_bytes = 50 * EngramRowCache::bytes_per_row(c.engram_head_dim);
  auto cache = engram_cache_for(**snap, {(dir / "missing-replica").string()}, opt);  // a replica without files is left out
  ASSERT_TRUE(cache.ok()) << cache.status().to_string();

  const int n_tab = c.n_engram_tables(), cols = (c.engram_max_ngram - 1) * c.engram_n_heads, hd = c.engram_head_dim;
  std::vector<model::EngramStaging::Table> mapped, drive;
  int64_t min_rows = INT64_MAX;
  for (int l = 0; l < c.n_total_layers(); ++l) {
    if (c.roles[size_t(l)].engram_table < 0) continue;
    const std::string p = model::layer_prefix(c, l);
    const TensorView& codes = (*snap)->get(p + "engram.embed.weight");
    const TensorView& scales = (*snap)->get(p + "engram.embed.scale");
    model::EngramStaging::Table tab{static_cast<const uint8_t*>(codes.data), static_cast<const uint8_t*>(scales.data), codes.dim(0),
                                    c.roles[size_t(l)].engram_table};
    mapped.push_back(tab);
    tab.source = cache->get();
    tab.layer = l;
    drive.push_back(tab);
    min_rows = std::min(min_rows, codes.dim(0));
  }
  ASSERT_FALSE(mapped.empty());
  const int64_t T = 100;  // several claims of a source (256 / cols step rows each) and a partial one
  std::vector<int64_t> ids(size_t(T * n_tab * cols));
  std::mt19937_64 rng(11);
  for (auto& id : ids) id = int64_t(rng() % uint64_t(std::min<int64_t>(min_rows, 40)));  // repeats, so some hits
  for (int tasks : {0, 3}) {
    model::EngramStaging a, b;
    ASSERT_TRUE(a.start(mapped, ids.data(), T, n_tab, cols, hd, tasks).ok());
    ASSERT_TRUE(b.start(drive, ids.data(), T, n_tab, cols, hd, tasks).ok());
    for (size_t k = 0; k < mapped.size(); ++k) {
      a.rows(k, nullptr);
      b.rows(k, nullptr);
      EXPECT_EQ(a.codes(k), b.codes(k)) << "layer " << k << ", " << tasks << " tasks";
      EXPECT_EQ(a.scales(k), b.scales(k));
    }
    b.join();
    EXPECT_TRUE(b.status().ok()) << b.status().to_string();
  }
  const EngramCacheStats s = (*cache)->stats();
  EXPECT_GT(s.hits, 0u);
  EXPECT_GT(s.drive_rows, 0u);
  EXPECT_EQ(s.lookups, uint64_t(2 * T * cols) * mapped.size());

  // The Engram store (convert --engram) in two folders: every row of every table as the mapping
  // has it, one read a row; a store of another size, or none, is left out; none usable is an error.
  const fs::path sa = dir / "store_a", sb = dir / "store_b";
  ASSERT_TRUE(write_engram_store(**snap, {sa.string(), sb.string()}).ok());
  EXPECT_FALSE(fs::exists(sa / (std::string(kEngramStoreFile) + ".tmp")));
  EngramCacheOptions so;  // no cache: every row from the store
  auto store = engram_store_for(**snap, {(dir / "nowhere").string(), sa.string(), sb.string()}, so);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  for (const auto& tab : drive) {
    std::vector<int64_t> all(size_t(tab.rows));
    for (int64_t r = 0; r < tab.rows; ++r) all[size_t(r)] = (r * 7919) % tab.rows;  // every row, out of order
    std::vector<uint8_t> codes(all.size() * size_t(hd)), scales(all.size() * size_t(hd / 32));
    ASSERT_TRUE((*store)->read_rows(tab.layer, all.data(), int(all.size()), codes.data(), scales.data()).ok());
    for (size_t i = 0; i < all.size(); ++i) {
      ASSERT_EQ(std::memcmp(&codes[i * size_t(hd)], tab.codes + all[i] * hd, size_t(hd)), 0) << "layer " << tab.layer << " row " << all[i];
      ASSERT_EQ(std::memcmp(&scales[i * size_t(hd / 32)], tab.scales + all[i] * (hd / 32), size_t(hd / 32)), 0);
    }
  }
  EXPECT_NE((*store)->drive_report().find("store_b"), std::string::npos);
  // The bench's way (no model identity): the same rows; a second call keeps the file it finds.
  const fs::path sm = dir / "store_mem";
  auto mem = engram_store_from_memory(**snap, {sm.string()}, so);
  ASSERT_TRUE(mem.ok()) << mem.status().to_string();
  const auto written = fs::last_write_time(sm / kEngramStoreFile);
  ASSERT_TRUE(engram_store_from_memory(**snap, {sm.string()}, so).ok());
  EXPECT_EQ(fs::last_write_time(sm / kEngramStoreFile), written);
  {
    const auto& tab = drive.back();
    std::vector<int64_t> ids{0, tab.rows - 1, tab.rows / 2};
    std::vector<uint8_t> codes(ids.size() * size_t(hd)), scales(ids.size() * size_t(hd / 32));
    ASSERT_TRUE((*mem)->read_rows(tab.layer, ids.data(), int(ids.size()), codes.data(), scales.data()).ok());
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(std::memcmp(&codes[i * size_t(hd)], tab.codes + ids[i] * hd, size_t(hd)), 0);
      EXPECT_EQ(std::memcmp(&scales[i * size_t(hd / 32)], tab.scales + ids[i] * (hd / 32), size_t(hd / 32)), 0);
    }
  }
  fs::resize_file(sb / kEngramStoreFile, fs::file_size(sb / kEngramStoreFile) - 4096);  // truncated
  fs::remove(sa / kEngramStoreFile);
  EXPECT_FALSE(engram_store_for(**snap, {sa.string(), sb.string()}, so).ok());

  // A source that fails: the step's status says so, and the rows are not left waiting.
  struct Failing final : model::EngramRowSource {
    Status read_rows(int, const int64_t*, int, uint8_t*, uint8_t*) const override { return FB_ERROR(kIo) << "drive gone"; }
  } failing;
  for (auto& tab : drive) tab.source = &failing;
  model::EngramStaging f;
  ASSERT_TRUE(f.start(drive, ids.data(), T, n_tab, cols, hd, 2).ok());
  for (size_t k = 0; k < drive.size(); ++k) f.rows(k, nullptr);
  EXPECT_FALSE(f.status().ok());
  EXPECT_NE(f.status().to_string().find("drive gone"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fb::storage
