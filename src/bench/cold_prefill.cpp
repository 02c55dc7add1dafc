// run_cold_prefill (cold_prefill.h): whole synthetic prompts through the expert tiers, serial
// copies vs experts streamed a layer ahead.
#include "bench/cold_prefill.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>

#include "bench/fake_context.h"
#include "cuda/expert_slots.h"
#include "memory/prefill_budget.h"
#include "storage/route_sim.h"

namespace fb::bench {

namespace {

Status run_prompt(cuda::CudaExecutor& ex, int64_t N, int64_t C, int64_t replay_start,
                  const std::function<model::Step(int64_t, int64_t, int64_t)>& prefill_step, const std::function<void(int64_t)>& on_chunk) {
  auto s = ex.new_session();
  std::vector<model::SessionState*> ss{s.get()};
  for (int64_t s0 = 0; s0 < N; s0 += C) {
    model::Step st = prefill_step(s0, std::min(N, s0 + C), N);
    for (model::Row& r : st.rows) r.replay_start = replay_start;
    auto o = ex.forward(st, ss);
    if (!o.ok()) return o.status();
    if (on_chunk) on_chunk(std::min(N, s0 + C));
  }
  return Status();
}

constexpr double kGiB = double(1ull << 30);

// Free and total HBM now (after the stream drained).
Status free_hbm(uint64_t* free_b, uint64_t* total_b) {
  size_t f = 0, t = 0;
  if (cudaDeviceSynchronize() != cudaSuccess || cudaMemGetInfo(&f, &t) != cudaSuccess) {
    cudaGetLastError();
    return FB_ERROR(kInternal) << "cudaMemGetInfo failed";
  }
  *free_b = f;
  *total_b = t;
  return Status();
}

}  // namespace

Result<double> parse_route_share(const std::string& s) {
  if (s == "uniform") return 0.0;
  if (s == "router") return -1.0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !(v > 0 && v < 1))
    return FB_ERROR(kInvalidArgument) << "--cold-prefill-routing must be uniform, router or a share in (0, 1) (got \"" << s << "\")";
  return v;
}

