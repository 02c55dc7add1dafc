// Compiler: response formats -> per-request token constraints (issue 27), over xgrammar's C++ core
// (the engine vLLM, SGLang and TensorRT-LLM use; fetched by tools/setup.sh, README says why). It
// owns the vocabulary as xgrammar sees it: every token's raw bytes, special and added tokens
// (chat markup, DSML, think tags) empty so no grammar ever allows them, EOS the only stop token.
// Built once per server; compile() is thread-safe (HTTP threads), each constraint is then used by
// one request on the engine thread. No xgrammar header leaks out of this folder.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>
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

// Tool calls in the model's own syntax (spec/15 §8.1, DSML): tool_choice forcing and strict
// function tools (issue 27). The grammar is an xgrammar structural tag composed here: the calls
// block "\n\n<｜DSML｜ calls>\n" + invokes + "</｜DSML｜ calls>", each invoke's parameters in the
// V4.1 DSML parameter form (string="true" raw strings, string="false" JSON values), its arguments
// conforming to the tool's parameters schema (check_schema's subset). After the block only EOS.
struct ToolSpec {
  std::string name;
  nlohmann::ordered_json parameters;  // null: no schema (any parameters)
  bool strict = false;                // OpenAI/Anthropic `strict`: arguments constrained under auto too
};

struct ToolCallFormat {
  enum class Choice {
    kAuto,      // text or calls; strict tools' arguments are constrained once a calls block starts
    kRequired,  // the output is a calls block of one or more calls (one when !parallel)
    kNamed,     // the output is a calls block of exactly one call of `name`
  } choice = Choice::kAuto;
  std::vector<ToolSpec> tools;
  std::string name;  // kNamed
  bool parallel = true;
  bool after_reasoning = false;  // as ResponseFormat: the reasoning runs free until </think>
  // kAuto: constrain the calls block even without a strict tool, its invokes naming only `tools`
  // (OpenAI tool_choice allowed_tools, where `tools` is the allowed subset of the request's).
  bool restrict_names = false;
  // kAuto with a response_format (Chat): the answer is either this JSON value or one calls block
  // (no text around either; strict tools' arguments constrained as above), the value written as
  // compile(ResponseFormat) writes it. Ignored when a call is forced (the answer is then the call).
  std::optional<ResponseFormat> answer;
};

class Compiler {
 public:
  // vocab_size: the model's (ids past the tokenizer's are never allowed); eos_id: the one token
  // that may end the output, and only once the value is complete.
  static Result<std::unique_ptr<Compiler>> create(const tokenizer::Tokenizer& tok, int64_t vocab_size, int32_t eos_id);
  ~Compiler();
  // kInvalidArgument naming the problem for an unsupported or unsatisfiable schema.
  Result<std::shared_ptr<engine::TokenConstraint>> compile(const ResponseFormat& f) const;
  // kInvalidArgument naming the tool and the problem. kAuto with no strict tool, no answer
  // format and no restrict_names: nothing to enforce, a null constraint.
  Result<std::shared_ptr<engine::TokenConstraint>> compile(const ToolCallFormat& f) const;
  // The structural tag compile(ToolCallFormat) builds (tests, debugging).
  static Result<nlohmann::ordered_json> tool_call_structural_tag(const ToolCallFormat& f);
  int64_t vocab_size() const { return vocab_size_; }

 private:
  struct Impl;
  Compiler() = default;
  std::unique_ptr<Impl> impl_;
  int64_t vocab_size_ = 0;
};

}  // namespace fb::grammar
