// UTF-8 scanning shared by the encoder, the streaming decoder and the Engram map.
// Replacement follows the Unicode "maximal subpart" practice (what Rust's from_utf8_lossy and
// Python's errors="replace" do): each maximal invalid subsequence becomes one U+FFFD.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace fb::tokenizer {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

enum class Utf8Step { kValid, kInvalid, kIncomplete };

// Classifies the sequence starting at s[0]: kValid (a whole well-formed character of *len bytes),
// kInvalid (a maximal invalid subpart of *len bytes, to be replaced by one U+FFFD) or
// kIncomplete (a well-formed prefix that runs out of input; more bytes may complete it).
Utf8Step utf8_step(std::string_view s, size_t* len);

bool utf8_is_valid(std::string_view s);
// Lossy decode: valid text is returned unchanged, invalid subparts become U+FFFD.
std::string utf8_sanitize(std::string_view s);
// Appends the UTF-8 encoding of code point cp (cp must be a scalar value).
void utf8_append(std::string* out, char32_t cp);

}  // namespace fb::tokenizer
