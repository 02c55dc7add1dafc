// Per-session state of the CPU executor in the compact formats of spec/12 §1: FP8 window rings
// (e4m3 + e8m0/32), FP4 compressed KV (e2m1 + e4m3/16), FP4 index keys (e2m1 + e8m0/32), the
// ratio-2 pending tails (position-addressed in a small ring, so re-running a position rewrites
// its slot and rollback needs no snapshot), token history (Engram), and the DSpark draft rings. Invariant: everything a
// position < n_pos contributed is present; rollback(p) keeps positions < p exactly.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "model/live_sessions.h"
#include "model/executor.h"
#include "model/session_layout.h"

namespace fb::cpu {

// The caches' geometry is the shared format's (model/session_layout.h): ring headroom past the
// window, ratio-2 tail slots, row bytes.
using model::kRingHeadroom;
using model::kTailSlots;

struct Ring {
  int slots = 0;
  int row_bytes = 0;            // head_dim e4m3 codes + head_dim/32 e8m0 scales
  std::vector<uint8_t> data;    // [slots, row_bytes]
  std::vector<int64_t> pos;     // position held by each slot, -1 = never written
  void init(int n_slots, int head_dim);
  uint8_t* slot(int64_t p) { return data.data() + size_t(p % slots) * size_t(row_bytes); }
  const uint8_t* find(int64_t p) const;  // nullptr unless the slot holds position p
};

// One layer's compressed cache: its geometry (model::comp_geometry: ratio; kv_bytes, head_dim/2
// packed e2m1 + head_dim/16 e4m3; key_bytes, index_head_dim/2 packed e2m1 + index_head_dim/32
// e8m0; the tail's size) and its rows.
struct CompressedCache : model::CompGeometry {
  std::vector<uint8_t> kv;      // [entries, kv_bytes]
  std::vector<uint8_t> keys;    // [entries, key_bytes]
  std::vector<float> tail;      // ratio 2: [kTailSlots (pos % kTailSlots)][k, g][head_dim] f32
  std::vector<int64_t> tail_pos;  // ratio 2: position held by each tail slot, -1 = never written
  int64_t n_entries() const { return kv_bytes ? int64_t(kv.size() / size_t(kv_bytes)) : 0; }
};

class SessionCache;

// The live sessions of one CpuModel, for its memory ledger (stats()). add/remove lock; totals()
// reads the sessions' sizes, so call it where no step changes them (the thread that runs the steps).
class SessionCache;
// The CPU executor's live sessions (model::LiveSessions) and their totals.
class SessionRegistry : public model::LiveSessions<SessionCache> {
 public:
  struct Totals {
    int64_t sessions = 0;
    uint64_t bytes = 0;
  };
  Totals totals() const;
};

class SessionCache final : public model::SessionState {
 public:
  explicit SessionCache(const model::Config& c);
  // Counts this session in `registry` until it is destroyed (CpuModel::new_session). A copy or a
  // moved-to SessionCache is not counted; an assigned-to one keeps its own registration.
  void track(std::shared_ptr<SessionRegistry> registry);
  // Bytes its caches have allocated (vector capacities): rings, compressed KV, index keys, tails,
  // token history, image flags, draft rings.
  uint64_t bytes() const;

  int64_t next_pos = 0;               // next position
  std::vector<int32_t> tokens;        // token per position
  std::vector<uint8_t> image;         // 1 = image-span position (Engram DEAD)
  std::vector<Ring> rings;            // per backbone layer
  std::vector<CompressedCache> comp;  // per backbone layer (ratio 0 for non-sources)
  std::vector<Ring> draft_rings;      // per draft stage; window slots, slot = pos % window

  // Forget positions >= p. Refuses (kInvalidArgument) if the rings no longer hold what the
  // next query needs (rolled back further than kRingHeadroom past overwritten slots), or if a
  // ratio-2 compressor no longer holds the pending tail of an odd p (its slot was reused by a
  // position 16 later): the caller then rolls back one position less far, or starts over.
  Status rollback(int64_t p) override;
  int64_t n_pos() const override { return next_pos; }
  void reset();

  // Plain bytes of the whole state (DESIGN-AHEAD item 4; layout in docs/formats.md): a versioned
  // header naming the model (`model_id`), every cache in its compact format, a CRC-32C trailer.
  std::string serialize(uint64_t model_id) const;
  // Replaces this state with a serialized one. Everything is validated first (magic, version,
  // model identity, every size against this config, consistency of positions and entries,
  // checksum); on any error (kCorrupt, kInvalidArgument) the session is left as it was.
  Status restore(std::string_view bytes, uint64_t model_id);

 private:
  const model::Config* config_;
  model::LiveTracker<SessionCache> tracker_;
};

}  // namespace fb::cpu
