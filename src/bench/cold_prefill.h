// Cold prefill through the expert tiers (issue 26; `flashbox bench --synthetic --experts 384
// --expert-slots 128 --cold-prefill 8192,32768`): whole prompts prefilled in chunks of the size the
// HBM budget allows (memory::prefill_chunk_rows over the free HBM), the experts that are not
// resident crossing PCIe in every chunk, once with serial copies (expert_prefetch off) and once
// streamed a layer ahead (on), each run from empty slots (DevExpertSlots::evict_all) under the
// router's own routing, from the slots the run before left under drawn routing (route_share). Per run: tok/s, copies (bytes, GPU time, rate), and per layer step
// the copy time against the step time, so the overlap shows. [policy] benchmark-only: the
// synthetic model's outputs are noise; traffic and time are what is measured.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/progress.h"
#include "base/status.h"
#include "bench/kernel_trace.h"
#include "cuda/executor.h"
#include "model/step.h"

namespace fb::bench {

struct ColdPrefillRun;

struct ColdPrefillTrace {
  int64_t prompt = 0, chunks = 0, layers = 0;
  CopyOverlap overlap;
  std::vector<std::pair<std::string, std::pair<int64_t, double>>> top;  // kernel name -> (calls, us), by time, the largest first
  std::vector<TraceRecord> recs;  // every record, sorted by start (bench --trace-csv writes them)
};

struct ColdPrefillOptions {
  std::vector<int64_t> prompts;          // prompt lengths (tokens)
  int64_t chunk = 0;                     // rows per chunk; 0: per prompt, the largest whose counted step fits the free HBM
  uint64_t margin_bytes = 2ull << 30;    // HBM left unplanned beside the count (memory::prefill_budget_from_free) ...
  double margin_frac = 0.02;             // ... plus this share of the device (allocator, cuBLASLt, what the count misses)
  int64_t serial_upto = INT64_MAX;       // also run prompts of at most this many tokens with expert_prefetch off (0: none)
  double deadline_s = 0;                 // > 0: skip a prompt whose predicted time (from the last streamed rate) would end past this
  // Whose routing the runs use. < 0: the synthetic model's router (its random weights send a
  // prompt's rows to a few dozen of a layer's 384 experts, so few experts cross PCIe: session 14's
  // finding); 0 (default): each row's k experts drawn uniformly from the layer's experts, so a
  // chunk of thousands of rows reaches nearly every expert, as a real prompt does; > 0: Zipf
  // routing whose 10 hottest experts of a layer carry this share (storage::ZipfRouting, the tier
  // sweep's draw). [policy] benchmark-only, like the rest of the bench: traffic and time are measured.
  double route_share = 0;
  uint64_t route_seed = 26;
  // Also a streamed run with SWA bounded replay (spec/11 §8.4, [approx-approved], off by default in
  // the product): rows below N - window leave the step at the decoder's first layer, so the decoder
  // layers (and their experts) run for the prompt's last window rows only: the CED schedule.
  bool replay = false;
  // After the first prompt's timed runs, one more streamed run of it traced with CUPTI
  // (bench/kernel_trace.h; CUDA builds with CUPTI only): how much of the copy time ran beside
  // kernels, how much was exposed, how long the GPU sat idle, and the kernels by time. Untimed.
  bool trace = false;
  // After the first prompt's runs: `ab_rounds` rounds of one streamed run per value of the CUDA
  // run option `ab_name` (cuda::set_run_option over the bench's options), interleaved; each run's
  // tok/s goes to on_ab (an option that changes no bits, e.g. dequant_x32, times only the kernels).
  std::string ab_name;
  std::vector<std::string> ab_values;
  int ab_rounds = 3;
  std::function<void(const std::string& value, int round, double tok_s)> on_ab;
  std::function<void(const ColdPrefillTrace&)> on_trace;
  std::function<void(const ColdPrefillRun&)> on_run;  // called as each run ends (CSV rows survive a timeout)
  ProgressFn progress;                   // tokens prefilled in each run (optional)
};

struct ColdPrefillRun {
  int64_t prompt = 0, chunk = 0, chunks = 0;
  bool prefetch = false;
  bool replay = false;  // bounded replay (ColdPrefillOptions::replay)
  double wall_s = 0, tok_s = 0;
  double copy_ms = 0, prefetch_ms = 0;  // GPU time of the slot-miss copies / the prefetch copies
  double copied_gb = 0, copy_gbps = 0;  // both kinds of copy; rate = bytes / their GPU time
  uint64_t hits = 0, misses = 0, prefetched = 0, prefetch_used = 0;
  double layer_step_ms = 0;   // wall / (chunks x layers)
  double layer_copy_ms = 0;   // copy GPU time / (chunks x tiered layers)
  uint64_t workspace_held = 0;  // the arena's buffer after the run (below workspace_high: it could not grow, steps fell back to cudaMalloc)
  uint64_t workspace_high = 0, predicted_bytes = 0;  // the step arena's high-water mark vs memory::prefill_step_bytes(...).arena()
  uint64_t tc_bytes = 0, predicted_tc = 0;            // tc_gemm's scratch held vs counted
  uint64_t budget_bytes = 0, free_bytes = 0;          // the prompt's sizing: free HBM and the budget after the margin
  double experts_per_layer_call = 0;  // distinct experts a tiered layer's MoE call needed, mean over calls (route_share >= 0 only)
};

// --cold-prefill-routing: "uniform" (0), "router" (-1) or a top-10 share in (0, 1); anything else
// is kInvalidArgument naming the choices.
Result<double> parse_route_share(const std::string& s);

struct ColdPrefillPlan {
  uint64_t staging_bytes = 0;  // the two prefetch staging buffers (reserved before any sizing)
};

// `ex` must have tiered layers. `prefill_step(s0, s1, end)` builds rows [s0, s1) of an `end`-row
// prompt. Per prompt: the arena and tc scratch are freed, the chunk is sized from free HBM by
// memory::prefill_step_bytes (staging already reserved), the arena reserved at the counted size,
// and one warm-up chunk at the prompt's end is checked against the count (a warning on stderr
// when its arena went past it) before anything is timed. HBM that runs out is kResourceExhausted
// with the sizes (free, budget, counted), never a bare CUDA error.
Result<std::vector<ColdPrefillRun>> run_cold_prefill(cuda::CudaExecutor& ex, const ColdPrefillOptions& opt, ColdPrefillPlan* plan,
                                                     const std::function<model::Step(int64_t, int64_t, int64_t)>& prefill_step);

}  // namespace fb::bench
