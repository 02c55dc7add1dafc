// The expert-tier sweep of issue 9 (`flashbox bench --synthetic --experts 384 --expert-slots S
// --skews 0.3,0.45,0.6`): the released-dimension model with more routed experts than HBM slots,
// its routing replaced by draws from a Zipf law whose 10 hottest experts (a random set per layer)
// carry a given share of a layer's routes. Per skew: batch-1 decode ms/token after a warm-up, the
// HBM hit rate, the H2D rate of the miss copies against the measured pinned peak, and the
// tier-bound floor / ceiling (docs/tiers.md) computed from the measured all-hit step time and the
// measured misses; optionally one prefill chunk's expert sweep. [policy] benchmark-only: the
// replaced routing makes the outputs noise; only traffic and time are measured. The points run in
// order on the same slots (the baseline leaves each layer's S hottest experts resident), so a short
// warm-up starts near the static placement; storage::SlotSim replays a sweep on the host and gives
// the cold-start steady state (storage_route_sim_test).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "base/progress.h"
#include "base/status.h"
#include "cuda/executor.h"
#include "model/step.h"
#include "storage/route_sim.h"

namespace fb::bench {

struct TierSweepOptions {
  std::vector<double> skews = {0.30, 0.45, 0.60};  // share of a layer's routes on its 10 hottest experts
  int warm_steps = 512;  // decode steps before the counters start (fills the slots, trains LFU)
  int steps = 24;        // timed decode steps
  int64_t prefill_rows = 0;  // > 0: also one prefill chunk of this many rows per skew
  uint64_t seed = 7;
  // Next-layer prediction arms run at every skew, one after another (CudaRunOptions::
  // expert_predict): each value < 0 runs without prediction, each value in [0, 1] with it, the
  // executor's guesses replaced by storage::PredictedRouting at that accuracy (the sweep's routing
  // is drawn, so the router's own guess would be noise). Empty: one arm as the options stand.
  std::vector<double> predict_accuracy;
  ProgressFn progress;       // decode steps of each point (optional)
};

struct TierPoint {
  double top10_share = 0;    // 0: the all-hit baseline (routes drawn from the slots' experts only)
  double predict_accuracy = -2;  // the arm's guess accuracy; -1: prediction off; -2: no arms (options as they stand)
  double predicted_per_token = 0, predict_used_per_token = 0;  // experts copied ahead of a predicted use, and used
  // The tier model with prediction (memory::DecodeBound::predicted_s from the run's own counts):
  // the used guesses' copies and the wrong guesses' copies beside the all-hit step, the rest after.
  double predict_model_ms = 0;
  double ms_token = 0;       // median decode step
  double hit_rate = 0;       // HBM slot hits / expert lookups (decode, after the warm-up)
  double static_hit = 0;     // hit rate of the best static placement (the S hottest experts resident)
  double misses_per_token = 0;
  double bypassed_per_token = 0;  // misses staged, not admitted (LFU admission)
  double host_per_token = 0;      // misses computed on the host CPU (CudaRunOptions::host_compute)
  double host_ms_per_token = 0;   // the host's wall time computing them
  double copy_gbps = 0;      // H2D rate of the miss copies (bytes / copy-stream GPU time)
  double floor_ms = 0, ceiling_ms = 0;  // tier model: all-hit step + copies serial / overlapped
  double plan_ms = 0;        // the plan's prediction: static-placement misses, serial, at the pinned peak
  double prefill_s = 0, prefill_hit_rate = 0, prefill_copy_gbps = 0, prefill_misses = 0;
};

// The synthetic model's experts share one pool of weight bytes (loader/synthetic.cpp), which a host
// computing cold experts (CudaRunOptions::host_compute) would read from its caches; the real
// model's cold experts come from DRAM. This wraps the host's compute so that each job reads one of
// `n` distinct experts' bytes of the job's shape instead (round robin; random values made on first
// use): the host's time is that of reading cold bytes. The outputs are noise, as the sweep's routing
// already makes them ([policy] benchmark-only).
std::shared_ptr<const model::HostExpertCompute> cold_bytes_host_experts(std::shared_ptr<const model::HostExpertCompute> inner, int n);

// Next-layer prediction arms of the sweeps (this one and bench/drive_tier.h): `base` with
// expert_predict on for accuracy >= 0, the executor's guesses replaced by `guess` at that accuracy
// (its kept routing forgotten); accuracy < 0: prediction off, no guesses.
void use_predicted_routing(cuda::CudaExecutor& ex, const cuda::CudaRunOptions& base, const std::shared_ptr<storage::PredictedRouting>& guess,
                           double accuracy);

// `ex` must have tiered layers (CudaLoadOptions::expert_slots < experts); `s` a session at its
// decode context; `prefill_step(s0, s1, end)` builds prefill rows [s0, s1) of an `end`-row prompt.
// The first point is the all-hit baseline, then one per skew.
Result<std::vector<TierPoint>> run_tier_sweep(cuda::CudaExecutor& ex, model::SessionState& s, const TierSweepOptions& opt,
                                              double h2d_peak_gbps,
                                              const std::function<model::Step(int64_t, int64_t, int64_t)>& prefill_step);

}  // namespace fb::bench
