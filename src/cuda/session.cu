// CudaSession (per-session compact caches on the device, host bookkeeping of positions) and the
// device RoPE tables. Mirrors cpu/session_cache.cpp: same slot rule, same rollback rule.
#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "base/check.h"
#include "cuda/executor.h"
#include "loader/bind.h"

namespace fb::cuda {

using model::Config;

// ---- sessions ---------------------------------------------------------------------------------

CudaSessionRegistry::Totals CudaSessionRegistry::totals() const {
  Totals t;
  for_each([&t](const CudaSession& s) {
    ++t.sessions;
    t.device_bytes += s.device_bytes();
    t.host_bytes += s.host_bytes();
  });
  return t;
}

void CudaSession::track(std::shared_ptr<CudaSessionRegistry> registry) { tracker_.track(std::move(registry), this); }

uint64_t CudaSession::device_bytes() const {
  uint64_t n = 0;
  for (const DevRing& r : rings) n += r.data.bytes();
  for (const DevRing& r : draft_rings) n += r.data.bytes();
  for (const DevCompressed& c : comp) n += c.kv.bytes() + c.keys.bytes() + c.tail.bytes();
  return n;
}

uint64_t CudaSession::host_bytes() const {
  const auto vb = [](const auto& v) { return uint64_t(v.capacity()) * sizeof(v[0]); };
  uint64_t n = vb(tokens) + vb(image);
  for (const DevRing& r : rings) n += vb(r.pos);
  for (const DevRing& r : draft_rings) n += vb(r.pos);
  for (const DevCompressed& c : comp) n += vb(c.tail_pos);
  return n;
}

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
    const model::CompGeometry g = model::comp_geometry(c, l);
    DevCompressed& cc = comp[size_t(l)];
    cc.ratio = g.ratio;
    cc.kv_bytes = g.kv_bytes;
    cc.key_bytes = g.key_bytes;
    if (g.tail_slots) {
      FB_RETURN_IF_ERROR(cc.tail.alloc(size_t(g.tail_floats) * sizeof(float)));
      FB_CUDA_TRY(cudaMemsetAsync(cc.tail.get(), 0, cc.tail.bytes(), st));
      cc.tail_pos.assign(size_t(g.tail_slots), -1);
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

// The same rule as cpu::SessionCache::rollback (model::check_rollback).
Status CudaSession::rollback(int64_t p) {
  FB_RETURN_IF_ERROR(model::check_rollback(*config_, next_pos, p, rings, comp));
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
  // Positions are independent: a long prompt's first step (e.g. 4K -> 32K positions, ~3M libm
  // calls, ~55 ms on one core: the worst round of the other sessions) fills them on every core.
  const auto fill = [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) table.at(p, &hc[size_t((p - n_pos) * half)], &hs[size_t((p - n_pos) * half)]);
  };
  const int64_t span = n - n_pos, cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t parts = std::min<int64_t>(cores, span / 1024);
  if (parts <= 1) {
    fill(n_pos, n);
  } else {
    std::vector<std::thread> pool;
    for (int64_t k = 1; k < parts; ++k) pool.emplace_back(fill, n_pos + span * k / parts, n_pos + span * (k + 1) / parts);
    fill(n_pos, n_pos + span / parts);
    for (std::thread& t : pool) t.join();
  }
  FB_CUDA_TRY(cudaMemcpy(cos.get<float>() + n_pos * half, hc.data(), hc.size() * sizeof(float), cudaMemcpyHostToDevice));
  FB_CUDA_TRY(cudaMemcpy(sin.get<float>() + n_pos * half, hs.data(), hs.size() * sizeof(float), cudaMemcpyHostToDevice));
  n_pos = n;
  return Status();
}

}  // namespace fb::cuda
