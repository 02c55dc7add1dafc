#include "server/request_parse.h"

#include <algorithm>
#include <climits>
#include <cstdlib>

#include "server/phrase_bias.h"
#include "tokenizer/prompt_encoder.h"
#if FB_SERVER_HAS_GRAMMAR
#include "grammar/compiler.h"
#endif

namespace fb::server {

namespace {

using tokenizer::Message;

Status type_error(const char* key, const char* want) { return FB_ERROR(kInvalidArgument) << "'" << key << "' must be " << want; }

// Optional typed fields: absent or null keeps *out; a wrong type is a 400 naming the field.
Status opt_number(const ojson& b, const char* key, double* out) {
  if (!b.contains(key) || b[key].is_null()) return Status();
  if (!b[key].is_number()) return type_error(key, "a number");
  *out = b[key].get<double>();
  return Status();
}
Status opt_int(const ojson& b, const char* key, int64_t* out) {
  if (!b.contains(key) || b[key].is_null()) return Status();
  if (!b[key].is_number_integer()) return type_error(key, "an integer");
  *out = b[key].get<int64_t>();
  return Status();
}
Status opt_bool(const ojson& b, const char* key, bool* out) {
  if (!b.contains(key) || b[key].is_null()) return Status();
  if (!b[key].is_boolean()) return type_error(key, "a boolean");
  *out = b[key].get<bool>();
  return Status();
}
Status opt_string(const ojson& b, const char* key, std::string* out) {
  if (!b.contains(key) || b[key].is_null()) return Status();
  if (!b[key].is_string()) return type_error(key, "a string");
  *out = b[key].get<std::string>();
  return Status();
}

struct Thinking {
  bool on = true;  // spec/16 §1: thinking on by default
  int effort = 75;
};

Status apply_effort(const ojson& v, Thinking* t, const char* key) {
  std::string name;
  if (v.is_string()) name = v.get<std::string>();
  else if (v.is_number_integer()) name = std::to_string(v.get<int64_t>());
  else return type_error(key, "a string or an integer");
  auto e = tokenizer::effort_from_api_name(name);
  if (!e.ok()) return e.status();
  if (!e->has_value()) {
    t->on = false;
  } else {
    t->on = true;
    t->effort = **e;
  }
  return Status();
}

// DeepSeek `thinking: {type}`, reasoning_effort, chat_template_kwargs, model aliases.
Status parse_thinking(const ojson& b, const std::string& model, Thinking* t) {
  if (model == "deepseek-chat") t->on = false;
  if (model == "deepseek-reasoner") t->on = true;
  if (b.contains("thinking") && !b["thinking"].is_null()) {
    const ojson& th = b["thinking"];
    if (th.is_boolean()) t->on = th.get<bool>();
    else if (th.is_object() && th.contains("type") && th["type"].is_string()) {
      const std::string ty = th["type"].get<std::string>();
      if (ty == "enabled") t->on = true;
      else if (ty == "disabled") t->on = false;
      else return FB_ERROR(kInvalidArgument) << "'thinking.type' must be \"enabled\" or \"disabled\"";
    } else {
      return type_error("thinking", "an object {\"type\": \"enabled\"|\"disabled\"}");
    }
  }
  if (b.contains("think") && !b["think"].is_null()) FB_RETURN_IF_ERROR(opt_bool(b, "think", &t->on));
  if (b.contains("reasoning_effort") && !b["reasoning_effort"].is_null()) FB_RETURN_IF_ERROR(apply_effort(b["reasoning_effort"], t, "reasoning_effort"));
  if (b.contains("chat_template_kwargs") && !b["chat_template_kwargs"].is_null()) {
    const ojson& k = b["chat_template_kwargs"];
    if (!k.is_object()) return type_error("chat_template_kwargs", "an object");
    for (const char* key : {"thinking", "enable_thinking"}) FB_RETURN_IF_ERROR(opt_bool(k, key, &t->on));
    if (k.contains("reasoning_effort") && !k["reasoning_effort"].is_null()) FB_RETURN_IF_ERROR(apply_effort(k["reasoning_effort"], t, "reasoning_effort"));
  }
  return Status();
}

Status parse_sampling(const ojson& b, Endpoint ep, ParsedRequest* pr) {
  engine::SamplingParams& s = pr->req.sampling;
  double temperature = 1.0, top_p = 0.95, min_p = 0;  // spec/16 §1 defaults, applied explicitly
  int64_t top_k = 0, seed = -1;
  FB_RETURN_IF_ERROR(opt_number(b, "temperature", &temperature));
  FB_RETURN_IF_ERROR(opt_number(b, "top_p", &top_p));
  FB_RETURN_IF_ERROR(opt_number(b, "min_p", &min_p));
  FB_RETURN_IF_ERROR(opt_int(b, "top_k", &top_k));
  FB_RETURN_IF_ERROR(opt_int(b, "seed", &seed));
  if (temperature < 0 || temperature > 2) return FB_ERROR(kInvalidArgument) << "'temperature' must be in [0, 2]";
  if (top_p <= 0 || top_p > 1) return FB_ERROR(kInvalidArgument) << "'top_p' must be in (0, 1]";
  if (min_p < 0 || min_p > 1) return FB_ERROR(kInvalidArgument) << "'min_p' must be in [0, 1]";
  if (top_k < 0 || top_k > (int64_t(1) << 20)) return FB_ERROR(kInvalidArgument) << "'top_k' must be >= 0";
  s.temperature = float(temperature);
  s.top_p = float(top_p);
  s.min_p = float(min_p);
  s.top_k = int(top_k);
  if (b.contains("seed") && !b["seed"].is_null()) s.seed = uint64_t(seed);
  // OpenAI's logit processing (issue 27): bias per token id in [-100, 100] (ids checked against the
  // vocabulary once the tokenizer is known, parse_request), presence and frequency penalties in [-2, 2].
  double presence = 0, frequency = 0;
  FB_RETURN_IF_ERROR(opt_number(b, "presence_penalty", &presence));
  FB_RETURN_IF_ERROR(opt_number(b, "frequency_penalty", &frequency));
  if (presence < -2 || presence > 2) return FB_ERROR(kInvalidArgument) << "'presence_penalty' must be in [-2, 2] (got " << presence << ")";
  if (frequency < -2 || frequency > 2) return FB_ERROR(kInvalidArgument) << "'frequency_penalty' must be in [-2, 2] (got " << frequency << ")";
  s.presence_penalty = float(presence);
  s.frequency_penalty = float(frequency);
  if (b.contains("logit_bias") && !b["logit_bias"].is_null()) {
    const ojson& lb = b["logit_bias"];
    if (!lb.is_object()) return type_error("logit_bias", "an object mapping token ids to biases");
    if (lb.size() > 1024) return FB_ERROR(kInvalidArgument) << "'logit_bias' has " << lb.size() << " entries; at most 1024";
    for (auto it = lb.begin(); it != lb.end(); ++it) {
      const std::string& key = it.key();
      char* end = nullptr;
      const long long id = std::strtoll(key.c_str(), &end, 10);
      if (key.empty() || *end || id < 0 || id > INT32_MAX)
        return FB_ERROR(kInvalidArgument) << "'logit_bias' key \"" << key << "\" is not a token id";
      if (!it.value().is_number()) return FB_ERROR(kInvalidArgument) << "'logit_bias' value for token " << key << " must be a number";
      const double v = it.value().get<double>();
      if (!(v >= -100 && v <= 100)) return FB_ERROR(kInvalidArgument) << "'logit_bias' value for token " << key << " must be in [-100, 100] (got " << v << ")";
      s.logit_bias.push_back({int32_t(id), float(v)});
    }
  }

  int64_t max_tokens = -1;
  const char* max_key = nullptr;  // the field the request used
  for (const char* key : {"max_tokens", "max_completion_tokens", "max_output_tokens"}) {
    FB_RETURN_IF_ERROR(opt_int(b, key, &max_tokens));
    if (b.contains(key) && !b[key].is_null()) max_key = key;
  }
  if (ep == Endpoint::kMessages && !max_key) return FB_ERROR(kInvalidArgument) << "'max_tokens' is required";
  if (max_key && max_tokens < 1)
    return FB_ERROR(kInvalidArgument) << "'" << max_key << "' must be at least 1 (got " << max_tokens << ")";
  pr->req.max_tokens = max_tokens;  // resolved against the context once the prompt is known

  const char* stop_key = ep == Endpoint::kMessages ? "stop_sequences" : "stop";
  if (b.contains(stop_key) && !b[stop_key].is_null()) {
    const ojson& st = b[stop_key];
    if (st.is_string()) {
      pr->req.stop.push_back(st.get<std::string>());
    } else if (st.is_array()) {
      for (const auto& x : st) {
        if (!x.is_string()) return type_error(stop_key, "a string or a list of strings");
        pr->req.stop.push_back(x.get<std::string>());
      }
    } else {
      return type_error(stop_key, "a string or a list of strings");
    }
    if (pr->req.stop.size() > 16) return FB_ERROR(kInvalidArgument) << "at most 16 stop sequences";
  }
  if (ep == Endpoint::kCompletions) {
    int64_t lp = -1;
    FB_RETURN_IF_ERROR(opt_int(b, "logprobs", &lp));
    if (lp > 20) return FB_ERROR(kInvalidArgument) << "'logprobs' must be <= 20";
    if (lp >= 0) {
      pr->logprobs = true;
      pr->top_logprobs = int(lp);
    }
  } else if (ep == Endpoint::kChat) {
    FB_RETURN_IF_ERROR(opt_bool(b, "logprobs", &pr->logprobs));
    int64_t top = 0;
    FB_RETURN_IF_ERROR(opt_int(b, "top_logprobs", &top));
    if (top < 0 || top > 20) return FB_ERROR(kInvalidArgument) << "'top_logprobs' must be in [0, 20]";
    pr->top_logprobs = int(top);
  }
  pr->req.logprobs = pr->logprobs ? pr->top_logprobs : -1;
  FB_RETURN_IF_ERROR(opt_bool(b, "stream", &pr->stream));
  if (b.contains("stream_options") && b["stream_options"].is_object())
    FB_RETURN_IF_ERROR(opt_bool(b["stream_options"], "include_usage", &pr->include_usage));
  FB_RETURN_IF_ERROR(opt_bool(b, "parallel_tool_calls", &pr->parallel_tool_calls));
  int64_t n = 1;
  FB_RETURN_IF_ERROR(opt_int(b, "n", &n));
  if (n != 1) return FB_ERROR(kUnsupported) << "'n' must be 1";
  return Status();
}

// OpenAI tools [{type: function, function: {...}}] (Chat), flat function objects (Responses) or
// Anthropic tools -> function objects for the prompt; each tool's `strict` flag into *strict.
Result<ojson> function_tools(const ojson& tools, bool anthropic, std::vector<bool>* strict) {
  if (!tools.is_array()) return type_error("tools", "a list");
  ojson out = ojson::array();
  auto strict_of = [](const ojson& o, const std::string& name, bool* v) -> Status {
    if (!o.contains("strict") || o["strict"].is_null()) return Status();
    if (!o["strict"].is_boolean()) return FB_ERROR(kInvalidArgument) << "tool '" << name << "': 'strict' must be a boolean";
    *v = o["strict"].get<bool>();
    return Status();
  };
  for (const auto& t : tools) {
    if (!t.is_object()) return type_error("tools", "a list of objects");
    bool st = false;
    if (anthropic) {
      if (!t.contains("name") || !t["name"].is_string()) return FB_ERROR(kInvalidArgument) << "every tool needs a string 'name'";
      ojson f;
      f["name"] = t["name"];
      if (t.contains("description")) f["description"] = t["description"];
      f["parameters"] = t.contains("input_schema") ? t["input_schema"] : ojson::object();
      FB_RETURN_IF_ERROR(strict_of(t, t["name"].get<std::string>(), &st));
      out.push_back(f);
    } else {
      const ojson& f = t.contains("function") ? t["function"] : t;
      if (t.contains("type") && t["type"].is_string() && t["type"] != "function") continue;  // built-in tools: not ours
      if (!f.is_object() || !f.contains("name") || !f["name"].is_string())
        return FB_ERROR(kInvalidArgument) << "every tool needs function.name";
      ojson g;
      g["name"] = f["name"];
      if (f.contains("description")) g["description"] = f["description"];
      if (f.contains("parameters")) g["parameters"] = f["parameters"];
      FB_RETURN_IF_ERROR(strict_of(f, f["name"].get<std::string>(), &st));
      out.push_back(g);
    }
    if (strict) strict->push_back(st);
  }
  return out;
}

// tool_choice (issue 27; spec/15 §8.5): OpenAI Chat "none" | "auto" | "required" |
// {"type":"function","function":{"name"}}, Responses {"type":"function","name"}, Anthropic
// {"type":"auto"|"any"|"tool"|"none", "name", "disable_parallel_tool_use"}. "none" drops the tools
// from the prompt; "required"/"any" and a named tool are enforced by a grammar (the prompt format
// has no forcing of its own).
struct ToolChoice {
  enum class Mode { kAuto, kNone, kRequired, kNamed } mode = Mode::kAuto;
  std::string name;
  bool no_parallel = false;  // Anthropic disable_parallel_tool_use
  // OpenAI allowed_tools (mode auto or required): the calls may name only these functions; every
  // tool stays in the prompt. Empty: no such restriction.
  std::vector<std::string> allowed;
  std::string allowed_field;  // where the list sat, for the 400s ("tool_choice.allowed_tools.tools")
};

// OpenAI `allowed_tools`: Chat {"type": "allowed_tools", "allowed_tools": {"mode", "tools": [{"type":
// "function", "function": {"name"}}]}}, Responses {"type": "allowed_tools", "mode", "tools": [{"type":
// "function", "name"}]}. Either shape on either API. The names are checked against `tools` once
// those are known (request_constraint).
Status parse_allowed_tools(const ojson& tc, ToolChoice* c) {
  const bool nested = tc.contains("allowed_tools");
  const std::string at = nested ? "tool_choice.allowed_tools" : "tool_choice";
  const ojson& a = nested ? tc["allowed_tools"] : tc;
  if (!a.is_object()) return type_error(at.c_str(), "an object with 'mode' and 'tools'");
  if (!a.contains("mode") || !a["mode"].is_string())
    return FB_ERROR(kInvalidArgument) << "'" << at << ".mode' must be \"auto\" or \"required\"";
  const std::string mode = a["mode"].get<std::string>();
  if (mode == "auto") c->mode = ToolChoice::Mode::kAuto;
  else if (mode == "required") c->mode = ToolChoice::Mode::kRequired;
  else return FB_ERROR(kInvalidArgument) << "'" << at << ".mode' must be \"auto\" or \"required\" (got \"" << mode << "\")";
  c->allowed_field = at + ".tools";
  if (!a.contains("tools") || !a["tools"].is_array())
    return FB_ERROR(kInvalidArgument) << "'" << c->allowed_field << "' must be a list of tools ({\"type\": \"function\", ...})";
  const ojson& list = a["tools"];
  if (list.empty()) return FB_ERROR(kInvalidArgument) << "'" << c->allowed_field << "' is empty; name at least one function";
  if (list.size() > 1024) return FB_ERROR(kInvalidArgument) << "'" << c->allowed_field << "' has " << list.size() << " entries; at most 1024";
  for (size_t i = 0; i < list.size(); ++i) {
    const ojson& t = list[i];
    const std::string where = c->allowed_field + "[" + std::to_string(i) + "]";
    if (!t.is_object() || !t.contains("type") || !t["type"].is_string())
      return FB_ERROR(kInvalidArgument) << "'" << where << "' must be an object with a 'type'";
    const std::string type = t["type"].get<std::string>();
    if (type != "function")
      return FB_ERROR(kInvalidArgument) << "'" << where << "' has type \"" << type << "\"; this server has function tools only";
    const ojson* name = nullptr;
    if (t.contains("function") && t["function"].is_object() && t["function"].contains("name")) name = &t["function"]["name"];
    else if (t.contains("name")) name = &t["name"];
    if (!name || !name->is_string() || name->get<std::string>().empty())
      return FB_ERROR(kInvalidArgument) << "'" << where << "' needs the function's name ('function': {'name': ...} or 'name')";
    const std::string n = name->get<std::string>();
    if (std::find(c->allowed.begin(), c->allowed.end(), n) == c->allowed.end()) c->allowed.push_back(n);
  }
  return Status();
}

Result<ToolChoice> parse_tool_choice(const ojson& b) {
  ToolChoice c;
  if (!b.contains("tool_choice") || b["tool_choice"].is_null()) return c;
  const ojson& tc = b["tool_choice"];
  auto by_name = [&](const std::string& s) -> Status {
    if (s == "none") c.mode = ToolChoice::Mode::kNone;
    else if (s == "auto") c.mode = ToolChoice::Mode::kAuto;
    else if (s == "required" || s == "any") c.mode = ToolChoice::Mode::kRequired;
    else return FB_ERROR(kInvalidArgument) << "'tool_choice' \"" << s << "\" is not one of none, auto, required (Anthropic: auto, any, tool, none)";
    return Status();
  };
  if (tc.is_string()) {
    FB_RETURN_IF_ERROR(by_name(tc.get<std::string>()));
    return c;
  }
  if (!tc.is_object() || !tc.contains("type") || !tc["type"].is_string())
    return type_error("tool_choice", "a string or an object with a 'type'");
  const std::string type = tc["type"].get<std::string>();
  if (tc.contains("disable_parallel_tool_use") && !tc["disable_parallel_tool_use"].is_null()) {
    if (!tc["disable_parallel_tool_use"].is_boolean()) return type_error("tool_choice.disable_parallel_tool_use", "a boolean");
    c.no_parallel = tc["disable_parallel_tool_use"].get<bool>();
  }
  if (type == "function" || type == "tool") {
    const ojson* name = nullptr;
    if (tc.contains("function") && tc["function"].is_object() && tc["function"].contains("name")) name = &tc["function"]["name"];
    else if (tc.contains("name")) name = &tc["name"];
    if (!name || !name->is_string() || name->get<std::string>().empty())
      return FB_ERROR(kInvalidArgument) << "'tool_choice' of type " << type << " needs the function's name"
                                        << (type == "function" ? " ('function': {'name': ...})" : " ('name')");
    c.mode = ToolChoice::Mode::kNamed;
    c.name = name->get<std::string>();
    return c;
  }
  if (type == "none" || type == "auto" || type == "any" || type == "required") {
    FB_RETURN_IF_ERROR(by_name(type));
    return c;
  }
  if (type == "allowed_tools") {
    FB_RETURN_IF_ERROR(parse_allowed_tools(tc, &c));
    return c;
  }
  return FB_ERROR(kUnsupported) << "'tool_choice' type \"" << type << "\" is not supported (use none, auto, required, allowed_tools or a named function)";
}

std::string text_of_blocks(const ojson& content, const char* key) {
  if (content.is_string()) return content.get<std::string>();
  std::string out;
  if (!content.is_array()) return out;
  for (const auto& b : content) {
    if (b.is_string()) {
      out += (out.empty() ? "" : "\n\n") + b.get<std::string>();
      continue;
    }
    if (!b.is_object() || !b.contains(key) || !b[key].is_string()) continue;
    out += (out.empty() ? "" : "\n\n") + b[key].get<std::string>();
  }
  return out;
}

// Anthropic messages -> OpenAI-style messages (spec/15 §9.3).
Result<ojson> anthropic_messages(const ojson& b) {
  ojson msgs = ojson::array();
  if (b.contains("system") && !b["system"].is_null()) {
    const ojson& s = b["system"];
    if (!s.is_string() && !s.is_array()) return type_error("system", "a string or a list of text blocks");
    const std::string text = text_of_blocks(s, "text");
    if (!text.empty()) msgs.push_back({{"role", "system"}, {"content", text}});
  }
  if (!b.contains("messages") || !b["messages"].is_array()) return FB_ERROR(kInvalidArgument) << "'messages' must be a list";
  for (size_t i = 0; i < b["messages"].size(); ++i) {
    const ojson& m = b["messages"][i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return FB_ERROR(kInvalidArgument) << "messages[" << i << "] needs a string role";
    const std::string role = m["role"].get<std::string>();
    if (role != "user" && role != "assistant") return FB_ERROR(kInvalidArgument) << "messages[" << i << "].role must be user or assistant";
    if (!m.contains("content")) return FB_ERROR(kInvalidArgument) << "messages[" << i << "] needs content";
    const ojson& c = m["content"];
    if (c.is_string()) {
      msgs.push_back({{"role", role}, {"content", c}});
      continue;
    }
    if (!c.is_array()) return FB_ERROR(kInvalidArgument) << "messages[" << i << "].content must be a string or a list of blocks";
    if (role == "user") {
      std::string text;
      // With an image the message keeps its blocks in order (text and image parts, joined with
      // "\n\n" by the encoder, spec/15 §6.3 step 1); without, the texts are joined here.
      ojson parts = ojson::array();
      bool has_image = false;
      for (const auto& blk : c) {
        if (!blk.is_object() || !blk.contains("type") || !blk["type"].is_string())
          return FB_ERROR(kInvalidArgument) << "messages[" << i << "].content blocks need a type";
        const std::string ty = blk["type"].get<std::string>();
        if (ty == "text") {
          if (!blk.contains("text") || !blk["text"].is_string()) return FB_ERROR(kInvalidArgument) << "text blocks need a string 'text'";
          text += (text.empty() ? "" : "\n\n") + blk["text"].get<std::string>();
          parts.push_back({{"type", "text"}, {"text", blk["text"]}});
        } else if (ty == "tool_result") {
          const ojson rc = blk.contains("content") ? blk["content"] : ojson("");
          const bool rc_image = rc.is_array() && std::any_of(rc.begin(), rc.end(), [](const ojson& x) {
            return x.is_object() && x.value("type", "") == "image";
          });
          if (rc_image) {  // text and image parts stay in order inside the tool result
            ojson rparts = ojson::array();
            if (blk.value("is_error", false)) rparts.push_back({{"type", "text"}, {"text", "Error: "}});
            for (const auto& x : rc)
              if (x.is_object() && (x.value("type", "") == "image" || x.value("type", "") == "text")) rparts.push_back(x);
            msgs.push_back({{"role", "tool"}, {"tool_call_id", blk.value("tool_use_id", "")}, {"content", rparts}});
            continue;
          }
          std::string content = text_of_blocks(rc, "text");
          if (blk.value("is_error", false)) content = "Error: " + content;
          msgs.push_back({{"role", "tool"}, {"tool_call_id", blk.value("tool_use_id", "")}, {"content", content}});
        } else if (ty == "image") {
          has_image = true;
          parts.push_back(blk);
        }
      }
      if (has_image) msgs.push_back({{"role", "user"}, {"content", parts}});
      else if (!text.empty()) msgs.push_back({{"role", "user"}, {"content", text}});
    } else {
      ojson a = {{"role", "assistant"}, {"content", ""}};
      std::string text, thinking;
      ojson calls = ojson::array();
      for (const auto& blk : c) {
        if (!blk.is_object() || !blk.contains("type") || !blk["type"].is_string())
          return FB_ERROR(kInvalidArgument) << "messages[" << i << "].content blocks need a type";
        const std::string ty = blk["type"].get<std::string>();
        if (ty == "text" && blk.contains("text") && blk["text"].is_string()) text += blk["text"].get<std::string>();
        if (ty == "thinking" && blk.contains("thinking") && blk["thinking"].is_string()) thinking += blk["thinking"].get<std::string>();
        if (ty == "tool_use") {
          if (!blk.contains("name") || !blk["name"].is_string()) return FB_ERROR(kInvalidArgument) << "tool_use blocks need a name";
          calls.push_back({{"id", blk.value("id", "")}, {"type", "function"},
                           {"function", {{"name", blk["name"]}, {"arguments", blk.contains("input") ? blk["input"] : ojson::object()}}}});
        }
      }
      a["content"] = text;
      if (!thinking.empty()) a["reasoning_content"] = thinking;
      if (!calls.empty()) a["tool_calls"] = calls;
      msgs.push_back(a);
    }
  }
  return msgs;
}

// Responses `input` + `instructions` -> OpenAI-style messages (spec/15 §9.2).
Result<ojson> responses_messages(const ojson& b) {
  ojson msgs = ojson::array();
  std::string instructions;
  FB_RETURN_IF_ERROR(opt_string(b, "instructions", &instructions));
  if (!instructions.empty()) msgs.push_back({{"role", "system"}, {"content", instructions}});
  if (!b.contains("input")) return FB_ERROR(kInvalidArgument) << "'input' is required";
  const ojson& in = b["input"];
  if (in.is_string()) {
    msgs.push_back({{"role", "user"}, {"content", in}});
    return msgs;
  }
  if (!in.is_array()) return type_error("input", "a string or a list of items");
  std::string pending_reasoning;
  for (size_t i = 0; i < in.size(); ++i) {
    const ojson& it = in[i];
    if (!it.is_object()) return FB_ERROR(kInvalidArgument) << "input[" << i << "] must be an object";
    const std::string ty = it.contains("type") && it["type"].is_string() ? it["type"].get<std::string>() : "message";
    if (ty == "message") {
      if (!it.contains("role") || !it["role"].is_string()) return FB_ERROR(kInvalidArgument) << "input[" << i << "] needs a string role";
      std::string role = it["role"].get<std::string>();
      if (role == "developer") role = "system";
      const ojson& c = it.contains("content") ? it["content"] : ojson("");
      if (!c.is_string() && !c.is_array()) return FB_ERROR(kInvalidArgument) << "input[" << i << "].content must be a string or a list";
      ojson m = {{"role", role}, {"content", text_of_blocks(c, "text")}};
      if (c.is_array() && std::any_of(c.begin(), c.end(), [](const ojson& x) { return x.is_object() && x.value("type", "") == "input_image"; })) {
        ojson parts = ojson::array();  // text and images in order (spec/15 §6.3 step 1)
        for (const auto& x : c) {
          if (!x.is_object()) continue;
          if (x.value("type", "") == "input_image") {
            parts.push_back({{"type", "image_url"}, {"image_url", x.contains("image_url") ? x["image_url"] : ojson("")}});
          } else if (x.contains("text") && x["text"].is_string()) {
            parts.push_back({{"type", "text"}, {"text", x["text"]}});
          }
        }
        m["content"] = parts;
      }
      if (role == "assistant" && !pending_reasoning.empty()) m["reasoning_content"] = std::exchange(pending_reasoning, "");
      msgs.push_back(m);
    } else if (ty == "function_call") {
      if (!it.contains("name") || !it["name"].is_string()) return FB_ERROR(kInvalidArgument) << "input[" << i << "] needs a name";
      ojson call = {{"id", it.value("call_id", "")}, {"type", "function"},
                    {"function", {{"name", it["name"]}, {"arguments", it.contains("arguments") ? it["arguments"] : ojson("{}")}}}};
      if (msgs.empty() || msgs.back()["role"] != "assistant" || msgs.back().contains("tool_calls") == false) {
        if (!msgs.empty() && msgs.back()["role"] == "assistant" && !msgs.back().contains("tool_calls")) {
          msgs.back()["tool_calls"] = ojson::array();
        } else {
          ojson a = {{"role", "assistant"}, {"content", ""}, {"tool_calls", ojson::array()}};
          if (!pending_reasoning.empty()) a["reasoning_content"] = std::exchange(pending_reasoning, "");
          msgs.push_back(a);
        }
      }
      msgs.back()["tool_calls"].push_back(call);
    } else if (ty == "function_call_output") {
      const ojson& out = it.contains("output") ? it["output"] : ojson("");
      msgs.push_back({{"role", "tool"}, {"tool_call_id", it.value("call_id", "")}, {"content", text_of_blocks(out, "text")}});
    } else if (ty == "reasoning") {
      std::string r;
      for (const char* key : {"content", "summary"})
        if (it.contains(key)) r += text_of_blocks(it[key], "text");
      pending_reasoning += r;
    } else {
      return FB_ERROR(kUnsupported) << "input item type '" << ty << "' is not supported";
    }
  }
  return msgs;
}

// The answer's format: Chat `response_format` {"type": "text" | "json_object" | "json_schema",
// json_schema: {name, description, schema, strict}}, or Responses `text.format` with the same
// fields flat ({"type": "json_schema", "name", "schema", "strict"}). Type-checked here and compiled
// by request_constraint (alone, or with the tools under tool_choice auto). The schema is also
// rendered into the prompt (spec/15 §6.4; parse_request).
struct AnswerFormat {
  bool on = false;
  bool object = false;  // json_object: any object
  ojson schema;         // json_schema
  bool strict = false;
  std::string field = "response_format";  // as the request named it, for the 400s
};

// Anthropic Messages: `output_config.format` {"type": "json_schema", "schema"} (the Messages API's
// structured outputs; the beta's top-level `output_format` is read too). Completions: `response_format`
// as in Chat (vLLM's extension of the legacy API; no prompt template, so the value starts at once).
const ojson* answer_format_json(const ojson& b, Endpoint ep) {
  if ((ep == Endpoint::kChat || ep == Endpoint::kCompletions) && b.contains("response_format") && !b["response_format"].is_null())
    return &b["response_format"];
  if (ep == Endpoint::kResponses && b.contains("text") && b["text"].is_object() && b["text"].contains("format") && !b["text"]["format"].is_null())
    return &b["text"]["format"];
  if (ep == Endpoint::kMessages) {
    if (b.contains("output_config") && b["output_config"].is_object() && b["output_config"].contains("format") &&
        !b["output_config"]["format"].is_null())
      return &b["output_config"]["format"];
    if (b.contains("output_format") && !b["output_format"].is_null()) return &b["output_format"];
  }
  return nullptr;
}

// Where a format's json_schema fields sit: flat in the format object (Responses, Anthropic) or under
// its `json_schema` (Chat, Completions).
bool flat_format(Endpoint ep) { return ep == Endpoint::kResponses || ep == Endpoint::kMessages; }

std::string format_field(const ojson& b, Endpoint ep) {
  if (ep == Endpoint::kResponses) return "text.format";
  if (ep == Endpoint::kMessages) return b.contains("output_config") && b["output_config"].is_object() && b["output_config"].contains("format")
                                            ? "output_config.format"
                                            : "output_format";
  return "response_format";
}

// The schema object a json_schema format carries (null: none), for the prompt.
ojson answer_schema(const ojson& rf, Endpoint ep) {
  const ojson* js = flat_format(ep) ? &rf : rf.contains("json_schema") ? &rf["json_schema"] : nullptr;
  if (!rf.is_object() || rf.value("type", "") != "json_schema" || !js || !js->is_object() || !js->contains("schema")) return ojson();
  return (*js)["schema"];
}

Status parse_response_format(const ojson& b, Endpoint ep, const ParseContext& ctx, AnswerFormat* f) {
  const ojson* p = answer_format_json(b, ep);
  if (!p) return Status();
  const ojson& rf = *p;
  const bool flat = flat_format(ep);
  const std::string field = format_field(b, ep);
  const bool anthropic = ep == Endpoint::kMessages;  // json_schema only, always strict
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    return type_error(field.c_str(), anthropic ? "an object {\"type\": \"json_schema\", \"schema\": {...}}" : "an object with 'type' text, json_object or json_schema");
  const std::string type = rf["type"].get<std::string>();
  if (anthropic && type != "json_schema")
    return FB_ERROR(kInvalidArgument) << "'" << field << ".type' must be json_schema (got \"" << type << "\")";
  if (anthropic && (!rf.contains("schema") || !rf["schema"].is_object()))
    return type_error((field + ".schema").c_str(), "a JSON schema object");
  if (type == "text") return Status();
  if (type != "json_object" && type != "json_schema")
    return FB_ERROR(kInvalidArgument) << "'" << field << ".type' must be text, json_object or json_schema (got \"" << type << "\")";
#if FB_SERVER_HAS_GRAMMAR
  if (!ctx.grammar) return FB_ERROR(kUnsupported) << field << " " << type << " needs the grammar engine, which this server has not loaded";
#else
  (void)ctx;
  return FB_ERROR(kUnsupported) << field << " " << type << " needs the grammar engine: this build has none (tools/setup.sh fetches xgrammar)";
#endif
  f->on = true;
  f->object = type == "json_object";
  f->field = field;
  if (type == "json_schema") {
    if (!flat && (!rf.contains("json_schema") || !rf["json_schema"].is_object())) return type_error("response_format.json_schema", "an object");
    const ojson& js = flat ? rf : rf["json_schema"];
    f->schema = js.contains("schema") && !js["schema"].is_null() ? js["schema"] : ojson::object();
    if (js.contains("strict") && !js["strict"].is_null()) {
      if (!js["strict"].is_boolean()) return type_error((field + (flat ? ".strict" : ".json_schema.strict")).c_str(), "a boolean");
      f->strict = js["strict"].get<bool>();
    }
    // Anthropic's structured outputs always hold to the schema, members beyond `properties` included.
    if (anthropic) f->strict = true;
  }
  return Status();
}

// The request's token constraint (issue 27), null when there is nothing to enforce:
// - tool_choice required / named: the answer is a calls block in the model's own DSML syntax
//   (grammar::ToolCallFormat); a response_format then has no text to shape and is not applied.
// - tool_choice auto with tools: strict tools' arguments are constrained once a calls block opens;
//   with a response_format the answer is that JSON value or one calls block.
// - no tools (or tool_choice none): the response_format alone.
Status request_constraint(const ToolChoice& tc, const ojson& tools, const std::vector<bool>& strict, bool parallel, const AnswerFormat& answer,
                          const ParseContext& ctx, bool thinking, engine::SamplingParams* s) {
  const bool any_strict = std::find(strict.begin(), strict.end(), true) != strict.end();
  const bool forced = tc.mode == ToolChoice::Mode::kRequired || tc.mode == ToolChoice::Mode::kNamed;
  const bool have_tools = tc.mode != ToolChoice::Mode::kNone && tools.is_array() && !tools.empty();
  if (!tc.allowed.empty() && !have_tools)
    return FB_ERROR(kInvalidArgument) << "'tool_choice' allowed_tools names functions but the request has no function tools";
  if (forced && !have_tools)
    return FB_ERROR(kInvalidArgument) << "'tool_choice' " << (tc.mode == ToolChoice::Mode::kNamed ? "names function '" + tc.name + "'" : "is required")
                                      << " but the request has no function tools";
  std::string names;  // the request's tools, for the 400s
  if (have_tools)
    for (const auto& t : tools) names += (names.empty() ? "" : ", ") + t["name"].get<std::string>();
  const auto in_tools = [&](const std::string& n) {
    return std::any_of(tools.begin(), tools.end(), [&](const ojson& t) { return t["name"] == n; });
  };
  if (tc.mode == ToolChoice::Mode::kNamed && !in_tools(tc.name))
    return FB_ERROR(kInvalidArgument) << "'tool_choice' names function '" << tc.name << "', which is not in 'tools' (" << names << ")";
  for (size_t i = 0; i < tc.allowed.size(); ++i)
    if (!in_tools(tc.allowed[i]))
      return FB_ERROR(kInvalidArgument) << "'" << tc.allowed_field << "' names function '" << tc.allowed[i] << "', which is not in 'tools' (" << names
                                        << ")";
  // allowed_tools: the calls may name only the listed functions (a grammar over that subset; the
  // prompt keeps every tool). Listing every tool restricts nothing.
  const bool restrict_names = !tc.allowed.empty() && tc.allowed.size() < tools.size();
  const auto allowed = [&](const ojson& t) {
    return tc.allowed.empty() || std::find(tc.allowed.begin(), tc.allowed.end(), t["name"].get<std::string>()) != tc.allowed.end();
  };
  const bool tool_grammar = have_tools && (forced || any_strict || answer.on || restrict_names);
  if (!tool_grammar && !answer.on) return Status();
#if FB_SERVER_HAS_GRAMMAR
  if (!ctx.grammar)
    return FB_ERROR(kUnsupported) << (forced ? "tool_choice required or a named tool" : restrict_names ? "tool_choice allowed_tools" : "strict function tools")
                                  << " need the grammar engine, which this server has not loaded";
  std::optional<grammar::ResponseFormat> rf;
  if (answer.on) {
    rf.emplace();
    rf->kind = answer.object ? grammar::ResponseFormat::Kind::kJsonObject : grammar::ResponseFormat::Kind::kJsonSchema;
    rf->schema = answer.schema;
    rf->strict = answer.strict;
    rf->after_reasoning = thinking;
  }
  Result<std::shared_ptr<engine::TokenConstraint>> c = std::shared_ptr<engine::TokenConstraint>();
  if (!tool_grammar) {
    c = ctx.grammar->compile(*rf);
  } else {
    grammar::ToolCallFormat f;
    f.choice = tc.mode == ToolChoice::Mode::kNamed      ? grammar::ToolCallFormat::Choice::kNamed
               : tc.mode == ToolChoice::Mode::kRequired ? grammar::ToolCallFormat::Choice::kRequired
                                                        : grammar::ToolCallFormat::Choice::kAuto;
    f.name = tc.name;
    f.parallel = parallel;
    f.after_reasoning = thinking;
    f.restrict_names = restrict_names;
    if (!forced) f.answer = rf;
    for (size_t i = 0; i < tools.size(); ++i) {
      const ojson& t = tools[i];
      if (!allowed(t)) continue;
      f.tools.push_back({t["name"].get<std::string>(), t.contains("parameters") ? t["parameters"] : ojson(), i < strict.size() && strict[i]});
    }
    c = ctx.grammar->compile(f);
  }
  if (!c.ok()) {
    // The grammar's 400s call the answer's schema "response_format"; name the field this API used.
    const std::string& m = c.status().message();
    const std::string rf_name = "response_format schema";
    if (answer.on && answer.field != "response_format" && m.rfind(rf_name, 0) == 0)
      return FB_ERROR(kInvalidArgument) << answer.field << " schema" << m.substr(rf_name.size());
    return c.status();
  }
  s->constraint = std::move(c).value();
  return Status();
#else
  (void)parallel, (void)ctx, (void)thinking, (void)s;
  (void)allowed;
  return FB_ERROR(kUnsupported) << (forced ? "tool_choice required or a named tool" : restrict_names ? "tool_choice allowed_tools" : "strict function tools")
                                << " need the grammar engine: this build has none (tools/setup.sh fetches xgrammar)";
#endif
}

}  // namespace

Result<ParsedRequest> parse_request(Endpoint ep, const ojson& b, const ParseContext& ctx) {
  if (!b.is_object()) return FB_ERROR(kInvalidArgument) << "the request body must be a JSON object";
  ParsedRequest pr;
  pr.endpoint = ep;
  FB_RETURN_IF_ERROR(opt_string(b, "model", &pr.model));
  FB_RETURN_IF_ERROR(parse_sampling(b, ep, &pr));
  {  // phrase bias (issue 27): the server's list, then the request's
    std::vector<engine::PhraseBias> mine;
    if (b.contains("phrase_bias") && !b["phrase_bias"].is_null()) mine = FB_TRY(parse_phrase_bias(b["phrase_bias"], *ctx.tok, "'phrase_bias'"));
    pr.req.sampling.phrase_bias = merge_phrase_bias(ctx.phrase_bias ? *ctx.phrase_bias : std::vector<engine::PhraseBias>(), std::move(mine));
  }
  Thinking th;
  std::string text;
  std::vector<ojson> image_parts;
  ToolChoice tool_choice;
  ojson tools;  // function objects as rendered into the prompt
  std::vector<bool> tool_strict;
  if (ep == Endpoint::kCompletions) {
    th.on = false;
    if (!b.contains("prompt")) return FB_ERROR(kInvalidArgument) << "'prompt' is required";
    const ojson& p = b["prompt"];
    if (p.is_string()) {
      text = p.get<std::string>();
      pr.req.prompt = ctx.tok->encode(text);
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      text = p[0].get<std::string>();
      pr.req.prompt = ctx.tok->encode(text);
    } else if (p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), [](const ojson& x) { return x.is_number_integer(); })) {
      for (const auto& x : p) pr.req.prompt.push_back(int32_t(std::clamp<int64_t>(x.get<int64_t>(), -1, INT32_MAX)));
    } else {
      return type_error("prompt", "a string, a list of one string, or a list of token ids");
    }
  } else {
    FB_RETURN_IF_ERROR(parse_thinking(b, pr.model, &th));
    if (ep == Endpoint::kResponses && b.contains("reasoning") && b["reasoning"].is_object() && b["reasoning"].contains("effort") &&
        !b["reasoning"]["effort"].is_null())
      FB_RETURN_IF_ERROR(apply_effort(b["reasoning"]["effort"], &th, "reasoning.effort"));
    if (ep == Endpoint::kMessages && b.contains("output_config") && b["output_config"].is_object() &&
        b["output_config"].contains("effort") && !b["output_config"]["effort"].is_null())
      FB_RETURN_IF_ERROR(apply_effort(b["output_config"]["effort"], &th, "output_config.effort"));
    ojson msgs;
    if (ep == Endpoint::kChat) {
      if (!b.contains("messages") || !b["messages"].is_array()) return FB_ERROR(kInvalidArgument) << "'messages' must be a list";
      msgs = b["messages"];
    } else if (ep == Endpoint::kMessages) {
      msgs = FB_TRY(anthropic_messages(b));
    } else {
      msgs = FB_TRY(responses_messages(b));
    }
    if (msgs.empty()) return FB_ERROR(kInvalidArgument) << "no messages";
    image_parts = engine::collect_image_parts(msgs);
    if (!image_parts.empty() && !ctx.images.vision)
      return FB_ERROR(kInvalidArgument) << "model has no vision tower: image input is not available";
    std::vector<tokenizer::Message> messages = FB_TRY(tokenizer::messages_from_json(msgs));
    // Request-level tools and response_format go on the first system message (spec/15 §6.4).
    tool_choice = FB_TRY(parse_tool_choice(b));
    if (tool_choice.no_parallel) pr.parallel_tool_calls = false;
    if (b.contains("tools") && !b["tools"].is_null()) {
      tools = FB_TRY(function_tools(b["tools"], ep == Endpoint::kMessages, &tool_strict));
      if (tool_choice.mode == ToolChoice::Mode::kNone) tools = ojson();
    }
    ojson response_format;
    if (const ojson* rf = answer_format_json(b, ep)) response_format = answer_schema(*rf, ep);
    if ((tools.is_array() && !tools.empty()) || !response_format.is_null()) {
      if (messages.empty() || (messages[0].role != "system" && messages[0].role != "developer")) {
        tokenizer::Message sys;
        sys.role = "system";
        sys.content = "";
        messages.insert(messages.begin(), sys);
      }
      if (tools.is_array() && !tools.empty()) messages[0].tools = tools;
      if (!response_format.is_null()) messages[0].response_format = response_format;
    }
    tokenizer::PromptOptions po;
    po.mode = th.on ? tokenizer::ThinkingMode::kThinking : tokenizer::ThinkingMode::kChat;
    po.reasoning_effort = th.effort;
    po.tools_template = ctx.tools_template;
    const bool ends_with_user = messages.back().role != "assistant";
    auto rendered = FB_TRY(tokenizer::render_prompt(std::move(messages), po));
    if (rendered.n_images != int(image_parts.size()))
      return FB_ERROR(kInvalidArgument) << "found " << image_parts.size() << " images but the prompt has " << rendered.n_images << " placeholders";
    text = std::move(rendered.text);
    pr.req.prompt = ctx.tok->encode(text);
    FB_RETURN_IF_ERROR(engine::expand_images(image_parts, ctx.images, ctx.image_token_id, &pr.req));
    if (!ends_with_user) th.on = false;  // continuing an assistant turn: no reasoning header was opened
  }
  pr.prompt_text = std::move(text);
  pr.req.thinking = th.on;
  if (ep == Endpoint::kResponses) {
    pr.echo["tool_choice"] = b.contains("tool_choice") && !b["tool_choice"].is_null() ? b["tool_choice"] : ojson("auto");
    pr.echo["tools"] = b.contains("tools") && b["tools"].is_array() ? b["tools"] : ojson::array();
    pr.echo["parallel_tool_calls"] = pr.parallel_tool_calls;
    pr.echo["temperature"] = pr.req.sampling.temperature;
    pr.echo["top_p"] = pr.req.sampling.top_p;
    pr.echo["max_output_tokens"] = pr.req.max_tokens > 0 ? ojson(pr.req.max_tokens) : ojson(nullptr);
    pr.echo["instructions"] = b.contains("instructions") && b["instructions"].is_string() ? b["instructions"] : ojson(nullptr);
    pr.echo["text"] = {{"format", answer_format_json(b, ep) ? *answer_format_json(b, ep) : ojson{{"type", "text"}}}};
  }
  AnswerFormat answer;
  FB_RETURN_IF_ERROR(parse_response_format(b, ep, ctx, &answer));
  // Completions: no tools (tool_choice stays auto, `tools` unread), the response_format alone.
  FB_RETURN_IF_ERROR(request_constraint(tool_choice, tools, tool_strict, pr.parallel_tool_calls, answer, ctx, th.on, &pr.req.sampling));
  for (const auto& [id, v] : pr.req.sampling.logit_bias)
    if (ctx.tok && id >= ctx.tok->vocab_size())
      return FB_ERROR(kInvalidArgument) << "'logit_bias' names token " << id << ", outside the vocabulary of " << ctx.tok->vocab_size();
  if (pr.req.prompt.empty()) return FB_ERROR(kInvalidArgument) << "the prompt is empty";
  const int64_t n = int64_t(pr.req.prompt.size());
  if (n >= ctx.max_context)
    return FB_ERROR(kResourceExhausted) << "this model's maximum context length is " << ctx.max_context << " tokens; the prompt has " << n
                                        << " tokens";
  const int64_t room = ctx.max_context - n;
  // An explicit limit beyond the context is the client's error (as the OpenAI API and vLLM answer):
  // 400 naming the numbers, never a run that cannot reach it. The default is clamped instead.
  if (pr.req.max_tokens > room)
    return FB_ERROR(kInvalidArgument) << "this model's maximum context length is " << ctx.max_context << " tokens; the prompt has " << n
                                      << " tokens, so at most " << room << " can be generated, but max_tokens asks for " << pr.req.max_tokens;
  const int64_t dflt = th.on ? 65536 : 8192;  // spec/16 §1 (deepseek-recipe defaults)
  pr.req.max_tokens = std::min(pr.req.max_tokens > 0 ? pr.req.max_tokens : dflt, room);
  return pr;
}

}  // namespace fb::server
