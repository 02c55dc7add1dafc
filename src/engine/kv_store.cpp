#include "engine/kv_store.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "base/crc32c.h"
#include "base/log.h"
#include "base/mapped_file.h"

namespace fb::engine {

namespace fs = std::filesystem;

namespace {

// File layout (little endian): magic, u64 model id, i64 n tokens, u64 state bytes, i32 tokens[n],
// the state, u32 CRC-32C of everything before it.
constexpr char kMagic[8] = {'F', 'B', 'K', 'V', '\0', '\0', '\0', '\1'};
constexpr size_t kHeader = sizeof kMagic + 8 + 8 + 8;
constexpr const char* kSuffix = ".fbkv";

struct Header {
  uint64_t model_id = 0;
  int64_t n_tokens = 0;
  uint64_t state_bytes = 0;
};

bool parse_header(std::string_view b, Header* h) {
  if (b.size() < kHeader || std::memcmp(b.data(), kMagic, sizeof kMagic) != 0) return false;
  std::memcpy(&h->model_id, b.data() + 8, 8);
  std::memcpy(&h->n_tokens, b.data() + 16, 8);
  std::memcpy(&h->state_bytes, b.data() + 24, 8);
  return h->n_tokens >= 0 && h->n_tokens < (int64_t(1) << 32);
}

std::string file_name(uint64_t hash, int64_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "kv-%016llx-%lld%s", (unsigned long long)hash, (long long)n, kSuffix);
  return buf;
}

}  // namespace

std::vector<uint64_t> prefix_hashes(std::span<const int32_t> tokens) {
  std::vector<uint64_t> h(tokens.size() + 1);
  uint64_t x = 1469598103934665603ull;
  h[0] = x;
  for (size_t i = 0; i < tokens.size(); ++i) {
    uint32_t t = uint32_t(tokens[i]);
    for (int k = 0; k < 4; ++k, t >>= 8) x = (x ^ (t & 0xFF)) * 1099511628211ull;
    h[i + 1] = x;
  }
  return h;
}

Result<KvFileInfo> verify_kv_file(const std::string& path) {
  auto b = FB_TRY(read_file_bytes(path));
  Header h;
  if (!parse_header(b, &h)) return FB_ERROR(kCorrupt) << path << ": not a checkpoint (bad header)";
  if (b.size() != kHeader + size_t(h.n_tokens) * 4 + h.state_bytes + 4)
    return FB_ERROR(kCorrupt) << path << ": " << b.size() << " bytes, the header promises " << kHeader + size_t(h.n_tokens) * 4 + h.state_bytes + 4;
  uint32_t crc = 0;
  std::memcpy(&crc, b.data() + b.size() - 4, 4);
  if (crc32c(b.data(), b.size() - 4) != crc) return FB_ERROR(kCorrupt) << path << ": checksum mismatch";
  return KvFileInfo{h.model_id, h.n_tokens, b.size()};
}

Result<std::unique_ptr<KvStore>> KvStore::open(const std::string& dir, uint64_t budget_bytes, uint64_t model_id) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return FB_ERROR(kIo) << "kv cache " << dir << ": " << ec.message();
  std::unique_ptr<KvStore> s(new KvStore(dir, budget_bytes, model_id));
  std::vector<std::pair<fs::file_time_type, Entry>> found;
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    const std::string name = de.path().filename().string();
    if (name.find(".tmp.") != std::string::npos) {  // a write a crash interrupted
      fs::remove(de.path(), ec);
      continue;
    }
    if (de.path().extension() != kSuffix || !de.is_regular_file()) continue;
    auto b = read_file_bytes(de.path().string());
    Header h;
    if (!b.ok() || !parse_header(*b, &h)) {
      FB_LOG(kWarn) << "kv cache: " << name << " is not a readable checkpoint; removed";
      fs::remove(de.path(), ec);
      ++s->stats_.rejected;
      continue;
    }
    if (h.model_id != model_id) continue;  // another model's: not ours to judge or delete
    if (b->size() != kHeader + size_t(h.n_tokens) * 4 + h.state_bytes + 4) {
      FB_LOG(kWarn) << "kv cache: " << name << " is truncated; removed";
      fs::remove(de.path(), ec);
      ++s->stats_.rejected;
      continue;
    }
    std::vector<int32_t> toks(static_cast<size_t>(h.n_tokens));
    std::memcpy(toks.data(), b->data() + kHeader, toks.size() * 4);
    Entry e;
    e.file = de.path().string();
    e.n_tokens = h.n_tokens;
    e.prefix_hash = prefix_hashes(toks).back();
    e.bytes = b->size();
    found.push_back({de.last_write_time(ec), std::move(e)});
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });  // oldest first
  for (auto& [t, e] : found) {
    e.last_used = ++s->clock_;
    s->stats_.bytes += e.bytes;
    s->entries_.push_back(std::move(e));
  }
  s->evict_to(s->budget_);
  return s;
}

