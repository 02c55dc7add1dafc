// HTTP server (OpenAI + Anthropic APIs, /health, /metrics) on cpp-httplib. HTTP threads parse,
// render and tokenize, then queue on the Engine; they never touch tensors. Every handler is
// wrapped once against exceptions from the JSON library, so bad input is a 4xx, never a crash.
#pragma once

#include <string>

#include "base/status.h"
#include "engine/engine.h"

namespace fb::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;                   // empty: no authentication
  std::string model_name = "deepseek-v4.1-flash";
  size_t max_body_bytes = 8u << 20;      // larger bodies get 413
  std::string tools_template;
  int keepalive_ms = 5000;               // SSE comment / Anthropic ping while nothing else is sent
  bool allow_local_images = false;       // file:// and plain paths in image parts (never the network)
  int max_images = 64;                   // per request
  std::string phrase_bias_file;          // JSON phrase bias list applied to every request (issue 27)
};

// Serves until the process is stopped; returns an error if the port cannot be bound.
Status serve(engine::Engine& engine, const ServerOptions& opt);

}  // namespace fb::server
