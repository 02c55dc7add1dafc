// flashbox bench: the expert-tier rows (bench_rows.h): the issue 9 sweep, issue 26 cold prefill and
// issue 22 drive tier on the synthetic model.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "base/progress.h"
#include "bench/cold_prefill.h"
#include "bench/decode_bench.h"
#include "bench/fake_context.h"
#include "bench/tier_sweep.h"
#include "cmd/bench_rows.h"

namespace fb::cmd {

// issue 9: the expert-tier sweep on the synthetic model with HBM slots (bench/tier_sweep.h). The
// host copy of the experts is page-locked first, so misses copy at the pinned rate, as from the
// host tier of a real run.
std::shared_ptr<cuda::DevExpertSlots> pin_synthetic_experts(const BenchArgs& a, cuda::CudaExecutor& ex) {
  auto slots = ex.expert_slots();
  if (!slots) {
    std::fprintf(stderr, "bench: --expert-slots %d holds every expert of a layer: nothing is tiered\n", a.expert_slots);
    return nullptr;
  }
  size_t pinned = 0, failed = 0;
  for (const auto& [p, n] : ex.snapshot().memory_blocks()) {
    if (n < (size_t(1) << 20)) continue;  // small tensors: not expert payload
    if (slots->pin_host(p, n).ok()) pinned += n;
    else ++failed;
  }
  std::fprintf(stderr, "bench: page-locked %.2f GB of synthetic host tensors (%zu blocks failed); %d slots x %.1f MB per tiered layer\n",
               double(pinned) / 1e9, failed, a.expert_slots, double(slots->slot_bytes()) / 1e6);
  return slots;
}

// The drive-tier and tier-sweep rows: the synthetic experts page-locked (the pool the slots settle
// from), one session holding a fake context of the first --contexts value (4096 when none) and the
// options both take from the flags (--skews, --steps, progress on a terminal); then
// rows(options, session, context, slots). 1 when the start fails (said on stderr).
template <class Options, class Rows>
int run_tier_rows(const BenchArgs& a, cuda::CudaExecutor& ex, Rows rows) {
  auto slots = pin_synthetic_experts(a, ex);
  if (!slots) return 1;
  const int64_t context = a.contexts.empty() ? 4096 : a.contexts.front();
  auto s = ex.new_session();
  if (Status st = bench::fill_fake_context(ex, static_cast<cuda::CudaSession&>(*s), context, uint64_t(context)); !st.ok()) {
    std::fprintf(stderr, "bench: context %lld: %s\n", (long long)context, st.to_string().c_str());
    return 1;
  }
  Options o;
  o.skews = a.skews;
  o.steps = a.steps;
  PhaseProgress progress;  // on a terminal only
  o.progress = progress.fn();
  return rows(o, *s, context, *slots);
}

// issue 26: whole prompts prefilled cold through the expert tiers (bench/cold_prefill.h), serial
// copies vs experts streamed a layer ahead, each prompt in the largest chunk its counted step
// fits in the free HBM. CSV rows are written (and flushed) as each run ends.
int run_cold_prefill_rows(const BenchArgs& a, Csv& csv, cuda::CudaExecutor& ex, double h2d_peak_gbps, double bf16_tflops) {
  if (!pin_synthetic_experts(a, ex)) return 1;
  const model::Config& c = ex.config();
  bench::ColdPrefillOptions o;
  o.prompts = a.cold_prefill;
  o.chunk = a.cold_prefill_chunk;
  o.serial_upto = a.cold_prefill_serial == 1 ? INT64_MAX : a.cold_prefill_serial;
  o.deadline_s = a.cold_prefill_deadline;
  auto share = bench::parse_route_share(a.cold_prefill_routing);
  if (!share.ok()) return bench_failed(share.status());
  o.route_share = *share;
  o.replay = a.cold_prefill_replay;
  o.trace = a.cold_prefill_trace;
  std::map<std::string, std::vector<double>> ab_tok_s;
  if (!a.cold_prefill_ab.empty()) {
    const OptionAb ab(a.cold_prefill_ab);  // refused before the model is used, not after the first runs
    if (Status st = ab.check(); !st.ok()) return bench_failed(st, "--cold-prefill-ab");
    o.ab_name = ab.name;
    o.ab_values = ab.values;
    o.on_ab = [&](const std::string& v, int round, double tok_s) {
      ab_tok_s[v].push_back(tok_s);
      std::fprintf(stderr, "bench: cold prefill A/B round %d: %s=%s %.1f tok/s\n", round, o.ab_name.c_str(), v.c_str(), tok_s);
    };
  }
  o.on_trace = [&](const bench::ColdPrefillTrace& t) {
    const bench::CopyOverlap& v = t.overlap;
    const double steps = double(t.chunks * t.layers);
    std::fprintf(stderr,
                 "bench: cold prefill trace %lld (streamed, %lld chunk(s) x %lld layers): span %.1f ms; kernels busy %.1f ms, HtoD copies %.1f ms, "
                 "both %.1f ms (%.0f%% of the copy time beside kernels), copies alone %.1f ms, kernels alone %.1f ms, idle %.1f ms; "
                 "per layer step: span %.2f, copies %.2f, copies alone %.2f, idle %.2f ms\n",
                 (long long)t.prompt, (long long)t.chunks, (long long)t.layers, v.span_us * 1e-3, v.kernel_us * 1e-3, v.copy_us * 1e-3,
                 v.both_us * 1e-3, 100 * v.hidden_share(), v.copy_only_us * 1e-3, v.kernel_only_us * 1e-3, v.idle_us * 1e-3,
                 v.span_us * 1e-3 / steps, v.copy_us * 1e-3 / steps, v.copy_only_us * 1e-3 / steps, v.idle_us * 1e-3 / steps);
    for (const auto& [name, cu] : t.top)
      std::fprintf(stderr, "bench: cold prefill trace %lld: %-40s %8lld calls %10.1f ms\n", (long long)t.prompt, name.c_str(), (long long)cu.first,
                   cu.second * 1e-3);
    const std::string k = "cold_prefill_trace_";
    csv.row(k + "span_ms", t.prompt, v.span_us * 1e-3, "ms, the traced streamed run's first to last GPU record");
    csv.row(k + "kernel_ms", t.prompt, v.kernel_us * 1e-3, "ms some kernel ran");
    csv.row(k + "copy_ms", t.prompt, v.copy_us * 1e-3, "ms some HtoD copy ran");
    csv.row(k + "copy_hidden_share", t.prompt, v.hidden_share(), "share of the HtoD copy time with a kernel running beside it");
    csv.row(k + "copy_alone_ms", t.prompt, v.copy_only_us * 1e-3, "ms of HtoD copy with no kernel running (exposed)");
    csv.row(k + "idle_ms", t.prompt, v.idle_us * 1e-3, "ms with neither a kernel nor an HtoD copy running");
    if (!a.trace_csv.empty()) {
      const std::string path = a.trace_csv + ".cold" + std::to_string(t.prompt) + ".csv";
      if (Status st = bench::write_trace_csv(path, t.recs); !st.ok()) std::fprintf(stderr, "bench: %s\n", st.to_string().c_str());
      else std::fprintf(stderr, "bench: cold prefill trace records written to %s\n", path.c_str());
    }
  };
  PhaseProgress progress;  // on a terminal only
  o.progress = progress.fn();
  constexpr double kGiB = double(1ull << 30);
  std::vector<bench::ColdPrefillRun> done;
  o.on_run = [&](const bench::ColdPrefillRun& r) {
    const char* mode = r.replay ? "replay" : r.prefetch ? "stream" : "serial";
    const std::string k = std::string("cold_prefill_") + mode;
    const double gflop_tok = bench::decode_step_cost(c, r.prompt / 2, true).flops / 1e9;  // mean context N/2
    const double tflops = gflop_tok * double(r.prompt) / r.wall_s / 1e3;
    const double pcie = r.copied_gb / r.wall_s;
    std::fprintf(stderr, "bench: cold prefill %8lld %6lld  %-6s %9.1f %7.2f %9.1f %5.1f  %13.2f %7.2f %7llu  %llu(%llu)\n", (long long)r.prompt,
                 (long long)r.chunk, mode, r.tok_s, r.wall_s, r.copied_gb, r.copy_gbps, r.layer_step_ms,
                 r.layer_copy_ms, (unsigned long long)r.misses, (unsigned long long)r.prefetched, (unsigned long long)r.prefetch_used);
    std::fprintf(stderr, "bench: cold prefill %lld %s: PCIe %.1f GB/s over the wall = %.0f%% of the %.1f GB/s pinned peak (copies alone %.1f GB/s = %.0f%%); "
                 "%.0f TFLOP/s = %.0f%% of the %.0f TFLOP/s bf16 GEMM\n",
                 (long long)r.prompt, mode, pcie, h2d_peak_gbps > 0 ? 100 * pcie / h2d_peak_gbps : -1, h2d_peak_gbps,
                 r.copy_gbps, h2d_peak_gbps > 0 ? 100 * r.copy_gbps / h2d_peak_gbps : -1, tflops, bf16_tflops > 0 ? 100 * tflops / bf16_tflops : -1,
                 bf16_tflops);
    csv.row(k + "_tok_s", r.prompt, r.tok_s, "tok/s");
    csv.row(k + "_s", r.prompt, r.wall_s, "s");
    csv.row(k + "_chunk_rows", r.prompt, double(r.chunk), "rows per chunk");
    csv.row(k + "_tflops", r.prompt, tflops, "TFLOP/s (matmul + attention FLOPs)", bf16_tflops > 0 ? tflops / bf16_tflops : -1);
    csv.row(k + "_pcie_gbps", r.prompt, pcie, "GB/s of expert copies over the wall time", h2d_peak_gbps > 0 ? pcie / h2d_peak_gbps : -1);
    csv.row(k + "_copy_gb", r.prompt, r.copied_gb, "GB copied (slot misses + prefetch)");
    csv.row(k + "_copy_gbps", r.prompt, r.copy_gbps, "GB/s: bytes / the copies' GPU time", h2d_peak_gbps > 0 ? r.copy_gbps / h2d_peak_gbps : -1);
    csv.row(k + "_layer_step_ms", r.prompt, r.layer_step_ms, "ms per layer step: wall / (chunks x layers)");
    csv.row(k + "_layer_copy_ms", r.prompt, r.layer_copy_ms, "ms of copy GPU time per tiered layer step");
    csv.row(k + "_slot_misses", r.prompt, double(r.misses), "experts copied into slots");
    csv.row(k + "_prefetched", r.prompt, double(r.prefetched), "experts copied into staging a layer ahead");
    csv.row(k + "_prefetch_used", r.prompt, double(r.prefetch_used), "staged experts a MoE call read");
    if (o.route_share >= 0)
      csv.row(k + "_experts_per_call", r.prompt, r.experts_per_layer_call, "distinct experts a tiered layer's MoE call needed (mean)");
    csv.row(k + "_budget_gib", r.prompt, double(r.budget_bytes) / kGiB, "GiB the chunk was sized from (free HBM minus the margin)");
    csv.row(k + "_free_gib", r.prompt, double(r.free_bytes) / kGiB, "GiB of HBM free before the step");
    csv.row(k + "_arena_high_gib", r.prompt, double(r.workspace_high) / kGiB, "GiB measured step arena");
    csv.row(k + "_arena_counted_gib", r.prompt, double(r.predicted_bytes) / kGiB, "GiB counted arena (memory::prefill_step_bytes)");
    csv.row(k + "_tc_scratch_gib", r.prompt, double(r.tc_bytes) / kGiB, "GiB measured tc_gemm scratch");
    csv.row(k + "_tc_counted_gib", r.prompt, double(r.predicted_tc) / kGiB, "GiB counted tc scratch (memory::prefill_step_bytes)");
    // Copy / compute per layer step: the serial run's wall minus its copies is the compute it
    // serialised with; the streamed run shows how much of the copy time it hid.
    for (const bench::ColdPrefillRun& s : done) {
      if (s.prefetch || !r.prefetch || r.replay || s.prompt != r.prompt) continue;
      const double copy_s = (s.copy_ms + s.prefetch_ms) * 1e-3;
      const double compute_s = std::max(0.0, s.wall_s - copy_s);
      const double hidden = copy_s > 0 ? (s.wall_s - r.wall_s) / copy_s : 0;
      const double layers = double(s.chunks * c.n_layers);
      std::fprintf(stderr, "bench: cold prefill %lld: per layer step compute ~%.2f ms, copies %.2f ms; streamed %.2f ms vs serial %.2f ms: %.0f%% of the copy time hidden (%.2fx)\n",
                   (long long)s.prompt, compute_s * 1e3 / layers, copy_s * 1e3 / layers, r.layer_step_ms, s.layer_step_ms, hidden * 100,
                   s.wall_s / r.wall_s);
      csv.row("cold_prefill_layer_compute_ms", s.prompt, compute_s * 1e3 / layers, "ms per layer step: serial wall minus its copies");
      csv.row("cold_prefill_copy_hidden", s.prompt, hidden, "share of the serial copy time the streamed run hid");
      csv.row("cold_prefill_speedup", s.prompt, s.wall_s / r.wall_s, "x serial");
    }
    done.push_back(r);
  };
  std::fprintf(stderr, "bench: cold prefill   prompt  chunk  mode      tok/s  wall_s   copy_GB  GB/s  layer: step_ms copy_ms  misses  staged(used)\n");
  bench::ColdPrefillPlan plan;
  auto runs = bench::run_cold_prefill(ex, o, &plan, [&](int64_t s0, int64_t s1, int64_t end) { return prefill_step(c, s0, s1, end, 13); });
  std::fprintf(stderr, "bench: cold prefill: %.1f GiB of prefetch staging\n", double(plan.staging_bytes) / kGiB);
  if (!runs.ok()) return bench_failed(runs.status(), "cold prefill");
  for (auto& [v, x] : ab_tok_s) {
    std::sort(x.begin(), x.end());
    const double med = x[x.size() / 2];
    std::fprintf(stderr, "bench: cold prefill %lld streamed: A/B %s=%s: %.1f tok/s (median of %zu interleaved runs)\n", (long long)o.prompts.front(),
                 o.ab_name.c_str(), v.c_str(), med, x.size());
    csv.row("cold_prefill_ab_" + o.ab_name + "=" + v + "_tok_s", o.prompts.front(), med, "tok/s, streamed, interleaved A/B, median");
  }
  return 0;
}

// issue 22: the drive tier (bench/drive_tier.h) at the first --contexts value.
int run_drive_tier_rows(const BenchArgs& a, Csv& csv, cuda::CudaExecutor& ex, bench::SwitchExperts& src) {
  return run_tier_rows<bench::DriveTierOptions>(a, ex, [&](bench::DriveTierOptions& o, model::SessionState& s, int64_t L,
                                                           const cuda::DevExpertSlots&) {
    o.pool_warm_steps = a.tier_warm_steps;
    o.drive_warm_steps = a.drive_warm_steps;
    o.replay_tokens = a.drive_replay_tokens;
    o.predict_accuracy = drive_predict_accuracy(a);
    auto pts = bench::run_drive_tier(ex, s, src, o);
    if (!pts.ok()) return bench_failed(pts.status(), "drive tier");
    csv.row("drive_tier_slots_per_layer", L, double(a.expert_slots), "HBM expert slots per tiered layer");
    csv.row("drive_tier_host_experts", L, double(a.host_experts), "host cache records (page-locked)");
    csv.row("drive_tier_records", L, double(a.drive_records), "expert records per drive file");
    csv.row("drive_tier_drives", L, double(a.expert_drives.size()), "replica dirs");
    for (const bench::DriveTierPoint& p : *pts) {
      char k[64];
      std::snprintf(k, sizeof k, "drive_tier_s%02d", int(p.top10_share * 100 + 0.5));
      const std::string key(k);
      csv.row(key + "_hbm_hit", L, p.hbm_hit, "HBM slot hit rate");
      csv.row(key + "_asked_hbm_hit", L, p.hbm_hit_asked, "HBM slot hit rate (the read-when-asked arm's timed steps)");
      csv.row(key + "_host_filled", L, double(p.host_filled), "host cache records holding an expert when the timed steps began");
      csv.row(key + "_host_fill_s", L, p.host_fill_s, "s to read the warmed host cache's records from the drives");
      const char* arm[3] = {"_routed", "_asked", "_predicted"};
      for (int i = 0; i < (o.predict_accuracy >= 0 ? 3 : 2); ++i) {
        csv.row(key + arm[i] + "_ms_token", L, p.ms_token[i], "ms per decode token (median)");
        csv.row(key + arm[i] + "_wait_ms_token", L, p.wait_ms_token[i], "exposed drive wait, ms per token");
        csv.row(key + arm[i] + "_host_hits_token", L, p.host_hits_token[i], "host cache hits per token");
        csv.row(key + arm[i] + "_drive_reads_token", L, p.drive_reads_token[i], "drive reads per token");
        csv.row(key + arm[i] + "_drive_gbps", L, p.drive_gbps[i], "GB/s read from the drives (wall)");
      }
      if (o.predict_accuracy >= 0) {
        csv.row(key + "_predicted_per_token", L, p.predicted_token, "experts copied ahead of a predicted use per token");
        csv.row(key + "_predict_used_per_token", L, p.predict_used_token, "... of them hit by their layer's call");
        csv.row(key + "_predict_hinted_per_token", L, p.predict_hinted_token, "guesses whose drive reads started a layer early");
      }
    }
    return 0;
  });
}

int run_tier_sweep_rows(const BenchArgs& a, Csv& csv, cuda::CudaExecutor& ex, double h2d_peak_gbps) {
  return run_tier_rows<bench::TierSweepOptions>(a, ex, [&](bench::TierSweepOptions& o, model::SessionState& s, int64_t L,
                                                           const cuda::DevExpertSlots& slots) {
    o.warm_steps = a.tier_warm_steps;
    o.prefill_rows = a.tier_prefill_rows;
    o.predict_accuracy = a.predict_accuracy;
    const model::Config& c = ex.config();
    auto pts = bench::run_tier_sweep(ex, s, o, h2d_peak_gbps,
                                     [&](int64_t s0, int64_t s1, int64_t end) { return prefill_step(c, s0, s1, end, 11); });
    if (!pts.ok()) return bench_failed(pts.status(), "tier sweep");
    csv.row("tier_slots_per_layer", L, double(a.expert_slots), "HBM expert slots per tiered layer");
    csv.row("tier_staging_per_layer", L, double(a.expert_staging), "staging slots per tiered layer (LFU admission)");
    csv.row("tier_lfu_aging", L, double(a.lfu_aging), "LFU counts halve every N x slots lookups");
    csv.row("tier_warm_steps", L, double(a.tier_warm_steps), "decode steps before the counters start");
    csv.row("tier_expert_mb", L, double(slots.slot_bytes()) / 1e6, "MB per routed expert (w1, w2, w3 + scales)");
    for (const bench::TierPoint& p : *pts) {
      std::string k = p.top10_share > 0 ? "tier_top10_" + std::to_string(int(std::lround(p.top10_share * 100))) : std::string("tier_allhit");
      if (p.predict_accuracy >= 0) k += "_pred" + std::to_string(int(std::lround(p.predict_accuracy * 100)));
      else if (p.predict_accuracy == -1 && p.top10_share > 0) k += "_nopred";
      csv.row(k + "_decode_ms", L, p.ms_token, "ms/token (median, after the warm-up)");
      csv.row(k + "_hbm_hit", L, p.hit_rate, "HBM slot hit rate (LFU)", p.static_hit > 0 ? p.hit_rate / p.static_hit : -1);
      csv.row(k + "_static_hit", L, p.static_hit, "hit rate of the best static placement (S hottest resident)");
      csv.row(k + "_misses_per_token", L, p.misses_per_token, "HBM slot misses per token (copied or computed on the host)");
      csv.row(k + "_host_experts_per_token", L, p.host_per_token, "misses computed on the host CPU per token (--cuda-opt host_compute)");
      csv.row(k + "_host_ms_per_token", L, p.host_ms_per_token, "host wall ms computing them per token");
      if (p.predict_accuracy >= 0) {
        csv.row(k + "_predicted_per_token", L, p.predicted_per_token, "experts copied ahead of a predicted use per token (expert_predict)");
        csv.row(k + "_predict_used_per_token", L, p.predict_used_per_token, "... of them hit by their layer's call");
        csv.row(k + "_predict_model_ms", L, p.predict_model_ms, "ms/token, model: guessed copies beside the all-hit step, the rest after",
                p.ms_token / std::max(1e-9, p.predict_model_ms));
      }
      csv.row(k + "_copy_gbps", L, p.copy_gbps, "GB/s H2D of the miss copies", h2d_peak_gbps > 0 ? p.copy_gbps / h2d_peak_gbps : -1);
      csv.row(k + "_floor_ms", L, p.floor_ms, "ms/token, model: all-hit step + copies, no overlap");
      csv.row(k + "_ceiling_ms", L, p.ceiling_ms, "ms/token, model: max(all-hit step, copies)");
      csv.row(k + "_plan_ms", L, p.plan_ms, "ms/token, plan: all-hit step + static-placement misses at the pinned peak", p.ms_token / p.plan_ms);
      if (p.prefill_s > 0) {
        csv.row(k + "_prefill_chunk_s", a.tier_prefill_rows, p.prefill_s, "s per prefill chunk (expert sweep included)");
        csv.row(k + "_prefill_hbm_hit", a.tier_prefill_rows, p.prefill_hit_rate, "HBM slot hit rate in the chunk");
        csv.row(k + "_prefill_misses", a.tier_prefill_rows, p.prefill_misses, "expert copies in the chunk");
        csv.row(k + "_prefill_copy_gbps", a.tier_prefill_rows, p.prefill_copy_gbps, "GB/s H2D", h2d_peak_gbps > 0 ? p.prefill_copy_gbps / h2d_peak_gbps : -1);
      }
    }
    return 0;
  });
}

}  // namespace fb::cmd
