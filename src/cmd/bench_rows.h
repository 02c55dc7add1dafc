// flashbox bench (bench.cpp): the command's arguments, its CSV rows, the synthetic prefill steps, and
// the expert-tier row runners that live in bench_tiers.cpp (issue 9 sweep, issue 26 cold prefill,
// issue 22 drive tier). CUDA builds only; command-line code, no kernels.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "base/status.h"
#include "bench/drive_tier.h"
#include "bench/limits.h"
#include "cuda/executor.h"
#include "model/config.h"
#include "model/step.h"

namespace fb::cmd {

struct BenchArgs {
  bool limits = false;
  bool synthetic = false;
  std::string model;
  std::string csv;
  int reps = 10;
  int steps = 10;
  int experts = 16;
  int draft_experts = 16;
  int64_t engram_vocab = 100000;
  std::vector<std::string> engram_drives;  // Engram tables written there and read through a row cache (bench::make_engram_drive_cache)
  int64_t engram_cache_bytes = 0;
  std::string engram_place = "auto";  // where the synthetic model's Engram tables live: auto | hbm | host (cuda::EngramPlace)
  std::vector<int64_t> contexts = {4096, 32768, 131072};
  int64_t prompt_len = 64;
  int verify_rows = 6;
  bool dspark_sweep = false;
  bool sweep_schedule = false;
  std::vector<int64_t> prefill;  // prompt lengths for --synthetic prefill rows
  int64_t prefill_chunk = 2048;
  std::vector<double> accept = {0.0, 0.5, 0.8, 1.0};
  int64_t sweep_tokens = 240;  // ~60 rounds at p = 0.8: 24 tokens (~7 rounds) could not read the ratio (session 19)
  bool profile = false;
  bool profile_kernels = false;
  bool graph_step = false;
  int trace_steps = 0;    // --trace-steps: CUPTI timeline of this many decode (and verify) steps
  std::string trace_csv;  // --trace-csv: the median traced steps' records
  std::vector<int64_t> prefill_at;
  std::vector<int64_t> prefill_gemms;
  std::string ab_env;
  int ab_rounds = 3;  // --ab: interleaved rounds per value (medians)
  std::string prefill_ab_env;
  std::string numerics = "fast";
  std::vector<std::string> cuda_opts;
  int expert_slots = 0;
  int expert_staging = 0;
  int lfu_aging = 64;
  std::vector<double> skews = {0.30, 0.45, 0.60};
  int64_t tier_prefill_rows = 2048;
  std::vector<int64_t> cold_prefill;  // issue 26: prompt lengths prefilled through the expert tiers
  int64_t cold_prefill_chunk = 0;     // 0: the largest chunk the free HBM allows
  int64_t cold_prefill_serial = 1;    // also prompts with expert_prefetch off: 1 all, 0 none, N > 1 those of at most N tokens
  double cold_prefill_deadline = 0;   // seconds; later prompts are skipped when predicted to end past it (0: none)
  std::string cold_prefill_routing = "uniform";  // uniform | router | a top-10 share in (0, 1) (ColdPrefillOptions::route_share)
  bool cold_prefill_replay = false;   // also a streamed run with bounded replay (the CED figure)
  bool cold_prefill_trace = false;
  std::string cold_prefill_ab;        // NAME=a,b: streamed runs of the first prompt per value, interleaved (3 rounds)    // one more streamed run of the first prompt traced with CUPTI (copy / kernel overlap)
  int tier_warm_steps = 512;
  std::vector<double> predict_accuracy;  // tier sweep: next-layer prediction arms (< 0 off; bench::TierSweepOptions); drive tier: the first >= 0
  std::vector<std::string> expert_drives;  // issue 22: replica dirs of the drive tier (bench/drive_tier.h)
  int64_t host_experts = 64;               // ... its host cache records
  int drive_records = 64;                  // ... expert records written per drive
  std::vector<std::string> drive_faults;  // ... replica faults injected mid-run (storage::parse_reader_fault)
  int drive_warm_steps = 8;                // ... decode steps through the drives before each timed arm
  int drive_replay_tokens = 3000;          // ... decode tokens replayed in the slot and host caches first (DriveTierOptions)
  std::vector<int64_t> kv_restore;  // contexts for the disk KV cache restore rows
  std::string kv_dir;               // their state files ("": the temp folder)
  bool kv_restore_estimate = false;
  std::vector<int> sessions;        // issue 20: session counts of the shared-step rows
  int64_t sessions_context = 4096;
  int session_rounds = 32;
  bool sessions_dspark = false;
  int64_t arrival_prompt = 0;
  int arrival_streams = 7;
  int64_t arrival_tail = 4096;
  bool sessions_prefill = false;    // really prefill the sessions' contexts (default: fake-filled)
  double mixed_step_factor = 2.0;
};

class Csv {
 public:
  Csv(FILE* f, const bench::DeviceInfo& d) : f_(f), d_(d) {
    std::fprintf(f_, "commit,gpu,driver,runtime,sm_clock_mhz,mem_clock_mhz,row,context,value,unit,limit_share\n");
  }
  void row(const std::string& name, int64_t ctx, double v, const char* unit, double share = -1) {
    std::fprintf(f_, "%s,%s,%d,%d,%d,%d,%s,%lld,%.4f,%s,", FB_GIT_COMMIT, d_.name.c_str(), d_.driver_version, d_.runtime_version,
                 d_.sm_clock_mhz, d_.mem_clock_mhz, name.c_str(), (long long)ctx, v, unit);
    if (share >= 0) std::fprintf(f_, "%.3f", share);
    std::fprintf(f_, "\n");
    std::fflush(f_);
  }

