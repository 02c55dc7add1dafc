// Responder: engine events -> one API's wire format (spec/15 §9): SSE chunks while streaming,
// and the whole JSON body otherwise. Tool-call ids are invented here (call_/toolu_ + hex).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/request_parse.h"

namespace fb::server {

class Responder {
 public:
  Responder(const ParsedRequest& pr, std::string model_name);
  std::string stream_start();                        // SSE sent before any event
  std::string on_event(const engine::Event& e);      // accumulates; returns SSE when streaming
  std::string stream_end(const engine::Event& done); // closing SSE
  std::string body(const engine::Event& done);       // non-streaming JSON

 private:
  struct Call {
    std::string id, name, arguments;
  };
  std::string sse(const ojson& j, const char* event = nullptr);
  std::string open_block(const char* type);  // opens a block / item of `type`, closing the open one
  std::string close_block();
  std::string anthropic_block_start();
  std::string anthropic_block_stop();
  std::string responses_item_added();
  std::string responses_item_done();
  ojson usage_json(const engine::Usage& u) const;
  const char* finish_name(engine::FinishReason r) const;
  ojson logprobs_json() const;

  ParsedRequest pr_;
  std::string model_, id_;
  int64_t created_ = 0;
  std::string reasoning_, text_;
  std::vector<Call> calls_;
  std::vector<engine::TokenInfo> tokens_;
  // Streaming state.
  std::string open_block_;  // Anthropic block / Responses item currently open ("" none)
  int block_index_ = -1;
  int seq_ = 0;
};

}  // namespace fb::server
