#include "storage/engram_rows.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include "base/check.h"
#include "base/crc32c.h"
#include "base/log.h"
#include "loader/snapshot.h"
#include "model/engram_constants.h"
#include "model/schema.h"
#include "storage/expert_store.h"

namespace fb::storage {

namespace fs = std::filesystem;

namespace {
constexpr uint64_t kFree = ~uint64_t(0);
uint64_t row_key(int table, int64_t row) { return (uint64_t(uint32_t(table)) << 40) | uint64_t(row); }
}  // namespace

uint64_t RowIndex::table_bytes(int64_t capacity) {
  size_t n = 16;
  while (n < size_t(std::max<int64_t>(capacity, 1)) * 2) n <<= 1;
  return n * sizeof(int32_t);
}

RowIndex::RowIndex(int64_t capacity) {
  const size_t n = table_bytes(capacity) / sizeof(int32_t);
  table_.assign(n, -1);
  mask_ = n - 1;
  shift_ = 64;
  for (size_t m = n; m > 1; m >>= 1) --shift_;
}

void RowIndex::insert(uint64_t key, int32_t slot) {
  FB_CHECK_LT(size_t(size_) + 1, table_.size()) << "RowIndex full";
  size_t i = home(key);
  while (table_[i] >= 0) i = (i + 1) & mask_;
  table_[i] = slot;
  ++size_;
}

std::string EngramCacheStats::to_string() const {
  std::ostringstream o;
  o << "engram cache: " << lookups << " rows asked, " << hits << " hits";
  if (lookups > 0) o << " (" << (100.0 * double(hits) / double(lookups)) << "%)";
  o << ", " << drive_rows << " read from the drives (" << drive_bytes << " B in " << read_calls << " submissions, waited "
    << (double(read_wait_ns) / 1e6) << " ms), " << evictions << " evicted, " << resident_rows << " of " << capacity_rows << " rows held";
  return o.str();
}

RowClock::RowClock(int64_t capacity) : cap_(std::max<int64_t>(capacity, 0)) {
  FB_CHECK_LT(cap_, int64_t(1) << 29) << "RowClock capacity";  // int32 slots in a table of >= 2x
  if (cap_ == 0) return;
  index_ = std::make_unique<RowIndex>(cap_);
  keys_.assign(size_t(cap_), kFree);
  ref_.assign(size_t(cap_), 0);
}

uint64_t RowClock::state_bytes(int64_t capacity) {
  return capacity > 0 ? uint64_t(capacity) * (sizeof(uint64_t) + 1) + RowIndex::table_bytes(capacity) : 0;
}

int64_t RowClock::fit(uint64_t budget, uint64_t payload_bytes) {
  // Two index entries per key at best; the power-of-two table may take up to twice that.
  const uint64_t per_key = payload_bytes + sizeof(uint64_t) + 1;
  int64_t cap = std::min<int64_t>(int64_t(budget / (per_key + 2 * sizeof(int32_t))), (int64_t(1) << 28));
  while (cap > 0 && uint64_t(cap) * payload_bytes + state_bytes(cap) > budget) {
    const uint64_t index = RowIndex::table_bytes(cap);
    const int64_t fit = budget > index ? int64_t((budget - index) / per_key) : 0;
    cap = std::min(cap - 1, fit);  // a smaller capacity never needs a larger table: this ends
  }
  return std::max<int64_t>(cap, 0);
}

int32_t RowClock::lookup(uint64_t key) {
  if (!index_) return -1;
  const int32_t s = index_->find(key, [&](int32_t x) { return keys_[size_t(x)]; });
  if (s >= 0) ref_[size_t(s)] = 1;
  return s;
}

int32_t RowClock::admit(uint64_t key, bool* evicted) {
  *evicted = false;
  if (!index_) return -1;
  int32_t s;
  if (used_ < cap_) {
    s = int32_t(used_++);
  } else {  // the first key not looked up since the hand last passed it
    while (ref_[size_t(hand_)]) {
      ref_[size_t(hand_)] = 0;
      hand_ = (hand_ + 1) % cap_;
    }
    s = int32_t(hand_);
    hand_ = (hand_ + 1) % cap_;
    index_->erase(keys_[size_t(s)], [&](int32_t x) { return keys_[size_t(x)]; });
    *evicted = true;
  }
  keys_[size_t(s)] = key;
  ref_[size_t(s)] = 0;
  index_->insert(key, s);
  return s;
}

uint64_t EngramRowCache::bytes_per_row(int head_dim) {
  // payload, key, clock bit, and two int32 entries of the index (a table >= 2x the rows)
  return uint64_t(head_dim + head_dim / 32) + sizeof(uint64_t) + 1 + 2 * sizeof(int32_t);
}

Result<std::shared_ptr<EngramRowCache>> EngramRowCache::create(std::vector<EngramTableFile> tables, int head_dim, std::vector<std::string> roots,
                                                               EngramCacheOptions opt) {
  if (head_dim <= 0 || head_dim % 32 != 0) return FB_ERROR(kInvalidArgument) << "Engram head_dim " << head_dim << " is not a positive multiple of 32";
  if (tables.empty()) return FB_ERROR(kInvalidArgument) << "no Engram tables to cache";
  std::shared_ptr<EngramRowCache> c(new EngramRowCache());
  int max_layer = 0;
  for (const EngramTableFile& t : tables) {
    if (t.layer < 0 || t.rows <= 0 || t.rows >= (int64_t(1) << 40))
      return FB_ERROR(kInvalidArgument) << "Engram table of layer " << t.layer << ": " << t.rows << " rows";
    max_layer = std::max(max_layer, t.layer);
  }
  c->table_by_layer_.assign(size_t(max_layer) + 1, -1);
  for (size_t i = 0; i < tables.size(); ++i) {
    if (c->table_by_layer_[size_t(tables[i].layer)] >= 0) return FB_ERROR(kInvalidArgument) << "two Engram tables for layer " << tables[i].layer;
    c->table_by_layer_[size_t(tables[i].layer)] = int(i);
  }
  c->tables_ = std::move(tables);
  c->hd_ = head_dim;
  c->sb_ = head_dim / 32;
  c->clock_ = std::make_unique<RowClock>(RowClock::fit(opt.capacity_bytes, uint64_t(head_dim + c->sb_)));
  c->stats_.capacity_rows = c->clock_->capacity();
  c->rows_.resize(size_t(c->clock_->capacity()) * size_t(head_dim + c->sb_));
  // Rows are small: one chunk each; no hedging below the reader's minimum (2 ms), which a 264 B
  // read on a healthy drive never reaches. The first reader now: a root that cannot be used is
  // an error of the setup, not of a step.
  c->roots_ = std::move(roots);
  c->opt_ = std::move(opt);
  c->give_back(FB_TRY(c->take_reader()));
  return c;
}

Result<std::unique_ptr<ReplicaReader>> EngramRowCache::take_reader() const {
  std::lock_guard<std::mutex> lock(read_mu_);
  if (!idle_.empty()) {
    std::unique_ptr<ReplicaReader> r = std::move(idle_.back());
    idle_.pop_back();
    return r;
  }
  std::unique_ptr<ReplicaReader> r = FB_TRY(ReplicaReader::open(roots_, opt_.reader));
  for (const ReaderFault& f : opt_.faults) r->inject(f);
  readers_.push_back(r.get());
  return r;
}

void EngramRowCache::give_back(std::unique_ptr<ReplicaReader> r) const {
  std::lock_guard<std::mutex> lock(read_mu_);
  idle_.push_back(std::move(r));
}

int EngramRowCache::table_of(int layer) const {
  return (layer >= 0 && size_t(layer) < table_by_layer_.size()) ? table_by_layer_[size_t(layer)] : -1;
}

Status EngramRowCache::read_rows(int layer, const int64_t* ids, int n, uint8_t* codes, uint8_t* scales) const {
  const int t = table_of(layer);
  if (t < 0) return FB_ERROR(kInvalidArgument) << "no Engram table cached for layer " << layer;
  const EngramTableFile& tab = tables_[size_t(t)];
  const size_t hd = size_t(hd_), sb = size_t(sb_), rb = hd + sb;
  std::vector<int> miss;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.lookups += uint64_t(n);
    for (int i = 0; i < n; ++i) {
      if (ids[i] < 0 || ids[i] >= tab.rows)
        return FB_ERROR(kInternal) << "Engram row " << ids[i] << " outside layer " << layer << "'s table (" << tab.rows << " rows)";
      const int32_t s = clock_->lookup(row_key(t, ids[i]));
      if (s < 0) {
        miss.push_back(i);
        continue;
      }
      const uint8_t* r = &rows_[size_t(s) * rb];
      std::memcpy(codes + size_t(i) * hd, r, hd);
      std::memcpy(scales + size_t(i) * sb, r + hd, sb);
      ++stats_.hits;
    }
  }
  if (miss.empty()) return Status();
  // The misses straight into the caller's rows (the reader bounces them through aligned buffers);
  // from a store, each row whole into `joined`, then split.
  std::vector<ReadRange> ranges;
  std::vector<uint8_t> joined;
  ranges.reserve(miss.size() * 2);
  if (tab.rows_per_page > 0) joined.resize(miss.size() * rb);
  for (size_t j = 0; j < miss.size(); ++j) {
    const int i = miss[j];
    const uint64_t row = uint64_t(ids[i]);
    if (tab.rows_per_page > 0) {
      const uint64_t rpp = uint64_t(tab.rows_per_page);
      ranges.push_back({tab.codes_path, tab.codes_offset + row / rpp * 4096 + row % rpp * rb, rb, &joined[j * rb]});
    } else {
      ranges.push_back({tab.codes_path, tab.codes_offset + row * hd, hd, codes + size_t(i) * hd});
      ranges.push_back({tab.scales_path, tab.scales_offset + row * sb, sb, scales + size_t(i) * sb});
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  Status st;
  {
    auto r = take_reader();
    if (!r.ok()) return r.status();
    st = (*r)->read(ranges);
    give_back(std::move(r.value()));
  }
  const uint64_t waited = uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  std::lock_guard<std::mutex> lock(mu_);
  stats_.read_calls += 1;
  stats_.read_wait_ns += waited;
  if (!st.ok()) return st;
  for (size_t j = 0; j < miss.size() && !joined.empty(); ++j) {
    std::memcpy(codes + size_t(miss[j]) * hd, &joined[j * rb], hd);
    std::memcpy(scales + size_t(miss[j]) * sb, &joined[j * rb + hd], sb);
  }
  stats_.drive_rows += miss.size();
  stats_.drive_bytes += miss.size() * rb;
  if (clock_->capacity() == 0) return Status();
  for (int i : miss) {
    const uint64_t key = row_key(t, ids[i]);
    // Looking it up again also marks it used: another task (or an earlier column) brought it in.
    if (clock_->lookup(key) >= 0) continue;
    bool evicted = false;
    const int32_t s = clock_->admit(key, &evicted);
    stats_.evictions += evicted ? 1 : 0;
    uint8_t* r = &rows_[size_t(s) * rb];
    std::memcpy(r, codes + size_t(i) * hd, hd);
    std::memcpy(r + hd, scales + size_t(i) * sb, sb);
  }
  return Status();
}

EngramCacheStats EngramRowCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngramCacheStats s = stats_;
  s.resident_rows = clock_->size();
  return s;
}

uint64_t EngramRowCache::host_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rows_.size() + RowClock::state_bytes(clock_->capacity());
}

