#include "base/crc32c.h"

#include <array>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace fb {

namespace {

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

uint32_t crc_table(const uint8_t* p, size_t n, uint32_t c) {
  static const std::array<uint32_t, 256> t = make_table();
  for (size_t i = 0; i < n; ++i) c = t[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc_hw1(const uint8_t* p, size_t n, uint32_t c) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
    p += 8;
    n -= 8;
  }
  c = uint32_t(c64);
  while (n--) c = _mm_crc32_u8(c, *p++);
  return c;
}

// Three streams at once: the crc32 instruction's latency (3 cycles) is three times its issue
// interval, so one dependent chain runs at a third of the rate. A block of 3 kStripe bytes runs as
// three chains (the first continuing the running register, the other two from 0); the register is
// linear over GF(2), so reg(s, A|B|C) = shift(reg(s, A), 2 kStripe) ^ shift(reg(0, B), kStripe) ^
// reg(0, C), with shift(x, L) = the register after L zero bytes, a linear map applied through four
// 256-entry tables per L built once from the single-chain code.
constexpr size_t kStripe = 4096;

struct ShiftTables {
  uint32_t t[4][256];
  explicit ShiftTables(size_t zeros) {
    static const std::vector<uint8_t> z(2 * kStripe, 0);
    uint32_t basis[32];
    for (int b = 0; b < 32; ++b) basis[b] = crc_hw1(z.data(), zeros, uint32_t(1) << b);
    for (int k = 0; k < 4; ++k)
      for (int v = 0; v < 256; ++v) {
        uint32_t r = 0;
        for (int bit = 0; bit < 8; ++bit)
          if (v >> bit & 1) r ^= basis[8 * k + bit];
        t[k][v] = r;
      }
  }
  uint32_t operator()(uint32_t x) const { return t[0][x & 0xFF] ^ t[1][x >> 8 & 0xFF] ^ t[2][x >> 16 & 0xFF] ^ t[3][x >> 24]; }
};

__attribute__((target("sse4.2"))) uint32_t crc_hw(const uint8_t* p, size_t n, uint32_t c) {
  if (n >= 3 * kStripe) {
    static const ShiftTables one(kStripe), two(2 * kStripe);
    while (n >= 3 * kStripe) {
      uint64_t a = c, b = 0, d = 0;
      for (size_t i = 0; i < kStripe; i += 8) {
        uint64_t va, vb, vd;
        std::memcpy(&va, p + i, 8);
        std::memcpy(&vb, p + kStripe + i, 8);
        std::memcpy(&vd, p + 2 * kStripe + i, 8);
        a = _mm_crc32_u64(a, va);
        b = _mm_crc32_u64(b, vb);
        d = _mm_crc32_u64(d, vd);
      }
      c = two(uint32_t(a)) ^ one(uint32_t(b)) ^ uint32_t(d);
      p += 3 * kStripe;
      n -= 3 * kStripe;
    }
  }
  return crc_hw1(p, n, c);
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("sse4.2")) return ~crc_hw(p, n, c);
#endif
  return ~crc_table(p, n, c);
}

}  // namespace fb
