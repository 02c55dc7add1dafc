#include "loader/read_in.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

namespace fb::loader {

bool is_routed_expert_tensor(const std::string& name) { return name.find(".ffn.experts.") != std::string::npos; }

uint64_t available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream is(line.substr(13));
    uint64_t kb = 0;
    is >> kb;
    return kb * 1024;
  }
  return 0;
}

ReadInResult read_in(const Snapshot& snap, const std::function<bool(const std::string&)>& skip, uint64_t max_bytes,
                     Progress* progress) {
  ReadInResult r;
  if (snap.dir().empty()) return r;  // in_memory(): nothing on a drive
  struct Item {
    const uint8_t* data;
    size_t nbytes;
    std::string shard;
    uint64_t offset;
  };
  std::vector<Item> items;
  for (const std::string& name : snap.tensor_names()) {
    if (skip && skip(name)) continue;
    auto loc = snap.locate(name);
    if (!loc.ok()) continue;
    const TensorView& v = snap.get(name);
    items.push_back({v.data, v.nbytes(), loc->path, loc->offset});
    r.bytes += v.nbytes();
  }
  r.tensors = int64_t(items.size());
  if (r.bytes > max_bytes) return r;
  // File order: each shard front to back, so the drive reads sequentially.
  std::sort(items.begin(), items.end(),
            [](const Item& a, const Item& b) { return a.shard != b.shard ? a.shard < b.shard : a.offset < b.offset; });
  if (progress) {
    progress->set_total(int64_t(r.bytes));
    progress->set_items_total(r.tensors, "tensors");
  }
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  constexpr size_t kChunk = size_t(32) << 20;
  uint64_t done = 0;
  int64_t n_done = 0;
  uint8_t acc = 0;
  for (const Item& it : items) {
    for (size_t off = 0; off < it.nbytes; off += kChunk) {
      const size_t len = std::min(kChunk, it.nbytes - off);
      const uint8_t* p = it.data + off;
      // Ask for the chunk's pages ahead (readahead), then fault each page in.
      const uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(page - 1);
      (void)madvise(reinterpret_cast<void*>(a), size_t(reinterpret_cast<uintptr_t>(p + len) - a), MADV_WILLNEED);
      for (size_t i = 0; i < len; i += page) acc = uint8_t(acc ^ p[i]);
      acc = uint8_t(acc ^ p[len - 1]);
      done += len;
      if (progress) progress->update(int64_t(done), n_done);
    }
    ++n_done;
    if (progress) progress->update(int64_t(done), n_done);
  }
  r.xor_sample = acc;
  if (progress) progress->finish();
  r.read = true;
  return r;
}

}  // namespace fb::loader
