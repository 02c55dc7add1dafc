// PreTokenizer: the HF `Sequence` of `Split` (behaviour Isolated) regex steps, run with PCRE2
// (UTF + UCP, JIT). Owns only the regex splitting; the ByteLevel step is a byte->symbol mapping
// done by the BPE model. Invariant: each later split sees only one piece of the earlier ones,
// so lookaheads such as `\s+(?!\S)` never look past a piece boundary (HF semantics).
#pragma once

#include <cstddef>
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

 private:
  std::vector<std::unique_ptr<Regex>> regexes_;
};

}  // namespace fb::tokenizer
