// crc32c: the hardware paths (one chain, three interleaved chains on inputs of 12 KiB and more)
// against a bitwise reference written here from the polynomial, at every length class around the
// interleave's block boundaries, with chained calls; plus the standard check value.
#include "base/crc32c.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

namespace fb {
namespace {

uint32_t crc_bitwise(const uint8_t* p, size_t n, uint32_t crc) {
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

TEST(Crc32c, CheckValue) {
  const char* s = "123456789";
  EXPECT_EQ(crc32c(s, 9), 0xE3069283u);  // the CRC-32C check value
  EXPECT_EQ(crc32c(s, 0), 0u);
}

TEST(Crc32c, EqualsBitwiseAtEveryBoundary) {
  std::mt19937_64 g(5);
  std::vector<uint8_t> buf(3 * 3 * 4096 + 64);
  for (auto& b : buf) b = uint8_t(g());
  std::vector<size_t> lengths;
  for (size_t n = 0; n < 80; ++n) lengths.push_back(n);
  for (size_t blocks = 1; blocks <= 3; ++blocks)
    for (long d = -9; d <= 9; ++d) lengths.push_back(size_t(long(blocks * 3 * 4096) + d));
  for (size_t n : lengths) {
    if (n > buf.size()) continue;
    for (uint32_t init : {0u, 0xDEADBEEFu}) {
      for (size_t off : {size_t(0), size_t(3)}) {  // unaligned starts too
        if (off + n > buf.size()) continue;
        ASSERT_EQ(crc32c(buf.data() + off, n, init), crc_bitwise(buf.data() + off, n, init)) << "n=" << n << " off=" << off << " init=" << init;
      }
    }
  }
}

TEST(Crc32c, ChainedEqualsWhole) {
  std::mt19937_64 g(6);
  std::vector<uint8_t> buf(100000);
  for (auto& b : buf) b = uint8_t(g());
  const uint32_t whole = crc32c(buf.data(), buf.size());
  for (size_t cut : {size_t(1), size_t(4095), size_t(12288), size_t(12289), size_t(50000), size_t(99999)})
    EXPECT_EQ(crc32c(buf.data() + cut, buf.size() - cut, crc32c(buf.data(), cut)), whole) << "cut " << cut;
}

// A rate printout (not a gate): the session checkpoints checksum hundreds of MB.
TEST(Crc32c, Rate) {
  std::vector<uint8_t> buf(size_t(64) << 20, 0x5A);
  const auto t0 = std::chrono::steady_clock::now();
  uint32_t c = 0;
  for (int i = 0; i < 4; ++i) c = crc32c(buf.data(), buf.size(), c);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The same bytes in 8 KiB calls: the single-chain path (below the interleave's 12 KiB block).
  const auto t1 = std::chrono::steady_clock::now();
  uint32_t c1 = 0;
  for (int i = 0; i < 4; ++i)
    for (size_t at = 0; at < buf.size(); at += 8192) c1 = crc32c(buf.data() + at, 8192, c1);
  const double s1 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  EXPECT_EQ(c1, c);
  std::printf("  crc32c: %.2f GB/s interleaved, %.2f GB/s in 8 KiB calls (one chain)\n", 4.0 * double(buf.size()) / s / 1e9,
              4.0 * double(buf.size()) / s1 / 1e9);
}

}  // namespace
}  // namespace fb
