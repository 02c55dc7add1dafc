// TieredExperts: routed experts through three tiers, as a model::ExpertSource. Tier 1 is N slots
// per layer (HBM in the CUDA executor; host memory standing in for it on the CPU), tier 2 a
// shared host-RAM cache of records, tier 3 the drives (the expert store or the snapshot shards,
// through ReplicaReader). Slot buffers and cache records are elastic ledger state: admitted
// when first filled, given back when the ledger reclaims. Bytes are copied, never changed, so
// outputs are identical to reading the snapshot directly (check-fixture --expert-slots).
// Pinning: acquire() pins until the lease dies; expert() (the executor interface has no release)
// pins until a call for another layer arrives: executors finish a layer's MoE before the next.
#pragma once

#include <functional>
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
  // Called on each host cache buffer right after it is allocated and right before it is freed
  // (the CUDA executor page-locks them, so its copies run at the pinned rate).
  std::function<void(void*, size_t)> on_host_alloc, on_host_free;
};

struct TierStats {
  uint64_t slot_hits = 0, slot_misses = 0, host_hits = 0, host_misses = 0, drive_reads = 0, drive_bytes = 0;
  uint64_t overflow = 0;  // expert() misses with every slot of the layer pinned (served from a spare buffer)
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
  Result<ExpertLease> acquire(int layer, int e) const;
  TierStats stats() const;
  // stats() as lookups by supplying tier: first-tier slot hits, host cache hits, drive reads
  // (bytes: the record's size for the first two, the bytes read for the drives).
  bool traffic(model::ExpertTraffic* out) const override;
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
  uint64_t shrink_host(uint64_t want);

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
  mutable AlignedBuffer staging_;
  mutable int epoch_layer_ = -1;
  mutable std::vector<AlignedBuffer> overflow_;
  mutable std::vector<int> epoch_host_pins_;  // host_views: host slots pinned by expert() in the current epoch
  mutable TierStats stats_;
};

// The tiers over a snapshot: reads from the expert store in `store_dirs` (replicas; validated
// against the snapshot's identity) or, when none is given, straight from the snapshot's shards.
Result<std::shared_ptr<TieredExperts>> tiered_experts_for(const loader::Snapshot& snap, const std::vector<std::string>& store_dirs,
                                                          TieredOptions opt, memory::Ledger* ledger = nullptr);

}  // namespace fb::storage
