#include "tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/uchar.h>
#include <unicode/uset.h>

#include <cctype>
#include <cstdio>

#include "base/check.h"

namespace fb::tokenizer {

// `code`: the pattern after expand_unicode_properties(), exact everywhere. `fast`: the pattern as
// written (PCRE2's own tables and \s), exact on subjects without code points from `fast_below`'s
// lead byte up (none newer than PCRE2's tables, no U+180E) and faster there: explicit ranges
// next to \p{X} cost a compare each for every character tested. Null when the two are the same.
struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  pcre2_code* fast = nullptr;
  uint8_t fast_below = 0;  // use `fast` when every byte of the subject is below this
  ~Regex() {
    if (code) pcre2_code_free(code);
    if (fast) pcre2_code_free(fast);
  }
};

namespace {

struct MatchData {
  pcre2_match_data* md;
  pcre2_match_data* md_fast = nullptr;
  explicit MatchData(const PreTokenizer::Regex& re) : md(pcre2_match_data_create_from_pattern(re.code, nullptr)) {
    if (re.fast) md_fast = pcre2_match_data_create_from_pattern(re.fast, nullptr);
    FB_CHECK(md != nullptr && (md_fast != nullptr) == (re.fast != nullptr)) << "pcre2 match data allocation failed";
  }
  ~MatchData() {
    pcre2_match_data_free(md);
    if (md_fast) pcre2_match_data_free(md_fast);
  }
};

bool all_bytes_below(std::string_view s, uint8_t limit) {
  for (char ch : s) {
    if (uint8_t(ch) >= limit) return false;
  }
  return true;
}

// Splits `piece` with regex `level`, recursing into the next level for every sub-piece.
void split_level(const std::vector<std::unique_ptr<PreTokenizer::Regex>>& regexes, size_t level,
                 std::string_view piece, const std::function<void(std::string_view)>& emit,
                 std::vector<std::unique_ptr<MatchData>>& mds) {
  if (piece.empty()) return;
  if (level == regexes.size()) {
    emit(piece);
    return;
  }
  const PreTokenizer::Regex& re = *regexes[level];
  const bool fast = re.fast && all_bytes_below(piece, re.fast_below);
  const pcre2_code* code = fast ? re.fast : re.code;
  pcre2_match_data* md = fast ? mds[level]->md_fast : mds[level]->md;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  size_t pos = 0, gap_start = 0;
  while (pos < piece.size()) {
    // The subject is the piece alone: lookaheads must not see beyond it.
    int rc = pcre2_match(code, subject, piece.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) {
      FB_CHECK(rc == PCRE2_ERROR_NOMATCH) << "pcre2_match failed with code " << rc;
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t ms = ov[0], me = ov[1];
    if (me == ms) {  // empty match: HF skips it; step one character
      pos = ms + 1;
      while (pos < piece.size() && (uint8_t(piece[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (ms > gap_start) split_level(regexes, level + 1, piece.substr(gap_start, ms - gap_start), emit, mds);
    split_level(regexes, level + 1, piece.substr(ms, me - ms), emit, mds);
    gap_start = pos = me;
  }
  if (gap_start < piece.size()) split_level(regexes, level + 1, piece.substr(gap_start), emit, mds);
}

struct USetDeleter {
  void operator()(USet* s) const { uset_close(s); }
};
using USetPtr = std::unique_ptr<USet, USetDeleter>;

// The General_Category mask ICU has for `name` (any alias; PCRE2's L& is LC), or 0.
int32_t category_mask(std::string name) {
  if (name == "L&") name = "LC";
  const int32_t mask = u_getPropertyValueEnum(UCHAR_GENERAL_CATEGORY_MASK, name.c_str());
  return mask == UCHAR_INVALID_CODE ? 0 : mask;
}

// Code points HF's engine (Oniguruma in `tokenizers` 0.23: Unicode 16.0) knows and ICU 72
// (Unicode 15.0) does not: Unicode 15.1 and 16.0 additions with their General_Category, read
// from HF's own engine by tests/tokenizer/gen_unicode_supplement.py (which also checks that
// every code point ICU knows has the same category there). ICU reports all of these as Cn.
struct SupplementRange {
  char32_t first, last;
  const char* gc;
};
constexpr SupplementRange kSupplement[] = {
// 5812 code points in 83 ranges (gen_unicode_supplement.py).
    {0x897, 0x897, "Mn"},
    {0x1B4E, 0x1B4F, "Po"},
    {0x1B7F, 0x1B7F, "Po"},
    {0x1C89, 0x1C89, "Lu"},
    {0x1C8A, 0x1C8A, "Ll"},
    {0x2427, 0x2429, "So"},
    {0x2FFC, 0x2FFF, "So"},
    {0x31E4, 0x31E5, "So"},
    {0x31EF, 0x31EF, "So"},
    {0xA7CB, 0xA7CC, "Lu"},
    {0xA7CD, 0xA7CD, "Ll"},
    {0xA7DA, 0xA7DA, "Lu"},
    {0xA7DB, 0xA7DB, "Ll"},
    {0xA7DC, 0xA7DC, "Lu"},
    {0x105C0, 0x105F3, "Lo"},
    {0x10D40, 0x10D49, "Nd"},
    {0x10D4A, 0x10D4D, "Lo"},
    {0x10D4E, 0x10D4E, "Lm"},
    {0x10D4F, 0x10D4F, "Lo"},
    {0x10D50, 0x10D65, "Lu"},
    {0x10D69, 0x10D6D, "Mn"},
    {0x10D6E, 0x10D6E, "Pd"},
    {0x10D6F, 0x10D6F, "Lm"},
    {0x10D70, 0x10D85, "Ll"},
    {0x10D8E, 0x10D8F, "Sm"},
    {0x10EC2, 0x10EC4, "Lo"},
    {0x10EFC, 0x10EFC, "Mn"},
    {0x11380, 0x11389, "Lo"},
    {0x1138B, 0x1138B, "Lo"},
    {0x1138E, 0x1138E, "Lo"},
    {0x11390, 0x113B5, "Lo"},
    {0x113B7, 0x113B7, "Lo"},
    {0x113B8, 0x113BA, "Mc"},
    {0x113BB, 0x113C0, "Mn"},
    {0x113C2, 0x113C2, "Mc"},
    {0x113C5, 0x113C5, "Mc"},
    {0x113C7, 0x113CA, "Mc"},
    {0x113CC, 0x113CD, "Mc"},
    {0x113CE, 0x113CE, "Mn"},
    {0x113CF, 0x113CF, "Mc"},
    {0x113D0, 0x113D0, "Mn"},
    {0x113D1, 0x113D1, "Lo"},
    {0x113D2, 0x113D2, "Mn"},
    {0x113D3, 0x113D3, "Lo"},
    {0x113D4, 0x113D5, "Po"},
    {0x113D7, 0x113D8, "Po"},
    {0x113E1, 0x113E2, "Mn"},
    {0x116D0, 0x116E3, "Nd"},
    {0x11BC0, 0x11BE0, "Lo"},
    {0x11BE1, 0x11BE1, "Po"},
    {0x11BF0, 0x11BF9, "Nd"},
    {0x11F5A, 0x11F5A, "Mn"},
    {0x13460, 0x143FA, "Lo"},
    {0x16100, 0x1611D, "Lo"},
    {0x1611E, 0x16129, "Mn"},
    {0x1612A, 0x1612C, "Mc"},
    {0x1612D, 0x1612F, "Mn"},
    {0x16130, 0x16139, "Nd"},
    {0x16D40, 0x16D42, "Lm"},
    {0x16D43, 0x16D6A, "Lo"},
    {0x16D6B, 0x16D6C, "Lm"},
    {0x16D6D, 0x16D6F, "Po"},
    {0x16D70, 0x16D79, "Nd"},
    {0x18CFF, 0x18CFF, "Lo"},
    {0x1CC00, 0x1CCEF, "So"},
    {0x1CCF0, 0x1CCF9, "Nd"},
    {0x1CD00, 0x1CEB3, "So"},
    {0x1E5D0, 0x1E5ED, "Lo"},
    {0x1E5EE, 0x1E5EF, "Mn"},
    {0x1E5F0, 0x1E5F0, "Lo"},
    {0x1E5F1, 0x1E5FA, "Nd"},
    {0x1E5FF, 0x1E5FF, "Po"},
    {0x1F8B2, 0x1F8BB, "So"},
    {0x1F8C0, 0x1F8C1, "So"},
    {0x1FA89, 0x1FA89, "So"},
    {0x1FA8F, 0x1FA8F, "So"},
    {0x1FABE, 0x1FABE, "So"},
    {0x1FAC6, 0x1FAC6, "So"},
    {0x1FADC, 0x1FADC, "So"},
    {0x1FADF, 0x1FADF, "So"},
    {0x1FAE9, 0x1FAE9, "So"},
    {0x1FBCB, 0x1FBEF, "So"},
    {0x2EBF0, 0x2EE5D, "Lo"},
};

int32_t supplement_gc_mask(const SupplementRange& r) {
  return U_MASK(u_getPropertyValueEnum(UCHAR_GENERAL_CATEGORY, r.gc));
}

// The code points of the General_Category `mask` (ICU's, with kSupplement), complemented when
// `negate`, surrogates removed.
USetPtr category_set(int32_t mask, bool negate) {
  USetPtr set(uset_openEmpty());
  UErrorCode err = U_ZERO_ERROR;
  uset_applyIntPropertyValue(set.get(), UCHAR_GENERAL_CATEGORY_MASK, mask, &err);
  FB_CHECK(U_SUCCESS(err)) << "ICU General_Category set: " << u_errorName(err);
  for (const SupplementRange& r : kSupplement) {
    if (supplement_gc_mask(r) & mask) {
      uset_addRange(set.get(), UChar32(r.first), UChar32(r.last));
    } else {
      uset_removeRange(set.get(), UChar32(r.first), UChar32(r.last));
    }
  }
  if (negate) uset_complement(set.get());
  uset_removeRange(set.get(), 0xD800, 0xDFFF);  // not encodable in UTF mode
  return set;
}

// Assigned code points (ICU + kSupplement) that Unicode `engine_version` ("14.0.0") did not have
// yet; only kSupplement when ICU does not know that version (it is newer than ICU).
USetPtr newer_than(std::string_view engine_version) {
  USetPtr newer = category_set(U_GC_CN_MASK, /*negate=*/true);  // assigned
  std::u16string v;
  for (char ch : engine_version.substr(0, engine_version.rfind('.'))) v += char16_t(ch);  // "14.0"
  const std::u16string age = u"Age";
  USetPtr old(uset_openEmpty());
  UErrorCode err = U_ZERO_ERROR;
  uset_applyPropertyAlias(old.get(), age.data(), int32_t(age.size()), v.data(), int32_t(v.size()), &err);
  if (U_FAILURE(err)) {  // assume the engine knows all of ICU
    old.reset(uset_openEmpty());
    err = U_ZERO_ERROR;
    uset_applyIntPropertyValue(old.get(), UCHAR_GENERAL_CATEGORY_MASK, U_GC_CN_MASK, &err);
    uset_complement(old.get());
  }
  uset_removeAll(newer.get(), old.get());
  return newer;
}

// Class body for `set`: \x{A}-\x{B} ranges (single code points and pairs without the dash).
void append_ranges(const USet* set, std::string& out) {
  char buf[32];
  const int32_t n = uset_getItemCount(set);
  for (int32_t i = 0; i < n; ++i) {
    UChar32 a = 0, b = 0;
    UErrorCode err = U_ZERO_ERROR;
    if (uset_getItem(set, i, &a, &b, nullptr, 0, &err) != 0) continue;  // strings: none here
    std::snprintf(buf, sizeof buf, "\\x{%X}", unsigned(a));
    out += buf;
    if (b == a) continue;
    std::snprintf(buf, sizeof buf, b == a + 1 ? "\\x{%X}" : "-\\x{%X}", unsigned(b));
    out += buf;
  }
}

// True when `pattern` sets the caseless option inline: "(?i", "(?xi:", "(?^i)" ... (an `i` among
// the option letters before any '-').
bool sets_caseless(std::string_view pattern) {
  for (size_t at = pattern.find("(?"); at != std::string_view::npos; at = pattern.find("(?", at + 2)) {
    for (size_t j = at + 2; j < pattern.size(); ++j) {
      const char c = pattern[j];
      if (c == 'i') return true;
      if (c == '-' || !(std::isalpha(static_cast<unsigned char>(c)) || c == '^')) break;
    }
  }
  return false;
}

}  // namespace

uint32_t PreTokenizer::general_category_mask(char32_t c) {
  for (const SupplementRange& r : kSupplement) {
    if (c >= r.first && c <= r.last) return uint32_t(supplement_gc_mask(r));
  }
  return U_MASK(u_charType(UChar32(c)));
}

std::string PreTokenizer::engine_unicode_version() {
  char buf[32] = {};
  pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, buf);
  return buf;
}

std::string PreTokenizer::expand_unicode_properties(std::string_view pat, std::string_view engine_unicode) {
  if (sets_caseless(pat)) return std::string(pat);
  const USetPtr newer = engine_unicode.empty() ? nullptr : newer_than(engine_unicode);
  std::string out;
  out.reserve(pat.size() * 16);
  bool in_class = false;
  bool prev_dash = false;  // in a class: the last item was a '-' that may be a range operator
  size_t class_body = 0;   // in a class: where its items start in `out` (after '[' and '^')
  // In a class: the escapes kept for PCRE2 and the merged ranges of a run of property escapes.
  std::string pending_native;
  USetPtr pending;
  auto flush = [&] {
    out += pending_native;
    pending_native.clear();
    if (pending) append_ranges(pending.get(), out);
    pending.reset();
  };
  size_t i = 0;
  while (i < pat.size()) {
    const char c = pat[i];
    if (c == '\\' && i + 1 < pat.size()) {
      const char d = pat[i + 1];
      size_t end = i + 2;
      if (d == 'Q') {  // \Q...\E: literal text
        const size_t e = pat.find("\\E", i + 2);
        end = e == std::string_view::npos ? pat.size() : e + 2;
      } else if (d == 'p' || d == 'P' || d == 's' || d == 'S') {
        const bool space = d == 's' || d == 'S';  // HF's \s: \t-\r, U+0085 and Z (not U+180E)
        bool negate = d == 'P' || d == 'S';
        std::string name = space ? "Z" : "";
        if (space) {
        } else if (end < pat.size() && pat[end] == '{') {
          const size_t close = pat.find('}', end);
          if (close != std::string_view::npos) {
            name.assign(pat.substr(end + 1, close - end - 1));
            end = close + 1;
          }
        } else if (end < pat.size()) {
          name.assign(1, pat[end]);
          ++end;
        }
        if (!space && !name.empty() && name[0] == '^') {
          negate = !negate;
          name.erase(0, 1);
        }
        // Next to a range dash PCRE2 reports an error; leave such escapes for it to do so.
        const bool dash_next = in_class && end + 1 < pat.size() && pat[end] == '-' && pat[end + 1] != ']';
        const int32_t mask = name.empty() || prev_dash || dash_next ? 0 : category_mask(name);
        USetPtr set = mask ? category_set(mask, /*negate=*/false) : nullptr;
        if (set && space) {
          uset_addRange(set.get(), 0x9, 0xD);
          uset_add(set.get(), 0x85);
        }
        // Hybrid: PCRE2's own \p{X} is right for every code point its tables know (no
        // General_Category change since: tested); add only the members newer than its tables.
        // Not for categories with Cn (PCRE2 gives it the newer code points) nor for a negated
        // escape inside a class (no class subtraction); those get the full range list.
        std::string native;
        if (set && newer && !(mask & U_GC_CN_MASK) && !(negate && in_class)) {
          if (const char* n = u_getPropertyValueName(UCHAR_GENERAL_CATEGORY_MASK, mask, U_SHORT_PROPERTY_NAME)) {
            native = std::string(space ? "\\x{9}-\\x{D}\\x{85}" : "") + "\\p{" +
                     (std::string_view(n) == "LC" ? "L&" : n) + "}";
            uset_retainAll(set.get(), newer.get());
          }
        }
        if (set && native.empty() && negate) {
          uset_complement(set.get());
          uset_removeRange(set.get(), 0xD800, 0xDFFF);
        }
        if (set && !(native.empty() && uset_isEmpty(set.get()))) {  // (empty: \p{Cs}; PCRE2's is too)
          if (in_class) {
            pending_native += native;
            if (!pending) pending.reset(uset_openEmpty());
            uset_addAll(pending.get(), set.get());
          } else if (uset_isEmpty(set.get()) && !space && !negate) {
            out += native;
          } else {
            out += negate && !native.empty() ? "[^" : "[";
            out += native;
            append_ranges(set.get(), out);
            out += ']';
          }
          i = end;
          continue;
        }
      }
      if (in_class) flush();
      out.append(pat.substr(i, end - i));
      prev_dash = false;
      i = end;
      continue;
    }
    if (!in_class) {
      out += c;
      ++i;
      if (c == '[') {
        in_class = true;
        prev_dash = false;
        if (i < pat.size() && pat[i] == '^') out += pat[i++];
        class_body = out.size();
        if (i < pat.size() && pat[i] == ']') out += pat[i++];  // a leading ']' is literal
      }
      continue;
    }
    flush();
    if (c == ']') {
      in_class = false;
      out += c;
      ++i;
      continue;
    }
    if (c == '[' && i + 1 < pat.size() && (pat[i + 1] == ':' || pat[i + 1] == '.' || pat[i + 1] == '=')) {
      const size_t e = pat.find(std::string{pat[i + 1], ']'}, i + 2);  // POSIX [:name:] etc.
      const size_t end = e == std::string_view::npos ? pat.size() : e + 2;
      out.append(pat.substr(i, end - i));
      prev_dash = false;
      i = end;
      continue;
    }
    prev_dash = c == '-' && out.size() > class_body;  // a leading '-' is literal
    out += c;
    ++i;
  }
  if (in_class) return std::string(pat);  // unterminated class: let PCRE2 report it as written
  return out;
}

PreTokenizer::PreTokenizer() = default;
PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

namespace {

pcre2_code* compile(const std::string& pattern, int* err, PCRE2_SIZE* off) {
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, err, off, nullptr);
  // JIT is a speed-up only; without it pcre2_match interprets the same pattern.
  if (code) pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return code;
}

// The UTF-8 lead byte of the lowest code point where PCRE2's tables or \s differ from the
// expansion (lead bytes grow with the code point, so a subject with all bytes below it holds
// only lower code points).
uint8_t first_risky_lead_byte(std::string_view engine_unicode) {
  USetPtr risky = newer_than(engine_unicode);
  uset_add(risky.get(), 0x180E);  // in PCRE2's \s, not in HF's
  UChar32 lo = 0, hi = 0;
  UErrorCode err = U_ZERO_ERROR;
  uset_getItem(risky.get(), 0, &lo, &hi, nullptr, 0, &err);
  if (lo < 0x80) return uint8_t(lo);
  if (lo < 0x800) return uint8_t(0xC0 | (lo >> 6));
  if (lo < 0x10000) return uint8_t(0xE0 | (lo >> 12));
  return uint8_t(0xF0 | (lo >> 18));
}

}  // namespace

Result<PreTokenizer> PreTokenizer::create(const std::vector<std::string>& patterns) {
  PreTokenizer p;
  const std::string engine = engine_unicode_version();
  const uint8_t fast_below = first_risky_lead_byte(engine);
  for (const std::string& pat : patterns) {
    // HF's Unicode 16.0 categories and \s instead of PCRE2's (older) tables.
    const std::string expanded = expand_unicode_properties(pat, engine);
    int err = 0;
    PCRE2_SIZE off = 0;
    auto re = std::make_unique<Regex>();
    re->code = compile(expanded, &err, &off);
    if (!re->code) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof buf);
      return FB_ERROR(kCorrupt) << "pre-tokenizer regex does not compile at offset " << off << " of its expansion: "
                                << reinterpret_cast<const char*>(buf) << " (pattern " << pat << ")";
    }
    if (expanded != pat) {
      re->fast = compile(pat, &err, &off);  // null (no fast path) if PCRE2 rejects it as written
      re->fast_below = fast_below;
    }
    p.regexes_.push_back(std::move(re));
  }
  return p;
}

void PreTokenizer::split(std::string_view text, const std::function<void(std::string_view)>& emit) const {
  std::vector<std::unique_ptr<MatchData>> mds;
  for (const auto& r : regexes_) mds.push_back(std::make_unique<MatchData>(*r));
  split_level(regexes_, 0, text, emit, mds);
}

}  // namespace fb::tokenizer
