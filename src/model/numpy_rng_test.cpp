// Checks the NumPy Generator(PCG64) port against NumPy's own output: the committed golden file
// (tools/gen_numpy_rng_golden.py, fixed cases) and, when a Python with NumPy is available, fresh
// random cases produced by the same script at test time.
#include "model/numpy_rng.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace fb::model {
namespace {

std::string source_dir() { return FB_SOURCE_DIR; }  // the build's source tree (fb_add_test)

// The Python int parser accepts the full int64 and uint64 ranges as text.
uint64_t parse_u64(const std::string& s) { return std::stoull(s); }
int64_t parse_i64(const std::string& s) { return std::stoll(s); }

struct Counts {
  int seed_lines = 0;
  int pcg_lines = 0;
  int int_lines = 0;
  int path32 = 0;
  int path64 = 0;
};

// Checks every record of a golden-format stream; `c` counts what was checked.
void check_records(std::istream& in, const std::string& what, Counts& c) {
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string tag;
    ls >> tag;
    std::vector<std::string> f;
    for (std::string tok; ls >> tok;) f.push_back(tok);
    const std::string where = what + ":" + std::to_string(lineno);
    if (tag == "S") {
      ASSERT_EQ(f.size(), 9u) << where;
      const uint64_t seed = parse_u64(f[0]);
      const std::vector<uint32_t> got = numpy_seed_sequence_state_u32(seed, 8);
      for (int i = 0; i < 8; ++i) {
        EXPECT_EQ(got[i], static_cast<uint32_t>(parse_u64(f[1 + i]))) << where << " word " << i;
      }
      ++c.seed_lines;
    } else if (tag == "P") {
      ASSERT_EQ(f.size(), 11u) << where;
      const uint64_t seed = parse_u64(f[0]);
      NumpyPcg64 g(seed);
      EXPECT_EQ(g.state()[0], parse_u64(f[1])) << where;
      EXPECT_EQ(g.state()[1], parse_u64(f[2])) << where;
      EXPECT_EQ(g.increment()[0], parse_u64(f[3])) << where;
      EXPECT_EQ(g.increment()[1], parse_u64(f[4])) << where;
      for (int i = 0; i < 3; ++i) EXPECT_EQ(g.next_uint64(), parse_u64(f[5 + i])) << where;
      NumpyPcg64 g32(seed);
      for (int i = 0; i < 3; ++i) EXPECT_EQ(g32.next_uint32(), parse_u64(f[8 + i])) << where;
      ++c.pcg_lines;
    } else if (tag == "I") {
      ASSERT_GE(f.size(), 4u) << where;
      const uint64_t seed = parse_u64(f[0]);
      const int64_t low = parse_i64(f[1]);
      const int64_t high = parse_i64(f[2]);
      const int64_t n = parse_i64(f[3]);
      ASSERT_EQ(f.size(), static_cast<size_t>(4 + n)) << where;
      const std::vector<int64_t> got = numpy_default_rng_integers(seed, low, high, n);
      ASSERT_EQ(got.size(), static_cast<size_t>(n)) << where;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[i], parse_i64(f[4 + i])) << where << " index " << i << ": " << line;
      }
      const uint64_t rng = static_cast<uint64_t>(high - 1) - static_cast<uint64_t>(low);
      if (rng != 0 && rng <= 0xFFFFFFFFull) ++c.path32;
      if (rng > 0xFFFFFFFFull) ++c.path64;
      ++c.int_lines;
    } else {
      ADD_FAILURE() << where << ": unknown record '" << tag << "'";
    }
  }
}

TEST(NumpyRng, GoldenFile) {
  const std::string path = source_dir() + "/src/model/testdata/numpy_rng_golden.txt";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "cannot open " << path;
  std::string header;
  std::getline(in, header);
  EXPECT_EQ(header.rfind("# numpy ", 0), 0u) << "golden file must record the NumPy version";
  Counts c;
  check_records(in, path, c);
  EXPECT_GE(c.seed_lines, 20);
  EXPECT_GE(c.pcg_lines, 20);
  EXPECT_GE(c.int_lines, 1000);
  EXPECT_GE(c.path32, 100);
  EXPECT_GE(c.path64, 100);
}

// spec/11 §6.2 released values (before the 2v+1 map): B = 46,539,438,283,891 for V = 99,092.
TEST(NumpyRng, ReleasedEngramDraws) {
  const int64_t b = 46539438283891;
  EXPECT_EQ(((INT64_MAX / 99092) / 2), b);
  const std::vector<int64_t> l1 = numpy_default_rng_integers(10007, 0, b, 4);
  const std::vector<int64_t> l14 = numpy_default_rng_integers(140098, 0, b, 4);
  const std::vector<int64_t> want1 = {76632096046245, 4839876093313, 35959672319349,
                                      73987337458391};
  const std::vector<int64_t> want14 = {67716810739261, 51510806800915, 30921347202721,
                                       82619226485591};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(2 * l1[i] + 1, want1[i]) << i;
    EXPECT_EQ(2 * l14[i] + 1, want14[i]) << i;
  }
}

TEST(NumpyRng, EdgeCases) {
  EXPECT_TRUE(numpy_default_rng_integers(1, 0, 10, 0).empty());
  // Range of one value: no draws, every value is low.
  EXPECT_EQ(numpy_default_rng_integers(5, -7, -6, 3), (std::vector<int64_t>{-7, -7, -7}));
  // The uint32 buffer persists across draws: two 32-bit draws use one 64-bit output.
  NumpyPcg64 a(123), b(123);
  const uint64_t x = a.next_uint64();
  EXPECT_EQ(b.next_uint32(), static_cast<uint32_t>(x));
  EXPECT_EQ(b.next_uint32(), static_cast<uint32_t>(x >> 32));
  EXPECT_EQ(b.next_uint64(), a.next_uint64());
}

TEST(NumpyRngDeathTest, RejectsEmptyRange) {
  EXPECT_DEATH(numpy_default_rng_integers(1, 5, 5, 1), "");
}

// Finds a Python interpreter that can import numpy; empty when none.
std::string python_with_numpy() {
  for (const char* py : {"python3", "/usr/bin/python3", "python"}) {
    const std::string cmd = std::string(py) + " -c 'import numpy' >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return py;
  }
  return {};
}

TEST(NumpyRng, FreshRandomCasesAgainstNumpy) {
  const std::string py = python_with_numpy();
  if (py.empty()) {
    GTEST_SKIP() << "no python with numpy: fresh-case comparison skipped";
  }
  const std::string cmd =
      py + " " + source_dir() + "/tools/gen_numpy_rng_golden.py --random 400 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string text;
  char buf[4096];
  for (size_t got; (got = fread(buf, 1, sizeof buf, pipe)) > 0;) text.append(buf, got);
  const int rc = pclose(pipe);
  ASSERT_EQ(rc, 0) << cmd << "\n" << text;
  std::istringstream in(text);
  // The header names the numpy version and the case picker's seed, for reproducing a failure.
  std::string first, second, third;
  std::getline(in, first);
  std::getline(in, second);
  std::getline(in, third);
  SCOPED_TRACE(first + " | " + third);
  Counts c;
  check_records(in, "fresh", c);
  EXPECT_EQ(c.int_lines, 400);
}

}  // namespace
}  // namespace fb::model
