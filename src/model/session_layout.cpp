#include "model/session_layout.h"

#include <algorithm>
#include <cstring>

#include "base/crc32c.h"

namespace fb::model {

namespace {

// Header: magic 8, version 4, flags 4, model id 8, position 8, layers 4, draft stages 4.
constexpr size_t kPosAt = 24;
constexpr size_t kHeaderBytes = 40;

RingLayout ring_at(size_t& at, int slots, int head_dim) {
  RingLayout r;
  r.slots = slots;
  r.row_bytes = ring_row_bytes(head_dim);
  r.at = at;
  r.pos_at = at + 8;
  r.data_at = r.pos_at + size_t(slots) * sizeof(int64_t);
  at = r.data_at + r.data_bytes();
  return r;
}

template <typename T>
void put_at(char* out, size_t at, T v) {
  std::memcpy(out + at, &v, sizeof v);
}

template <typename T>
T get_at(std::string_view b, size_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof v);
  return v;
}

Status truncated(size_t at, const char* what) {
  return FB_ERROR(kCorrupt) << "session state: truncated or malformed at byte " << at << " (" << what << ")";
}

}  // namespace

CompGeometry comp_geometry(const Config& c, int layer) {
  const LayerRole& role = c.roles[size_t(layer)];
  CompGeometry g;
  if (!role.kv_source) return g;
  g.ratio = role.ratio;
  g.kv_bytes = comp_kv_bytes(c);
  g.key_bytes = comp_key_bytes(c);
  if (role.ratio == 2) {
    g.tail_slots = kTailSlots;
    g.tail_floats = int64_t(kTailSlots) * 2 * c.head_dim;
  }
  return g;
}

SessionLayout session_layout(const Config& c, int64_t next_pos) {
  SessionLayout l;
  l.next_pos = next_pos;
  size_t at = kHeaderBytes;
  l.tokens_at = at;
  at += size_t(next_pos) * sizeof(int32_t);
  l.image_at = at;
  at += size_t(next_pos);
  for (int i = 0; i < c.n_layers; ++i) l.rings.push_back(ring_at(at, c.window_size + kRingHeadroom, c.head_dim));
  for (int i = 0; i < c.n_layers; ++i) {
    CompLayout cc{comp_geometry(c, i)};
    if (cc.ratio) cc.entries = next_pos / cc.ratio;
    cc.at = at;
    cc.kv_at = at + 20;
    cc.keys_at = cc.kv_at + cc.kv_size();
    cc.n_tail_at = cc.keys_at + cc.keys_size();
    cc.tail_pos_at = cc.n_tail_at + 8;
    cc.tail_at = cc.tail_pos_at + size_t(cc.tail_slots) * sizeof(int64_t);
    at = cc.tail_at + cc.tail_size();
    l.comp.push_back(cc);
  }
  for (int i = 0; i < c.n_mtp_layers; ++i) l.draft_rings.push_back(ring_at(at, c.window_size, c.head_dim));
  l.total_bytes = at + 4;
  return l;
}

