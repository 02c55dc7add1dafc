// flashbox probe: host RAM and cores, drive read rates (O_DIRECT, io_uring), the GPU and its pinned
// H2D rate when a CUDA runtime is built in (FB_HAVE_CUDA); then the memory plan for a model and
// the tier-bound decode rates (docs/tiers.md). Flags override every probed number.
#include <sched.h>
#include <sys/sysinfo.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "cmd/commands.h"
#include "base/thread_pool.h"
#include "cpu/host_expert.h"
#include "memory/plan.h"
#include "memory/prefill_budget.h"
#include "memory/tier_model.h"
#include "model/config.h"
#include "model/schema.h"
#include "storage/drive_probe.h"
#include "storage/replica_reader.h"
#include "storage/route_sim.h"
#ifdef FB_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace fb::cmd {

namespace {

namespace fs = std::filesystem;
constexpr double kGB = 1e9;

struct ProbeArgs {
  std::vector<std::string> dirs;
  std::vector<std::string> stores;  // replica dirs holding the records the drive tier will read (experts.fbx or records.bin)
  std::string model;
  double seconds = 2.0;
  int file_mib = 1024;
  double hbm_target_gib = -1, host_target_gib = -1, hbm_gbps = -1, h2d_gbps = -1, drive_gbps = -1, kernel_gbps = -1;
  double prefill_layer_ms = -1, prefill_row_us = -1;
  int expert_slots = -1;
  int64_t host_experts = -1;
  int sessions = 1;
  int gpus = 1;
  // Issue 25's link, measured on the 2 x H200 device kind (NV18 NVLink; tools/device_nccl_link.py,
  // docs/bench/h200x2-s24-nccl-link.csv): 278 GB/s one way at 64 MiB; a one-token all_to_all 60.8 us
  // timed with the host's barrier and synchronisation around it (an upper bound: the queued,
  // in-stream figure was not measured).
  double link_gbps = 278, link_latency_us = 60.8;
  int64_t context = 131072;
  bool no_dspark = false;
  bool no_sim = false;
  bool no_host_experts = false;
  double host_expert_ms = -1;  // override of the measured host time for one expert and token
  // The Engram row cache's hit rate: `flashbox engram-sim` with the default 1 GiB cache, the
  // lowest of three corpora (Python source 0.58, flashbox's own source and docs 0.66, C headers
  // 0.84; the second half of each, after the first warmed the cache; docs/tiers.md).
  double engram_hit = 0.58;
  double predict_accuracy = 0;  // the decode bound with next-layer prediction (DecodeBound::predicted_s); 0: not printed
  double prefill_budget_gib = -1;  // HBM for one prefill step (default: the plan's workspace)
};

struct Gpu {
  bool present = false;
  std::string name;
  int sms = 0;
  uint64_t total_bytes = 0, free_bytes = 0;
  double h2d_bytes_per_s = 0;
};

Gpu probe_gpu() {
  Gpu g;
#ifdef FB_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return g;
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return g;
  g.present = true;
  g.name = p.name;
  g.sms = p.multiProcessorCount;
  size_t fr = 0, tot = 0;
  cudaMemGetInfo(&fr, &tot);
  g.free_bytes = fr;
  g.total_bytes = tot;
  const size_t n_bytes = 256u << 20;
  void *host = nullptr, *dev = nullptr;
  if (cudaHostAlloc(&host, n_bytes, cudaHostAllocDefault) == cudaSuccess && cudaMalloc(&dev, n_bytes) == cudaSuccess) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaMemcpy(dev, host, n_bytes, cudaMemcpyHostToDevice);  // warm up
    const int reps = 10;
    cudaEventRecord(a);
    for (int i = 0; i < reps; ++i) cudaMemcpyAsync(dev, host, n_bytes, cudaMemcpyHostToDevice);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    g.h2d_bytes_per_s = double(n_bytes) * reps / (double(ms) * 1e-3);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  if (dev) cudaFree(dev);
  if (host) cudaFreeHost(host);
#endif
  return g;
}

// One expert record's bytes on the drives (layer 0, expert 0: each tensor 4 KiB aligned, as the
// store lays a record out and the reader reads it).
static uint64_t expert_record_bytes(const model::Config& c) {
  uint64_t stride = 0;
  for (const model::TensorSpec& s : model::expected_tensors(c))
    if (s.layer == 0 && s.expert == 0) stride += (uint64_t(s.nbytes()) + 4095) / 4096 * 4096;
  return stride;
}

int run_probe(const ProbeArgs& a) {
  struct sysinfo si;
  sysinfo(&si);
  const double ram_total = double(si.totalram) * si.mem_unit, ram_free = double(si.freeram + si.bufferram) * si.mem_unit;
  cpu_set_t set;
  sched_getaffinity(0, sizeof set, &set);
  std::printf("host: %.1f GiB RAM (%.1f GiB free), %d CPU cores usable (%u online)\n", ram_total / memory::kGiB, ram_free / memory::kGiB,
              CPU_COUNT(&set), std::thread::hardware_concurrency());

  std::string cfg_path = a.model.empty() ? std::string(FB_SOURCE_DIR) + "/tests/data/released_config.json" : a.model;
  if (fs::is_directory(cfg_path)) cfg_path += "/config.json";
  auto cfg = model::Config::from_file(cfg_path);
  if (!cfg.ok()) {
    std::fprintf(stderr, "probe: %s\n", cfg.status().to_string().c_str());
    return 2;
  }
  std::vector<std::string> dirs = a.dirs.empty() ? std::vector<std::string>{fs::temp_directory_path().string()} : a.dirs;
  double drive_total = 0, drive_iops = 0;
  for (const std::string& d : dirs) {
    auto r = storage::probe_drive(d, uint64_t(a.file_mib) << 20, a.seconds);
    if (!r.ok()) {
      std::printf("drive %s: %s\n", d.c_str(), r.status().to_string().c_str());
      continue;
    }
    std::printf("drive %s (%s, %s, %llu MiB file): sequential 1M %.2f GB/s, random 1M %.2f GB/s, random 4K %.3f GB/s (%.0f IOPS)\n",
                d.c_str(), r->engine.c_str(), r->direct ? "O_DIRECT" : "buffered: O_DIRECT refused", (unsigned long long)(r->file_bytes >> 20),
                r->seq_bytes_per_s / kGB, r->rand1m_bytes_per_s / kGB, r->rand4k_bytes_per_s / kGB, r->rand4k_iops());
    drive_total += r->rand1m_bytes_per_s;  // the old measure: 1 MiB reads at random offsets, 8 in flight
    drive_iops += r->rand4k_iops();
  }
  {
    // The rate the plan uses: every dir read at once as the expert reader reads a layer's misses
    // (ReaderOptions' chunk size and reads in flight per replica dir, O_DIRECT, whole expert
    // records: one record's chunks in order from a random record offset). Summing the dirs'
    // rates is right only for separate devices; random 1M reads miss the record's locality.
    const storage::DriveProbeShape shape = storage::reader_probe_shape(storage::ReaderOptions{}, expert_record_bytes(*cfg));
    auto together = storage::probe_drives_together(dirs, uint64_t(a.file_mib) << 20, a.seconds, shape);
    if (together.ok()) {
      std::printf("drives together (%zu dir%s, as the expert reader: %.1f MB records in %u KiB reads, %d in flight per dir): %.2f GB/s "
                  "(the dirs' random 1M summed: %.2f GB/s)\n",
                  dirs.size(), dirs.size() == 1 ? "" : "s", double(shape.record_bytes) / 1e6, shape.block >> 10, shape.depth_per_dir,
                  *together / kGB, drive_total / kGB);
      drive_total = *together;
    } else {
      std::printf("drives together: %s (the plan uses the dirs' random 1M rates summed)\n", together.status().to_string().c_str());
    }
    if (!a.stores.empty()) {
      // The same pattern on the records the tier will read (no scratch file): their devices,
      // their place on them and whatever caches them. The plan takes this rate when given.
      auto files = storage::record_files_in(a.stores, shape.record_bytes);
      auto rate = files.ok() ? storage::probe_record_files(*files, a.seconds, shape) : Result<double>(files.status());
      if (rate.ok()) {
        std::printf("drives reading the store (%zu replica%s, %llu records of %.1f MB from %s): %.2f GB/s (the plan's drive rate)\n",
                    files->paths.size(), files->paths.size() == 1 ? "" : "s", (unsigned long long)files->n_records,
                    double(files->record_bytes) / 1e6, files->paths.front().c_str(), *rate / kGB);
        drive_total = *rate;
      } else {
        std::fprintf(stderr, "probe: --store: %s\n", rate.status().to_string().c_str());
        return 2;
      }
    }
  }

  const Gpu g = probe_gpu();
  if (g.present)
    std::printf("gpu: %s, %d SMs, %.1f GiB HBM (%.1f GiB free), pinned H2D %.1f GB/s\n", g.name.c_str(), g.sms,
                double(g.total_bytes) / memory::kGiB, double(g.free_bytes) / memory::kGiB, g.h2d_bytes_per_s / kGB);
  else
    std::printf("gpu: none found%s; the plan assumes an H200 (139 GiB usable, 4.3 TB/s HBM, 53 GB/s pinned H2D)\n",
#ifdef FB_HAVE_CUDA
                ""
#else
                " (built without CUDA)"
#endif
    );

  memory::PlanInputs in;
  const uint64_t reserve = 2 * memory::kGiB;  // CUDA context, allocator slack
  in.hbm_target_bytes = a.hbm_target_gib >= 0 ? uint64_t(a.hbm_target_gib * memory::kGiB)
                        : g.present          ? (g.free_bytes > reserve ? g.free_bytes - reserve : 0)
                                             : 139 * memory::kGiB - reserve;
  in.host_target_bytes = a.host_target_gib >= 0 ? uint64_t(a.host_target_gib * memory::kGiB)
                                                : uint64_t(std::max(0.0, std::min(ram_total * 0.75, ram_free - 4.0 * memory::kGiB)));
  in.n_sessions = a.sessions;
  in.context_tokens = a.context;
  in.dspark = !a.no_dspark;
  in.expert_slots = a.expert_slots;
  in.host_experts = a.host_experts;
  auto plan = memory::plan_memory(*cfg, in);
  std::printf("plan for %s:\n", cfg_path.c_str());
  if (!plan.ok()) {
    std::printf("  %s\n", plan.status().to_string().c_str());
    return 1;
  }
  std::printf("%s", plan->to_string().c_str());

  memory::TierRates rates;
  rates.hbm_bytes_per_s = a.hbm_gbps > 0 ? a.hbm_gbps * kGB : 4.3e12;
  // The rate the decode kernels reach today, measured (not the copy roofline): the fast class on
  // the H200 streams a synthetic released-dimension token's 12.8944 GB (FP8 wo_a) in 9.6924 ms at
  // 4K context with every expert resident (session 16, commit bb0368f, docs/bench/h200-synthetic-s16-bb0368f.csv;
  // session 14: 10.2374 ms, session 9: 12.2955 ms).
  const double measured_hbm = a.kernel_gbps > 0 ? a.kernel_gbps * kGB : 12.8944e9 / 9.6924e-3;
  rates.h2d_bytes_per_s = a.h2d_gbps > 0 ? a.h2d_gbps * kGB : g.h2d_bytes_per_s > 0 ? g.h2d_bytes_per_s : 53e9;
  rates.drive_bytes_per_s = a.drive_gbps > 0 ? a.drive_gbps * kGB : drive_total;
  double host_expert_ms = 0;  // measured below: the decode bound's host-compute line
  if (!a.no_host_experts) {
    // Routed experts computed on the host where their bytes are (issue 22): one token through one
    // expert of this config on every thread (cpu::expert_one_token, the CPU reference's bits),
    // beside the copy that would bring it to the GPU instead. Serving a layer's misses both ways
    // at once, the share each way in proportion to its rate, gives the combined rate (the CUDA
    // executor's split under --cuda-opt host_compute=1, DevExpertSlots::take_host).
    // The pool's idle threads spin before they sleep (set_pool_spin_us): measured both ways.
    const int spin = pool_spin_us();
    set_pool_spin_us(0);
    const cpu::HostExpertRate h0 = cpu::measure_host_experts(cfg->dim, cfg->moe_inter_dim, 8, std::min(a.seconds, 2.0) / 2);
    set_pool_spin_us(spin);
    const cpu::HostExpertRate hx = spin > 0 ? cpu::measure_host_experts(cfg->dim, cfg->moe_inter_dim, 8, std::min(a.seconds, 2.0) / 2) : h0;
    const double copy_ms = hx.weight_bytes / rates.h2d_bytes_per_s * 1e3;
    const double both = 1e3 / copy_ms + 1e3 / hx.ms_per_expert;  // experts per second
    std::printf("host experts: one token through one %.1f MB expert in %.2f ms on %d threads (%s, %.1f GB/s of weights; one thread %.2f ms); "
                "pinned H2D moves one in %.2f ms: misses served at %.0f experts/s by copies alone, %.0f with host compute beside them (%.2fx)\n",
                hx.weight_bytes / 1e6, hx.ms_per_expert, hx.threads, hx.simd ? "AVX-512" : "scalar", hx.bytes_per_s() / kGB, hx.ms_one_thread,
                copy_ms, 1e3 / copy_ms, both, both * copy_ms / 1e3);
    std::printf("host experts: the pool's round trip %.1f us with idle threads spinning %d us, %.1f us sleeping at once (then %.2f ms an expert)\n",
                hx.pool_us, spin, h0.pool_us, h0.ms_per_expert);
    host_expert_ms = hx.ms_per_expert;
  }
  if (a.host_expert_ms >= 0) host_expert_ms = a.host_expert_ms;  // given (0: the decode bound without host compute)
  {
    // Cold prefill (issue 26): the chunk the step workspace allows, and the copy-bound rate when
    // every chunk routes to every expert (the non-resident ones cross PCIe once per chunk).
    // Compute side: a layer step's time from its rows and position, measured on the H200 with
    // uniform routing (memory::kColdPrefillH200: a fixed part per layer step, a part per row, the
    // attention's growth with the position; the copies at the prefetch's share of the H2D rate).
    memory::ColdPrefillCompute compute = memory::kColdPrefillH200;
    if (a.prefill_layer_ms >= 0) compute.fixed_ms = a.prefill_layer_ms;
    if (a.prefill_row_us > 0) compute.row_us = a.prefill_row_us;
    const int64_t ctx = in.context_tokens;
    const uint64_t budget = a.prefill_budget_gib > 0 ? uint64_t(a.prefill_budget_gib * memory::kGiB) : in.hbm_workspace_bytes;
    const int64_t rows = memory::prefill_chunk_rows(*cfg, budget, ctx);
    if (rows > 0)
      std::printf("prefill chunk (memory::prefill_chunk_rows): %lld rows fit the %.1f GiB step budget at %lld tokens of context; a step needs",
                  (long long)rows, double(budget) / memory::kGiB, (long long)ctx);
    else
      std::printf("prefill chunk (memory::prefill_chunk_rows): by count not even 2,048 rows fit the %.1f GiB step budget at %lld tokens of "
                  "context; a step needs",
                  double(budget) / memory::kGiB, (long long)ctx);
    for (int64_t r : {int64_t(2048), int64_t(8192), int64_t(32768)})
      std::printf(" %.1f GiB at %lld rows%s", double(memory::prefill_step_bytes(*cfg, r, std::max(ctx, r)).total()) / memory::kGiB, (long long)r,
                  r == 32768 ? "\n" : ",");
    const int slots = plan->hbm_slots_per_layer;
    if (slots > 0 && slots < plan->n_experts_per_layer) {
      // The backbone's layers only: a prompt chunk runs no DSpark stage's experts.
      double miss_bytes = 0;
      for (int l = 0; l < cfg->n_layers; ++l)
        miss_bytes += double(std::max(0, cfg->roles[size_t(l)].n_experts - slots)) * double(plan->expert_bytes);
      const double copy_rate = rates.h2d_bytes_per_s * compute.copy_efficiency;
      const double copy_s = miss_bytes / copy_rate;
      std::printf("cold prefill with %d HBM slots per layer: %.1f GB of experts cross PCIe per chunk (%.2f s at %.1f GB/s, %.0f%% of the H2D "
                  "rate); streaming a layer ahead needs %.1f GiB of staging (2 x %d experts; not in the plan above)\n",
                  slots, miss_bytes / 1e9, copy_s, copy_rate / 1e9, 100.0 * compute.copy_efficiency,
                  2.0 * double(plan->n_experts_per_layer - slots) * double(plan->expert_bytes) / memory::kGiB, plan->n_experts_per_layer - slots);
      std::printf("  a layer step computes in %.1f ms + %.2f us a row + %.4f ns a row and token of position%s; streamed = per layer step "
                  "the longer of compute and copies (+ %.1f ms exposed when copy-bound)\n",
                  compute.fixed_ms, compute.row_us, compute.ctx_ns,
                  a.prefill_layer_ms >= 0 || a.prefill_row_us > 0 ? " (--prefill-layer-ms / --prefill-row-us)" : " (H200, uniform routing)",
                  compute.exposed_copy_ms);
      for (int64_t r : {int64_t(2048), int64_t(8192), int64_t(32768)}) {
        // one chunk of r rows at the start of a prompt
        const memory::ColdPrefillEstimate one =
            memory::cold_prefill_estimate(r, r, cfg->n_layers, -1, cfg->window_size, plan->n_experts_per_layer, slots, cfg->n_activated_experts,
                                          double(plan->expert_bytes), rates.h2d_bytes_per_s, compute);
        const double compute_s = cfg->n_layers * compute.layer_ms(double(r), 0.5 * double(r)) * 1e-3;
        std::printf("  %6lld-row chunks: serial %.0f tok/s, streamed %.0f tok/s (compute %.2f s, copies %.2f s per chunk)\n", (long long)r,
                    double(r) / one.serial_s, double(r) / one.streamed_s, compute_s, one.copy_s);
      }
      if (rows > 0) {
        // The prediction `bench --cold-prefill` checks: a prompt of --context tokens in the
        // fewest chunks the size above allows, of equal size (memory::prefill_balanced_chunk, as
        // the bench), each chunk copying every non-resident expert; and with bounded replay.
        const int64_t chunk = memory::prefill_balanced_chunk(rows, ctx);
        const memory::ColdPrefillEstimate e =
            memory::cold_prefill_estimate(ctx, chunk, cfg->n_layers, cfg->decoder_start, cfg->window_size, plan->n_experts_per_layer, slots,
                                          cfg->n_activated_experts, double(plan->expert_bytes), rates.h2d_bytes_per_s, compute, true);
        const memory::ColdPrefillEstimate routed =
            memory::cold_prefill_estimate(ctx, chunk, cfg->n_layers, cfg->decoder_start, cfg->window_size, plan->n_experts_per_layer, slots,
                                          cfg->n_activated_experts, double(plan->expert_bytes), rates.h2d_bytes_per_s, compute, false);
        std::printf("  a %lld-token prompt cold in %lld chunk(s) of %lld rows: serial %.0f tok/s (%.1f s), streamed %.0f tok/s (%.1f s)\n",
                    (long long)ctx, (long long)e.chunks, (long long)chunk, double(ctx) / e.serial_s, e.serial_s, double(ctx) / e.streamed_s,
                    e.streamed_s);
        if (e.replay_s > 0)
          std::printf("  the same with bounded replay (decoder layers %d-%d over the last %lld rows): streamed %.0f tok/s (%.1f s; the "
                      "executor stages every non-resident expert of a decoder layer too); %.0f tok/s if only the window's experts crossed\n",
                      cfg->decoder_start, cfg->n_layers - 1, (long long)std::min<int64_t>(cfg->window_size, ctx), double(ctx) / e.replay_s,
                      e.replay_s, double(ctx) / routed.replay_s);
      }
    }
  }

  const int layers = cfg->n_layers, n = cfg->n_routed_experts, k = cfg->n_activated_experts;
  uint64_t dense = 0;  // per token: every backbone weight except routed experts, Engram tables and embedding
  for (const memory::PlanItem& i : plan->items)
    if (i.name.rfind("dense weights", 0) == 0) dense = i.bytes;
  const double host_per_layer = double(plan->host_cache_experts) / std::max(1, plan->n_expert_layers);
  // A token's loads under a plan with static placement by popularity, at a routing skew whose 10
  // hottest experts carry `share`: HBM slots hold the most popular, the host cache the next.
  const auto static_load = [&](const memory::MemoryPlan& p, double share) {
    const double s = memory::zipf_exponent_for_top_share(n, 10, share);
    const double host = double(p.host_cache_experts) / std::max(1, p.n_expert_layers);
    memory::DecodeLoad l;
    l.dense_bytes = double(dense);
    l.expert_bytes = double(p.expert_bytes);
    l.experts_per_token = double(layers) * k;
    l.hbm_hit = memory::zipf_top_share(n, p.hbm_slots_per_layer, s);
    l.host_hit = memory::zipf_top_share(n, std::min(n, p.hbm_slots_per_layer + int(host)), s) - l.hbm_hit;
    return l;
  };
  memory::TierRates today = rates;  // the rates with today's decode kernels' effective HBM rate
  today.hbm_bytes_per_s = measured_hbm;
  std::printf("decode bound (HBM %.0f GB/s, H2D %.1f GB/s, drives %.2f GB/s; static placement by popularity):\n",
              rates.hbm_bytes_per_s / kGB, rates.h2d_bytes_per_s / kGB, rates.drive_bytes_per_s / kGB);
  for (double share : {0.3, 0.45, 0.6}) {
    const memory::DecodeLoad l = static_load(*plan, share);
    const memory::DecodeBound b = memory::decode_bound(l, rates);
    std::printf("  top-10 share %.0f%%: hits HBM %.1f%% host %.1f%% drive %.1f%% -> %.1f ms/token serial (%.1f tok/s floor), %.1f ms "
                "overlapped (%.1f tok/s)\n",
                share * 100, l.hbm_hit * 100, l.host_hit * 100, (1 - l.hbm_hit - l.host_hit) * 100, b.serial_s * 1e3,
                b.floor_tok_per_s(), b.overlapped_s * 1e3, b.ceiling_tok_per_s());
    const memory::DecodeBound bt = memory::decode_bound(l, today);
    std::printf("    with today's kernels (%.0f GB/s effective): %.1f ms/token serial (%.1f tok/s), %.1f ms overlapped (%.1f tok/s)\n",
                measured_hbm / kGB, bt.serial_s * 1e3, bt.floor_tok_per_s(), bt.overlapped_s * 1e3, bt.ceiling_tok_per_s());
    if (a.predict_accuracy > 0)
      std::printf("    ... with next-layer prediction holding %.0f%% of the misses (--cuda-opt expert_predict=1, off by default; the "
                  "accuracy is an input, not measured on this model): %.1f ms/token (%.1f tok/s)\n",
                  a.predict_accuracy * 100, bt.predicted_s(a.predict_accuracy) * 1e3, 1.0 / bt.predicted_s(a.predict_accuracy));
    if (host_expert_ms > 0) {
      memory::TierRates th = today;
      th.host_expert_s = host_expert_ms * 1e-3;
      const memory::DecodeBound bh = memory::decode_bound(l, th);
      std::printf("    ... and cold experts computed on the host beside the copies (%.0f%% of the misses; --host-compute 1, off by "
                  "default): %.1f ms/token serial (%.1f tok/s), %.1f ms overlapped (%.1f tok/s)\n",
                  bh.host_share * 100, bh.serial_s * 1e3, bh.floor_tok_per_s(), bh.overlapped_s * 1e3, bh.ceiling_tok_per_s());
    }
    if (plan->hbm_slots_per_layer > 0 && plan->hbm_slots_per_layer < n && !a.no_sim) {
      // What the executor's policies reach: the HBM slots (CUDA default: LFU, aging 64) and the
      // host cache under them (TieredExperts with host views: one LFU cache of every layer's
      // records, aging 8, looked up once per slot miss), the lookups replayed on the host
      // (storage::SlotSim, the executor's own take_wave calls) to the steady state: 3,000 tokens
      // from a cold start, then 300 counted. The drive-tier bench starts its timed steps from the
      // same steady state (bench::DriveTierOptions::replay_tokens).
      storage::ZipfRouting r(layers, n, 7);
      r.set_skew(share);
      storage::SlotSimOptions so;
      so.slots = plan->hbm_slots_per_layer;
      so.aging = 64;
      so.top_k = k;
      so.host_records = plan->host_cache_experts;
      storage::SlotSim sim(layers, so);
      sim.decode(r, 3000);
      sim.reset_counts();
      sim.decode(r, 300);
      memory::DecodeLoad lf = l;
      lf.hbm_hit = sim.result().hit_rate;
      lf.host_hit = sim.result().host_hit_rate;
      // the host hits of the analytic estimate (before session 24): static placement's host share
      // plus the hits LFU slots lose against it, scaled by the host cache against the slots
      const double analytic_host = memory::lfu_host_hit(l.hbm_hit, l.host_hit, lf.hbm_hit, plan->hbm_slots_per_layer, host_per_layer);
      // with today's kernels, as the executor runs
      const memory::DecodeBound bf = memory::decode_bound(lf, today);
      std::printf("    LFU slots (aging 64) and LFU host cache (aging 8), simulated steady state, with today's kernels: HBM %.1f%% host %.1f%% -> "
                  "%.1f ms/token serial (%.1f tok/s), %.1f ms overlapped (%.1f tok/s) [host hits by the analytic estimate: %.1f%%]\n",
                  lf.hbm_hit * 100, lf.host_hit * 100, bf.serial_s * 1e3, bf.floor_tok_per_s(), bf.overlapped_s * 1e3, bf.ceiling_tok_per_s(),
                  analytic_host * 100);
    }
  }
  if (!cfg->engram_layer_ids.empty()) {
    // Engram tables on the drives (--engram-cache-bytes): a token's rows that miss the host row
    // cache are two 4 KiB reads each (codes and scales are separate tensors), issued together when
    // the token is known; the first Engram layer waits for them unless they are hidden.
    const int64_t rows = int64_t(cfg->engram_layer_ids.size()) * (cfg->engram_max_ngram - 1) * cfg->engram_n_heads;
    uint64_t table_bytes = 0;
    for (int64_t n : cfg->engram_num_embeddings) table_bytes += uint64_t(n) * uint64_t(cfg->engram_head_dim + cfg->engram_head_dim / 32);
    const double reads = 2.0 * double(rows) * (1.0 - std::clamp(a.engram_hit, 0.0, 1.0));
    std::printf("engram: %.1f GiB of tables, %lld rows a token; from the drives through a row cache hitting %.0f%% (--engram-hit): %.1f reads of "
                "4 KiB a token",
                double(table_bytes) / memory::kGiB, (long long)rows, a.engram_hit * 100, reads);
    if (drive_iops > 0)
      std::printf(", %.0f us at the drives' random 4K rate (%.0f IOPS, queue depth 32; a serial bound: the reads of a token go out together)",
                  reads / drive_iops * 1e6, drive_iops);
    std::printf("\n");
  }
  if (a.gpus > 1) {
    // Issue 25, a projection (no multi-GPU code yet): the same box with G GPUs, routed experts
    // spread over them evenly by popularity, the dense path, KV and the draft on GPU 0, each other
    // GPU keeping its own workspace; so the experts get G x the HBM target less (G - 1) workspaces.
    memory::PlanInputs ing = in;
    const uint64_t extra = uint64_t(a.gpus - 1) * (in.hbm_target_bytes > in.hbm_workspace_bytes ? in.hbm_target_bytes - in.hbm_workspace_bytes : 0);
    ing.hbm_target_bytes = in.hbm_target_bytes + extra;
    ing.expert_slots = -1;
    auto pg = memory::plan_memory(*cfg, ing);
    if (!pg.ok()) {
      std::printf("%d GPUs: %s\n", a.gpus, pg.status().to_string().c_str());
      return 0;
    }
    const memory::LinkRates link{a.link_gbps * kGB, a.link_latency_us * 1e-6};
    const double hidden_bytes = double(cfg->dim) * 2.0;  // a token's bf16 hidden state
    std::printf("%d GPUs (projection; no multi-GPU code yet): %d expert slots per layer (1 GPU: %d), %lld host experts; link %.0f GB/s, "
                "%.1f us per exchange (2 x H200 default: NCCL measured with host synchronisation per exchange, an upper bound), two exchanges per MoE layer\n",
                a.gpus, pg->hbm_slots_per_layer, plan->hbm_slots_per_layer, (long long)pg->host_cache_experts, a.link_gbps, a.link_latency_us);
    for (double share : {0.3, 0.45, 0.6}) {
      const memory::DecodeLoad l = static_load(*pg, share);
      const memory::MultiGpuBound m = memory::decode_bound_gpus(l, today, a.gpus, layers, k, hidden_bytes, link);
      std::printf("  top-10 share %.0f%%: hits HBM %.1f%% host %.1f%% drive %.1f%%; with today's kernels %.1f ms/token serial (%.1f tok/s), "
                  "%.1f ms overlapped (%.1f tok/s); busiest GPU %.0f%% of a layer's experts, exchanges %.2f ms\n",
                  share * 100, l.hbm_hit * 100, l.host_hit * 100, (1 - l.hbm_hit - l.host_hit) * 100, m.bound.serial_s * 1e3,
                  m.bound.floor_tok_per_s(), m.bound.overlapped_s * 1e3, m.bound.ceiling_tok_per_s(), m.busiest_share * 100, m.comm_s * 1e3);
    }
  }
  return 0;
}

}  // namespace

