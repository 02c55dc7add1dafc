// SlotCache: the residency policy of one tier of N equal slots (a layer's HBM expert slots, the
// host expert cache): which key sits in which slot, eviction keys, pins. It holds no bytes, so the
// CUDA executor keys its device slots with the same policy the CPU tiers use.
// Eviction: the unpinned slot with the lowest key; LRU keys by last use, LFU by a use count that
// halves every `n_slots * 8` accesses (aging), ties broken by last use. Pinned slots never move.
// LFU counts every key's uses, resident or not (the history survives eviction): an evicted hot
// key that comes back is not the next victim, so a stream of cold keys churns through the
// coldest slot instead of pushing the hot set out (measured on the H200 expert-tier sweep,
// docs/tiers.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

namespace fb::storage {

enum class EvictionPolicy { kLru, kLfu };

// The key of (layer, expert) in a cache shared by every layer (TieredExperts' host cache; SlotSim).
inline int64_t host_record_key(int layer, int e) { return (int64_t(layer) << 32) | int64_t(e); }

class SlotCache {
 public:
  // aging: LFU counts halve every `aging * n_slots` accesses (a longer window estimates a steady
  // routing distribution better and follows a drifting one more slowly).
  SlotCache(int n_slots, EvictionPolicy policy, int aging = 8);

  struct Lookup {
    int slot = -1;            // -1: every slot is pinned, or (bypass) the key was not admitted
    bool hit = false;
    bool bypass = false;      // a miss not admitted: the LFU victim has more uses than the key
    int64_t evicted_key = -1; // the key that lost the slot on a miss (-1: the slot was empty)
  };
  // Finds `key` or assigns it a slot, and pins that slot (release() unpins). With admit_colder
  // false (LFU only), a missing key with fewer uses than the slot it would evict is not admitted
  // (Lookup::bypass): the caller serves it from a staging buffer and the resident set stays.
  Lookup acquire(int64_t key, bool admit_colder = true);
  void release(int slot);
  int find(int64_t key) const;
  // Drops the key of an unpinned slot (the tier is shrinking or the bytes are being reused).
  bool evict_slot(int slot);
  // Puts a missing key into the slot acquire() would take for it (an empty one, else the
  // eviction victim among the unpinned), unpinned and without counting an access: bytes copied
  // ahead of a predicted use (DevExpertSlots::predict). The later acquire() of the key is then a
  // hit and counts as every lookup does; a wrong prediction is the next victim under LFU (its
  // uses are what they were). With admit_colder false (LFU), a key with fewer uses than the
  // victim is not placed. Returns the slot, or -1 (resident already, every slot pinned, or not
  // admitted).
  int place(int64_t key, bool admit_colder = true);
  // A use of a missing key served outside the cache (a cold expert computed on the host CPU): the
  // access is counted as acquire() counts it (a miss; LFU uses and aging), nothing is admitted.
  void count_elsewhere(int64_t key);
  // LFU uses of `key` now (0 for a key never seen or forgotten by aging; LRU: 0).
  uint64_t uses_of(int64_t key) const;

  int n_slots() const { return int(slots_.size()); }
  int pins(int slot) const { return slots_[size_t(slot)].pins; }
  int64_t key_of(int slot) const { return slots_[size_t(slot)].key; }
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }
  uint64_t evictions() const { return evictions_; }

 private:
  struct Slot {
    int64_t key = -1;
    int pins = 0;
    uint64_t last_use = 0;
  };
  uint64_t uses(const Slot& s) const;
  int victim_slot() const;  // an empty unpinned slot, else the unpinned one with the lowest key; -1: all pinned
  int64_t assign(int slot, int64_t key, int pins);  // `key` into `slot` (last use now); returns the key evicted, or -1
  void count_access(int64_t key);  // the clock, LFU aging and the key's use (every lookup)
  EvictionPolicy policy_;
  int aging_ = 8;
  std::vector<Slot> slots_;
  std::unordered_map<int64_t, int> where_;
  std::unordered_map<int64_t, uint64_t> freq_;  // LFU: uses of every key seen (aged)
  uint64_t clock_ = 0, hits_ = 0, misses_ = 0, evictions_ = 0;
};

// One wave of a MoE call's lookups, shared by the CUDA executor's HBM slots (DevExpertSlots) and
// their host replay (SlotSim): from want[from] on, each expert gets a cache slot (pinned; the slot
// is appended to `pinned`) while unpinned slots remain. While `staging` staging entries remain, a
// miss colder than its LFU victim is staged instead of admitted, and so is every expert once all
// cache slots are pinned; staged entries are numbered n_slots(), n_slots() + 1, ... Returns one
// past the last expert taken (the next wave starts there after the caller releases `pinned`).
struct WaveTake {
  int32_t expert = -1;
  int entry = -1;       // cache slot, or n_slots() + k for the k-th staged expert of the wave
  bool hit = false;
  bool staged = false;
};
size_t take_wave(SlotCache& c, const std::vector<int32_t>& want, size_t from, int staging, std::vector<int>& pinned,
                 std::vector<WaveTake>& out);
// Resident keys first (stable): a call that needs more experts than slots uses its hits before
// its later waves evict them.
void resident_first(const SlotCache& c, std::vector<int32_t>& want);
// A whole MoE call's lookups as DevExpertSlots makes them, without bytes: resident_first, then
// take_wave after take_wave, each wave's slots released before the next; on_take(t) for every
// expert taken, in take order. SlotSim replays calls with it, and DevExpertSlots::replay warms its
// slots with it (the drive-tier bench), so the replayed policy is the executor's own code.
void replay_call(SlotCache& c, std::vector<int32_t> want, int staging, const std::function<void(const WaveTake&)>& on_take);

}  // namespace fb::storage
