// run_cold_prefill (cold_prefill.h): whole synthetic prompts through the expert tiers, serial
// copies vs experts streamed a layer ahead.
#include "bench/cold_prefill.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "bench/fake_context.h"
#include "cuda/expert_slots.h"
#include "memory/prefill_budget.h"

namespace fb::bench {

namespace {

Status run_prompt(cuda::CudaExecutor& ex, int64_t N, int64_t C, const std::function<model::Step(int64_t, int64_t, int64_t)>& prefill_step) {
  auto s = ex.new_session();
  std::vector<model::SessionState*> ss{s.get()};
  for (int64_t s0 = 0; s0 < N; s0 += C) {
    auto o = ex.forward(prefill_step(s0, std::min(N, s0 + C), N), ss);
    if (!o.ok()) return o.status();
  }
  return Status();
}

}  // namespace

Result<std::vector<ColdPrefillRun>> run_cold_prefill(cuda::CudaExecutor& ex, const ColdPrefillOptions& opt, ColdPrefillPlan* plan,
                                                     const std::function<model::Step(int64_t, int64_t, int64_t)>& prefill_step) {
  auto slots = ex.expert_slots();
  if (!slots) return FB_ERROR(kInvalidArgument) << "cold prefill needs tiered experts (--expert-slots below --experts)";
  if (opt.prompts.empty()) return FB_ERROR(kInvalidArgument) << "cold prefill: no prompt lengths";
  const model::Config& c = ex.config();
  int n_tiered = 0, entries = ex.run_options().expert_prefetch_entries;
  bool derive = entries <= 0;
  for (int l = 0; l < c.n_layers; ++l)
    if (slots->slots(l) > 0) {
      ++n_tiered;
      if (derive) entries = std::max(entries, c.roles[size_t(l)].n_experts - slots->slots(l));
    }
  if (n_tiered == 0) return FB_ERROR(kInvalidArgument) << "cold prefill: no layer has more experts than slots";
  const int64_t n_max = *std::max_element(opt.prompts.begin(), opt.prompts.end());

  // The chunk: the largest whose step fits what HBM has left once the staging buffers exist.
  ColdPrefillPlan p;
  p.staging_bytes = slots->prefetch_entries() > 0 ? 0 : 2ull * uint64_t(entries) * slots->slot_bytes();
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return FB_ERROR(kInternal) << "cudaMemGetInfo failed";
  const uint64_t avail = uint64_t(free_b) + ex.workspace_bytes();
  p.budget_bytes = avail > p.staging_bytes + opt.reserve_bytes ? avail - p.staging_bytes - opt.reserve_bytes : 0;
  p.chunk = opt.chunk > 0 ? opt.chunk : memory::prefill_chunk_rows(c, p.budget_bytes, n_max);
  if (p.chunk <= 0)
    return FB_ERROR(kResourceExhausted) << "cold prefill: " << double(p.budget_bytes) / double(1ull << 30)
                                        << " GiB of HBM left for the step: not even a 2,048-row chunk fits";
  if (plan) *plan = p;

  const cuda::CudaRunOptions before = ex.run_options();
  auto with_prefetch = [&](bool on) {
    cuda::CudaRunOptions o = before;
    o.expert_prefetch = on;
    o.expert_prefetch_min_rows = std::min<int64_t>(o.expert_prefetch_min_rows, p.chunk);
    ex.set_run_options(o);
  };
  // Warm-up: the largest chunk at the longest prompt's end (after a fake-filled context), so the
  // step arena has grown and the staging buffers exist before anything is timed.
  {
    with_prefetch(true);
    const int64_t C = std::min(p.chunk, n_max);
    auto s = ex.new_session();
    FB_RETURN_IF_ERROR(fill_fake_context(ex, static_cast<cuda::CudaSession&>(*s), n_max - C, uint64_t(n_max) + 29));
    std::vector<model::SessionState*> ss{s.get()};
    auto o = ex.forward(prefill_step(n_max - C, n_max, n_max), ss);
    if (!o.ok()) {
      ex.set_run_options(before);
      return o.status();
    }
    if (slots->prefetch_entries() == 0) {  // the executor said why on stderr ("cuda: expert prefetch off: ...")
      ex.set_run_options(before);
      return FB_ERROR(kResourceExhausted) << "cold prefill: the prefetch staging buffers were not reserved, so a streamed run would be serial";
    }
  }

  std::vector<ColdPrefillRun> runs;
  for (int64_t N : opt.prompts) {
    std::vector<bool> modes;
    if (opt.serial_baseline) modes.push_back(false);
    modes.push_back(true);
    for (bool on : modes) {
      with_prefetch(on);
      slots->reset_stats();
      const auto t0 = std::chrono::steady_clock::now();
      const Status st = run_prompt(ex, N, p.chunk, prefill_step);
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!st.ok()) {
        ex.set_run_options(before);
        return st;
      }
      const cuda::ExpertSlotStats x = slots->stats();
      ColdPrefillRun r;
      r.prompt = N;
      r.chunk = std::min(p.chunk, N);
      r.chunks = (N + p.chunk - 1) / p.chunk;
      r.prefetch = on;
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
      r.predicted_bytes = memory::prefill_step_bytes(c, std::min(p.chunk, n_max), n_max).arena();  // the warm-up's step: the largest
      // One line per run as it ends (a run cut short by a timeout keeps the ones before it).
      std::fprintf(stderr, "bench: cold prefill run: %lld tokens in %lld chunk(s) of %lld, %s: %.2f s, %.0f tok/s\n", (long long)N,
                   (long long)r.chunks, (long long)r.chunk, on ? "streamed" : "serial", sec, r.tok_s);
      runs.push_back(r);
    }
  }
  ex.set_run_options(before);
  return runs;
}

}  // namespace fb::bench
