// The expert-major store (docs/formats.md, "expert store"): one file `experts.fbx` per drive with
// every routed expert's w1, w3, w2 (payload + e8m0 scales) contiguous in one record, each part
// 4 KiB aligned, so one (layer, expert) is one direct read. Header: magic, version, model
// identity, part layout, per-record CRC-32C, header/index CRC. Written to a temp file, fsynced,
// renamed, and validated on open; a store for another model is refused.
// ExpertLocator maps (layer, expert) to the byte ranges to read: from the store, or straight from
// the snapshot's shards (the loader's tensor offsets) when no store exists.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"
#include "loader/snapshot.h"
#include "model/weights.h"
#include "storage/replica_reader.h"

namespace fb::storage {

constexpr char kStoreFile[] = "experts.fbx";
constexpr char kStoreMagic[8] = {'F', 'B', 'X', 'S', 'T', 'O', 'R', 'E'};
constexpr uint32_t kStoreVersion = 1;

// One expert record: parts in the order w1.weight, w1.scale, w3.weight, w3.scale, w2.weight,
// w2.scale, each at a 4 KiB aligned offset inside the record.
struct ExpertPart {
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // inside the record
  uint64_t nbytes = 0;
};
struct ExpertLayout {
  std::array<ExpertPart, 6> parts;
  uint64_t stride_bytes = 0;  // record size, 4 KiB aligned
  // Views of a record held at `record` (the bytes must outlive the views).
  model::ExpertWeights view(const uint8_t* record) const;
};

// Layout of the snapshot's experts (all routed experts share one shape in V4.1).
Result<ExpertLayout> expert_layout(const loader::Snapshot& snap);
// Identity of the model the bytes belong to: a hash of config.json and the shard index.
Result<uint64_t> model_identity(const std::string& snapshot_dir);

class ExpertStore {
 public:
  // Opens DIR/experts.fbx and validates magic, version, CRCs, the file size and (when
  // `identity` is non-zero) the model identity.
  static Result<std::unique_ptr<ExpertStore>> open(const std::string& dir, uint64_t identity = 0);

  const ExpertLayout& layout() const { return layout_; }
  uint64_t identity() const { return identity_; }
  int n_layers() const { return int(layer_first_.size()); }
  int n_experts(int layer) const { return n_experts_[size_t(layer)]; }
  uint64_t record_offset(int layer, int e) const;
  uint32_t record_crc(int layer, int e) const;
  // The records lie one after another from data_start() (record_offset's order), n_records() of them.
  uint64_t data_start() const { return data_start_; }
  int64_t n_records() const { return int64_t(crcs_.size()); }
  // Reads every record through `reader` and checks its CRC (convert runs it on each replica).
  // `progress` (optional) gets (records checked, records) every 64 records and at the end.
  Status verify_all(ReplicaReader& reader, const std::function<void(int64_t, int64_t)>& progress = {}) const;

 private:
  ExpertLayout layout_;
  uint64_t identity_ = 0;
  uint64_t data_start_ = 0;
  std::vector<int> n_experts_;
  std::vector<size_t> layer_first_;
  std::vector<uint32_t> crcs_;
};

struct ConvertProgress {
  // The phase: experts written into DIR (count: experts), the store copied to a replica (bytes),
  // a copy's records read back and checked (count: experts). Each phase starts with done = 0.
  enum class Phase { kWrite, kCopy, kValidate };
  Phase phase = Phase::kWrite;
  int64_t done = 0, total = 0;
  std::string dir;  // the folder the phase writes or reads
};
// Writes DIR/experts.fbx from the snapshot (then copies it to every replica dir, each atomically),
// and validates every copy. `progress` is called now and then, in every phase.
Status write_expert_store(const loader::Snapshot& snap, const std::string& out_dir, const std::vector<std::string>& replica_dirs,
                          const std::function<void(const ConvertProgress&)>& progress = {});

// Where an expert's bytes are, as ranges relative to each drive root.
class ExpertLocator {
 public:
  virtual ~ExpertLocator() = default;
  virtual const ExpertLayout& layout() const = 0;
  virtual int n_layers() const = 0;
  virtual int n_experts(int layer) const = 0;
  // Ranges that fill a record buffer of layout().stride_bytes at `record`.
  virtual std::vector<ReadRange> ranges(int layer, int e, uint8_t* record) const = 0;
  // Checks a record after its read (the store's CRC); OK when there is nothing to check.
  virtual Status check(int layer, int e, const uint8_t* record) const = 0;
};

std::unique_ptr<ExpertLocator> store_locator(std::shared_ptr<const ExpertStore> store);
// Ranges into the shards (paths relative to the snapshot dir, so replicas are copies of it).
Result<std::unique_ptr<ExpertLocator>> shard_locator(const loader::Snapshot& snap);

}  // namespace fb::storage
