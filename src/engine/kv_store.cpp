#include "engine/kv_store.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <unordered_map>

#include "base/crc32c.h"
#include "base/log.h"
#include "base/mapped_file.h"

namespace fb::engine {

namespace fs = std::filesystem;

namespace {

// File layouts (little endian, docs/formats.md). Full: magic ...\1, u64 model id, i64 n tokens,
// u64 state bytes, i32 tokens[n], the state, u32 CRC-32C of everything before it. Delta: magic
// ...\2, the same four fields (state bytes = the rebuilt state's size), i32 tokens[n], i64 parent
// token count, u32 CRC-32C of the rebuilt state, u32 0, u64 op bytes, the ops, u32 CRC-32C of
// everything before it.
constexpr char kMagic[8] = {'F', 'B', 'K', 'V', '\0', '\0', '\0', '\1'};
constexpr char kMagicDelta[8] = {'F', 'B', 'K', 'V', '\0', '\0', '\0', '\2'};
constexpr size_t kHeader = sizeof kMagic + 8 + 8 + 8;
constexpr size_t kDeltaFields = 8 + 4 + 4 + 8;  // after the tokens
constexpr const char* kSuffix = ".fbkv";

struct Header {
  uint64_t model_id = 0;
  int64_t n_tokens = 0;
  uint64_t state_bytes = 0;
  bool delta = false;
  int64_t parent_n = -1;
  uint32_t state_crc = 0;
  uint64_t op_bytes = 0;
};

bool parse_header(std::string_view b, Header* h) {
  if (b.size() < kHeader) return false;
  const bool full = std::memcmp(b.data(), kMagic, sizeof kMagic) == 0, delta = std::memcmp(b.data(), kMagicDelta, sizeof kMagicDelta) == 0;
  if (!full && !delta) return false;
  h->delta = delta;
  std::memcpy(&h->model_id, b.data() + 8, 8);
  std::memcpy(&h->n_tokens, b.data() + 16, 8);
  std::memcpy(&h->state_bytes, b.data() + 24, 8);
  if (h->n_tokens < 0 || h->n_tokens >= (int64_t(1) << 32)) return false;
  if (delta) {
    const size_t at = kHeader + size_t(h->n_tokens) * 4;
    if (b.size() < at + kDeltaFields) return false;
    std::memcpy(&h->parent_n, b.data() + at, 8);
    std::memcpy(&h->state_crc, b.data() + at + 8, 4);
    std::memcpy(&h->op_bytes, b.data() + at + 16, 8);
    if (h->parent_n < 0 || h->parent_n >= h->n_tokens) return false;
  }
  return true;
}

// The size the header promises for the whole file.
uint64_t file_size(const Header& h) {
  const uint64_t head = kHeader + uint64_t(h.n_tokens) * 4;
  return h.delta ? head + kDeltaFields + h.op_bytes + 4 : head + h.state_bytes + 4;
}

bool crc_ok(std::string_view b) {
  uint32_t crc = 0;
  std::memcpy(&crc, b.data() + b.size() - 4, 4);
  return crc32c(b.data(), b.size() - 4) == crc;
}

void put_u64(std::string& b, uint64_t v) { b.append(reinterpret_cast<const char*>(&v), 8); }

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

// ---- delta coding ---------------------------------------------------------------------------
// Ops: u8 kind (0 copy, 1 literal), u64 a, u64 b; copy: parent bytes [a, a + b); literal: the a
// bytes that follow the record. Matching: the parent's blocks of B bytes (at multiples of B) in a
// table by polynomial hash; the child is scanned with the same hash rolling one byte at a time; a
// verified block match is extended forward byte by byte and becomes one copy.

namespace {

constexpr uint64_t kRollBase = 0x100000001B3ull;

size_t block_size(size_t parent_bytes) { return parent_bytes < (size_t(1) << 20) ? 64 : 1024; }

uint64_t block_hash(const unsigned char* p, size_t n) {
  uint64_t h = 0;
  for (size_t i = 0; i < n; ++i) h = h * kRollBase + p[i];
  return h;
}

void put_op(std::string& ops, uint8_t kind, uint64_t a, uint64_t b) {
  ops.push_back(char(kind));
  put_u64(ops, a);
  put_u64(ops, b);
}

}  // namespace

std::optional<std::string> encode_delta(std::string_view parent, std::string_view child, size_t max_literal) {
  const size_t B = block_size(parent.size());
  const auto* P = reinterpret_cast<const unsigned char*>(parent.data());
  const auto* C = reinterpret_cast<const unsigned char*>(child.data());
  std::unordered_map<uint64_t, size_t> table;
  table.reserve(parent.size() / B + 1);
  for (size_t off = 0; off + B <= parent.size(); off += B) table.emplace(block_hash(P + off, B), off);
  uint64_t top = 1;  // kRollBase^(B-1)
  for (size_t i = 1; i < B; ++i) top *= kRollBase;
  std::string ops;
  size_t literal = 0, lit_start = 0, i = 0;
  auto flush = [&](size_t end) {
    if (end > lit_start) {
      put_op(ops, 1, end - lit_start, 0);
      ops.append(child.data() + lit_start, end - lit_start);
      literal += end - lit_start;
    }
  };
  uint64_t h = child.size() >= B ? block_hash(C, B) : 0;
  while (i + B <= child.size()) {
    auto it = table.find(h);
    if (it != table.end() && std::memcmp(P + it->second, C + i, B) == 0) {
      flush(i);
      const size_t off = it->second;
      size_t len = B;
      while (off + len < parent.size() && i + len < child.size() && P[off + len] == C[i + len]) ++len;
      put_op(ops, 0, off, len);
      i += len;
      lit_start = i;
      if (i + B <= child.size()) h = block_hash(C + i, B);
    } else {
      if (i + B < child.size()) h = (h - C[i] * top) * kRollBase + C[i + B];
      ++i;
      if (i - lit_start + literal > max_literal) return std::nullopt;
    }
  }
  flush(child.size());
  if (literal > max_literal) return std::nullopt;
  return ops;
}

Result<std::string> apply_delta(std::string_view parent, std::string_view ops, uint64_t child_bytes) {
  std::string out;
  out.reserve(size_t(child_bytes));
  size_t at = 0;
  while (at < ops.size()) {
    if (ops.size() - at < 17) return FB_ERROR(kCorrupt) << "delta: truncated op at " << at;
    const uint8_t kind = uint8_t(ops[at]);
    uint64_t a = 0, b = 0;
    std::memcpy(&a, ops.data() + at + 1, 8);
    std::memcpy(&b, ops.data() + at + 9, 8);
    at += 17;
    if (kind == 0) {
      if (a > parent.size() || b > parent.size() - a) return FB_ERROR(kCorrupt) << "delta: copy [" << a << ", +" << b << ") past the parent's " << parent.size() << " bytes";
      if (b > child_bytes - out.size()) return FB_ERROR(kCorrupt) << "delta: output past " << child_bytes << " bytes";
      out.append(parent.data() + a, size_t(b));
    } else if (kind == 1) {
      if (a > ops.size() - at || a > child_bytes - out.size()) return FB_ERROR(kCorrupt) << "delta: literal of " << a << " bytes past the end";
      out.append(ops.data() + at, size_t(a));
      at += size_t(a);
    } else {
      return FB_ERROR(kCorrupt) << "delta: unknown op " << int(kind);
    }
  }
  if (out.size() != child_bytes) return FB_ERROR(kCorrupt) << "delta: rebuilt " << out.size() << " bytes, expected " << child_bytes;
  return out;
}

Result<KvFileInfo> verify_kv_file(const std::string& path) {
  auto b = FB_TRY(read_file_bytes(path));
  Header h;
  if (!parse_header(b, &h)) return FB_ERROR(kCorrupt) << path << ": not a checkpoint (bad header)";
  if (b.size() != file_size(h)) return FB_ERROR(kCorrupt) << path << ": " << b.size() << " bytes, the header promises " << file_size(h);
  if (!crc_ok(b)) return FB_ERROR(kCorrupt) << path << ": checksum mismatch";
  return KvFileInfo{h.model_id, h.n_tokens, b.size(), h.delta ? h.parent_n : -1};
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
    if (b->size() != file_size(h)) {
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
    const std::vector<uint64_t> ph = prefix_hashes(toks);
    e.prefix_hash = ph.back();
    if (h.delta) {
      e.parent_n = h.parent_n;
      e.parent_hash = ph[size_t(h.parent_n)];
    }
    e.bytes = b->size();
    found.push_back({de.last_write_time(ec), std::move(e)});
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });  // oldest first
  for (auto& [t, e] : found) {
    e.last_used = ++s->clock_;
    s->stats_.bytes += e.bytes;
    s->entries_.push_back(std::move(e));
  }
  // Deltas whose parent is gone are useless; depths from the full checkpoints down (a cycle, which
  // only damage could make, never resolves and is dropped too).
  for (auto& e : s->entries_) e.depth = e.parent_n < 0 ? 0 : -1;
  for (bool changed = true; changed;) {
    changed = false;
    for (auto& e : s->entries_) {
      if (e.depth >= 0) continue;
      const int p = s->find(e.parent_n, e.parent_hash);
      if (p >= 0 && s->entries_[size_t(p)].depth >= 0) {
        e.depth = s->entries_[size_t(p)].depth + 1;
        changed = true;
      }
    }
  }
  std::vector<size_t> orphans;
  for (size_t i = 0; i < s->entries_.size(); ++i)
    if (s->entries_[i].depth < 0) orphans.push_back(i);
  if (!orphans.empty()) {
    FB_LOG(kWarn) << "kv cache: " << orphans.size() << " delta checkpoint(s) without their parent; removed";
  }
  s->drop_all(orphans, Drop::kRejected);
  // Oldest first, each entry marks its chain used: a parent ends up more recent than its deltas,
  // so eviction takes leaves first (as it does within a process).
  std::vector<size_t> order(s->entries_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return s->entries_[a].last_used < s->entries_[b].last_used; });
  for (size_t i : order) s->touch_chain(i);
  s->evict_to(s->budget_);
  return s;
}

