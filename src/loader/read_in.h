// Reading a snapshot's weights in at load (issue 24): the executors map the shards and touch their
// bytes lazily (the CPU on first use, CUDA while it uploads), so a large checkpoint's wait on the
// drive is spread over page faults nobody sees. read_in() faults the bytes in first, in file
// order, with progress on a terminal (bytes and tensors), so the executor built next finds them
// in the page cache.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "base/progress.h"
#include "loader/snapshot.h"

namespace fb::loader {

struct ReadInResult {
  bool read = false;    // false: nothing read (over max_bytes, or a snapshot without files)
  uint64_t bytes = 0;   // bytes of the selected tensors
  int64_t tensors = 0;  // selected tensors
  uint8_t xor_sample = 0;  // XOR of one byte per page read (keeps the reads; no meaning)
};

// Reads the tensors for which `skip(name)` is false (all when `skip` is empty) through the
// snapshot's mapping, shard by shard in file order. When their bytes exceed `max_bytes` nothing
// is read (they would not stay in memory). `progress` (optional) gets the byte total, the tensors
// as its second counter, an update per 32 MiB and finish() at the end.
ReadInResult read_in(const Snapshot& snap, const std::function<bool(const std::string&)>& skip, uint64_t max_bytes,
                     Progress* progress);

// Routed-expert tensors ("...ffn.experts.E.w1.weight" and their scales): what the tiers read.
bool is_routed_expert_tensor(const std::string& name);

// MemAvailable of /proc/meminfo in bytes (0 when unknown).
uint64_t available_memory_bytes();

}  // namespace fb::loader
