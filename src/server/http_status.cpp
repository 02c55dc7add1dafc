#include "server/http_status.h"

#include <nlohmann/json.hpp>

namespace fb::server {

HttpError http_error_for(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return {200, "", ""};
    case StatusCode::kInvalidArgument: return {400, "invalid_request_error", "invalid_request_error"};
    case StatusCode::kUnsupported: return {400, "invalid_request_error", "invalid_request_error"};
    case StatusCode::kNotFound: return {404, "not_found_error", "not_found_error"};
    // Context overflow: the request cannot be served as sent.
    case StatusCode::kResourceExhausted: return {400, "invalid_request_error", "invalid_request_error"};
    // A full queue: retry later (the SDKs retry 429 with backoff).
    case StatusCode::kUnavailable: return {429, "rate_limit_exceeded", "overloaded_error"};
    case StatusCode::kCancelled: return {499, "request_cancelled", "api_error"};
    case StatusCode::kOutOfMemory: return {503, "server_error", "overloaded_error"};
    case StatusCode::kCorrupt:
    case StatusCode::kIo:
    case StatusCode::kInternal: return {500, "server_error", "api_error"};
  }
  return {500, "server_error", "api_error"};
}

HttpError http_error_for_http(int http) {
  switch (http) {
    case 400: return {400, "invalid_request_error", "invalid_request_error"};
    case 401: return {401, "authentication_error", "authentication_error"};
    case 404: return {404, "not_found_error", "not_found_error"};
    case 405: return {405, "invalid_request_error", "invalid_request_error"};
    case 413: return {413, "invalid_request_error", "request_too_large"};
    case 429: return {429, "rate_limit_exceeded", "overloaded_error"};
    default: return {http, http < 500 ? "invalid_request_error" : "server_error", http < 500 ? "invalid_request_error" : "api_error"};
  }
}

std::string error_body(Api api, const HttpError& e, const std::string& message) {
  nlohmann::json j;
  if (api == Api::kAnthropic) {
    j = {{"type", "error"}, {"error", {{"type", e.anthropic_type}, {"message", message}}}};
  } else {
    j = {{"error", {{"message", message}, {"type", e.openai_type}, {"param", nullptr}, {"code", nullptr}}}};
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool api_key_ok(const std::string& key, const std::string& authorization, const std::string& x_api_key) {
  return key.empty() || authorization == "Bearer " + key || x_api_key == key;
}

}  // namespace fb::server
