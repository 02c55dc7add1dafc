#include "server/responder.h"

#include <chrono>
#include <random>

namespace fb::server {

namespace {
std::string hex_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%016llx%08llx", prefix, (unsigned long long)rng(), (unsigned long long)(rng() & 0xffffffff));
  return buf;
}
std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }
ojson bytes_json(const std::string& b) {
  ojson a = ojson::array();
  for (unsigned char c : b) a.push_back(int(c));
  return a;
}
ojson parse_or_empty(const std::string& s) {
  ojson j = ojson::parse(s, nullptr, false);
  return j.is_discarded() ? ojson::object() : j;
}
}  // namespace

Responder::Responder(const ParsedRequest& pr, std::string model_name) : pr_(pr), model_(std::move(model_name)) {
  const char* prefix = pr.endpoint == Endpoint::kMessages ? "msg_" : pr.endpoint == Endpoint::kResponses ? "resp_" : pr.endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-";
  id_ = hex_id(prefix);
  created_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (!pr.model.empty()) model_ = pr.model;
}

std::string Responder::sse(const ojson& j, const char* event) {
  std::string s;
  if (event) s += std::string("event: ") + event + "\n";
  return s + "data: " + dump(j) + "\n\n";
}

const char* Responder::finish_name(engine::FinishReason r) const {
  using F = engine::FinishReason;
  if (pr_.endpoint == Endpoint::kMessages) {
    switch (r) {
      case F::kLength: return "max_tokens";
      case F::kToolCalls: return "tool_use";
      case F::kStopString: return "stop_sequence";
      default: return "end_turn";
    }
  }
  switch (r) {
    case F::kLength: return "length";
    case F::kToolCalls: return "tool_calls";
    default: return "stop";
  }
}

ojson Responder::usage_json(const engine::Usage& u) const {
  if (pr_.endpoint == Endpoint::kMessages)
    return {{"input_tokens", u.prompt_tokens}, {"output_tokens", u.completion_tokens}, {"cache_read_input_tokens", u.cached_tokens}};
  if (pr_.endpoint == Endpoint::kResponses)
    return {{"input_tokens", u.prompt_tokens}, {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
            {"output_tokens", u.completion_tokens}, {"output_tokens_details", {{"reasoning_tokens", u.reasoning_tokens}}},
            {"total_tokens", u.prompt_tokens + u.completion_tokens}};
  return {{"prompt_tokens", u.prompt_tokens}, {"completion_tokens", u.completion_tokens}, {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}},
          {"completion_tokens_details", {{"reasoning_tokens", u.reasoning_tokens}}},
          {"prompt_cache_hit_tokens", u.cached_tokens}, {"prompt_cache_miss_tokens", u.prompt_tokens - u.cached_tokens}};
}

