// The one table from Status to HTTP (STYLE.md "Errors"), and error bodies in each API's format
// (OpenAI {"error": {...}}, Anthropic {"type": "error", "error": {...}}).
#pragma once

#include <string>

#include "base/status.h"

namespace fb::server {

enum class Api { kOpenAi, kAnthropic };

struct HttpError {
  int http = 500;
  const char* openai_type = "server_error";
  const char* anthropic_type = "api_error";
};

HttpError http_error_for(StatusCode code);
// Error body for an HTTP status that did not come from a Status (401, 404, 413, ...).
HttpError http_error_for_http(int http);
std::string error_body(Api api, const HttpError& e, const std::string& message);

// --api-key: the request names `key` as "Authorization: Bearer KEY" or "x-api-key: KEY" (an
// empty key lets every request in). Shared by the API and the dashboard's /v1/stats.
bool api_key_ok(const std::string& key, const std::string& authorization, const std::string& x_api_key);

}  // namespace fb::server
