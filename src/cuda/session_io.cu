// CudaExecutor::save_session / restore_session (DESIGN-AHEAD item 4): a CudaSession as exactly
// the bytes cpu::SessionCache::serialize writes (docs/formats.md "Session state"), placed through
// model::SessionLayout. The device caches hold the CPU's compact rows byte for byte (window and
// draft rows: e4m3 codes then e8m0 scales; compressed KV and index keys: e2m1 pairs with the even
// element in the low nibble, then the scales; slot = position % slots; ratio-2 tails f32
// [kTailSlots][k, g][head_dim], slot = position % kTailSlots), so nothing is converted: only where
// bytes live differs (compressed caches keep capacity past their entries; positions, tokens and
// image flags are host bookkeeping). The cache bytes cross PCIe in one copy each way, through a
// device image of the state's cache range; the per-cache copies are device-to-device. Restore
// validates everything on the host, then builds the new caches aside and swaps them in, so a
// refused or failed restore leaves the session as it was.
#include <cstring>

#include "model/session_layout.h"
#include "cuda/executor.h"

namespace fb::cuda {

namespace {

// One cache range of the state: `bytes` at blob offset `at`, on the device at `dev`.
struct CacheCopy {
  size_t at = 0;
  size_t bytes = 0;
  uint8_t* dev = nullptr;
};

// The cache ranges of session `s` laid out as `l` (rings, compressed KV, index keys, tails, draft
// rings, in stream order); empty ranges left out.
std::vector<CacheCopy> cache_copies(const model::SessionLayout& l, const CudaSession& s) {
  std::vector<CacheCopy> v;
  auto add = [&v](size_t at, size_t n, const DeviceBuffer& b) {
    if (n) v.push_back({at, n, b.get<uint8_t>()});
  };
  for (size_t i = 0; i < l.rings.size(); ++i) add(l.rings[i].data_at, l.rings[i].data_bytes(), s.rings[i].data);
  for (size_t i = 0; i < l.comp.size(); ++i) {
    const model::CompLayout& c = l.comp[i];
    add(c.kv_at, c.kv_size(), s.comp[i].kv);
    add(c.keys_at, c.keys_size(), s.comp[i].keys);
    add(c.tail_at, c.tail_size(), s.comp[i].tail);
  }
  for (size_t i = 0; i < l.draft_rings.size(); ++i) add(l.draft_rings[i].data_at, l.draft_rings[i].data_bytes(), s.draft_rings[i].data);
  return v;
}

// The blob range [lo, hi) that holds every cache byte (from the first ring's rows to the trailer;
// the small host fields inside it are copied along and overwritten).
std::pair<size_t, size_t> cache_range(const model::SessionLayout& l) {
  const size_t lo = l.rings.empty() ? l.image_at + size_t(l.next_pos) : l.rings.front().data_at;
  return {lo, l.total_bytes - 4};
}

// A session's buffers and bookkeeping must match the layout of its position (a mismatch is a bug
// of the executor, reported rather than written as a state that would not restore).
Status check_matches(const CudaSession& s, const model::SessionLayout& l) {
  const int64_t P = l.next_pos;
  if (int64_t(s.tokens.size()) != P || int64_t(s.image.size()) != P || s.rings.size() != l.rings.size() ||
      s.comp.size() != l.comp.size() || s.draft_rings.size() != l.draft_rings.size())
    return FB_ERROR(kInternal) << "cuda session at position " << P << " holds " << s.tokens.size() << " tokens, " << s.rings.size()
                               << " rings, " << s.draft_rings.size() << " draft rings";
  auto ring_ok = [](const DevRing& r, const model::RingLayout& rl) {
    return r.slots == rl.slots && r.row_bytes == rl.row_bytes && r.pos.size() == size_t(rl.slots) && r.data.bytes() >= rl.data_bytes();
  };
  for (size_t i = 0; i < l.rings.size(); ++i)
    if (!ring_ok(s.rings[i], l.rings[i])) return FB_ERROR(kInternal) << "cuda session: window ring " << i << " does not have this model's layout";
  for (size_t i = 0; i < l.draft_rings.size(); ++i)
    if (!ring_ok(s.draft_rings[i], l.draft_rings[i])) return FB_ERROR(kInternal) << "cuda session: draft ring " << i << " does not have this model's layout";
  for (size_t i = 0; i < l.comp.size(); ++i) {
    const DevCompressed& cc = s.comp[i];
    const model::CompLayout& cl = l.comp[i];
    if (cc.ratio != cl.ratio || cc.kv_bytes != cl.kv_bytes || cc.key_bytes != cl.key_bytes || (cl.ratio && cc.n_entries != cl.entries) ||
        cc.capacity < cc.n_entries || cc.tail_pos.size() != size_t(cl.tail_slots) || cc.tail.bytes() < cl.tail_size())
      return FB_ERROR(kInternal) << "cuda session: layer " << i << " holds " << cc.n_entries << " compressed entries (ratio " << cc.ratio
                                 << ") at position " << P << "; the format wants " << cl.entries;
  }
  return Status();
}

}  // namespace

Result<std::string> CudaExecutor::save_session(const model::SessionState& st) const {
  const CudaSession& s = static_cast<const CudaSession&>(st);
  // A session that never ran has no device buffers yet: its state is the fresh one (zero rows,
  // no positions), which is what the CPU writes for a fresh session.
  if (!s.allocated()) {
    if (s.next_pos != 0) return FB_ERROR(kInternal) << "cuda session at position " << s.next_pos << " without caches";
    return model::fresh_session_bytes(cfg_, model_id_);
  }
  const model::SessionLayout l = model::session_layout(cfg_, s.next_pos);
  FB_RETURN_IF_ERROR(check_matches(s, l));
  std::string out(l.total_bytes, '\0');
  const auto [lo, hi] = cache_range(l);
  if (hi > lo) {
    // Gather the caches into a device image of [lo, hi), then one device-to-host copy. The
    // stream orders this after every step already issued on the session.
    DeviceBuffer image;
    FB_RETURN_IF_ERROR(image.alloc(hi - lo));
    for (const CacheCopy& c : cache_copies(l, s))
      FB_CUDA_TRY(cudaMemcpyAsync(image.get<uint8_t>() + (c.at - lo), c.dev, c.bytes, cudaMemcpyDeviceToDevice, stream_));
    FB_CUDA_TRY(cudaMemcpyAsync(out.data() + lo, image.get(), hi - lo, cudaMemcpyDeviceToHost, stream_));
    FB_CUDA_TRY(cudaStreamSynchronize(stream_));
  }
  model::SessionFields f;
  f.tokens = s.tokens.data();
  f.image = s.image.data();
  for (const DevRing& r : s.rings) f.ring_pos.push_back(r.pos.data());
  for (const DevCompressed& cc : s.comp) f.tail_pos.push_back(cc.tail_pos.data());
  for (const DevRing& r : s.draft_rings) f.draft_pos.push_back(r.pos.data());
  model::write_session_fields(l, model_id_, f, out.data());
  model::seal_session(out.data(), l.total_bytes);
  return out;
}

Status CudaExecutor::restore_session(model::SessionState& st, std::string_view bytes) const {
  CudaSession& s = static_cast<CudaSession&>(st);
  // Everything is checked before anything is allocated or changed (cpu::SessionCache::restore's rules).
  const model::SessionLayout l = FB_TRY(model::parse_session_layout(cfg_, bytes, model_id_));
  const int64_t P = l.next_pos;
  // The new state is built aside: an allocation or copy failure leaves `s` as it was.
  CudaSession fresh(cfg_);
  FB_RETURN_IF_ERROR(fresh.ensure_allocated(stream_));
  for (size_t i = 0; i < l.comp.size(); ++i)
    if (l.comp[i].entries > 0) FB_RETURN_IF_ERROR(fresh.reserve_compressed(int(i), l.comp[i].entries, stream_));
  fresh.next_pos = P;
  fresh.tokens.resize(size_t(P));
  fresh.image.resize(size_t(P));
  if (P > 0) {
    std::memcpy(fresh.tokens.data(), bytes.data() + l.tokens_at, size_t(P) * sizeof(int32_t));
    std::memcpy(fresh.image.data(), bytes.data() + l.image_at, size_t(P));
  }
  auto ring_pos = [&bytes](DevRing& r, const model::RingLayout& rl) { std::memcpy(r.pos.data(), bytes.data() + rl.pos_at, size_t(rl.slots) * 8); };
  for (size_t i = 0; i < l.rings.size(); ++i) ring_pos(fresh.rings[i], l.rings[i]);
  for (size_t i = 0; i < l.draft_rings.size(); ++i) ring_pos(fresh.draft_rings[i], l.draft_rings[i]);
  for (size_t i = 0; i < l.comp.size(); ++i) {
    DevCompressed& cc = fresh.comp[i];
    const model::CompLayout& cl = l.comp[i];
    cc.n_entries = cl.entries;
    if (cl.tail_slots) std::memcpy(cc.tail_pos.data(), bytes.data() + cl.tail_pos_at, size_t(cl.tail_slots) * 8);
  }
  FB_RETURN_IF_ERROR(check_matches(fresh, l));
  const auto [lo, hi] = cache_range(l);
  if (hi > lo) {
    // One host-to-device copy of the cache range (pageable: staging it through pinned memory
    // would add a host copy of the same size), then each cache from the device image.
    DeviceBuffer image;
    FB_RETURN_IF_ERROR(image.alloc(hi - lo));
    FB_CUDA_TRY(cudaMemcpyAsync(image.get(), bytes.data() + lo, hi - lo, cudaMemcpyHostToDevice, stream_));
    for (const CacheCopy& c : cache_copies(l, fresh))
      FB_CUDA_TRY(cudaMemcpyAsync(c.dev, image.get<uint8_t>() + (c.at - lo), c.bytes, cudaMemcpyDeviceToDevice, stream_));
    FB_CUDA_TRY(cudaStreamSynchronize(stream_));
  }
  s = std::move(fresh);
  return Status();
}

}  // namespace fb::cuda
