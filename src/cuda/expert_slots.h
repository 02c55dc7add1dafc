// DevExpertSlots: the HBM tier of the routed experts (issue 9, docs/tiers.md). Each layer gets S
// device slots laid out exactly as the resident [E, ...] arrays (so every MoE kernel indexes a
// slot where it would index an expert), keyed by a storage::SlotCache (the policy the host tiers
// use). Missing experts are copied from a model::ExpertSource (the snapshot, TieredExperts, or the
// bench's pinned synthetic pool) on a copy stream that waits for every earlier use of the slots and
// that the compute stream waits for before the routed kernels: the copies start as soon as the
// routing is known and overlap the shared expert. Bytes are copied, never changed, so the outputs
// are bit-identical to the all-resident executor (cuda_fixture_parity_test ExpertSlots*).
// One caller at a time (the executor's step); not thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "base/status.h"
#include "cuda/device.h"
#include "cuda/ops.h"
#include "model/config.h"
#include "model/weights.h"
#include "storage/slot_cache.h"

namespace fb::cuda {

struct ExpertSlotStats {
  uint64_t hits = 0, misses = 0;  // expert lookups of MoE calls (one per distinct expert per call)
  uint64_t copied_bytes = 0;      // host -> HBM
  uint64_t bypassed = 0;          // misses served from a staging slot, not admitted (LFU admission)
  uint64_t waves = 0, calls = 0;  // waves > calls: a call needed more experts than a layer has slots
  double copy_ms = 0;             // GPU time of the copy batches (copy stream, CUDA events)
  // Prefetch (CudaRunOptions::expert_prefetch): experts copied into a staging buffer a layer
  // ahead, those a MoE call then used, the copies' bytes and GPU time (prefetch stream).
  uint64_t prefetched = 0, prefetch_used = 0, prefetch_bytes = 0;
  double prefetch_ms = 0;
  // Copies ahead of a predicted use (CudaRunOptions::expert_predict, DevExpertSlots::predict):
  // experts copied into a slot before their layer's call, those the call then used (counted in
  // `hits` too: the rest of hits + misses is what the prediction did not change), and bytes.
  uint64_t predicted = 0, predict_used = 0, predict_bytes = 0;
  uint64_t predict_hinted = 0;  // guesses handed to a tiered source's prefetch instead (its views expire between layers)
  // Cold experts computed on the host CPU (CudaRunOptions::host_compute): experts, (row, expert)
  // pairs, and the host's wall time computing them. They count in `misses` too.
  uint64_t host_experts = 0, host_pairs = 0;
  double host_ms = 0;
  double hit_rate() const { return hits + misses ? double(hits) / double(hits + misses) : 1.0; }
  double copy_gbps() const { return copy_ms > 0 ? double(copied_bytes) / (copy_ms * 1e-3) / 1e9 : 0.0; }
};

class DevExpertSlots {
 public:
  struct Layout {  // bytes of one expert's six tensors, the slot stride of each array
    int64_t w1 = 0, s1 = 0, w2 = 0, s2 = 0, w3 = 0, s3 = 0;
    int64_t total() const { return w1 + s1 + w2 + s2 + w3 + s3; }
  };
  // `slots` slots for every layer of `c` with more routed experts than that (the others stay
  // resident in the executor); w1/w2/w3(layer) view the slot arrays as the kernels' Fp4W.
  // `staging` extra slots per tiered layer serve misses that LFU admission keeps out of the cache
  // (SlotCache::acquire with admit_colder false): a cold expert is copied and used once without
  // evicting a hotter one. 0: every miss is admitted.
  static Result<std::unique_ptr<DevExpertSlots>> create(const model::Config& c, std::shared_ptr<const model::ExpertSource> src, int slots,
                                                        storage::EvictionPolicy policy, int staging = 0, int lfu_aging = 8);
  ~DevExpertSlots();
  DevExpertSlots(const DevExpertSlots&) = delete;
  DevExpertSlots& operator=(const DevExpertSlots&) = delete;

