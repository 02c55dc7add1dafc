#include "model/numpy_rng.h"

#include <limits>

#include "base/check.h"

namespace fb::model {

namespace {

using u128 = unsigned __int128;

// SeedSequence hashing constants (numpy/random/bit_generator.pyx).
constexpr uint32_t kInitA = 0x43b0d7e5u;
constexpr uint32_t kMultA = 0x931e8875u;
constexpr uint32_t kInitB = 0x8b51f9ddu;
constexpr uint32_t kMultB = 0x58f38dedu;
constexpr uint32_t kMixMultL = 0xca01f9ddu;
constexpr uint32_t kMixMultR = 0x4973f715u;
constexpr int kXShift = 16;  // half the bit width of uint32
constexpr int kPoolSize = 4;

// PCG64 default multiplier (pcg64.h), 128 bits as (hi, lo).
constexpr u128 kPcgMultiplier =
    (static_cast<u128>(2549297995355413924ull) << 64) | static_cast<u128>(4865540595714422341ull);

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixMultL * x - kMixMultR * y;
  r ^= r >> kXShift;
  return r;
}

// _int_to_uint32_array: little-endian 32-bit words; 0 becomes one zero word.
std::vector<uint32_t> seed_words(uint64_t seed) {
  std::vector<uint32_t> words;
  if (seed == 0) {
    words.push_back(0);
  }
  while (seed > 0) {
    words.push_back(static_cast<uint32_t>(seed & 0xffffffffull));
    seed >>= 32;
  }
  return words;
}

std::array<uint32_t, kPoolSize> mixed_pool(uint64_t seed) {
  const std::vector<uint32_t> entropy = seed_words(seed);
  std::array<uint32_t, kPoolSize> pool{};
  uint32_t hash_const = kInitA;
  for (int i = 0; i < kPoolSize; ++i) {
    const uint32_t word = i < static_cast<int>(entropy.size()) ? entropy[i] : 0u;
    pool[i] = hashmix(word, hash_const);
  }
  for (int src = 0; src < kPoolSize; ++src) {
    for (int dst = 0; dst < kPoolSize; ++dst) {
      if (src != dst) {
        pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
      }
    }
  }
  // A uint64 seed has at most 2 words, so no entropy is left beyond the pool; kept for clarity.
  for (size_t src = kPoolSize; src < entropy.size(); ++src) {
    for (int dst = 0; dst < kPoolSize; ++dst) {
      pool[dst] = mix(pool[dst], hashmix(entropy[src], hash_const));
    }
  }
  return pool;
}

// Lemire's method as NumPy writes it twice: on 32 bits (buffered_bounded_lemire_uint32, U =
// uint32_t, Wide = uint64_t, draws next_uint32) and on 64 bits (bounded_lemire_uint64, U =
// uint64_t, Wide = u128, draws next_uint64); rng < the largest U.
template <typename U, typename Wide, typename Draw>
U bounded_lemire(Draw draw, U rng) {
  const U rng_excl = rng + 1u;
  Wide m = static_cast<Wide>(draw()) * rng_excl;
  U leftover = static_cast<U>(m);
  if (leftover < rng_excl) {
    const U threshold = (std::numeric_limits<U>::max() - rng) % rng_excl;
    while (leftover < threshold) {
      m = static_cast<Wide>(draw()) * rng_excl;
      leftover = static_cast<U>(m);
    }
  }
  return static_cast<U>(m >> (8 * sizeof(U)));
}

}  // namespace

std::vector<uint32_t> numpy_seed_sequence_state_u32(uint64_t seed, int n_words) {
  FB_CHECK_GE(n_words, 0);
  const std::array<uint32_t, kPoolSize> pool = mixed_pool(seed);
  std::vector<uint32_t> out(static_cast<size_t>(n_words));
  uint32_t hash_const = kInitB;
  for (int i = 0; i < n_words; ++i) {
    uint32_t v = pool[i % kPoolSize];
    v ^= hash_const;
    hash_const *= kMultB;
    v *= hash_const;
    v ^= v >> kXShift;
    out[i] = v;
  }
  return out;
}

