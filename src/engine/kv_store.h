// Disk store of session checkpoints (issue 21, the store half): serialized session states
// (Executor::save_session, docs/formats.md) keyed by the exact token prefix they cover, under a
// byte budget, crash-safe and corruption-tolerant.
//
// One file per checkpoint, written to a temporary name, fsynced and renamed (base
// write_file_atomic), so a crash leaves either the old set or the new file, never half of one;
// leftover temporaries are removed at open. The directory is the index: open() reads every
// file's header (model identity, token count, tokens) and builds the in-memory table. A lookup
// hashes the prompt's prefixes once and, longest first, verifies a candidate whole (checksum and
// tokens) before returning it; a damaged or foreign file is logged, deleted and skipped, never an
// error and never a wrong state. Eviction keeps the files within the budget, least recently used
// first. Not thread-safe: the engine thread owns it.
//
// Delta checkpoints: a conversation that grows is stored as a delta against the longest stored
// prefix of its tokens (its parent): copy ranges of the parent's state plus literal bytes, found
// by a rolling hash over blocks of the parent (the session state's growing arrays shift but keep
// their bytes). A delta is written when it is smaller than half the full state and its parent's
// chain is shorter than kMaxChain; restoring one rebuilds the state from the chain and checks the
// rebuilt bytes against the CRC-32C recorded for them. A delta lives only with its parent:
// dropping a file (eviction, damage, replacement) drops every delta built on it, and using a delta
// marks its whole chain used.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace fb::engine {

struct KvHit {
  int64_t tokens = 0;  // the prefix length the state covers
  std::string state;   // the session bytes (Executor::restore_session)
};

struct KvStoreStats {
  int64_t entries = 0;  // derived: the table's size
  int64_t deltas = 0;   // derived: entries stored as deltas
  uint64_t bytes = 0;
  int64_t hits = 0, misses = 0, evicted = 0, rejected = 0;  // rejected: damaged or foreign files dropped
  uint64_t written = 0;  // bytes of checkpoint files written by put() since open
};

class KvStore {
 public:
  // `model_id` names the model whose states this store serves (files of another are ignored and
  // left alone). `budget_bytes` bounds the files' total size.
  static Result<std::unique_ptr<KvStore>> open(const std::string& dir, uint64_t budget_bytes, uint64_t model_id);

  // Stores `state` as the checkpoint of exactly `tokens` (replacing one of the same tokens),
  // then evicts least recently used files until the total fits the budget. A state larger than
  // the whole budget is not stored (kResourceExhausted).
  Status put(std::span<const int32_t> tokens, std::string_view state);
  // The longest stored prefix of `prompt` of at most `max_tokens` tokens, verified; nullopt when
  // none. Marks it used (LRU).
  std::optional<KvHit> longest_prefix(std::span<const int32_t> prompt, int64_t max_tokens);

  KvStoreStats stats() const {
    KvStoreStats s = stats_;
    s.entries = int64_t(entries_.size());
    for (const Entry& e : entries_) s.deltas += e.parent_n >= 0 ? 1 : 0;
    return s;
  }
  // Deltas per chain at most (a chain of this many deltas gets a full checkpoint next).
  static constexpr int kMaxChain = 8;
  // Tests and the bench: write only full checkpoints.
  void set_deltas(bool on) { deltas_ = on; }
  const std::string& dir() const { return dir_; }

 private:
  struct Entry {
    std::string file;
    int64_t n_tokens = 0;
    uint64_t prefix_hash = 0;
    uint64_t bytes = 0;
    uint64_t last_used = 0;
    int64_t parent_n = -1;     // a delta: its parent's token count (-1: a full checkpoint)
    uint64_t parent_hash = 0;  // ... and the key of its first parent_n tokens
    int depth = 0;             // deltas from here to a full checkpoint
  };
  KvStore(std::string dir, uint64_t budget, uint64_t model_id) : dir_(std::move(dir)), budget_(budget), model_id_(model_id) {}
  enum class Drop { kEvicted, kRejected, kReplaced };
  // Drops entry i and every delta built on it (transitively).
  void drop(size_t i, Drop why);
  void evict_to(uint64_t bytes);
  int find(int64_t n, uint64_t hash) const;  // the entry of exactly these tokens, or -1
  // The verified state of entry i whose tokens are tokens[0..n): the file's checks, then for a
  // delta the parent's state (recursively) and the rebuilt bytes' checksum. Entries that fail are
  // added to `bad`.
  Result<std::string> load_state(size_t i, std::span<const int32_t> tokens, std::vector<size_t>* bad, int depth);
  void touch_chain(size_t i);
  void drop_all(std::vector<size_t> idx, Drop why);

  std::string dir_;
  uint64_t budget_ = 0, model_id_ = 0, clock_ = 0;
  std::vector<Entry> entries_;
  KvStoreStats stats_;
  bool deltas_ = true;
  // The last state read or written (file, bytes): the parent of the next put is usually the
  // prefix the generator just restored.
  std::string cache_file_, cache_state_;
  std::vector<int32_t> cache_tokens_;
};

// One checkpoint file, checked whole without a store (operators' `flashbox kv`): header, size and
// checksum. kCorrupt names what is wrong.
struct KvFileInfo {
  uint64_t model_id = 0;
  int64_t n_tokens = 0;
  uint64_t bytes = 0;
  int64_t parent_tokens = -1;  // a delta checkpoint: its parent's token count (the file alone is checked)
};
Result<KvFileInfo> verify_kv_file(const std::string& path);

// Delta coding of `child` against `parent` (kv_store.cpp): ops (copy ranges of parent, literal
// bytes), or nullopt when the literals would exceed max_literal bytes. apply_delta rebuilds the
// child, checking every range (kCorrupt on a bad op stream).
std::optional<std::string> encode_delta(std::string_view parent, std::string_view child, size_t max_literal);
Result<std::string> apply_delta(std::string_view parent, std::string_view ops, uint64_t child_bytes);

// 64-bit FNV-1a over token ids: the key of a prefix (prefix_hashes(t)[n] = key of t[0..n)).
std::vector<uint64_t> prefix_hashes(std::span<const int32_t> tokens);

}  // namespace fb::engine
