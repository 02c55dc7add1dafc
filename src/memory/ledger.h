// Ledger: the one byte target per tier (HBM, pinned host RAM). Every allocation of size is a
// Grant admitted here first (DESIGN-AHEAD item 6). Mandatory state (dense weights, session KV and
// workspaces, DSpark weights) may reclaim bytes from elastic owners (expert slots, host expert
// cache, prefix KV) through their shrink callbacks; elastic state never reclaims.
// Invariant: for every tier, the sum of live grants never exceeds the target (property-tested).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "base/status.h"

namespace fb::memory {

enum class Tier : uint8_t { kHbm = 0, kHost = 1 };
constexpr int kTierCount = 2;
const char* tier_name(Tier t);

enum class Kind : uint8_t { kMandatory, kElastic };

class Ledger;

// A granted byte range of one tier; released on destruction. Move-only.
class Grant {
 public:
  Grant() = default;
  ~Grant() { release(); }
  Grant(Grant&& o) noexcept { *this = std::move(o); }
  Grant& operator=(Grant&& o) noexcept;
  Grant(const Grant&) = delete;
  Grant& operator=(const Grant&) = delete;

  uint64_t bytes() const { return bytes_; }
  Tier tier() const { return tier_; }
  Kind kind() const { return kind_; }
  bool valid() const { return ledger_ != nullptr; }
  // Shrinking always succeeds; growing goes through admission (and may fail).
  Status resize(uint64_t new_bytes);
  void release();

 private:
  friend class Ledger;
  Ledger* ledger_ = nullptr;
  Tier tier_ = Tier::kHbm;
  Kind kind_ = Kind::kElastic;
  uint64_t bytes_ = 0;
};

// Asked to free at least `want_bytes` of its grants (by destroying or shrinking them); returns
// the bytes it released. Called without the ledger's lock held; must not call admit().
using ShrinkFn = std::function<uint64_t(uint64_t want_bytes)>;

struct TierUsage {
  uint64_t target_bytes = 0;
  uint64_t mandatory_bytes = 0;
  uint64_t elastic_bytes = 0;
  uint64_t used_bytes() const { return mandatory_bytes + elastic_bytes; }
  uint64_t free_bytes() const { return target_bytes - used_bytes(); }
  // What elastic state may hold once mandatory state is in: the remainder of the target.
  uint64_t elastic_budget_bytes() const { return target_bytes - mandatory_bytes; }
};

class Ledger {
 public:
  explicit Ledger(std::array<uint64_t, kTierCount> target_bytes);
  ~Ledger();
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  // Admits `bytes` or returns kResourceExhausted naming the owner, the tier and the shortfall.
  // Mandatory admission first asks elastic owners of the tier to shrink (lowest priority first).
  Result<Grant> admit(Tier tier, Kind kind, uint64_t bytes, const std::string& owner);

  // Elastic owners register how to give bytes back. Lower `priority` is reclaimed first.
  // Returns an id for unregister_owner (owners must unregister before they die).
  int register_owner(Tier tier, const std::string& name, int priority, ShrinkFn shrink);
  void unregister_owner(int id);

  // Ask elastic owners of `tier` to free `want_bytes` (used by admission; exposed for phases
  // that need headroom, e.g. a prefill workspace). Returns bytes freed.
  uint64_t reclaim(Tier tier, uint64_t want_bytes);

  TierUsage usage(Tier tier) const;
  std::string to_string() const;

 private:
  friend class Grant;
  Status grow(Grant& g, uint64_t extra);
  void give_back(Tier tier, Kind kind, uint64_t bytes);
  void close_grant();

  struct Owner {
    int id;
    Tier tier;
    std::string name;
    int priority;
    ShrinkFn shrink;
  };
  mutable std::mutex mu_;
  std::mutex reclaim_mu_;  // one reclaim at a time (callbacks run unlocked)
  std::array<TierUsage, kTierCount> tiers_{};
  std::vector<Owner> owners_;
  int next_owner_id_ = 1;
  uint64_t live_grants_ = 0;
};

}  // namespace fb::memory
