// Engram tables on the drives (issue 22, MISSION item 7): a hot-row cache in host RAM over
// direct reads of the snapshot's shards.
//
// The release's Engram tables are 189 GiB, more than the host RAM of the box we serve on, and a
// token reads 48 random rows of 264 B (256 B of e4m3 codes and 8 B of e8m0 scales, two tensors).
// Read through the mapping, each row costs a 4 KiB page of the page cache, so the page cache
// holds 15 times fewer rows than the same RAM holds rows, and it competes with every other file.
// EngramRowCache keeps rows themselves (264 B + 17 B of key, index and clock state each, up to a
// byte budget) and reads misses from the shards on one or more replica drives through
// ReplicaReader (io_uring, O_DIRECT, hedging, failover to another replica), a step row's misses
// in one submission. The staging tasks of model::EngramStaging call it ahead of their layers.
//
// Eviction is CLOCK (a row touched since the hand last passed stays); the index is open
// addressing with linear probing and backward-shift deletion over a power-of-two table of slot
// numbers (RowIndex, below, tested against std::unordered_map).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "model/engram_staging.h"
#include "storage/replica_reader.h"

namespace fb::loader {
class Snapshot;
}

namespace fb::storage {

// Key -> slot map over caller-held keys: open addressing, linear probing, backward-shift deletion
// (no tombstones, so lookups stay short however long the cache runs). Capacity fixed at creation.
class RowIndex {
 public:
  explicit RowIndex(int64_t capacity);  // keys it can hold at once (the table is >= 2x that)
  // The slot holding `key`, or -1. `key_of(slot)` reads a slot's key (the cache stores the keys).
  template <class KeyOf>
  int32_t find(uint64_t key, const KeyOf& key_of) const {
    for (size_t i = home(key);; i = (i + 1) & mask_) {
      const int32_t s = table_[i];
      if (s < 0) return -1;
      if (key_of(s) == key) return s;
    }
  }
  // Adds key -> slot (the key must not be present).
  void insert(uint64_t key, int32_t slot);
  // Removes `key` (present); entries after it move back so no probe sequence breaks.
  template <class KeyOf>
  void erase(uint64_t key, const KeyOf& key_of) {
    size_t i = home(key);
    while (key_of(table_[i]) != key) i = (i + 1) & mask_;
    for (size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      const int32_t s = table_[j];
      if (s < 0) break;
      const size_t k = home(key_of(s));
      // Entry j may fill hole i unless its home lies cyclically in (i, j].
      const bool stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
      if (stays) continue;
      table_[i] = s;
      i = j;
    }
    table_[i] = -1;
    --size_;
  }
  int64_t size() const { return size_; }
  uint64_t bytes() const { return table_.size() * sizeof(int32_t); }
  static uint64_t table_bytes(int64_t capacity);  // what bytes() will be for `capacity`

 private:
  size_t home(uint64_t key) const {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;  // Fibonacci hashing: the high bits mix every key bit
    return size_t(h >> shift_) & mask_;
  }
  std::vector<int32_t> table_;
  size_t mask_ = 0;
  int shift_ = 0;
  int64_t size_ = 0;
};

// The cache's policy without its payload: which keys are held, in which slot, and which goes
// when a new one comes (CLOCK: a key looked up since the hand last passed stays; a key admits
// cold, so one never asked for again leaves at the hand's next pass). EngramRowCache stores its
// rows by these slots; `flashbox engram-sim` runs the same policy over token streams of real text.
class RowClock {
 public:
  explicit RowClock(int64_t capacity);  // keys held at once (0: none)
  // The largest capacity whose keys, clock bits, index and `payload_bytes` per key fit `budget`.
  static int64_t fit(uint64_t budget, uint64_t payload_bytes);
  // Host bytes of the policy's own state (keys, clock bits, index).
  static uint64_t state_bytes(int64_t capacity);
  // The slot holding `key` (marked as used), or -1.
  int32_t lookup(uint64_t key);
  // A slot for `key` (not held; the caller checked): a free one, or the one the hand evicts
  // (`evicted` set true). -1 with capacity 0.
  int32_t admit(uint64_t key, bool* evicted);
  int64_t capacity() const { return cap_; }
  int64_t size() const { return index_ ? index_->size() : 0; }

