// The JSON-schema subset response_format accepts (issue 27; docs/serving.md lists it). The grammar
// engine (xgrammar) would silently ignore keywords it cannot enforce; this check refuses them
// first, naming the keyword and where it is, and refuses schemas no value can satisfy.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"

namespace fb::grammar {

// kInvalidArgument naming the first unsupported keyword, malformed value or unsatisfiable part
// (with its JSON pointer inside the schema); Status() when every keyword is one we enforce.
// `what` names the schema in messages ("response_format schema", "tool 'f' parameters schema").
Status check_schema(const nlohmann::ordered_json& schema, const std::string& what = "response_format schema");

}  // namespace fb::grammar
