// Synthetic MoE routing and a host-side replay of the slot policy (issue 9, docs/tiers.md).
// ZipfRouting draws what the tier sweep forces on the GPU (bench/tier_sweep.h): per layer a random
// order of the experts, picks by rank from a Zipf law whose `top` hottest carry a given share, top_k
// distinct per row, ascending. simulate_slots() runs SlotCache over such a stream exactly as
// DevExpertSlots looks experts up in decode (one call per layer per token), so policies (LFU aging,
// admission, LRU) can be compared in seconds and checked against the device's measured hit rates.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "storage/slot_cache.h"

namespace fb::storage {

class ZipfRouting {
 public:
  // `share` <= 0: uniform over the first `pool` ranks (the all-hit baseline of the sweep).
  ZipfRouting(int n_layers, int n_experts, uint64_t seed);
  void set_skew(double share, int top = 10, int pool = 0);
  // ids [rows, k]: each row k distinct experts of `layer`, ascending.
  void draw(int layer, std::vector<int32_t>& ids, int64_t rows, int k);
  // The share of picks the `slots` hottest experts of a layer get (the best static placement).
  double static_hit(int slots) const;
  int n_experts() const { return n_experts_; }

 private:
  int n_experts_;
  std::vector<std::vector<int32_t>> order_;  // [layer][rank]
  std::vector<double> cdf_;                  // over ranks; empty: uniform over pool_
  int pool_ = 0;
  double exponent_ = 0;
  std::mt19937_64 rng_;
};

// A guess of a layer's routing with a chosen accuracy, for the tier sweep's next-layer prediction
// (cuda::CudaRunOptions::expert_predict; [policy] benchmark-only). predict(layer) draws the layer's
// routing now from `routes` and keeps it, and returns a guess: each row's experts, each kept with
// probability `accuracy`, else replaced by another draw from the same law that the row did not
// pick (a wrong guess is as likely hot as the law makes it). The next draw(layer) returns the
// kept routing (a fresh draw when none is kept). Accuracy = the share of the routing's (row,
// expert) picks the guess holds.
class PredictedRouting {
 public:
  PredictedRouting(ZipfRouting& routes, double accuracy, uint64_t seed) : routes_(routes), accuracy_(accuracy), rng_(seed) {}
  void predict(int layer, std::vector<int32_t>& guess, int64_t rows, int k);
  void draw(int layer, std::vector<int32_t>& ids, int64_t rows, int k);
  void set_accuracy(double a) { accuracy_ = a; }
  void forget() { kept_.clear(); }

 private:
  ZipfRouting& routes_;
  double accuracy_;
  std::mt19937_64 rng_;
  std::map<int, std::vector<int32_t>> kept_;
};

struct SlotSimOptions {
  int slots = 128;
  int aging = 8;                 // SlotCache aging (x slots lookups)
  int staging = 0;               // admission staging slots (0: admit every miss)
  EvictionPolicy policy = EvictionPolicy::kLfu;
  int top_k = 6;
  // The host cache under the slots (storage::TieredExperts with host views, as the CUDA executor
  // and the drive-tier bench run it): one SlotCache of `host_records` records shared by every
  // layer, keyed (layer, expert), SlotCache's default aging (8), looked up once per slot miss
  // (staged misses too); the records a layer looked up stay pinned until a later layer's lookup
  // (TieredExperts' layer epochs). 0: no host cache (every slot miss reads a drive).
  int64_t host_records = 0;
  int host_aging = 8;
};

struct SlotSimResult {
  double hit_rate = 0;           // over the lookups since reset_counts()
  double misses_per_token = 0;   // per decode token, summed over layers
  double host_hit_rate = 0;      // host cache hits / slot lookups (the same denominator as hit_rate)
  double drive_reads_per_token = 0;  // slot misses the host cache did not hold, per decode token
};

// One SlotCache per layer, looked up as DevExpertSlots::take does: a MoE call takes its distinct
// experts in waves (resident ones first), pinning up to `slots` per wave, staging colder misses
// while staging slots remain. State persists across calls, so a sequence of runs (the device
// sweep's order) can be replayed.
class SlotSim {
 public:
  SlotSim(int n_layers, const SlotSimOptions& o);
  void call(int layer, std::vector<int32_t> want);
  // `tokens` batch-1 decode tokens: every layer routes one row.
  void decode(ZipfRouting& r, int64_t tokens);
  // One prefill chunk of `rows` rows: every layer calls once with the distinct experts of its rows.
  void prefill(ZipfRouting& r, int64_t rows);
  void reset_counts();
  SlotSimResult result() const;
  const SlotCache* host() const { return host_.get(); }
  // Counts since reset_counts(): slot lookups, host cache hits, drive reads.
  uint64_t lookups() const { return hits_ + misses_; }
  uint64_t host_hits() const { return host_hits_; }
  uint64_t drive_reads() const { return drive_reads_; }

 private:
  void host_lookup(int layer, int32_t e);
  SlotSimOptions o_;
  std::vector<SlotCache> caches_;
  std::unique_ptr<SlotCache> host_;
  std::vector<int> host_pins_;  // host records pinned by the current layer epoch
  int epoch_layer_ = -1;
  uint64_t hits_ = 0, misses_ = 0, host_hits_ = 0, drive_reads_ = 0;
  int64_t tokens_ = 0;
};

}  // namespace fb::storage
