// KvStore: longest verified prefix, persistence across reopen, LRU eviction under the budget,
// crash leftovers, damaged, truncated and foreign files (never an error, never a wrong state).
#include "engine/kv_store.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
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

}  // namespace
}  // namespace fb::engine
