// Compiler: response formats -> per-request token constraints (issue 27), over xgrammar's C++ core
// (the engine vLLM, SGLang and TensorRT-LLM use; fetched by tools/setup.sh, README says why). It
// owns the vocabulary as xgrammar sees it: every token's raw bytes, special and added tokens
// (chat markup, DSML, think tags) empty so no grammar ever allows them, EOS the only stop token.
// Built once per server; compile() is thread-safe (HTTP threads), each constraint is then used by
// one request on the engine thread. No xgrammar header leaks out of this folder.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>

#include "base/status.h"
#include "engine/token_constraint.h"
#include "tokenizer/tokenizer.h"

namespace fb::grammar {

struct ResponseFormat {
  enum class Kind { kJsonObject, kJsonSchema } kind = Kind::kJsonObject;
  nlohmann::ordered_json schema;  // kJsonSchema (check_schema's subset)
  // OpenAI `strict`: objects get no properties beyond `properties`. Off: extra properties are
  // allowed where the schema does not forbid them. Either way every value validates.
  bool strict = false;
  // Thinking mode: the reasoning runs free (EOS excluded) until </think>; the value follows it.
  bool after_reasoning = false;
};

class Compiler {
 public:
  // vocab_size: the model's (ids past the tokenizer's are never allowed); eos_id: the one token
  // that may end the output, and only once the value is complete.
  static Result<std::unique_ptr<Compiler>> create(const tokenizer::Tokenizer& tok, int64_t vocab_size, int32_t eos_id);
  ~Compiler();
  // kInvalidArgument naming the problem for an unsupported or unsatisfiable schema.
  Result<std::shared_ptr<engine::TokenConstraint>> compile(const ResponseFormat& f) const;
  int64_t vocab_size() const { return vocab_size_; }

 private:
  struct Impl;
  Compiler() = default;
  std::unique_ptr<Impl> impl_;
  int64_t vocab_size_ = 0;
};

}  // namespace fb::grammar
