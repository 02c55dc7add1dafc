#include "storage/tiered_experts.h"

#include <chrono>
#include <cstring>
#include <sstream>

#include "base/check.h"
#include "base/log.h"

namespace fb::storage {

namespace {
int64_t host_key(int layer, int e) { return host_record_key(layer, e); }
uint64_t now_ns() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}
}  // namespace

std::string TierStats::to_string() const {
  std::ostringstream os;
  os << "slots " << slot_hits << " hit / " << slot_misses << " miss, host " << host_hits << " hit / " << host_misses << " miss, drive reads "
     << drive_reads << " (" << drive_bytes << " B), overflow " << overflow << "; drive wait " << double(drive_wait_ns) / 1e6
     << " ms exposed; prefetch " << prefetch_reads << " reads (" << prefetch_used << " used, " << prefetch_unused << " unused)";
  if (checksum_failovers > 0) os << ", " << checksum_failovers << " checksum failovers";
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
  opt.reader.caller_drains = true;  // every destination is drained before it is reused or freed
  t->reader_ = FB_TRY(ReplicaReader::open(std::move(roots), opt.reader));
  for (const ReaderFault& f : opt.faults) {
    if (f.drive >= t->reader_->n_drives())
      return FB_ERROR(kInvalidArgument) << "fault on drive " << f.drive << ": there are " << t->reader_->n_drives() << " replica drive(s)";
    t->reader_->inject(f);
  }
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
  t->host_stale_.assign(size_t(opt.host_experts), 0);
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
    host_stale_[size_t(s)] = 0;
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
  Pending p;
  if (FB_TRY(claim_pending_locked(layer, e, &p))) {
    std::memcpy(dst, p.host_slot >= 0 ? host_buf_[size_t(p.host_slot)].data() : p.buf.data(), stride);
    if (p.host_slot >= 0) host_->release(p.host_slot);
    else FB_RETURN_IF_ERROR(reader_->drain(p.buf.data(), p.buf.size()));  // a hedge's late copy may still land in it
    return Status();
  }
  const int h = FB_TRY(host_slot_locked(layer, e));
  if (h >= 0) {
    std::memcpy(dst, host_buf_[size_t(h)].data(), stride);
    host_->release(h);
    return Status();
  }
  return read_record_locked(layer, e, dst);
}

Status TieredExperts::read_record_locked(int layer, int e, uint8_t* dst) const {
  FB_RETURN_IF_ERROR(reader_->drain(dst, loc_->layout().stride_bytes));
  std::vector<ReadRange> r = loc_->ranges(layer, e, dst);
  auto job = reader_->submit(r);
  if (!job.ok()) return job.status().with_context("expert " + std::to_string(e) + " of layer " + std::to_string(layer));
  ++stats_.drive_reads;
  for (const ReadRange& x : r) stats_.drive_bytes += x.nbytes;
  return finish_read_locked(*job, layer, e, dst);
}

Status TieredExperts::finish_read_locked(ReplicaReader::Job job, int layer, int e, uint8_t* dst) const {
  const uint64_t t0 = now_ns();
  Status st = reader_->wait(job).with_context("expert " + std::to_string(e) + " of layer " + std::to_string(layer));
  if (st.ok()) st = verify_locked(layer, e, dst);
  stats_.drive_wait_ns += now_ns() - t0;
  return st;
}

Status TieredExperts::verify_locked(int layer, int e, uint8_t* dst) const {
  Status st = loc_->check(layer, e, dst);
  if (st.ok()) return st;
  // Some chunk came from a replica with bad bytes: read the record from each replica alone.
  const std::vector<ReadRange> r = loc_->ranges(layer, e, dst);
  std::vector<int> bad;
  for (int d = 0; d < reader_->n_drives(); ++d) {
    if (reader_->stats(d).failed) continue;
    if (reader_->read(r, d).ok() && loc_->check(layer, e, dst).ok()) {
      for (int b : bad) reader_->mark_failed(b, "expert " + std::to_string(e) + " of layer " + std::to_string(layer) + ": checksum mismatch");
      ++stats_.checksum_failovers;
      FB_LOG(kWarn) << "storage: expert " << e << " of layer " << layer << " failed its checksum; the copy on " << reader_->stats(d).root
                    << " is good";
      return Status();
    }
    bad.push_back(d);
  }
  for (int b : bad) reader_->mark_failed(b, "expert " + std::to_string(e) + " of layer " + std::to_string(layer) + ": checksum mismatch");
  return st.with_context("no replica holds a valid copy");
}

