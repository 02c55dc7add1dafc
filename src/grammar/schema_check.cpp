#include "grammar/schema_check.h"

#include <set>
#include <string>

namespace fb::grammar {

namespace {

using ojson = nlohmann::ordered_json;

// Keywords the grammar enforces (each has a test in compiler_test.cpp) and annotations that
// constrain nothing. Everything else is refused: an unenforced keyword would return JSON that
// does not validate against the client's schema.
const std::set<std::string>& enforced() {
  static const std::set<std::string> k = {"type",     "properties", "required",  "additionalProperties", "items",     "enum",
                                          "const",    "anyOf",      "$ref",      "$defs",                "definitions", "minItems",
                                          "maxItems", "minLength",  "maxLength", "minimum",              "maximum"};
  return k;
}
const std::set<std::string>& annotations() {
  static const std::set<std::string> k = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
                                          "readOnly", "writeOnly"};
  return k;
}
const std::set<std::string>& type_names() {
  static const std::set<std::string> k = {"object", "array", "string", "number", "integer", "boolean", "null"};
  return k;
}

struct Checker {
  const ojson& root;
  const std::string& schema_name;  // "response_format schema", "tool 'f' parameters schema"

  Status bad(const std::string& at, const std::string& what) const {
    return FB_ERROR(kInvalidArgument) << schema_name << " at '" << (at.empty() ? "/" : at) << "': " << what;
  }

  Status count(const ojson& s, const char* key, const std::string& at) const {
    if (!s.contains(key)) return Status();
    const ojson& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) return bad(at, std::string("'") + key + "' must be a non-negative integer");
    return Status();
  }

  Status check(const ojson& s, const std::string& at, int depth) const {
    if (depth > 64) return bad(at, "nested deeper than 64 levels");
    if (s.is_boolean()) {
      if (!s.get<bool>()) return bad(at, "the schema 'false' admits no value");
      return Status();
    }
    if (!s.is_object()) return bad(at, "a schema must be an object or a boolean");
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (!enforced().count(k) && !annotations().count(k))
        return bad(at, "keyword '" + k + "' is not supported (supported: type, properties, required, additionalProperties, items, enum, const, "
                                          "anyOf, $ref/$defs, minItems, maxItems, minLength, maxLength, minimum, maximum)");
    }
    if (s.contains("type")) {
      const ojson& t = s["type"];
      auto one = [&](const ojson& x) { return x.is_string() && type_names().count(x.get<std::string>()); };
      if (t.is_array()) {
        if (t.empty()) return bad(at, "'type' is an empty list");
        for (const auto& x : t)
          if (!one(x)) return bad(at, "'type' must name object, array, string, number, integer, boolean or null");
      } else if (!one(t)) {
        return bad(at, "'type' must name object, array, string, number, integer, boolean or null");
      }
    }
    if (s.contains("enum") && (!s["enum"].is_array() || s["enum"].empty())) return bad(at, "'enum' must be a non-empty list");
    if (s.contains("properties")) {
      const ojson& p = s["properties"];
      if (!p.is_object()) return bad(at, "'properties' must be an object");
      for (auto it = p.begin(); it != p.end(); ++it) FB_RETURN_IF_ERROR(check(it.value(), at + "/properties/" + it.key(), depth + 1));
    }
    if (s.contains("required")) {
      const ojson& r = s["required"];
      if (!r.is_array()) return bad(at, "'required' must be a list of property names");
      const bool closed = s.contains("additionalProperties") && s["additionalProperties"].is_boolean() && !s["additionalProperties"].get<bool>();
      for (const auto& n : r) {
        if (!n.is_string()) return bad(at, "'required' must be a list of property names");
        if (closed && !(s.contains("properties") && s["properties"].contains(n.get<std::string>())))
          return bad(at, "property '" + n.get<std::string>() + "' is required but additionalProperties is false and it is not in 'properties'");
      }
    }
    if (s.contains("additionalProperties") && !s["additionalProperties"].is_boolean())
      FB_RETURN_IF_ERROR(check(s["additionalProperties"], at + "/additionalProperties", depth + 1));
    if (s.contains("items")) {
      if (s["items"].is_boolean() && !s["items"].get<bool>()) {
        if (s.contains("minItems") && s["minItems"].is_number_integer() && s["minItems"].get<int64_t>() > 0)
          return bad(at, "'items' is false but 'minItems' asks for items");
      } else {
        FB_RETURN_IF_ERROR(check(s["items"], at + "/items", depth + 1));
      }
    }
    if (s.contains("anyOf")) {
      const ojson& a = s["anyOf"];
      if (!a.is_array() || a.empty()) return bad(at, "'anyOf' must be a non-empty list of schemas");
      for (size_t i = 0; i < a.size(); ++i) FB_RETURN_IF_ERROR(check(a[i], at + "/anyOf/" + std::to_string(i), depth + 1));
    }
    for (const char* defs : {"$defs", "definitions"}) {
      if (!s.contains(defs)) continue;
      if (!s[defs].is_object()) return bad(at, std::string("'") + defs + "' must be an object");
      for (auto it = s[defs].begin(); it != s[defs].end(); ++it)
        FB_RETURN_IF_ERROR(check(it.value(), at + "/" + defs + "/" + it.key(), depth + 1));
    }
    if (s.contains("$ref")) {
      const ojson& r = s["$ref"];
      if (!r.is_string()) return bad(at, "'$ref' must be a string");
      const std::string ref = r.get<std::string>();
      if (ref.rfind("#/", 0) != 0) return bad(at, "'$ref' " + ref + " is not a reference inside this schema (#/...)");
      bool found = false;
      try {  // nlohmann throws on a malformed pointer: wrapped here, its one use
        found = root.contains(ojson::json_pointer(ref.substr(1)));
      } catch (const std::exception&) {
        found = false;
      }
      if (!found) return bad(at, "'$ref' " + ref + " names nothing in the schema");
    }
    for (const char* key : {"minItems", "maxItems", "minLength", "maxLength"}) FB_RETURN_IF_ERROR(count(s, key, at));
    for (const char* key : {"minimum", "maximum"})
      if (s.contains(key) && !s[key].is_number()) return bad(at, std::string("'") + key + "' must be a number");
    auto above = [&](const char* lo, const char* hi) {
      return s.contains(lo) && s.contains(hi) && s[lo].is_number() && s[hi].is_number() && s[lo].get<double>() > s[hi].get<double>();
    };
    if (above("minItems", "maxItems")) return bad(at, "'minItems' is above 'maxItems'");
    if (above("minLength", "maxLength")) return bad(at, "'minLength' is above 'maxLength'");
    if (above("minimum", "maximum")) return bad(at, "'minimum' is above 'maximum'");
    return Status();
  }
};

}  // namespace

Status check_schema(const ojson& schema, const std::string& what) { return Checker{schema, what}.check(schema, "", 0); }

}  // namespace fb::grammar
