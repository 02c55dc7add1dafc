#include "tokenizer/stream_decoder.h"

#include "tokenizer/utf8.h"

namespace fb::tokenizer {

std::string StreamDecoder::push(int32_t id) {
  if (!tok_->is_valid_id(id) || (skip_special_ && tok_->is_special(id))) return {};
  return push_bytes(tok_->token_bytes(id));
}

std::string StreamDecoder::push_bytes(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    size_t len = 0;
    const Utf8Step st = utf8_step(std::string_view(pending_).substr(i), &len);
    if (st == Utf8Step::kIncomplete) break;  // wait for the rest of the character
    if (st == Utf8Step::kValid) {
      out.append(pending_, i, len);
    } else {
      out.append(kReplacementChar);
    }
    i += len;
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = pending_.empty() ? std::string() : utf8_sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace fb::tokenizer
