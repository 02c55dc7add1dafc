#include "model/engram_staging.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

namespace fb::model {
namespace {

// Two tables of different sizes (codes and scales filled with a row-dependent pattern), a step of
// T rows whose ids point anywhere in them.
struct Fixture {
  static constexpr int kHd = 64, kCols = 6, kTables = 2;
  std::vector<std::vector<uint8_t>> codes, scales;
  std::vector<int64_t> rows_of{97, 131};
  std::vector<int64_t> ids;
  int64_t T = 0;

  explicit Fixture(int64_t t, uint64_t seed) : T(t) {
    std::mt19937_64 rng(seed);
    for (int k = 0; k < kTables; ++k) {
      codes.emplace_back(size_t(rows_of[size_t(k)] * kHd));
      scales.emplace_back(size_t(rows_of[size_t(k)] * (kHd / 32)));
      for (auto& b : codes.back()) b = uint8_t(rng());
      for (auto& b : scales.back()) b = uint8_t(rng());
    }
    ids.resize(size_t(T * kTables * kCols));
    for (int64_t t = 0; t < T; ++t)
      for (int k = 0; k < kTables; ++k)
        for (int c = 0; c < kCols; ++c) ids[size_t((t * kTables + k) * kCols + c)] = int64_t(rng() % uint64_t(rows_of[size_t(k)]));
  }
  // Layers in run order: table 1 first, then table 0 (the order the staging is told, not the ids').
  std::vector<EngramStaging::Table> tables() const {
    return {{codes[1].data(), scales[1].data(), rows_of[1], 1}, {codes[0].data(), scales[0].data(), rows_of[0], 0}};
  }
  // The staged rows of layer k equal the table rows its ids name.
  void expect_rows(const EngramStaging::Rows& r, int table) const {
    for (int64_t t = 0; t < T; ++t)
      for (int c = 0; c < kCols; ++c) {
        const int64_t i = t * kCols + c, row = ids[size_t((t * kTables + table) * kCols + c)];
        ASSERT_EQ(std::memcmp(r.codes + i * kHd, codes[size_t(table)].data() + row * kHd, kHd), 0) << "codes, row " << t << " col " << c;
        ASSERT_EQ(std::memcmp(r.scales + i * (kHd / 32), scales[size_t(table)].data() + row * (kHd / 32), kHd / 32), 0)
            << "scales, row " << t << " col " << c;
      }
  }
};

TEST(EngramStaging, RowsEqualTheTablesWithAndWithoutTasks) {
  for (int tasks : {0, 1, 4}) {
    for (int64_t T : {1, 3, 257}) {
      SCOPED_TRACE("tasks " + std::to_string(tasks) + ", rows " + std::to_string(T));
      Fixture f(T, uint64_t(T * 10 + tasks));
      EngramStaging s;
      ASSERT_TRUE(s.start(f.tables(), f.ids.data(), T, Fixture::kTables, Fixture::kCols, Fixture::kHd, tasks).ok());
      ASSERT_EQ(s.layers(), 2u);
      EngramRows n;
      f.expect_rows(s.rows(0, &n), 1);
      f.expect_rows(s.rows(1, &n), 0);
      const uint64_t want = uint64_t(2 * T * Fixture::kCols);
      EXPECT_EQ(n.rows, want);
      EXPECT_EQ(n.bytes, want * (Fixture::kHd + Fixture::kHd / 32));
      EXPECT_EQ(n.hidden + n.exposed, n.rows);
      EXPECT_EQ(n.in_place(), 0u);
      if (tasks == 0) {
        EXPECT_EQ(n.hidden, 0u) << "no task: every row is copied by its layer";
        EXPECT_EQ(n.exposed, want);
      }
    }
  }
}

// Tasks that ran to the end before the layers asked staged every row: all hidden, nothing waited.
TEST(EngramStaging, RowsStagedBeforeTheLayerAreHidden) {
  Fixture f(64, 5);
  EngramStaging s;
  ASSERT_TRUE(s.start(f.tables(), f.ids.data(), f.T, Fixture::kTables, Fixture::kCols, Fixture::kHd, 2).ok());
  EngramRows n;
  s.join();  // the tasks ran to the end before any layer asked
  f.expect_rows(s.rows(0, &n), 1);
  f.expect_rows(s.rows(1, &n), 0);
  EXPECT_EQ(n.hidden, n.rows);
  EXPECT_EQ(n.exposed, 0u);
  EXPECT_EQ(n.exposed_s, 0.0);
}

// A restarted staging (the next step) forgets the previous step's rows; a null count is allowed.
TEST(EngramStaging, RestartForTheNextStep) {
  Fixture a(9, 1), b(4, 2);
  EngramStaging s;
  ASSERT_TRUE(s.start(a.tables(), a.ids.data(), a.T, Fixture::kTables, Fixture::kCols, Fixture::kHd, 1).ok());
  a.expect_rows(s.rows(0, nullptr), 1);
  // b's tables are other bytes: the staged rows must come from them.
  ASSERT_TRUE(s.start(b.tables(), b.ids.data(), b.T, Fixture::kTables, Fixture::kCols, Fixture::kHd, 1).ok());
  b.expect_rows(s.rows(1, nullptr), 0);
  b.expect_rows(s.rows(0, nullptr), 1);
}

int threads_of_this_process() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// The workers are kept from step to step (a decode step starts no thread); asking for more grows
// the pool; each step's rows are still the tables'.
TEST(EngramStaging, WorkersAreKeptAcrossSteps) {
  EngramStaging s;
  const int base = threads_of_this_process();
  for (int step = 0; step < 12; ++step) {
    Fixture f(5, uint64_t(100 + step));
    const int tasks = step < 6 ? 2 : 3;
    ASSERT_TRUE(s.start(f.tables(), f.ids.data(), f.T, Fixture::kTables, Fixture::kCols, Fixture::kHd, tasks).ok());
    EngramRows n;
    f.expect_rows(s.rows(0, &n), 1);
    f.expect_rows(s.rows(1, &n), 0);
    EXPECT_EQ(n.hidden + n.exposed, n.rows);
    s.join();
    EXPECT_EQ(threads_of_this_process(), base + tasks) << "step " << step;
  }
}

TEST(EngramStaging, BadIdsAndShapesAreErrors) {
  Fixture f(3, 7);
  EngramStaging s;
  f.ids[size_t(Fixture::kCols)] = f.rows_of[1];  // step row 0, table 1, column 0: one past the table's end
  Status st = s.start(f.tables(), f.ids.data(), f.T, Fixture::kTables, Fixture::kCols, Fixture::kHd, 1);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.to_string().find("outside its table"), std::string::npos) << st.to_string();
  f.ids[size_t(Fixture::kCols)] = -1;
  EXPECT_FALSE(s.start(f.tables(), f.ids.data(), f.T, Fixture::kTables, Fixture::kCols, Fixture::kHd, 1).ok());
  EXPECT_FALSE(s.start(f.tables(), f.ids.data(), f.T, Fixture::kTables, Fixture::kCols, 48, 1).ok()) << "head_dim not a multiple of 32";
  auto bad = f.tables();
  bad[0].index = 2;
  EXPECT_FALSE(s.start(bad, f.ids.data(), f.T, Fixture::kTables, Fixture::kCols, Fixture::kHd, 1).ok()) << "table index out of range";
}

}  // namespace
}  // namespace fb::model