std::string EngramRowCache::drive_report() const {
  // Every reader's counts, summed per drive; a drive failed when any reader gave it up.
  std::lock_guard<std::mutex> lock(read_mu_);
  std::ostringstream o;
  for (int d = 0; d < int(roots_.size()); ++d) {
    DriveStats t;
    for (const ReplicaReader* r : readers_) {
      const DriveStats s = r->stats(d);
      t.n_reads += s.n_reads;
      t.bytes_read += s.bytes_read;
      t.n_errors += s.n_errors;
      t.n_hedges += s.n_hedges;
      if (s.failed && !t.failed) {
        t.failed = true;
        t.last_error = s.last_error;
      }
    }
    o << "  engram drive " << d << " " << roots_[size_t(d)] << ": " << t.n_reads << " reads, " << t.bytes_read << " B, " << t.n_errors
      << " errors, " << t.n_hedges << " hedges" << (t.failed ? ", failed: " + t.last_error : std::string()) << " (" << readers_.size()
      << " reader" << (readers_.size() == 1 ? "" : "s") << ")\n";
  }
  return o.str();
}

std::vector<EngramSimResult> simulate_engram_cache(const model::Config& c, const std::vector<std::vector<int32_t>>& class_docs,
                                                   int64_t pad_class, const std::vector<uint64_t>& budgets, uint64_t warm_tokens) {
  const auto tables = model::engram_constants(c.engram_layer_ids, c.engram_vocab_size, c.engram_max_ngram, c.engram_n_heads,
                                              c.engram_compressed_vocab);
  const int n_ord = c.engram_max_ngram - 1, H = c.engram_n_heads;
  const size_t per_token = tables.size() * size_t(n_ord * H);
  uint64_t total = 0;
  for (const auto& d : class_docs) total += d.size();
  std::vector<EngramSimResult> out;
  std::vector<RowClock> clocks;
  clocks.reserve(budgets.size());
  for (uint64_t b : budgets) {
    EngramSimResult r;
    r.budget_bytes = b;
    // No more rows than the streams ask for: a larger cache behaves the same (it never evicts).
    r.capacity_rows = std::min<int64_t>(RowClock::fit(b, uint64_t(c.engram_head_dim + c.engram_head_dim / 32)), int64_t(total * per_token));
    clocks.emplace_back(r.capacity_rows);
    out.push_back(r);
  }
  std::vector<int64_t> ids(per_token);
  uint64_t seen = 0;
  for (const auto& doc : class_docs) {
    for (int64_t pos = 0; pos < int64_t(doc.size()); ++pos, ++seen) {
      model::engram_row_ids(tables, c.engram_max_ngram, H, pad_class, pos, [&](int64_t p) { return int64_t(doc[size_t(p)]); }, ids.data());
      const bool measured = seen >= warm_tokens;
      for (size_t k = 0; k < clocks.size(); ++k) {
        EngramSimResult& r = out[k];
        r.tokens += measured ? 1 : 0;
        for (size_t i = 0; i < per_token; ++i) {
          const uint64_t key = row_key(int(i / size_t(n_ord * H)), ids[i]);
          const bool hit = clocks[k].lookup(key) >= 0;
          bool evicted = false;
          if (!hit) clocks[k].admit(key, &evicted);
          if (measured) {
            ++r.lookups;
            r.hits += hit ? 1 : 0;
            r.evictions += evicted ? 1 : 0;
          }
        }
      }
    }
  }
  for (size_t k = 0; k < clocks.size(); ++k) out[k].held_rows = clocks[k].size();
  return out;
}

