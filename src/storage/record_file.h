// A flat file of expert records for benchmarks: record r at r x stride, each record laid out as
// the expert store's (ExpertLayout: six 4 KiB aligned parts), without the store's header or
// checksums. cyclic_locator maps (layer, e) to record (layer x 131 + e) mod n_records, so a model
// with more experts than the file holds (the synthetic released-dimension bench, whose experts
// share bytes anyway) reads real, spread-out offsets from the drives with O_DIRECT.
// [policy] benchmark-only: the bytes of (layer, e) are those of its record, not the model's.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "storage/expert_store.h"

namespace fb::storage {

// The record file's name under each drive root (the drive bench's; `probe --store` finds it).
inline constexpr char kRecordFile[] = "records.bin";

// Writes `n_records` records (record(r) gives the tensors of record r) to `path` (fsynced).
Status write_record_file(const std::string& path, const ExpertLayout& lay, int n_records,
                         const std::function<model::ExpertWeights(int r)>& record);
// `file`: relative to each drive root. n_experts[layer]: experts of each layer.
std::unique_ptr<ExpertLocator> cyclic_locator(const ExpertLayout& lay, std::vector<int> n_experts, int n_records, std::string file);
int cyclic_record(int layer, int e, int n_records);

}  // namespace fb::storage
