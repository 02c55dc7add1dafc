// StreamDecoder: incremental detokenization (spec/15 §1.2). Never emits half a character:
// bytes of an incomplete UTF-8 sequence are held until it completes; invalid bytes become
// U+FFFD exactly as the whole-sequence lossy decode would. Invariant: the concatenation of
// every push() plus finish() equals Tokenizer::decode() of the same ids.
#pragma once

#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace fb::tokenizer {

class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = false) : tok_(&tok), skip_special_(skip_special) {}
  // Text that became final with this id (possibly empty).
  std::string push(int32_t id);
  // Raw bytes variant (e.g. for a test double); same holding rule.
  std::string push_bytes(std::string_view bytes);
  // Flushes a dangling incomplete sequence as U+FFFD; the decoder is then empty.
  std::string finish();
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace fb::tokenizer