namespace {

constexpr char kEngramMagic[8] = {'F', 'B', 'E', 'N', 'G', 'R', 'M', '1'};
constexpr uint32_t kEngramVersion = 1;
constexpr uint64_t kPage = 4096;

// The Engram layers of `snap` with their mapped tables.
struct SnapTable {
  int layer = 0;
  int64_t rows = 0;
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
};
Result<std::vector<SnapTable>> snapshot_tables(const loader::Snapshot& snap) {
  const model::Config& c = snap.config();
  std::vector<SnapTable> out;
  for (int l = 0; l < c.n_total_layers(); ++l) {
    if (c.roles[size_t(l)].engram_table < 0) continue;
    const std::string p = model::layer_prefix(c, l);
    auto codes = snap.find(p + "engram.embed.weight");
    auto scales = snap.find(p + "engram.embed.scale");
    if (!codes.ok()) return codes.status();
    if (!scales.ok()) return scales.status();
    out.push_back({l, codes->dim(0), static_cast<const uint8_t*>(codes->data), static_cast<const uint8_t*>(scales->data)});
  }
  if (out.empty()) return FB_ERROR(kUnsupported) << "the model has no Engram layers";
  return out;
}

// Header: magic, version, head_dim, rows_per_page, n_tables, identity, then per table (layer,
// rows, offset), then the CRC32C of everything before it; one page.
std::vector<uint8_t> engram_header(uint64_t identity, int head_dim, int rows_per_page, const std::vector<EngramTableFile>& t) {
  std::vector<uint8_t> h(kPage, 0);
  size_t at = 0;
  auto put = [&](const void* p, size_t n) {
    std::memcpy(&h[at], p, n);
    at += n;
  };
  const uint32_t hd = uint32_t(head_dim), rpp = uint32_t(rows_per_page), n = uint32_t(t.size());
  put(kEngramMagic, 8);
  put(&kEngramVersion, 4);
  put(&hd, 4);
  put(&rpp, 4);
  put(&n, 4);
  put(&identity, 8);
  for (const EngramTableFile& x : t) {
    const int32_t layer = x.layer;
    const int64_t rows = x.rows;
    put(&layer, 4);
    put(&rows, 8);
    put(&x.codes_offset, 8);
  }
  const uint32_t crc = crc32c(h.data(), at);
  put(&crc, 4);
  return h;
}

// The tables' places in a store of `tables` (offsets from the first page after the header).
std::vector<EngramTableFile> engram_layout(const std::vector<SnapTable>& tables, int rows_per_page) {
  std::vector<EngramTableFile> out;
  uint64_t off = kPage;
  for (const SnapTable& t : tables) {
    EngramTableFile f;
    f.layer = t.layer;
    f.rows = t.rows;
    f.rows_per_page = rows_per_page;
    f.codes_path = f.scales_path = kEngramStoreFile;
    f.codes_offset = f.scales_offset = off;
    off += (uint64_t(t.rows) + uint64_t(rows_per_page) - 1) / uint64_t(rows_per_page) * kPage;
    out.push_back(f);
  }
  return out;
}

uint64_t store_bytes(const std::vector<EngramTableFile>& t) {
  const EngramTableFile& last = t.back();
  return last.codes_offset + (uint64_t(last.rows) + uint64_t(last.rows_per_page) - 1) / uint64_t(last.rows_per_page) * kPage;
}

Status write_store_file(const std::string& dir, const std::vector<SnapTable>& tables, const std::vector<EngramTableFile>& layout,
                        const std::vector<uint8_t>& header, int head_dim,
                        const std::function<void(const std::string&, uint64_t, uint64_t)>& progress) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string tmp = dir + "/" + kEngramStoreFile + ".tmp", dst = dir + "/" + kEngramStoreFile;
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return FB_ERROR(kIo) << "cannot write " << tmp;
  const size_t hd = size_t(head_dim), sb = hd / 32, rb = hd + sb;
  const uint64_t total = store_bytes(layout);
  bool ok = std::fwrite(header.data(), 1, header.size(), f) == header.size();
  std::vector<uint8_t> page(kPage);
  uint64_t done = kPage;
  for (size_t k = 0; k < tables.size() && ok; ++k) {
    const SnapTable& t = tables[k];
    const int64_t rpp = layout[k].rows_per_page;
    for (int64_t r0 = 0; r0 < t.rows && ok; r0 += rpp) {
      std::fill(page.begin(), page.end(), uint8_t(0));
      for (int64_t r = r0; r < std::min(t.rows, r0 + rpp); ++r) {
        std::memcpy(&page[size_t(r - r0) * rb], t.codes + size_t(r) * hd, hd);
        std::memcpy(&page[size_t(r - r0) * rb + hd], t.scales + size_t(r) * sb, sb);
      }
      ok = std::fwrite(page.data(), 1, page.size(), f) == page.size();
      done += kPage;
      if (progress && (done % (uint64_t(64) << 20) == 0 || done == total)) progress(dir, done, total);
    }
  }
  ok = std::fflush(f) == 0 && ok;
  ok = ::fsync(fileno(f)) == 0 && ok;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    return FB_ERROR(kIo) << "writing " << tmp;
  }
  if (std::rename(tmp.c_str(), dst.c_str()) != 0) return FB_ERROR(kIo) << "rename " << tmp;
  return Status();
}