int TieredExperts::host_reserve_locked(int layer, int e) const {
  if (host_->n_slots() == 0) return -1;
  const SlotCache::Lookup h = host_->acquire(host_key(layer, e));
  if (h.slot < 0) return -1;
  FB_CHECK(!h.hit || host_stale_[size_t(h.slot)]) << "host_reserve_locked for a cached record";
  host_stale_[size_t(h.slot)] = 0;  // the caller reads the record into it (or evicts it)
  AlignedBuffer& b = host_buf_[size_t(h.slot)];
  if (b.size() == 0) {
    const uint64_t stride = loc_->layout().stride_bytes;
    if (ledger_) {
      auto g = ledger_->admit(memory::Tier::kHost, memory::Kind::kElastic, stride, "host expert cache");
      if (!g.ok()) {
        host_->release(h.slot);
        host_->evict_slot(h.slot);  // the ledger had no room: read past the host tier
        return -1;
      }
      host_grants_[size_t(h.slot)] = std::move(g.value());
    }
    b = AlignedBuffer(stride);
    if (opt_.on_host_alloc) opt_.on_host_alloc(b.data(), b.size());
  }
  return h.slot;
}

void TieredExperts::set_prefetch(bool on) {
  std::lock_guard lock(mu_);
  opt_.prefetch = on;
}

void TieredExperts::prefetch(int layer, const std::vector<int>& experts) const {
  std::lock_guard lock(mu_);
  if (!opt_.prefetch) return;
  if (layer < 0 || layer >= int(layers_.size())) return;
  const uint64_t stride = loc_->layout().stride_bytes;
  for (int e : experts) {
    if (e < 0 || e >= loc_->n_experts(layer)) continue;
    const int64_t key = host_key(layer, e);
    if (pending_.count(key)) continue;
    if (resident_locked(layer, e)) continue;  // in the first tier or the host cache
    Pending p;
    p.host_slot = host_reserve_locked(layer, e);
    if (p.host_slot < 0 && pending_buffers_ >= opt_.prefetch_buffers) continue;  // expert() reads it when asked
    if (p.host_slot < 0) p.buf = AlignedBuffer(stride);
    uint8_t* dst = p.host_slot >= 0 ? host_buf_[size_t(p.host_slot)].data() : p.buf.data();
    const std::vector<ReadRange> r = loc_->ranges(layer, e, dst);
    Status st = reader_->drain(dst, stride);
    Result<ReplicaReader::Job> job = st.ok() ? reader_->submit(r) : Result<ReplicaReader::Job>(st);
    if (!job.ok()) {  // only a hint: expert() reads it (and reports the error) when asked
      if (p.host_slot >= 0) {
        host_->release(p.host_slot);
        host_->evict_slot(p.host_slot);
      }
      continue;
    }
    p.job = *job;
    if (host_->n_slots() > 0) ++stats_.host_misses;
    ++stats_.prefetch_reads;
    ++stats_.drive_reads;
    for (const ReadRange& x : r) stats_.drive_bytes += x.nbytes;
    if (p.host_slot < 0) ++pending_buffers_;
    pending_.emplace(key, std::move(p));
  }
}

Result<bool> TieredExperts::claim_pending_locked(int layer, int e, Pending* out) const {
  auto it = pending_.find(host_key(layer, e));
  if (it == pending_.end()) return false;
  *out = std::move(it->second);
  pending_.erase(it);
  if (out->host_slot < 0) --pending_buffers_;
  uint8_t* dst = out->host_slot >= 0 ? host_buf_[size_t(out->host_slot)].data() : out->buf.data();
  Status st = finish_read_locked(out->job, layer, e, dst);
  if (!st.ok()) {
    if (out->host_slot >= 0) {
      host_->release(out->host_slot);
      host_->evict_slot(out->host_slot);
    } else {
      (void)reader_->drain(out->buf.data(), out->buf.size());
    }
    return st;
  }
  ++stats_.prefetch_used;
  return true;
}

