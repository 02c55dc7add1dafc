#include "cpu/session_cache.h"

#include <algorithm>

namespace fb::cpu {

void Ring::init(int n_slots, int head_dim) {
  slots = n_slots;
  row_bytes = head_dim + head_dim / 32;
  data.assign(size_t(slots) * size_t(row_bytes), 0);
  pos.assign(size_t(slots), -1);
}

const uint8_t* Ring::find(int64_t p) const {
  if (p < 0) return nullptr;
  const size_t s = size_t(p % slots);
  return pos[s] == p ? data.data() + s * size_t(row_bytes) : nullptr;
}

SessionCache::SessionCache(const model::Config& c) : config_(&c) { reset(); }

void SessionCache::reset() {
  const model::Config& c = *config_;
  next_pos = 0;
  tokens.clear();
  image.clear();
  rings.assign(size_t(c.n_layers), Ring{});
  for (auto& r : rings) r.init(c.window_size + kRingHeadroom, c.head_dim);
  comp.assign(size_t(c.n_layers), CompressedCache{});
  for (int l = 0; l < c.n_layers; ++l) {
    const auto& role = c.roles[size_t(l)];
    if (!role.kv_source) continue;
    CompressedCache& cc = comp[size_t(l)];
    cc.ratio = role.ratio;
    cc.kv_bytes = c.head_dim / 2 + c.head_dim / 16;
    cc.key_bytes = c.index_head_dim / 2 + c.index_head_dim / 32;
    if (role.ratio == 2) {
      cc.tail.assign(size_t(kTailSlots * 2 * c.head_dim), 0.0f);
      cc.tail_pos.assign(size_t(kTailSlots), -1);
    }
  }
  draft_rings.assign(size_t(c.n_mtp_layers), Ring{});
  for (auto& r : draft_rings) r.init(c.window_size, c.head_dim);
}

Status SessionCache::rollback(int64_t p) {
  if (p < 0 || p > next_pos) return FB_ERROR(kInvalidArgument) << "rollback to " << p << " outside [0, " << next_pos << "]";
  const model::Config& c = *config_;
  // The next query at p reads positions [p - window + 1, p - 1] from every ring.
  for (const Ring& r : rings)
    for (int64_t q = std::max<int64_t>(0, p - c.window_size + 1); q < p; ++q)
      if (!r.find(q)) return FB_ERROR(kInvalidArgument) << "rollback to " << p << ": window row " << q << " was overwritten";
  // A ratio-r compressor at p pools positions [p - p % r, p + r): the pending ones must remain.
  for (const CompressedCache& cc : comp)
    if (cc.ratio == 2)
      for (int64_t q = p - p % cc.ratio; q < p; ++q)
        if (cc.tail_pos[size_t(q % kTailSlots)] != q)
          return FB_ERROR(kInvalidArgument) << "rollback to " << p << ": the compressor tail of position " << q << " was overwritten";
  next_pos = p;
  tokens.resize(size_t(p));
  image.resize(size_t(p));
  for (CompressedCache& cc : comp) {
    if (!cc.ratio) continue;
    const size_t keep = size_t(p / cc.ratio);
    cc.kv.resize(keep * size_t(cc.kv_bytes));
    cc.keys.resize(keep * size_t(cc.key_bytes));
  }
  return Status();
}

}  // namespace fb::cpu