int KvStore::find(int64_t n, uint64_t hash) const {
  for (size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].n_tokens == n && entries_[i].prefix_hash == hash) return int(i);
  return -1;
}

void KvStore::drop_all(std::vector<size_t> idx, Drop why) {
  // Close over dependents: a delta whose parent is dropped goes with it.
  std::vector<bool> gone(entries_.size(), false);
  for (size_t i : idx) gone[i] = true;
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (gone[i] || entries_[i].parent_n < 0) continue;
      const int p = find(entries_[i].parent_n, entries_[i].parent_hash);
      if (p < 0 || gone[size_t(p)]) {
        gone[i] = true;
        changed = true;
      }
    }
  }
  std::error_code ec;
  for (size_t i = entries_.size(); i-- > 0;) {
    if (!gone[i]) continue;
    if (entries_[i].file == cache_file_) cache_file_.clear();
    fs::remove(entries_[i].file, ec);
    stats_.bytes -= entries_[i].bytes;
    const bool first = std::find(idx.begin(), idx.end(), i) != idx.end();
    if (why == Drop::kRejected) {
      ++stats_.rejected;
    } else if (why == Drop::kEvicted || !first) {  // a replaced entry's dependents count as evicted
      ++stats_.evicted;
    }
    entries_.erase(entries_.begin() + std::ptrdiff_t(i));
  }
}

