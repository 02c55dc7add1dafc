// flashbox check-fixture DIR [--backend cpu|cuda] [--numerics fast|exact] [--cuda-opt NAME=VALUE] [--chunk N] [--expert-slots N [--host-experts N] [--expert-store DIR... [--fault-replica D@N:KIND]] [--no-expert-prefetch] [--expert-predict]] [--engram-cache-bytes N [--engram-replica DIR... | --engram-store DIR...] [--engram-fault D@N:KIND]] [--bounded-replay]
// Exit 0 PASS, 1 FAIL, 2 could not run. Last line: the summary contract of CLARIFICATIONS.md.
#include <atomic>
#include <cstdio>
#include <memory>

#include "cmd/commands.h"
#include "cpu/executor.h"
#include "cpu/host_expert.h"
#ifdef FB_HAVE_CUDA_EXECUTOR
#include "cmd/cuda_run_flags.h"
#include "cuda/executor.h"
#endif
#include "engine/executor_factory.h"
#include "engine/fixture_check.h"
#include "storage/engram_rows.h"
#include "storage/tiered_experts.h"

namespace fb::cmd {

namespace {

struct Args {
  std::vector<std::string> dirs;
  std::string backend = "cpu";
  int64_t chunk = 0;
  bool bounded_replay = false;
  int64_t expert_slots = 0;
  int64_t host_experts = 0;
  std::vector<std::string> expert_store;
  std::vector<std::string> faults;  // --fault-replica (storage::parse_reader_fault)
  bool prefetch = true;
  bool expert_predict = false;
  bool verbose = false;
  bool compare_cpu = false;
  std::string numerics = "fast";
  std::vector<std::string> cuda_opts;  // NAME=VALUE (cuda::set_run_option)
  std::string dump;
  int64_t engram_cache_bytes = -1;  // >= 0: Engram rows from the shards through a row cache (engine::ExecutorOptions)
  std::vector<std::string> engram_replicas;
  std::vector<std::string> engram_store;   // --engram-store (flashbox convert --engram)
  std::vector<std::string> engram_faults;  // --engram-fault (storage::parse_reader_fault), drive 0 = the checkpoint's own folder
};

// --fault-replica / --engram-fault specs, or the first bad one's error under the flag's name.
Result<std::vector<storage::ReaderFault>> parse_faults(const std::vector<std::string>& specs, const char* flag) {
  std::vector<storage::ReaderFault> out;
  for (const std::string& f : specs) {
    auto x = storage::parse_reader_fault(f);
    if (!x.ok()) return x.status().with_context(flag);
    out.push_back(*x);
  }
  return out;
}

int run(const Args& a) {
  auto faults_or = parse_faults(a.faults, "--fault-replica");
  auto engram_faults_or = parse_faults(a.engram_faults, "--engram-fault");
  for (const auto* r : {&faults_or, &engram_faults_or})
    if (!r->ok()) {
      std::fprintf(stderr, "check-fixture: %s\n", r->status().to_string().c_str());
      return 2;
    }
  const std::vector<storage::ReaderFault> faults = *faults_or, engram_faults = *engram_faults_or;
  std::vector<std::shared_ptr<storage::TieredExperts>> tiers;  // kept to report hit/miss counters
#ifdef FB_HAVE_CUDA_EXECUTOR
  std::vector<std::shared_ptr<cuda::DevExpertSlots>> cuda_tiers;  // reported after each fixture
#endif
  std::vector<std::shared_ptr<storage::EngramRowCache>> engram;  // reported after each fixture
  std::vector<std::shared_ptr<const cpu::CpuModel::PredictCounts>> cpu_predict;  // --expert-predict on the CPU: guesses, reported after each fixture
  auto make_engram = [&](const loader::Snapshot& snap) -> Result<std::shared_ptr<storage::EngramRowCache>> {
    if (a.engram_cache_bytes < 0) return std::shared_ptr<storage::EngramRowCache>();
    storage::EngramCacheOptions eo;
    eo.capacity_bytes = uint64_t(a.engram_cache_bytes);
    eo.faults = engram_faults;
    auto c = a.engram_store.empty() ? storage::engram_cache_for(snap, a.engram_replicas, eo) : storage::engram_store_for(snap, a.engram_store, eo);
    if (!c.ok()) return c.status().with_context(a.engram_store.empty() ? "--engram-cache-bytes" : "--engram-store");
    engram.push_back(c.value());
    return c;
  };
  auto make = [&](const std::string& ckpt) -> Result<std::unique_ptr<model::Executor>> {
    if (a.backend == "cpu") {
      auto m = cpu::CpuModel::load(ckpt);
      if (!m.ok()) return m.status();
      if (auto e = FB_TRY(make_engram(m.value()->snapshot()))) m.value()->set_engram_source(std::move(e));
      if (a.expert_slots > 0) {  // experts through the tiers: slots, host cache, shard reads
        storage::TieredOptions to;
        to.slots_per_layer = int(a.expert_slots);
        to.host_experts = a.host_experts > 0 ? a.host_experts : a.expert_slots;
        to.prefetch = a.prefetch;
        to.faults = faults;
        auto src = storage::tiered_experts_for(m.value()->snapshot(), a.expert_store, to);
        if (!src.ok()) return src.status();
        tiers.push_back(src.value());
        m.value()->set_expert_source(std::move(src.value()));
      }
      if (a.expert_predict) {
        m.value()->set_expert_predict(true);
        cpu_predict.push_back(m.value()->predict_counts());
      }
      return std::unique_ptr<model::Executor>(std::move(m.value()));
    }
#ifdef FB_HAVE_CUDA_EXECUTOR
    if (a.backend == "cuda") {
      // --expert-slots: routed experts in that many HBM slots per layer, misses copied from the
      // snapshot (cuda/expert_slots.h); the outputs must not change.
      cuda::CudaLoadOptions lo;
      lo.expert_slots = int(a.expert_slots);
      FB_RETURN_IF_ERROR(apply_cuda_run_flags(lo.run, a.numerics, a.cuda_opts));
      if (a.expert_predict) lo.run.expert_predict = true;
      if (a.expert_slots > 0) {
        // The misses come through the host tiers (host cache, then shard reads with O_DIRECT):
        // HBM slots <- page-locked host records <- drives, every byte copied unchanged.
        engine::ExecutorOptions eo;
        eo.expert_slots = int(a.expert_slots);
        eo.host_experts = a.host_experts;
        eo.expert_store = a.expert_store;
        eo.expert_prefetch = a.prefetch;
        eo.expert_predict = lo.run.expert_predict;  // views kept a layer longer for the copies ahead
        eo.reader_faults = faults;
        auto src = engine::make_host_tiers("cuda", ckpt, eo);
        if (!src.ok()) return src.status();
        tiers.push_back(src.value());
        lo.experts = std::move(src.value());
      }
      lo.host_compute = cpu::host_expert_compute();  // used under --cuda-opt host_compute=1|2
      if (a.engram_cache_bytes >= 0) {
        auto snap = loader::Snapshot::open(ckpt);
        if (!snap.ok()) return snap.status();
        lo.engram_rows = FB_TRY(make_engram(**snap));
      }
      auto m = cuda::CudaExecutor::load(ckpt, {}, lo);
      if (!m.ok()) return m.status();
      if (auto t = m.value()->expert_slots()) cuda_tiers.push_back(std::move(t));
      return std::unique_ptr<model::Executor>(std::move(m.value()));
    }
#endif
    return FB_ERROR(kUnsupported) << "backend \"" << a.backend << "\" is not built into this binary";
  };
  auto make_cpu = [](const std::string& ckpt) -> Result<std::unique_ptr<model::Executor>> {
    auto m = cpu::CpuModel::load(ckpt);
    if (!m.ok()) return m.status();
    return std::unique_ptr<model::Executor>(std::move(m.value()));
  };
  int rc = 0;
  for (const std::string& dir : a.dirs) {
    engine::FixtureCheckOptions opt;
    opt.chunk = a.chunk;
    opt.bounded_replay = a.bounded_replay;
    opt.verbose = a.verbose;
    opt.dump_dir = a.dump;
    if (a.compare_cpu) opt.make_reference = make_cpu;
    auto rep = engine::check_fixture(dir, make, opt);
    if (!rep.ok()) {
      std::fprintf(stderr, "check-fixture %s: could not run: %s\n", dir.c_str(), rep.status().to_string().c_str());
      rc = std::max(rc, 2);
      continue;
    }
    if (!rep->pass) rc = std::max(rc, 1);
#ifdef FB_HAVE_CUDA_EXECUTOR
    for (const auto& x : cuda_tiers) {
      const cuda::ExpertSlotStats t = x->stats();
      std::fprintf(stderr,
                   "check-fixture: HBM expert slots: %llu hits, %llu misses, %llu waves over %llu MoE calls, %.1f MB copied; %llu misses "
                   "computed on the host (%llu row-expert pairs, %.1f ms)\n",
                   (unsigned long long)t.hits, (unsigned long long)t.misses, (unsigned long long)t.waves, (unsigned long long)t.calls,
                   double(t.copied_bytes) / 1e6, (unsigned long long)t.host_experts, (unsigned long long)t.host_pairs, t.host_ms);
      if (t.predicted + t.predict_hinted > 0)  // --cuda-opt expert_predict=1: the router's next-layer guesses
        std::fprintf(stderr,
                     "check-fixture: next-layer prediction: %llu experts copied ahead, %llu of them used by their layer's call; %llu guesses "
                     "handed to the host tiers' reads\n",
                     (unsigned long long)t.predicted, (unsigned long long)t.predict_used, (unsigned long long)t.predict_hinted);
    }
    cuda_tiers.clear();
#endif
    if (!cpu_predict.empty()) {
      int64_t n = 0, picks = 0, guessed = 0;
      for (const auto& c : cpu_predict) n += c->hints.load(), picks += c->picks.load(), guessed += c->guessed.load();
      std::fprintf(stderr,
                   "check-fixture: next-layer prediction: %lld guesses handed to the expert source's prefetch; %lld of %lld routed picks "
                   "guessed (recall %.3f)\n",
                   (long long)n, (long long)guessed, (long long)picks, picks > 0 ? double(guessed) / double(picks) : 0.0);
      cpu_predict.clear();
    }
    for (const auto& e : engram) {
      std::fprintf(stderr, "check-fixture: %s\n", e->stats().to_string().c_str());
      const std::string report = e->drive_report();
      if (!engram_faults.empty() || report.find("failed") != std::string::npos) std::fprintf(stderr, "%s", report.c_str());
    }
    engram.clear();
    if (rep->reference.ran) std::printf("%s\n", rep->reference.line().c_str());
    std::printf("%s\n", rep->summary_line().c_str());
    std::fflush(stdout);
  }
  uint64_t wait_ns = 0, reads = 0;
  for (const auto& t : tiers) {
    const storage::TierStats s = t->stats();
    std::fprintf(stderr, "check-fixture: expert tiers: %s\n", s.to_string().c_str());
    std::string report = t->drive_report();
    for (size_t p = 0, q; p < report.size(); p = q + 1) {
      q = report.find('\n', p);
      if (q == std::string::npos) q = report.size();
      std::fprintf(stderr, "check-fixture:   %s\n", report.substr(p, q - p).c_str());
    }
    wait_ns += s.drive_wait_ns;
    reads += s.drive_reads;
  }
  if (!tiers.empty())
    std::fprintf(stderr, "check-fixture: exposed drive wait %.2f ms over %llu drive reads (%s)\n", double(wait_ns) / 1e6,
                 (unsigned long long)reads, a.prefetch ? "prefetch on" : "prefetch off");
  return rc;
}

}  // namespace

Runner add_check_fixture(CLI::App& app) {
  auto a = std::make_shared<Args>();
  CLI::App* g = nullptr;  // the option group of the options that follow (sections of --help)
  app.add_option("dir", a->dirs, "fixture folder(s): checkpoint/, prompt.i32, steps.json, logits.f32 ...")->required();
  app.add_option("--backend", a->backend, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--chunk", a->chunk, "prefill chunk size in rows (0 = one shot)");
  app.add_flag("--bounded-replay", a->bounded_replay,
               "approximate prefill (SWA bounded replay, spec/11 sec. 8.4); the fixtures are exact, so expect FAIL");
  g = app.add_option_group("expert tiers", "routed experts through HBM slots, the host cache and an expert store (the output must not change)");
  g->add_option("--expert-slots", a->expert_slots, "resident experts per layer (tiered store)");
  g->add_option("--host-experts", a->host_experts,
                "with --expert-slots: records in the host-RAM cache (default: --expert-slots; on CUDA at least 64 unless given)");
  g->add_option("--expert-store", a->expert_store,
                "with --expert-slots: expert-store replicas written by flashbox convert (default: the snapshot's shards)");
  g->add_option("--fault-replica", a->faults,
                "with --expert-store: make replica DRIVE fail mid-run after AFTER of its reads: DRIVE@AFTER:unlink|truncate|eio "
                "(unlink and truncate change the real file) or DRIVE@AFTER:delay=US (a slow drive); repeatable; the output must not change");
  g->add_flag("--expert-predict", a->expert_predict,
              "next-layer expert prediction: each tiered layer routes its input through the next layer's gate and reads (CPU, host "
              "tiers) or copies (CUDA slots) the guesses ahead; the outputs must not change");
  g->add_flag("!--no-expert-prefetch", a->prefetch,
              "with --expert-slots: read each missing expert only when it is asked for (no reads at routing time)");
  g = app.add_option_group("Engram tables on the drives", "their rows read from the shards with direct I/O (the output must not change)");
  g->add_option("--engram-cache-bytes", a->engram_cache_bytes,
                "read the Engram rows from the snapshot's shards through a host row cache of this many bytes (0: no cache; -1, the "
                "default: through the memory mapping)");
  g->add_option("--engram-replica", a->engram_replicas, "with --engram-cache-bytes: a copy of the checkpoint's shard files elsewhere (repeatable)");
  g->add_option("--engram-store", a->engram_store,
                "with --engram-cache-bytes: read the rows from these Engram stores (flashbox convert --engram) instead of the shards");
  g->add_option("--engram-fault", a->engram_faults,
                "with --engram-cache-bytes: make drive D (0: the checkpoint's folder, then each --engram-replica; or the --engram-store "
                "folders in order) fail after N reads, "
                "as --fault-replica (unlink and truncate change the real file); the output must not change");
  app.add_flag("-v,--verbose", a->verbose, "per-row and per-layer errors");
  g = app.add_option_group("CUDA", "the CUDA executor: its numerics class, run options and the CPU in lockstep");
  g->add_flag("--compare-cpu", a->compare_cpu,
              "also run the CPU reference in lockstep and compare logits, taps and drafts (bit for bit with --numerics exact)");
  g->add_option("--numerics", a->numerics, "CUDA numerics class: fast (default) or exact (bit-identical to the CPU reference)")
      ->check(CLI::IsMember({"fast", "exact"}));
  g->add_option("--cuda-opt", a->cuda_opts, "CUDA run option NAME=VALUE (repeatable; names as for bench --ab), e.g. tc_gemv=1");
  app.add_option("--dump-taps", a->dump, "write detailed prefill taps (f32) to this folder");
  return [a] { return run(*a); };
}

}  // namespace fb::cmd
