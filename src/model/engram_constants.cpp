#include "model/engram_constants.h"

#include <limits>
#include <unordered_set>

#include "base/check.h"
#include "model/numpy_rng.h"

namespace fb::model {

namespace {

constexpr uint64_t kSeedStride = 10007;

uint64_t mulmod(uint64_t a, uint64_t b, uint64_t m) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) % m);
}

uint64_t powmod(uint64_t base, uint64_t exp, uint64_t m) {
  uint64_t result = 1 % m;
  base %= m;
  while (exp > 0) {
    if (exp & 1u) result = mulmod(result, base, m);
    base = mulmod(base, base, m);
    exp >>= 1;
  }
  return result;
}

}  // namespace

bool engram_is_prime(uint64_t n) {
  if (n < 2) return false;
  // Small primes: trial division; also the Miller-Rabin witnesses below.
  constexpr uint64_t kSmall[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
  for (uint64_t p : kSmall) {
    if (n % p == 0) return n == p;
  }
  uint64_t d = n - 1;
  int r = 0;
  while ((d & 1u) == 0) {
    d >>= 1;
    ++r;
  }
  // These 12 witnesses make Miller-Rabin deterministic for every n < 2^64.
  for (uint64_t a : kSmall) {
    uint64_t x = powmod(a, d, n);
    if (x == 1 || x == n - 1) continue;
    bool composite = true;
    for (int i = 1; i < r; ++i) {
      x = mulmod(x, x, n);
      if (x == n - 1) {
        composite = false;
        break;
      }
    }
    if (composite) return false;
  }
  return true;
}

int64_t engram_multiplier_bound(int64_t compressed_vocab) {
  FB_CHECK_GE(compressed_vocab, 1);
  const int64_t b = (std::numeric_limits<int64_t>::max() / compressed_vocab) / 2;
  return b > 1 ? b : 1;
}

std::vector<int64_t> engram_multipliers(int layer_id, int max_ngram, int64_t compressed_vocab) {
  FB_CHECK_GE(layer_id, 0);
  FB_CHECK_GE(max_ngram, 1);
  const int64_t bound = engram_multiplier_bound(compressed_vocab);
  const uint64_t seed = kSeedStride * static_cast<uint64_t>(layer_id);
  std::vector<int64_t> m = numpy_default_rng_integers(seed, 0, bound, max_ngram);
  for (int64_t& v : m) {
    v = 2 * v + 1;  // v < B <= (2^63-1)/2, so 2v+1 <= 2^63-1
  }
  return m;
}

std::vector<EngramTableConstants> engram_constants(const std::vector<int>& layer_ids,
                                                   int64_t engram_vocab_size, int max_ngram,
                                                   int n_heads, int64_t compressed_vocab) {
  FB_CHECK_GE(max_ngram, 2);
  FB_CHECK_GE(n_heads, 1);
  FB_CHECK_GE(engram_vocab_size, 1);
  FB_CHECK_GE(compressed_vocab, 1);
  std::unordered_set<int64_t> handed_out;
  std::vector<EngramTableConstants> tables;
  tables.reserve(layer_ids.size());
  for (int layer_id : layer_ids) {
    EngramTableConstants t;
    t.layer_id = layer_id;
    for (int order = 2; order <= max_ngram; ++order) {
      // The walk restarts at engram_vocab_size for every (table, order); the global skip-set
      // makes the result the next unused primes.
      int64_t candidate = engram_vocab_size;
      for (int h = 0; h < n_heads; ++h) {
        while (!engram_is_prime(static_cast<uint64_t>(candidate)) ||
               handed_out.count(candidate) != 0) {
          FB_CHECK_LT(candidate, std::numeric_limits<int64_t>::max());
          ++candidate;
        }
        handed_out.insert(candidate);
        t.primes.push_back(candidate);
      }
    }
    int64_t sum = 0;
    for (int64_t p : t.primes) {
      t.offsets.push_back(sum);
      FB_CHECK_LE(p, std::numeric_limits<int64_t>::max() - sum) << "engram table rows overflow";
      sum += p;
    }
    t.rows = sum;
    t.multipliers = engram_multipliers(layer_id, max_ngram, compressed_vocab);
    tables.push_back(std::move(t));
  }
  return tables;
}

}  // namespace fb::model
