// The drive tier under the CUDA executor at the released dimensions (issue 22; `flashbox bench
// --synthetic --experts 384 --expert-slots S --expert-drives DIR,DIR [--host-experts H]
// [--drive-records R] --skews ...`): the synthetic model's HBM slots miss into a small host cache
// (TieredExperts, page-locked records) over R expert records written to a file on each drive dir
// (replicas; read with O_DIRECT, so every host miss is a real disk read). Routing is replaced by
// the tier sweep's Zipf draws. Per skew: the HBM slots settle from the pinned pool first (fast;
// the drives would take minutes to fill 43 x S slots), then decode runs through the drives, with
// reads started when the router has run and without (A/B): ms/token, HBM hit rate, host hits and
// drive reads per token, exposed drive wait per token, per-drive rates.
// Warm-up to the steady state the plan models (probe's storage::SlotSim): first `replay_tokens`
// decode tokens of the same routing are replayed in the HBM slot caches (DevExpertSlots::replay:
// the executor's own take_wave calls, no kernels) and their slot misses in the host cache's policy
// (TieredExperts::replay_lookup), the changed slots' bytes are copied in, then `pool_warm_steps`
// real decode steps run from the pool with each slot miss also looked up in the host cache; the
// records the host cache then holds are read from the drives (TieredExperts::fill_host). So a
// large host cache is warm when timed, and the timed steps read through the real tiers.
// [policy] benchmark-only: an expert's bytes are its record's (storage/record_file.h), so outputs
// are noise; only traffic and time are measured.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/check.h"
#include "base/progress.h"
#include "base/status.h"
#include "cuda/executor.h"
#include "model/weights.h"
#include "storage/engram_rows.h"
#include "storage/tiered_experts.h"

namespace fb::bench {

// The executor's expert source: the pinned pool until use_drives(true), then the drive tiers.
class SwitchExperts final : public model::ExpertSource {
 public:
  SwitchExperts(std::shared_ptr<const model::ExpertSource> pool, std::shared_ptr<storage::TieredExperts> drives)
      : pool_(std::move(pool)), drives_(std::move(drives)) {}
  void use_drives(bool on) { on_ = on; }
  // With replay_host(true), a miss served from the pool is also looked up in the host cache's
  // policy (TieredExperts::replay_lookup), as the drive tiers would have looked it up.
  void replay_host(bool on) { replay_host_ = on; }
  model::ExpertWeights expert(int layer, int e) const override {
    if (on_) return drives_->expert(layer, e);
    if (replay_host_) {
      const Status st = drives_->replay_lookup(layer, e);
      FB_CHECK(st.ok()) << st.to_string();
    }
    return pool_->expert(layer, e);
  }
  void prefetch(int layer, const std::vector<int>& experts) const override {
    if (on_) drives_->prefetch(layer, experts);
  }
  // Counts like the tiers (also tells the executor that views expire between layers).
  bool traffic(model::ExpertTraffic* out) const override { return drives_->traffic(out); }
  // The pool's views never expire; the drive tiers' do after their epochs (expert prediction's
  // copies ahead ask this before each layer's guesses).
  int view_layers() const override { return on_ ? drives_->view_layers() : 0; }
  bool ready(int layer, int e) const override { return !on_ || drives_->ready(layer, e); }
  storage::TieredExperts& drives() { return *drives_; }

 private:
  std::shared_ptr<const model::ExpertSource> pool_;
  std::shared_ptr<storage::TieredExperts> drives_;
  bool on_ = false, replay_host_ = false;
};

struct DriveTierOptions {
  std::vector<double> skews = {0.30, 0.45, 0.60};
  int replay_tokens = 0;      // decode tokens replayed in the slot and host caches first (no kernels)
  int pool_warm_steps = 256;  // decode steps from the pool before each point (the HBM slots settle)
  int drive_warm_steps = 8;   // then through the drives (the host cache fills), per A/B arm
  int steps = 8;              // timed decode steps per arm
  // >= 0: a third arm, reads at routing time plus next-layer prediction (CudaRunOptions::
  // expert_predict) with guesses holding this share of the drawn routing (storage::PredictedRouting);
  // the tiers need TieredOptions::epochs_kept 2 for its copies ahead (make_drive_tiers).
  double predict_accuracy = -1;
  uint64_t seed = 7;
  ProgressFn progress;        // decode steps of each point (optional)
};

struct DriveTierPoint {
  double top10_share = 0;
  double hbm_hit = 0;        // HBM slot hits / lookups (timed steps, prefetch arm)
  double hbm_hit_asked = 0;  // ... of the other arm's timed steps (the same slots, later tokens)
  // [0]: reads started when the router has run; [1]: each record read when asked for; [2] (with
  // DriveTierOptions::predict_accuracy): [0] plus next-layer prediction.
  double ms_token[3] = {0, 0, 0};
  double wait_ms_token[3] = {0, 0, 0};  // exposed drive wait per token
  double host_hits_token[3] = {0, 0, 0}, drive_reads_token[3] = {0, 0, 0};
  double drive_gbps[3] = {0, 0, 0};     // drive bytes / timed wall time
  double predicted_token = 0, predict_used_token = 0, predict_hinted_token = 0;  // arm [2]: copies ahead, used; guesses whose reads started
  int64_t host_filled = 0;           // host cache records holding an expert when the first arm's timed steps began
  double host_fill_s = 0;            // reading the warmed host cache's records from the drives
  int64_t replayed_slot_copies = 0;  // slots whose bytes the replay changed
};

// Writes R records of the snapshot's first tiered layer's experts (cycling) into DIR/records.bin
// for every dir, and builds the tiers over them (host_views, page-locked records through `on_alloc`
// / `on_free`).
// `faults` (storage::parse_reader_fault: a replica unlinked, truncated, failing with EIO or slow
// after N of its reads) are injected into the reader, as check-fixture --fault-replica does.
Result<std::shared_ptr<storage::TieredExperts>> make_drive_tiers(const loader::Snapshot& snap, const std::vector<std::string>& dirs,
                                                                 int records, int64_t host_experts,
                                                                 std::function<void(void*, size_t)> on_alloc,
                                                                 std::function<void(void*, size_t)> on_free,
                                                                 std::vector<storage::ReaderFault> faults = {}, int epochs_kept = 1);

// Engram rows from the drives under the CUDA executor (issue 22; `bench --synthetic
// --engram-drives DIR,DIR [--engram-cache-bytes N]`): the synthetic snapshot's Engram tables
// written as an Engram store (DIR/engram.fbe in each dir, one 4 KiB read a row; a file that holds
// them already is kept), then read back row by row through storage::EngramRowCache (O_DIRECT, a
// host row cache of `cache_bytes`, the dirs as replicas).
Result<std::shared_ptr<storage::EngramRowCache>> make_engram_drive_cache(const loader::Snapshot& snap, const std::vector<std::string>& dirs,
                                                                         uint64_t cache_bytes);

Result<std::vector<DriveTierPoint>> run_drive_tier(cuda::CudaExecutor& ex, model::SessionState& s, SwitchExperts& src,
                                                   const DriveTierOptions& opt);

}  // namespace fb::bench
