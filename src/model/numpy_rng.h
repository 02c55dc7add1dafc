// Bit-exact port of NumPy's `numpy.random.default_rng(seed).integers(low, high, size=n,
// dtype=np.int64)` (NumPy >= 1.17 Generator path): SeedSequence entropy mixing (pool of 4 uint32)
// -> generate_state(4, uint64) -> PCG64 (128-bit LCG, XSL-RR output, next_uint32 buffering of the
// high half) -> Lemire's bounded-integer rejection (32-bit variant when the range fits in 32 bits).
// Used for the Engram hash multipliers (spec/11 §6.2); checked against NumPy's own output in
// numpy_rng_test.cpp (golden file produced by tools/gen_numpy_rng_golden.py).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace fb::model {

// NumPy's SeedSequence(entropy=seed) with the default pool size 4, no spawn key.
// Returns generate_state(n_words, dtype=uint32).
std::vector<uint32_t> numpy_seed_sequence_state_u32(uint64_t seed, int n_words);

// NumPy's PCG64 bit generator (state and increment as 128-bit values, has_uint32 buffer).
class NumpyPcg64 {
 public:
  // Seeded as numpy.random.PCG64(seed) seeds itself: SeedSequence(seed).generate_state(4, uint64)
  // gives [state_hi, state_lo, inc_hi, inc_lo] for pcg64_set_seed.
  explicit NumpyPcg64(uint64_t seed);
  // pcg64_set_seed(initstate, initseq) directly (both as (hi, lo) halves).
  NumpyPcg64(uint64_t initstate_hi, uint64_t initstate_lo, uint64_t initseq_hi,
             uint64_t initseq_lo);

  uint64_t next_uint64();
  // Low 32 bits of a fresh 64-bit draw first; the high 32 bits are kept for the next call.
  uint32_t next_uint32();

  // Current LCG state / increment as {hi, lo} (matches bit_generator.state['state']).
  std::array<uint64_t, 2> state() const;
  std::array<uint64_t, 2> increment() const;

 private:
  void step();
  unsigned __int128 state_ = 0;
  unsigned __int128 inc_ = 0;
  bool has_uint32_ = false;
  uint32_t uinteger_ = 0;
};

// NumPy's random_bounded_uint64_fill with use_masked = false (the Generator path): `cnt` values in
// the closed interval [off, off + rng] (wrapping mod 2^64).
void numpy_bounded_uint64_fill(NumpyPcg64& gen, uint64_t off, uint64_t rng, int64_t cnt,
                               uint64_t* out);

// Exact numpy.random.Generator(PCG64(SeedSequence(seed))).integers(low, high, size=n,
// dtype=np.int64) with endpoint=False. Requires low < high and n >= 0 (FB_CHECK).
std::vector<int64_t> numpy_default_rng_integers(uint64_t seed, int64_t low, int64_t high,
                                                int64_t n);

}  // namespace fb::model
