// KvStore: longest verified prefix, persistence across reopen, LRU eviction under the budget,
// crash leftovers, damaged, truncated and foreign files (never an error, never a wrong state).
#include "engine/kv_store.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <cstdio>
#include <string>

#include <unistd.h>

namespace fb::engine {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const char* name) {
  const fs::path d = fs::temp_directory_path() / (std::string(name) + "_" + std::to_string(getpid()));  // concurrent runs apart
  fs::remove_all(d);
  return d.string();
}

std::vector<int32_t> seq(int n, int base = 100) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = base + i;
  return v;
}

std::vector<fs::path> files(const std::string& dir) {
  std::vector<fs::path> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path());
  return v;
}

TEST(KvStore, LongestVerifiedPrefixAndReopen) {
  const std::string dir = fresh_dir("fb_kv_store_a");
  auto s = KvStore::open(dir, 1 << 20, 42);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  const auto p = seq(50);
  ASSERT_TRUE((*s)->put(std::span(p).first(10), "state-10").ok());
  ASSERT_TRUE((*s)->put(std::span(p).first(30), "state-30").ok());
  ASSERT_TRUE((*s)->put(seq(40, 7), "other-40").ok());  // not a prefix of p
  auto h = (*s)->longest_prefix(p, 49);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->tokens, 30);
  EXPECT_EQ(h->state, "state-30");
  auto h2 = (*s)->longest_prefix(p, 20);  // at most 20 tokens
  ASSERT_TRUE(h2.has_value());
  EXPECT_EQ(h2->tokens, 10);
  auto prompt = p;
  prompt[5] = 9999;  // diverges inside every stored prefix
  EXPECT_FALSE((*s)->longest_prefix(prompt, 49).has_value());
  // The same tokens again replace the older checkpoint.
  ASSERT_TRUE((*s)->put(std::span(p).first(30), "state-30b").ok());
  EXPECT_EQ((*s)->stats().entries, 3);
  // Reopen: everything is still there (the directory is the index).
  s->reset();
  auto r = KvStore::open(dir, 1 << 20, 42);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->stats().entries, 3);
  auto h3 = (*r)->longest_prefix(p, 49);
  ASSERT_TRUE(h3.has_value());
  EXPECT_EQ(h3->state, "state-30b");
  // Another model's store sees none of them and deletes none of them.
  auto o = KvStore::open(dir, 1 << 20, 43);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ((*o)->stats().entries, 0);
  EXPECT_FALSE((*o)->longest_prefix(p, 49).has_value());
  EXPECT_EQ(files(dir).size(), 3u);
}

TEST(KvStore, BudgetEvictsLeastRecentlyUsed) {
  const std::string dir = fresh_dir("fb_kv_store_b");
  const std::string state(1000, 'x');
  const uint64_t one = 32 + 4 * 20 + 1000 + 4;  // header + tokens + state + checksum
  auto s = KvStore::open(dir, 3 * one, 1);
  ASSERT_TRUE(s.ok());
  std::vector<std::vector<int32_t>> keys;
  for (int i = 0; i < 3; ++i) {
    keys.push_back(seq(20, 1000 * (i + 1)));
    ASSERT_TRUE((*s)->put(keys.back(), state).ok());
  }
  ASSERT_TRUE((*s)->longest_prefix(keys[0], 20).has_value());  // 0 is now the most recent
  keys.push_back(seq(20, 9000));
  ASSERT_TRUE((*s)->put(keys.back(), state).ok());  // evicts 1, the least recently used
  EXPECT_LE((*s)->stats().bytes, 3 * one);
  EXPECT_EQ((*s)->stats().evicted, 1);
  EXPECT_TRUE((*s)->longest_prefix(keys[0], 20).has_value());
  EXPECT_FALSE((*s)->longest_prefix(keys[1], 20).has_value());
  EXPECT_TRUE((*s)->longest_prefix(keys[2], 20).has_value());
  EXPECT_EQ(files(dir).size(), 3u);
  // A checkpoint larger than the whole budget is refused, nothing else is touched.
  EXPECT_EQ((*s)->put(keys[0], std::string(4 * one, 'y')).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ((*s)->stats().entries, 3);
  // Reopening under a smaller budget trims to it.
  s->reset();
  auto small = KvStore::open(dir, 2 * one, 1);
  ASSERT_TRUE(small.ok());
  EXPECT_LE((*small)->stats().bytes, 2 * one);
  EXPECT_EQ(files(dir).size(), 2u);
}

TEST(KvStore, DamagedTruncatedAndLeftoverFilesAreDroppedNotServed) {
  const std::string dir = fresh_dir("fb_kv_store_c");
  const auto p = seq(64);
  {
    auto s = KvStore::open(dir, 1 << 20, 5);
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->put(std::span(p).first(16), "short-state").ok());
    ASSERT_TRUE((*s)->put(std::span(p).first(48), "long-state-that-will-be-damaged").ok());
    ASSERT_TRUE((*s)->put(std::span(p).first(32), "middle-state-to-be-truncated").ok());
  }
  for (const auto& f : files(dir)) {
    const auto size = fs::file_size(f);
    if (f.filename().string().find("-48.fbkv") != std::string::npos) {
      std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
      io.seekp(std::streamoff(size - 10));
      io.put('!');  // one byte of the state flipped
    } else if (f.filename().string().find("-32.fbkv") != std::string::npos) {
      fs::resize_file(f, size - 7);
    }
  }
  std::ofstream(fs::path(dir) / "kv-0000000000000000-8.fbkv.tmp.12345") << "half a write";  // a crash leftover
  std::ofstream(fs::path(dir) / "kv-garbage-1.fbkv") << "not a checkpoint";
  auto s = KvStore::open(dir, 1 << 20, 5);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->stats().rejected, 2);  // the truncated file and the garbage, found at open
  auto h = (*s)->longest_prefix(p, 64);  // the damaged 48 fails its checksum: the 16 is served
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->tokens, 16);
  EXPECT_EQ(h->state, "short-state");
  EXPECT_EQ((*s)->stats().rejected, 3);
  EXPECT_EQ(files(dir).size(), 1u) << "damaged files and leftovers are removed";
}