void KvStore::drop(size_t i, Drop why) {
  std::error_code ec;
  fs::remove(entries_[i].file, ec);
  stats_.bytes -= entries_[i].bytes;
  entries_.erase(entries_.begin() + std::ptrdiff_t(i));
  if (why == Drop::kRejected) ++stats_.rejected;
  if (why == Drop::kEvicted) ++stats_.evicted;
}

void KvStore::evict_to(uint64_t bytes) {
  while (stats_.bytes > bytes && !entries_.empty()) {
    size_t lru = 0;
    for (size_t i = 1; i < entries_.size(); ++i)
      if (entries_[i].last_used < entries_[lru].last_used) lru = i;
    drop(lru, Drop::kEvicted);
  }
}

Status KvStore::put(std::span<const int32_t> tokens, std::string_view state) {
  const uint64_t size = kHeader + tokens.size() * 4 + state.size() + 4;
  if (size > budget_) return FB_ERROR(kResourceExhausted) << "kv cache: a " << size << "-byte checkpoint exceeds the budget of " << budget_;
  std::string b;
  b.reserve(size_t(size));
  b.append(kMagic, sizeof kMagic);
  const int64_t n = int64_t(tokens.size());
  const uint64_t sb = state.size();
  b.append(reinterpret_cast<const char*>(&model_id_), 8);
  b.append(reinterpret_cast<const char*>(&n), 8);
  b.append(reinterpret_cast<const char*>(&sb), 8);
  b.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 4);
  b.append(state.data(), state.size());
  const uint32_t crc = crc32c(b.data(), b.size());
  b.append(reinterpret_cast<const char*>(&crc), 4);
  const uint64_t hash = prefix_hashes(tokens).back();
  // Replace a checkpoint of the same tokens; make room first so the total never exceeds the budget.
  for (size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].n_tokens == n && entries_[i].prefix_hash == hash) {
      drop(i, Drop::kReplaced);
      break;
    }
  evict_to(budget_ - size);
  Entry e;
  e.file = (fs::path(dir_) / file_name(hash, n)).string();
  FB_RETURN_IF_ERROR(write_file_atomic(e.file, b.data(), b.size()));
  e.n_tokens = n;
  e.prefix_hash = hash;
  e.bytes = size;
  e.last_used = ++clock_;
  stats_.bytes += size;
  entries_.push_back(std::move(e));
  return Status();
}

std::optional<KvHit> KvStore::longest_prefix(std::span<const int32_t> prompt, int64_t max_tokens) {
  const std::vector<uint64_t> h = prefix_hashes(prompt);
  const int64_t limit = std::min<int64_t>(max_tokens, int64_t(prompt.size()));
  std::vector<size_t> cand;
  for (size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].n_tokens <= limit && entries_[i].prefix_hash == h[size_t(entries_[i].n_tokens)]) cand.push_back(i);
  std::sort(cand.begin(), cand.end(), [&](size_t a, size_t b) { return entries_[a].n_tokens > entries_[b].n_tokens; });
  std::vector<size_t> bad;
  std::optional<KvHit> hit;
  for (size_t i : cand) {
    Entry& e = entries_[i];
    auto b = read_file_bytes(e.file);
    Header hd;
    bool ok = b.ok() && parse_header(*b, &hd) && hd.model_id == model_id_ && hd.n_tokens == e.n_tokens &&
              b->size() == kHeader + size_t(hd.n_tokens) * 4 + hd.state_bytes + 4;
    if (ok) {
      uint32_t crc = 0;
      std::memcpy(&crc, b->data() + b->size() - 4, 4);
      ok = crc32c(b->data(), b->size() - 4) == crc && std::memcmp(b->data() + kHeader, prompt.data(), size_t(e.n_tokens) * 4) == 0;
    }
    if (!ok) {
      FB_LOG(kWarn) << "kv cache: " << e.file << " failed verification; removed";
      bad.push_back(i);
      continue;
    }
    e.last_used = ++clock_;
    hit = KvHit{e.n_tokens, b->substr(kHeader + size_t(e.n_tokens) * 4, size_t(hd.state_bytes))};
    break;
  }
  std::sort(bad.rbegin(), bad.rend());
  for (size_t i : bad) drop(i, Drop::kRejected);
  ++(hit ? stats_.hits : stats_.misses);
  return hit;
}

}  // namespace fb::engine
