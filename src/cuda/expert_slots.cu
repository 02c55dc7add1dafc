// DevExpertSlots (expert_slots.h): HBM slots of the routed experts, filled from an ExpertSource.
#include "cuda/expert_slots.h"

#include <algorithm>

#include "base/check.h"

namespace fb::cuda {

namespace {

Status alloc_array(DeviceBuffer& b, int64_t per_slot, int n) { return b.alloc(size_t(per_slot) * size_t(n)); }

}  // namespace

Result<std::unique_ptr<DevExpertSlots>> DevExpertSlots::create(const model::Config& c, std::shared_ptr<const model::ExpertSource> src,
                                                               int slots, storage::EvictionPolicy policy, int staging, int lfu_aging) {
  if (!src) return FB_ERROR(kInvalidArgument) << "expert slots need an expert source";
  if (slots < 1) return FB_ERROR(kInvalidArgument) << "expert slots per layer must be >= 1 (got " << slots << ")";
  if (staging < 0) return FB_ERROR(kInvalidArgument) << "staging slots must be >= 0";
  std::unique_ptr<DevExpertSlots> d(new DevExpertSlots());
  d->src_ = std::move(src);
  d->staging_ = staging;
  d->layers_.resize(size_t(c.n_total_layers()));
  bool have_layout = false;
  for (int l = 0; l < c.n_total_layers(); ++l) {
    const int E = c.roles[size_t(l)].n_experts;
    if (E <= slots) continue;  // no more experts than slots: the executor keeps them all resident
    const model::ExpertWeights x = d->src_->expert(l, 0);
    const Layout lay{x.w1.w.nbytes(), x.w1.scale.nbytes(), x.w2.w.nbytes(), x.w2.scale.nbytes(), x.w3.w.nbytes(), x.w3.scale.nbytes()};
    if (!have_layout) {
      d->layout_ = lay;
      have_layout = true;
    } else if (lay.w1 != d->layout_.w1 || lay.s1 != d->layout_.s1 || lay.w2 != d->layout_.w2 || lay.s2 != d->layout_.s2 ||
               lay.w3 != d->layout_.w3 || lay.s3 != d->layout_.s3) {
      return FB_ERROR(kCorrupt) << "routed experts of layer " << l << " differ in size from the first layer's";
    }
    const int S = slots + staging;  // array entries: the cache's slots, then the staging slots
    Layer& L = d->layers_[size_t(l)];
    L.cache = std::make_unique<storage::SlotCache>(slots, policy, lfu_aging);
    L.n_experts = E;
    FB_RETURN_IF_ERROR(alloc_array(L.bw1, lay.w1, S));
    FB_RETURN_IF_ERROR(alloc_array(L.bs1, lay.s1, S));
    FB_RETURN_IF_ERROR(alloc_array(L.bw2, lay.w2, S));
    FB_RETURN_IF_ERROR(alloc_array(L.bs2, lay.s2, S));
    FB_RETURN_IF_ERROR(alloc_array(L.bw3, lay.w3, S));
    FB_RETURN_IF_ERROR(alloc_array(L.bs3, lay.s3, S));
    auto view = [](const model::Fp4Linear& f, const DeviceBuffer& w, const DeviceBuffer& s, int64_t wb, int64_t sb) {
      Fp4W v;
      v.w = w.get<uint8_t>();
      v.s = s.get<uint8_t>();
      v.N = f.w.dim(0);
      v.K = f.w.dim(1) * 2;
      v.w_stride = wb;
      v.s_stride = sb;
      return v;
    };
    L.w1 = view(x.w1, L.bw1, L.bs1, lay.w1, lay.s1);
    L.w2 = view(x.w2, L.bw2, L.bs2, lay.w2, lay.s2);
    L.w3 = view(x.w3, L.bw3, L.bs3, lay.w3, lay.s3);
  }
  d->slot_bytes_ = uint64_t(d->layout_.total());
  FB_CUDA_TRY(cudaStreamCreateWithFlags(&d->copy_, cudaStreamNonBlocking));
  FB_CUDA_TRY(cudaEventCreateWithFlags(&d->ready_, cudaEventDisableTiming));
  FB_CUDA_TRY(cudaEventCreateWithFlags(&d->done_, cudaEventDisableTiming));
  return Result<std::unique_ptr<DevExpertSlots>>(std::move(d));
}

DevExpertSlots::~DevExpertSlots() {
  if (copy_) cudaStreamSynchronize(copy_);
  if (prefetch_) cudaStreamSynchronize(prefetch_);
  for (auto* t : {&timers_, &pf_timers_})
    for (auto& [a, b] : *t) {
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
  for (Staged& g : stage_) {
    if (g.filled) cudaEventDestroy(g.filled);
    if (g.free) cudaEventDestroy(g.free);
  }
  for (Layer& L : layers_)
    for (cudaEvent_t ev : L.read_done)
      if (ev) cudaEventDestroy(ev);
  if (prefetch_) cudaStreamDestroy(prefetch_);
  if (ready_) cudaEventDestroy(ready_);
  if (done_) cudaEventDestroy(done_);
  if (copy_) cudaStreamDestroy(copy_);
  for (void* p : pinned_host_) cudaHostUnregister(p);
}

uint64_t DevExpertSlots::device_bytes() const {
  uint64_t n = 0;
  for (const Layer& L : layers_)
    for (const DeviceBuffer* b : {&L.bw1, &L.bs1, &L.bw2, &L.bs2, &L.bw3, &L.bs3}) n += b->bytes();
  for (const Staged& g : stage_)
    for (const DeviceBuffer* b : {&g.bw1, &g.bs1, &g.bw2, &g.bs2, &g.bw3, &g.bs3}) n += b->bytes();
  return n;
}

Status DevExpertSlots::pin_host(const void* p, size_t bytes) {
  if (!p || bytes == 0) return Status();
  FB_CUDA_TRY(cudaHostRegister(const_cast<void*>(p), bytes, cudaHostRegisterDefault));
  pinned_host_.push_back(const_cast<void*>(p));
  return Status();
}

Status DevExpertSlots::copy_expert(int layer, int e, const Fp4W& w1, const Fp4W& w2, const Fp4W& w3, int entry, cudaStream_t st) {
  const model::ExpertWeights x = src_->expert(layer, e);
  const Layout& y = layout_;
  const std::pair<const TensorView*, std::pair<const uint8_t*, int64_t>> parts[] = {
      {&x.w1.w, {w1.w, y.w1}}, {&x.w1.scale, {w1.s, y.s1}}, {&x.w2.w, {w2.w, y.w2}},
      {&x.w2.scale, {w2.s, y.s2}}, {&x.w3.w, {w3.w, y.w3}}, {&x.w3.scale, {w3.s, y.s3}}};
  for (const auto& [view, dst] : parts) {
    if (view->nbytes() != dst.second)
      return FB_ERROR(kCorrupt) << "expert " << e << " of layer " << layer << ": a tensor of " << view->nbytes() << " bytes, slots hold "
                                << dst.second;
    uint8_t* to = const_cast<uint8_t*>(dst.first) + int64_t(entry) * dst.second;
    FB_CUDA_TRY(cudaMemcpyAsync(to, view->data, size_t(dst.second), cudaMemcpyHostToDevice, st));
  }
  return Status();
}

Status DevExpertSlots::copy_in(int layer, int e, int slot) {
  const Layer& L = layers_[size_t(layer)];
  FB_RETURN_IF_ERROR(copy_expert(layer, e, L.w1, L.w2, L.w3, slot, copy_));
  stats_.copied_bytes += slot_bytes_;
  return Status();
}

Status DevExpertSlots::timer_begin(cudaStream_t st, std::vector<std::pair<cudaEvent_t, cudaEvent_t>>& timers, size_t& used) {
  if (used == timers.size()) {
    cudaEvent_t a = nullptr, b = nullptr;
    FB_CUDA_TRY(cudaEventCreate(&a));
    FB_CUDA_TRY(cudaEventCreate(&b));
    timers.push_back({a, b});
  }
  FB_CUDA_TRY(cudaEventRecord(timers[used].first, st));
  return Status();
}

Result<size_t> DevExpertSlots::take(int layer, const std::vector<int32_t>& want, size_t from, std::vector<int32_t>& slot_of,
                                    cudaStream_t compute, bool per_slot) {
  Layer& L = layers_.at(size_t(layer));
  if (!L.cache) return FB_ERROR(kInternal) << "layer " << layer << " has no expert slots";
  if (!L.pinned.empty()) release(layer);  // a wave an error left pinned
  bool copying = false;
  std::vector<storage::WaveTake> wave;
  const size_t next = storage::take_wave(*L.cache, want, from, staging_, L.pinned, wave);  // the policy (storage::SlotSim replays it)
  for (const storage::WaveTake& t : wave) {
    const int32_t e = t.expert;
    const int slot = t.entry;
    slot_of.at(size_t(e)) = slot;
    if (t.staged) ++stats_.bypassed;
    if (t.hit) {
      ++stats_.hits;
      if (std::find(L.predicted.begin(), L.predicted.end(), e) != L.predicted.end()) ++stats_.predict_used;
      continue;
    }
    ++stats_.misses;
    if (per_slot) {
      // Only the slot's own last reader (mark_read) must be done: this copy overlaps the
      // kernels of the other slots' experts (each copy timed alone, its wait excluded).
      if (size_t(slot) < L.read_marked.size() && L.read_marked[size_t(slot)])
        FB_CUDA_TRY(cudaStreamWaitEvent(copy_, L.read_done[size_t(slot)], 0));
      FB_RETURN_IF_ERROR(timer_begin(copy_, timers_, used_));
      FB_RETURN_IF_ERROR(copy_in(layer, e, slot));
      FB_CUDA_TRY(cudaEventRecord(timers_[used_].second, copy_));
      ++used_;
      continue;
    }
    if (!copying) {  // the copies wait for every kernel already issued (earlier readers of the slots)
      FB_CUDA_TRY(cudaEventRecord(ready_, compute));
      FB_CUDA_TRY(cudaStreamWaitEvent(copy_, ready_, 0));
      FB_RETURN_IF_ERROR(timer_begin(copy_, timers_, used_));
      copying = true;
    }
    FB_RETURN_IF_ERROR(copy_in(layer, e, slot));
  }
  if (copying) {
    FB_CUDA_TRY(cudaEventRecord(timers_[used_].second, copy_));
    ++used_;
  }
  FB_CUDA_TRY(cudaEventRecord(done_, copy_));
  ++stats_.waves;
  if (from == 0) ++stats_.calls;
  L.predicted.clear();  // a guess the first wave did not use was wrong (a later wave's use is not counted)
  return next;
}

bool DevExpertSlots::predict_ok() const {
  // A source whose views are valid only until its next call for another layer (a tiered source
  // keeping one epoch) would drop this layer's views while its copies may still read them.
  return src_->view_layers() != 1;
}

Status DevExpertSlots::predict(int layer, const std::vector<int32_t>& experts, int max) {
  Layer& L = layers_.at(size_t(layer));
  if (!L.cache) return Status();
  if (!L.pinned.empty()) release(layer);  // a wave an error left pinned
  L.predicted.clear();
  // Guesses whose bytes are not ready in host memory (or a source whose views would expire) are
  // not copied now: their drive reads start a layer early instead (ExpertSource::prefetch into
  // host cache records; the layer's own routing then finds them on their way).
  const bool copy_ok = predict_ok();
  std::vector<int> hint;
  bool copying = false;
  int taken = 0;
  for (const int32_t e : experts) {
    if (taken >= max) break;
    if (e < 0 || e >= L.n_experts) return FB_ERROR(kInternal) << "predicted expert " << e << " of layer " << layer;
    if (L.cache->find(e) >= 0) continue;  // resident
    ++taken;
    if (!copy_ok || !src_->ready(layer, e)) {
      hint.push_back(int(e));
      continue;
    }
    const int slot = L.cache->place(e);
    if (slot < 0) continue;  // resident (or every slot pinned)
    if (!copying) {
      FB_RETURN_IF_ERROR(timer_begin(copy_, timers_, used_));
      copying = true;
    }
    FB_RETURN_IF_ERROR(copy_in(layer, e, slot));
    L.predicted.push_back(e);
  }
  if (copying) {
    FB_CUDA_TRY(cudaEventRecord(timers_[used_].second, copy_));
    ++used_;
  }
  if (!hint.empty()) src_->prefetch(layer, hint);
  stats_.predict_hinted += hint.size();
  stats_.predicted += L.predicted.size();
  stats_.predict_bytes += uint64_t(L.predicted.size()) * slot_bytes_;
  return Status();
}

void DevExpertSlots::resident_first(int layer, std::vector<int32_t>& want) const {
  const storage::SlotCache& cache = *layers_[size_t(layer)].cache;
  // The misses' reads start now, the moment the router has chosen (a tiered source prefetches
  // from its drives; other sources ignore the hint), and run while the hits are used.
  std::vector<int> misses;
  for (const int32_t e : want)
    if (cache.find(e) < 0) misses.push_back(int(e));
  if (!misses.empty()) src_->prefetch(layer, misses);
  storage::resident_first(cache, want);
}

std::vector<int32_t> DevExpertSlots::take_host(int layer, std::vector<int32_t>& want, const std::vector<int>& rows, double copy_ms, double host_ms) {
  std::vector<int32_t> host;
  storage::SlotCache& cache = *layers_[size_t(layer)].cache;
  std::vector<int32_t> misses;
  for (const int32_t e : want)
    if (cache.find(e) < 0) misses.push_back(e);
  std::stable_sort(misses.begin(), misses.end(), [&](int32_t a, int32_t b) {
    const uint64_t ua = cache.uses_of(a), ub = cache.uses_of(b);
    return ua != ub ? ua < ub : a < b;
  });
  double copies = copy_ms * double(misses.size()), work = 0;
  for (const int32_t e : misses) {
    const double w = work + host_ms * double(std::max(1, rows[size_t(e)])), c = copies - copy_ms;
    if (std::max(w, c) >= std::max(work, copies)) break;
    work = w;
    copies = c;
    host.push_back(e);
  }
  if (host.empty()) return host;
  std::sort(host.begin(), host.end());
  for (const int32_t e : host) cache.count_elsewhere(e);
  stats_.misses += host.size();
  std::vector<int32_t> rest;
  for (const int32_t e : want)
    if (!std::binary_search(host.begin(), host.end(), e)) rest.push_back(e);
  want.swap(rest);
  return host;
}

Status DevExpertSlots::replay(int layer, std::vector<int32_t> want, const std::function<void(int32_t)>& on_miss) {
  Layer& L = layers_.at(size_t(layer));
  if (!L.cache) return FB_ERROR(kInternal) << "layer " << layer << " has no expert slots";
  if (!L.pinned.empty()) release(layer);
  if (L.replay_keys.empty())
    for (int s = 0; s < L.cache->n_slots(); ++s) L.replay_keys.push_back(L.cache->key_of(s));
  storage::replay_call(*L.cache, std::move(want), staging_, [&](const storage::WaveTake& t) {
    if (!t.hit && on_miss) on_miss(t.expert);
  });
  return Status();
}

Result<int64_t> DevExpertSlots::load_replayed() {
  FB_CUDA_TRY(cudaDeviceSynchronize());  // no kernel may still read a slot whose bytes change
  int64_t n = 0;
  for (int l = 0; l < int(layers_.size()); ++l) {
    Layer& L = layers_[size_t(l)];
    if (!L.cache || L.replay_keys.empty()) continue;
    for (int s = 0; s < L.cache->n_slots(); ++s) {
      const int64_t key = L.cache->key_of(s);
      if (key < 0 || key == L.replay_keys[size_t(s)]) continue;
      FB_RETURN_IF_ERROR(copy_in(l, int(key), s));
      ++n;
    }
    L.replay_keys.clear();
  }
  FB_CUDA_TRY(cudaStreamSynchronize(copy_));
  return n;
}

Status DevExpertSlots::join(cudaStream_t compute) {
  FB_CUDA_TRY(cudaStreamWaitEvent(compute, done_, 0));
  return Status();
}

void DevExpertSlots::release(int layer) {
  Layer& L = layers_.at(size_t(layer));
  for (int s : L.pinned) L.cache->release(s);
  L.pinned.clear();
}

int64_t DevExpertSlots::evict_all() {
  int64_t n = 0;
  for (Layer& L : layers_)
    if (L.cache)
      for (int s = 0; s < L.cache->n_slots(); ++s) n += L.cache->evict_slot(s) ? 1 : 0;
  for (Layer& L : layers_) L.predicted.clear();
  drop_staged();
  return n;
}

void DevExpertSlots::settle() {
  auto sum = [](std::vector<std::pair<cudaEvent_t, cudaEvent_t>>& timers, size_t& used, double& total) {
    for (size_t i = 0; i < used; ++i) {
      float ms = 0;
      if (cudaEventSynchronize(timers[i].second) == cudaSuccess && cudaEventElapsedTime(&ms, timers[i].first, timers[i].second) == cudaSuccess)
        total += double(ms);
    }
    used = 0;
  };
  sum(timers_, used_, stats_.copy_ms);
  sum(pf_timers_, pf_used_, stats_.prefetch_ms);
}

Status DevExpertSlots::reserve_prefetch(int entries) {
  if (entries < 1) return FB_ERROR(kInvalidArgument) << "prefetch entries must be >= 1 (got " << entries << ")";
  if (prefetch_entries_ >= entries) return Status();
  const Layer* first = nullptr;
  for (const Layer& L : layers_)
    if (L.cache) {
      first = &L;
      break;
    }
  if (!first) return FB_ERROR(kInvalidArgument) << "no layer has expert slots to prefetch into";
  if (!prefetch_) FB_CUDA_TRY(cudaStreamCreateWithFlags(&prefetch_, cudaStreamNonBlocking));
  FB_CUDA_TRY(cudaStreamSynchronize(prefetch_));  // the old buffers' copies (a smaller reservation)
  prefetch_entries_ = 0;
  const Layout& y = layout_;
  for (Staged& g : stage_) {
    if (!g.filled) FB_CUDA_TRY(cudaEventCreateWithFlags(&g.filled, cudaEventDisableTiming));
    if (!g.free) FB_CUDA_TRY(cudaEventCreateWithFlags(&g.free, cudaEventDisableTiming));
    FB_CUDA_TRY(cudaEventSynchronize(g.free));  // readers of the old buffers
    g.layer = -1;
    for (DeviceBuffer* b : {&g.bw1, &g.bs1, &g.bw2, &g.bs2, &g.bw3, &g.bs3}) b->reset();
    Status st = alloc_array(g.bw1, y.w1, entries);
    if (st.ok()) st = alloc_array(g.bs1, y.s1, entries);
    if (st.ok()) st = alloc_array(g.bw2, y.w2, entries);
    if (st.ok()) st = alloc_array(g.bs2, y.s2, entries);
    if (st.ok()) st = alloc_array(g.bw3, y.w3, entries);
    if (st.ok()) st = alloc_array(g.bs3, y.s3, entries);
    if (!st.ok()) {  // nothing half-reserved stays allocated
      for (Staged& h : stage_)
        for (DeviceBuffer* b : {&h.bw1, &h.bs1, &h.bw2, &h.bs2, &h.bw3, &h.bs3}) b->reset();
      return st;
    }
    auto view = [](const Fp4W& like, const DeviceBuffer& w, const DeviceBuffer& sc) {
      Fp4W v = like;  // N, K and strides of the slot arrays
      v.w = w.get<uint8_t>();
      v.s = sc.get<uint8_t>();
      return v;
    };
    g.w1 = view(first->w1, g.bw1, g.bs1);
    g.w2 = view(first->w2, g.bw2, g.bs2);
    g.w3 = view(first->w3, g.bw3, g.bs3);
  }
  prefetch_entries_ = entries;
  return Status();
}

Status DevExpertSlots::prefetch(int layer, int keep) {
  const Layer& L = layers_.at(size_t(layer));
  if (!L.cache || prefetch_entries_ == 0) return Status();
  for (const Staged& g : stage_)
    if (g.layer == layer) return Status();  // already on its way
  // A buffer no MoE call still has to read: a free one, else one not holding `keep` (the layer
  // whose call is issuing this prefetch and has not read its own buffer yet).
  int b = -1;
  for (int i = 0; i < 2 && b < 0; ++i)
    if (stage_[size_t(i)].layer < 0) b = i;
  for (int i = 0; i < 2 && b < 0; ++i)
    if (stage_[size_t(i)].layer != keep) b = i;
  if (b < 0) return FB_ERROR(kInternal) << "prefetch of layer " << layer << ": both staging buffers hold layer " << keep;
  Staged& g = stage_[size_t(b)];
  const int E = L.n_experts;
  g.layer = layer;
  g.entry_of.assign(size_t(E), -1);
  // Copies into this buffer wait for its last readers (done_staged; a buffer never read since
  // its last fill was never handed to a kernel, and copies on prefetch_ stay in order).
  FB_CUDA_TRY(cudaStreamWaitEvent(prefetch_, g.free, 0));
  int n = 0;
  for (int e = 0; e < E && n < prefetch_entries_; ++e) {
    if (L.cache->find(e) >= 0) continue;  // resident: the call hits its slot
    if (n == 0) FB_RETURN_IF_ERROR(timer_begin(prefetch_, pf_timers_, pf_used_));
    FB_RETURN_IF_ERROR(copy_expert(layer, e, g.w1, g.w2, g.w3, n, prefetch_));
    g.entry_of[size_t(e)] = n++;
  }
  if (n > 0) {
    FB_CUDA_TRY(cudaEventRecord(pf_timers_[pf_used_].second, prefetch_));
    ++pf_used_;
  }
  FB_CUDA_TRY(cudaEventRecord(g.filled, prefetch_));
  stats_.prefetched += uint64_t(n);
  stats_.prefetch_bytes += uint64_t(n) * slot_bytes_;
  return Status();
}

Status DevExpertSlots::mark_read(int layer, int entry, cudaStream_t compute) {
  Layer& L = layers_.at(size_t(layer));
  if (!L.cache || entry < 0 || entry >= entries(layer)) return FB_ERROR(kInternal) << "mark_read: entry " << entry << " of layer " << layer;
  if (L.read_done.empty()) {
    L.read_done.assign(size_t(entries(layer)), nullptr);
    L.read_marked.assign(size_t(entries(layer)), 0);
    for (cudaEvent_t& ev : L.read_done) FB_CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  }
  FB_CUDA_TRY(cudaEventRecord(L.read_done[size_t(entry)], compute));
  L.read_marked[size_t(entry)] = 1;
  return Status();
}

void DevExpertSlots::drop_staged() {
  for (Staged& g : stage_) g.layer = -1;
}

const DevExpertSlots::Staged* DevExpertSlots::staged(int layer) const {
  for (const Staged& g : stage_)
    if (g.layer == layer && prefetch_entries_ > 0) return &g;
  return nullptr;
}

Status DevExpertSlots::join_staged(int layer, cudaStream_t compute) {
  const Staged* g = staged(layer);
  if (g) FB_CUDA_TRY(cudaStreamWaitEvent(compute, g->filled, 0));
  return Status();
}

Status DevExpertSlots::done_staged(int layer, cudaStream_t compute, uint64_t used) {
  for (Staged& g : stage_)
    if (g.layer == layer) {
      FB_CUDA_TRY(cudaEventRecord(g.free, compute));
      g.layer = -1;
    }
  stats_.prefetch_used += used;
  return Status();
}

}  // namespace fb::cuda