// A stand-in for a serialized session of n positions, shaped like docs/formats.md's: a header with
// the position, the token ids, then per layer a fixed ring whose rows follow the last positions,
// growing compressed entries (fixed bytes per position once written) and a small changing tail.
std::string fake_state(const std::vector<int32_t>& toks, int n) {
  std::string s = "FBSESS" + std::to_string(n) + "|";
  s.append(reinterpret_cast<const char*>(toks.data()), size_t(n) * 4);
  for (int layer = 0; layer < 4; ++layer) {
    for (int slot = 0; slot < 16; ++slot) {
      const int pos = n - 16 + slot;
      for (int b = 0; b < 64; ++b) s.push_back(char((pos * 131 + b * 7 + layer * 17) & 0xFF));
    }
    for (int e = 0; e < n / 2; ++e)
      for (int b = 0; b < 48; ++b) s.push_back(char((e * 29 + b * 11 + layer * 5 + toks[size_t(2 * e)]) & 0xFF));
    for (int b = 0; b < 32; ++b) s.push_back(char((n * 3 + b + layer) & 0xFF));
  }
  return s;
}

TEST(KvStore, DeltaCodingRoundTripsAndRejectsBadOps) {
  std::string parent(5000, '\0'), child;
  for (size_t i = 0; i < parent.size(); ++i) parent[i] = char((i * 7919) >> 3);
  child = parent.substr(0, 1200) + "inserted bytes" + parent.substr(1200, 3000) + std::string(300, 'z') + parent.substr(4100);
  auto ops = encode_delta(parent, child, child.size());
  ASSERT_TRUE(ops.has_value());
  EXPECT_LT(ops->size(), child.size() / 4);
  auto back = apply_delta(parent, *ops, child.size());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, child);
  EXPECT_FALSE(encode_delta(parent, std::string(5000, 'q'), 100).has_value()) << "more literal bytes than allowed";
  EXPECT_EQ(apply_delta(parent, ops->substr(0, ops->size() - 3), child.size()).status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(apply_delta(parent.substr(0, 2000), *ops, child.size()).status().code(), StatusCode::kCorrupt) << "a copy past the parent";
  EXPECT_EQ(apply_delta(parent, *ops, child.size() + 1).status().code(), StatusCode::kCorrupt);
  std::string bad = *ops;
  bad[0] = char(7);
  EXPECT_EQ(apply_delta(parent, bad, child.size()).status().code(), StatusCode::kCorrupt);
}

TEST(KvStore, GrowingConversationIsStoredAsDeltasAndRestoresExactly) {
  const std::string dir = fresh_dir("fb_kv_store_d");
  const auto toks = seq(400, 7);
  const std::vector<int> turns = {200, 260, 320, 380};
  uint64_t full_bytes = 0;
  {
    auto s = KvStore::open(dir, 64 << 20, 9);
    ASSERT_TRUE(s.ok());
    for (int n : turns) {
      ASSERT_TRUE((*s)->put(std::span(toks).first(size_t(n)), fake_state(toks, n)).ok());
      full_bytes += 32 + 4 * uint64_t(n) + fake_state(toks, n).size() + 4;
    }
    const KvStoreStats st = (*s)->stats();
    EXPECT_EQ(st.entries, 4);
    EXPECT_EQ(st.deltas, 3);
    EXPECT_LT(st.written, full_bytes / 2) << "written " << st.written << " of " << full_bytes << " full";
    std::printf("  4 turns: %llu bytes written with deltas, %llu as full checkpoints\n", (unsigned long long)st.written,
                (unsigned long long)full_bytes);
  }
  auto s = KvStore::open(dir, 64 << 20, 9);  // a new process: the chain is resolved from the files
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->stats().deltas, 3);
  for (int n : turns) {
    auto h = (*s)->longest_prefix(toks, n);
    ASSERT_TRUE(h.has_value()) << n;
    EXPECT_EQ(h->tokens, n);
    EXPECT_TRUE(h->state == fake_state(toks, n)) << "turn " << n;
  }
  // With deltas off every checkpoint is whole.
  (*s)->set_deltas(false);
  ASSERT_TRUE((*s)->put(toks, fake_state(toks, 400)).ok());
  EXPECT_EQ((*s)->stats().deltas, 3);
}

