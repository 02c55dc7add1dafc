// Engram constants against the released test vectors (spec/11 §6.2), the tiny config
// (spec/10 §7.3) and the ops fixture engram_hash.multipliers.i64.
#include "model/engram_constants.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "model/numpy_rng.h"

namespace fb::model {
namespace {

using V = std::vector<int64_t>;

const V kPrimes0 = {16000057, 16000079, 16000081, 16000097, 16000121, 16000129, 16000133,
                    16000183, 16000189, 16000207, 16000211, 16000253, 16000277, 16000289,
                    16000307, 16000321, 16000339, 16000381, 16000393, 16000399, 16000403,
                    16000409, 16000447, 16000463};
const V kOffsets0 = {0,         16000057,  32000136,  48000217,  64000314,  80000435,
                     96000564,  112000697, 128000880, 144001069, 160001276, 176001487,
                     192001740, 208002017, 224002306, 240002613, 256002934, 272003273,
                     288003654, 304004047, 320004446, 336004849, 352005258, 368005705};
const V kPrimes1 = {16000477, 16000487, 16000499, 16000507, 16000511, 16000573, 16000609,
                    16000627, 16000667, 16000669, 16000693, 16000697, 16000711, 16000729,
                    16000759, 16000769, 16000781, 16000799, 16000813, 16000819, 16000841,
                    16000877, 16000879, 16000889};
const V kOffsets1 = {0,         16000477,  32000964,  48001463,  64001970,  80002481,
                     96003054,  112003663, 128004290, 144004957, 160005626, 176006319,
                     192007016, 208007727, 224008456, 240009215, 256009984, 272010765,
                     288011564, 304012377, 320013196, 336014037, 352014914, 368015793};
const V kMult0 = {76632096046245, 4839876093313, 35959672319349, 73987337458391};
const V kMult1 = {67716810739261, 51510806800915, 30921347202721, 82619226485591};

TEST(EngramConstants, ReleasedConfig) {
  const auto t = engram_constants({1, 14}, 16000000, 4, 8, 99092);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].layer_id, 1);
  EXPECT_EQ(t[1].layer_id, 14);
  EXPECT_EQ(t[0].primes, kPrimes0);
  EXPECT_EQ(t[1].primes, kPrimes1);
  EXPECT_EQ(t[0].offsets, kOffsets0);
  EXPECT_EQ(t[1].offsets, kOffsets1);
  EXPECT_EQ(t[0].rows, 384006168);
  EXPECT_EQ(t[1].rows, 384016682);
  EXPECT_EQ(t[0].multipliers, kMult0);
  EXPECT_EQ(t[1].multipliers, kMult1);
  EXPECT_EQ(engram_multiplier_bound(99092), 46539438283891);
}

// fixtures/ops of the shared folder the build names (FB_SHARED_DIR, fb_add_test); empty when
// `file` is not there.
std::string ops_fixture_dir(const std::string& file) {
  const std::string dir = std::string(FB_SHARED_DIR) + "/fixtures/ops";
  return std::ifstream(dir + "/" + file).good() ? dir : std::string();
}

TEST(EngramConstants, OpsFixtureMultipliers) {
  const std::string used = ops_fixture_dir("engram_hash.multipliers.i64");
  if (used.empty()) GTEST_SKIP() << "fixtures/ops/engram_hash.multipliers.i64 not found";
  std::ifstream in(used + "/engram_hash.multipliers.i64", std::ios::binary);
  V fixture(8);
  in.read(reinterpret_cast<char*>(fixture.data()), 8 * sizeof(int64_t));
  ASSERT_EQ(in.gcount(), 64) << used;
  // manifest.json: i64 [2 tables, 4], compressed_vocab 99092, tables = layers 1 and 14.
  const auto t = engram_constants({1, 14}, 16000000, 4, 8, 99092);
  EXPECT_EQ(V(fixture.begin(), fixture.begin() + 4), t[0].multipliers);
  EXPECT_EQ(V(fixture.begin() + 4, fixture.end()), t[1].multipliers);
}

