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
  uint64_t bytes = 0;
  int64_t hits = 0, misses = 0, evicted = 0, rejected = 0;  // rejected: damaged or foreign files dropped
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
    return s;
  }
  const std::string& dir() const { return dir_; }

 private:
  struct Entry {
    std::string file;
    int64_t n_tokens = 0;
    uint64_t prefix_hash = 0;
    uint64_t bytes = 0;
    uint64_t last_used = 0;
  };
  KvStore(std::string dir, uint64_t budget, uint64_t model_id) : dir_(std::move(dir)), budget_(budget), model_id_(model_id) {}
  enum class Drop { kEvicted, kRejected, kReplaced };
  void drop(size_t i, Drop why);
  void evict_to(uint64_t bytes);

  std::string dir_;
  uint64_t budget_ = 0, model_id_ = 0, clock_ = 0;
  std::vector<Entry> entries_;
  KvStoreStats stats_;
};

// One checkpoint file, checked whole without a store (operators' `flashbox kv`): header, size and
// checksum. kCorrupt names what is wrong.
struct KvFileInfo {
  uint64_t model_id = 0;
  int64_t n_tokens = 0;
  uint64_t bytes = 0;
};
Result<KvFileInfo> verify_kv_file(const std::string& path);

// 64-bit FNV-1a over token ids: the key of a prefix (prefix_hashes(t)[n] = key of t[0..n)).
std::vector<uint64_t> prefix_hashes(std::span<const int32_t> tokens);

}  // namespace fb::engine