  // 0: the layer is not tiered.
  int slots(int layer) const { return layers_[size_t(layer)].cache ? layers_[size_t(layer)].cache->n_slots() : 0; }
  // Entries of the layer's arrays (cache slots, then staging slots): what the kernels index.
  int entries(int layer) const { return slots(layer) > 0 ? slots(layer) + staging_ : 0; }
  const Fp4W& w1(int layer) const { return layers_[size_t(layer)].w1; }
  const Fp4W& w2(int layer) const { return layers_[size_t(layer)].w2; }
  const Fp4W& w3(int layer) const { return layers_[size_t(layer)].w3; }
  // Orders `want` so that resident experts come first (stable): a call that needs more experts
  // than slots uses what is resident before the later waves evict it. Called once the routing is
  // known: it hands the source the misses first (ExpertSource::prefetch), so drive reads start.
  void resident_first(int layer, std::vector<int32_t>& want) const;
  // Copies a layer's predicted experts ahead of its call (CudaRunOptions::expert_predict, issue
  // 22): each of `experts` that is not resident gets the slot its miss would take
  // (SlotCache::place: unpinned, no lookup counted, so the call's lookup is an ordinary hit and a
  // wrong guess is the next LFU victim) and is copied on the copy stream after every copy already
  // issued (the current layer's misses keep their place ahead of it); the layer's next take()
  // waits for these copies with its own. At most `max` experts. The caller's contract: no kernel
  // still reads the layer's slots, i.e. the host has synchronised with the compute stream at a
  // point after the layer's last issued call (a tiered decode step's routing sync of an earlier
  // layer is such a point). A guess whose bytes are not in host memory (ExpertSource::ready), or
  // any guess of a source whose views expire at the next layer's calls (predict_ok() false), is not
  // copied: it goes to ExpertSource::prefetch, so its drive read starts a layer early.
  Status predict(int layer, const std::vector<int32_t>& experts, int max);
  bool predict_ok() const;
  // Cold experts computed on the host CPU where their bytes are (CudaRunOptions::host_compute,
  // issue 22): moves misses of `want` out of it, coldest (LFU uses, then id) first, while moving
  // one more shortens the longer of the two queues: the copies (copy_ms an expert, one after
  // another on the copy stream) and the host's work (host_ms a (row, expert) pair; rows[e]: the
  // step's rows routed to e). Each one's use is counted in the layer's cache
  // (SlotCache::count_elsewhere) and nothing is admitted. Returns them, ascending. The choice
  // depends only on the cache's state and the two rates.
  std::vector<int32_t> take_host(int layer, std::vector<int32_t>& want, const std::vector<int>& rows, double copy_ms, double host_ms);
  void note_host(uint64_t experts, uint64_t pairs, double ms) {
    stats_.host_experts += experts;
    stats_.host_pairs += pairs;
    stats_.host_ms += ms;
    // The host's time a pair as it runs beside the copies, whose DRAM traffic slows it (H200 host:
    // 0.61 ms an expert in the sweeps against 0.40 calibrated alone, docs/tiers.md), an EWMA over
    // the layers' host batches.
    if (pairs > 0) host_pair_ms_ = host_pair_ms_ > 0 ? 0.9 * host_pair_ms_ + 0.1 * (ms / double(pairs)) : ms / double(pairs);
  }
  // take_host's host rate: the measured time a pair (note_host), or `calibrated` before any.
  double host_pair_ms(double calibrated) const { return host_pair_ms_ > 0 ? host_pair_ms_ : calibrated; }
  const Layout& layout() const { return layout_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  // Device bytes held now: every tiered layer's arrays (slots and staging entries) and the two
  // prefetch staging buffers once reserved (the executor's memory ledger).
  uint64_t device_bytes() const;

  // One wave of a MoE call (storage::take_wave): pins slots for want[from], want[from + 1], ...
  // (distinct experts) until the layer's slots and staging entries are used or `want` ends;
  // slot_of[e] gets each taken expert's array entry. The
  // misses are copied on the copy stream after everything already issued on `compute`. Returns
  // the index one past the last taken expert. Call join(compute) before kernels read the slots and
  // release(layer) once they are issued.
  // per_slot (the tensor-core path under CudaRunOptions::expert_prefetch, which calls mark_read
  // after each expert's last kernel): a miss's copy waits only for the last reader of its own
  // slot, so a wave's copies overlap the previous wave's remaining experts (double-buffered waves).
  Result<size_t> take(int layer, const std::vector<int32_t>& want, size_t from, std::vector<int32_t>& slot_of, cudaStream_t compute,
                      bool per_slot = false);
  // Records that every kernel reading `entry` of the layer's arrays has been issued on `compute`.
  // Every read of a slot in a step that uses per_slot must be marked.
  Status mark_read(int layer, int entry, cudaStream_t compute);
  Status join(cudaStream_t compute);
  void release(int layer);

  // Prefetch a layer ahead (cold prefill, issue 26; docs/tiers.md "Streaming experts during
  // prefill"). Two staging buffers of `entries` experts each, allocated once by
  // reserve_prefetch (kResourceExhausted when HBM is short: the caller runs without). prefetch()
  // copies up to `entries` experts of `layer` that are not resident in its slots (ascending id)
  // into the buffer not in use, on a second copy stream, after the buffer's previous readers
  // (the event done_staged recorded). A MoE call of that layer then reads each staged expert from
  // staged(layer) instead of taking a slot: join_staged before its kernels, done_staged once
  // they are issued. The slot cache is not told about staged experts (they are used once).
  struct Staged {
    int layer = -1;
    std::vector<int32_t> entry_of;  // [experts of the layer]: entry in this buffer, or -1
    DeviceBuffer bw1, bs1, bw2, bs2, bw3, bs3;
    Fp4W w1, w2, w3;
    cudaEvent_t filled = nullptr, free = nullptr;
  };
  Status reserve_prefetch(int entries);
  int prefetch_entries() const { return prefetch_entries_; }
  // keep: a layer whose staged experts must not be overwritten (-1: none).
  Status prefetch(int layer, int keep = -1);
  // Forgets what the buffers hold (a step start: a failed step may have left a prefetch unread);
  // their bytes stay until the next prefetch, which waits for their readers.
  void drop_staged();
  const Staged* staged(int layer) const;
  Status join_staged(int layer, cudaStream_t compute);
  Status done_staged(int layer, cudaStream_t compute, uint64_t used);

  // Page-locks a host range the source's views point into (the bench's synthetic pool) so that
  // misses copy at the pinned rate; unregistered in the destructor.
  Status pin_host(const void* p, size_t bytes);

  // Warm-up by replay (the drive-tier bench): the lookups one MoE call of `layer` with the
  // distinct experts `want` makes in the layer's slot cache, exactly as resident_first + take make
  // them (storage::take_wave, the calls storage::SlotSim makes too), with no copy and no kernel;
  // on_miss(e) for each miss in take order (where take's copy asks the source for the expert).
  // The caches then hold the keys the same calls run for real would have left. load_replayed()
  // copies the bytes of every slot whose key changed since its layer's first replay (from the
  // source, synchronously, after the device is idle): the slots are then as if the calls had run.
  Status replay(int layer, std::vector<int32_t> want, const std::function<void(int32_t)>& on_miss);
  Result<int64_t> load_replayed();

  // Adds the finished copy batches' GPU times to the stats (the caller's stream has drained).
  void settle();
  ExpertSlotStats stats() const { return stats_; }
  // Where misses are copied from (the host tiers' counters split them by host RAM and drives).
  const model::ExpertSource& source() const { return *src_; }
  void reset_stats() { stats_ = ExpertSlotStats{}; }
  // Forgets every tiered layer's resident experts (unpinned slots; after the steps that read them
  // have finished): the next call of each layer starts cold. The bench's cold prefill runs start
  // from this state, so a run is not warmed by the one before it (the same prompt routes to the
  // same experts). Returns the slots emptied.
  int64_t evict_all();

 private:
  DevExpertSlots() = default;
  struct Layer {
    std::unique_ptr<storage::SlotCache> cache;
    DeviceBuffer bw1, bs1, bw2, bs2, bw3, bs3;
    Fp4W w1, w2, w3;
    std::vector<int> pinned;  // slots pinned by the current wave
    int n_experts = 0;
    std::vector<cudaEvent_t> read_done;  // per entry: after its last marked reader (mark_read)
    std::vector<char> read_marked;
    std::vector<int64_t> replay_keys;  // replay(): each slot's key before the first replayed call
    std::vector<int32_t> predicted;    // predict(): experts copied ahead of the layer's next call
  };
  Status copy_in(int layer, int e, int slot);
  Status copy_expert(int layer, int e, const Fp4W& w1, const Fp4W& w2, const Fp4W& w3, int entry, cudaStream_t st);
  Status timer_begin(cudaStream_t st, std::vector<std::pair<cudaEvent_t, cudaEvent_t>>& timers, size_t& used);
  std::shared_ptr<const model::ExpertSource> src_;
  std::vector<Layer> layers_;
  Layout layout_;
  uint64_t slot_bytes_ = 0;
  int staging_ = 0;
  cudaStream_t copy_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> timers_;  // [0, used_) recorded since settle()
  size_t used_ = 0;
  std::vector<void*> pinned_host_;
  Staged stage_[2];
  int prefetch_entries_ = 0;
  cudaStream_t prefetch_ = nullptr;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> pf_timers_;
  size_t pf_used_ = 0;
  ExpertSlotStats stats_;
  double host_pair_ms_ = 0;  // note_host's EWMA (0: none yet)
};

}  // namespace fb::cuda
