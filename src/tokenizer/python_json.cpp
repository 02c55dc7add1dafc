#include "tokenizer/python_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace fb::tokenizer {

namespace {

// Python float.__repr__: shortest round-trip digits; fixed notation when -4 <= exp < 16.
std::string python_float(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // e.g. "-1.2345e+17"
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  if (digits.size() > 1) digits.erase(1, 1);  // drop the '.'
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0." + std::string(size_t(-exp - 1), '0') + digits;
    } else if (size_t(exp) + 1 >= digits.size()) {
      out = digits + std::string(size_t(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, size_t(exp) + 1) + "." + digits.substr(size_t(exp) + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return sign + out;
}

void dump(const nlohmann::ordered_json& v, std::string* out) {
  switch (v.type()) {
    case nlohmann::ordered_json::value_t::null: *out += "null"; break;
    case nlohmann::ordered_json::value_t::boolean: *out += v.get<bool>() ? "true" : "false"; break;
    case nlohmann::ordered_json::value_t::number_integer: *out += std::to_string(v.get<int64_t>()); break;
    case nlohmann::ordered_json::value_t::number_unsigned: *out += std::to_string(v.get<uint64_t>()); break;
    case nlohmann::ordered_json::value_t::number_float: *out += python_float(v.get<double>()); break;
    case nlohmann::ordered_json::value_t::string: *out += python_json_string(v.get_ref<const std::string&>()); break;
    case nlohmann::ordered_json::value_t::array: {
      *out += '[';
      bool first = true;
      for (const auto& e : v) {
        if (!first) *out += ", ";
        first = false;
        dump(e, out);
      }
      *out += ']';
      break;
    }
    case nlohmann::ordered_json::value_t::object: {
      *out += '{';
      bool first = true;
      for (const auto& [k, e] : v.items()) {
        if (!first) *out += ", ";
        first = false;
        *out += python_json_string(k);
        *out += ": ";
        dump(e, out);
      }
      *out += '}';
      break;
    }
    default: *out += "null"; break;  // binary / discarded never come from parsed client JSON
  }
}

}  // namespace

std::string python_json_string(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (char ch : s) {
    const auto c = uint8_t(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
  return out;
}

std::string python_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  dump(value, &out);
  return out;
}

}  // namespace fb::tokenizer