// Checks DIR/engram.fbe against what `snap` would write: header bytes and the file's size.
Status check_store(const std::string& dir, const std::vector<uint8_t>& want_header, uint64_t want_bytes) {
  const std::string path = dir + "/" + kEngramStoreFile;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return FB_ERROR(kNotFound) << path << ": no Engram store (flashbox convert --engram)";
  std::vector<uint8_t> h(kPage);
  const bool read = std::fread(h.data(), 1, h.size(), f) == h.size();
  std::fclose(f);
  if (!read || std::memcmp(h.data(), kEngramMagic, 8) != 0) return FB_ERROR(kCorrupt) << path << ": not an Engram store";
  if (h != want_header) return FB_ERROR(kCorrupt) << path << ": written for another model or version (or its header is damaged)";
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec || size != want_bytes) return FB_ERROR(kCorrupt) << path << ": " << size << " B, want " << want_bytes << " (truncated?)";
  return Status();
}

}  // namespace

Status write_engram_store(const loader::Snapshot& snap, const std::vector<std::string>& dirs,
                          const std::function<void(const std::string& dir, uint64_t done, uint64_t total)>& progress) {
  if (dirs.empty()) return FB_ERROR(kInvalidArgument) << "no folder for the Engram store";
  const model::Config& c = snap.config();
  const std::vector<SnapTable> tables = FB_TRY(snapshot_tables(snap));
  const int rb = c.engram_head_dim + c.engram_head_dim / 32, rpp = int(kPage) / rb;
  if (c.engram_head_dim <= 0 || rpp < 1) return FB_ERROR(kUnsupported) << "Engram rows of " << rb << " B do not fit a 4 KiB page";
  const uint64_t identity = FB_TRY(model_identity(snap.dir()));
  const std::vector<EngramTableFile> layout = engram_layout(tables, rpp);
  const std::vector<uint8_t> header = engram_header(identity, c.engram_head_dim, rpp, layout);
  for (const std::string& d : dirs) {
    FB_RETURN_IF_ERROR(write_store_file(d, tables, layout, header, c.engram_head_dim, progress));
    FB_RETURN_IF_ERROR(check_store(d, header, store_bytes(layout)));
  }
  return Status();
}

