#include "tokenizer/prompt_encoder.h"

#include <algorithm>
#include <charconv>

#include "tokenizer/python_json.h"

namespace fb::tokenizer {

namespace {

using json = nlohmann::ordered_json;

// Our own wording of the Tools-block instructions (spec/15 §6.2 layout; the official sentences
// are read from the user's snapshot when available and passed as PromptOptions::tools_template).
constexpr std::string_view kOwnToolsTemplate =
    "## Tools\n"
    "\n"
    "You can use the tools below. To call tools, write one \"<｜DSML｜ calls>\" block laid out like this example:\n"
    "\n"
    "<｜DSML｜ calls>\n"
    "<｜DSML｜ invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜ parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜ parameter>\n"
    "...\n"
    "</｜DSML｜ invoke>\n"
    "<｜DSML｜ invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</｜DSML｜ invoke>\n"
    "</｜DSML｜ calls>\n"
    "\n"
    "Give string parameters as raw text with string=\"true\". Give numbers, booleans, arrays and objects as "
    "JSON with string=\"false\".\n"
    "\n"
    "In thinking mode (the reply starts with <think>), do all of your reasoning inside <think>...</think> "
    "before any tool call or final answer.\n"
    "\n"
    "Otherwise, write tool calls or the final answer right after </think>.\n"
    "\n"
    "### Available Tool Schemas\n"
    "\n"
    "{tool_schemas}\n"
    "\n"
    "Use only the tool names defined above and follow their parameter schemas exactly.\n";

constexpr std::string_view kResponseFormatHeader =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

bool is_user_like(const std::vector<Message>& msgs, size_t i) {
  return msgs[i].role == "user" || (msgs[i].role == "system" && i > 0);
}

Result<std::string> task_token(const std::string& task) {
  static const std::pair<const char*, const char*> kTasks[] = {
      {"action", "<｜action｜>"}, {"query", "<｜query｜>"},  {"authority", "<｜authority｜>"},
      {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"}, {"read_url", "<｜read_url｜>"}};
  for (const auto& [name, tok] : kTasks)
    if (task == name) return std::string(tok);
  return FB_ERROR(kInvalidArgument) << "unknown task '" << task << "'";
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

// Arguments -> an object (spec/15 §8.1): parse JSON strings up to twice, else wrap.
json arguments_object(const json& args) {
  json v = args;
  for (int k = 0; k < 2 && v.is_string(); ++k) {
    json p = json::parse(v.get_ref<const std::string&>(), nullptr, /*allow_exceptions=*/false);
    if (p.is_discarded()) break;
    v = std::move(p);
  }
  if (v.is_object()) return v;
  json wrapped = json::object();
  wrapped["arguments"] = args;
  return wrapped;
}

std::string tool_result_text(const json& content) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return "";
  if (!content.is_array()) return python_json_dumps(content);
  std::vector<std::string> parts;
  for (const auto& p : content) {
    const std::string type = p.is_object() ? p.value("type", "") : "";
    if (type == "text") {
      parts.push_back(p.value("text", ""));
    } else {
      parts.push_back("[Unsupported " + type + "]");
    }
  }
  return join(parts, "\n\n");
}

bool is_image_block(const std::string& type) { return type == "image_url" || type == "image"; }

// spec/15 §6.3 step 1: images become placeholder text blocks; literal placeholders are errors.
Status preprocess_images(std::vector<Message>* msgs, int* n_images) {
  for (Message& m : *msgs) {
    if (m.content && m.content->find(kImageTag) != std::string::npos)
      return FB_ERROR(kInvalidArgument) << "message text contains the image placeholder " << kImageTag;
    if (m.reasoning_content && m.reasoning_content->find(kImageTag) != std::string::npos)
      return FB_ERROR(kInvalidArgument) << "reasoning_content contains the image placeholder";
    if (m.content_blocks.empty()) continue;
    std::vector<std::string> texts;
    for (ContentBlock& b : m.content_blocks) {
      if (is_image_block(b.type)) {
        b = ContentBlock{"text", std::string(kImageTag), "", nullptr};
        ++*n_images;
      } else if (b.type == "text" && b.text.find(kImageTag) != std::string::npos) {
        return FB_ERROR(kInvalidArgument) << "text block contains the image placeholder";
      } else if (b.type == "tool_result" && b.content.is_array()) {
        for (auto& p : b.content) {
          if (p.is_object() && is_image_block(p.value("type", ""))) {
            p = json{{"type", "text"}, {"text", std::string(kImageTag)}};
            ++*n_images;
          }
        }
      }
      if (b.type == "text") texts.push_back(b.text);
    }
    if (!m.content) m.content = join(texts, "\n\n");
  }
  return {};
}

// spec/15 §6.3 steps 2-3: tool messages become tool_result blocks of a user message; results
// are ordered like the calls of the preceding assistant message.
std::vector<Message> merge_tool_messages(std::vector<Message> in) {
  std::vector<Message> out;
  for (Message& m : in) {
    if (m.role == "tool") {
      ContentBlock b{"tool_result", "", m.tool_call_id, m.content ? json(*m.content) : json(nullptr)};
      if (!m.content_blocks.empty()) {
        json parts = json::array();
        for (const auto& cb : m.content_blocks)
          parts.push_back(cb.type == "text" ? json{{"type", "text"}, {"text", cb.text}} : json{{"type", cb.type}});
        b.content = parts;
      }
      if (!out.empty() && out.back().role == "user" && !out.back().content_blocks.empty()) {
        out.back().content_blocks.push_back(std::move(b));
      } else {
        Message u;
        u.role = "user";
        u.content_blocks.push_back(std::move(b));
        out.push_back(std::move(u));
      }
    } else if (m.role == "user") {
      if (m.content_blocks.empty()) m.content_blocks.push_back(ContentBlock{"text", m.content.value_or(""), "", nullptr});
      if (!out.empty() && out.back().role == "user" && !out.back().content_blocks.empty() && out.back().task.empty()) {
        for (auto& b : m.content_blocks) out.back().content_blocks.push_back(std::move(b));
        if (!m.task.empty()) out.back().task = m.task;
      } else {
        out.push_back(std::move(m));
      }
    } else {
      out.push_back(std::move(m));
    }
  }
  // Sort tool results by the position of their id in the last assistant's calls (stable).
  const std::vector<ToolCall>* last_calls = nullptr;
  for (Message& m : out) {
    if (m.role == "assistant" && !m.tool_calls.empty()) last_calls = &m.tool_calls;
    if (m.role != "user" || !last_calls) continue;
    std::vector<size_t> slots;
    for (size_t i = 0; i < m.content_blocks.size(); ++i)
      if (m.content_blocks[i].type == "tool_result") slots.push_back(i);
    if (slots.size() < 2) continue;
    auto order = [&](const ContentBlock& b) {
      for (size_t k = 0; k < last_calls->size(); ++k)
        if ((*last_calls)[k].id == b.tool_use_id) return k;
      return size_t(0);
    };
    std::vector<ContentBlock> results;
    for (size_t s : slots) results.push_back(m.content_blocks[s]);
    std::stable_sort(results.begin(), results.end(),
                     [&](const ContentBlock& a, const ContentBlock& b) { return order(a) < order(b); });
    for (size_t k = 0; k < slots.size(); ++k) m.content_blocks[slots[k]] = std::move(results[k]);
  }
  return out;
}

}  // namespace

std::string render_tools_block(const json& tools, const std::string& tools_template) {
  std::vector<std::string> schemas;
  for (const auto& t : tools) {
    const json& f = (t.is_object() && t.contains("function") && t["function"].is_object()) ? t["function"] : t;
    schemas.push_back(python_json_dumps(f));
  }
  std::string out(tools_template.empty() ? kOwnToolsTemplate : std::string_view(tools_template));
  const std::string placeholder = "{tool_schemas}";
  if (size_t p = out.find(placeholder); p != std::string::npos) out.replace(p, placeholder.size(), join(schemas, "\n"));
  return out;
}

std::string render_dsml_calls(const std::vector<ToolCall>& calls) {
  const std::string d(kDsml);
  std::vector<std::string> invokes;
  for (const ToolCall& c : calls) {
    std::vector<std::string> params;
    const json args = arguments_object(c.arguments);  // named: items() must not outlive it
    for (const auto& [k, v] : args.items()) {
      const bool is_string = v.is_string();
      params.push_back("<" + d + " parameter name=\"" + k + "\" string=\"" + (is_string ? "true" : "false") + "\">" +
                       (is_string ? v.get<std::string>() : python_json_dumps(v)) + "</" + d + " parameter>");
    }
    invokes.push_back("<" + d + " invoke name=\"" + c.name + "\">\n" + join(params, "\n") + "\n</" + d + " invoke>");
  }
  return "\n\n<" + d + " calls>\n" + join(invokes, "\n") + "\n</" + d + " calls>";
}

Result<int> parse_reasoning_effort(std::string_view s) {
  if (s == "low") return 50;
  if (s == "high") return 75;
  if (s == "max") return 100;
  int v = 0;
  auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (r.ec == std::errc() && r.ptr == s.data() + s.size() && v >= 1 && v <= 100) return v;
  return FB_ERROR(kInvalidArgument) << "reasoning effort must be low, high, max or an integer 1..100, got '" << s << "'";
}

Result<std::optional<int>> effort_from_api_name(std::string_view s) {
  if (s == "none") return std::optional<int>();
  if (s == "minimal" || s == "low") return std::optional<int>(50);
  if (s == "medium" || s == "high" || s == "xhigh") return std::optional<int>(75);
  if (s == "max" || s == "ultra") return std::optional<int>(100);
  const int v = FB_TRY(parse_reasoning_effort(s));
  return std::optional<int>(v);
}

Result<RenderedPrompt> render_prompt(std::vector<Message> msgs, const PromptOptions& opt) {
  const bool thinking = opt.mode == ThinkingMode::kThinking;
  if (thinking && (opt.reasoning_effort < 1 || opt.reasoning_effort > 100))
    return FB_ERROR(kInvalidArgument) << "reasoning effort " << opt.reasoning_effort << " is outside 1..100";
  RenderedPrompt rp;
  for (Message& m : msgs) {
    if (m.role == "developer") m.role = "system";
    static const char* kRoles[] = {"system", "user", "assistant", "tool", "latest_reminder"};
    if (std::find_if(std::begin(kRoles), std::end(kRoles), [&](const char* r) { return m.role == r; }) == std::end(kRoles))
      return FB_ERROR(kInvalidArgument) << "unknown message role '" << m.role << "'";
    if (!m.task.empty()) FB_TRY(task_token(m.task));
  }
  FB_RETURN_IF_ERROR(preprocess_images(&msgs, &rp.n_images));
  msgs = merge_tool_messages(std::move(msgs));

  bool drop_thinking = opt.drop_thinking;
  for (const Message& m : msgs)
    if (m.tools.is_array() && !m.tools.empty()) drop_thinking = false;
  auto last_user_like = [&] {
    size_t l = 0;
    bool found = false;
    for (size_t i = 0; i < msgs.size(); ++i)
      if (is_user_like(msgs, i)) l = i, found = true;
    return found ? int64_t(l) : int64_t(-1);
  };
  if (thinking && drop_thinking) {
    const int64_t l = last_user_like();
    for (size_t i = 0; int64_t(i) < l; ++i)
      if (msgs[i].role == "assistant") msgs[i].reasoning_content.reset();
  }
  const int64_t last = last_user_like();

  std::string out = opt.add_bos ? std::string(kBos) : std::string();
  const std::string effort =
      thinking ? "Reasoning Effort: " + std::to_string(opt.reasoning_effort) +
                     " (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
               : "";
  for (size_t i = 0; i < msgs.size(); ++i) {
    const Message& m = msgs[i];
    const std::string eff = (i == 0 && thinking) ? effort : "";
    if (i == 0 && (!eff.empty() || m.role == "system")) out += kSystemTag;
    out += eff;
    if (m.role == "system") {
      if (i > 0) out += kSystemTag;
      out += m.content.value_or("");
      if (m.tools.is_array() && !m.tools.empty()) out += "\n\n" + render_tools_block(m.tools, opt.tools_template);
      if (!m.response_format.is_null())
        out += "\n\n" + std::string(kResponseFormatHeader) + python_json_dumps(m.response_format);
    } else if (m.role == "user") {
      out += kUserTag;
      if (!m.content_blocks.empty()) {
        std::vector<std::string> parts;
        for (const ContentBlock& b : m.content_blocks) {
          if (b.type == "text") {
            parts.push_back(b.text);
          } else if (b.type == "tool_result") {
            parts.push_back("<tool_result>" + tool_result_text(b.content) + "</tool_result>");
          } else {
            parts.push_back("[Unsupported " + b.type + "]");
          }
        }
        out += join(parts, "\n\n");
      } else {
        out += m.content.value_or("");
      }
    } else if (m.role == "latest_reminder") {
      out += std::string(kLatestReminderTag) + m.content.value_or("");
    } else if (m.role == "assistant") {
      std::string think;
      if (thinking && !(i > 0 && !msgs[i - 1].task.empty())) {
        if (!drop_thinking || int64_t(i) > last) think = m.reasoning_content.value_or("") + std::string(kThinkEnd);
      }
      const std::string calls = m.tool_calls.empty() ? "" : render_dsml_calls(m.tool_calls);
      out += think + m.content.value_or("") + calls + (m.wo_eos ? "" : std::string(kEos));
    }
    // Transition to the next turn.
    if (i + 1 < msgs.size() && msgs[i + 1].role != "assistant" && msgs[i + 1].role != "latest_reminder") continue;
    if (!m.task.empty()) {
      if (m.task == "action") {
        out += std::string(kAssistantTag) + std::string(thinking ? kThinkBegin : kThinkEnd) + "<｜action｜>";
      } else {
        out += FB_TRY(task_token(m.task));
      }
    } else if (m.role == "user" || (m.role == "system" && i > 0)) {
      out += kAssistantTag;
      out += (thinking && (!drop_thinking || int64_t(i) >= last)) ? kThinkBegin : kThinkEnd;
    }
  }
  rp.text = std::move(out);
  return rp;
}

Result<std::vector<Message>> messages_from_json(const json& arr) {
  if (!arr.is_array()) return FB_ERROR(kInvalidArgument) << "messages must be a JSON array";
  std::vector<Message> msgs;
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& j = arr[i];
    if (!j.is_object() || !j.contains("role") || !j["role"].is_string())
      return FB_ERROR(kInvalidArgument) << "messages[" << i << "] needs a string role";
    Message m;
    m.role = j["role"].get<std::string>();
    if (j.contains("content")) {
      const json& c = j["content"];
      if (c.is_string()) {
        m.content = c.get<std::string>();
      } else if (c.is_array()) {
        for (const json& p : c) {
          if (!p.is_object()) return FB_ERROR(kInvalidArgument) << "messages[" << i << "].content parts must be objects";
          ContentBlock b;
          b.type = p.value("type", "");
          if (b.type == "text") b.text = p.value("text", "");
          if (b.type == "tool_result") {
            b.tool_use_id = p.value("tool_use_id", "");
            b.content = p.contains("content") ? p["content"] : json(nullptr);
          }
          m.content_blocks.push_back(std::move(b));
        }
      } else if (!c.is_null()) {
        return FB_ERROR(kInvalidArgument) << "messages[" << i << "].content must be a string or a list";
      }
    }
    for (const char* key : {"reasoning_content", "reasoning"})
      if (j.contains(key) && j[key].is_string() && !m.reasoning_content) m.reasoning_content = j[key].get<std::string>();
    if (j.contains("tool_calls") && j["tool_calls"].is_array()) {
      for (const json& tc : j["tool_calls"]) {
        const json& f = tc.contains("function") ? tc["function"] : tc;
        if (!f.is_object() || !f.contains("name") || !f["name"].is_string())
          return FB_ERROR(kInvalidArgument) << "messages[" << i << "].tool_calls entries need function.name";
        m.tool_calls.push_back(ToolCall{tc.value("id", ""), f["name"].get<std::string>(),
                                        f.contains("arguments") ? f["arguments"] : json::object()});
      }
    }
    m.tool_call_id = j.value("tool_call_id", "");
    if (j.contains("tools")) m.tools = j["tools"];
    if (j.contains("response_format")) m.response_format = j["response_format"];
    m.task = j.value("task", "");
    m.wo_eos = j.value("wo_eos", false);
    msgs.push_back(std::move(m));
  }
  return msgs;
}

}  // namespace fb::tokenizer
