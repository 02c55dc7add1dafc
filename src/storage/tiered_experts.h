// TieredExperts: routed experts through three tiers, as a model::ExpertSource. Tier 1 is N slots
// per layer (HBM in the CUDA executor; host memory standing in for it on the CPU), tier 2 a
// shared host-RAM cache of records, tier 3 the drives (the expert store or the snapshot shards,
// through ReplicaReader). Slot buffers and cache records are elastic ledger state: admitted
// when first filled, given back when the ledger reclaims. Bytes are copied, never changed, so
// outputs are identical to reading the snapshot directly (check-fixture --expert-slots).
// Pinning: acquire() pins until the lease dies; expert() (the executor interface has no release)
// pins until a call for another layer arrives: executors finish a layer's MoE before the next.
// Reads start early: prefetch(layer, experts) (the executor calls it once the router has run)
// submits every missing record's read at once (into a pinned host cache record, or a prefetch
// buffer without a free one); expert() then waits only for what has not landed yet (the exposed
// drive wait, TierStats::drive_wait_ns). A record that fails its checksum is re-read from each
// replica alone; replicas whose copy is bad are marked failed.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "memory/ledger.h"
#include "model/weights.h"
#include "storage/aligned_buffer.h"
#include "storage/expert_store.h"
#include "storage/replica_reader.h"
#include "storage/slot_cache.h"

namespace fb::storage {

struct TieredOptions {
  int slots_per_layer = 8;
  int64_t host_experts = 0;  // records in the host cache (0: none, drives feed the slots directly)
  EvictionPolicy policy = EvictionPolicy::kLfu;
  ReaderOptions reader;
  // For a consumer that copies the bytes out itself (the CUDA executor's HBM slots): expert()
  // returns views straight into the host cache record, pinned there until a call for another
  // layer, instead of copying the record into a first-tier slot. Needs host_experts > 0.
  bool host_views = false;
  // Layer epochs a view stays valid through: 1, until a call for another layer; 2, also through
  // the next layer's calls (the CUDA executor's copies ahead of a predicted use read the next
  // layer while this layer's copies may still run; model::ExpertSource::view_layers).
  int epochs_kept = 1;
  // Called on each host cache buffer right after it is allocated and right before it is freed
  // (the CUDA executor page-locks them, so its copies run at the pinned rate).
  std::function<void(void*, size_t)> on_host_alloc, on_host_free;
  // prefetch(): start the reads of a layer's misses when the router has run (off: each expert()
  // reads its record when asked, one after another).
  bool prefetch = true;
  int prefetch_buffers = 8;  // prefetches in flight without a free host cache record, at most
  // Fault injection on the replicas (tests; check-fixture --fault-replica), applied at create().
  std::vector<ReaderFault> faults;
};

struct TierStats {
  uint64_t slot_hits = 0, slot_misses = 0, host_hits = 0, host_misses = 0, drive_reads = 0, drive_bytes = 0;
  uint64_t overflow = 0;  // expert() misses with every slot of the layer pinned (served from a spare buffer)
  // Exposed drive time: wall time expert()/acquire() spent blocked on drive reads (a prefetched
  // read that landed before it was asked for costs nothing here).
  uint64_t drive_wait_ns = 0;
  uint64_t prefetch_reads = 0;   // records whose read prefetch() started
  uint64_t prefetch_used = 0;    // ... and an expert() call then took
  uint64_t prefetch_unused = 0;  // ... finished without being asked for (bytes read for nothing)
  uint64_t checksum_failovers = 0;  // records re-read from another replica after a bad checksum
  // Warm-up (replay_lookup / fill_host): lookups replayed in the host cache's policy without
  // bytes, and the records fill_host then read from the drives (not in drive_reads/drive_bytes).
  uint64_t warm_lookups = 0, warm_reads = 0, warm_bytes = 0;
  std::vector<DriveStats> drives;   // per replica drive: reads, errors, hedges, failed (stats() fills it)
  std::string to_string() const;
};

class TieredExperts;

// A pinned expert: its views stay valid until the lease dies.
class ExpertLease {
 public:
  ExpertLease() = default;
  ExpertLease(ExpertLease&& o) noexcept { *this = std::move(o); }
  ExpertLease& operator=(ExpertLease&& o) noexcept;
  ~ExpertLease();
  const model::ExpertWeights& weights() const { return w_; }

 private:
  friend class TieredExperts;
  const TieredExperts* owner_ = nullptr;
  int layer_ = -1, slot_ = -1;
  model::ExpertWeights w_;
};

class TieredExperts final : public model::ExpertSource {
 public:
  // `roots`: the drive roots the locator's relative paths live under (replicas). `ledger` may be
  // null (no accounting).
  static Result<std::shared_ptr<TieredExperts>> create(std::unique_ptr<ExpertLocator> locator, std::vector<std::string> roots,
                                                       TieredOptions opt, memory::Ledger* ledger = nullptr);
  ~TieredExperts() override;

