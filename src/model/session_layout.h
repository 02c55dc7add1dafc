// The session-state format both executors share: the compact caches' geometry (ring slots, row
// bytes, compressor tails; spec/12 §1) and where each part of a serialized state lies
// (docs/formats.md "Session state", the bytes cpu::SessionCache::serialize writes), so an executor
// whose caches live elsewhere (the CUDA executor's device buffers) can write and read the same bytes
// without a host copy of the state: it writes the small host fields here and copies each cache
// straight to or from its offset. Backend-free. Invariant: for any state, layout + fields + caches +
// seal give exactly SessionCache::serialize's bytes, and parse_session_layout accepts exactly what
// SessionCache::restore accepts (tests/session_layout_test).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/config.h"

namespace fb::model {

// Rows a step may speculate past the committed position: rings hold window + this many slots so
// rejected rows never overwrite a slot a later query still reads (spec/12 §1, spec/13 §6.5).
constexpr int kRingHeadroom = 8;
// Ratio-2 compressor tails kept per position (slot = pos % kTailSlots): pooling at odd p reads
// p-1 and p, and rejected speculative rows (up to kRingHeadroom) must not overwrite p-1's slot.
constexpr int kTailSlots = 16;
static_assert(kTailSlots >= kRingHeadroom + 2);

// Bytes of one row of each compact cache (spec/12 §1).
// FP8 window row: head_dim e4m3 codes + head_dim/32 e8m0 scales.
constexpr int ring_row_bytes(int head_dim) { return head_dim + head_dim / 32; }
// FP4 compressed KV entry: head_dim/2 packed e2m1 + head_dim/16 e4m3 scales.
inline int comp_kv_bytes(const Config& c) { return c.head_dim / 2 + c.head_dim / 16; }
// FP4 index key: index_head_dim/2 packed e2m1 + index_head_dim/32 e8m0 scales.
inline int comp_key_bytes(const Config& c) { return c.index_head_dim / 2 + c.index_head_dim / 32; }

// Whether a session at next_pos may roll back to p (both executors' rule; positions are host
// bookkeeping): the window rows the next query at p reads, [p - window + 1, p - 1], must still be
// in every ring, and every ratio-r compressor's pending positions [p - p % r, p) in its tail ring
// of kTailSlots (re-running a position rewrites its slot, so rejected rows never overwrite the
// tail a kept odd position still needs). Rings: find(pos) non-null when held; compressed caches:
// ratio and tail_pos.
template <typename Rings, typename Comps>
Status check_rollback(const Config& c, int64_t next_pos, int64_t p, const Rings& rings, const Comps& comp) {
  if (p < 0 || p > next_pos) return FB_ERROR(kInvalidArgument) << "rollback to " << p << " outside [0, " << next_pos << "]";
  for (const auto& r : rings)
    for (int64_t q = std::max<int64_t>(0, p - c.window_size + 1); q < p; ++q)
      if (!r.find(q)) return FB_ERROR(kInvalidArgument) << "rollback to " << p << ": window row " << q << " was overwritten";
  for (const auto& cc : comp)
    if (cc.ratio == 2)
      for (int64_t q = p - p % cc.ratio; q < p; ++q)
        if (cc.tail_pos.size() != size_t(kTailSlots) || cc.tail_pos[size_t(q % kTailSlots)] != q)
          return FB_ERROR(kInvalidArgument) << "rollback to " << p << ": the compressor tail of position " << q << " was overwritten";
  return Status();
}

// The format's magic and version (SessionCache::serialize writes them).
inline constexpr char kSessionMagic[8] = {'F', 'B', 'S', 'E', 'S', 'S', '\0', '\1'};
inline constexpr uint32_t kSessionVersion = 1;

struct RingLayout {
  int32_t slots = 0, row_bytes = 0;
  size_t at = 0;       // i32 slots, i32 row bytes
  size_t pos_at = 0;   // i64 [slots] position held by each slot
  size_t data_at = 0;  // u8 [slots, row_bytes] FP8 rows
  size_t data_bytes() const { return size_t(slots) * size_t(row_bytes); }
};

// One layer's compressed cache as every executor sizes it: ratio 0 where the layer is not a KV
// source (every size 0); a ratio-2 compressor keeps kTailSlots tail slots of [k, g][head_dim] f32.
struct CompGeometry {
  int32_t ratio = 0, kv_bytes = 0, key_bytes = 0;
  int64_t tail_slots = 0;  // ratio 2: kTailSlots, else 0
  int64_t tail_floats = 0; // ratio 2: kTailSlots * 2 * head_dim f32, else 0
};
CompGeometry comp_geometry(const Config& c, int layer);

struct CompLayout : CompGeometry {
  int64_t entries = 0;     // = next_pos / ratio
  size_t at = 0;           // i32 ratio, i32 kv bytes, i32 key bytes, i64 entries
  size_t kv_at = 0;        // u8 [entries, kv_bytes] FP4 KV
  size_t keys_at = 0;      // u8 [entries, key_bytes] FP4 index keys
  size_t n_tail_at = 0;    // i64 tail slots
  size_t tail_pos_at = 0;  // i64 [tail_slots]
  size_t tail_at = 0;      // f32 [tail_slots][k, g][head_dim]
  size_t kv_size() const { return size_t(entries) * size_t(kv_bytes); }
  size_t keys_size() const { return size_t(entries) * size_t(key_bytes); }
  size_t tail_size() const { return size_t(tail_floats) * sizeof(float); }
};

struct SessionLayout {
  int64_t next_pos = 0;
  size_t tokens_at = 0;  // i32 [next_pos]
  size_t image_at = 0;   // u8 [next_pos]
  std::vector<RingLayout> rings;        // per backbone layer
  std::vector<CompLayout> comp;         // per backbone layer
  std::vector<RingLayout> draft_rings;  // per draft stage
  size_t total_bytes = 0;               // the CRC-32C trailer included
};

// The layout of this config's state at `next_pos` positions (sizes as SessionCache::reset makes
// them; compressed entries next_pos / ratio, the SessionCache invariant).
SessionLayout session_layout(const Config& c, int64_t next_pos);

// The host-side fields of a state (everything but the cache rows and the CRC); pointers into the
// caller's bookkeeping, each array as long as its layout says (tail_pos: null where no tail).
struct SessionFields {
  const int32_t* tokens = nullptr;         // [next_pos]
  const uint8_t* image = nullptr;          // [next_pos]
  std::vector<const int64_t*> ring_pos;    // [layers] -> [slots]
  std::vector<const int64_t*> tail_pos;    // [layers] -> [tail_slots]
  std::vector<const int64_t*> draft_pos;   // [stages] -> [slots]
};
// Writes the header and every host field at its offset of `out` (total_bytes long); the caller
// fills the cache ranges (data_at, kv_at, keys_at, tail_at) and then calls seal_session.
void write_session_fields(const SessionLayout& l, uint64_t model_id, const SessionFields& f, char* out);
// The CRC-32C of every byte before the trailer, into the trailer.
void seal_session(char* out, size_t total_bytes);

// Validates serialized bytes against this config and model identity with SessionCache::restore's
// rules, in its order (magic, checksum, version, identity, counts and sizes, token ids, ring slots
// holding their own positions, no trailing bytes), and returns where everything lies. Nothing is
// copied. Errors: kCorrupt (damage, truncation), kInvalidArgument (another model or shape),
// kUnsupported (another format version).
Result<SessionLayout> parse_session_layout(const Config& c, std::string_view bytes, uint64_t model_id);

// The bytes of a fresh state (no positions: every ring slot and tail empty, no entries), as a
// session that never ran serializes.
std::string fresh_session_bytes(const Config& c, uint64_t model_id);

}  // namespace fb::model
