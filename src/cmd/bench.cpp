// flashbox bench: benchmark rows as CSV with commit, GPU, driver and clocks, each next to the
// physical limit measured in the same run (HBM copy bandwidth, tensor-core GEMM rate, H2D).
//   --limits                          the ceilings alone
//   --synthetic [--experts N] [--contexts 4096,32768,...]   released-dimension model in HBM,
//                                     batch-1 decode / verify (1..6 rows) / draft at each context
//   --model DIR [--prompt-len N]      a real checkpoint (e.g. a fixture), prefill then decode
//   --kv-restore 4096,32768,131072    with --synthetic: disk KV cache restore vs prefill (issue 21;
//                                     bench/kv_restore_bench.h), state files in --kv-dir
//   --sessions 1,2,4,8,16             with --synthetic: N sessions at --sessions-context decoding in
//                                     shared steps (issue 20; engine/session_rounds.h): aggregate
//                                     tok/s, round-time p50/p99; --arrival-prompt N: a prompt of N
//                                     tokens arrives beside --arrival-streams decoding sessions
//   --cold-prefill 8192,32768         with --synthetic --experts 384 --expert-slots 128: whole prompts
//                                     prefilled cold through the expert tiers (issue 26;
//                                     bench/cold_prefill.h): serial copies vs streamed a layer ahead
//   --expert-drives DIR,DIR           with --synthetic --expert-slots S: misses through a small host
//                                     cache (--host-experts) over expert records on the drives (issue 22;
//                                     bench/drive_tier.h): ms/token and exposed drive wait per skew,
//                                     reads at routing time vs read when asked
//   --profile                         per-op GPU ms of a one-row decode step (CUDA events, summed
//                                     over layers), rows profile_<op>_ms; step.wall vs step.gpu
//                                     shows the host overhead
// The arguments, CSV rows and prefill steps are shared through bench_rows.h with bench_tiers.cpp,
// which holds the expert-tier rows (--expert-slots sweeps, --cold-prefill, --expert-drives).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <sstream>

#include "base/progress.h"
#include "bench/decode_bench.h"
#include "bench/dspark_sweep.h"
#include "bench/fake_context.h"
#include "bench/kv_restore_bench.h"
#include "bench/limits.h"
#include "bench/tier_sweep.h"
#include "bench/cold_prefill.h"
#include "bench/drive_tier.h"
#include "loader/bind.h"
#include "cmd/bench_rows.h"
#include "cmd/commands.h"
#include "cmd/cuda_run_flags.h"
#include "cpu/host_expert.h"
#include "cuda/executor.h"
#include "cuda/host_memory.h"
#include "engine/generator.h"
#include "engine/session_rounds.h"
#include "loader/synthetic.h"
#include "loader/tiny_model.h"

namespace fb::cmd {

// Prefill rows [s0, s1) of an `end`-token prompt of synthetic token ids (p * 7919 + salt), the last
// prompt row asking for logits, and the DSpark taps asked for as the engine's generator does.
model::Step prefill_step(const model::Config& c, int64_t s0, int64_t s1, int64_t end, int64_t salt) {
  model::Step st;
  st.taps_from_row = engine::Generator::prefill_taps_from_row(s1 - s0, c.window_size);
  for (int64_t p = s0; p < s1; ++p) {
    model::Row r;
    r.pos = p;
    r.token = int32_t((p * 7919 + salt) % c.vocab_size);
    r.kind = model::RowKind::kPrefill;
    r.prefill_end = end;
    r.want_logits = p == end - 1;
    st.rows.push_back(r);
  }
  return st;
}

namespace {

// "NAME=a,b;NAME2=c,d" -> the specs, in order (empty: none).
std::vector<std::string> ab_specs(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ';');)
    if (!x.empty()) out.push_back(x);
  return out;
}

// wo_a_bf16: the step reads the BF16 copy of wo_a (the exact class, or wo_a_fp8 off), not the FP8 one.
void report_decode(Csv& csv, const model::Config& c, int64_t L, const bench::DecodeTiming& t, double d2d_gbps, bool wo_a_bf16) {
  const bench::StepCost k = bench::decode_step_cost(c, L, wo_a_bf16);
  const double bytes = k.weight_bytes + k.cache_bytes;
  const double gbps = bytes / (t.decode_ms * 1e-3) / 1e9;
  csv.row("decode_ms", L, t.decode_ms, "ms/token");
  csv.row("decode_tok_s", L, 1000.0 / t.decode_ms, "tok/s");
  if (t.enqueue_ms > 0) csv.row("decode_enqueue_ms", L, t.enqueue_ms, "ms of host time issuing the step, up to its output copies (near decode_ms: the GPU waits on the host)");
  csv.row("decode_bytes", L, bytes / 1e9, "GB/token (weights + cache)");
  csv.row("decode_gflop", L, k.flops / 1e9, "GFLOP/token");
  csv.row("decode_hbm_gbps", L, gbps, "GB/s", d2d_gbps > 0 ? gbps / d2d_gbps : -1);
  csv.row("decode_roofline_ms", L, bytes / (d2d_gbps * 1e9) * 1e3, "ms/token at the measured copy rate");
  for (size_t r = 0; r < t.verify_ms.size(); ++r) {
    csv.row("verify_rows_" + std::to_string(r + 1) + "_ms", L, t.verify_ms[r], "ms/step");
    csv.row("verify_rows_" + std::to_string(r + 1) + "_ratio", L, t.verify_ms[r] / t.verify_ms[0], "x one row");
  }
  if (t.draft_ms > 0) csv.row("draft_ms", L, t.draft_ms, "ms/draft block");
}

