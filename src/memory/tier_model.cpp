#include "memory/tier_model.h"

#include <algorithm>
#include <cmath>

namespace fb::memory {

DecodeBound decode_bound(const DecodeLoad& l, const TierRates& r) {
  DecodeBound b;
  const double routed = l.expert_bytes * l.experts_per_token;
  const double miss_host = routed * l.host_hit, miss_drive = routed * std::max(0.0, 1.0 - l.hbm_hit - l.host_hit);
  // Every byte is read from HBM by the kernels; misses first cross PCIe into a slot; drive misses
  // also cross the drive into pinned staging first.
  b.hbm_s = r.hbm_bytes_per_s > 0 ? (l.dense_bytes + routed) / r.hbm_bytes_per_s : 0;
  b.h2d_s = r.h2d_bytes_per_s > 0 ? (miss_host + miss_drive) / r.h2d_bytes_per_s : 0;
  b.drive_s = miss_drive > 0 ? (r.drive_bytes_per_s > 0 ? miss_drive / r.drive_bytes_per_s : INFINITY) : 0;
  b.serial_s = b.hbm_s + b.h2d_s + b.drive_s;
  b.overlapped_s = std::max({b.hbm_s, b.h2d_s, b.drive_s});
  return b;
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

}  // namespace fb::memory
