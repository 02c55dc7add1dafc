#include "tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "base/check.h"

namespace fb::tokenizer {

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() {
    if (code) pcre2_code_free(code);
  }
};

namespace {

struct MatchData {
  pcre2_match_data* md;
  explicit MatchData(const pcre2_code* code) : md(pcre2_match_data_create_from_pattern(code, nullptr)) {
    FB_CHECK(md != nullptr) << "pcre2 match data allocation failed";
  }
  ~MatchData() { pcre2_match_data_free(md); }
};

// Splits `piece` with regex `level`, recursing into the next level for every sub-piece.
void split_level(const std::vector<std::unique_ptr<PreTokenizer::Regex>>& regexes, size_t level,
                 std::string_view piece, const std::function<void(std::string_view)>& emit,
                 std::vector<std::unique_ptr<MatchData>>& mds) {
  if (piece.empty()) return;
  if (level == regexes.size()) {
    emit(piece);
    return;
  }
  const pcre2_code* code = regexes[level]->code;
  pcre2_match_data* md = mds[level]->md;
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

}  // namespace

PreTokenizer::PreTokenizer() = default;
PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

Result<PreTokenizer> PreTokenizer::create(const std::vector<std::string>& patterns) {
  PreTokenizer p;
  for (const std::string& pat : patterns) {
    int err = 0;
    PCRE2_SIZE off = 0;
    auto re = std::make_unique<Regex>();
    re->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(), PCRE2_UTF | PCRE2_UCP,
                             &err, &off, nullptr);
    if (!re->code) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof buf);
      return FB_ERROR(kCorrupt) << "pre-tokenizer regex does not compile at offset " << off << ": "
                                << reinterpret_cast<const char*>(buf) << " (pattern " << pat << ")";
    }
    // JIT is a speed-up only; without it pcre2_match interprets the same pattern.
    pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE);
    p.regexes_.push_back(std::move(re));
  }
  return p;
}

void PreTokenizer::split(std::string_view text, const std::function<void(std::string_view)>& emit) const {
  std::vector<std::unique_ptr<MatchData>> mds;
  for (const auto& r : regexes_) mds.push_back(std::make_unique<MatchData>(r->code));
  split_level(regexes_, 0, text, emit, mds);
}

}  // namespace fb::tokenizer
