#include "storage/tiered_experts.h"

#include <cstring>
#include <sstream>

#include "base/check.h"

namespace fb::storage {

namespace {
int64_t host_key(int layer, int e) { return (int64_t(layer) << 32) | int64_t(e); }
}  // namespace

std::string TierStats::to_string() const {
  std::ostringstream os;
  os << "slots " << slot_hits << " hit / " << slot_misses << " miss, host " << host_hits << " hit / " << host_misses << " miss, drive reads "
     << drive_reads << " (" << drive_bytes << " B), overflow " << overflow;
  return os.str();
}

ExpertLease& ExpertLease::operator=(ExpertLease&& o) noexcept {
  if (this != &o) {
    if (owner_) owner_->unpin(layer_, slot_);
    owner_ = std::exchange(o.owner_, nullptr);
    layer_ = o.layer_;
    slot_ = o.slot_;
    w_ = o.w_;
  }
  return *this;
}

ExpertLease::~ExpertLease() {
  if (owner_) owner_->unpin(layer_, slot_);
}

Result<std::shared_ptr<TieredExperts>> TieredExperts::create(std::unique_ptr<ExpertLocator> locator, std::vector<std::string> roots,
                                                             TieredOptions opt, memory::Ledger* ledger) {
  if (opt.slots_per_layer < 1) return FB_ERROR(kInvalidArgument) << "expert slots per layer must be >= 1";
  std::shared_ptr<TieredExperts> t(new TieredExperts());
  t->reader_ = FB_TRY(ReplicaReader::open(std::move(roots), opt.reader));
  t->loc_ = std::move(locator);
  t->opt_ = opt;
  t->ledger_ = ledger;
  t->layers_.resize(size_t(t->loc_->n_layers()));
  for (int l = 0; l < t->loc_->n_layers(); ++l) {
    const int n = std::min(opt.slots_per_layer, std::max(1, t->loc_->n_experts(l)));
    Layer& L = t->layers_[size_t(l)];
    L.slots = std::make_unique<SlotCache>(n, opt.policy);
    L.buffers.resize(size_t(n));
    L.grants.resize(size_t(n));
  }
  t->host_ = std::make_unique<SlotCache>(int(opt.host_experts), opt.policy);
  t->host_buf_.resize(size_t(opt.host_experts));
  t->host_grants_.resize(size_t(opt.host_experts));
  if (ledger) {
    TieredExperts* self = t.get();
    t->owner_id_ = ledger->register_owner(memory::Tier::kHost, "host expert cache", 0, [self](uint64_t want) { return self->shrink_host(want); });
  }
  return t;
}

TieredExperts::~TieredExperts() {
  if (ledger_ && owner_id_ >= 0) ledger_->unregister_owner(owner_id_);
  reader_.reset();  // waits for straggling reads before any buffer is freed
  if (opt_.on_host_free)
    for (AlignedBuffer& b : host_buf_)
      if (b.size() > 0) opt_.on_host_free(b.data(), b.size());
}

uint64_t TieredExperts::shrink_host(uint64_t want) {
  std::lock_guard lock(mu_);
  uint64_t freed = 0;
  for (int s = 0; s < host_->n_slots() && freed < want; ++s) {
    if (host_buf_[size_t(s)].size() == 0 || host_->pins(s) > 0) continue;
    host_->evict_slot(s);
    (void)reader_->drain(host_buf_[size_t(s)].data(), host_buf_[size_t(s)].size());
    freed += host_grants_[size_t(s)].bytes();
    host_grants_[size_t(s)].release();
    if (opt_.on_host_free) opt_.on_host_free(host_buf_[size_t(s)].data(), host_buf_[size_t(s)].size());
    host_buf_[size_t(s)] = AlignedBuffer();
  }
  return freed;
}

Status TieredExperts::fetch_record_locked(int layer, int e, uint8_t* dst) const {
  const uint64_t stride = loc_->layout().stride_bytes;
  const int h = FB_TRY(host_slot_locked(layer, e));
  if (h >= 0) {
    std::memcpy(dst, host_buf_[size_t(h)].data(), stride);
    host_->release(h);
    return Status();
  }
  FB_RETURN_IF_ERROR(reader_->drain(dst, stride));
  std::vector<ReadRange> r = loc_->ranges(layer, e, dst);
  FB_RETURN_IF_ERROR(reader_->read(r).with_context("expert " + std::to_string(e) + " of layer " + std::to_string(layer)));
  ++stats_.drive_reads;
  for (const ReadRange& x : r) stats_.drive_bytes += x.nbytes;
  return loc_->check(layer, e, dst);
}

Result<int> TieredExperts::host_slot_locked(int layer, int e) const {
  const uint64_t stride = loc_->layout().stride_bytes;
  if (host_->n_slots() == 0) return -1;
  const SlotCache::Lookup h = host_->acquire(host_key(layer, e));
  if (h.slot < 0) {
    ++stats_.host_misses;
    return -1;
  }
  AlignedBuffer& b = host_buf_[size_t(h.slot)];
  if (h.hit) {
    ++stats_.host_hits;
    return h.slot;
  }
  ++stats_.host_misses;
  bool ok = true;
  if (b.size() == 0) {
    if (ledger_) {
      auto g = ledger_->admit(memory::Tier::kHost, memory::Kind::kElastic, stride, "host expert cache");
      if (g.ok()) host_grants_[size_t(h.slot)] = std::move(g.value());
      else ok = false;
    }
    if (ok) {
      b = AlignedBuffer(stride);
      if (opt_.on_host_alloc) opt_.on_host_alloc(b.data(), b.size());
    }
  }
  if (!ok) {
    host_->release(h.slot);
    host_->evict_slot(h.slot);  // the ledger had no room: read past the host tier
    return -1;
  }
  Status st = reader_->drain(b.data(), stride);
  std::vector<ReadRange> r = loc_->ranges(layer, e, b.data());
  if (st.ok()) st = reader_->read(r).with_context("expert " + std::to_string(e) + " of layer " + std::to_string(layer));
  if (st.ok()) {
    ++stats_.drive_reads;
    for (const ReadRange& x : r) stats_.drive_bytes += x.nbytes;
    st = loc_->check(layer, e, b.data());
  }
  if (!st.ok()) {
    host_->release(h.slot);
    host_->evict_slot(h.slot);
    return st;
  }
  return h.slot;
}

Result<int> TieredExperts::pin_locked(int layer, int e, AlignedBuffer* spare) const {
  FB_CHECK(layer >= 0 && layer < int(layers_.size())) << "layer " << layer;
  FB_CHECK(e >= 0 && e < loc_->n_experts(layer)) << "expert " << e << " of layer " << layer;
  Layer& L = layers_[size_t(layer)];
  const SlotCache::Lookup lk = L.slots->acquire(e);
  if (lk.slot >= 0 && lk.hit) {
    ++stats_.slot_hits;
    return lk.slot;
  }
  ++stats_.slot_misses;
  const uint64_t stride = loc_->layout().stride_bytes;
  bool have_slot = lk.slot >= 0;
  if (have_slot && L.buffers[size_t(lk.slot)].size() == 0) {
    if (ledger_) {
      // In the CPU build slot buffers stand in for HBM slots, so they are HBM-tier state.
      auto g = ledger_->admit(memory::Tier::kHbm, memory::Kind::kElastic, stride, "expert slots");
      if (g.ok()) L.grants[size_t(lk.slot)] = std::move(g.value());
      else have_slot = false;
    }
    if (have_slot) L.buffers[size_t(lk.slot)] = AlignedBuffer(stride);
    else {
      L.slots->release(lk.slot);
      L.slots->evict_slot(lk.slot);
    }
  }
  if (!have_slot) {
    ++stats_.overflow;
    *spare = AlignedBuffer(stride);
    FB_RETURN_IF_ERROR(fetch_record_locked(layer, e, spare->data()));
    return -1;
  }
  Status st = fetch_record_locked(layer, e, L.buffers[size_t(lk.slot)].data());
  if (!st.ok()) {
    L.slots->release(lk.slot);
    L.slots->evict_slot(lk.slot);
    return st;
  }
  return lk.slot;
}

void TieredExperts::unpin(int layer, int slot) const {
  std::lock_guard lock(mu_);
  layers_[size_t(layer)].slots->release(slot);
}

model::ExpertWeights TieredExperts::expert(int layer, int e) const {
  std::lock_guard lock(mu_);
  if (layer != epoch_layer_) {
    if (epoch_layer_ >= 0) {
      Layer& old = layers_[size_t(epoch_layer_)];
      for (int s : old.epoch_pins) old.slots->release(s);
      old.epoch_pins.clear();
    }
    for (int h : epoch_host_pins_) host_->release(h);
    epoch_host_pins_.clear();
    overflow_.clear();
    epoch_layer_ = layer;
  }
  if (opt_.host_views && host_->n_slots() > 0) {
    // The record itself, pinned in the host cache until the epoch ends (no first-tier copy).
    FB_CHECK(layer >= 0 && layer < int(layers_.size())) << "layer " << layer;
    FB_CHECK(e >= 0 && e < loc_->n_experts(layer)) << "expert " << e << " of layer " << layer;
    auto h = host_slot_locked(layer, e);
    FB_CHECK(h.ok()) << h.status().to_string();
    if (*h >= 0) {
      epoch_host_pins_.push_back(*h);
      return loc_->layout().view(host_buf_[size_t(*h)].data());
    }
    AlignedBuffer spare(loc_->layout().stride_bytes);  // every host slot pinned by this layer: read past the cache
    Status st = fetch_record_locked(layer, e, spare.data());
    FB_CHECK(st.ok()) << st.to_string();
    ++stats_.overflow;
    overflow_.push_back(std::move(spare));
    return loc_->layout().view(overflow_.back().data());
  }
  AlignedBuffer spare;
  auto s = pin_locked(layer, e, &spare);
  // The executor interface cannot return a Status: an expert no replica can supply is fatal here
  // (the engine path uses acquire(), which returns it).
  FB_CHECK(s.ok()) << s.status().to_string();
  if (*s < 0) {
    overflow_.push_back(std::move(spare));
    return loc_->layout().view(overflow_.back().data());
  }
  layers_[size_t(layer)].epoch_pins.push_back(*s);
  return loc_->layout().view(layers_[size_t(layer)].buffers[size_t(*s)].data());
}

Result<ExpertLease> TieredExperts::acquire(int layer, int e) const {
  std::lock_guard lock(mu_);
  AlignedBuffer spare;
  const int s = FB_TRY(pin_locked(layer, e, &spare));
  if (s < 0)
    return FB_ERROR(kResourceExhausted) << "every expert slot of layer " << layer << " is pinned (" << layers_[size_t(layer)].slots->n_slots()
                                        << " slots): release leases or raise --expert-slots";
  ExpertLease lease;
  lease.owner_ = this;
  lease.layer_ = layer;
  lease.slot_ = s;
  lease.w_ = loc_->layout().view(layers_[size_t(layer)].buffers[size_t(s)].data());
  return lease;
}

TierStats TieredExperts::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

bool TieredExperts::traffic(model::ExpertTraffic* out) const {
  uint64_t record = 0;  // the six tensors' bytes (the stride adds 4 KiB alignment)
  for (const ExpertPart& p : loc_->layout().parts) record += p.nbytes;
  std::lock_guard lock(mu_);
  out->hbm = {stats_.slot_hits, stats_.slot_hits * record};
  out->host = {stats_.host_hits, stats_.host_hits * record};
  out->drive = {stats_.drive_reads, stats_.drive_bytes};
  return true;
}

Result<std::shared_ptr<TieredExperts>> tiered_experts_for(const loader::Snapshot& snap, const std::vector<std::string>& store_dirs,
                                                          TieredOptions opt, memory::Ledger* ledger) {
  if (store_dirs.empty()) return TieredExperts::create(FB_TRY(shard_locator(snap)), {snap.dir()}, opt, ledger);
  const uint64_t id = FB_TRY(model_identity(snap.dir()));
  std::shared_ptr<const ExpertStore> store(FB_TRY(ExpertStore::open(store_dirs[0], id)));
  for (size_t i = 1; i < store_dirs.size(); ++i) {
    auto other = FB_TRY(ExpertStore::open(store_dirs[i], id));
    if (other->layout().stride_bytes != store->layout().stride_bytes)
      return FB_ERROR(kCorrupt) << store_dirs[i] << ": replica layout differs from " << store_dirs[0];
  }
  return TieredExperts::create(store_locator(store), store_dirs, opt, ledger);
}

}  // namespace fb::storage