int run(const BenchArgs& a) {
  auto dev = bench::device_info();
  if (!dev.ok()) {
    std::fprintf(stderr, "bench: no usable GPU: %s\n", dev.status().to_string().c_str());
    return 2;
  }
  FILE* out = a.csv.empty() ? stdout : std::fopen(a.csv.c_str(), "w");
  if (!out) {
    std::fprintf(stderr, "bench: cannot write %s\n", a.csv.c_str());
    return 1;
  }
  Csv csv(out, *dev);
  auto lim = bench::measure_limits(a.reps);
  if (!lim.ok()) return bench_failed(lim.status());
  csv.row("hbm_d2d_copy", 0, lim->d2d_gbps, "GB/s (read+write)");
  csv.row("h2d_pinned", 0, lim->h2d_pinned_gbps, "GB/s");
  csv.row("h2d_pageable", 0, lim->h2d_pageable_gbps, "GB/s");
  csv.row("gemm_bf16_8192", 0, lim->bf16_tflops, "TFLOP/s");
  csv.row("gemm_fp8_8192", 0, lim->fp8_tflops, "TFLOP/s");
  if (a.synthetic) {
    const std::string cfg = loader::released_synthetic_config_json(a.experts, a.draft_experts, a.engram_vocab);
    const auto t0 = std::clock();
    // With --expert-slots the experts beyond the 16th share bytes with the first 16 (host memory
    // and generation time of 16 per layer), and only the slots live in HBM.
    constexpr int kDistinct = 16;
    auto snap = loader::synthetic_snapshot(cfg, 1, a.expert_slots > 0 ? kDistinct : 0);
    if (!snap.ok()) return bench_failed(snap.status());
    auto map = (*snap)->engram_token_map();
    cuda::CudaLoadOptions lo;
    lo.expert_slots = a.expert_slots;
    lo.expert_staging = a.expert_staging;
    lo.lfu_aging = a.lfu_aging;
    if (a.engram_place == "hbm") {
      lo.engram = cuda::EngramPlace::kHbm;
    } else if (a.engram_place == "host") {
      lo.engram = cuda::EngramPlace::kHost;
    } else if (a.engram_place != "auto") {
      return bench_failed(FB_ERROR(kInvalidArgument) << "--engram-place must be auto, hbm or host (got \"" << a.engram_place << "\")");
    }
    {
      Status st = apply_cuda_run_flags(lo.run, a.numerics, a.cuda_opts);
      for (const std::string& spec : ab_specs(a.ab_env))
        if (st.ok()) st = OptionAb(spec).check();
      if (st.ok() && !a.prefill_ab_env.empty()) st = OptionAb(a.prefill_ab_env).check();
      if (!st.ok()) return bench_failed(st);
      std::fprintf(stderr, "bench: numerics %s\n", cuda::numerics_name(lo.run.numerics));
    }
    std::shared_ptr<bench::SwitchExperts> drive_src;
    if (a.expert_slots > 0 && !a.expert_drives.empty()) {
      // Issue 22: misses from the pinned pool while the slots settle, then through the drives.
      std::vector<storage::ReaderFault> faults;
      for (const std::string& f : a.drive_faults) {
        auto x = storage::parse_reader_fault(f);
        if (!x.ok()) return bench_failed(x.status(), "--drive-fault");
        faults.push_back(*x);
      }
      auto tiers = bench::make_drive_tiers(
          **snap, a.expert_drives, a.drive_records, a.host_experts,
          [](void* p, size_t n) { cuda::pin_host_range(p, n); }, [](void* p, size_t) { cuda::unpin_host_range(p); }, std::move(faults),
          drive_predict_accuracy(a) >= 0 ? 2 : 1);  // the prediction arm copies ahead: views kept through the next layer
      if (!tiers.ok()) return bench_failed(tiers.status(), "drive tier");
      drive_src = std::make_shared<bench::SwitchExperts>(std::make_shared<loader::SnapshotExperts>(**snap), std::move(tiers.value()));
      lo.experts = drive_src;
    }
    std::shared_ptr<storage::EngramRowCache> engram_cache;
    if (!a.engram_drives.empty()) {
      auto e = bench::make_engram_drive_cache(**snap, a.engram_drives, uint64_t(std::max<int64_t>(0, a.engram_cache_bytes)));
      if (!e.ok()) return bench_failed(e.status(), "--engram-drives");
      engram_cache = std::move(e.value());
      lo.engram_rows = engram_cache;
    }
    // used under --cuda-opt host_compute=1|2; the synthetic experts share one pool of bytes, so the
    // host reads 32 distinct experts' bytes instead (bench::cold_bytes_host_experts)
    lo.host_compute = bench::cold_bytes_host_experts(cpu::host_expert_compute(), 32);
    auto ex = cuda::CudaExecutor::from_snapshot(std::move(snap.value()), map, lo);
    if (!ex.ok()) return bench_failed(ex.status());
    std::fprintf(stderr, "bench: synthetic released-dimension model (%d routed experts/layer, %s) ready, %.1f s CPU\n", a.experts,
                 a.expert_slots > 0 ? (std::to_string(a.expert_slots) + " HBM slots per layer").c_str() : "all resident",
                 double(std::clock() - t0) / CLOCKS_PER_SEC);
    if (a.expert_slots > 0 && !a.cold_prefill.empty()) return run_cold_prefill_rows(a, csv, **ex, lim->h2d_pinned_gbps, lim->bf16_tflops);
    if (drive_src) return run_drive_tier_rows(a, csv, **ex, *drive_src);
    if (a.expert_slots > 0) return run_tier_sweep_rows(a, csv, **ex, lim->h2d_pinned_gbps);
    Progress decode_progress("bench decode", int64_t(a.contexts.size()), "contexts");  // on a terminal only
    int64_t n_contexts = 0;
    for (int64_t L : a.contexts) {
      decode_progress.update(n_contexts++);
      auto s = (*ex)->new_session();
      Status st = bench::fill_fake_context(**ex, static_cast<cuda::CudaSession&>(*s), L, uint64_t(L));
      if (!st.ok()) return bench_failed(st, "context " + std::to_string(L));
      const model::EngramRows e0 = (*ex)->stats().engram;
      const storage::EngramCacheStats c0 = engram_cache ? engram_cache->stats() : storage::EngramCacheStats{};
      auto t = bench::time_decode(**ex, *s, a.steps, a.verify_rows);
      if (!t.ok()) return bench_failed(t.status(), "context " + std::to_string(L));
      decode_progress.hide();  // the rows and notes below go to the same terminal
      report_decode(csv, (*ex)->config(), L, *t, lim->d2d_gbps,
                    !(lo.run.numerics == cuda::Numerics::kFast && lo.run.wo_a_fp8 && lo.run.fast_gemv));
      if (const model::EngramRows e1 = (*ex)->stats().engram; e1.hidden + e1.exposed > e0.hidden + e0.exposed) {
        // Tables on the host (--engram-place host): the timed steps' rows, fetched ahead or not.
        const double rows = double(e1.rows - e0.rows), hidden = double(e1.hidden - e0.hidden), exposed = double(e1.exposed - e0.exposed);
        const double wait_ms = (e1.exposed_s - e0.exposed_s) * 1e3;
        std::fprintf(stderr, "bench: context %lld: Engram rows from host tables: %.0f rows, %.0f hidden, %.0f exposed, %.3f ms waited in all (%d tasks)\n",
                     (long long)L, rows, hidden, exposed, wait_ms, (*ex)->run_options().engram_prefetch_tasks);
        csv.row("engram_rows_hidden_share", L, rows > 0 ? hidden / rows : 0, "share of the timed steps' Engram rows staged before their layer");
        csv.row("engram_exposed_wait_ms", L, wait_ms, "ms the timed steps' issue path waited for Engram rows, in all");
        if (engram_cache) {  // --engram-drives: what the drives served
          const storage::EngramCacheStats c1 = engram_cache->stats();
          const double steps = double(std::max<uint64_t>(1, e1.rows - e0.rows)) / double(std::max<int64_t>(1, (*ex)->config().engram_n_heads)) /
                               double(std::max(1, (*ex)->config().engram_max_ngram - 1)) / double((*ex)->config().engram_layer_ids.size());
          std::fprintf(stderr, "bench: context %lld: Engram rows from the drives: %llu of %llu rows read (%llu submissions, %.3f ms of reads)\n",
                       (long long)L, (unsigned long long)(c1.drive_rows - c0.drive_rows), (unsigned long long)(c1.lookups - c0.lookups),
                       (unsigned long long)(c1.read_calls - c0.read_calls), double(c1.read_wait_ns - c0.read_wait_ns) / 1e6);
          csv.row("engram_drive_rows_per_row", L, double(c1.drive_rows - c0.drive_rows) / steps, "Engram rows read from the drives per step row");
          csv.row("engram_drive_read_ms_per_row", L, double(c1.read_wait_ns - c0.read_wait_ns) / 1e6 / steps,
                  "ms of drive reads (staging tasks' and layers' waits) per step row");
        }
      }
      if (a.graph_step) {
        auto g = bench::time_graph_step(**ex, *s, 10);
        if (!g.ok()) {
          std::fprintf(stderr, "bench: graph step at %lld: %s\n", (long long)L, g.status().to_string().c_str());
        } else {
          std::fprintf(stderr, "bench: context %lld: one decode step as a CUDA graph: %.3f ms replay (%zu nodes; capture %.2f ms, instantiate %.2f ms)\n",
                       (long long)L, g->replay_ms, g->nodes, g->capture_ms, g->instantiate_ms);
          csv.row("decode_graph_replay_ms", L, g->replay_ms, "ms/step: the step's kernels replayed from a CUDA graph (no host launches)");
          csv.row("decode_graph_nodes", L, double(g->nodes), "graph nodes (kernels + copies) of one decode step");
        }
      }
      if (a.trace_steps > 0) {
        const int vr = std::max(1, a.verify_rows);
        for (int rows : vr > 1 ? std::vector<int>{1, vr} : std::vector<int>{1}) {
          const int rc = trace_decode_rows(a, csv, **ex, *s, L, rows);
          if (rc != 0) return rc;
        }
      }
      for (const std::string& spec : ab_specs(a.ab_env)) {
        // Interleaved A/B of a run option (one after the other when several): one-row steps and
        // steps of --verify-rows rows.
        const OptionAb ab(spec);
        const std::string& name = ab.name;
        const std::vector<std::string>& values = ab.values;
        std::map<std::string, std::vector<double>> ms, mv, md;
        const int vr = std::max(1, a.verify_rows);
        ab.rounds(a.ab_rounds, **ex, [&](const std::string& v) {
          auto tv = bench::time_decode(**ex, *s, a.steps, vr);
          if (tv.ok()) {
            ms[v].push_back(tv->decode_ms);
            mv[v].push_back(tv->verify_ms.back());
            if (tv->draft_ms > 0) md[v].push_back(tv->draft_ms);
          } else {
            std::fprintf(stderr, "bench: A/B %s=%s: %s\n", name.c_str(), v.c_str(), tv.status().to_string().c_str());
          }
        });
        for (const auto& v : values) {
          auto& x = ms[v];
          auto& y = mv[v];
          if (x.empty()) continue;
          std::sort(x.begin(), x.end());
          std::sort(y.begin(), y.end());
          std::fprintf(stderr, "bench: context %lld: A/B %s=%s: %.3f ms/token, %d rows %.3f ms/step (medians of %zu interleaved runs)\n",
                       (long long)L, name.c_str(), v.c_str(), x[x.size() / 2], vr, y[y.size() / 2], x.size());
          csv.row("ab_" + name + "=" + v + "_decode_ms", L, x[x.size() / 2], "ms/token, interleaved A/B, median");
          csv.row("ab_" + name + "=" + v + "_verify_rows_" + std::to_string(vr) + "_ms", L, y[y.size() / 2], "ms/step, interleaved A/B, median");
          auto& d = md[v];
          if (d.empty()) continue;
          std::sort(d.begin(), d.end());
          std::fprintf(stderr, "bench: context %lld: A/B %s=%s: draft block %.3f ms\n", (long long)L, name.c_str(), v.c_str(), d[d.size() / 2]);
          csv.row("ab_" + name + "=" + v + "_draft_ms", L, d[d.size() / 2], "ms/draft block (greedy), interleaved A/B, median");
        }
      }
      if (a.profile || a.profile_kernels) {
        // Per-op GPU time of a one-row decode step, a step of --verify-rows rows (which ops grow
        // with rows) and a DSpark draft block.
        cuda::CudaExecutor& cx = **ex;
        struct Run {
          const char* what;
          std::string tag;
          std::function<Status()> go;
        };
        const int vr = std::max(1, a.verify_rows);
        std::vector<Run> runs{{"decode step", "", [&] { return bench::run_decode_steps(cx, *s, a.steps, 1); }}};
        if (vr > 1)
          runs.push_back({"verify step", "verify" + std::to_string(vr) + "_", [&] { return bench::run_decode_steps(cx, *s, a.steps, vr); }});
        if (cx.config().n_mtp_layers > 0) runs.push_back({"draft block", "draft_", [&] { return bench::run_drafts(cx, *s, a.steps); }});
        for (const Run& run : runs) {
          cx.clear_profile();
          cx.set_profile(true);
          cx.set_kernel_profile(a.profile_kernels);
          st = run.go();
          cx.set_profile(false);
          cx.set_kernel_profile(false);
          if (!st.ok()) return bench_failed(st, "profile (" + std::string(run.what) + ") at " + std::to_string(L));
          std::vector<std::pair<double, std::string>> rows;
          for (const auto& [name, p] : cx.profile()) rows.push_back({p.ms / a.steps, name});
          std::sort(rows.begin(), rows.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
          std::fprintf(stderr, "bench: profile of a %s at context %lld (ms per call, summed over layers):\n", run.what, (long long)L);
          for (const auto& [ms, name] : rows) {
            std::fprintf(stderr, "  %-18s %9.3f ms  (%lld calls)\n", name.c_str(), ms, (long long)(cx.profile().at(name).calls / a.steps));
            csv.row("profile_" + run.tag + name + "_ms", L, ms, "ms per call (CUDA events)");
          }
        }
      }
    }
    decode_progress.update(n_contexts);
    decode_progress.finish();
    for (int64_t N : a.prefill) {
      // Exact chunked prefill of N random tokens (CUDA cores, reference-exact kernels).
      Progress prefill_progress("bench prefill " + std::to_string(N), N, "tokens");  // on a terminal only
      auto s = (*ex)->new_session();
      std::vector<model::SessionState*> ss{s.get()};
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t s0 = 0; s0 < N; s0 += a.prefill_chunk) {
        const model::Step st = prefill_step((*ex)->config(), s0, std::min(N, s0 + a.prefill_chunk), N, 5);
        if (auto o = (*ex)->forward(st, ss); !o.ok()) return bench_failed(o.status(), "prefill " + std::to_string(N));
        prefill_progress.update(std::min(N, s0 + a.prefill_chunk));
      }
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      prefill_progress.finish();
      const double gflop_tok = bench::decode_step_cost((*ex)->config(), N / 2, true).flops / 1e9;  // mean context N/2
      const double tflops = gflop_tok * double(N) / sec / 1e3;
      csv.row("prefill_tok_s", N, double(N) / sec, "tok/s");
      csv.row("prefill_s", N, sec, "s");
      csv.row("prefill_tflops", N, tflops, "TFLOP/s (matmul + attention FLOPs)", lim->fp8_tflops > 0 ? tflops / lim->fp8_tflops : -1);
    }
    Progress prefill_at_progress("bench prefill-at", int64_t(a.prefill_at.size()), "contexts");  // on a terminal only
    int64_t n_at = 0;
    for (int64_t L : a.prefill_at) {
      prefill_at_progress.update(n_at++);  // drawn while this context's chunk runs; hidden before its lines
      // Prefill throughput at a context frontier: one chunk of --prefill-chunk rows ending at L,
      // after a fake-filled context of L - chunk (the chunk reads what a real prompt's last chunk
      // reads: every earlier window row, compressed entry and index key). A warm-up session first
      // (workspace growth), then the timed one.
      const int64_t C = std::min<int64_t>(a.prefill_chunk, L);
      double sec = 0;
      cuda::CudaExecutor& cx = **ex;
      const int passes = (a.profile || a.profile_kernels) ? 3 : 2;
      for (int pass = 0; pass < passes; ++pass) {
        const bool prof = pass == 2;  // an extra, profiled pass after the timed one
        if (prof) {
          cx.clear_profile();
          cx.set_profile(true);
          cx.set_kernel_profile(a.profile_kernels);
        }
        auto s = (*ex)->new_session();
        Status fs = bench::fill_fake_context(**ex, static_cast<cuda::CudaSession&>(*s), L - C, uint64_t(L) + 17);
        if (!fs.ok()) return bench_failed(fs, "prefill at " + std::to_string(L));
        std::vector<model::SessionState*> ss{s.get()};
        const model::Step st = prefill_step((*ex)->config(), L - C, L, L, 5);
        const auto t0 = std::chrono::steady_clock::now();
        if (auto o = (*ex)->forward(st, ss); !o.ok()) return bench_failed(o.status(), "prefill at " + std::to_string(L));
        const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!prof) {
          sec = t;
          continue;
        }
        cx.set_profile(false);
        cx.set_kernel_profile(false);
        std::vector<std::pair<double, std::string>> rows;
        for (const auto& [name, p] : cx.profile()) rows.push_back({p.ms, name});
        std::sort(rows.begin(), rows.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
        prefill_at_progress.hide();
        std::fprintf(stderr, "bench: profile of the %lld-row prefill chunk ending at %lld (ms, summed over layers; wall %.1f ms):\n",
                     (long long)C, (long long)L, t * 1e3);
        for (const auto& [ms, name] : rows) {
          std::fprintf(stderr, "  %-18s %9.3f ms  (%lld calls)\n", name.c_str(), ms, (long long)cx.profile().at(name).calls);
          csv.row("prefill_profile_" + name + "_ms", L, ms, "ms per chunk (CUDA events)");
        }
      }
      if (!a.prefill_ab_env.empty()) {
        // The same chunk under each value of the --prefill-ab-env switch, interleaved, medians of 3.
        const OptionAb ab(a.prefill_ab_env);
        const std::string& name = ab.name;
        std::map<std::string, std::vector<double>> tv;
        ab.rounds(3, **ex, [&](const std::string& v) {
          auto s = (*ex)->new_session();
          if (!bench::fill_fake_context(**ex, static_cast<cuda::CudaSession&>(*s), L - C, uint64_t(L) + 17).ok()) return;
          std::vector<model::SessionState*> ss{s.get()};
          const auto t0 = std::chrono::steady_clock::now();
          if (!(*ex)->forward(prefill_step((*ex)->config(), L - C, L, L, 5), ss).ok()) return;
          tv[v].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        });
        prefill_at_progress.hide();
        for (auto& [v, x] : tv) {
          std::sort(x.begin(), x.end());
          const double med = x[x.size() / 2];
          std::fprintf(stderr, "bench: prefill chunk ending at %lld: A/B %s=%s: %.1f ms, %.1f tok/s (median of %zu interleaved runs)\n",
                       (long long)L, name.c_str(), v.c_str(), med * 1e3, double(C) / med, x.size());
          csv.row("ab_" + name + "=" + v + "_prefill_tok_s", L, double(C) / med, "tok/s of the chunk, interleaved A/B, median");
        }
      }
      const bench::StepCost cost = bench::decode_step_cost((*ex)->config(), L - C / 2, true);
      const double gflop_tok = cost.flops / 1e9;
      const double tflops = gflop_tok * double(C) / sec / 1e3;
      // Bytes a row of the step moves at least: the active weights once per step (shared by its
      // rows) plus the row's own cache reads, against the copy rate measured in this run.
      const double bytes_tok = cost.weight_bytes / double(C) + cost.cache_bytes;
      csv.row("prefill_frontier_bytes", L, bytes_tok / 1e6, "MB/token (active weights once per step + the row's cache reads)",
              lim->d2d_gbps > 0 ? bytes_tok * double(C) / sec / 1e9 / lim->d2d_gbps : -1);
      prefill_at_progress.hide();
      std::fprintf(stderr, "bench: prefill chunk of %lld rows ending at %lld: %.2f s, %.1f tok/s\n", (long long)C, (long long)L, sec,
                   double(C) / sec);
      const std::string unit = "tok/s of one " + std::to_string(C) + "-row chunk ending at this context";
      csv.row("prefill_frontier_tok_s", L, double(C) / sec, unit.c_str());
      csv.row("prefill_frontier_tflops", L, tflops, "TFLOP/s (matmul + attention FLOPs)", lim->fp8_tflops > 0 ? tflops / lim->fp8_tflops : -1);
    }
    prefill_at_progress.update(n_at);
    prefill_at_progress.finish();
    for (int64_t M : a.prefill_gemms) {
      // The GEMM work of a prefill chunk of M rows on the tensor-core path, one middle layer's
      // weights, each GEMM alone (median of 3), against the measured tensor-core rates.
      const int layer = (*ex)->config().n_layers / 2;
      auto t = (*ex)->time_prefill_gemms(M, layer, 3);
      if (!t.ok()) return bench_failed(t.status(), "prefill gemms " + std::to_string(M));
      double fl = 0, ms = 0;
      std::fprintf(stderr, "bench: tensor-core GEMM work of a %lld-row prefill chunk (layer %d; bf16 operands, f32 accumulate):\n", (long long)M,
                   layer);
      for (const auto& g : *t) {
        const double tf = g.flops / (g.ms * 1e-3) / 1e12;
        std::fprintf(stderr, "  %-34s %8.3f ms %8.1f TFLOP/s  %5.1f%% of BF16, %5.1f%% of FP8\n", g.name.c_str(), g.ms, tf,
                     100.0 * tf / lim->bf16_tflops, 100.0 * tf / lim->fp8_tflops);
        csv.row("prefill_gemm_" + g.name + "_tflops", M, tf, "TFLOP/s (share: of the FP8 rate)", tf / lim->fp8_tflops);
        fl += g.flops;
        ms += g.ms;
      }
      const double tf = fl / (ms * 1e-3) / 1e12;
      std::fprintf(stderr, "  %-34s %8.3f ms %8.1f TFLOP/s  %5.1f%% of BF16, %5.1f%% of FP8\n", "all (one layer)", ms, tf,
                   100.0 * tf / lim->bf16_tflops, 100.0 * tf / lim->fp8_tflops);
      csv.row("prefill_gemm_layer_tflops", M, tf, "TFLOP/s, one layer's GEMM work (share: of the FP8 rate)", tf / lim->fp8_tflops);
      csv.row("prefill_gemm_layer_bf16_share", M, tf / lim->bf16_tflops, "share of the measured BF16 tensor-core rate");
    }
    if (!a.kv_restore.empty()) {
      // issue 21: save, write, read and restore a session at each context against its prefill.
      bench::KvRestoreOptions ko;
      ko.contexts = a.kv_restore;
      ko.dir = a.kv_dir.empty() ? std::filesystem::temp_directory_path().string() : a.kv_dir;
      ko.full_prefill = !a.kv_restore_estimate;
      ko.prefill_chunk = a.prefill_chunk;
      PhaseProgress kv_progress;  // on a terminal only
      ko.progress = kv_progress.fn();
      const bool tmpfs = bench::dir_on_tmpfs(ko.dir);
      std::fprintf(stderr, "bench: kv restore: state files in %s%s\n", ko.dir.c_str(), tmpfs ? " (a tmpfs: RAM, not a disk)" : "");
      const model::Config& c = (*ex)->config();
      auto pts = bench::run_kv_restore(
          **ex, ko, [&c](int64_t s0, int64_t s1, int64_t end) { return prefill_step(c, s0, s1, end, 5); },
          [](const std::string& line) { std::fprintf(stderr, "bench: kv restore: %s\n", line.c_str()); });
      if (!pts.ok()) return bench_failed(pts.status(), "kv restore");
      csv.row("kv_dir_tmpfs", 0, tmpfs ? 1.0 : 0.0, "1 = the state files' folder is a tmpfs (RAM, not a disk)");
      bench::report_kv_restore(*pts, c, lim->h2d_pageable_gbps,
                               [&csv](const std::string& n, int64_t L, double v, const char* u, double share) { csv.row(n, L, v, u, share); });
    }
    if (!a.sessions.empty() || a.arrival_prompt > 0) {
      // issue 20: N sessions in shared steps at one context, and a long prompt arriving beside
      // decoding streams under the engine's prefill policy. The contexts are fake-filled
      // (bench/fake_context.h: a decode step costs what it costs at a real context of that length)
      // unless --sessions-prefill; so is the arrival prompt up to its last --arrival-tail tokens.
      engine::SessionRoundsOptions so;
      so.sessions = a.sessions;
      so.context = a.sessions_context;
      so.rounds = a.session_rounds;
      so.dspark = a.sessions_dspark;
      so.prefill_chunk = int(a.prefill_chunk);
      so.arrival_prompt = a.arrival_prompt;
      so.arrival_streams = a.arrival_streams;
      so.step_factor = a.mixed_step_factor;
      if (!a.sessions_prefill) {
        cuda::CudaExecutor& cx = **ex;
        so.fill_context = [&cx](model::SessionState& s, std::span<const int32_t> tokens) -> Status {
          auto& cs = static_cast<cuda::CudaSession&>(s);
          // The same tokens get the same cache bytes: a session starts each count from the same
          // state, so its greedy tokens can be compared across counts (row invariance, below).
          const uint64_t seed = 0x5E55 ^ (uint64_t(tokens.size()) << 32) ^ uint64_t(uint32_t(tokens.empty() ? 0 : tokens.front()));
          FB_RETURN_IF_ERROR(bench::fill_fake_context(cx, cs, int64_t(tokens.size()), seed));
          cs.tokens.assign(tokens.begin(), tokens.end());  // the generator's history (Engram hashes read them)
          return Status();
        };
        so.arrival_tail = a.arrival_tail;
      }
      so.log = [](const std::string& line) { std::fprintf(stderr, "bench: %s\n", line.c_str()); };
      auto sr = engine::run_session_rounds(**ex, so);
      if (!sr.ok()) return bench_failed(sr.status(), "sessions");
      const int64_t L = a.sessions_context;
      const double one = sr->rows.empty() || sr->rows[0].sessions != 1 ? 0 : sr->rows[0].tok_s;
      for (const engine::SessionRoundsRow& r : sr->rows) {
        const std::string tag = "sessions_" + std::to_string(r.sessions) + "_";
        std::fprintf(stderr, "bench: %d sessions at %lld: %.1f tok/s (%.2fx one), %.1f rows/step, round p50 %.2f ms (step %.2f), p99 %.2f ms, max %.2f ms\n",
                     r.sessions, (long long)L, r.tok_s, one > 0 ? r.tok_s / one : 0.0, r.rows_per_step, r.gap_p50_ms, r.step_p50_ms, r.gap_p99_ms,
                     r.gap_max_ms);
        csv.row(tag + "tok_s", L, r.tok_s, "tok/s, all sessions together (shared steps)");
        if (one > 0) csv.row(tag + "speedup", L, r.tok_s / one, "x one session's tok/s");
        csv.row(tag + "rows_per_step", L, r.rows_per_step, "rows");
        csv.row(tag + "gap_p50_ms", L, r.gap_p50_ms, "ms, round time = each session's inter-token gap, median");
        csv.row(tag + "gap_p99_ms", L, r.gap_p99_ms, "ms, p99");
        csv.row(tag + "gap_max_ms", L, r.gap_max_ms, "ms, max");
        csv.row(tag + "step_p50_ms", L, r.step_p50_ms, "ms, the round's forward() step, median (the rest of a round is host work)");
        // Session 0's greedy tokens beside the others against its run with the first count (the
        // common prefix: DSpark rounds may emit more): equal unless batching changed its bits.
        const std::vector<int32_t>& a0 = sr->rows[0].first_session_tokens;
        const size_t n = std::min(a0.size(), r.first_session_tokens.size());
        const bool same = n > 0 && std::equal(a0.begin(), a0.begin() + int64_t(n), r.first_session_tokens.begin());
        if (&r != &sr->rows[0]) {
          std::fprintf(stderr, "bench: session 0's %zu tokens beside %d other sessions: %s to its run beside %d\n", n, r.sessions - 1,
                       same ? "equal" : "DIFFERENT", sr->rows[0].sessions - 1);
          csv.row(tag + "tokens_equal", L, same ? 1.0 : 0.0, "1 = session 0's greedy tokens equal to the first count's (row invariance)");
        }
      }
      if (sr->has_arrival) {
        const engine::ArrivalResult& ar = sr->arrival;
        std::fprintf(stderr, "bench: a %lld-token prompt beside %d streams at %lld: worst gap %.2f ms vs median %.2f ms before (%.2fx), "
                     "its last %lld rows prefilled in %.2f s over %lld rounds (%lld reference steps, last chunk %lld rows)\n",
                     (long long)a.arrival_prompt, a.arrival_streams, (long long)L, ar.worst_gap_ms, ar.median_gap_ms,
                     ar.median_gap_ms > 0 ? ar.worst_gap_ms / ar.median_gap_ms : 0.0, (long long)ar.prefilled_rows, ar.prefill_s,
                     (long long)ar.rounds, (long long)ar.reference_steps, (long long)ar.last_chunk);
        std::fprintf(stderr, "bench: the worst gap: round %lld of the prompt, %lld prompt rows, its step %.2f ms\n", (long long)ar.worst_round,
                     (long long)ar.worst_prefill_rows, ar.worst_step_ms);
        csv.row("arrival_worst_gap_ms", a.arrival_prompt, ar.worst_gap_ms, "ms, the streams' worst gap while the prompt prefilled");
        csv.row("arrival_median_gap_ms", a.arrival_prompt, ar.median_gap_ms, "ms, their median gap before it arrived");
        csv.row("arrival_gap_ratio", a.arrival_prompt, ar.median_gap_ms > 0 ? ar.worst_gap_ms / ar.median_gap_ms : 0.0, "worst / median");
        csv.row("arrival_prefill_s", a.arrival_prompt, ar.prefill_s, "s, arrival to the prompt's last chunk");
        csv.row("arrival_prefilled_rows", a.arrival_prompt, double(ar.prefilled_rows), "prompt rows prefilled beside the streams (the rest filled)");
      }
    }
    // Forced acceptance p: plain greedy first, then DSpark with full blocks (spec/13 §5), and with
    // --sweep-schedule also under the confidence scheduler and its back-off (the default path).
    for (int pass = 0; pass < (a.dspark_sweep ? (a.sweep_schedule ? 2 : 1) : 0); ++pass) {
      const bool sched = pass == 1;
      PhaseProgress sweep_progress;  // on a terminal only
      auto rep = bench::dspark_sweep(**ex, 256, a.sweep_tokens, a.accept, sched ? -1 : (*ex)->config().dspark_block_size, sweep_progress.fn());
      if (!rep.ok()) return bench_failed(rep.status(), "dspark sweep");
      for (const auto& r : *rep) {
        char tag[40];
        std::snprintf(tag, sizeof tag, sched ? "dspark_sched_p%.2f_" : "dspark_p%.2f_", r.p);
        std::fprintf(stderr, "bench: dspark %s p=%.2f: %.1f tok/s (plain %.1f), %.2f tokens/round, %lld rounds, %lld back-off steps, equal=%d\n",
                     sched ? "scheduled" : "full blocks", r.p, r.tok_per_s, r.plain_tok_per_s, r.tokens_per_round, (long long)r.rounds,
                     (long long)r.backoff_steps, int(r.matches_plain));
        if (sched) csv.row(std::string(tag) + "backoff_steps", 256, double(r.backoff_steps), "plain steps: drafting did not pay");
        csv.row(std::string(tag) + "tokens_per_round", 256, r.tokens_per_round, "tokens/round");
        csv.row(std::string(tag) + "model_tokens_per_round", 256, r.expected_tokens_per_round, "tokens/round (speed model)");
        csv.row(std::string(tag) + "tok_s", 256, r.tok_per_s, "tok/s (DSpark on)");
        csv.row(std::string(tag) + "plain_tok_s", 256, r.plain_tok_per_s, "tok/s (DSpark off)");
        csv.row(std::string(tag) + "equals_plain", 256, r.matches_plain ? 1.0 : 0.0, "1 = greedy output identical");
      }
    }
  }
  if (!a.model.empty()) {
    auto ex = cuda::CudaExecutor::load(a.model);
    if (!ex.ok()) return bench_failed(ex.status());
    auto s = (*ex)->new_session();
    std::vector<model::SessionState*> ss{s.get()};
    const model::Step st = prefill_step((*ex)->config(), 0, a.prompt_len, a.prompt_len, 3);
    if (auto o = (*ex)->forward(st, ss); !o.ok()) return bench_failed(o.status(), "prefill");
    auto t = bench::time_decode(**ex, *s, a.steps, a.verify_rows);
    if (!t.ok()) return bench_failed(t.status());
    csv.row("model_decode_ms", a.prompt_len, t->decode_ms, "ms/token");
    csv.row("model_decode_tok_s", a.prompt_len, 1000.0 / t->decode_ms, "tok/s");
  }
  if (out != stdout) std::fclose(out);
  return 0;
}

}  // namespace