 private:
  FILE* f_;
  bench::DeviceInfo d_;
};

// A bench stage that failed: "bench: WHAT: error" on stderr ("bench: error" without a WHAT) and
// the command's exit code 1, so a stage is checked as `if (!r.ok()) return bench_failed(r.status(), "what");`.
inline int bench_failed(const Status& s, const std::string& what = "") {
  std::fprintf(stderr, "bench: %s%s%s\n", what.c_str(), what.empty() ? "" : ": ", s.to_string().c_str());
  return 1;
}

// The drive tier's prediction arm: the first --predict-accuracy value >= 0, or -1 (no such arm).
inline double drive_predict_accuracy(const BenchArgs& a) {
  for (double x : a.predict_accuracy)
    if (x >= 0) return x;
  return -1;
}

// Prefill rows [s0, s1) of an `end`-token prompt of synthetic token ids (p * 7919 + salt), the last
// prompt row asking for logits, and the DSpark taps asked for as the engine's generator does.
model::Step prefill_step(const model::Config& c, int64_t s0, int64_t s1, int64_t end, int64_t salt);

// issue 9: the expert-tier sweep on the synthetic model with HBM slots (bench/tier_sweep.h). The
// host copy of the experts is page-locked first, so misses copy at the pinned rate, as from the
// host tier of a real run.
std::shared_ptr<cuda::DevExpertSlots> pin_synthetic_experts(const BenchArgs& a, cuda::CudaExecutor& ex);

// An interleaved A/B of a CUDA run option (cuda::set_run_option names), NAME=v1,v2,...: rounds()
// calls f(value) for `n` rounds over the values with the option set on the executor, then puts
// the executor's options back as they were (later rows measure the configured run).
struct OptionAb {
  std::string name;
  std::vector<std::string> values;
  explicit OptionAb(const std::string& spec) {
    const size_t eq = spec.find('=');
    name = spec.substr(0, eq);
    std::stringstream vs(eq == std::string::npos ? std::string() : spec.substr(eq + 1));
    for (std::string v; std::getline(vs, v, ',');) values.push_back(v);
  }
  Status check() const {
    cuda::CudaRunOptions o;
    if (values.empty()) return FB_ERROR(kInvalidArgument) << "A/B " << name << ": no values (NAME=v1,v2)";
    for (const auto& v : values) FB_RETURN_IF_ERROR(cuda::set_run_option(o, name, v));
    return Status();
  }
  template <typename F>
  void rounds(int n, cuda::CudaExecutor& ex, F&& f) const {
    const cuda::CudaRunOptions before = ex.run_options();
    for (int rep = 0; rep < n; ++rep)
      for (const auto& v : values) {
        cuda::CudaRunOptions o = before;
        (void)cuda::set_run_option(o, name, v);  // checked up front (check())
        ex.set_run_options(o);
        f(v);
      }
    ex.set_run_options(before);
  }
};

// issue 26: whole prompts prefilled cold through the expert tiers (bench/cold_prefill.h), serial
// copies vs experts streamed a layer ahead, with the chunk the free HBM allows.
int run_cold_prefill_rows(const BenchArgs& a, Csv& csv, cuda::CudaExecutor& ex, double h2d_peak_gbps, double bf16_tflops);

// issue 22: the drive tier (bench/drive_tier.h) at the first --contexts value.
int run_drive_tier_rows(const BenchArgs& a, Csv& csv, cuda::CudaExecutor& ex, bench::SwitchExperts& src);

int run_tier_sweep_rows(const BenchArgs& a, Csv& csv, cuda::CudaExecutor& ex, double h2d_peak_gbps);

// issue 19: --trace-steps steps of `rows` decode rows at context L traced with CUPTI
// (bench/kernel_trace.h): the median step's span, busy and idle time, kernels by time.
int trace_decode_rows(const BenchArgs& a, Csv& csv, cuda::CudaExecutor& ex, model::SessionState& s, int64_t L, int rows);

}  // namespace fb::cmd