// Reopened under a slightly smaller budget, a store evicts the newest delta (a leaf), not the
// full checkpoint everything is built on.
TEST(KvStore, ReopenEvictsLeavesBeforeParents) {
  const std::string dir = fresh_dir("fb_kv_store_f");
  const auto toks = seq(400, 11);
  uint64_t total = 0;
  {
    auto s = KvStore::open(dir, 64 << 20, 6);
    ASSERT_TRUE(s.ok());
    for (int n : {200, 260, 320}) ASSERT_TRUE((*s)->put(std::span(toks).first(size_t(n)), fake_state(toks, n)).ok());
    ASSERT_EQ((*s)->stats().deltas, 2);
    total = (*s)->stats().bytes;
  }
  auto s = KvStore::open(dir, total - 1, 6);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->stats().entries, 2);
  EXPECT_EQ((*s)->stats().evicted, 1);
  auto h = (*s)->longest_prefix(toks, 400);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->tokens, 260);
  EXPECT_TRUE(h->state == fake_state(toks, 260));
}

TEST(KvStore, DeltaChainsStayShortAndDieWithTheirParent) {
  const std::string dir = fresh_dir("fb_kv_store_e");
  const auto toks = seq(800, 3);
  auto s = KvStore::open(dir, 256 << 20, 4);
  ASSERT_TRUE(s.ok());
  for (int k = 0; k < 12; ++k) {
    const int n = 200 + 40 * k;
    ASSERT_TRUE((*s)->put(std::span(toks).first(size_t(n)), fake_state(toks, n)).ok());
  }
  EXPECT_EQ((*s)->stats().entries, 12);
  for (int k = 0; k < 12; ++k) {
    const int n = 200 + 40 * k;
    auto h = (*s)->longest_prefix(toks, n);
    ASSERT_TRUE(h.has_value());
    EXPECT_TRUE(h->state == fake_state(toks, n)) << n;
  }
  // A damaged full checkpoint takes every delta built on it along: nothing wrong is served.
  std::string root;
  for (const auto& f : files(dir))
    if (f.filename().string().find("-200.fbkv") != std::string::npos) root = f.string();
  ASSERT_FALSE(root.empty());
  {
    std::fstream io(root, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(std::streamoff(fs::file_size(root) - 100));  // inside the state: the file's checksum fails
    io.put('#');
  }
  const int64_t before = (*s)->stats().entries;
  s->reset();  // a fresh process (the store keeps the last state it read in memory)
  s = KvStore::open(dir, 256 << 20, 4);
  ASSERT_TRUE(s.ok());
  auto h = (*s)->longest_prefix(toks, 800);
  const KvStoreStats st = (*s)->stats();
  EXPECT_FALSE(h.has_value()) << "every checkpoint here is built on the damaged one";
  EXPECT_EQ(st.rejected, before);
  EXPECT_EQ(st.entries, 0);
  EXPECT_TRUE(files(dir).empty());
  std::printf("  damaged root: %lld of %lld entries dropped, served %lld tokens\n", (long long)(before - st.entries), (long long)before,
              (long long)(h ? h->tokens : 0));
  // Under a budget smaller than the chain: eviction keeps the total within it (a delta goes with
  // its parent), and whatever stays restores exactly.
  s->reset();
  auto small = KvStore::open(dir, 40 << 10, 4);
  ASSERT_TRUE(small.ok());
  for (int k = 0; k < 12; ++k) {
    const int n = 200 + 40 * k;
    const Status st2 = (*small)->put(std::span(toks).first(size_t(n)), fake_state(toks, n));
    EXPECT_TRUE(st2.ok() || st2.code() == StatusCode::kResourceExhausted) << st2.to_string();
    EXPECT_LE((*small)->stats().bytes, uint64_t(40) << 10);
  }
  EXPECT_GT((*small)->stats().evicted, 0);
  int served = 0;
  for (int64_t n = 200; n <= 640; n += 40) {
    auto r = (*small)->longest_prefix(std::span(toks).first(size_t(n)), n);
    if (!r.has_value()) continue;
    ++served;
    EXPECT_TRUE(r->state == fake_state(toks, int(r->tokens))) << r->tokens;
  }
  EXPECT_GT(served, 0);
}

}  // namespace
}  // namespace fb::engine
