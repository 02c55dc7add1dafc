#include "storage/route_sim.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "base/check.h"
#include "memory/tier_model.h"

namespace fb::storage {

ZipfRouting::ZipfRouting(int n_layers, int n_experts, uint64_t seed) : n_experts_(n_experts), rng_(seed) {
  order_.resize(size_t(n_layers));
  for (auto& o : order_) {
    o.resize(size_t(n_experts));
    for (int e = 0; e < n_experts; ++e) o[size_t(e)] = e;
    std::shuffle(o.begin(), o.end(), rng_);
  }
}

void ZipfRouting::set_skew(double share, int top, int pool) {
  FB_CHECK(share > 0 || pool > 0) << "uniform routing needs a pool of experts";
  cdf_.clear();
  pool_ = pool;
  exponent_ = 0;
  if (share <= 0) return;
  exponent_ = memory::zipf_exponent_for_top_share(n_experts_, top, share);
  cdf_.assign(size_t(n_experts_), 0.0);
  double sum = 0, acc = 0;
  for (int r = 0; r < n_experts_; ++r) sum += std::pow(double(r + 1), -exponent_);
  for (int r = 0; r < n_experts_; ++r) {
    acc += std::pow(double(r + 1), -exponent_) / sum;
    cdf_[size_t(r)] = acc;
  }
}

double ZipfRouting::static_hit(int slots) const {
  if (cdf_.empty()) return slots >= pool_ ? 1.0 : double(slots) / double(pool_);
  return memory::zipf_top_share(n_experts_, slots, exponent_);
}

void ZipfRouting::draw(int layer, std::vector<int32_t>& ids, int64_t rows, int k) {
  const std::vector<int32_t>& ord = order_.at(size_t(layer));
  FB_CHECK(k <= (cdf_.empty() ? pool_ : n_experts_)) << k << " distinct experts per row from " << (cdf_.empty() ? pool_ : n_experts_);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t r = 0; r < rows; ++r) {
    int32_t* row = ids.data() + r * k;
    int got = 0;
    while (got < k) {
      size_t rank;
      if (cdf_.empty()) {
        rank = size_t(rng_() % uint64_t(std::max(1, pool_)));
      } else {
        rank = size_t(std::lower_bound(cdf_.begin(), cdf_.end(), u(rng_)) - cdf_.begin());
        rank = std::min(rank, ord.size() - 1);
      }
      const int32_t e = ord[rank];
      if (std::find(row, row + got, e) == row + got) row[got++] = e;
    }
    std::sort(row, row + k);
  }
}

void PredictedRouting::predict(int layer, std::vector<int32_t>& guess, int64_t rows, int k) {
  std::vector<int32_t>& real = kept_[layer];
  real.assign(size_t(rows * k), -1);
  routes_.draw(layer, real, rows, k);
  guess = real;
  std::vector<int32_t> other(static_cast<size_t>(k));
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* row = real.data() + r * k;
    int32_t* g = guess.data() + r * k;
    for (int i = 0; i < k; ++i) {
      if (u(rng_) < accuracy_) continue;
      // a wrong guess: an expert of the law's draws that neither the row nor the guess holds
      for (int tries = 0; tries < 64; ++tries) {
        routes_.draw(layer, other, 1, k);
        const int32_t e = other[size_t(rng_() % uint64_t(k))];
        if (std::find(row, row + k, e) == row + k && std::find(g, g + k, e) == g + k) {
          g[i] = e;
          break;
        }
      }
    }
    std::sort(g, g + k);
  }
}

void PredictedRouting::draw(int layer, std::vector<int32_t>& ids, int64_t rows, int k) {
  auto it = kept_.find(layer);
  if (it != kept_.end() && it->second.size() == size_t(rows * k)) {
    ids = it->second;
    kept_.erase(it);
    return;
  }
  if (it != kept_.end()) kept_.erase(it);
  ids.resize(size_t(rows * k));
  routes_.draw(layer, ids, rows, k);
}

SlotSim::SlotSim(int n_layers, const SlotSimOptions& o) : o_(o) {
  for (int l = 0; l < n_layers; ++l) caches_.emplace_back(o.slots, o.policy, o.aging);
  if (o.host_records > 0) host_ = std::make_unique<SlotCache>(int(o.host_records), o.policy, o.host_aging);
}

void SlotSim::host_lookup(int layer, int32_t e) {
  if (!host_) {
    ++drive_reads_;
    return;
  }
  if (layer != epoch_layer_) {  // TieredExperts::expert: a new layer's call ends the last epoch's pins
    for (int h : host_pins_) host_->release(h);
    host_pins_.clear();
    epoch_layer_ = layer;
  }
  const SlotCache::Lookup h = host_->acquire(host_record_key(layer, e));
  if (h.slot >= 0) host_pins_.push_back(h.slot);
  if (h.hit) ++host_hits_;
  else ++drive_reads_;  // a miss reads the drives (into the record, or past a fully pinned cache)
}

void SlotSim::call(int layer, std::vector<int32_t> want) {
  replay_call(caches_.at(size_t(layer)), std::move(want), o_.staging, [&](const WaveTake& t) {  // the waves of DevExpertSlots::take
    (t.hit ? hits_ : misses_) += 1;
    if (!t.hit) host_lookup(layer, t.expert);  // the slot's copy asks the source for the expert
  });
}

void SlotSim::decode(ZipfRouting& r, int64_t tokens) {
  std::vector<int32_t> ids(size_t(o_.top_k));
  for (int64_t t = 0; t < tokens; ++t)
    for (int l = 0; l < int(caches_.size()); ++l) {
      r.draw(l, ids, 1, o_.top_k);
      call(l, ids);
    }
  tokens_ += tokens;
}

void SlotSim::prefill(ZipfRouting& r, int64_t rows) {
  std::vector<int32_t> ids(size_t(rows * o_.top_k));
  for (int l = 0; l < int(caches_.size()); ++l) {
    r.draw(l, ids, rows, o_.top_k);
    std::vector<int32_t> want(ids);
    std::sort(want.begin(), want.end());
    want.erase(std::unique(want.begin(), want.end()), want.end());
    call(l, want);
  }
}

void SlotSim::reset_counts() {
  hits_ = misses_ = host_hits_ = drive_reads_ = 0;
  tokens_ = 0;
}

SlotSimResult SlotSim::result() const {
  SlotSimResult r;
  const uint64_t lookups = hits_ + misses_;
  r.hit_rate = lookups ? double(hits_) / double(lookups) : 1.0;
  r.misses_per_token = tokens_ > 0 ? double(misses_) / double(tokens_) : 0.0;
  r.host_hit_rate = lookups ? double(host_hits_) / double(lookups) : 0.0;
  r.drive_reads_per_token = tokens_ > 0 ? double(drive_reads_) / double(tokens_) : 0.0;
  return r;
}

}  // namespace fb::storage
