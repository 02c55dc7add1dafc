// Executor factory: the one place that maps `--backend cpu|cuda` to a model::Executor. The CUDA
// executor (src/cuda) plugs in through the FB_HAVE_CUDA_EXECUTOR compile definition; without it
// "cuda" is a clean kUnsupported, never a silent fallback to the CPU.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/executor.h"
#include "storage/tiered_experts.h"

namespace fb::engine {

// Routed experts through the tiers (issue 9, docs/tiers.md) instead of all resident.
struct ExecutorOptions {
  // Experts per layer kept resident: HBM slots on CUDA, the first host tier on the CPU. 0: all.
  // kAutoSlots: CUDA sizes the slots from the memory plan (every expert resident when they fit,
  // memory::auto_expert_placement); the CPU keeps every expert (the mapped snapshot).
  int expert_slots = 0;
  static constexpr int kAutoSlots = -1;
  int64_t context_tokens = 131072;   // the session context the plan reserves KV for
  int expert_staging = 0;            // CUDA: staging slots for LFU admission (0: admit every miss)
  // CUDA: cold experts computed on the host CPU beside the copies (cuda::CudaRunOptions::host_compute:
  // 0 off, 1 the misses split between copies and the host, 2 every miss on the host).
  int host_compute = 0;
  // Next-layer expert prediction (issue 22, [exact], off by default): CUDA copies the guesses into
  // their layer's slots ahead of its call (cuda::CudaRunOptions::expert_predict; host tiers: their
  // drive reads start instead); the CPU hands them to the tiers' prefetch (CpuModel::set_expert_predict).
  bool expert_predict = false;
  int64_t host_experts = 0;          // host cache records (0: as many as expert_slots per layer x 1)
  std::vector<std::string> expert_store;  // expert-store replicas (flashbox convert); empty: the snapshot's shards
  bool expert_prefetch = true;            // drive reads start when the router has run (storage::TieredOptions::prefetch)
  std::vector<storage::ReaderFault> reader_faults;  // fault injection on the replicas (check-fixture --fault-replica)
  // Engram tables on the drives (issue 22): >= 0, their rows are read from the snapshot's shards
  // (and `engram_replicas`, copies of them on other drives) through a host row cache of this many
  // bytes (storage::EngramRowCache; 0: no cache); -1 (default): read through the mapping.
  // kAutoEngramCache (serve / chat / run): auto_engram_cache_bytes() of the tables and the RAM.
  int64_t engram_cache_bytes = -1;
  static constexpr int64_t kAutoEngramCache = -2;
  std::vector<std::string> engram_replicas;
  // Engram stores (`flashbox convert --engram`, replicas) to read the rows from instead of the
  // shards: one read a row; the row cache as engram_cache_bytes (a negative value: min(1 GiB, 5%)).
  std::vector<std::string> engram_store;
  // CUDA numerics class (CLARIFICATIONS "Numerics classes"): "fast" (default; tensor cores, fixed
  // reordered sums, tolerance-gated) or "exact" (bit-identical to the CPU reference). The CPU
  // executor is the reference and accepts both names.
  std::string numerics = "fast";
  // CUDA: time each backbone op on the device (CUDA events around the ops, summed after each
  // step) for Executor::stats' step time by op family (the dashboard, /metrics). Off by default:
  // two events per op. The CPU executor times its ops always.
  bool op_times = false;
};

// [policy] Where the Engram tables are read from when the user does not say: through the mapping
// (-1) while they take at most half of the host's available memory (the page cache keeps them);
// beyond that (the release's 189 GiB on a 128 GB box) the mapping would thrash, a 4 KiB page per
// 264-byte row, with one page fault in flight per staging task, so the rows come from the drives
// through a row cache of min(1 GiB, 5% of the memory): `flashbox engram-sim` measured 58% hits at
// 1 GiB and 66% at 4 GiB on Python source, where the same GiB in the expert cache saves more
// (docs/tiers.md, "Engram tables on the drives").
int64_t auto_engram_cache_bytes(uint64_t table_bytes, uint64_t available_bytes);
// The row cache's size when the rows come from the drives and none is given: min(1 GiB, 5%).
int64_t engram_row_cache_bytes(uint64_t available_bytes);

// `tiers_out` (optional) receives the routed experts' host tiers when the executor reads through
// them (null when every expert is resident), so the engine can report their hit counters.
Result<std::unique_ptr<model::Executor>> make_executor(const std::string& backend, const std::string& model_dir,
                                                       const ExecutorOptions& opt = {},
                                                       std::shared_ptr<storage::TieredExperts>* tiers_out = nullptr);

// The host tiers of the routed experts for `backend` (what make_executor uses; check-fixture keeps
// the pointer for its counters): a host cache over the drives (the expert store replicas, or the
// snapshot's shards read with O_DIRECT). For "cuda" the cache hands out views of its records
// (no first-tier copy) and page-locks them, so the executor's copies run at the pinned rate.
Result<std::shared_ptr<storage::TieredExperts>> make_host_tiers(const std::string& backend, const std::string& model_dir,
                                                                const ExecutorOptions& opt);

}  // namespace fb::engine
