// Test helper of the server's unit tests: the parse context of a server over the real V4.1
// tokenizer with a 4,096-token context, without or with the grammar engine.
#pragma once

#if FB_SERVER_HAS_GRAMMAR
#include "grammar/compiler.h"
#endif
#include "server/request_parse.h"
#include "tokenizer/test_assets.h"

namespace fb::server {

inline ParseContext test_parse_context() {
  ParseContext c;
  c.tok = &tokenizer::v41_tokenizer();
  c.max_context = 4096;
  return c;
}

#if FB_SERVER_HAS_GRAMMAR
// The same with the grammar engine over the V4.1 vocabulary (one compiler for the test program);
// grammar null when it could not be built (tests assert it is set).
inline ParseContext test_grammar_parse_context() {
  static const auto gram = grammar::Compiler::create(tokenizer::v41_tokenizer(), 129280, 1);
  ParseContext c = test_parse_context();
  c.grammar = gram.ok() ? gram->get() : nullptr;
  return c;
}
#endif

}  // namespace fb::server
