#include "engine/executor_factory.h"

#include <sys/sysinfo.h>

#include <algorithm>

#include "base/log.h"
#include "memory/plan.h"

#include "cpu/executor.h"
#include "cpu/host_expert.h"
#include "loader/read_in.h"
#include "loader/snapshot.h"
#include "storage/engram_rows.h"
#include "storage/tiered_experts.h"
#ifdef FB_HAVE_CUDA_EXECUTOR
#include "cuda/executor.h"
#include "cuda/host_memory.h"
#endif

namespace fb::engine {

Result<std::shared_ptr<storage::TieredExperts>> make_host_tiers(const std::string& backend, const std::string& model_dir,
                                                                const ExecutorOptions& opt) {
  auto snap = FB_TRY(loader::Snapshot::open(model_dir));
  storage::TieredOptions to;
  to.host_experts = opt.host_experts > 0 ? opt.host_experts : opt.expert_slots;
  to.prefetch = opt.expert_prefetch;
  to.faults = opt.reader_faults;
  if (backend == "cuda") {
    to.slots_per_layer = 1;  // unused: the executor copies from the host records themselves
    to.host_views = true;
    // With --expert-predict the executor copies the next layer's guesses while this layer's copies
    // may still read its views: they stay valid through one more layer's calls.
    if (opt.expert_predict) to.epochs_kept = 2;
    // Unless a number is asked for (--host-experts): at least 64 records, so a layer's picks stay
    // in the (page-locked) cache while they are copied. Fewer work too: picks beyond them come
    // from buffers kept for the layer's whole epoch (pageable, so slower to copy).
    if (opt.host_experts <= 0) to.host_experts = std::max<int64_t>(to.host_experts, 64);
#ifdef FB_HAVE_CUDA_EXECUTOR
    // Page-locked records copy at ~55 GB/s instead of the pageable rate; a failed registration
    // only costs speed.
    to.on_host_alloc = [](void* p, size_t n) { cuda::pin_host_range(p, n); };
    to.on_host_free = [](void* p, size_t) { cuda::unpin_host_range(p); };
#endif
  } else {
    to.slots_per_layer = opt.expert_slots;
  }
  return storage::tiered_experts_for(*snap, opt.expert_store, to);
}

int64_t engram_row_cache_bytes(uint64_t available_bytes) { return int64_t(std::min<uint64_t>(uint64_t(1) << 30, available_bytes / 20)); }

int64_t auto_engram_cache_bytes(uint64_t table_bytes, uint64_t available_bytes) {
  if (table_bytes == 0 || table_bytes <= available_bytes / 2) return -1;
  return engram_row_cache_bytes(available_bytes);
}

namespace {

// ExecutorOptions::kAutoSlots on CUDA: the plan for this GPU's free HBM and a host budget of
// min(75% of RAM, free RAM - 4 GiB), as `flashbox probe` plans.
Result<ExecutorOptions> resolve_auto(const std::string& backend, const std::string& model_dir, ExecutorOptions opt) {
  if (opt.expert_slots != ExecutorOptions::kAutoSlots) return opt;
  opt.expert_slots = 0;
  if (backend != "cuda") return opt;
#ifdef FB_HAVE_CUDA_EXECUTOR
  size_t free_b = 0, total_b = 0;
  if (!cuda::device_memory(&free_b, &total_b)) return opt;  // no device: the loader reports it
  struct sysinfo si {};
  sysinfo(&si);
  const double ram_total = double(si.totalram) * si.mem_unit, ram_free = double(si.freeram + si.bufferram) * si.mem_unit;
  const uint64_t host = uint64_t(std::max(0.0, std::min(ram_total * 0.75, ram_free - 4.0 * double(memory::kGiB))));
  auto snap = FB_TRY(loader::Snapshot::open(model_dir));
  auto p = memory::auto_expert_placement(snap->config(), free_b, host, opt.context_tokens);
  if (!p.ok()) return p.status().with_context("planning the GPU's memory (flashbox probe --model DIR shows the plan)");
  opt.expert_slots = p->expert_slots;
  if (opt.host_experts == 0) opt.host_experts = p->host_experts;
  if (opt.expert_slots > 0)
    FB_LOG(kInfo) << "experts: " << opt.expert_slots << " of " << p->plan.n_experts_per_layer << " per layer in HBM slots, "
                  << opt.host_experts << " in the host cache, the rest read from the drives (plan for "
                  << free_b / memory::kGiB << " GiB of free HBM; --expert-slots overrides)";
#endif
  return opt;
}

// Reads the weights the executor keeps resident in from the drive before it is built, with their
// progress on a terminal (issue 24): bytes and tensors. Routed experts read through the tiers stay
// on the drive. Skipped when they exceed 80% of the available memory (they would not stay cached,
// and the executor pages them in as before).
void read_in_weights(const std::string& model_dir, bool experts_tiered, bool engram_on_drives) {
  auto snap = loader::Snapshot::open(model_dir);
  if (!snap.ok()) return;  // the executor's loader reports it
  Progress progress("load weights", 0, ProgressUnit::kBytes);
  std::function<bool(const std::string&)> skip = [=](const std::string& name) {
    return (experts_tiered && loader::is_routed_expert_tensor(name)) || (engram_on_drives && name.find(".engram.embed.") != std::string::npos);
  };
  const uint64_t avail = loader::available_memory_bytes();
  const uint64_t limit = avail > 0 ? avail / 5 * 4 : ~uint64_t(0);
  auto r = loader::read_in(**snap, skip, limit, &progress);
  if (!r.read && r.bytes > 0) {
    FB_LOG(kInfo) << "load: " << r.bytes / 1000000 << " MB of weights exceed 80% of the available memory: not read in ahead";
  }
}

}  // namespace

Result<std::unique_ptr<model::Executor>> make_executor(const std::string& backend, const std::string& model_dir, const ExecutorOptions& opt_in,
                                                       std::shared_ptr<storage::TieredExperts>* tiers_out) {
  std::shared_ptr<storage::TieredExperts> unused;
  std::shared_ptr<storage::TieredExperts>& tiers = tiers_out ? *tiers_out : unused;
  tiers.reset();
  if (opt_in.expert_slots < ExecutorOptions::kAutoSlots || opt_in.expert_staging < 0 || opt_in.host_experts < 0)
    return FB_ERROR(kInvalidArgument) << "expert slots (or -1: auto), staging slots and host experts must be >= 0";
  ExecutorOptions opt = FB_TRY(resolve_auto(backend, model_dir, opt_in));
  // (--expert-predict with every expert resident does nothing: nothing is missing.)
  if (opt.expert_slots == 0 && (opt.host_experts > 0 || !opt.expert_store.empty() || opt.expert_staging > 0 || opt.host_compute > 0))
    return FB_ERROR(kInvalidArgument)
           << "--host-experts, --expert-store, --expert-staging and --host-compute need --expert-slots N (experts are all resident otherwise)";
  if (opt.host_compute < 0 || opt.host_compute > 2) return FB_ERROR(kInvalidArgument) << "--host-compute takes 0, 1 or 2";
#ifdef FB_HAVE_CUDA_EXECUTOR
  const bool have_cuda = true;
#else
  const bool have_cuda = false;
#endif
  if (!opt.engram_store.empty() && !opt.engram_replicas.empty())
    return FB_ERROR(kInvalidArgument) << "--engram-store and --engram-replica: the rows come from one or the other";
  if (!opt.engram_store.empty() && opt.engram_cache_bytes < 0)  // the stores imply the drive path
    opt.engram_cache_bytes = engram_row_cache_bytes(loader::available_memory_bytes());
  if (opt.engram_cache_bytes == ExecutorOptions::kAutoEngramCache) {
    auto snap = FB_TRY(loader::Snapshot::open(model_dir));
    const model::Config& c = snap->config();
    uint64_t table_bytes = 0;
    for (int64_t n : c.engram_num_embeddings) table_bytes += uint64_t(n) * uint64_t(c.engram_head_dim + c.engram_head_dim / 32);
    const uint64_t avail = loader::available_memory_bytes();
    opt.engram_cache_bytes = avail > 0 ? auto_engram_cache_bytes(table_bytes, avail) : -1;
    if (opt.engram_cache_bytes >= 0) {
      FB_LOG(kInfo) << "engram: " << table_bytes / memory::kGiB << " GiB of tables against " << avail / memory::kGiB
                    << " GiB of available memory: rows read from the drives through a " << opt.engram_cache_bytes / (1 << 20)
                    << " MiB row cache (--engram-cache-bytes overrides; -1 reads them through the mapping)";
    }
  }
  if (opt.engram_cache_bytes < -1) return FB_ERROR(kInvalidArgument) << "--engram-cache-bytes takes -1 (off), 0 or a size";
  if (opt.engram_cache_bytes < 0 && !opt.engram_replicas.empty())
    return FB_ERROR(kInvalidArgument) << "--engram-replica needs --engram-cache-bytes N (the Engram tables are read through the mapping otherwise)";
  if (backend == "cpu" || (backend == "cuda" && have_cuda)) read_in_weights(model_dir, opt.expert_slots > 0, opt.engram_cache_bytes >= 0);
  std::shared_ptr<storage::EngramRowCache> engram;
  if (opt.engram_cache_bytes >= 0) {
    auto snap = FB_TRY(loader::Snapshot::open(model_dir));
    storage::EngramCacheOptions eo;
    eo.capacity_bytes = uint64_t(opt.engram_cache_bytes);
    auto c = opt.engram_store.empty() ? storage::engram_cache_for(*snap, opt.engram_replicas, eo)
                                      : storage::engram_store_for(*snap, opt.engram_store, eo);
    if (!c.ok()) return c.status().with_context(opt.engram_store.empty() ? "--engram-cache-bytes" : "--engram-store");
    engram = std::move(c.value());
  }
  if (backend == "cpu") {
    auto m = cpu::CpuModel::load(model_dir);
    if (!m.ok()) return m.status();
    if (engram) m.value()->set_engram_source(engram);
    if (opt.expert_slots > 0) {
      tiers = FB_TRY(make_host_tiers(backend, model_dir, opt));
      m.value()->set_expert_source(tiers);
      m.value()->set_expert_predict(opt.expert_predict);
    }
    return std::unique_ptr<model::Executor>(std::move(m).value());
  }
  if (backend == "cuda") {
#ifdef FB_HAVE_CUDA_EXECUTOR
    // The CUDA executor's loader (src/cuda/executor.h); same contract as CpuModel::load. With
    // expert slots the misses come from the host tiers (their first tier only stages a layer's picks).
    cuda::CudaLoadOptions lo;
    lo.expert_slots = opt.expert_slots;
    lo.expert_staging = opt.expert_staging;
    lo.run.numerics = FB_TRY(cuda::parse_numerics(opt.numerics));
    if (opt.expert_slots > 0) {
      tiers = FB_TRY(make_host_tiers(backend, model_dir, opt));
      lo.experts = tiers;
      lo.host_compute = cpu::host_expert_compute();
      lo.run.host_compute = opt.host_compute;
      lo.run.expert_predict = opt.expert_predict;
    }
    lo.engram_rows = engram;
    auto m = cuda::CudaModel::load(model_dir, {}, lo);
    if (!m.ok()) {
      if (m.status().code() == StatusCode::kOutOfMemory)
        return m.status().with_context(opt.expert_slots > 0 ? "the model does not fit in HBM with --expert-slots " + std::to_string(opt.expert_slots) +
                                                                  ": lower it (flashbox probe --model DIR prints the plan)"
                                                            : "the model does not fit in HBM with every expert resident: pass --expert-slots N "
                                                              "(flashbox probe --model DIR prints the plan)");
      return m.status();
    }
    if (opt.op_times) m.value()->set_profile(true);
    return std::unique_ptr<model::Executor>(std::move(m).value());
#else
    return FB_ERROR(kUnsupported) << "this build has no CUDA executor (configure with the cuda preset on a machine with the "
                                     "CUDA toolkit), use --backend cpu";
#endif
  }
  return FB_ERROR(kInvalidArgument) << "unknown backend '" << backend << "' (cpu or cuda)";
}

}  // namespace fb::engine
