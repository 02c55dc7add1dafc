#include "tokenizer/utf8.h"

#include <cstdint>

namespace fb::tokenizer {

Utf8Step utf8_step(std::string_view s, size_t* len) {
  const auto b0 = uint8_t(s[0]);
  if (b0 < 0x80) {
    *len = 1;
    return Utf8Step::kValid;
  }
  // Unicode Table 3-7: the allowed range of the second byte depends on the lead byte.
  int n = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    *len = 1;
    return Utf8Step::kInvalid;
  }
  for (int i = 1; i < n; ++i) {
    if (size_t(i) >= s.size()) {
      *len = size_t(i);
      return Utf8Step::kIncomplete;
    }
    const auto b = uint8_t(s[i]);
    const uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) {
      *len = size_t(i);
      return Utf8Step::kInvalid;
    }
  }
  *len = size_t(n);
  return Utf8Step::kValid;
}

bool utf8_is_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (uint8_t(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    if (utf8_step(s.substr(i), &len) != Utf8Step::kValid) return false;
    i += len;
  }
  return true;
}

std::string utf8_sanitize(std::string_view s) {
  if (utf8_is_valid(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 16);
  size_t i = 0;
  while (i < s.size()) {
    size_t len = 0;
    // An incomplete sequence at the very end is invalid too: no more bytes will come.
    if (utf8_step(s.substr(i), &len) == Utf8Step::kValid) {
      out.append(s.substr(i, len));
    } else {
      out.append(kReplacementChar);
    }
    i += len;
  }
  return out;
}

void utf8_append(std::string* out, char32_t cp) {
  if (cp < 0x80) {
    out->push_back(char(cp));
  } else if (cp < 0x800) {
    out->push_back(char(0xC0 | (cp >> 6)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(char(0xE0 | (cp >> 12)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(char(0xF0 | (cp >> 18)));
    out->push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(char(0x80 | (cp & 0x3F)));
  }
}

}  // namespace fb::tokenizer