Result<std::shared_ptr<EngramRowCache>> engram_store_for(const loader::Snapshot& snap, const std::vector<std::string>& store_dirs,
                                                         EngramCacheOptions opt) {
  const model::Config& c = snap.config();
  const std::vector<SnapTable> tables = FB_TRY(snapshot_tables(snap));
  const int rpp = int(kPage) / (c.engram_head_dim + c.engram_head_dim / 32);
  const uint64_t identity = FB_TRY(model_identity(snap.dir()));
  const std::vector<EngramTableFile> layout = engram_layout(tables, rpp);
  const std::vector<uint8_t> header = engram_header(identity, c.engram_head_dim, rpp, layout);
  std::vector<std::string> good;
  std::string why;
  for (const std::string& d : store_dirs) {
    const Status st = check_store(d, header, store_bytes(layout));
    if (st.ok()) {
      good.push_back(d);
      continue;
    }
    FB_LOG(kWarn) << "storage: Engram store " << d << " left out: " << st.message();
    why += "\n  " + st.message();
  }
  if (good.empty()) return FB_ERROR(kIo) << "no usable Engram store of " << store_dirs.size() << ":" << why;
  return EngramRowCache::create(layout, c.engram_head_dim, std::move(good), std::move(opt));
}

Result<std::shared_ptr<EngramRowCache>> engram_store_from_memory(const loader::Snapshot& snap, const std::vector<std::string>& dirs,
                                                                 EngramCacheOptions opt) {
  if (dirs.empty()) return FB_ERROR(kInvalidArgument) << "no folder for the Engram store";
  const model::Config& c = snap.config();
  const std::vector<SnapTable> tables = FB_TRY(snapshot_tables(snap));
  const int rpp = int(kPage) / (c.engram_head_dim + c.engram_head_dim / 32);
  const std::vector<EngramTableFile> layout = engram_layout(tables, rpp);
  const std::vector<uint8_t> header = engram_header(0, c.engram_head_dim, rpp, layout);
  for (const std::string& d : dirs)
    if (!check_store(d, header, store_bytes(layout)).ok()) FB_RETURN_IF_ERROR(write_store_file(d, tables, layout, header, c.engram_head_dim, {}));
  return EngramRowCache::create(layout, c.engram_head_dim, dirs, std::move(opt));
}