void write_session_fields(const SessionLayout& l, uint64_t model_id, const SessionFields& f, char* out) {
  std::memcpy(out, kSessionMagic, sizeof kSessionMagic);
  put_at<uint32_t>(out, 8, kSessionVersion);
  put_at<uint32_t>(out, 12, 0);  // flags
  put_at<uint64_t>(out, 16, model_id);
  put_at<int64_t>(out, kPosAt, l.next_pos);
  put_at<int32_t>(out, 32, int32_t(l.rings.size()));
  put_at<int32_t>(out, 36, int32_t(l.draft_rings.size()));
  if (l.next_pos > 0) {
    std::memcpy(out + l.tokens_at, f.tokens, size_t(l.next_pos) * sizeof(int32_t));
    std::memcpy(out + l.image_at, f.image, size_t(l.next_pos));
  }
  auto ring = [out](const RingLayout& r, const int64_t* pos) {
    put_at<int32_t>(out, r.at, r.slots);
    put_at<int32_t>(out, r.at + 4, r.row_bytes);
    std::memcpy(out + r.pos_at, pos, size_t(r.slots) * sizeof(int64_t));
  };
  for (size_t i = 0; i < l.rings.size(); ++i) ring(l.rings[i], f.ring_pos[i]);
  for (size_t i = 0; i < l.comp.size(); ++i) {
    const CompLayout& cc = l.comp[i];
    put_at<int32_t>(out, cc.at, cc.ratio);
    put_at<int32_t>(out, cc.at + 4, cc.kv_bytes);
    put_at<int32_t>(out, cc.at + 8, cc.key_bytes);
    put_at<int64_t>(out, cc.at + 12, cc.entries);
    put_at<int64_t>(out, cc.n_tail_at, cc.tail_slots);
    if (cc.tail_slots) std::memcpy(out + cc.tail_pos_at, f.tail_pos[i], size_t(cc.tail_slots) * sizeof(int64_t));
  }
  for (size_t i = 0; i < l.draft_rings.size(); ++i) ring(l.draft_rings[i], f.draft_pos[i]);
}

void seal_session(char* out, size_t total_bytes) {
  const uint32_t crc = crc32c(out, total_bytes - 4);
  std::memcpy(out + total_bytes - 4, &crc, 4);
}

