// Engram hash constants derived from the config (spec/10 §6, spec/11 §6.2): per-table primes,
// offsets, row counts and multipliers. Pure functions of the config; no tokenizer needed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fb::model {

struct EngramTableConstants {
  int layer_id = 0;
  std::vector<int64_t> primes;   // [n_orders * n_heads], flat (order, head); order = 2..max_ngram
  std::vector<int64_t> offsets;  // exclusive prefix sums of `primes` in the same flat order
  int64_t rows = 0;              // sum of `primes` (= engram_num_embeddings of the table)
  std::vector<int64_t> multipliers;  // [max_ngram]; s = 0 is the current token; all odd
};

// Multiplier bound B = max(1, ((2^63 - 1) // V) // 2) for compressed vocab size V >= 1.
int64_t engram_multiplier_bound(int64_t compressed_vocab);

// Multipliers of one table: default_rng(10007 * layer_id).integers(0, B, size=max_ngram, int64),
// each v mapped to 2v + 1.
std::vector<int64_t> engram_multipliers(int layer_id, int max_ngram, int64_t compressed_vocab);

// Deterministic primality test for all 64-bit values (used by the prime walk).
bool engram_is_prime(uint64_t n);

// One table per entry of `layer_ids`, in that (config) order. Primes: for each table, for each
// n-gram order 2..max_ngram, for each head, the smallest prime >= engram_vocab_size not handed
// out before (the skip-set spans all tables). Requires max_ngram >= 2, n_heads >= 1,
// engram_vocab_size >= 1, compressed_vocab >= 1, layer_id >= 0 (FB_CHECK).
std::vector<EngramTableConstants> engram_constants(const std::vector<int>& layer_ids,
                                                   int64_t engram_vocab_size, int max_ngram,
                                                   int n_heads, int64_t compressed_vocab);

// spec/11 §6.3: the hashed row ids of every table for the row at position `pos`, written to
// out[(tab * (max_ngram - 1) + n) * n_heads + h] (tables in config order, n-gram order n + 2).
// cls(p) is the class of position p (p >= 0), negative for a DEAD (image) position; a DEAD or
// negative position blocks it and everything further back, which then use pad_class. Shared by
// the CPU and CUDA executors (host integer math).
template <class ClassOf>
void engram_row_ids(const std::vector<EngramTableConstants>& tables, int max_ngram, int n_heads, int64_t pad_class, int64_t pos,
                    ClassOf cls, int64_t* out) {
  const int n_ord = max_ngram - 1;
  std::vector<int64_t> pi(static_cast<size_t>(max_ngram));
  for (size_t tab = 0; tab < tables.size(); ++tab) {
    const EngramTableConstants& k = tables[tab];
    bool blocked = false;
    for (int sidx = 0; sidx < max_ngram; ++sidx) {
      const int64_t p = pos - sidx;
      const int64_t cl = p >= 0 ? cls(p) : -1;
      blocked = blocked || p < 0 || cl < 0;
      const int64_t u = blocked ? pad_class : cl;
      pi[size_t(sidx)] = int64_t(uint64_t(u) * uint64_t(k.multipliers[size_t(sidx)]));
    }
    int64_t x = pi[0];
    for (int n = 0; n < n_ord; ++n) {
      x ^= pi[size_t(n + 1)];
      for (int h = 0; h < n_heads; ++h) {
        const size_t col = size_t(n * n_heads + h);
        out[(tab * size_t(n_ord)) * size_t(n_heads) + col] = x % k.primes[col] + k.offsets[col];
      }
    }
  }
}

}  // namespace fb::model