Runner add_probe(CLI::App& app) {
  auto a = std::make_shared<ProbeArgs>();
  CLI::App* g = nullptr;  // the option group of the options that follow (sections of --help)
  app.add_option("--model", a->model, "snapshot folder or config.json (default: the released config)");
  app.add_flag("--no-sim", a->no_sim, "skip the simulated LFU hit rates (a few seconds)");
  app.add_flag("--no-host-experts", a->no_host_experts, "skip timing routed experts computed on the host CPU (a few seconds, 150 MB)");
  g = app.add_option_group("drives", "what is measured of the drives, and for how long");
  g->add_option("--dir", a->dirs, "directories on the drives to measure (default: the temp dir)");
  g->add_option("--store", a->stores,
                "replica dirs of the expert store (experts.fbx from flashbox convert, or the drive bench's records.bin): also read "
                "its records as the expert reader does and plan with that rate (repeatable; nothing is written)");
  g->add_option("--seconds", a->seconds, "seconds per drive measurement");
  g->add_option("--file-mib", a->file_mib, "size of the scratch file per drive");
  g = app.add_option_group("budgets", "memory targets and expert placement (default: planned from the measured machine)");
  g->add_option("--hbm-target-gib", a->hbm_target_gib, "override the HBM byte target");
  g->add_option("--host-target-gib", a->host_target_gib, "override the pinned host RAM target");
  g->add_option("--expert-slots", a->expert_slots, "HBM expert slots per layer (default: from the remainder)");
  g->add_option("--host-experts", a->host_experts, "host cache size in experts (default: from the remainder)");
  g = app.add_option_group("rates", "measured rates replaced by given ones");
  g->add_option("--hbm-gbps", a->hbm_gbps, "override the HBM read rate");
  g->add_option("--h2d-gbps", a->h2d_gbps, "override the pinned H2D rate");
  g->add_option("--kernel-gbps", a->kernel_gbps,
                "override the decode kernels' effective HBM rate (default: as measured on the H200, docs/results.md)");
  g->add_option("--drive-gbps", a->drive_gbps, "override the drives' combined read rate");
  g->add_option("--predict-accuracy", a->predict_accuracy,
                "the decode bound with next-layer expert prediction holding this share of the misses (0: no such line)")
      ->check(CLI::Range(0.0, 1.0));
  g->add_option("--engram-hit", a->engram_hit, "the Engram row cache's hit rate for the engram line (flashbox engram-sim measures it)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  g->add_option("--host-expert-ms", a->host_expert_ms,
                "override the host CPU's time for one routed expert and one token (the decode bound's host-compute lines; 0: none)")
      ->check(CLI::NonNegativeNumber);
  g = app.add_option_group("workload", "what the plan serves");
  g->add_option("--sessions", a->sessions, "sessions whose KV is mandatory");
  g->add_option("--context", a->context, "context tokens per session (and the cold-prefill prompt length)");
  g = app.add_option_group("cold prefill", "the cold-prefill estimate");
  g->add_option("--prefill-budget-gib", a->prefill_budget_gib,
                "HBM for one prefill step when sizing the cold-prefill chunk (default: the plan's workspace; bench --cold-prefill prints its own)");
  g->add_option("--prefill-layer-ms", a->prefill_layer_ms,
                "cold prefill: the fixed compute of a layer step whatever its rows, ms (default: measured on the H200, 34.1)")
      ->check(CLI::NonNegativeNumber);
  g->add_option("--prefill-row-us", a->prefill_row_us, "cold prefill: the compute per row of a layer step, us (default: measured on the H200, 5.49)")
      ->check(CLI::PositiveNumber);
  g = app.add_option_group("several GPUs", "a projection with the routed experts spread over N GPUs (issue 25)");
  g->add_option("--gpus", a->gpus, "also project decode with the routed experts spread over N GPUs of one box (issue 25; 1..8)")
      ->check(CLI::Range(1, 8));
  g->add_option("--link-gbps", a->link_gbps,
                "with --gpus: the GPUs' link rate for the MoE exchanges (default 278: 2 x H200 NVLink, NCCL, 64 MiB one way)")
      ->check(CLI::PositiveNumber);
  g->add_option("--link-latency-us", a->link_latency_us,
                "with --gpus: the fixed cost of one exchange (default 60.8 us: a one-token NCCL all_to_all on 2 x H200 timed with host "
                "synchronisation, an upper bound)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--no-dspark", a->no_dspark, "plan without the DSpark draft");
  return [a] { return run_probe(*a); };
}

}  // namespace fb::cmd