Result<SessionLayout> parse_session_layout(const Config& c, std::string_view bytes, uint64_t model_id) {
  if (bytes.size() < sizeof kSessionMagic + 4 || std::memcmp(bytes.data(), kSessionMagic, sizeof kSessionMagic) != 0)
    return FB_ERROR(kCorrupt) << "session state: not a flashbox session (bad magic)";
  const size_t body = bytes.size() - 4;
  if (crc32c(bytes.data(), body) != get_at<uint32_t>(bytes, body))
    return FB_ERROR(kCorrupt) << "session state: checksum mismatch (" << bytes.size() << " bytes)";
  if (body < 16) return truncated(body, "version");
  const uint32_t version = get_at<uint32_t>(bytes, 8);
  if (version != kSessionVersion)
    return FB_ERROR(kUnsupported) << "session state: format version " << version << ", this build reads " << kSessionVersion;
  if (body < 24) return truncated(body, "model id");
  const uint64_t id = get_at<uint64_t>(bytes, 16);
  if (id != model_id)
    return FB_ERROR(kInvalidArgument) << "session state: written for another model (id " << id << ", this model " << model_id << ")";
  if (body < kHeaderBytes) return truncated(body, "position");
  const int64_t P = get_at<int64_t>(bytes, kPosAt);
  const int32_t n_rings = get_at<int32_t>(bytes, 32), n_draft = get_at<int32_t>(bytes, 36);
  if (P < 0 || n_rings != c.n_layers || n_draft != c.n_mtp_layers)
    return FB_ERROR(kInvalidArgument) << "session state: " << n_rings << " layers and " << n_draft << " draft stages at position " << P
                                      << "; this model has " << c.n_layers << " and " << c.n_mtp_layers;
  // Every position costs 5 bytes (token id, image flag): a larger P cannot fit (and would
  // overflow the offsets below).
  if (uint64_t(P) > (body - kHeaderBytes) / 5) return truncated(kHeaderBytes, "tokens");
  SessionLayout l = session_layout(c, P);
  for (int64_t i = 0; i < P; ++i) {
    const int32_t t = get_at<int32_t>(bytes, l.tokens_at + size_t(i) * 4);
    if (t < 0 || t >= c.vocab_size) return FB_ERROR(kCorrupt) << "session state: token id " << t << " outside the vocabulary";
  }
  // Each section in stream order: its header must be this config's, and its bytes present.
  auto have = [body](size_t at, size_t n) { return at <= body && n <= body - at; };
  auto ring = [&](const RingLayout& r, const char* what) -> Status {
    if (!have(r.at, 8)) return truncated(std::min(r.at, body), what);
    const int32_t slots = get_at<int32_t>(bytes, r.at), row_bytes = get_at<int32_t>(bytes, r.at + 4);
    if (slots != r.slots || row_bytes != r.row_bytes)
      return FB_ERROR(kInvalidArgument) << "session state: " << what << " has " << slots << " slots of " << row_bytes
                                        << " bytes; this model uses " << r.slots << " of " << r.row_bytes;
    if (!have(r.pos_at, size_t(r.slots) * 8 + r.data_bytes())) return truncated(r.pos_at, what);
    for (int64_t i = 0; i < r.slots; ++i) {
      const int64_t p = get_at<int64_t>(bytes, r.pos_at + size_t(i) * 8);
      // Positions at or past P may remain after a rollback (stale rows nobody reads).
      if (p < -1 || (p >= 0 && p % r.slots != i)) return FB_ERROR(kCorrupt) << "session state: " << what << " slot " << i << " holds position " << p;
    }
    return Status();
  };
  for (const RingLayout& r : l.rings) FB_RETURN_IF_ERROR(ring(r, "window ring"));
  for (size_t i = 0; i < l.comp.size(); ++i) {
    const CompLayout& cc = l.comp[i];
    if (!have(cc.at, 20)) return truncated(std::min(cc.at, body), "compressor");
    const int32_t ratio = get_at<int32_t>(bytes, cc.at), kvb = get_at<int32_t>(bytes, cc.at + 4), keyb = get_at<int32_t>(bytes, cc.at + 8);
    const int64_t entries = get_at<int64_t>(bytes, cc.at + 12);
    if (ratio != cc.ratio || kvb != cc.kv_bytes || keyb != cc.key_bytes)
      return FB_ERROR(kInvalidArgument) << "session state: layer " << i << "'s compressed cache (ratio " << ratio << ") does not match this model's";
    if (ratio && entries != cc.entries)
      return FB_ERROR(kCorrupt) << "session state: layer " << i << " holds " << entries << " compressed entries at position " << P;
    if (!ratio && entries != 0) return FB_ERROR(kCorrupt) << "session state: layer " << i << " has entries but no compressor";
    if (!have(cc.kv_at, cc.kv_size() + cc.keys_size() + 8)) return truncated(cc.kv_at, "compressed KV");
    const int64_t n_tail = get_at<int64_t>(bytes, cc.n_tail_at);
    if (n_tail != cc.tail_slots) return FB_ERROR(kCorrupt) << "session state: layer " << i << " tail of " << n_tail << " slots";
    if (!have(cc.tail_pos_at, size_t(cc.tail_slots) * 8 + cc.tail_size())) return truncated(cc.tail_pos_at, "compressor tail");
  }
  for (const RingLayout& r : l.draft_rings) FB_RETURN_IF_ERROR(ring(r, "draft ring"));
  if (l.total_bytes != bytes.size())
    return FB_ERROR(kCorrupt) << "session state: " << bytes.size() - l.total_bytes << " bytes after the last section";
  return l;
}

std::string fresh_session_bytes(const Config& c, uint64_t model_id) {
  const SessionLayout l = session_layout(c, 0);
  std::string out(l.total_bytes, '\0');  // caches and tails: zero rows, as a fresh cache holds
  // Every slot's position is -1 (never written); one run of -1 serves each array.
  size_t longest = 0;
  for (const RingLayout& r : l.rings) longest = std::max(longest, size_t(r.slots));
  for (const RingLayout& r : l.draft_rings) longest = std::max(longest, size_t(r.slots));
  for (const CompLayout& cc : l.comp) longest = std::max(longest, size_t(cc.tail_slots));
  const std::vector<int64_t> never(longest, -1);
  SessionFields f;
  f.ring_pos.assign(l.rings.size(), never.data());
  f.tail_pos.assign(l.comp.size(), never.data());
  f.draft_pos.assign(l.draft_rings.size(), never.data());
  write_session_fields(l, model_id, f, out.data());
  seal_session(out.data(), l.total_bytes);
  return out;
}

}  // namespace fb::model
