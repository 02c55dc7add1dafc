// Prompt encoder for DeepSeek-V4.1 (spec/15 §6-§8): renders a message list into the exact prompt
// text the model was trained on (system/user/assistant/tool turns, thinking and chat modes with
// reasoning effort, tool definitions, DSML tool calls, tool results, history rules). Text only:
// tokenising the result is the Tokenizer's job. The Tools-block prose is our own wording unless
// the caller passes the official template read from the user's model snapshot.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace fb::tokenizer {

// Literal control strings of V4.1 (spec/15 §2, §6.1).
inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kThinkBegin = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kUserTag = "<｜User｜>";
inline constexpr std::string_view kAssistantTag = "<｜Assistant｜>";
inline constexpr std::string_view kSystemTag = "<｜System｜>";
inline constexpr std::string_view kLatestReminderTag = "<｜latest_reminder｜>";
inline constexpr std::string_view kImageTag = "<｜deepseek_image｜>";
inline constexpr std::string_view kDsml = "｜DSML｜";

enum class ThinkingMode { kChat, kThinking };

struct ToolCall {
  std::string id;
  std::string name;
  nlohmann::ordered_json arguments;  // an object, or a JSON string of one (OpenAI wire form)
};

struct ContentBlock {
  std::string type;                // "text", "tool_result", "image_url", "image", other
  std::string text;                // type text
  std::string tool_use_id;         // type tool_result
  nlohmann::ordered_json content;  // type tool_result: a string or a list of parts
};

struct Message {
  std::string role;  // system, developer (= system), user, assistant, tool, latest_reminder
  std::optional<std::string> content;
  std::vector<ContentBlock> content_blocks;
  std::optional<std::string> reasoning_content;
  std::vector<ToolCall> tool_calls;
  std::string tool_call_id;                 // role tool
  nlohmann::ordered_json tools;             // system: array of function objects (or null)
  nlohmann::ordered_json response_format;   // system: a schema (or null)
  std::string task;                         // internal task name (action, query, ...), usually empty
  bool wo_eos = false;                      // assistant prefill: no EOS after it
};

struct PromptOptions {
  ThinkingMode mode = ThinkingMode::kThinking;
  int reasoning_effort = 75;  // 1..100, thinking mode only (high = 75)
  bool drop_thinking = true;  // forced off when any message carries tools
  bool add_bos = true;        // false when continuing a context
  // Official Tools-block text with the placeholder "{tool_schemas}" (from the user's snapshot);
  // empty = our own wording of the same instructions (spec/15 §6.2).
  std::string tools_template;
};

struct RenderedPrompt {
  std::string text;
  int n_images = 0;  // image placeholders in prompt order
};

// Renders the prompt. Errors: unknown role or task, a literal image placeholder in text,
// effort out of range.
Result<RenderedPrompt> render_prompt(std::vector<Message> messages, const PromptOptions& options);

// Encoder effort names and integers: low=50, high=75, max=100, or "1".."100".
Result<int> parse_reasoning_effort(std::string_view name_or_int);
// Hosted-API effort names (DeepSeek's table, spec/15 §7): minimal/low -> 50, medium/high/xhigh ->
// 75, max/ultra -> 100, an integer 1..100 as is; "none" -> nullopt (chat mode).
Result<std::optional<int>> effort_from_api_name(std::string_view name);

// OpenAI-style message JSON -> messages (content strings or parts, reasoning_content or
// reasoning, tool_calls, tool_call_id, tools, response_format, task, wo_eos).
Result<std::vector<Message>> messages_from_json(const nlohmann::ordered_json& messages);

// DSML call block as written into history: "\n\n<｜DSML｜ calls>\n" ... "</｜DSML｜ calls>".
std::string render_dsml_calls(const std::vector<ToolCall>& calls);
// The Tools block for the system message (no leading "\n\n").
std::string render_tools_block(const nlohmann::ordered_json& tools, const std::string& tools_template);

}  // namespace fb::tokenizer