// model::engram_row_ids (shared by the CPU and CUDA executors) against the reference's hashes at
// the released constants: ops fixture engram_hash.rows (text from position 0) and rows_masked
// (positions 20..26 an image span: DEAD history), [48 positions, 2 tables, 24 (order, head)].
TEST(EngramConstants, RowIdsMatchTheOpsFixture) {
  const std::string dir = ops_fixture_dir("engram_hash.rows.i64");
  if (dir.empty()) GTEST_SKIP() << "fixtures/ops/engram_hash.rows.i64 not found";
  auto read = [&](const std::string& name, size_t bytes) {
    std::vector<char> b(bytes);
    std::ifstream in(dir + "/" + name, std::ios::binary);
    in.read(b.data(), std::streamsize(bytes));
    EXPECT_EQ(size_t(in.gcount()), bytes) << name;
    return b;
  };
  constexpr int kPos = 48, kCols = 2 * 24;
  const auto cb = read("engram_hash.classes.i32", kPos * 4);
  std::vector<int32_t> classes(kPos);
  std::memcpy(classes.data(), cb.data(), cb.size());
  const auto t = engram_constants({1, 14}, 16000000, 4, 8, 99092);
  const int64_t pad_class = 1;  // manifest params: the fixtures' stub map
  for (bool masked : {false, true}) {
    const auto rb = read(masked ? "engram_hash.rows_masked.i64" : "engram_hash.rows.i64", kPos * kCols * 8);
    std::vector<int64_t> want(kPos * kCols), got(kPos * kCols, -7);
    std::memcpy(want.data(), rb.data(), rb.size());
    auto cls = [&](int64_t p) -> int64_t { return masked && p >= 20 && p <= 26 ? -1 : classes[size_t(p)]; };
    for (int64_t p = 0; p < kPos; ++p) engram_row_ids(t, 4, 8, pad_class, p, cls, &got[size_t(p * kCols)]);
    int64_t diff = 0;
    for (size_t i = 0; i < got.size(); ++i) diff += got[i] != want[i];
    EXPECT_EQ(diff, 0) << (masked ? "rows_masked" : "rows") << ": first at " << (std::mismatch(got.begin(), got.end(), want.begin()).first - got.begin());
  }
}

TEST(EngramConstants, TinyConfig) {
  // spec/10 §7.3: engram on layers [0, 1], engram_vocab_size 100, 2 heads, max n-gram 4,
  // 256 compressed classes.
  const auto t = engram_constants({0, 1}, 100, 4, 2, 256);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].primes, (V{101, 103, 107, 109, 113, 127}));
  EXPECT_EQ(t[1].primes, (V{131, 137, 139, 149, 151, 157}));
  EXPECT_EQ(t[0].offsets, (V{0, 101, 204, 311, 420, 533}));
  EXPECT_EQ(t[1].offsets, (V{0, 131, 268, 407, 556, 707}));
  EXPECT_EQ(t[0].rows, 660);
  EXPECT_EQ(t[1].rows, 864);
  // Layer id 0 seeds with default_rng(0); B = ((2^63-1)//256)//2 = 2^54 - 1.
  EXPECT_EQ(engram_multiplier_bound(256), (int64_t{1} << 54) - 1);
  const V draws0 = numpy_default_rng_integers(0, 0, (int64_t{1} << 54) - 1, 4);
  const V draws1 = numpy_default_rng_integers(10007, 0, (int64_t{1} << 54) - 1, 4);
  ASSERT_EQ(t[0].multipliers.size(), 4u);
  ASSERT_EQ(t[1].multipliers.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(t[0].multipliers[i], 2 * draws0[i] + 1);
    EXPECT_EQ(t[1].multipliers[i], 2 * draws1[i] + 1);
    EXPECT_EQ(t[0].multipliers[i] % 2, 1);
    // (2v+1)·(V−1) stays below 2^63.
    EXPECT_LE(t[0].multipliers[i], INT64_MAX / 255);
  }
}

TEST(EngramConstants, PrimeWalkProperties) {
  // Config order matters (layer ids are not sorted), and vocab sizes that are prime are taken.
  const auto t = engram_constants({14, 1, 3}, 7, 3, 3, 5);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].layer_id, 14);
  EXPECT_EQ(t[0].primes, (V{7, 11, 13, 17, 19, 23}));
  EXPECT_EQ(t[1].primes, (V{29, 31, 37, 41, 43, 47}));
  EXPECT_EQ(t[2].primes, (V{53, 59, 61, 67, 71, 73}));
  EXPECT_EQ(t[2].offsets, (V{0, 53, 112, 173, 240, 311}));
  EXPECT_EQ(t[2].rows, 384);
  EXPECT_EQ(t[0].multipliers.size(), 3u);
  // V = 1: B = (2^63-1)//2 = 2^62 - 1 (largest possible); V huge: B clamps to 1 -> multipliers 1.
  EXPECT_EQ(engram_multiplier_bound(1), (int64_t{1} << 62) - 1);
  EXPECT_EQ(engram_multiplier_bound(INT64_MAX), 1);
  EXPECT_EQ(engram_multipliers(5, 4, INT64_MAX), (V{1, 1, 1, 1}));
}

TEST(EngramConstants, IsPrime) {
  int count = 0;
  for (uint64_t n = 0; n < 10000; ++n) {
    bool trial = n >= 2;
    for (uint64_t d = 2; d * d <= n && trial; ++d) trial = n % d != 0;
    EXPECT_EQ(engram_is_prime(n), trial) << n;
    count += trial;
  }
  EXPECT_EQ(count, 1229);
  EXPECT_TRUE(engram_is_prime(18446744073709551557ull));    // largest 64-bit prime
  EXPECT_FALSE(engram_is_prime(3215031751ull));             // strong pseudoprime to 2,3,5,7
  EXPECT_FALSE(engram_is_prime(3825123056546413051ull));    // spsp to bases 2..23
  EXPECT_TRUE(engram_is_prime(2305843009213693951ull));     // 2^61 - 1
  EXPECT_FALSE(engram_is_prime(4294967297ull));             // 2^32 + 1 = 641 * 6700417
}

}  // namespace
}  // namespace fb::model