Result<std::shared_ptr<EngramRowCache>> engram_cache_for(const loader::Snapshot& snap, const std::vector<std::string>& replica_dirs,
                                                         EngramCacheOptions opt) {
  const model::Config& c = snap.config();
  std::vector<EngramTableFile> tables;
  std::set<std::string> files;
  const uint64_t hd = uint64_t(c.engram_head_dim), sb = hd / 32;
  for (int l = 0; l < c.n_total_layers(); ++l) {
    if (c.roles[size_t(l)].engram_table < 0) continue;
    const std::string p = model::layer_prefix(c, l);
    auto codes = snap.locate(p + "engram.embed.weight");
    auto scales = snap.locate(p + "engram.embed.scale");
    if (!codes.ok() || !scales.ok()) return FB_ERROR(kUnsupported) << "layer " << l << "'s Engram table has no file to read rows from";
    const int64_t rows = hd > 0 ? int64_t(codes->nbytes / hd) : 0;
    if (rows <= 0 || codes->nbytes != uint64_t(rows) * hd || scales->nbytes != uint64_t(rows) * sb)
      return FB_ERROR(kCorrupt) << "layer " << l << "'s Engram table: " << codes->nbytes << " B of codes and " << scales->nbytes
                                << " B of scales for head_dim " << hd;
    EngramTableFile t;
    t.layer = l;
    t.codes_path = fs::path(codes->path).lexically_relative(snap.dir()).string();
    t.scales_path = fs::path(scales->path).lexically_relative(snap.dir()).string();
    t.codes_offset = codes->offset;
    t.scales_offset = scales->offset;
    t.rows = rows;
    files.insert(t.codes_path);
    files.insert(t.scales_path);
    tables.push_back(std::move(t));
  }
  if (tables.empty()) return FB_ERROR(kUnsupported) << "the model has no Engram layers";
  for (const std::string& f : files)
    if (f.empty() || f.rfind("..", 0) == 0) return FB_ERROR(kUnsupported) << "Engram tables not in files under " << snap.dir();
  // A replica must hold every shard with the same size (the bytes are trusted to match: a copy of
  // the snapshot); one that does not is left out, as a lost expert-store replica is.
  std::vector<std::string> roots{snap.dir()};
  for (const std::string& dir : replica_dirs) {
    std::string why;
    for (const std::string& f : files) {
      std::error_code ec1, ec2;
      const auto a = fs::file_size(fs::path(snap.dir()) / f, ec1), b = fs::file_size(fs::path(dir) / f, ec2);
      if (ec2) why = f + ": " + ec2.message();
      else if (!ec1 && a != b) why = f + ": " + std::to_string(b) + " B, the snapshot's has " + std::to_string(a);
      if (!why.empty()) break;
    }
    if (!why.empty()) {
      FB_LOG(kWarn) << "storage: Engram replica " << dir << " left out: " << why;
      continue;
    }
    roots.push_back(dir);
  }
  return EngramRowCache::create(std::move(tables), c.engram_head_dim, std::move(roots), std::move(opt));
}

}  // namespace fb::storage
