// Test-only access to the committed V4.1-equivalent tokenizer (assets/tokenizer/), loaded once
// per test binary. FB_SOURCE_DIR comes from fb_add_test.
#pragma once

#include <cstdlib>
#include <string>

#include "base/check.h"
#include "tokenizer/tokenizer.h"

namespace fb::tokenizer {

inline std::string v41_tokenizer_path() { return std::string(FB_SOURCE_DIR) + "/assets/tokenizer/tokenizer.json"; }

inline const Tokenizer& v41_tokenizer() {
  static const Tokenizer* tok = [] {
    auto r = Tokenizer::load(v41_tokenizer_path());
    FB_CHECK(r.ok()) << r.status().to_string();
    return new Tokenizer(std::move(r).value());
  }();
  return *tok;
}

}  // namespace fb::tokenizer
