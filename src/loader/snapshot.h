// Snapshot: an opened HF snapshot directory (config.json, model.safetensors.index.json, shards).
// Shards are memory-mapped, never read eagerly. Tensors are looked up by their checkpoint name
// and validated against the schema derived from the config (model/schema.h).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/mapped_file.h"
#include "base/tensor_view.h"
#include "model/config.h"
#include "model/schema.h"

namespace fb::loader {

// Where a tensor's bytes sit on disk: read them with direct I/O instead of the mapping.
struct TensorLocation {
  std::string path;      // shard file
  uint64_t offset = 0;   // absolute file offset of the first byte
  uint64_t nbytes = 0;
};

struct ValidationReport {
  std::vector<std::string> missing;     // in the schema, not in the files
  std::vector<std::string> unexpected;  // in the files, not in the schema
  std::vector<std::string> mismatched;  // "name: want BF16 [a, b], have F32 [a, b]"
  std::vector<std::string> other;       // index/shard disagreements, token map problems
  bool ok() const { return missing.empty() && unexpected.empty() && mismatched.empty() && other.empty(); }
  std::string to_string(size_t max_per_kind = 20) const;
};

class Snapshot {
 public:
  // Opens DIR: parses config.json and the index, maps every shard and parses its header (any
  // container-level corruption is an error here). Schema validation is separate (validate()).
  static Result<std::unique_ptr<Snapshot>> open(const std::string& dir);
  // A snapshot whose tensors live in memory (synthetic benchmark models); `storage` keeps the
  // bytes the views point into alive. The engram map is given explicitly.
  static std::unique_ptr<Snapshot> in_memory(model::Config config, std::map<std::string, TensorView> tensors,
                                             std::vector<std::vector<uint8_t>> storage, std::vector<int32_t> engram_map);

  const std::string& dir() const { return dir_; }
  const model::Config& config() const { return config_; }

  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // A tensor that validate() accepted; FB_CHECK on a missing name (a bug once validated).
  const TensorView& get(const std::string& name) const;
  Result<TensorView> find(const std::string& name) const;
  std::vector<std::string> tensor_names() const;
  const std::string& shard_of(const std::string& name) const;
  Result<TensorLocation> locate(const std::string& name) const;

  ValidationReport validate() const;

  // Compressed-vocab map for Engram: `engram_token_map.i32` beside the config when present.
  // Empty when the file is absent (the tokenizer then derives it).
  const std::vector<int32_t>& engram_token_map() const { return engram_map_; }

  // The byte blocks an in_memory() snapshot owns (empty for a mapped one): the bench page-locks
  // them so a synthetic model's expert copies run at the pinned rate.
  std::vector<std::pair<const uint8_t*, size_t>> memory_blocks() const {
    std::vector<std::pair<const uint8_t*, size_t>> v;
    for (const auto& b : storage_)
      if (!b.empty()) v.push_back({b.data(), b.size()});
    return v;
  }

 private:
  struct Entry {
    TensorView view;
    std::string shard;
    uint64_t file_offset = 0;
  };
  std::string dir_;
  model::Config config_;
  std::vector<MappedFile> files_;
  std::map<std::string, Entry> tensors_;
  std::vector<std::string> index_problems_;
  std::vector<int32_t> engram_map_;
  std::vector<std::vector<uint8_t>> storage_;  // in_memory() snapshots own their bytes
};

// Checks a token map against the config: length = vocab, every class in [0, classes), and the
// number of distinct classes = engram_compressed_vocab_size.
Status validate_engram_map(const model::Config& c, const std::vector<int32_t>& map);

// What every executor checks before it runs a snapshot: the schema validates, and an Engram model
// has a valid token map (*token_map when given, else the snapshot's engram_token_map.i32).
Status check_runnable(const Snapshot& snap, std::vector<int32_t>* token_map);

// The 64-bit identity of a model for serialized sessions (docs/formats.md "Session state"):
// FNV-1a of the bytes of config.json and model.safetensors.index.json (a snapshot without files,
// e.g. a synthetic one, hashes its config's dimensions instead). Every executor names its states
// with it, so a state written by one executor restores on another at the same model.
uint64_t model_identity(const Snapshot& snap);

}  // namespace fb::loader
