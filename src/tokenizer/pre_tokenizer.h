// PreTokenizer: the HF `Sequence` of `Split` (behaviour Isolated) regex steps, run with PCRE2
// (UTF + UCP, JIT). Owns only the regex splitting; the ByteLevel step is a byte->symbol mapping
// done by the BPE model. Invariant: each later split sees only one piece of the earlier ones,
// so lookaheads such as `\s+(?!\S)` never look past a piece boundary (HF semantics).
//
// Unicode version: PCRE2's own property tables are those of its build (Unicode 14 in Debian 12's
// 10.42) while HF's Oniguruma (tokenizers 0.23) uses Unicode 16.0. create() therefore gives
// every General_Category escape (\p{L}, \P{Lu}, \p{^N}, \pS, ...) and \s/\S HF's membership
// (ICU 72 = Unicode 15.0 plus a table of the 15.1/16.0 additions) before compiling; see
// expand_unicode_properties().
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace fb::tokenizer {

class PreTokenizer {
 public:
  PreTokenizer();
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  // patterns: the Split regexes in order (each Isolated, not inverted).
  static Result<PreTokenizer> create(const std::vector<std::string>& patterns);

  // Calls emit(piece) for every final piece of valid UTF-8 `text`, left to right; the pieces
  // concatenate back to `text`.
  void split(std::string_view text, const std::function<void(std::string_view)>& emit) const;

  struct Regex;

  // The pattern with every General_Category escape (\p{X}, \pX, \P{X}, \p{^X}; X a name or
  // alias ICU knows, incl. PCRE2's L& = LC) and \s, \S made to match what HF's engine matches:
  // General_Category from ICU plus a small table of Unicode 15.1/16.0 additions (HF's Oniguruma
  // is Unicode 16.0, ICU 72 is 15.0; see general_category_mask()), and \s = [\t-\r\x85\p{Z}]
  // (Oniguruma's; PCRE2's \s also has U+180E).
  //  - engine_unicode empty: each escape becomes explicit \x{..} ranges;
  //  - engine_unicode = the Unicode version of PCRE2's tables (create() passes
  //    engine_unicode_version()): \p{X} stays for PCRE2 and only the X members assigned after
  //    that version are added as ranges (PCRE2 sees them as Cn); \P{X} outside a class becomes
  //    [^\p{X}<ranges>]. Same sets, far fewer ranges to scan (PCRE2 10.42 scans class ranges
  //    linearly); relies on code points PCRE2 knows having the same category in ICU (true for
  //    14.0 -> 15.0; tokenizer_test checks every code point). Negated escapes inside a class and
  //    categories containing Cn are expanded in full.
  // Inside a character class a run of such escapes merges into one range list in place; outside
  // one the result is a class of its own (quantifiers still apply). Surrogates are never listed
  // (invalid in UTF mode). Left to PCRE2 as written: other \p names (scripts, Xan, ...), \d, \w,
  // \h, \v, \b, POSIX classes, escapes next to a range '-', unterminated classes, and any
  // pattern that sets caseless matching (`(?i`): ranges would then also match case variants,
  // which \p{Lu} and \p{Ll} do not.
  static std::string expand_unicode_properties(std::string_view pattern, std::string_view engine_unicode);
  // The General_Category of c (a U_MASK(UCharCategory) bit) used above: ICU's, or the table's.
  static uint32_t general_category_mask(char32_t c);
  // The Unicode version of PCRE2's property tables, e.g. "14.0.0".
  static std::string engine_unicode_version();

 private:
  std::vector<std::unique_ptr<Regex>> regexes_;
};

}  // namespace fb::tokenizer