ojson Responder::logprobs_json() const {
  if (!pr_.logprobs) return nullptr;
  if (pr_.endpoint == Endpoint::kCompletions) {
    ojson toks = ojson::array(), lps = ojson::array(), tops = ojson::array();
    for (const auto& t : tokens_) {
      toks.push_back(t.text);
      lps.push_back(t.logprob);
      ojson top = ojson::object();
      for (const auto& x : t.top) top[x.text] = x.logprob;
      tops.push_back(top);
    }
    return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}};
  }
  ojson content = ojson::array();
  for (const auto& t : tokens_) {
    ojson top = ojson::array();
    for (const auto& x : t.top) top.push_back({{"token", x.text}, {"logprob", x.logprob}, {"bytes", bytes_json(x.bytes)}});
    content.push_back({{"token", t.text}, {"logprob", t.logprob}, {"bytes", bytes_json(t.bytes)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

// Streaming Anthropic content blocks and Responses output items share one index sequence and one
// open block at a time; the endpoint decides which events open and close one.
std::string Responder::close_block() {
  if (open_block_.empty()) return "";
  std::string s = pr_.endpoint == Endpoint::kMessages ? anthropic_block_stop() : responses_item_done();
  open_block_.clear();
  return s;
}

std::string Responder::open_block(const char* type) {
  if (open_block_ == type) return "";
  std::string s = close_block();
  ++block_index_;
  open_block_ = type;
  return s + (pr_.endpoint == Endpoint::kMessages ? anthropic_block_start() : responses_item_added());
}

std::string Responder::anthropic_block_stop() {
  std::string s;
  if (open_block_ == "thinking")
    s += sse({{"type", "content_block_delta"}, {"index", block_index_}, {"delta", {{"type", "signature_delta"}, {"signature", ""}}}},
             "content_block_delta");
  return s + sse({{"type", "content_block_stop"}, {"index", block_index_}}, "content_block_stop");
}

std::string Responder::anthropic_block_start() {
  ojson cb = open_block_ == "thinking" ? ojson{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}} : ojson{{"type", "text"}, {"text", ""}};
  return sse({{"type", "content_block_start"}, {"index", block_index_}, {"content_block", cb}}, "content_block_start");
}

std::string Responder::responses_item_done() {
  std::string s;
  const std::string item_id = id_ + "_" + std::to_string(block_index_);
  ojson item;
  if (open_block_ == "reasoning") {
    s += sse({{"type", "response.reasoning_text.done"}, {"item_id", item_id}, {"output_index", block_index_}, {"content_index", 0},
              {"text", reasoning_}, {"sequence_number", seq_++}}, "response.reasoning_text.done");
    item = {{"type", "reasoning"}, {"id", item_id}, {"summary", ojson::array()},
            {"content", ojson::array({{{"type", "reasoning_text"}, {"text", reasoning_}}})}};
  } else {
    s += sse({{"type", "response.output_text.done"}, {"item_id", item_id}, {"output_index", block_index_}, {"content_index", 0},
              {"text", text_}, {"sequence_number", seq_++}}, "response.output_text.done");
    item = {{"type", "message"}, {"id", item_id}, {"role", "assistant"}, {"status", "completed"},
            {"content", ojson::array({{{"type", "output_text"}, {"text", text_}, {"annotations", ojson::array()}}})}};
  }
  return s + sse({{"type", "response.output_item.done"}, {"output_index", block_index_}, {"item", item}, {"sequence_number", seq_++}},
                 "response.output_item.done");
}

std::string Responder::responses_item_added() {
  const std::string item_id = id_ + "_" + std::to_string(block_index_);
  ojson item = open_block_ == "reasoning"
                   ? ojson{{"type", "reasoning"}, {"id", item_id}, {"summary", ojson::array()}}
                   : ojson{{"type", "message"}, {"id", item_id}, {"role", "assistant"}, {"status", "in_progress"}, {"content", ojson::array()}};
  std::string s = sse({{"type", "response.output_item.added"}, {"output_index", block_index_}, {"item", item}, {"sequence_number", seq_++}},
                      "response.output_item.added");
  if (open_block_ == "message")
    s += sse({{"type", "response.content_part.added"}, {"item_id", item_id}, {"output_index", block_index_}, {"content_index", 0},
              {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", ojson::array()}}}, {"sequence_number", seq_++}},
             "response.content_part.added");
  return s;
}

std::string Responder::stream_start() {
  switch (pr_.endpoint) {
    case Endpoint::kChat:
      return sse({{"id", id_}, {"object", "chat.completion.chunk"}, {"created", created_}, {"model", model_},
                  {"choices", ojson::array({{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr}, {"finish_reason", nullptr}}})}});
    case Endpoint::kMessages:
      return sse({{"type", "message_start"},
                  {"message", {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", model_}, {"content", ojson::array()},
                               {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                               {"usage", {{"input_tokens", int64_t(pr_.req.prompt.size())}, {"output_tokens", 0}}}}}},
                 "message_start");
    case Endpoint::kResponses: {
      ojson r = {{"id", id_}, {"object", "response"}, {"created_at", created_}, {"status", "in_progress"}, {"model", model_},
                 {"output", ojson::array()}};
      for (const auto& [k, v] : pr_.echo.items()) r[k] = v;
      return sse({{"type", "response.created"}, {"response", r}, {"sequence_number", seq_++}}, "response.created") +
             sse({{"type", "response.in_progress"}, {"response", r}, {"sequence_number", seq_++}}, "response.in_progress");
    }
    case Endpoint::kCompletions: return "";
  }
  return "";
}

std::string Responder::on_event(const engine::Event& e) {
  using K = engine::Event::Kind;
  std::string s;
  if (e.kind == K::kReasoning) reasoning_ += e.text;
  if (e.kind == K::kText) text_ += e.text;
  if (e.kind == K::kLogprob) tokens_.push_back(e.token);
  Call call;
  if (e.kind == K::kToolCall) {
    if (!pr_.parallel_tool_calls && !calls_.empty()) return "";
    call = {hex_id(pr_.endpoint == Endpoint::kMessages ? "toolu_" : "call_"), e.call.name, e.call.arguments};
    calls_.push_back(call);
  }
  if (!pr_.stream) return "";
  const int call_index = int(calls_.size()) - 1;
  switch (pr_.endpoint) {
    case Endpoint::kChat: {
      ojson delta;
      if (e.kind == K::kReasoning) delta = {{"reasoning_content", e.text}};
      else if (e.kind == K::kText) delta = {{"content", e.text}};
      else if (e.kind == K::kToolCall)
        delta = {{"tool_calls", ojson::array({{{"index", call_index}, {"id", call.id}, {"type", "function"},
                                               {"function", {{"name", call.name}, {"arguments", call.arguments}}}}})}};
      else if (e.kind == K::kLogprob && pr_.logprobs) delta = ojson::object();
      else return "";
      ojson choice = {{"index", 0}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
      if (e.kind == K::kLogprob) {
        tokens_.clear();
        tokens_.push_back(e.token);
        choice["logprobs"] = logprobs_json();
      }
      return sse({{"id", id_}, {"object", "chat.completion.chunk"}, {"created", created_}, {"model", model_}, {"choices", ojson::array({choice})}});
    }
    case Endpoint::kCompletions: {
      if (e.kind != K::kText) return "";
      return sse({{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", model_},
                  {"choices", ojson::array({{{"index", 0}, {"text", e.text}, {"logprobs", nullptr}, {"finish_reason", nullptr}}})}});
    }
    case Endpoint::kMessages: {
      if (e.kind == K::kReasoning) {
        s += open_block("thinking");
        s += sse({{"type", "content_block_delta"}, {"index", block_index_}, {"delta", {{"type", "thinking_delta"}, {"thinking", e.text}}}},
                 "content_block_delta");
      } else if (e.kind == K::kText) {
        s += open_block("text");
        s += sse({{"type", "content_block_delta"}, {"index", block_index_}, {"delta", {{"type", "text_delta"}, {"text", e.text}}}},
                 "content_block_delta");
      } else if (e.kind == K::kToolCall) {
        s += close_block();
        ++block_index_;
        s += sse({{"type", "content_block_start"}, {"index", block_index_},
                  {"content_block", {{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", ojson::object()}}}},
                 "content_block_start");
        s += sse({{"type", "content_block_delta"}, {"index", block_index_}, {"delta", {{"type", "input_json_delta"}, {"partial_json", call.arguments}}}},
                 "content_block_delta");
        s += sse({{"type", "content_block_stop"}, {"index", block_index_}}, "content_block_stop");
      }
      return s;
    }
    case Endpoint::kResponses: {
      if (e.kind == K::kReasoning) {
        s += open_block("reasoning");
        s += sse({{"type", "response.reasoning_text.delta"}, {"item_id", id_ + "_" + std::to_string(block_index_)}, {"output_index", block_index_},
                  {"content_index", 0}, {"delta", e.text}, {"sequence_number", seq_++}}, "response.reasoning_text.delta");
      } else if (e.kind == K::kText) {
        s += open_block("message");
        s += sse({{"type", "response.output_text.delta"}, {"item_id", id_ + "_" + std::to_string(block_index_)}, {"output_index", block_index_},
                  {"content_index", 0}, {"delta", e.text}, {"logprobs", ojson::array()}, {"sequence_number", seq_++}}, "response.output_text.delta");
      } else if (e.kind == K::kToolCall) {
        s += close_block();
        ++block_index_;
        const std::string item_id = id_ + "_" + std::to_string(block_index_);
        ojson item = {{"type", "function_call"}, {"id", item_id}, {"call_id", call.id}, {"name", call.name}, {"arguments", ""}, {"status", "in_progress"}};
        s += sse({{"type", "response.output_item.added"}, {"output_index", block_index_}, {"item", item}, {"sequence_number", seq_++}},
                 "response.output_item.added");
        s += sse({{"type", "response.function_call_arguments.delta"}, {"item_id", item_id}, {"output_index", block_index_},
                  {"delta", call.arguments}, {"sequence_number", seq_++}}, "response.function_call_arguments.delta");
        s += sse({{"type", "response.function_call_arguments.done"}, {"item_id", item_id}, {"output_index", block_index_},
                  {"arguments", call.arguments}, {"sequence_number", seq_++}}, "response.function_call_arguments.done");
        item["arguments"] = call.arguments;
        item["status"] = "completed";
        s += sse({{"type", "response.output_item.done"}, {"output_index", block_index_}, {"item", item}, {"sequence_number", seq_++}},
                 "response.output_item.done");
      }
      return s;
    }
  }
  return s;
}

std::string Responder::stream_end(const engine::Event& done) {
  switch (pr_.endpoint) {
    case Endpoint::kChat:
    case Endpoint::kCompletions: {
      const bool chat = pr_.endpoint == Endpoint::kChat;
      ojson choice = chat ? ojson{{"index", 0}, {"delta", ojson::object()}, {"logprobs", nullptr}, {"finish_reason", finish_name(done.finish)}}
                          : ojson{{"index", 0}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", finish_name(done.finish)}};
      const char* obj = chat ? "chat.completion.chunk" : "text_completion";
      std::string s = sse({{"id", id_}, {"object", obj}, {"created", created_}, {"model", model_}, {"choices", ojson::array({choice})}});
      if (pr_.include_usage || !chat)
        s += sse({{"id", id_}, {"object", obj}, {"created", created_}, {"model", model_}, {"choices", ojson::array()}, {"usage", usage_json(done.usage)}});
      return s + "data: [DONE]\n\n";
    }
    case Endpoint::kMessages: {
      std::string s = close_block();
      s += sse({{"type", "message_delta"},
                {"delta", {{"stop_reason", finish_name(done.finish)}, {"stop_sequence", done.stop_matched.empty() ? ojson(nullptr) : ojson(done.stop_matched)}}},
                {"usage", {{"input_tokens", done.usage.prompt_tokens}, {"output_tokens", done.usage.completion_tokens}}}},
               "message_delta");
      return s + sse({{"type", "message_stop"}}, "message_stop");
    }
    case Endpoint::kResponses: {
      std::string s = close_block();
      ojson r = ojson::parse(body(done));
      const char* ev = r["status"] == "completed" ? "response.completed" : "response.incomplete";
      return s + sse({{"type", ev}, {"response", r}, {"sequence_number", seq_++}}, ev);
    }
  }
  return "";
}

std::string Responder::body(const engine::Event& done) {
  switch (pr_.endpoint) {
    case Endpoint::kChat: {
      ojson msg = {{"role", "assistant"}, {"content", text_}};
      if (pr_.req.thinking || !reasoning_.empty()) msg["reasoning_content"] = reasoning_;
      if (!calls_.empty()) {
        ojson tc = ojson::array();
        for (const auto& c : calls_) tc.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
        msg["tool_calls"] = tc;
      }
      return dump({{"id", id_}, {"object", "chat.completion"}, {"created", created_}, {"model", model_},
                   {"choices", ojson::array({{{"index", 0}, {"message", msg}, {"logprobs", logprobs_json()}, {"finish_reason", finish_name(done.finish)}}})},
                   {"usage", usage_json(done.usage)}});
    }
    case Endpoint::kCompletions:
      return dump({{"id", id_}, {"object", "text_completion"}, {"created", created_}, {"model", model_},
                   {"choices", ojson::array({{{"index", 0}, {"text", text_}, {"logprobs", logprobs_json()}, {"finish_reason", finish_name(done.finish)}}})},
                   {"usage", usage_json(done.usage)}});
    case Endpoint::kMessages: {
      ojson content = ojson::array();
      if (!reasoning_.empty()) content.push_back({{"type", "thinking"}, {"thinking", reasoning_}, {"signature", ""}});
      if (!text_.empty() || (calls_.empty() && reasoning_.empty())) content.push_back({{"type", "text"}, {"text", text_}});
      for (const auto& c : calls_) content.push_back({{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", parse_or_empty(c.arguments)}});
      return dump({{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", model_}, {"content", content},
                   {"stop_reason", finish_name(done.finish)},
                   {"stop_sequence", done.stop_matched.empty() ? ojson(nullptr) : ojson(done.stop_matched)},
                   {"usage", usage_json(done.usage)}});
    }
    case Endpoint::kResponses: {
      ojson output = ojson::array();
      int i = 0;
      if (!reasoning_.empty())
        output.push_back({{"type", "reasoning"}, {"id", id_ + "_r" + std::to_string(i++)}, {"summary", ojson::array()},
                          {"content", ojson::array({{{"type", "reasoning_text"}, {"text", reasoning_}}})}});
      if (!text_.empty() || calls_.empty())
        output.push_back({{"type", "message"}, {"id", id_ + "_m" + std::to_string(i++)}, {"role", "assistant"}, {"status", "completed"},
                          {"content", ojson::array({{{"type", "output_text"}, {"text", text_}, {"annotations", ojson::array()}}})}});
      for (const auto& c : calls_)
        output.push_back({{"type", "function_call"}, {"id", id_ + "_f" + std::to_string(i++)}, {"call_id", c.id}, {"name", c.name},
                          {"arguments", c.arguments}, {"status", "completed"}});
      const bool complete = done.finish != engine::FinishReason::kLength;
      ojson r = {{"id", id_}, {"object", "response"}, {"created_at", created_}, {"status", complete ? "completed" : "incomplete"},
                 {"model", model_}, {"output", output}, {"usage", usage_json(done.usage)}, {"error", nullptr},
                 {"incomplete_details", complete ? ojson(nullptr) : ojson{{"reason", "max_output_tokens"}}}};
      for (const auto& [k, v] : pr_.echo.items()) r[k] = v;  // the request's options, as sent
      return dump(r);
    }
  }
  return "{}";
}

}  // namespace fb::server
