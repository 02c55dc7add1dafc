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
  // One routed expert for one token computed on the host CPU (issue 22's lever; 0: every miss is
  // copied). Misses, whose records pass through host memory either way, then split between the
  // copies and the host in proportion to their rates, both at once.
  double host_expert_s = 0;
};

struct DecodeLoad {
  double dense_bytes = 0;          // non-routed weight bytes read per token (HBM resident)
  double expert_bytes = 0;         // one routed expert
  double experts_per_token = 0;    // layers x top-k
  double hbm_hit = 0;              // share of expert loads found in HBM slots
  double host_hit = 0;             // share found in the host cache (the rest: drives)
};

struct DecodeBound {
  double hbm_s = 0, h2d_s = 0, drive_s = 0, host_s = 0;  // host_s: experts computed on the host
  double host_share = 0;                                  // of the misses, computed on the host
  double serial_s = 0, overlapped_s = 0;
  // With next-layer prediction (issue 22, CudaRunOptions::expert_predict): a share `accuracy` of
  // the misses is known a layer early, so their transfers (drive read, then copy) run beside the
  // kernels; the rest stays on the critical path as in serial_s. Host compute cannot start early
  // (it needs the layer's input), so it stays beside the late copies. accuracy 0 = serial_s.
  // Wrong guesses' copies are not counted (a guess is mostly a hot, resident expert).
  double predicted_s(double accuracy) const;
  double floor_tok_per_s() const { return serial_s > 0 ? 1.0 / serial_s : 0; }
  double ceiling_tok_per_s() const { return overlapped_s > 0 ? 1.0 / overlapped_s : 0; }
};

DecodeBound decode_bound(const DecodeLoad& load, const TierRates& rates);

// Routing skew as a Zipf law over `n` experts: the exponent for which the `top` most popular
// experts carry `share` of the routes, and the share of the `k` most popular under it.
double zipf_exponent_for_top_share(int n, int top, double share);
double zipf_top_share(int n, int k, double exponent);

// The host cache's share of a layer's expert loads when the HBM slots run a dynamic policy (LFU)
// that hits `lfu_hbm` where a static placement of the most popular experts would hit `static_hbm`,
// and the host cache holds the next `host_per_layer` experts (share `static_host`): the host keeps
// its own static share, and catches the loads the policy loses in HBM only in proportion to its
// size against the HBM slots' (`slots`): a host cache as large as the slots can hold what they
// evicted, a cache of 1.5 records per layer cannot (the H200 drive-tier bench, 64 host records:
// 0.0 host hits per token; docs/tiers.md). The rest goes to the drives.
double lfu_host_hit(double static_hbm, double static_host, double lfu_hbm, int slots, double host_per_layer);

// Several GPUs in one box (issue 25, a projection before any multi-GPU code exists): E[the largest
// count] when `draws` picks fall uniformly and independently on `bins` (exact up to rounding:
// a generating-function count, not an enumeration).
double expected_max_load(int draws, int bins);

// The link between the GPUs as the MoE exchange sees it: bytes/s and a fixed cost per exchange.
struct LinkRates {
  double bytes_per_s = 0;
  double latency_s = 0;
};

// The decode bound with the routed experts spread over `gpus` GPUs evenly by popularity (each holds
// every G-th most popular expert of a layer, so a layer's hits and misses fall on the GPUs like
// independent uniform picks) and the dense path on one GPU: a layer's expert reads and PCIe misses
// take as long as the busiest GPU's share, expected_max_load(top_k, G) / top_k of the routed bytes
// (each GPU has its own HBM and PCIe link; the drives are shared); and per MoE layer two exchanges
// (the token's hidden state out to the other G - 1 GPUs, their partial sums back) on the critical
// path. gpus = 1 is decode_bound. `comm_s` in the result is the exchanges' time.
struct MultiGpuBound {
  DecodeBound bound;  // serial / overlapped include comm_s
  double comm_s = 0;
  double busiest_share = 1;  // expected_max_load(top_k, gpus) / top_k
};
MultiGpuBound decode_bound_gpus(const DecodeLoad& load, const TierRates& rates, int gpus, int layers, int top_k, double hidden_bytes,
                                const LinkRates& link);

}  // namespace fb::memory
