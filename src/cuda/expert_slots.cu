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
  for (auto& [a, b] : timers_) {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  if (ready_) cudaEventDestroy(ready_);
  if (done_) cudaEventDestroy(done_);
  if (copy_) cudaStreamDestroy(copy_);
  for (void* p : pinned_host_) cudaHostUnregister(p);
}

Status DevExpertSlots::pin_host(const void* p, size_t bytes) {
  if (!p || bytes == 0) return Status();
  FB_CUDA_TRY(cudaHostRegister(const_cast<void*>(p), bytes, cudaHostRegisterDefault));
  pinned_host_.push_back(const_cast<void*>(p));
  return Status();
}

Status DevExpertSlots::copy_in(int layer, int e, int slot) {
  const model::ExpertWeights x = src_->expert(layer, e);
  const Layer& L = layers_[size_t(layer)];
  const Layout& y = layout_;
  const std::pair<const TensorView*, std::pair<uint8_t*, int64_t>> parts[] = {
      {&x.w1.w, {const_cast<uint8_t*>(L.w1.w), y.w1}}, {&x.w1.scale, {const_cast<uint8_t*>(L.w1.s), y.s1}},
      {&x.w2.w, {const_cast<uint8_t*>(L.w2.w), y.w2}}, {&x.w2.scale, {const_cast<uint8_t*>(L.w2.s), y.s2}},
      {&x.w3.w, {const_cast<uint8_t*>(L.w3.w), y.w3}}, {&x.w3.scale, {const_cast<uint8_t*>(L.w3.s), y.s3}}};
  for (const auto& [view, dst] : parts) {
    if (view->nbytes() != dst.second)
      return FB_ERROR(kCorrupt) << "expert " << e << " of layer " << layer << ": a tensor of " << view->nbytes() << " bytes, slots hold "
                                << dst.second;
    FB_CUDA_TRY(cudaMemcpyAsync(dst.first + int64_t(slot) * dst.second, view->data, size_t(dst.second), cudaMemcpyHostToDevice, copy_));
  }
  stats_.copied_bytes += slot_bytes_;
  return Status();
}

Result<size_t> DevExpertSlots::take(int layer, const std::vector<int32_t>& want, size_t from, std::vector<int32_t>& slot_of,
                                    cudaStream_t compute) {
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
      continue;
    }
    ++stats_.misses;
    if (!copying) {  // the copies wait for every kernel already issued (earlier readers of the slots)
      FB_CUDA_TRY(cudaEventRecord(ready_, compute));
      FB_CUDA_TRY(cudaStreamWaitEvent(copy_, ready_, 0));
      if (used_ == timers_.size()) {
        cudaEvent_t a = nullptr, b = nullptr;
        FB_CUDA_TRY(cudaEventCreate(&a));
        FB_CUDA_TRY(cudaEventCreate(&b));
        timers_.push_back({a, b});
      }
      FB_CUDA_TRY(cudaEventRecord(timers_[used_].first, copy_));
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
  return next;
}

void DevExpertSlots::resident_first(int layer, std::vector<int32_t>& want) const { storage::resident_first(*layers_[size_t(layer)].cache, want); }

Status DevExpertSlots::join(cudaStream_t compute) {
  FB_CUDA_TRY(cudaStreamWaitEvent(compute, done_, 0));
  return Status();
}

void DevExpertSlots::release(int layer) {
  Layer& L = layers_.at(size_t(layer));
  for (int s : L.pinned) L.cache->release(s);
  L.pinned.clear();
}

void DevExpertSlots::settle() {
  for (size_t i = 0; i < used_; ++i) {
    float ms = 0;
    if (cudaEventSynchronize(timers_[i].second) == cudaSuccess && cudaEventElapsedTime(&ms, timers_[i].first, timers_[i].second) == cudaSuccess)
      stats_.copy_ms += double(ms);
  }
  used_ = 0;
}

}  // namespace fb::cuda
