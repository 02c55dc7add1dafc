#include "storage/slot_cache.h"

#include <algorithm>
#include <iterator>

#include "base/check.h"

namespace fb::storage {

SlotCache::SlotCache(int n_slots, EvictionPolicy policy, int aging)
    : policy_(policy), aging_(std::max(1, aging)), slots_(size_t(std::max(0, n_slots))) {}

int SlotCache::find(int64_t key) const {
  auto it = where_.find(key);
  return it == where_.end() ? -1 : it->second;
}

uint64_t SlotCache::uses(const Slot& s) const {
  auto it = freq_.find(s.key);
  return it == freq_.end() ? 0 : it->second;
}

uint64_t SlotCache::uses_of(int64_t key) const {
  auto it = freq_.find(key);
  return it == freq_.end() ? 0 : it->second;
}

void SlotCache::count_access(int64_t key) {
  ++clock_;
  if (policy_ == EvictionPolicy::kLfu) {
    if (!slots_.empty() && clock_ % (slots_.size() * size_t(aging_)) == 0)
      for (auto it = freq_.begin(); it != freq_.end();) {  // aging; forgotten keys leave the table
        it->second /= 2;
        it = it->second == 0 ? freq_.erase(it) : std::next(it);
      }
    ++freq_[key];
  }
}

void SlotCache::count_elsewhere(int64_t key) {
  count_access(key);
  ++misses_;
}

SlotCache::Lookup SlotCache::acquire(int64_t key, bool admit_colder) {
  count_access(key);
  Lookup r;
  if (int s = find(key); s >= 0) {
    Slot& sl = slots_[size_t(s)];
    ++sl.pins;
    sl.last_use = clock_;
    ++hits_;
    r.slot = s;
    r.hit = true;
    return r;
  }
  ++misses_;
  const int victim = victim_slot();
  if (victim < 0) return r;
  Slot& v = slots_[size_t(victim)];
  if (!admit_colder && policy_ == EvictionPolicy::kLfu && v.key >= 0 && freq_[key] < uses(v)) {
    r.bypass = true;
    return r;
  }
  r.evicted_key = assign(victim, key, 1);
  r.slot = victim;
  return r;
}

int64_t SlotCache::assign(int slot, int64_t key, int pins) {
  Slot& v = slots_[size_t(slot)];
  const int64_t evicted = v.key;
  if (v.key >= 0) {
    where_.erase(v.key);
    ++evictions_;
  }
  v.key = key;
  v.pins = pins;
  v.last_use = clock_;
  where_[key] = slot;
  return evicted;
}

int SlotCache::victim_slot() const {
  int victim = -1;
  for (int i = 0; i < n_slots(); ++i) {
    const Slot& s = slots_[size_t(i)];
    if (s.pins > 0) continue;
    if (s.key < 0) {  // an empty slot beats any eviction
      victim = i;
      break;
    }
    if (victim < 0) {
      victim = i;
      continue;
    }
    const Slot& v = slots_[size_t(victim)];
    const bool lower = policy_ == EvictionPolicy::kLru ? s.last_use < v.last_use
                                                       : (uses(s) < uses(v) || (uses(s) == uses(v) && s.last_use < v.last_use));
    if (lower) victim = i;
  }
  return victim;
}

int SlotCache::place(int64_t key, bool admit_colder) {
  if (find(key) >= 0) return -1;
  const int victim = victim_slot();
  if (victim < 0) return -1;
  Slot& v = slots_[size_t(victim)];
  if (!admit_colder && policy_ == EvictionPolicy::kLfu && v.key >= 0 && uses_of(key) < uses(v)) return -1;
  assign(victim, key, 0);
  return victim;
}

void SlotCache::release(int slot) {
  Slot& s = slots_.at(size_t(slot));
  FB_CHECK_GT(s.pins, 0) << "release of an unpinned slot " << slot;
  --s.pins;
}

bool SlotCache::evict_slot(int slot) {
  Slot& s = slots_.at(size_t(slot));
  if (s.pins > 0 || s.key < 0) return false;
  where_.erase(s.key);
  s = Slot{};
  ++evictions_;
  return true;
}

size_t take_wave(SlotCache& c, const std::vector<int32_t>& want, size_t from, int staging, std::vector<int>& pinned,
                 std::vector<WaveTake>& out) {
  const int S = c.n_slots();
  FB_CHECK(S + staging > 0) << "a wave needs a cache slot or a staging entry";
  out.clear();
  int staged = 0;
  size_t i = from;
  for (; i < want.size() && (int(pinned.size()) < S || staged < staging); ++i) {
    WaveTake t;
    t.expert = want[i];
    if (int(pinned.size()) < S) {
      const SlotCache::Lookup lk = c.acquire(t.expert, /*admit_colder=*/staged >= staging);
      if (lk.bypass) {
        t.staged = true;
      } else {
        FB_CHECK(lk.slot >= 0) << "an unpinned slot was counted but not found";
        pinned.push_back(lk.slot);
        t.entry = lk.slot;
        t.hit = lk.hit;
      }
    } else {
      t.staged = true;  // every cache slot is pinned by this wave
    }
    if (t.staged) t.entry = S + staged++;
    out.push_back(t);
  }
  return i;
}

void resident_first(const SlotCache& c, std::vector<int32_t>& want) {
  std::stable_partition(want.begin(), want.end(), [&](int32_t e) { return c.find(e) >= 0; });
}

void replay_call(SlotCache& c, std::vector<int32_t> want, int staging, const std::function<void(const WaveTake&)>& on_take) {
  resident_first(c, want);
  std::vector<WaveTake> wave;
  std::vector<int> pinned;
  for (size_t i = 0; i < want.size();) {
    i = take_wave(c, want, i, staging, pinned, wave);
    for (const WaveTake& t : wave)
      if (on_take) on_take(t);
    for (int s : pinned) c.release(s);
    pinned.clear();
  }
}

}  // namespace fb::storage