  model::ExpertWeights expert(int layer, int e) const override;
  void prefetch(int layer, const std::vector<int>& experts) const override;
  int view_layers() const override { return std::max(1, opt_.epochs_kept); }
  bool ready(int layer, int e) const override { return resident(layer, e); }
  // Turns reads at routing time on or off (A/B in the bench); pending reads still complete.
  void set_prefetch(bool on);
  // Whether (layer, e)'s bytes are in the first tier or the host cache now, i.e. a lookup would
  // read no drive (cache-conditional routing's question; cpu::RoutePreference).
  bool resident(int layer, int e) const;
  Result<ExpertLease> acquire(int layer, int e) const;
  // Warming the host cache without the drives (the drive-tier bench, whose HBM slots settle from
  // a page-locked pool first): replay_lookup makes the one host cache lookup that expert() makes
  // for (layer, e) with host views (the same SlotCache call, pinned until a later layer's lookup)
  // but moves no bytes; a record it admits is marked stale. fill_host() then reads every record the
  // cache holds whose bytes are stale or not allocated from the drives, `in_flight` at a time, and
  // verifies each: the cache is then in the state the same lookups through the drives would have
  // left it in, for one read per record held instead of one per miss. A lookup that finds a stale
  // record before fill_host reads it then (a miss). Host views only (kInvalidArgument otherwise;
  // without a host cache replay_lookup does nothing).
  Status replay_lookup(int layer, int e) const;
  Result<int64_t> fill_host(int in_flight = 16);
  // Records of the host cache that hold an expert's bytes (filled, not stale).
  int64_t host_records_filled() const;
  TierStats stats() const;
  // One line per replica drive: reads, bytes, estimated rate, errors, hedges, failed and why.
  std::string drive_report() const;
  // stats() as lookups by supplying tier: first-tier slot hits, host cache hits, drive reads
  // (bytes: the record's size for the first two, the bytes read for the drives).
  bool traffic(model::ExpertTraffic* out) const override;
  // Bytes of the buffers it holds now: first-tier slots, host cache records, staging, spare and
  // prefetch buffers.
  uint64_t host_bytes() const override;
  const ReplicaReader& reader() const { return *reader_; }

 private:
  friend class ExpertLease;
  TieredExperts() = default;
  struct Layer {
    std::unique_ptr<SlotCache> slots;
    std::vector<AlignedBuffer> buffers;
    std::vector<memory::Grant> grants;
    std::vector<int> epoch_pins;  // slots pinned by expert() in the current layer epoch
  };
  // With mu_ held: the slot holding (layer, e), pinned; -1 with every slot pinned (`spare` filled).
  Result<int> pin_locked(int layer, int e, AlignedBuffer* spare) const;
  Status fetch_record_locked(int layer, int e, uint8_t* dst) const;
  // With mu_ held: the host cache slot holding (layer, e), filled from the drives on a miss and
  // pinned (release with host_->release); -1: no host cache, every slot pinned, or no ledger room.
  Result<int> host_slot_locked(int layer, int e) const;
  void unpin(int layer, int slot) const;
  // With mu_ held: resident() for a valid layer.
  bool resident_locked(int layer, int e) const;
  // With mu_ held: a lookup of `layer` ends the previous layer's epoch (its pins, spare buffers and
  // unclaimed prefetches); -1 ends it without starting another.
  void begin_epoch_locked(int layer) const;
  uint64_t shrink_host(uint64_t want);
  struct Pending {  // a prefetched read
    ReplicaReader::Job job = 0;
    int host_slot = -1;   // the host cache record it fills (pinned), or -1: `buf`
    AlignedBuffer buf;
  };
  // With mu_ held: reads (layer, e)'s record into dst (drained first), verified, waiting counted.
  Status read_record_locked(int layer, int e, uint8_t* dst) const;
  // With mu_ held: waits for a submitted read of (layer, e) into dst and verifies it.
  Status finish_read_locked(ReplicaReader::Job job, int layer, int e, uint8_t* dst) const;
  // With mu_ held: a record that failed its checksum, re-read from each healthy replica alone.
  Status verify_locked(int layer, int e, uint8_t* dst) const;
  // With mu_ held: takes the pending prefetch of (layer, e) out of pending_, finished and
  // verified; false when there is none.
  Result<bool> claim_pending_locked(int layer, int e, Pending* out) const;
  // With mu_ held: finishes prefetches of layers other than `keep_layer` nobody asked for.
  void retire_pending_locked(int keep_layer) const;
  // With mu_ held: a host cache record for (layer, e) that is not there yet, pinned, allocated
  // (no read); -1 when none can be had.
  int host_reserve_locked(int layer, int e) const;

  mutable std::mutex mu_;
  std::unique_ptr<ExpertLocator> loc_;
  std::unique_ptr<ReplicaReader> reader_;
  TieredOptions opt_;
  memory::Ledger* ledger_ = nullptr;
  int owner_id_ = -1;
  mutable std::vector<Layer> layers_;
  mutable std::unique_ptr<SlotCache> host_;
  mutable std::vector<AlignedBuffer> host_buf_;
  mutable std::vector<memory::Grant> host_grants_;
  mutable std::vector<char> host_stale_;  // per host record: admitted by replay_lookup, bytes not read yet
  mutable AlignedBuffer staging_;
  mutable int epoch_layer_ = -1;
  mutable std::vector<AlignedBuffer> overflow_;
  mutable std::vector<int> epoch_host_pins_;  // host_views: host slots pinned by expert() in the current epoch
  struct Epoch {  // an ended epoch kept while its views may still be read (TieredOptions::epochs_kept)
    int layer = -1;
    std::vector<int> slot_pins, host_pins;
    std::vector<AlignedBuffer> overflow;
  };
  mutable std::deque<Epoch> kept_;
  void release_epoch_locked(Epoch& e) const;
  mutable std::map<int64_t, Pending> pending_;  // prefetched reads by (layer << 32 | expert)
  mutable int pending_buffers_ = 0;             // pending_ entries with their own buffer
  mutable TierStats stats_;
};

// The tiers over a snapshot: reads from the expert store in `store_dirs` (replicas; validated
// against the snapshot's identity) or, when none is given, straight from the snapshot's shards.
Result<std::shared_ptr<TieredExperts>> tiered_experts_for(const loader::Snapshot& snap, const std::vector<std::string>& store_dirs,
                                                          TieredOptions opt, memory::Ledger* ledger = nullptr);

}  // namespace fb::storage
