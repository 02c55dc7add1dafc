// Request parsing for the four HTTP APIs (spec/15 §9): client JSON -> the encoder's message list
// -> rendered, tokenized prompt and an engine::Request. Every field is type-checked; errors are
// kInvalidArgument (400) with the field named. No tensors, no engine calls.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"
#include "engine/engine.h"
#include "engine/image_input.h"
#include "tokenizer/tokenizer.h"

namespace fb::grammar {
class Compiler;
}

namespace fb::server {

using ojson = nlohmann::ordered_json;

enum class Endpoint { kChat, kCompletions, kResponses, kMessages };

struct ParseContext {
  const tokenizer::Tokenizer* tok = nullptr;
  int64_t max_context = 0;
  std::string tools_template;  // official Tools-block text when the snapshot has it
  engine::ImagePolicy images;  // image content parts (vision null: the model has none)
  int32_t image_token_id = 129264;
  // response_format json_object / json_schema (issue 27); null: this build has no grammar engine
  // (xgrammar not fetched) and such requests are refused.
  const grammar::Compiler* grammar = nullptr;
  // The server's phrase bias list (serve --phrase-bias FILE; issue 27), merged under the request's.
  const std::vector<engine::PhraseBias>* phrase_bias = nullptr;
};

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kChat;
  engine::Request req;
  std::string model;
  bool stream = false;
  bool include_usage = false;  // OpenAI chat stream_options.include_usage
  bool logprobs = false;
  int top_logprobs = 0;
  bool parallel_tool_calls = true;
  std::string prompt_text;     // rendered prompt (debugging, tests)
  // Responses API: request options the response object echoes (tool_choice, tools, temperature,
  // top_p, max_output_tokens, parallel_tool_calls, instructions), as the client sent them.
  ojson echo = ojson::object();
};

Result<ParsedRequest> parse_request(Endpoint ep, const ojson& body, const ParseContext& ctx);

}  // namespace fb::server