void KvStore::touch_chain(size_t i) {
  // the delta first, then its ancestors: a parent is never less recently used than its children
  for (int k = int(i); k >= 0;) {
    Entry& e = entries_[size_t(k)];
    e.last_used = ++clock_;
    k = e.parent_n < 0 ? -1 : find(e.parent_n, e.parent_hash);
  }
}

Result<std::string> KvStore::load_state(size_t i, std::span<const int32_t> tokens, std::vector<size_t>* bad, int depth) {
  const Entry e = entries_[i];
  auto fail = [&](const std::string& why) -> Status {
    FB_LOG(kWarn) << "kv cache: " << e.file << " " << why << "; removed";
    bad->push_back(i);
    return FB_ERROR(kCorrupt) << e.file << ": " << why;
  };
  if (e.file == cache_file_ && cache_tokens_.size() == size_t(e.n_tokens) && std::equal(cache_tokens_.begin(), cache_tokens_.end(), tokens.begin()))
    return cache_state_;
  auto b = read_file_bytes(e.file);
  Header hd;
  if (!b.ok() || !parse_header(*b, &hd) || hd.model_id != model_id_ || hd.n_tokens != e.n_tokens || b->size() != file_size(hd) || !crc_ok(*b) ||
      std::memcmp(b->data() + kHeader, tokens.data(), size_t(e.n_tokens) * 4) != 0)
    return fail("failed verification");
  if (!hd.delta) return b->substr(kHeader + size_t(e.n_tokens) * 4, size_t(hd.state_bytes));
  if (hd.parent_n != e.parent_n || depth >= kMaxChain) return fail("has a broken delta chain");
  const int p = find(e.parent_n, e.parent_hash);
  if (p < 0) return fail("lost its parent");
  auto parent = load_state(size_t(p), tokens, bad, depth + 1);
  if (!parent.ok()) return fail("has a damaged parent");
  const size_t at = kHeader + size_t(e.n_tokens) * 4 + kDeltaFields;
  auto state = apply_delta(*parent, std::string_view(*b).substr(at, size_t(hd.op_bytes)), hd.state_bytes);
  if (!state.ok() || crc32c(state->data(), state->size()) != hd.state_crc) return fail("rebuilds to other bytes than it recorded");
  return state;
}

