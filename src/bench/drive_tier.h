// The drive tier under the CUDA executor at the released dimensions (issue 22; `flashbox bench
// --synthetic --experts 384 --expert-slots S --expert-drives DIR,DIR [--host-experts H]
// [--drive-records R] --skews ...`): the synthetic model's HBM slots miss into a small host cache
// (TieredExperts, page-locked records) over R expert records written to a file on each drive dir
// (replicas; read with O_DIRECT, so every host miss is a real disk read). Routing is replaced by
// the tier sweep's Zipf draws. Per skew: the HBM slots settle from the pinned pool first (fast;
// the drives would take minutes to fill 43 x S slots), then decode runs through the drives, with
// reads started when the router has run and without (A/B): ms/token, HBM hit rate, host hits and
// drive reads per token, exposed drive wait per token, per-drive rates.
// [policy] benchmark-only: an expert's bytes are its record's (storage/record_file.h), so outputs
// are noise; only traffic and time are measured.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/progress.h"
#include "base/status.h"
#include "cuda/executor.h"
#include "model/weights.h"
#include "storage/tiered_experts.h"

namespace fb::bench {

// The executor's expert source: the pinned pool until use_drives(true), then the drive tiers.
class SwitchExperts final : public model::ExpertSource {
 public:
  SwitchExperts(std::shared_ptr<const model::ExpertSource> pool, std::shared_ptr<storage::TieredExperts> drives)
      : pool_(std::move(pool)), drives_(std::move(drives)) {}
  void use_drives(bool on) { on_ = on; }
  model::ExpertWeights expert(int layer, int e) const override { return on_ ? drives_->expert(layer, e) : pool_->expert(layer, e); }
  void prefetch(int layer, const std::vector<int>& experts) const override {
    if (on_) drives_->prefetch(layer, experts);
  }
  // Counts like the tiers (also tells the executor that views expire between layers).
  bool traffic(model::ExpertTraffic* out) const override { return drives_->traffic(out); }
  storage::TieredExperts& drives() { return *drives_; }

 private:
  std::shared_ptr<const model::ExpertSource> pool_;
  std::shared_ptr<storage::TieredExperts> drives_;
  bool on_ = false;
};

struct DriveTierOptions {
  std::vector<double> skews = {0.30, 0.45, 0.60};
  int pool_warm_steps = 256;  // decode steps from the pool before each point (the HBM slots settle)
  int drive_warm_steps = 8;   // then through the drives (the host cache fills), per A/B arm
  int steps = 8;              // timed decode steps per arm
  uint64_t seed = 7;
  ProgressFn progress;        // decode steps of each point (optional)
};

struct DriveTierPoint {
  double top10_share = 0;
  double hbm_hit = 0;  // HBM slot hits / lookups (timed steps, prefetch arm)
  // [0]: reads started when the router has run; [1]: each record read when asked for.
  double ms_token[2] = {0, 0};
  double wait_ms_token[2] = {0, 0};  // exposed drive wait per token
  double host_hits_token[2] = {0, 0}, drive_reads_token[2] = {0, 0};
  double drive_gbps[2] = {0, 0};     // drive bytes / timed wall time
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
                                                                 std::vector<storage::ReaderFault> faults = {});

Result<std::vector<DriveTierPoint>> run_drive_tier(cuda::CudaExecutor& ex, model::SessionState& s, SwitchExperts& src,
                                                   const DriveTierOptions& opt);

}  // namespace fb::bench
