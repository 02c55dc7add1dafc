#include "cpu/session_cache.h"

#include <algorithm>
#include <cstring>

#include "base/crc32c.h"

namespace fb::cpu {

void Ring::init(int n_slots, int head_dim) {
  slots = n_slots;
  row_bytes = model::ring_row_bytes(head_dim);
  data.assign(size_t(slots) * size_t(row_bytes), 0);
  pos.assign(size_t(slots), -1);
}

const uint8_t* Ring::find(int64_t p) const {
  if (p < 0) return nullptr;
  const size_t s = size_t(p % slots);
  return pos[s] == p ? data.data() + s * size_t(row_bytes) : nullptr;
}

SessionCache::SessionCache(const model::Config& c) : config_(&c) { reset(); }

SessionRegistry::Totals SessionRegistry::totals() const {
  Totals t;
  for_each([&t](const SessionCache& s) {
    ++t.sessions;
    t.bytes += s.bytes();
  });
  return t;
}

void SessionCache::track(std::shared_ptr<SessionRegistry> registry) { tracker_.track(std::move(registry), this); }

uint64_t SessionCache::bytes() const {
  const auto vb = [](const auto& v) { return uint64_t(v.capacity()) * sizeof(v[0]); };
  const auto ring = [&](const Ring& r) { return vb(r.data) + vb(r.pos); };
  uint64_t n = vb(tokens) + vb(image);
  for (const Ring& r : rings) n += ring(r);
  for (const Ring& r : draft_rings) n += ring(r);
  for (const CompressedCache& c : comp) n += vb(c.kv) + vb(c.keys) + vb(c.tail) + vb(c.tail_pos);
  return n;
}

void SessionCache::reset() {
  const model::Config& c = *config_;
  next_pos = 0;
  tokens.clear();
  image.clear();
  rings.assign(size_t(c.n_layers), Ring{});
  for (auto& r : rings) r.init(c.window_size + kRingHeadroom, c.head_dim);
  comp.assign(size_t(c.n_layers), CompressedCache{});
  for (int l = 0; l < c.n_layers; ++l) {
    CompressedCache& cc = comp[size_t(l)];
    static_cast<model::CompGeometry&>(cc) = model::comp_geometry(c, l);
    cc.tail.assign(size_t(cc.tail_floats), 0.0f);
    cc.tail_pos.assign(size_t(cc.tail_slots), -1);
  }
  draft_rings.assign(size_t(c.n_mtp_layers), Ring{});
  for (auto& r : draft_rings) r.init(c.window_size, c.head_dim);
}

Status SessionCache::rollback(int64_t p) {
  FB_RETURN_IF_ERROR(model::check_rollback(*config_, next_pos, p, rings, comp));
  next_pos = p;
  tokens.resize(size_t(p));
  image.resize(size_t(p));
  for (CompressedCache& cc : comp) {
    if (!cc.ratio) continue;
    const size_t keep = size_t(p / cc.ratio);
    cc.kv.resize(keep * size_t(cc.kv_bytes));
    cc.keys.resize(keep * size_t(cc.key_bytes));
  }
  return Status();
}

// ---- serialization (docs/formats.md "Session state") --------------------------------------------

namespace {

constexpr const char (&kMagic)[8] = model::kSessionMagic;
constexpr uint32_t kVersion = model::kSessionVersion;

struct Writer {
  std::string b;
  template <typename T>
  void put(T v) {
    b.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  template <typename T>
  void put_vec(const std::vector<T>& v) {
    if (!v.empty()) b.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
};

struct Reader {
  std::string_view b;
  size_t at = 0;
  Status fail(const char* what) const { return FB_ERROR(kCorrupt) << "session state: truncated or malformed at byte " << at << " (" << what << ")"; }
  template <typename T>
  Status get(T* v, const char* what) {
    if (b.size() - at < sizeof(T)) return fail(what);
    std::memcpy(v, b.data() + at, sizeof(T));
    at += sizeof(T);
    return Status();
  }
  template <typename T>
  Status get_vec(std::vector<T>* v, int64_t n, const char* what) {
    if (n < 0 || uint64_t(n) > (b.size() - at) / sizeof(T)) return fail(what);
    v->resize(size_t(n));
    if (n) std::memcpy(v->data(), b.data() + at, size_t(n) * sizeof(T));
    at += size_t(n) * sizeof(T);
    return Status();
  }
};

void put_ring(Writer& w, const Ring& r) {
  w.put<int32_t>(r.slots);
  w.put<int32_t>(r.row_bytes);
  w.put_vec(r.pos);
  w.put_vec(r.data);
}

// Reads into `r`, which holds this config's fresh ring (reset()): the stored layout must be its
// layout, and every position must sit in its own slot.
Status get_ring(Reader& rd, Ring* r, const char* what) {
  const Ring want{r->slots, r->row_bytes, {}, {}};
  int32_t slots = 0, row_bytes = 0;
  FB_RETURN_IF_ERROR(rd.get(&slots, what));
  FB_RETURN_IF_ERROR(rd.get(&row_bytes, what));
  if (slots != want.slots || row_bytes != want.row_bytes)
    return FB_ERROR(kInvalidArgument) << "session state: " << what << " has " << slots << " slots of " << row_bytes << " bytes; this model uses "
                                      << want.slots << " of " << want.row_bytes;
  r->slots = slots;
  r->row_bytes = row_bytes;
  FB_RETURN_IF_ERROR(rd.get_vec(&r->pos, slots, what));
  FB_RETURN_IF_ERROR(rd.get_vec(&r->data, int64_t(slots) * row_bytes, what));
  for (int64_t i = 0; i < slots; ++i) {
    const int64_t p = r->pos[size_t(i)];
    // Positions at or past next_pos may remain after a rollback (stale rows nobody reads).
    if (p < -1 || (p >= 0 && p % slots != i)) return FB_ERROR(kCorrupt) << "session state: " << what << " slot " << i << " holds position " << p;
  }
  return Status();
}

}  // namespace

std::string SessionCache::serialize(uint64_t model_id) const {
  Writer w;
  w.b.append(kMagic, sizeof kMagic);
  w.put<uint32_t>(kVersion);
  w.put<uint32_t>(0);  // flags
  w.put<uint64_t>(model_id);
  w.put<int64_t>(next_pos);
  w.put<int32_t>(int32_t(rings.size()));
  w.put<int32_t>(int32_t(draft_rings.size()));
  w.put_vec(tokens);
  w.put_vec(image);
  for (const Ring& r : rings) put_ring(w, r);
  for (const CompressedCache& cc : comp) {
    w.put<int32_t>(cc.ratio);
    w.put<int32_t>(cc.kv_bytes);
    w.put<int32_t>(cc.key_bytes);
    w.put<int64_t>(cc.n_entries());
    w.put_vec(cc.kv);
    w.put_vec(cc.keys);
    w.put<int64_t>(int64_t(cc.tail_pos.size()));
    w.put_vec(cc.tail_pos);
    w.put_vec(cc.tail);
  }
  for (const Ring& r : draft_rings) put_ring(w, r);
  w.put<uint32_t>(crc32c(w.b.data(), w.b.size()));
  return std::move(w.b);
}

Status SessionCache::restore(std::string_view bytes, uint64_t model_id) {
  if (bytes.size() < sizeof kMagic + 4 || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    return FB_ERROR(kCorrupt) << "session state: not a flashbox session (bad magic)";
  const size_t body = bytes.size() - 4;
  uint32_t crc = 0;
  std::memcpy(&crc, bytes.data() + body, 4);
  if (crc32c(bytes.data(), body) != crc) return FB_ERROR(kCorrupt) << "session state: checksum mismatch (" << bytes.size() << " bytes)";
  Reader rd{bytes.substr(0, body), sizeof kMagic};
  uint32_t version = 0, flags = 0;
  uint64_t id = 0;
  FB_RETURN_IF_ERROR(rd.get(&version, "version"));
  FB_RETURN_IF_ERROR(rd.get(&flags, "flags"));
  if (version != kVersion) return FB_ERROR(kUnsupported) << "session state: format version " << version << ", this build reads " << kVersion;
  FB_RETURN_IF_ERROR(rd.get(&id, "model id"));
  if (id != model_id)
    return FB_ERROR(kInvalidArgument) << "session state: written for another model (id " << id << ", this model " << model_id << ")";
  SessionCache s(*config_);  // the layout this config expects; filled, checked, then swapped in
  int32_t n_rings = 0, n_draft = 0;
  FB_RETURN_IF_ERROR(rd.get(&s.next_pos, "position"));
  FB_RETURN_IF_ERROR(rd.get(&n_rings, "layers"));
  FB_RETURN_IF_ERROR(rd.get(&n_draft, "draft stages"));
  if (s.next_pos < 0 || n_rings != int32_t(s.rings.size()) || n_draft != int32_t(s.draft_rings.size()))
    return FB_ERROR(kInvalidArgument) << "session state: " << n_rings << " layers and " << n_draft << " draft stages at position " << s.next_pos
                                      << "; this model has " << s.rings.size() << " and " << s.draft_rings.size();
  FB_RETURN_IF_ERROR(rd.get_vec(&s.tokens, s.next_pos, "tokens"));
  FB_RETURN_IF_ERROR(rd.get_vec(&s.image, s.next_pos, "image flags"));
  for (int32_t t : s.tokens)
    if (t < 0 || t >= config_->vocab_size) return FB_ERROR(kCorrupt) << "session state: token id " << t << " outside the vocabulary";
  for (Ring& r : s.rings) FB_RETURN_IF_ERROR(get_ring(rd, &r, "window ring"));
  for (size_t l = 0; l < s.comp.size(); ++l) {
    CompressedCache& cc = s.comp[l];
    int32_t ratio = 0, kvb = 0, keyb = 0;
    int64_t entries = 0, n_tail = 0;
    FB_RETURN_IF_ERROR(rd.get(&ratio, "compressor"));
    FB_RETURN_IF_ERROR(rd.get(&kvb, "compressor"));
    FB_RETURN_IF_ERROR(rd.get(&keyb, "compressor"));
    FB_RETURN_IF_ERROR(rd.get(&entries, "compressor"));
    if (ratio != cc.ratio || kvb != cc.kv_bytes || keyb != cc.key_bytes)
      return FB_ERROR(kInvalidArgument) << "session state: layer " << l << "'s compressed cache (ratio " << ratio << ") does not match this model's";
    if (ratio && entries != s.next_pos / ratio)
      return FB_ERROR(kCorrupt) << "session state: layer " << l << " holds " << entries << " compressed entries at position " << s.next_pos;
    if (!ratio && entries != 0) return FB_ERROR(kCorrupt) << "session state: layer " << l << " has entries but no compressor";
    FB_RETURN_IF_ERROR(rd.get_vec(&cc.kv, entries * kvb, "compressed KV"));
    FB_RETURN_IF_ERROR(rd.get_vec(&cc.keys, entries * keyb, "index keys"));
    FB_RETURN_IF_ERROR(rd.get(&n_tail, "compressor tail"));
    if (n_tail != int64_t(cc.tail_pos.size())) return FB_ERROR(kCorrupt) << "session state: layer " << l << " tail of " << n_tail << " slots";
    FB_RETURN_IF_ERROR(rd.get_vec(&cc.tail_pos, n_tail, "compressor tail"));
    FB_RETURN_IF_ERROR(rd.get_vec(&cc.tail, int64_t(cc.tail.size()), "compressor tail"));  // the fresh tail's size
  }
  for (Ring& r : s.draft_rings) FB_RETURN_IF_ERROR(get_ring(rd, &r, "draft ring"));
  if (rd.at != rd.b.size()) return FB_ERROR(kCorrupt) << "session state: " << rd.b.size() - rd.at << " bytes after the last section";
  next_pos = s.next_pos;
  tokens = std::move(s.tokens);
  image = std::move(s.image);
  rings = std::move(s.rings);
  comp = std::move(s.comp);
  draft_rings = std::move(s.draft_rings);
  return Status();
}

}  // namespace fb::cpu