void KvStore::drop(size_t i, Drop why) { drop_all({i}, why); }

void KvStore::evict_to(uint64_t bytes) {
  while (stats_.bytes > bytes && !entries_.empty()) {
    size_t lru = 0;
    for (size_t i = 1; i < entries_.size(); ++i)
      if (entries_[i].last_used < entries_[lru].last_used) lru = i;
    drop(lru, Drop::kEvicted);
  }
}

Status KvStore::put(std::span<const int32_t> tokens, std::string_view state) {
  const int64_t n = int64_t(tokens.size());
  const std::vector<uint64_t> ph = prefix_hashes(tokens);
  const uint64_t hash = ph.back(), full_size = kHeader + tokens.size() * 4 + state.size() + 4;
  // A delta against the longest stored proper prefix, when it is short enough and small enough.
  std::string ops;
  int64_t parent_n = -1;
  if (deltas_) {
    int best = -1;
    for (size_t i = 0; i < entries_.size(); ++i) {
      const Entry& e = entries_[i];
      if (e.n_tokens < n && e.prefix_hash == ph[size_t(e.n_tokens)] && e.depth < kMaxChain && (best < 0 || e.n_tokens > entries_[size_t(best)].n_tokens))
        best = int(i);
    }
    if (best >= 0) {
      std::vector<size_t> bad;
      auto parent = load_state(size_t(best), tokens, &bad, 0);
      if (parent.ok()) {
        const std::string parent_file = entries_[size_t(best)].file;
        const int64_t pn = entries_[size_t(best)].n_tokens;
        if (auto d = encode_delta(*parent, state, state.size() / 2); d && d->size() < state.size() / 2) {
          ops = std::move(*d);
          parent_n = entries_[size_t(best)].n_tokens;
          touch_chain(size_t(best));  // the parent stays while room is made
        }
        cache_file_ = parent_file;
        cache_tokens_.assign(tokens.begin(), tokens.begin() + pn);
        cache_state_ = std::move(*parent);
      }
      std::sort(bad.begin(), bad.end());
      bad.erase(std::unique(bad.begin(), bad.end()), bad.end());
      drop_all(bad, Drop::kRejected);
    }
  }
  std::string b;
  auto build = [&](bool delta) {
    b.clear();
    b.append(delta ? kMagicDelta : kMagic, sizeof kMagic);
    const uint64_t sb = state.size();
    b.append(reinterpret_cast<const char*>(&model_id_), 8);
    put_u64(b, uint64_t(n));
    put_u64(b, sb);
    b.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 4);
    if (delta) {
      put_u64(b, uint64_t(parent_n));
      const uint32_t scrc = crc32c(state.data(), state.size()), zero = 0;
      b.append(reinterpret_cast<const char*>(&scrc), 4);
      b.append(reinterpret_cast<const char*>(&zero), 4);
      put_u64(b, ops.size());
      b.append(ops);
    } else {
      b.append(state.data(), state.size());
    }
    const uint32_t crc = crc32c(b.data(), b.size());
    b.append(reinterpret_cast<const char*>(&crc), 4);
  };
  bool delta = parent_n >= 0;
  build(delta);
  if (b.size() > budget_) {
    if (!delta || full_size > budget_)
      return FB_ERROR(kResourceExhausted) << "kv cache: a " << b.size() << "-byte checkpoint exceeds the budget of " << budget_;
  }
  // Replace a checkpoint of the same tokens (and the deltas built on it), then make room so the
  // total never exceeds the budget; a delta whose parent had to go is written whole.
  if (int i = find(n, hash); i >= 0) drop(size_t(i), Drop::kReplaced);
  evict_to(budget_ - std::min<uint64_t>(b.size(), budget_));
  if (delta && find(parent_n, ph[size_t(parent_n)]) < 0) {
    delta = false;
    if (full_size > budget_) return FB_ERROR(kResourceExhausted) << "kv cache: a " << full_size << "-byte checkpoint exceeds the budget of " << budget_;
    build(false);
    evict_to(budget_ - b.size());
  }
  Entry e;
  e.file = (fs::path(dir_) / file_name(hash, n)).string();
  FB_RETURN_IF_ERROR(write_file_atomic(e.file, b.data(), b.size()));
  e.n_tokens = n;
  e.prefix_hash = hash;
  e.bytes = b.size();
  e.last_used = ++clock_;
  if (delta) {
    e.parent_n = parent_n;
    e.parent_hash = ph[size_t(parent_n)];
    e.depth = entries_[size_t(find(parent_n, e.parent_hash))].depth + 1;
  }
  stats_.bytes += b.size();
  stats_.written += b.size();
  entries_.push_back(std::move(e));
  cache_file_ = entries_.back().file;
  cache_tokens_.assign(tokens.begin(), tokens.end());
  cache_state_.assign(state.data(), state.size());
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
    if (std::find(bad.begin(), bad.end(), i) != bad.end()) continue;  // failed as another's parent
    auto state = load_state(i, prompt, &bad, 0);
    if (!state.ok()) continue;
    touch_chain(i);
    cache_file_ = entries_[i].file;
    cache_tokens_.assign(prompt.begin(), prompt.begin() + entries_[i].n_tokens);
    cache_state_ = *state;
    hit = KvHit{entries_[i].n_tokens, std::move(*state)};
    break;
  }
  std::sort(bad.begin(), bad.end());
  bad.erase(std::unique(bad.begin(), bad.end()), bad.end());
  drop_all(bad, Drop::kRejected);
  ++(hit ? stats_.hits : stats_.misses);
  return hit;
}

}  // namespace fb::engine