 private:
  int64_t cap_ = 0, used_ = 0, hand_ = 0;
  std::unique_ptr<RowIndex> index_;
  std::vector<uint64_t> keys_;
  std::vector<uint8_t> ref_;
};

// One Engram layer's table in the snapshot's files: paths relative to every drive root.
struct EngramTableFile {
  int layer = -1;
  // 0: codes and scales in separate places (the snapshot's two tensors: two reads a row); N > 0:
  // an Engram store (write_engram_store): rows of codes + scales together, N to a 4 KiB page from
  // codes_offset (one read a row); scales_path / scales_offset unused.
  int rows_per_page = 0;
  std::string codes_path;
  uint64_t codes_offset = 0;  // absolute file offset of row 0's codes
  std::string scales_path;
  uint64_t scales_offset = 0;
  int64_t rows = 0;
};

struct EngramCacheOptions {
  uint64_t capacity_bytes = 0;  // rows kept in host RAM (index included); 0: every row read from the drives
  // Rows are 4 KiB reads: many in flight per drive (a drive's deep queue is its rate), one chunk each.
  ReaderOptions reader = [] {
    ReaderOptions r;
    r.queue_depth_per_drive = 64;
    return r;
  }();
  // Fault injection on the replicas (check-fixture --engram-fault), into each reader: a caller
  // at a time uses a reader, and a reader counts its own reads.
  std::vector<ReaderFault> faults;
};

struct EngramCacheStats {
  uint64_t lookups = 0;      // rows asked for
  uint64_t hits = 0;         // ... found in the cache
  uint64_t drive_rows = 0;   // ... read from the drives (lookups - hits)
  uint64_t drive_bytes = 0;  // bytes the reads delivered (the rows' bytes; O_DIRECT reads whole 4 KiB blocks around them)
  uint64_t evictions = 0;
  uint64_t read_calls = 0;   // submissions (a step row's misses each)
  uint64_t read_wait_ns = 0; // time callers spent waiting for the drives
  int64_t capacity_rows = 0, resident_rows = 0;
  std::string to_string() const;
};

class EngramRowCache final : public model::EngramRowSource {
 public:
  static Result<std::shared_ptr<EngramRowCache>> create(std::vector<EngramTableFile> tables, int head_dim, std::vector<std::string> roots,
                                                        EngramCacheOptions opt);
  Status read_rows(int layer, const int64_t* ids, int n, uint8_t* codes, uint8_t* scales) const override;
  EngramCacheStats stats() const;
  // Host bytes the cache holds (rows, keys, clock bits, the index), allocated up front.
  uint64_t host_bytes() const override;
  uint64_t drive_bytes_read() const override { return stats().drive_bytes; }
  // Bytes one cached row takes (payload + key + clock bit + two index entries); the index rounds
  // up to a power of two, so a budget holds up to this many rows, and create() fits it exactly.
  static uint64_t bytes_per_row(int head_dim);
  std::string drive_report() const;

 private:
  EngramRowCache() = default;
  int table_of(int layer) const;

  std::vector<EngramTableFile> tables_;
  std::vector<int> table_by_layer_;  // layer -> index in tables_, -1
  int hd_ = 0, sb_ = 0;
  mutable std::mutex mu_;                    // the cache below and the counters
  mutable std::unique_ptr<RowClock> clock_;
  mutable std::vector<uint8_t> rows_;        // capacity x (hd + sb), by the clock's slots
  mutable EngramCacheStats stats_;
  // Readers: ReplicaReader takes one caller at a time, so each concurrent caller takes one of its
  // own (made on demand, kept), and the staging tasks' reads are in flight together.
  Result<std::unique_ptr<ReplicaReader>> take_reader() const;
  void give_back(std::unique_ptr<ReplicaReader> r) const;
  std::vector<std::string> roots_;
  EngramCacheOptions opt_;
  mutable std::mutex read_mu_;
  mutable std::vector<std::unique_ptr<ReplicaReader>> idle_;
  mutable std::vector<const ReplicaReader*> readers_;  // every reader made (for the report)
};

// The row cache's hit rate on real token streams (`flashbox engram-sim`): each document's Engram
// classes (positions from 0, as a session's) hashed to row ids as the executors hash them (spec/11
// §6.3, the config's tables), every row looked up in a RowClock of each byte budget (rows of
// head_dim + head_dim / 32 bytes) and admitted on a miss. The first `warm_tokens` tokens only warm
// the caches; the counts cover the rest.
struct EngramSimResult {
  uint64_t budget_bytes = 0;
  int64_t capacity_rows = 0;
  uint64_t tokens = 0;    // measured tokens
  uint64_t lookups = 0;   // rows they asked for
  uint64_t hits = 0;
  uint64_t evictions = 0;
  int64_t held_rows = 0;  // at the end
};
std::vector<EngramSimResult> simulate_engram_cache(const model::Config& c, const std::vector<std::vector<int32_t>>& class_docs,
                                                   int64_t pad_class, const std::vector<uint64_t>& budgets, uint64_t warm_tokens);

// The Engram store (`flashbox convert --engram`): DIR/engram.fbe holds every Engram table of the
// snapshot with each row's codes and scales together, floor(4096 / row bytes) rows to a 4 KiB
// page (15 of 264 B in the release: 3.3% padding), so a row is one aligned 4 KiB read instead of
// two, and the 189 GiB of tables can be copied to several drives without the rest of the
// snapshot. A 4 KiB header (magic, version, the model's identity, head_dim, the tables' layers,
// rows and offsets, a CRC32C) precedes the pages. Written to a temporary name, synced, renamed;
// the same in every replica dir.
inline constexpr const char* kEngramStoreFile = "engram.fbe";
Status write_engram_store(const loader::Snapshot& snap, const std::vector<std::string>& dirs,
                          const std::function<void(const std::string& dir, uint64_t done, uint64_t total)>& progress = {});
// The tables of `snap` from the Engram stores in `store_dirs` (replicas: one that is missing, of
// another model or damaged is left out with a warning; none left is an error).
Result<std::shared_ptr<EngramRowCache>> engram_store_for(const loader::Snapshot& snap, const std::vector<std::string>& store_dirs,
                                                         EngramCacheOptions opt);

// The same store for a snapshot without files (the bench's in-memory synthetic model: no model
// identity, written as 0): DIR/engram.fbe in each of `dirs` (kept when it already holds these
// tables), and the row cache over them.
Result<std::shared_ptr<EngramRowCache>> engram_store_from_memory(const loader::Snapshot& snap, const std::vector<std::string>& dirs,
                                                                 EngramCacheOptions opt);

// The Engram tables of `snap` (every layer with an Engram role) read from its shards under
// snap.dir() and each of `replica_dirs` (copies of the snapshot's shard files on other drives;
// one whose files are missing or differ in size is left out with a warning). kUnsupported for a
// snapshot without files (the synthetic bench model) or without Engram layers.
Result<std::shared_ptr<EngramRowCache>> engram_cache_for(const loader::Snapshot& snap, const std::vector<std::string>& replica_dirs,
                                                         EngramCacheOptions opt);

}  // namespace fb::storage
