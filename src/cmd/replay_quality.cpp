// flashbox replay-quality: what SWA bounded replay (spec/11 §8.4, [approx-approved], off by
// default) costs against exact prefill, on one model.
//   --fixture DIR                 a fixture folder: its checkpoint, prompt.i32, and the decode
//                                 inputs greedy_ids[0..K-1] of steps.json (teacher forcing)
//   --model DIR --prompt-len N    a checkpoint and N pseudo-random prompt ids (--seed); the decode
//                                 inputs are the exact run's own greedy chain of --steps tokens
//   --prefer-resident M1,M2,...   instead of bounded replay: cache-conditional routing (issue 22,
//                                 [approx-approved]) on the CPU with the routed experts behind
//                                 --expert-slots N per layer and --host-experts H records (the
//                                 snapshot's shards as the drive), one run per margin (0: the tiers
//                                 alone) against the plain CPU executor
// Prints one summary line per run (and per-row lines with -v); exit 0, or 2 when it could not run.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/mapped_file.h"
#include "cmd/commands.h"
#include "cpu/executor.h"
#include "engine/executor_factory.h"
#include "engine/replay_quality.h"
#include "storage/tiered_experts.h"

namespace fb::cmd {

namespace {

namespace fs = std::filesystem;

struct Args {
  std::string fixture, model, backend = "cpu";
  int64_t prompt_len = 1024, steps = 16, chunk = 0;
  uint64_t seed = 1;
  int reps = 1;
  bool verbose = false;
  std::vector<float> prefer_resident;  // margins (cache-conditional routing); empty: bounded replay
  int64_t expert_slots = 2, host_experts = 0;
};

Result<std::vector<int32_t>> read_i32(const std::string& path) {
  std::string b = FB_TRY(read_file_bytes(path));
  if (b.size() % 4) return FB_ERROR(kCorrupt) << path << " is not a whole number of int32";
  std::vector<int32_t> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

int fail(const Status& s) {
  std::fprintf(stderr, "replay-quality: could not run: %s\n", s.to_string().c_str());
  return 2;
}

int run(const Args& a) {
  engine::ReplayQualityOptions opt;
  opt.chunk = a.chunk;
  opt.reps = a.reps;
  opt.steps = a.steps;
  std::string model_dir = a.model, name;
  if (!a.fixture.empty()) {
    model_dir = (fs::path(a.fixture) / "checkpoint").string();
    name = fs::path(a.fixture).filename().string();
    if (name.empty()) name = fs::path(a.fixture).parent_path().filename().string();
    auto prompt = read_i32((fs::path(a.fixture) / "prompt.i32").string());
    if (!prompt.ok()) return fail(prompt.status());
    opt.prompt = std::move(prompt.value());
    auto text = read_file_bytes((fs::path(a.fixture) / "steps.json").string());
    if (!text.ok()) return fail(text.status());
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (j.is_discarded() || !j.contains("greedy_ids") || !j["greedy_ids"].is_array() || j["greedy_ids"].empty())
      return fail(FB_ERROR(kCorrupt) << a.fixture << "/steps.json has no greedy_ids");
    for (size_t k = 0; k + 1 < j["greedy_ids"].size(); ++k) opt.forced.push_back(j["greedy_ids"][k].get<int32_t>());
    if (opt.forced.empty()) opt.steps = 0;
  } else if (a.model.empty()) {
    return fail(FB_ERROR(kInvalidArgument) << "give --fixture DIR or --model DIR");
  }
  auto ex = engine::make_executor(a.backend, model_dir);
  if (!ex.ok()) return fail(ex.status());
  const model::Config& c = (*ex)->config();
  if (a.fixture.empty()) {
    name = fs::path(model_dir).filename().string() + "-synthetic" + std::to_string(a.prompt_len);
    uint64_t x = a.seed * 0x9E3779B97F4A7C15ull + 1;  // xorshift64*: the same ids for a seed everywhere
    const int64_t hi = std::min<int64_t>(c.vocab_size, 128000), lo = std::min<int64_t>(3, hi - 1);
    for (int64_t p = 0; p < a.prompt_len; ++p) {
      x ^= x >> 12;
      x ^= x << 25;
      x ^= x >> 27;
      opt.prompt.push_back(int32_t(lo + int64_t((x * 0x2545F4914F6CDD1Dull) >> 33) % (hi - lo)));
    }
  }
  if (!a.prefer_resident.empty()) {
    if (a.backend != "cpu") return fail(FB_ERROR(kUnsupported) << "--prefer-resident runs on the cpu backend");
    for (float margin : a.prefer_resident) {
      auto m = cpu::CpuModel::load(model_dir);
      if (!m.ok()) return fail(m.status());
      storage::TieredOptions to;
      to.slots_per_layer = int(a.expert_slots);
      to.host_experts = a.host_experts;
      auto src = storage::tiered_experts_for(m.value()->snapshot(), {}, to);
      if (!src.ok()) return fail(src.status());
      std::shared_ptr<storage::TieredExperts> tiers = src.value();
      m.value()->set_expert_source(tiers);
      if (margin > 0.0f) m.value()->set_route_preference(margin, [tiers](int l, int e) { return tiers->resident(l, e); });
      auto rep = engine::approx_quality(**ex, *m.value(), opt);
      if (!rep.ok()) return fail(rep.status());
      const storage::TierStats t = tiers->stats();
      const uint64_t lookups = t.slot_hits + t.slot_misses;
      std::printf("route-quality %s: margin=%g slots=%lld host=%lld rows=%zu kl_prompt=%.3e mean_kl=%.3e max_kl=%.3e top1=%d/%zu swaps=%lld "
                  "slot_hits=%llu slot_misses=%llu host_hits=%llu drive_reads=%llu slot_hit_rate=%.3f\n",
                  name.c_str(), double(margin), (long long)a.expert_slots, (long long)a.host_experts, rep->kl.size(),
                  rep->kl.empty() ? 0.0 : rep->kl[0], rep->mean_kl(), rep->max_kl(), rep->top1_agree(), rep->top1_same.size(),
                  (long long)m.value()->route_swaps(), (unsigned long long)t.slot_hits, (unsigned long long)t.slot_misses,
                  (unsigned long long)t.host_hits, (unsigned long long)t.drive_reads, lookups ? double(t.slot_hits) / double(lookups) : 0.0);
      std::fflush(stdout);
    }
    return 0;
  }
  auto rep = engine::replay_quality(**ex, opt);
  if (!rep.ok()) return fail(rep.status());
  if (a.verbose)
    for (size_t k = 0; k < rep->kl.size(); ++k)
      std::printf("row %zu%s kl=%.4e top1=%s exact_margin=%.4f\n", k, k == 0 ? " (last prompt position)" : "", rep->kl[k],
                  rep->top1_same[k] ? "same" : "DIFF", rep->exact_margin[k]);
  std::printf("%s\n", rep->summary_line(name).c_str());
  return 0;
}

}  // namespace

Runner add_replay_quality(CLI::App& app) {
  auto a = std::make_shared<Args>();
  app.add_option("--fixture", a->fixture, "fixture folder (checkpoint/, prompt.i32, steps.json): teacher-forced by its greedy_ids");
  app.add_option("--model", a->model, "model folder, with a synthetic prompt of --prompt-len ids");
  app.add_option("--prompt-len", a->prompt_len, "synthetic prompt length for --model");
  app.add_option("--seed", a->seed, "synthetic prompt seed");
  app.add_option("--steps", a->steps, "decode steps after the prompt for --model (teacher-forced by the exact run's argmax)");
  app.add_option("--chunk", a->chunk, "prefill rows per step (0 = one step)");
  app.add_option("--reps", a->reps, "timed prefills per mode (minimum reported)");
  app.add_option("--backend", a->backend, "executor (bounded replay runs on cpu)")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag("-v,--verbose", a->verbose, "one line per logits row");
  app.add_option("--prefer-resident", a->prefer_resident,
                 "cache-conditional routing margins (biased-score units) to measure instead of bounded replay; 0: the tiers alone")
      ->delimiter(',');
  app.add_option("--expert-slots", a->expert_slots, "with --prefer-resident: first-tier expert slots per layer")->check(CLI::Range(1, 1 << 20));
  app.add_option("--host-experts", a->host_experts, "with --prefer-resident: host cache records (0: none)")->check(CLI::Range(0, 1 << 30));
  return [a] { return run(*a); };
}

}  // namespace fb::cmd
