// Python `json.dumps(value, ensure_ascii=False)` byte-for-byte over nlohmann::ordered_json
// (spec/15 §6.1): separators ", " and ": ", keys in the given order, non-ASCII raw, floats in
// Python repr form, NaN/Infinity spelled as Python does. The prompt bytes depend on it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace fb::tokenizer {

std::string python_json_dumps(const nlohmann::ordered_json& value);
// A JSON string literal for s (quotes included), Python escaping rules.
std::string python_json_string(std::string_view s);

}  // namespace fb::tokenizer
