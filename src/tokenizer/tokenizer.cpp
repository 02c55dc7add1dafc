#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "base/check.h"
#include "base/mapped_file.h"
#include "tokenizer/sha256.h"
#include "tokenizer/utf8.h"

namespace fb::tokenizer {

// ---- ByteLevel alphabet (spec/15 §1) ----

namespace {

struct ByteLevelTables {
  char32_t to_char[256];
  int16_t from_char[0x144];  // code point -> byte, -1 outside the alphabet
  ByteLevelTables() {
    std::fill(std::begin(from_char), std::end(from_char), int16_t(-1));
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[b] = printable ? char32_t(b) : next++;
      from_char[to_char[b]] = int16_t(b);
    }
  }
};
const ByteLevelTables kByteLevel;

int byte_level_inverse(char32_t c) { return c < 0x144 ? kByteLevel.from_char[c] : -1; }

// Decodes one scalar value from valid UTF-8 at s[*i], advancing *i.
char32_t next_code_point(std::string_view s, size_t* i) {
  const auto b0 = uint8_t(s[*i]);
  if (b0 < 0x80) {
    *i += 1;
    return b0;
  }
  int n = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
  char32_t cp = b0 & (0x7F >> n);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (uint8_t(s[*i + size_t(k)]) & 0x3F);
  *i += size_t(n);
  return cp;
}

struct HeapEntry {
  uint32_t rank;
  uint32_t pos;
  int32_t left_id, right_id;
  // std heap is a max-heap: "greater" entries sink, so the smallest (rank, pos) is on top.
  bool operator<(const HeapEntry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

char32_t byte_level_char(uint8_t b) { return kByteLevel.to_char[b]; }

bool byte_level_to_bytes(std::string_view s, std::string* out) {
  out->clear();
  if (!utf8_is_valid(s)) return false;
  size_t i = 0;
  while (i < s.size()) {
    int b = byte_level_inverse(next_code_point(s, &i));
    if (b < 0) return false;
    out->push_back(char(b));
  }
  return true;
}

// ---- loading ----

Result<Tokenizer> Tokenizer::load(const std::string& path) {
  auto text = FB_TRY(read_file_bytes(path));
  auto tok = from_json_text(text);
  if (!tok.ok()) return tok.status().with_context(path);
  return tok;
}

Result<Tokenizer> Tokenizer::from_json_text(std::string_view json_text) {
  // nlohmann throws on bad JSON: wrap it once here (no exceptions cross our code).
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return FB_ERROR(kCorrupt) << "tokenizer.json is not a JSON object";
  Tokenizer t;
  t.source_sha256_ = sha256_hex(json_text);
  try {
    const auto& model = j.at("model");
    if (model.value("type", "") != "BPE") return FB_ERROR(kUnsupported) << "tokenizer model is not BPE";
    if (model.contains("byte_fallback") && model["byte_fallback"].is_boolean() && model["byte_fallback"].get<bool>())
      return FB_ERROR(kUnsupported) << "BPE byte_fallback is not supported";
    if (const auto& n = j["normalizer"]; !n.is_null()) {
      const bool empty_seq = n.value("type", "") == "Sequence" && n.value("normalizers", nlohmann::json::array()).empty();
      if (!empty_seq) return FB_ERROR(kUnsupported) << "only an empty normalizer is supported";
    }
    // Pre-tokenizer: Split (Isolated) steps, then a ByteLevel step without its own regex.
    std::vector<std::string> patterns;
    const auto& pre = j.at("pre_tokenizer");
    std::vector<nlohmann::json> steps;
    if (pre.value("type", "") == "Sequence") {
      for (const auto& s : pre.at("pretokenizers")) steps.push_back(s);
    } else {
      steps.push_back(pre);
    }
    bool byte_level = false;
    for (const auto& s : steps) {
      const std::string type = s.value("type", "");
      if (type == "Split") {
        if (s.value("behavior", "") != "Isolated" || s.value("invert", false) || !s.at("pattern").contains("Regex"))
          return FB_ERROR(kUnsupported) << "only Isolated, non-inverted regex Split steps are supported";
        patterns.push_back(s.at("pattern").at("Regex").get<std::string>());
      } else if (type == "ByteLevel") {
        if (s.value("add_prefix_space", false) || s.value("use_regex", true))
          return FB_ERROR(kUnsupported) << "ByteLevel pre-tokenizer with prefix space or its own regex";
        byte_level = true;
      } else {
        return FB_ERROR(kUnsupported) << "pre-tokenizer step " << type;
      }
    }
    if (!byte_level) return FB_ERROR(kUnsupported) << "pre-tokenizer has no ByteLevel step";
    t.pre_ = FB_TRY(PreTokenizer::create(patterns));

    // Vocabulary.
    const auto& vocab = model.at("vocab");
    int32_t max_id = -1;
    for (const auto& [s, id] : vocab.items()) max_id = std::max(max_id, id.get<int32_t>());
    for (const auto& a : j.at("added_tokens")) max_id = std::max(max_id, a.at("id").get<int32_t>());
    if (max_id < 255) return FB_ERROR(kCorrupt) << "vocabulary too small";
    t.id_bytes_.assign(size_t(max_id) + 1, std::string());
    t.added_index_.assign(size_t(max_id) + 1, -1);
    std::vector<bool> seen(size_t(max_id) + 1, false);
    std::fill(std::begin(t.byte_id_), std::end(t.byte_id_), -1);
    std::string bytes;
    for (const auto& [s, idj] : vocab.items()) {
      const int32_t id = idj.get<int32_t>();
      if (id < 0) return FB_ERROR(kCorrupt) << "negative id in vocab";
      if (!byte_level_to_bytes(s, &bytes)) {
        // Not a ByteLevel string (e.g. a control token also listed in vocab): literal bytes.
        bytes = s;
      } else {
        t.bytes_to_id_.emplace(bytes, id);
        if (bytes.size() == 1) t.byte_id_[uint8_t(bytes[0])] = id;
      }
      t.id_bytes_[size_t(id)] = bytes;
      seen[size_t(id)] = true;
    }
    for (int b = 0; b < 256; ++b)
      if (t.byte_id_[b] < 0) return FB_ERROR(kCorrupt) << "vocab lacks the single-byte token for byte " << b;

    // Merges: "a b" strings (older files) or ["a", "b"] pairs (newer files).
    const auto& merges = model.at("merges");
    uint32_t rank = 0;
    std::string left, right;
    for (const auto& m : merges) {
      std::string ls, rs;
      if (m.is_string()) {
        const std::string ms = m.get<std::string>();
        const size_t sp = ms.find(' ');
        if (sp == std::string::npos) return FB_ERROR(kCorrupt) << "merge without a space: " << ms;
        ls = ms.substr(0, sp);
        rs = ms.substr(sp + 1);
      } else {
        ls = m.at(0).get<std::string>();
        rs = m.at(1).get<std::string>();
      }
      if (!byte_level_to_bytes(ls, &left) || !byte_level_to_bytes(rs, &right))
        return FB_ERROR(kCorrupt) << "merge with a non-ByteLevel string: " << ls << " " << rs;
      auto li = t.bytes_to_id_.find(left), ri = t.bytes_to_id_.find(right), mi = t.bytes_to_id_.find(left + right);
      if (li == t.bytes_to_id_.end() || ri == t.bytes_to_id_.end() || mi == t.bytes_to_id_.end())
        return FB_ERROR(kCorrupt) << "merge refers to a token missing from the vocab: " << ls << " " << rs;
      const uint64_t key = uint64_t(uint32_t(li->second)) << 32 | uint32_t(ri->second);
      // First occurrence wins (lowest rank), as in HF.
      t.merges_.emplace(key, uint64_t(rank) << 32 | uint32_t(mi->second));
      ++rank;
    }

    // Added tokens.
    t.trie_.emplace_back();
    for (const auto& a : j.at("added_tokens")) {
      AddedToken at;
      at.id = a.at("id").get<int32_t>();
      at.content = a.at("content").get<std::string>();
      at.special = a.value("special", false);
      if (at.content.empty()) return FB_ERROR(kCorrupt) << "empty added token " << at.id;
      if (a.value("lstrip", false) || a.value("rstrip", false) || a.value("single_word", false))
        return FB_ERROR(kUnsupported) << "added token " << at.content << " uses lstrip/rstrip/single_word";
      if (t.added_index_[size_t(at.id)] >= 0) return FB_ERROR(kCorrupt) << "added token id " << at.id << " twice";
      // HF's ByteLevel decoder maps a token through the alphabet when every character is in it,
      // else emits the token string's own bytes.
      if (!byte_level_to_bytes(at.content, &bytes)) bytes = at.content;
      t.id_bytes_[size_t(at.id)] = bytes;
      seen[size_t(at.id)] = true;
      t.added_index_[size_t(at.id)] = int32_t(t.added_.size());
      int32_t node = 0;
      for (char c : at.content) {
        auto& next = t.trie_[size_t(node)].next;
        auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(uint8_t(c), int32_t(-1)));
        if (it == next.end() || it->first != uint8_t(c)) {
          const int32_t child = int32_t(t.trie_.size());
          t.trie_[size_t(node)].next.insert(it, {uint8_t(c), child});
          t.trie_.emplace_back();
          node = child;
        } else {
          node = it->second;
        }
      }
      t.trie_[size_t(node)].added = int32_t(t.added_.size());
      t.added_first_byte_[uint8_t(at.content[0])] = true;
      t.added_.push_back(std::move(at));
    }
    for (size_t id = 0; id < seen.size(); ++id)
      if (!seen[id]) return FB_ERROR(kCorrupt) << "token id " << id << " is neither in vocab nor added";
  } catch (const nlohmann::json::exception& e) {
    return FB_ERROR(kCorrupt) << "tokenizer.json: " << e.what();
  }
  return t;
}

// ---- encoding ----

size_t Tokenizer::match_added(std::string_view text, int32_t* added) const {
  int32_t node = 0;
  size_t best = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto& next = trie_[size_t(node)].next;
    auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(uint8_t(text[i]), int32_t(-1)));
    if (it == next.end() || it->first != uint8_t(text[i])) break;
    node = it->second;
    if (trie_[size_t(node)].added >= 0) {
      best = i + 1;
      *added = trie_[size_t(node)].added;
    }
  }
  return best;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  std::string sanitized;
  if (!utf8_is_valid(text)) {
    sanitized = utf8_sanitize(text);
    text = sanitized;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  if (!options.match_added_tokens || added_.empty()) {
    encode_plain(text, &out);
    return out;
  }
  // Leftmost-longest added-token matching (HF AddedVocabulary); plain text between matches.
  size_t plain_start = 0, i = 0;
  while (i < text.size()) {
    if (!added_first_byte_[uint8_t(text[i])]) {
      ++i;
      continue;
    }
    int32_t idx = -1;
    const size_t len = match_added(text.substr(i), &idx);
    if (len == 0) {
      ++i;
      continue;
    }
    encode_plain(text.substr(plain_start, i - plain_start), &out);
    out.push_back(added_[size_t(idx)].id);
    i += len;
    plain_start = i;
  }
  encode_plain(text.substr(plain_start), &out);
  return out;
}

void Tokenizer::encode_plain(std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  pre_.split(text, [&](std::string_view piece) { bpe(piece, out); });
}

void Tokenizer::bpe(std::string_view piece, std::vector<int32_t>* out) const {
  const size_t n = piece.size();
  if (n == 1) {
    out->push_back(byte_id_[uint8_t(piece[0])]);
    return;
  }
  if (n == 2) {
    const int32_t l = byte_id_[uint8_t(piece[0])], r = byte_id_[uint8_t(piece[1])];
    auto m = merges_.find(uint64_t(uint32_t(l)) << 32 | uint32_t(r));
    if (m != merges_.end()) {
      out->push_back(int32_t(uint32_t(m->second)));
    } else {
      out->push_back(l);
      out->push_back(r);
    }
    return;
  }
  // Symbols form a linked list over byte positions; the heap yields the lowest-rank pair,
  // leftmost among equal ranks (HF's Merge ordering). O(n log n) in the piece length.
  struct Sym {
    int32_t id, prev, next;
    bool alive;
  };
  std::vector<Sym> sym(n);
  for (size_t i = 0; i < n; ++i)
    sym[i] = {byte_id_[uint8_t(piece[i])], int32_t(i) - 1, i + 1 < n ? int32_t(i + 1) : -1, true};
  std::vector<HeapEntry> heap;
  heap.reserve(n);
  auto push_pair = [&](int32_t l) {
    if (l < 0) return;
    const int32_t r = sym[size_t(l)].next;
    if (r < 0) return;
    auto m = merges_.find(uint64_t(uint32_t(sym[size_t(l)].id)) << 32 | uint32_t(sym[size_t(r)].id));
    if (m == merges_.end()) return;
    heap.push_back({uint32_t(m->second >> 32), uint32_t(l), sym[size_t(l)].id, sym[size_t(r)].id});
    std::push_heap(heap.begin(), heap.end());
  };
  for (size_t i = 0; i + 1 < n; ++i) push_pair(int32_t(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const HeapEntry e = heap.back();
    heap.pop_back();
    Sym& l = sym[e.pos];
    if (!l.alive || l.id != e.left_id || l.next < 0) continue;
    Sym& r = sym[size_t(l.next)];
    if (r.id != e.right_id) continue;
    auto m = merges_.find(uint64_t(uint32_t(l.id)) << 32 | uint32_t(r.id));
    l.id = int32_t(uint32_t(m->second));
    r.alive = false;
    l.next = r.next;
    if (r.next >= 0) sym[size_t(r.next)].prev = int32_t(e.pos);
    push_pair(l.prev);
    push_pair(int32_t(e.pos));
  }
  for (int32_t i = 0; i >= 0; i = sym[size_t(i)].next) out->push_back(sym[size_t(i)].id);
}

// ---- decoding and lookups ----

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (!is_valid_id(id)) continue;  // HF skips ids it does not know
    if (skip_special && is_special(id)) continue;
    bytes += id_bytes_[size_t(id)];
  }
  return utf8_sanitize(bytes);
}

bool Tokenizer::is_special(int32_t id) const {
  const int32_t a = added_index_[size_t(id)];
  return a >= 0 && added_[size_t(a)].special;
}

std::string Tokenizer::token_string(int32_t id) const {
  if (is_added(id)) return added_[size_t(added_index_[size_t(id)])].content;
  std::string s;
  for (char c : id_bytes_[size_t(id)]) utf8_append(&s, byte_level_char(uint8_t(c)));
  return s;
}

int32_t Tokenizer::token_id(std::string_view token_string) const {
  int32_t idx = -1;
  if (match_added(token_string, &idx) == token_string.size() && idx >= 0) return added_[size_t(idx)].id;
  std::string bytes;
  if (!byte_level_to_bytes(token_string, &bytes)) return -1;
  auto it = bytes_to_id_.find(bytes);
  return it == bytes_to_id_.end() ? -1 : it->second;
}

}  // namespace fb::tokenizer