NumpyPcg64::NumpyPcg64(uint64_t seed) {
  // generate_state(4, uint64): 8 uint32 words, pairs read as little-endian uint64.
  const std::vector<uint32_t> w = numpy_seed_sequence_state_u32(seed, 8);
  uint64_t v[4];
  for (int k = 0; k < 4; ++k) {
    v[k] = static_cast<uint64_t>(w[2 * k]) | (static_cast<uint64_t>(w[2 * k + 1]) << 32);
  }
  *this = NumpyPcg64(v[0], v[1], v[2], v[3]);
}

NumpyPcg64::NumpyPcg64(uint64_t initstate_hi, uint64_t initstate_lo, uint64_t initseq_hi,
                       uint64_t initseq_lo) {
  const u128 initstate = (static_cast<u128>(initstate_hi) << 64) | initstate_lo;
  const u128 initseq = (static_cast<u128>(initseq_hi) << 64) | initseq_lo;
  // pcg_setseq_128_srandom_r
  state_ = 0;
  inc_ = (initseq << 1) | 1u;
  step();
  state_ += initstate;
  step();
  has_uint32_ = false;
  uinteger_ = 0;
}

void NumpyPcg64::step() { state_ = state_ * kPcgMultiplier + inc_; }

uint64_t NumpyPcg64::next_uint64() {
  step();
  const uint64_t hi = static_cast<uint64_t>(state_ >> 64);
  const uint64_t lo = static_cast<uint64_t>(state_);
  const unsigned rot = static_cast<unsigned>(hi >> 58);
  const uint64_t x = hi ^ lo;
  return (x >> rot) | (x << ((64u - rot) & 63u));
}

uint32_t NumpyPcg64::next_uint32() {
  if (has_uint32_) {
    has_uint32_ = false;
    return uinteger_;
  }
  const uint64_t next = next_uint64();
  has_uint32_ = true;
  uinteger_ = static_cast<uint32_t>(next >> 32);
  return static_cast<uint32_t>(next);
}

std::array<uint64_t, 2> NumpyPcg64::state() const {
  return {static_cast<uint64_t>(state_ >> 64), static_cast<uint64_t>(state_)};
}

std::array<uint64_t, 2> NumpyPcg64::increment() const {
  return {static_cast<uint64_t>(inc_ >> 64), static_cast<uint64_t>(inc_)};
}

void numpy_bounded_uint64_fill(NumpyPcg64& gen, uint64_t off, uint64_t rng, int64_t cnt,
                               uint64_t* out) {
  FB_CHECK_GE(cnt, 0);
  if (rng == 0) {
    for (int64_t i = 0; i < cnt; ++i) out[i] = off;
  } else if (rng <= 0xFFFFFFFFull) {
    if (rng == 0xFFFFFFFFull) {
      // 32-bit Lemire cannot take rng = 2^32-1: raw 32-bit draws.
      for (int64_t i = 0; i < cnt; ++i) out[i] = off + gen.next_uint32();
    } else {
      const uint32_t r32 = static_cast<uint32_t>(rng);
      for (int64_t i = 0; i < cnt; ++i) out[i] = off + bounded_lemire<uint32_t, uint64_t>([&] { return gen.next_uint32(); }, r32);
    }
  } else if (rng == UINT64_MAX) {
    for (int64_t i = 0; i < cnt; ++i) out[i] = off + gen.next_uint64();
  } else {
    for (int64_t i = 0; i < cnt; ++i) out[i] = off + bounded_lemire<uint64_t, u128>([&] { return gen.next_uint64(); }, rng);
  }
}

std::vector<int64_t> numpy_default_rng_integers(uint64_t seed, int64_t low, int64_t high,
                                                int64_t n) {
  FB_CHECK_GE(n, 0);
  FB_CHECK_LT(low, high) << "integers(low, high) needs low < high";
  std::vector<int64_t> result(static_cast<size_t>(n));
  if (n == 0) {
    return result;  // NumPy returns an empty array without touching the generator.
  }
  // Closed interval [low, high - 1]; the difference fits in uint64 because low < high.
  const uint64_t rng = static_cast<uint64_t>(high - 1) - static_cast<uint64_t>(low);
  const uint64_t off = static_cast<uint64_t>(low);
  NumpyPcg64 gen(seed);
  std::vector<uint64_t> raw(static_cast<size_t>(n));
  numpy_bounded_uint64_fill(gen, off, rng, n, raw.data());
  for (int64_t i = 0; i < n; ++i) {
    result[i] = static_cast<int64_t>(raw[i]);  // two's complement wrap, as NumPy's cast
  }
  return result;
}

}  // namespace fb::model
