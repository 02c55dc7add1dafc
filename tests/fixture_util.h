// Test helper: one official fixture (../shared/fixtures/NAME) on the CPU executor, with its prompt.
// `model` stays null when the fixture is absent, so tests can skip.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "base/mapped_file.h"
#include "cpu/executor.h"
#include "cpu/session_cache.h"

namespace fb::testing_util {

struct CpuFixture {
  std::unique_ptr<cpu::CpuModel> model;
  std::vector<int32_t> prompt;
};

inline CpuFixture load_cpu_fixture(const char* name) {
  CpuFixture f;
  const std::string dir = std::string(FB_SHARED_DIR) + "/fixtures/" + name;
  if (!std::filesystem::exists(dir)) return f;
  auto m = cpu::CpuModel::load(dir + "/checkpoint");
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return f;
  f.model = std::move(m.value());
  auto b = read_file_bytes(dir + "/prompt.i32");
  EXPECT_TRUE(b.ok());
  if (!b.ok()) return f;
  f.prompt.resize(b->size() / 4);
  std::memcpy(f.prompt.data(), b->data(), b->size());
  return f;
}

// Cache bytes a later query can read: ring rows of the last `ring_rows` positions (the same rows
// present, equal bytes), every compressed entry and index key, and with `tails` the ratio-2
// compressor tails (not after a rollback: rolled-back rows leave stale tail slots).
inline void expect_same_caches(const cpu::SessionCache& a, const cpu::SessionCache& b, int64_t ring_rows, bool tails) {
  ASSERT_EQ(a.next_pos, b.next_pos);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.image, b.image);
  for (size_t l = 0; l < a.rings.size(); ++l) {
    for (int64_t q = std::max<int64_t>(0, a.next_pos - ring_rows); q < a.next_pos; ++q) {
      const uint8_t* ra = a.rings[l].find(q);
      const uint8_t* rb = b.rings[l].find(q);
      ASSERT_EQ(ra == nullptr, rb == nullptr) << "layer " << l << " pos " << q;
      if (ra) EXPECT_EQ(std::memcmp(ra, rb, size_t(a.rings[l].row_bytes)), 0) << "ring layer " << l << " pos " << q;
    }
    EXPECT_EQ(a.comp[l].kv, b.comp[l].kv) << "compressed KV layer " << l;
    EXPECT_EQ(a.comp[l].keys, b.comp[l].keys) << "index keys layer " << l;
    if (tails) EXPECT_EQ(a.comp[l].tail, b.comp[l].tail) << "ratio-2 tail layer " << l;
  }
}

}  // namespace fb::testing_util