Result<std::vector<ColdPrefillRun>> run_cold_prefill(cuda::CudaExecutor& ex, const ColdPrefillOptions& opt, ColdPrefillPlan* plan,
                                                     const std::function<model::Step(int64_t, int64_t, int64_t)>& prefill_step) {
  auto slots = ex.expert_slots();
  if (!slots) return FB_ERROR(kInvalidArgument) << "cold prefill needs tiered experts (--expert-slots below --experts)";
  if (opt.prompts.empty()) return FB_ERROR(kInvalidArgument) << "cold prefill: no prompt lengths";
  const model::Config& c = ex.config();
  int n_tiered = 0, entries = ex.run_options().expert_prefetch_entries;
  const bool derive = entries <= 0;
  for (int l = 0; l < c.n_layers; ++l)
    if (slots->slots(l) > 0) {
      ++n_tiered;
      if (derive) entries = std::max(entries, c.roles[size_t(l)].n_experts - slots->slots(l));
    }
  if (n_tiered == 0) return FB_ERROR(kInvalidArgument) << "cold prefill: no layer has more experts than slots";

  // The staging buffers first, so the free HBM the chunks are sized from is what a step can use
  // (reserved here, the executor's own check of the source is skipped: CudaExecutor::prefetch_step).
  model::ExpertTraffic traffic;
  if (slots->source().traffic(&traffic))
    return FB_ERROR(kInvalidArgument) << "cold prefill: the expert source's views expire between layers (host tiers): no prefetch";
  ColdPrefillPlan p;
  if (slots->prefetch_entries() == 0) {
    Status st = slots->reserve_prefetch(entries);
    if (!st.ok()) {
      cudaGetLastError();
      return FB_ERROR(kResourceExhausted) << "cold prefill: the prefetch staging buffers (2 x " << entries << " experts, "
                                          << 2.0 * double(entries) * double(slots->slot_bytes()) / kGiB
                                          << " GiB) do not fit next to the model and slots: " << st.to_string();
    }
  }
  p.staging_bytes = 2ull * uint64_t(slots->prefetch_entries()) * slots->slot_bytes();
  if (plan) *plan = p;

  const cuda::CudaRunOptions before = ex.run_options();
  // `o` (the bench's options, or those with an A/B value set) with the prefetch on or off.
  auto with_prefetch = [&](bool on, int64_t chunk, cuda::CudaRunOptions o) {
    o.expert_prefetch = on;
    o.expert_prefetch_min_rows = std::min<int64_t>(o.expert_prefetch_min_rows, chunk);
    ex.set_run_options(o);
  };
  // The routing override (route_share >= 0), counting the distinct experts of each call.
  uint64_t route_calls = 0, route_distinct = 0;
  if (opt.route_share >= 0) {
    int n_exp = 0;
    for (int l = 0; l < c.n_layers; ++l)
      if (slots->slots(l) > 0) n_exp = std::max(n_exp, c.roles[size_t(l)].n_experts);
    auto draw = std::make_shared<storage::ZipfRouting>(c.n_total_layers(), n_exp, opt.route_seed);
    draw->set_skew(opt.route_share, 10, n_exp);
    ex.set_route_override([draw, &route_calls, &route_distinct](int layer, std::vector<int32_t>& ids, int64_t rows, int top_k) {
      draw->draw(layer, ids, rows, top_k);
      std::vector<char> seen(size_t(draw->n_experts()), 0);
      for (int32_t e : ids)
        if (!seen[size_t(e)]) {
          seen[size_t(e)] = 1;
          ++route_distinct;
        }
      ++route_calls;
    });
  }
  auto fail = [&](Status st) {
    ex.set_run_options(before);
    ex.set_route_override(nullptr);
    return st;
  };

  std::vector<ColdPrefillRun> runs;
  const auto t_start = std::chrono::steady_clock::now();
  double last_tok_s = 0;  // the last streamed run's rate (the deadline's prediction)
  for (int64_t N : opt.prompts) {
    const bool serial = N <= opt.serial_upto;
    if (opt.deadline_s > 0 && last_tok_s > 0) {
      const double used = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
      // serial runs are slower than streamed ones; a replay run is at most a streamed one
      const double need = double(N) / last_tok_s * ((serial ? 2.5 : 1.2) + (opt.replay ? 1.0 : 0.0));
      if (used + need > opt.deadline_s) {
        std::fprintf(stderr, "bench: cold prefill: %lld tokens skipped: about %.0f s at %.0f tok/s would end past the %.0f s deadline (%.0f s used)\n",
                     (long long)N, need, last_tok_s, opt.deadline_s, used);
        continue;
      }
    }
    // Size this prompt's chunk from what HBM has once the previous prompt's step memory is freed.
    ex.release_step_memory();
    uint64_t free_b = 0, total_b = 0;
    if (Status st = free_hbm(&free_b, &total_b); !st.ok()) return fail(st);
    const uint64_t budget = memory::prefill_budget_from_free(free_b, total_b, opt.margin_bytes, opt.margin_frac);
    int64_t C = opt.chunk > 0 ? opt.chunk : memory::prefill_chunk_rows(c, budget, N);
    if (C <= 0)
      return fail(FB_ERROR(kResourceExhausted) << "cold prefill: " << N << " tokens: " << double(free_b) / kGiB << " GiB of HBM free, "
                                               << double(budget) / kGiB << " GiB after the margin: not even a 2,048-row step fits (it needs "
                                               << double(memory::prefill_step_bytes(c, 2048, std::max<int64_t>(N, 2048)).total()) / kGiB
                                               << " GiB by count)");
    const int64_t C_max = C;
    C = opt.chunk > 0 ? std::min(C, N) : memory::prefill_balanced_chunk(C, N);  // the fewest chunks, of equal size
    const memory::PrefillStepBytes counted = memory::prefill_step_bytes(c, C, N);
    if (counted.total() > budget)  // only with --cold-prefill-chunk
      return fail(FB_ERROR(kResourceExhausted) << "cold prefill: " << N << " tokens: a " << C << "-row step needs " << double(counted.total()) / kGiB
                                               << " GiB by count (arena " << double(counted.arena()) / kGiB << ", tc scratch "
                                               << double(counted.tc) / kGiB << ", session " << double(counted.session) / kGiB << "), "
                                               << double(budget) / kGiB << " GiB are free after the margin");
    std::fprintf(stderr,
                 "bench: cold prefill: %lld tokens: chunk %lld rows (%s %lld), step budget %.2f GiB of %.2f GiB free (margin %.2f GiB); counted "
                 "%.2f GiB: arena %.2f, tc scratch %.2f, session %.2f\n",
                 (long long)N, (long long)C, opt.chunk > 0 ? "--cold-prefill-chunk" : "balanced; the largest that fits:", (long long)C_max, double(budget) / kGiB,
                 double(free_b) / kGiB, double(free_b - budget) / kGiB, double(counted.total()) / kGiB, double(counted.arena()) / kGiB,
                 double(counted.tc) / kGiB, double(counted.session) / kGiB);
    if (Status st = ex.reserve_workspace(counted.arena()); !st.ok())
      return fail(FB_ERROR(kResourceExhausted) << "cold prefill: " << N << " tokens: the " << double(counted.arena()) / kGiB
                                               << " GiB step arena could not be reserved with " << double(free_b) / kGiB
                                               << " GiB free: " << st.to_string());
    // Warm-up: the prompt's last chunk after a fake-filled context (tc scratch, cuBLASLt plans,
    // the staging's first use), then the count is checked against what the step used.
    {
      with_prefetch(true, C, before);
      auto s = ex.new_session();
      Status st = fill_fake_context(ex, static_cast<cuda::CudaSession&>(*s), N - C, uint64_t(N) + 29);
      std::vector<model::SessionState*> ss{s.get()};
      if (st.ok()) {
        auto o = ex.forward(prefill_step(N - C, N, N), ss);
        if (!o.ok()) st = o.status();
      }
      if (!st.ok())
        return fail(FB_ERROR(kResourceExhausted) << "cold prefill: " << N << " tokens: the warm-up step of " << C << " rows failed ("
                                                 << st.to_string() << ") with the arena reserved at " << double(counted.arena()) / kGiB
                                                 << " GiB and " << double(budget - counted.total()) / kGiB
                                                 << " GiB counted spare before the margin; the count (memory::prefill_step_bytes) or the margin is short");
      // A step past the count still ran (its overflow allocated per op, then the arena grew or
      // stayed): the runs go on, but the count is wrong and says so.
      if (ex.workspace_high_bytes() > counted.arena())
        std::fprintf(stderr, "bench: cold prefill: warning: %lld tokens: the %lld-row step's arena reached %.3f GiB, the count says %.3f GiB: a "
                     "buffer is missing from memory::prefill_step_bytes\n",
                     (long long)N, (long long)C, double(ex.workspace_high_bytes()) / kGiB, double(counted.arena()) / kGiB);
      if (ex.tc_scratch_bytes() > counted.tc)
        std::fprintf(stderr, "bench: cold prefill: warning: tc scratch %.2f GiB, counted %.2f GiB\n", double(ex.tc_scratch_bytes()) / kGiB,
                     double(counted.tc) / kGiB);
      if (slots->prefetch_entries() == 0)
        return fail(FB_ERROR(kResourceExhausted) << "cold prefill: the prefetch staging buffers were not reserved, so a streamed run would be serial");
    }
    struct Mode {
      bool prefetch, replay;
    };
    std::vector<Mode> modes;
    if (serial) modes.push_back({false, false});
    modes.push_back({true, false});
    if (opt.replay) modes.push_back({true, true});
    for (const Mode& mode : modes) {
      const bool on = mode.prefetch;
      const int64_t replay_start = mode.replay ? std::max<int64_t>(0, N - c.window_size) : 0;
      with_prefetch(on, C, before);
      // Cold for every run. With the router's own routing the warm-up step and the run before
      // left this prompt's experts resident (the same tokens route the same way), which made a
      // second run warm (session 13: the streamed run after the serial one had no misses and used
      // none of its 10,240 staged experts): the slots are emptied. With drawn routing every run
      // routes anew, so the slots keep what the run before left (S experts per layer, as useful
      // as any other S: the steady state of a server, and what `probe`'s plan assumes: E - S
      // experts per layer cross PCIe per chunk).
      if (opt.route_share < 0) slots->evict_all();
      slots->reset_stats();
      route_calls = route_distinct = 0;
      const auto t0 = std::chrono::steady_clock::now();
      const char* mode_name = mode.replay ? "streamed, bounded replay" : on ? "streamed" : "serial";
      const std::string phase = "bench cold prefill " + std::to_string(N) + " " + mode_name;
      if (opt.progress) opt.progress(phase, 0, N, "tokens");
      const Status st = run_prompt(ex, N, C, replay_start, prefill_step, [&](int64_t done) {
        if (opt.progress) opt.progress(phase, done, N, "tokens");
      });
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!st.ok())
        return fail(FB_ERROR(kResourceExhausted) << "cold prefill: " << N << " tokens in " << C << "-row chunks, " << mode_name
                                                 << " run failed after the warm-up step of the same size passed (" << st.to_string()
                                                 << "); arena reserved " << double(counted.arena()) / kGiB << " GiB, "
                                                 << double(free_b) / kGiB << " GiB were free before the prompt");
      const cuda::ExpertSlotStats x = slots->stats();
      ColdPrefillRun r;
      r.prompt = N;
      r.chunk = C;
      r.chunks = (N + C - 1) / C;
      r.prefetch = on;
      r.replay = mode.replay;
      r.wall_s = sec;
      r.tok_s = double(N) / sec;
      r.copy_ms = x.copy_ms;
      r.prefetch_ms = x.prefetch_ms;
      r.copied_gb = double(x.copied_bytes + x.prefetch_bytes) / 1e9;
      r.copy_gbps = x.copy_ms + x.prefetch_ms > 0 ? r.copied_gb / ((x.copy_ms + x.prefetch_ms) * 1e-3) : 0;
      r.hits = x.hits;
      r.misses = x.misses;
      r.prefetched = x.prefetched;
      r.prefetch_used = x.prefetch_used;
      r.layer_step_ms = sec * 1e3 / double(r.chunks * c.n_layers);
      r.layer_copy_ms = (x.copy_ms + x.prefetch_ms) / double(r.chunks * n_tiered);
      r.workspace_high = ex.workspace_high_bytes();
      r.workspace_held = ex.workspace_bytes();
      r.predicted_bytes = counted.arena();
      r.tc_bytes = ex.tc_scratch_bytes();
      r.predicted_tc = counted.tc;
      r.budget_bytes = budget;
      r.free_bytes = free_b;
      r.experts_per_layer_call = route_calls ? double(route_distinct) / double(route_calls) : 0;
      if (on && !mode.replay) last_tok_s = r.tok_s;
      // One line per run as it ends (a run cut short by a timeout keeps the ones before it).
      std::fprintf(stderr, "bench: cold prefill run: %lld tokens in %lld chunk(s) of %lld, %s: %.2f s, %.0f tok/s; %.1f distinct experts per MoE call\n",
                   (long long)N, (long long)r.chunks, (long long)r.chunk, mode_name, sec, r.tok_s, r.experts_per_layer_call);
      runs.push_back(r);
      if (opt.on_run) opt.on_run(r);
    }
    if (!opt.ab_name.empty() && N == opt.prompts.front()) {
      for (int round = 0; round < opt.ab_rounds; ++round)
        for (const std::string& v : opt.ab_values) {
          cuda::CudaRunOptions o = before;
          if (Status st = cuda::set_run_option(o, opt.ab_name, v); !st.ok()) return fail(st);
          with_prefetch(true, C, o);
          const auto t0 = std::chrono::steady_clock::now();
          if (Status st = run_prompt(ex, N, C, 0, prefill_step, nullptr); !st.ok()) return fail(st);
          const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (opt.on_ab) opt.on_ab(v, round, double(N) / sec);
        }
      ex.set_run_options(before);
    }
    if (opt.trace && N == opt.prompts.front()) {
      // One more streamed run under the tracer (untimed): where the copy time sits against the kernels.
      if (!kernel_trace_available()) {
        std::fprintf(stderr, "bench: cold prefill trace: this build has no CUPTI (skipped)\n");
        continue;
      }
      auto tracer = KernelTracer::start();
      if (!tracer.ok()) return fail(tracer.status());
      with_prefetch(true, C, before);
      auto recs = (*tracer)->capture([&] { return run_prompt(ex, N, C, 0, prefill_step, nullptr); });
      tracer->reset();
      if (!recs.ok()) return fail(recs.status());
      ColdPrefillTrace t;
      t.prompt = N;
      t.chunks = (N + C - 1) / C;
      t.layers = c.n_layers;
      t.overlap = copy_overlap(*recs);
      std::map<std::string, std::pair<int64_t, double>> by;
      for (const TraceRecord& x : *recs) {
        auto& b = by[x.name];
        ++b.first;
        b.second += double(x.end_ns > x.start_ns ? x.end_ns - x.start_ns : 0) * 1e-3;
      }
      t.top.assign(by.begin(), by.end());
      std::sort(t.top.begin(), t.top.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
      if (t.top.size() > 12) t.top.resize(12);
      t.recs = std::move(*recs);
      if (opt.on_trace) opt.on_trace(t);
    }
  }
  ex.set_run_options(before);
  ex.set_route_override(nullptr);
  return runs;
}

}  // namespace fb::bench