Runner add_bench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* g = nullptr;  // the option group of the options that follow (sections of --help)
  app.add_flag("--limits", a->limits, "only the physical limits (always measured)");
  app.add_flag("--synthetic", a->synthetic, "released-dimension synthetic model in HBM: decode, verify curve, draft");
  app.add_option("--model", a->model, "a checkpoint folder: prefill --prompt-len random tokens, then decode");
  app.add_option("--prompt-len", a->prompt_len, "prompt tokens for --model");
  g = app.add_option_group("synthetic model", "the released-dimension model of --synthetic");
  g->add_option("--experts", a->experts, "routed experts per layer of the synthetic model (all resident)");
  g->add_option("--draft-experts", a->draft_experts, "routed experts per DSpark stage of the synthetic model");
  g->add_option("--engram-vocab", a->engram_vocab, "engram_vocab_size of the synthetic model (table size)");
  g->add_option("--engram-drives", a->engram_drives,
                "write the synthetic Engram tables as an Engram store (DIR/engram.fbe) in each dir and read their rows from there with O_DIRECT "
                "(replicas; the tables stay on the host side)")
      ->delimiter(',');
  g->add_option("--engram-cache-bytes", a->engram_cache_bytes, "with --engram-drives: the host row cache (0: every row from the drives)");
  g->add_option("--engram-place", a->engram_place,
                "where the synthetic model's Engram tables live: auto (HBM up to 16 GiB of tables), hbm, or host (each step's rows "
                "copied from host memory, ahead of their layers by --cuda-opt engram_prefetch_tasks=N threads)");
  g = app.add_option_group("decode rows", "one-session decode steps of --synthetic");
  auto* contexts = g->add_option("--contexts", a->contexts, "context lengths for --synthetic")->delimiter(',');
  g->add_option("--steps", a->steps, "timed repetitions per row (median)");
  g->add_option("--verify-rows", a->verify_rows, "measure verify steps of 1..N rows");
  g = app.add_option_group("prefill", "prefill steps of --synthetic");
  g->add_option("--prefill", a->prefill, "with --synthetic: prefill these prompt lengths (real, chunked)")->delimiter(',');
  g->add_option("--prefill-chunk", a->prefill_chunk, "rows per prefill step");
  g->add_option("--prefill-at", a->prefill_at,
                "with --synthetic: prefill throughput of one --prefill-chunk chunk ending at these contexts (earlier context fake-filled)")
      ->delimiter(',');
  g->add_option("--prefill-gemms", a->prefill_gemms, "with --synthetic: time a prefill chunk's GEMM work (tensor cores) at these row counts")
      ->delimiter(',');
  g = app.add_option_group("DSpark sweep", "DSpark rounds at forced acceptance");
  g->add_flag("--dspark-sweep", a->dspark_sweep, "with --synthetic: DSpark tok/s at forced acceptance rates (--accept)");
  g->add_option("--accept", a->accept, "forced per-draft acceptance rates for --dspark-sweep")->delimiter(',');
  g->add_flag("--sweep-schedule", a->sweep_schedule, "with --dspark-sweep: also run it under the confidence scheduler and back-off");
  g->add_option("--sweep-tokens", a->sweep_tokens,
                "generated tokens per --dspark-sweep run (default 240; the tokens per round at a forced acceptance are a random draw: fewer rounds, "
                "noisier ratios)");
  g = app.add_option_group("CUDA options and A/B", "the run options of the CUDA executor, and interleaved A/B of them");
  g->add_option("--ab", a->ab_env,
                "with --synthetic: interleaved A/B of a CUDA run option on the decode rows, NAME=v1,v2 (e.g. numerics=exact,fast or attn_split=1,0); "
                "several, one after the other: NAME=v1,v2;NAME2=v1,v2");
  g->add_option("--ab-rounds", a->ab_rounds, "with --ab: interleaved rounds per value (default 3; the medians over them)")->check(CLI::Range(1, 100));
  g->add_option("--prefill-ab", a->prefill_ab_env, "with --prefill-at: interleaved A/B of a CUDA run option on each chunk, NAME=v1,v2");
  g->add_option("--numerics", a->numerics, "CUDA numerics class: fast (default) or exact (bit-identical to the CPU)")
      ->check(CLI::IsMember({"fast", "exact"}));
  g->add_option("--cuda-opt", a->cuda_opts, "CUDA run option NAME=VALUE (repeatable; names as for --ab)");
  g = app.add_option_group("timing detail", "CUDA graphs, CUPTI traces, per-op and per-kernel times");
  g->add_flag("--graph-step", a->graph_step,
              "with --synthetic: also the GPU time of one decode step captured as a CUDA graph and replayed (launch overhead excluded)");
  g->add_option("--trace-steps", a->trace_steps,
                "with --synthetic: trace N decode steps (and N of --verify-rows rows) at each context with CUPTI, as they run in production "
                "(PDL and the side stream on): span, busy and idle GPU time, kernels by time");
  g->add_option("--trace-csv", a->trace_csv,
                "with --trace-steps: write the median traced step's kernels and copies (start, end, stream) to PATH.<kind><context>.csv; with "
                "--cold-prefill-trace: the traced run's to PATH.cold<prompt>.csv");
  g->add_flag("--profile-kernels", a->profile_kernels,
              "with --profile: also per-kernel GPU time (k:<op>/<kernel>, an event after every launch; gaps count with the next kernel)");
  g->add_flag("--profile", a->profile, "per-op GPU time of a one-row decode step (CUDA events) after each --synthetic context");
  g = app.add_option_group("expert tiers", "routed experts through HBM slots, pinned host memory and drives (issues 9, 22)");
  g->add_option("--expert-slots", a->expert_slots,
                "with --synthetic: routed experts per layer in HBM slots, the rest copied from pinned host memory on a miss; runs the "
                "tier sweep (issue 9) at the first --contexts value instead of the other rows");
  g->add_option("--expert-staging", a->expert_staging,
                "with --expert-slots: staging slots per layer for LFU admission (cold misses do not evict hotter experts)");
  g->add_option("--lfu-aging", a->lfu_aging, "with --expert-slots: LFU counts halve every N x slots lookups of a layer");
  g->add_option("--skews", a->skews, "tier sweep: shares of a layer's routes carried by its 10 hottest experts")->delimiter(',');
  g->add_option("--tier-prefill-rows", a->tier_prefill_rows, "tier sweep: rows of the prefill chunk timed per skew (0: none)");
  g->add_option("--tier-warm-steps", a->tier_warm_steps, "tier sweep: decode steps before the counters start");
  g->add_option("--predict-accuracy", a->predict_accuracy,
                "tier sweep: next-layer expert prediction arms run at each skew in turn, e.g. -1,0.8 (-1: off; A in [0, 1]: "
                "--cuda-opt expert_predict on, guesses holding a share A of the drawn routing); drive tier (--expert-drives): a "
                "third arm with prediction at the first A >= 0")
      ->delimiter(',')
      ->check(CLI::Range(-1.0, 1.0));
  g->add_option("--expert-drives", a->expert_drives,
                "with --expert-slots: the drive tier (issue 22): expert records written to these replica dirs (a disk, not tmpfs), "
                "misses through --host-experts page-locked records, then O_DIRECT reads; replaces the tier sweep")
      ->delimiter(',');
  g->add_option("--host-experts", a->host_experts, "with --expert-drives: host cache records");
  g->add_option("--drive-records", a->drive_records, "with --expert-drives: expert records per drive file (18.8 MB each at released dims)");
  g->add_option("--drive-fault", a->drive_faults,
                "with --expert-drives: make replica DRIVE fail mid-run after AFTER of its reads: DRIVE@AFTER:unlink|truncate|eio "
                "(unlink and truncate change the record file) or DRIVE@AFTER:delay=US; repeatable; the run must go on through the other replica");
  g->add_option("--drive-warm-steps", a->drive_warm_steps, "with --expert-drives: decode steps through the drives before each timed arm");
  g->add_option("--drive-replay-tokens", a->drive_replay_tokens,
                "with --expert-drives: decode tokens whose cache lookups are replayed (no kernels) before the --tier-warm-steps "
                "steps, so the HBM slots and the host cache start the steps at the policy's steady state (0: none)");
  g = app.add_option_group("cold prefill", "long prompts prefilled through the expert tiers (issue 26)");
  g->add_option("--cold-prefill", a->cold_prefill,
                "with --expert-slots: prompts of these lengths prefilled through the expert tiers, serial copies vs experts streamed "
                "a layer ahead (--cuda-opt expert_prefetch; issue 26); replaces the tier sweep")
      ->delimiter(',');
  g->add_option("--cold-prefill-chunk", a->cold_prefill_chunk, "cold prefill: rows per chunk (0: the largest the free HBM allows)");
  g->add_option("--cold-prefill-serial", a->cold_prefill_serial,
                "cold prefill: also run prompts with serial copies: 1 every prompt, 0 none, N > 1 prompts of at most N tokens");
  g->add_option("--cold-prefill-routing", a->cold_prefill_routing,
                "cold prefill: whose routing: uniform (each row's experts drawn uniformly: a chunk reaches nearly every expert, as a "
                "real prompt does), router (the synthetic router's own picks: a few dozen experts a layer), or a share in (0, 1) "
                "carried by each layer's 10 hottest experts (Zipf)")
      ->check(CLI::Validator(
          [](const std::string& v) {
            const auto r = bench::parse_route_share(v);
            return r.ok() ? std::string() : r.status().to_string();
          },
          "uniform|router|SHARE"));
  g->add_flag("--cold-prefill-replay", a->cold_prefill_replay,
              "cold prefill: also a streamed run with SWA bounded replay (spec/11 sec. 8.4, an approximation): the decoder layers "
              "and their experts run for the prompt's last window rows only (the CED schedule)");
  g->add_flag("--cold-prefill-trace", a->cold_prefill_trace,
              "cold prefill: after the first prompt's runs, one more streamed run of it traced with CUPTI: the copy time beside "
              "kernels and exposed, the GPU's idle time, the kernels by time (untimed)");
  g->add_option("--cold-prefill-ab", a->cold_prefill_ab,
                "cold prefill: NAME=a,b[,...]: after the first prompt's runs, 3 rounds of one streamed run of it per value of the CUDA "
                "run option NAME, interleaved; medians of tok/s");
  g->add_option("--cold-prefill-deadline", a->cold_prefill_deadline,
                "cold prefill: seconds; a prompt whose time predicted from the last streamed rate would end later is skipped (0: none)");
  g = app.add_option_group("disk KV cache", "saving and restoring a session state");
  g->add_option("--kv-restore", a->kv_restore,
                "with --synthetic: disk KV cache rows at these contexts: prefill, save, write + fsync, cold read, restore (no decode "
                "rows unless --contexts is given)")
      ->delimiter(',');
  g->add_option("--kv-dir", a->kv_dir, "folder of the --kv-restore state files (default: the temp folder)");
  g->add_flag("--kv-restore-estimate", a->kv_restore_estimate,
              "with --kv-restore: fake-fill the context and estimate its prefill from chunk rates instead of prefilling it");
  g = app.add_option_group("sessions", "several sessions in shared steps (issue 20)");
  auto* sessions = g->add_option("--sessions", a->sessions,
                                 "with --synthetic: aggregate decode of N sessions in shared steps at --sessions-context (issue 20; no "
                                 "single-session decode rows unless --contexts is given)")
                       ->delimiter(',');
  g->add_option("--sessions-context", a->sessions_context, "context tokens of each --sessions session (fake-filled unless --sessions-prefill)")
      ->capture_default_str();
  g->add_flag("--sessions-prefill", a->sessions_prefill,
              "really prefill the --sessions contexts and the whole --arrival-prompt (minutes at 4K x 16 sessions; default: fake-filled "
              "caches, bench/fake_context.h)");
  g->add_option("--session-rounds", a->session_rounds, "timed decode rounds per session count")->capture_default_str();
  g->add_flag("--sessions-dspark", a->sessions_dspark, "--sessions rounds with DSpark (drafts in one call, verify blocks in the step)");
  auto* arrival = g->add_option("--arrival-prompt", a->arrival_prompt,
                                "with --synthetic: a prompt of N tokens arrives beside --arrival-streams decoding sessions (at "
                                "--sessions-context); the streams' worst gap while it prefills vs their median");
  g->add_option("--arrival-streams", a->arrival_streams, "decoding sessions beside --arrival-prompt")->capture_default_str();
  g->add_option("--arrival-tail", a->arrival_tail,
                "the --arrival-prompt's last N tokens are prefilled beside the streams, the rest fake-filled before it arrives (0: all)")
      ->capture_default_str();
  g->add_option("--mixed-step-factor", a->mixed_step_factor, "the prefill policy's bound for --arrival-prompt (as serve's)")->capture_default_str();
  app.add_option("--csv", a->csv, "write CSV here (default stdout)");
  app.add_option("--reps", a->reps, "timed repetitions per limit measurement (median)");
  return [a, contexts, sessions, arrival] {
    if (!a->kv_restore.empty() && contexts->count() == 0) a->contexts.clear();  // --kv-restore alone: its rows only
    if ((sessions->count() > 0 || arrival->count() > 0) && contexts->count() == 0) a->contexts.clear();  // likewise --sessions
    return run(*a);
  };
}

}  // namespace fb::cmd
