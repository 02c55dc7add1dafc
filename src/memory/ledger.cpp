#include "memory/ledger.h"

#include <algorithm>
#include <sstream>

#include "base/check.h"

namespace fb::memory {

const char* tier_name(Tier t) { return t == Tier::kHbm ? "HBM" : "host"; }

Grant& Grant::operator=(Grant&& o) noexcept {
  if (this != &o) {
    release();
    ledger_ = o.ledger_;
    tier_ = o.tier_;
    kind_ = o.kind_;
    bytes_ = o.bytes_;
    o.ledger_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void Grant::release() {
  if (!ledger_) return;
  ledger_->give_back(tier_, kind_, bytes_);
  ledger_->close_grant();
  ledger_ = nullptr;
  bytes_ = 0;
}

Status Grant::resize(uint64_t new_bytes) {
  FB_CHECK(ledger_) << "resize of an empty grant";
  if (new_bytes <= bytes_) {
    ledger_->give_back(tier_, kind_, bytes_ - new_bytes);
    bytes_ = new_bytes;
    return Status();
  }
  FB_RETURN_IF_ERROR(ledger_->grow(*this, new_bytes - bytes_));
  bytes_ = new_bytes;
  return Status();
}

Ledger::Ledger(std::array<uint64_t, kTierCount> target_bytes) {
  for (int i = 0; i < kTierCount; ++i) tiers_[size_t(i)].target_bytes = target_bytes[size_t(i)];
}

Ledger::~Ledger() {
  std::lock_guard lock(mu_);
  FB_CHECK_EQ(live_grants_, 0u) << "ledger destroyed while grants are alive";
  FB_CHECK(owners_.empty()) << "ledger destroyed while " << owners_.size() << " elastic owners are registered";
}

void Ledger::give_back(Tier tier, Kind kind, uint64_t bytes) {
  std::lock_guard lock(mu_);
  TierUsage& u = tiers_[size_t(tier)];
  uint64_t& b = kind == Kind::kMandatory ? u.mandatory_bytes : u.elastic_bytes;
  FB_CHECK_LE(bytes, b);
  b -= bytes;
}

void Ledger::close_grant() {
  std::lock_guard lock(mu_);
  FB_CHECK_GT(live_grants_, 0u);
  --live_grants_;
}

Result<Grant> Ledger::admit(Tier tier, Kind kind, uint64_t bytes, const std::string& owner) {
  Grant g;
  g.ledger_ = this;
  g.tier_ = tier;
  g.kind_ = kind;
  {
    std::lock_guard lock(mu_);
    ++live_grants_;
  }
  Status st = grow(g, bytes);
  if (!st.ok()) {
    g.ledger_ = nullptr;  // nothing to give back
    std::lock_guard lock(mu_);
    --live_grants_;
    return st.with_context(owner);
  }
  g.bytes_ = bytes;
  return g;
}

Status Ledger::grow(Grant& g, uint64_t extra) {
  const Tier tier = g.tier_;
  for (int attempt = 0; attempt < 3; ++attempt) {
    uint64_t deficit = 0;
    {
      std::lock_guard lock(mu_);
      TierUsage& u = tiers_[size_t(tier)];
      if (extra <= u.free_bytes()) {
        (g.kind_ == Kind::kMandatory ? u.mandatory_bytes : u.elastic_bytes) += extra;
        return Status();
      }
      deficit = extra - u.free_bytes();
      if (g.kind_ == Kind::kElastic || extra > u.target_bytes - u.mandatory_bytes) break;
    }
    if (reclaim(tier, deficit) == 0) break;
  }
  TierUsage u = usage(tier);
  return FB_ERROR(kResourceExhausted) << "cannot admit " << extra << " B of " << (g.kind_ == Kind::kMandatory ? "mandatory" : "elastic")
                                      << " " << tier_name(tier) << " state: target " << u.target_bytes << " B, mandatory "
                                      << u.mandatory_bytes << " B, elastic " << u.elastic_bytes << " B, free " << u.free_bytes()
                                      << " B (raise the target or lower the demand)";
}

int Ledger::register_owner(Tier tier, const std::string& name, int priority, ShrinkFn shrink) {
  std::lock_guard lock(mu_);
  const int id = next_owner_id_++;
  owners_.push_back({id, tier, name, priority, std::move(shrink)});
  std::stable_sort(owners_.begin(), owners_.end(), [](const Owner& a, const Owner& b) { return a.priority < b.priority; });
  return id;
}

void Ledger::unregister_owner(int id) {
  std::lock_guard rlock(reclaim_mu_);  // never while a reclaim may be calling this owner
  std::lock_guard lock(mu_);
  std::erase_if(owners_, [&](const Owner& o) { return o.id == id; });
}

uint64_t Ledger::reclaim(Tier tier, uint64_t want_bytes) {
  std::lock_guard rlock(reclaim_mu_);
  std::vector<Owner> owners;
  {
    std::lock_guard lock(mu_);
    for (const Owner& o : owners_)
      if (o.tier == tier) owners.push_back(o);
  }
  uint64_t freed = 0;
  for (const Owner& o : owners) {
    if (freed >= want_bytes) break;
    freed += o.shrink(want_bytes - freed);
  }
  return freed;
}

TierUsage Ledger::usage(Tier tier) const {
  std::lock_guard lock(mu_);
  return tiers_[size_t(tier)];
}

std::string Ledger::to_string() const {
  std::ostringstream os;
  for (int i = 0; i < kTierCount; ++i) {
    TierUsage u = usage(Tier(i));
    os << tier_name(Tier(i)) << ": target " << u.target_bytes << " B, mandatory " << u.mandatory_bytes << " B, elastic "
       << u.elastic_bytes << " B, free " << u.free_bytes() << " B\n";
  }
  return os.str();
}

}  // namespace fb::memory