void TieredExperts::retire_pending_locked(int keep_layer) const {
  for (auto it = pending_.begin(); it != pending_.end();) {
    const int layer = int(it->first >> 32), e = int(it->first & 0xffffffff);
    if (layer == keep_layer) {
      ++it;
      continue;
    }
    Pending p = std::move(it->second);
    it = pending_.erase(it);
    uint8_t* dst = p.host_slot >= 0 ? host_buf_[size_t(p.host_slot)].data() : p.buf.data();
    const Status st = finish_read_locked(p.job, layer, e, dst);
    if (p.host_slot >= 0) {
      host_->release(p.host_slot);  // the record stays cached (when it is good)
      if (!st.ok()) host_->evict_slot(p.host_slot);
    } else {
      --pending_buffers_;
      (void)reader_->drain(p.buf.data(), p.buf.size());
    }
    ++stats_.prefetch_unused;
  }
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
  if (h.hit && !host_stale_[size_t(h.slot)]) {
    ++stats_.host_hits;
    return h.slot;
  }
  ++stats_.host_misses;
  host_stale_[size_t(h.slot)] = 0;  // read below (or evicted)
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
  Status st = read_record_locked(layer, e, b.data());
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
    Status st = fetch_record_locked(layer, e, spare->data());
    if (!st.ok()) {
      (void)reader_->drain(spare->data(), spare->size());  // the caller frees it: no read may still target it
      return st;
    }
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

bool TieredExperts::resident(int layer, int e) const {
  std::lock_guard lock(mu_);
  return layer >= 0 && layer < int(layers_.size()) && resident_locked(layer, e);
}

bool TieredExperts::resident_locked(int layer, int e) const {
  const Layer& L = layers_[size_t(layer)];
  if (!opt_.host_views && L.slots && L.slots->find(e) >= 0) return true;
  if (!host_ || host_->n_slots() == 0) return false;
  const int h = host_->find(host_key(layer, e));
  return h >= 0 && !host_stale_[size_t(h)];
}

void TieredExperts::release_epoch_locked(Epoch& e) const {
  if (e.layer >= 0)
    for (int s : e.slot_pins) layers_[size_t(e.layer)].slots->release(s);
  for (int h : e.host_pins) host_->release(h);
  for (AlignedBuffer& b : e.overflow) (void)reader_->drain(b.data(), b.size());
  e = Epoch{};
}

void TieredExperts::begin_epoch_locked(int layer) const {
  // The ending epoch's pins and spare buffers are kept through epochs_kept - 1 more epochs (its
  // views may still be read); layer -1 ends every epoch.
  Epoch ended;
  ended.layer = epoch_layer_;
  if (epoch_layer_ >= 0) ended.slot_pins.swap(layers_[size_t(epoch_layer_)].epoch_pins);
  ended.host_pins.swap(epoch_host_pins_);
  ended.overflow.swap(overflow_);
  kept_.push_back(std::move(ended));
  const size_t keep = layer < 0 ? 0 : size_t(std::max(1, opt_.epochs_kept) - 1);
  while (kept_.size() > keep) {
    release_epoch_locked(kept_.front());
    kept_.pop_front();
  }
  retire_pending_locked(layer);
  epoch_layer_ = layer;
}

Status TieredExperts::replay_lookup(int layer, int e) const {
  std::lock_guard lock(mu_);
  if (host_->n_slots() == 0) return Status();  // no host cache: nothing to warm
  if (!opt_.host_views) return FB_ERROR(kInvalidArgument) << "replay_lookup replays the host cache of host views only";
  if (layer < 0 || layer >= int(layers_.size()) || e < 0 || e >= loc_->n_experts(layer))
    return FB_ERROR(kInvalidArgument) << "expert " << e << " of layer " << layer << " is not in the tiers";
  if (layer != epoch_layer_) begin_epoch_locked(layer);
  ++stats_.warm_lookups;
  const SlotCache::Lookup h = host_->acquire(host_key(layer, e));
  if (h.slot < 0) return Status();  // every record pinned: expert() would read past the cache
  if (!h.hit) host_stale_[size_t(h.slot)] = 1;
  epoch_host_pins_.push_back(h.slot);
  return Status();
}

Result<int64_t> TieredExperts::fill_host(int in_flight) {
  std::lock_guard lock(mu_);
  begin_epoch_locked(-1);  // the warm-up's last epoch ends: no record stays pinned
  const uint64_t stride = loc_->layout().stride_bytes;
  struct Fill {
    int slot = -1, layer = -1, e = -1;
    ReplicaReader::Job job = 0;
  };
  std::vector<Fill> q;
  size_t head = 0;
  int64_t filled = 0;
  Status err;
  auto drop = [&](int s, const Status& st) {
    host_->evict_slot(s);
    host_stale_[size_t(s)] = 0;
    if (err.ok()) err = st;
  };
  auto finish = [&](const Fill& f) {
    Status st = reader_->wait(f.job);
    if (st.ok()) st = verify_locked(f.layer, f.e, host_buf_[size_t(f.slot)].data());
    if (!st.ok()) return drop(f.slot, st.with_context("expert " + std::to_string(f.e) + " of layer " + std::to_string(f.layer)));
    host_stale_[size_t(f.slot)] = 0;
    ++filled;
  };
  for (int s = 0; s < host_->n_slots(); ++s) {
    const int64_t key = host_->key_of(s);
    AlignedBuffer& b = host_buf_[size_t(s)];
    if (key < 0 || (b.size() > 0 && !host_stale_[size_t(s)])) continue;
    if (b.size() == 0) {
      if (ledger_) {
        auto g = ledger_->admit(memory::Tier::kHost, memory::Kind::kElastic, stride, "host expert cache");
        if (!g.ok()) {  // no room: the record leaves the cache, as a lookup would read past it
          host_->evict_slot(s);
          host_stale_[size_t(s)] = 0;
          continue;
        }
        host_grants_[size_t(s)] = std::move(g.value());
      }
      b = AlignedBuffer(stride);
      if (opt_.on_host_alloc) opt_.on_host_alloc(b.data(), b.size());
    }
    const int layer = int(key >> 32), e = int(key & 0xffffffff);
    Status st = reader_->drain(b.data(), stride);
    const std::vector<ReadRange> r = loc_->ranges(layer, e, b.data());
    Result<ReplicaReader::Job> job = st.ok() ? reader_->submit(r) : Result<ReplicaReader::Job>(st);
    if (!job.ok()) {
      drop(s, job.status());
      continue;
    }
    ++stats_.warm_reads;
    for (const ReadRange& x : r) stats_.warm_bytes += x.nbytes;
    q.push_back(Fill{s, layer, e, *job});
    if (int(q.size() - head) >= std::max(1, in_flight)) finish(q[head++]);
  }
  while (head < q.size()) finish(q[head++]);
  if (!err.ok()) return err.with_context("filling the host expert cache");
  return filled;
}

int64_t TieredExperts::host_records_filled() const {
  std::lock_guard lock(mu_);
  int64_t n = 0;
  for (int s = 0; s < host_->n_slots(); ++s) n += host_->key_of(s) >= 0 && host_buf_[size_t(s)].size() > 0 && !host_stale_[size_t(s)];
  return n;
}

model::ExpertWeights TieredExperts::expert(int layer, int e) const {
  std::lock_guard lock(mu_);
  if (layer != epoch_layer_) begin_epoch_locked(layer);
  if (opt_.host_views && host_->n_slots() > 0) {
    // The record itself, pinned in the host cache until the epoch ends (no first-tier copy).
    FB_CHECK(layer >= 0 && layer < int(layers_.size())) << "layer " << layer;
    FB_CHECK(e >= 0 && e < loc_->n_experts(layer)) << "expert " << e << " of layer " << layer;
    Pending p;
    auto claimed = claim_pending_locked(layer, e, &p);
    FB_CHECK(claimed.ok()) << claimed.status().to_string();
    if (*claimed && p.host_slot >= 0) {
      epoch_host_pins_.push_back(p.host_slot);
      return loc_->layout().view(host_buf_[size_t(p.host_slot)].data());
    }
    if (*claimed) {
      overflow_.push_back(std::move(p.buf));
      return loc_->layout().view(overflow_.back().data());
    }
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
  if (s < 0) FB_RETURN_IF_ERROR(reader_->drain(spare.data(), spare.size()));
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
  TierStats s = stats_;
  for (int d = 0; d < reader_->n_drives(); ++d) s.drives.push_back(reader_->stats(d));
  return s;
}

std::string TieredExperts::drive_report() const {
  std::lock_guard lock(mu_);
  std::ostringstream os;
  for (int d = 0; d < reader_->n_drives(); ++d) {
    const DriveStats s = reader_->stats(d);
    if (d > 0) os << "\n";
    os << "drive " << d << " " << s.root << ": " << s.n_reads << " reads, " << double(s.bytes_read) / 1e6 << " MB, ~" << s.bytes_per_s / 1e9
       << " GB/s, " << s.n_errors << " errors, " << s.n_hedges << " hedges (" << s.n_hedges_won << " won), " << s.n_late << " late";
    if (s.failed) os << ", FAILED: " << s.last_error;
  }
  return os.str();
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

uint64_t TieredExperts::host_bytes() const {
  std::lock_guard lock(mu_);
  uint64_t n = staging_.size();
  for (const Layer& L : layers_)
    for (const AlignedBuffer& b : L.buffers) n += b.size();
  for (const AlignedBuffer& b : host_buf_) n += b.size();
  for (const AlignedBuffer& b : overflow_) n += b.size();
  for (const Epoch& k : kept_)
    for (const AlignedBuffer& b : k.overflow) n += b.size();
  for (const auto& [key, p] : pending_) n += p.buf.size();
  return n;
}

Result<std::shared_ptr<TieredExperts>> tiered_experts_for(const loader::Snapshot& snap, const std::vector<std::string>& store_dirs,
                                                          TieredOptions opt, memory::Ledger* ledger) {
  if (store_dirs.empty()) return TieredExperts::create(FB_TRY(shard_locator(snap)), {snap.dir()}, opt, ledger);
  const uint64_t id = FB_TRY(model_identity(snap.dir()));
  // A replica that is gone, truncated or damaged is left out (a drive lost since convert); the
  // others serve. Only with none left is it an error.
  std::shared_ptr<const ExpertStore> store;
  std::vector<std::string> good;
  std::vector<int> index_of(store_dirs.size(), -1);  // the drive index a given replica keeps
  std::string errors;
  for (size_t i = 0; i < store_dirs.size(); ++i) {
    const std::string& dir = store_dirs[i];
    auto s = ExpertStore::open(dir, id);
    if (!s.ok()) {
      FB_LOG(kWarn) << "storage: expert-store replica " << dir << " left out: " << s.status().message();
      errors += "\n  " + s.status().message();
      continue;
    }
    if (store && s.value()->layout().stride_bytes != store->layout().stride_bytes)
      return FB_ERROR(kCorrupt) << dir << ": replica layout differs from " << good[0];
    if (!store) store = std::move(s.value());
    index_of[i] = int(good.size());
    good.push_back(dir);
  }
  if (!store) return FB_ERROR(kIo) << "no usable expert-store replica of " << store_dirs.size() << ":" << errors;
  std::vector<ReaderFault> faults;  // injected faults follow their replica; those of left-out ones are moot
  for (ReaderFault f : opt.faults)
    if (f.drive >= 0 && size_t(f.drive) < index_of.size() && index_of[size_t(f.drive)] >= 0) {
      f.drive = index_of[size_t(f.drive)];
      faults.push_back(f);
    }
  opt.faults = std::move(faults);
  return TieredExperts::create(store_locator(store), good, opt, ledger);
}

}  // namespace fb::storage
