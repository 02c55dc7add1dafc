// Tier-bound decode model (docs/tiers.md): given where a token's expert loads are served from
// (HBM slot, pinned host RAM over PCIe, drive) and the measured rates, the time a batch-1 decode
// token needs at least. `serial` assumes no overlap (the floor); `overlapped` assumes the three
// transfers run concurrently (the ceiling without prediction). Pure arithmetic.
#pragma once

namespace fb::memory {

struct TierRates {
  double hbm_bytes_per_s = 0;
  double h2d_bytes_per_s = 0;    // pinned host -> device
  double drive_bytes_per_s = 0;  // all drives together
};

struct DecodeLoad {
  double dense_bytes = 0;          // non-routed weight bytes read per token (HBM resident)
  double expert_bytes = 0;         // one routed expert
  double experts_per_token = 0;    // layers x top-k
  double hbm_hit = 0;              // share of expert loads found in HBM slots
  double host_hit = 0;             // share found in the host cache (the rest: drives)
};

struct DecodeBound {
  double hbm_s = 0, h2d_s = 0, drive_s = 0;
  double serial_s = 0, overlapped_s = 0;
  double floor_tok_per_s() const { return serial_s > 0 ? 1.0 / serial_s : 0; }
  double ceiling_tok_per_s() const { return overlapped_s > 0 ? 1.0 / overlapped_s : 0; }
};

DecodeBound decode_bound(const DecodeLoad& load, const TierRates& rates);

// Routing skew as a Zipf law over `n` experts: the exponent for which the `top` most popular
// experts carry `share` of the routes, and the share of the `k` most popular under it.
double zipf_exponent_for_top_share(int n, int top, double share);
double zipf_top_share(int n, int k, double exponent);

}  // namespace fb::memory
