// CudaSession (per-session compact caches on the device, host bookkeeping of positions) and the
// device RoPE tables. Mirrors cpu/session_cache.cpp: same slot rule, same rollback rule.
#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "cuda/executor.h"
#include "loader/bind.h"

namespace fb::cuda {

using model::Config;

// ---- sessions ---------------------------------------------------------------------------------

static Status init_ring(DevRing& r, int slots, int head_dim, cudaStream_t st) {
  r.slots = slots;
  r.row_bytes = head_dim + head_dim / 32;
  r.pos.assign(size_t(slots), -1);
  FB_RETURN_IF_ERROR(r.data.alloc(size_t(slots) * size_t(r.row_bytes)));
  FB_CUDA_TRY(cudaMemsetAsync(r.data.get(), 0, r.data.bytes(), st));
  return Status();
}

Status CudaSession::ensure_allocated(cudaStream_t st) {
  if (allocated_) return Status();
  const Config& c = *config_;
  rings.resize(size_t(c.n_layers));
  for (auto& r : rings) FB_RETURN_IF_ERROR(init_ring(r, c.window_size + model::kRingHeadroom, c.head_dim, st));
  comp.resize(size_t(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const auto& role = c.roles[size_t(l)];
    if (!role.kv_source) continue;
    DevCompressed& cc = comp[size_t(l)];
    cc.ratio = role.ratio;
    cc.kv_bytes = model::comp_kv_bytes(c);
    cc.key_bytes = model::comp_key_bytes(c);
    if (role.ratio == 2) {
      FB_RETURN_IF_ERROR(cc.tail.alloc(size_t(model::kTailSlots * 2 * c.head_dim) * sizeof(float)));
      FB_CUDA_TRY(cudaMemsetAsync(cc.tail.get(), 0, cc.tail.bytes(), st));
      cc.tail_pos.assign(size_t(model::kTailSlots), -1);
    }
  }
  draft_rings.resize(size_t(c.n_mtp_layers));
  for (auto& r : draft_rings) FB_RETURN_IF_ERROR(init_ring(r, c.window_size, c.head_dim, st));
  allocated_ = true;
  return Status();
}

Status CudaSession::reserve_compressed(int layer, int64_t entries, cudaStream_t st) {
  DevCompressed& cc = comp[size_t(layer)];
  if (entries <= cc.capacity) return Status();
  const int64_t cap = std::max<int64_t>({entries, 2 * cc.capacity, 64});
  DeviceBuffer kv, keys;
  FB_RETURN_IF_ERROR(kv.alloc(size_t(cap) * size_t(cc.kv_bytes)));
  FB_RETURN_IF_ERROR(keys.alloc(size_t(cap) * size_t(cc.key_bytes)));
  if (cc.n_entries > 0) {
    FB_CUDA_TRY(cudaMemcpyAsync(kv.get(), cc.kv.get(), size_t(cc.n_entries) * size_t(cc.kv_bytes), cudaMemcpyDeviceToDevice, st));
    FB_CUDA_TRY(cudaMemcpyAsync(keys.get(), cc.keys.get(), size_t(cc.n_entries) * size_t(cc.key_bytes), cudaMemcpyDeviceToDevice, st));
  }
  FB_CUDA_TRY(cudaStreamSynchronize(st));  // the old buffers are freed below
  cc.kv = std::move(kv);
  cc.keys = std::move(keys);
  cc.capacity = cap;
  return Status();
}

// Same rule as cpu::SessionCache::rollback (positions are host bookkeeping; ratio-2 tails live in
// a position ring of model::kTailSlots, so re-running a position rewrites its slot and rejected
// rows never overwrite the tail a kept odd position still needs).
Status CudaSession::rollback(int64_t p) {
  if (p < 0 || p > next_pos) return FB_ERROR(kInvalidArgument) << "rollback to " << p << " outside [0, " << next_pos << "]";
  const Config& c = *config_;
  for (const DevRing& r : rings)
    for (int64_t q = std::max<int64_t>(0, p - c.window_size + 1); q < p; ++q)
      if (!r.find(q)) return FB_ERROR(kInvalidArgument) << "rollback to " << p << ": window row " << q << " was overwritten";
  for (const DevCompressed& cc : comp)
    if (cc.ratio == 2)
      for (int64_t q = p - p % cc.ratio; q < p; ++q)
        if (cc.tail_pos.size() != size_t(model::kTailSlots) || cc.tail_pos[size_t(q % model::kTailSlots)] != q)
          return FB_ERROR(kInvalidArgument) << "rollback to " << p << ": the compressor tail of position " << q << " was overwritten";
  next_pos = p;
  tokens.resize(size_t(p));
  image.resize(size_t(p));
  for (DevCompressed& cc : comp)
    if (cc.ratio) cc.n_entries = std::min(cc.n_entries, p / cc.ratio);
  return Status();
}

Status DevRope::ensure(int64_t n, cudaStream_t st) {
  if (n <= n_pos) return Status();
  const int half = table.rope_dim / 2;
  if (n > capacity) {
    const int64_t cap = std::max<int64_t>(n, 2 * capacity);
    DeviceBuffer c, s;
    FB_RETURN_IF_ERROR(c.alloc(size_t(cap * half) * sizeof(float)));
    FB_RETURN_IF_ERROR(s.alloc(size_t(cap * half) * sizeof(float)));
    if (n_pos > 0) {
      FB_CUDA_TRY(cudaMemcpyAsync(c.get(), cos.get(), size_t(n_pos * half) * sizeof(float), cudaMemcpyDeviceToDevice, st));
      FB_CUDA_TRY(cudaMemcpyAsync(s.get(), sin.get(), size_t(n_pos * half) * sizeof(float), cudaMemcpyDeviceToDevice, st));
    }
    FB_CUDA_TRY(cudaStreamSynchronize(st));
    cos = std::move(c);
    sin = std::move(s);
    capacity = cap;
  }
  std::vector<float> hc(size_t((n - n_pos) * half)), hs(hc.size());
  for (int64_t p = n_pos; p < n; ++p) table.at(p, &hc[size_t((p - n_pos) * half)], &hs[size_t((p - n_pos) * half)]);
  FB_CUDA_TRY(cudaMemcpy(cos.get<float>() + n_pos * half, hc.data(), hc.size() * sizeof(float), cudaMemcpyHostToDevice));
  FB_CUDA_TRY(cudaMemcpy(sin.get<float>() + n_pos * half, hs.data(), hs.size() * sizeof(float), cudaMemcpyHostToDevice));
  n_pos = n;
  return Status();
}

}  // namespace fb::cuda
