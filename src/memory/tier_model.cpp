#include "memory/tier_model.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace fb::memory {

DecodeBound decode_bound(const DecodeLoad& l, const TierRates& r) {
  DecodeBound b;
  const double routed = l.expert_bytes * l.experts_per_token;
  const double miss_host = routed * l.host_hit, miss_drive = routed * std::max(0.0, 1.0 - l.hbm_hit - l.host_hit);
  // With host compute, a miss is computed on the host with probability f and copied otherwise;
  // f = t_copy / (t_copy + t_host) balances the two channels (each then takes the same time).
  if (r.host_expert_s > 0 && r.h2d_bytes_per_s > 0 && l.expert_bytes > 0) {
    const double t_copy = l.expert_bytes / r.h2d_bytes_per_s;
    b.host_share = t_copy / (t_copy + r.host_expert_s);
  }
  const double misses = (miss_host + miss_drive) / std::max(1.0, l.expert_bytes);  // expert loads per token
  // Every other byte is read from HBM by the kernels; copied misses first cross PCIe into a slot;
  // drive misses also cross the drive into pinned staging first (computed or copied after).
  b.hbm_s = r.hbm_bytes_per_s > 0 ? (l.dense_bytes + routed - b.host_share * (miss_host + miss_drive)) / r.hbm_bytes_per_s : 0;
  b.h2d_s = r.h2d_bytes_per_s > 0 ? (1.0 - b.host_share) * (miss_host + miss_drive) / r.h2d_bytes_per_s : 0;
  b.host_s = b.host_share * misses * r.host_expert_s;
  b.drive_s = miss_drive > 0 ? (r.drive_bytes_per_s > 0 ? miss_drive / r.drive_bytes_per_s : INFINITY) : 0;
  // serial: nothing overlaps but the copies and the host's experts, which run side by side
  b.serial_s = b.hbm_s + std::max(b.h2d_s, b.host_s) + b.drive_s;
  b.overlapped_s = std::max({b.hbm_s, b.h2d_s, b.host_s, b.drive_s});
  return b;
}

double DecodeBound::predicted_s(double accuracy) const {
  const double a = std::clamp(accuracy, 0.0, 1.0);
  return std::max(hbm_s, a * (h2d_s + drive_s)) + std::max((1.0 - a) * h2d_s, host_s) + (1.0 - a) * drive_s;
}

double zipf_top_share(int n, int k, double s) {
  double top = 0, all = 0;
  for (int i = 1; i <= n; ++i) {
    const double w = std::pow(double(i), -s);
    all += w;
    if (i <= k) top += w;
  }
  return top / all;
}

double zipf_exponent_for_top_share(int n, int top, double share) {
  double lo = 0, hi = 8;
  for (int it = 0; it < 60; ++it) {
    const double mid = 0.5 * (lo + hi);
    (zipf_top_share(n, top, mid) < share ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

double lfu_host_hit(double static_hbm, double static_host, double lfu_hbm, int slots, double host_per_layer) {
  const double lost = static_hbm - lfu_hbm;
  if (lost <= 0) return std::max(0.0, static_hbm + static_host - lfu_hbm);  // the policy beat static placement
  const double catch_share = slots > 0 ? std::min(1.0, std::max(0.0, host_per_layer) / double(slots)) : 1.0;
  return static_host + lost * catch_share;
}

double expected_max_load(int draws, int bins) {
  if (draws <= 0 || bins <= 0) return 0;
  if (bins == 1) return draws;
  // E[max] = sum over m >= 1 of P(max >= m) = 1 - P(every bin < m). The assignments with every
  // count below m number draws! [x^draws] (sum_{j<m} x^j / j!)^bins: the exponential generating
  // function, raised to the bins-th power one bin at a time, in doubles (draws is a top-k).
  double expected = 0;
  for (int m = 1; m <= draws; ++m) {
    std::vector<double> one(size_t(draws) + 1, 0.0), acc(size_t(draws) + 1, 0.0);
    double f = 1;  // j!
    for (int j = 0; j < m && j <= draws; ++j) {
      if (j > 0) f *= j;
      one[size_t(j)] = 1.0 / f;
    }
    acc[0] = 1;
    for (int b = 0; b < bins; ++b) {
      std::vector<double> next(size_t(draws) + 1, 0.0);
      for (int i = 0; i <= draws; ++i)
        for (int j = 0; i + j <= draws; ++j) next[size_t(i + j)] += acc[size_t(i)] * one[size_t(j)];
      acc.swap(next);
    }
    // P(all < m) = draws! acc[draws] / bins^draws
    double p = acc[size_t(draws)];
    for (int i = 1; i <= draws; ++i) p = p * double(i) / double(bins);
    expected += 1.0 - p;
  }
  return expected;
}

MultiGpuBound decode_bound_gpus(const DecodeLoad& l, const TierRates& r, int gpus, int layers, int top_k, double hidden_bytes,
                                const LinkRates& link) {
  MultiGpuBound m;
  const int G = std::max(1, gpus);
  m.busiest_share = top_k > 0 ? expected_max_load(top_k, G) / double(top_k) : 1.0;
  const double routed = l.expert_bytes * l.experts_per_token * m.busiest_share;
  const double miss_host = routed * l.host_hit, miss_drive_busiest = routed * std::max(0.0, 1.0 - l.hbm_hit - l.host_hit);
  const double miss_drive_all = l.expert_bytes * l.experts_per_token * std::max(0.0, 1.0 - l.hbm_hit - l.host_hit);
  DecodeBound& b = m.bound;
  b.hbm_s = r.hbm_bytes_per_s > 0 ? (l.dense_bytes + routed) / r.hbm_bytes_per_s : 0;
  b.h2d_s = r.h2d_bytes_per_s > 0 ? (miss_host + miss_drive_busiest) / r.h2d_bytes_per_s : 0;
  b.drive_s = miss_drive_all > 0 ? (r.drive_bytes_per_s > 0 ? miss_drive_all / r.drive_bytes_per_s : INFINITY) : 0;
  if (G > 1) {
    const double per_exchange = link.latency_s + (link.bytes_per_s > 0 ? hidden_bytes * double(G - 1) / link.bytes_per_s : 0);
    m.comm_s = double(layers) * 2.0 * per_exchange;
  }
  b.serial_s = b.hbm_s + b.h2d_s + b.drive_s + m.comm_s;
  b.overlapped_s = std::max({b.hbm_s + m.comm_s, b.h2d_s, b.drive_s});
  return m;
}

}  // namespace fb::memory
