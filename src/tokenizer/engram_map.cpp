#include "tokenizer/engram_map.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/locid.h>

#include <cstring>
#include <unordered_map>

#include "tokenizer/sha256.h"
#include "tokenizer/utf8.h"

namespace fb::tokenizer {

namespace {

struct Normalizers {
  const icu::Normalizer2* nfkc = nullptr;
  const icu::Normalizer2* nfd = nullptr;
};

bool is_mark(UChar32 c) {
  const int8_t t = u_charType(c);
  return t == U_NON_SPACING_MARK || t == U_COMBINING_SPACING_MARK || t == U_ENCLOSING_MARK;
}

// The HF normaliser chain of spec/11 §6.1: NFKC, NFD, StripAccents (every M* character),
// Lowercase (full mapping), collapse [ \t\r\n]+ to " ", keep a lone " ", strip White_Space.
std::string normalize_key(const Normalizers& n, const std::string& text) {
  UErrorCode err = U_ZERO_ERROR;
  icu::UnicodeString s = icu::UnicodeString::fromUTF8(text);
  icu::UnicodeString a = n.nfkc->normalize(s, err);
  icu::UnicodeString b = n.nfd->normalize(a, err);
  if (U_FAILURE(err)) return text;
  icu::UnicodeString stripped;
  for (int32_t i = 0; i < b.length();) {
    const UChar32 c = b.char32At(i);
    if (!is_mark(c)) stripped.append(c);
    i += U16_LENGTH(c);
  }
  stripped.toLower(icu::Locale::getRoot());
  // Collapse runs of the four ASCII whitespace characters.
  icu::UnicodeString collapsed;
  bool in_run = false;
  for (int32_t i = 0; i < stripped.length();) {
    const UChar32 c = stripped.char32At(i);
    i += U16_LENGTH(c);
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
      if (!in_run) collapsed.append(UChar32(' '));
      in_run = true;
    } else {
      collapsed.append(c);
      in_run = false;
    }
  }
  if (collapsed == icu::UnicodeString(u" ")) return " ";
  int32_t begin = 0, end = collapsed.length();
  while (begin < end) {
    const UChar32 c = collapsed.char32At(begin);
    if (!u_isUWhiteSpace(c)) break;
    begin += U16_LENGTH(c);
  }
  while (end > begin) {
    const UChar32 c = collapsed.char32At(end - 1);
    if (!u_isUWhiteSpace(c)) break;
    end -= U16_LENGTH(c);
  }
  std::string out;
  collapsed.tempSubStringBetween(begin, end).toUTF8String(out);
  return out;
}

std::string key_for(const Normalizers& n, const Tokenizer& tok, int32_t id) {
  // "Decode the single id" (HF decode, lossy UTF-8).
  const std::string text = utf8_sanitize(tok.token_bytes(id));
  if (text.find(kReplacementChar) != std::string::npos) return tok.token_string(id);
  std::string key = normalize_key(n, text);
  return key.empty() ? text : key;
}

Result<Normalizers> get_normalizers() {
  UErrorCode err = U_ZERO_ERROR;
  Normalizers n;
  n.nfkc = icu::Normalizer2::getNFKCInstance(err);
  n.nfd = icu::Normalizer2::getNFDInstance(err);
  if (U_FAILURE(err)) return FB_ERROR(kInternal) << "ICU normalisers unavailable: " << u_errorName(err);
  return n;
}

}  // namespace

std::string engram_class_key(const Tokenizer& tok, int32_t id) {
  auto n = get_normalizers();
  if (!n.ok()) return {};
  return key_for(*n, tok, id);
}

Result<EngramMap> derive_engram_map(const Tokenizer& tok) {
  const Normalizers n = FB_TRY(get_normalizers());
  EngramMap m;
  m.map.resize(size_t(tok.vocab_size()));
  std::unordered_map<std::string, int32_t> classes;
  classes.reserve(size_t(tok.vocab_size()));
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    auto [it, inserted] = classes.emplace(key_for(n, tok, id), int32_t(classes.size()));
    m.map[size_t(id)] = it->second;
  }
  m.n_classes = int32_t(classes.size());
  return m;
}

std::string engram_map_sha256(const std::vector<int32_t>& map) {
  Sha256 h;
  for (int32_t v : map) {
    uint8_t le[4] = {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)};
    h.update(le, 4);
  }
  return h.hex_digest();
}

}  // namespace fb::tokenizer
