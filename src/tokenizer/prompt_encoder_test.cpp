// Golden renderings of the prompt encoder (spec/15 §6.4-6.5, §8): every turn type and mode,
// tool definitions, DSML history, tool results, history rules; token ids of spec/15 §4.
#include "tokenizer/prompt_encoder.h"

#include <gtest/gtest.h>

#include "tokenizer/python_json.h"
#include "tokenizer/test_assets.h"

namespace fb::tokenizer {
namespace {

using json = nlohmann::ordered_json;
const std::string E = "Reasoning Effort: 75 (range 1-100, the higher the value, the more thorough the reasoning)\n\n";

std::string render(const char* messages_json, ThinkingMode mode, int effort = 75, bool drop = true) {
  auto msgs = messages_from_json(json::parse(messages_json));
  EXPECT_TRUE(msgs.ok()) << msgs.status().to_string();
  PromptOptions o;
  o.mode = mode;
  o.reasoning_effort = effort;
  o.drop_thinking = drop;
  auto r = render_prompt(*msgs, o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r->text : "";
}

TEST(PythonJson, MatchesJsonDumps) {
  const json v = json::parse(R"({"b": [1, 2.5, -0.0001, 1e-05, 1e16, 123.0, true, null], "a": "é\n\"\\/\u0001", "c": {}})");
  EXPECT_EQ(python_json_dumps(v),
            R"({"b": [1, 2.5, -0.0001, 1e-05, 1e+16, 123.0, true, null], "a": "é\n\"\\/\u0001", "c": {}})");
}

TEST(PromptEncoder, ThinkingAndChatQuickStart) {
  const char* m = R"([{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"What is 2+2?"}])";
  EXPECT_EQ(render(m, ThinkingMode::kThinking),
            "<｜begin▁of▁sentence｜><｜System｜>" + E + "You are a helpful assistant.<｜User｜>What is 2+2?<｜Assistant｜><think>");
  EXPECT_EQ(render(m, ThinkingMode::kChat),
            "<｜begin▁of▁sentence｜><｜System｜>You are a helpful assistant.<｜User｜>What is 2+2?<｜Assistant｜></think>");
  const Tokenizer& t = v41_tokenizer();
  EXPECT_EQ(t.encode(render(m, ThinkingMode::kThinking)).size(), 43u);
  EXPECT_EQ(t.encode(render(m, ThinkingMode::kChat)).size(), 18u);
}

TEST(PromptEncoder, EffortLevels) {
  const char* m = R"([{"role":"user","content":"Hi"}])";
  EXPECT_EQ(render(m, ThinkingMode::kThinking, 100),
            "<｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 100 (range 1-100, the higher the value, the more thorough "
            "the reasoning)\n\n<｜User｜>Hi<｜Assistant｜><think>");
  EXPECT_EQ(render(m, ThinkingMode::kChat), "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>");
  EXPECT_EQ(*parse_reasoning_effort("low"), 50);
  EXPECT_EQ(*parse_reasoning_effort("max"), 100);
  EXPECT_EQ(*parse_reasoning_effort("33"), 33);
  EXPECT_FALSE(parse_reasoning_effort("medium").ok());
  EXPECT_FALSE(parse_reasoning_effort("101").ok());
  EXPECT_EQ(**effort_from_api_name("xhigh"), 75);
  EXPECT_EQ(**effort_from_api_name("ultra"), 100);
  EXPECT_FALSE(effort_from_api_name("none")->has_value());
}

TEST(PromptEncoder, MultiTurnDropsOldReasoning) {
  const char* m = R"([{"role":"user","content":"Hi"},
    {"role":"assistant","content":"Hello!","reasoning_content":"greet back"},
    {"role":"user","content":"2+2?"}])";
  EXPECT_EQ(render(m, ThinkingMode::kThinking),
            "<｜begin▁of▁sentence｜><｜System｜>" + E +
                "<｜User｜>Hi<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜><｜User｜>2+2?<｜Assistant｜><think>");
  EXPECT_EQ(render(m, ThinkingMode::kThinking, 75, /*drop=*/false),
            "<｜begin▁of▁sentence｜><｜System｜>" + E +
                "<｜User｜>Hi<｜Assistant｜><think>greet back</think>Hello!<｜end▁of▁sentence｜><｜User｜>2+2?<｜Assistant｜><think>");
  EXPECT_EQ(render(m, ThinkingMode::kChat),
            "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>Hello!<｜end▁of▁sentence｜><｜User｜>2+2?<｜Assistant｜></think>");
}

TEST(PromptEncoder, ToolRoundTripKeepsReasoning) {
  const char* m = R"([{"role":"system","content":"You are a helpful assistant.","tools":[{"type":"function","function":
      {"name":"get_weather","description":"Weather now","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]},
    {"role":"user","content":"Weather in Paris?"},
    {"role":"assistant","content":"","reasoning_content":"R1","tool_calls":[{"id":"c1","type":"function",
      "function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
    {"role":"tool","tool_call_id":"c1","content":"{\"temp_c\": 18}"}])";
  const std::string p = render(m, ThinkingMode::kThinking);
  const std::string schema =
      R"({"name": "get_weather", "description": "Weather now", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}})";
  const std::string tools = render_tools_block(json::parse(R"([{"name":"get_weather","description":"Weather now",
      "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}])"), "");
  EXPECT_NE(tools.find("\n### Available Tool Schemas\n\n" + schema + "\n\n"), std::string::npos);
  EXPECT_EQ(tools.rfind("## Tools\n\n", 0), 0u);
  EXPECT_EQ(tools.back(), '\n');
  EXPECT_EQ(p, "<｜begin▁of▁sentence｜><｜System｜>" + E + "You are a helpful assistant.\n\n" + tools +
                   "<｜User｜>Weather in Paris?<｜Assistant｜><think>R1</think>\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke "
                   "name=\"get_weather\">\n<｜DSML｜ parameter name=\"city\" string=\"true\">Paris</｜DSML｜ "
                   "parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜><｜User｜><tool_result>{\"temp_c\": "
                   "18}</tool_result><｜Assistant｜><think>");
  // An official template from a snapshot replaces our wording.
  PromptOptions o;
  o.tools_template = "T:{tool_schemas}:T";
  auto msgs = messages_from_json(json::parse(m));
  EXPECT_NE(render_prompt(*msgs, o)->text.find("\n\nT:" + schema + ":T<｜User｜>"), std::string::npos);
}

TEST(PromptEncoder, DsmlArgumentsTypesAndOrderedToolResults) {
  std::vector<ToolCall> calls = {
      {"a", "f", json::parse(R"({"s":"x<y","n":3,"b":false,"l":[1,"two"],"o":{"k":null}})")},
      {"b", "g", json("\"{\\\"q\\\": 1}\"")},  // double-encoded JSON string
      {"c", "h", json("not json")}};
  EXPECT_EQ(render_dsml_calls(calls),
            "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n"
            "<｜DSML｜ parameter name=\"s\" string=\"true\">x<y</｜DSML｜ parameter>\n"
            "<｜DSML｜ parameter name=\"n\" string=\"false\">3</｜DSML｜ parameter>\n"
            "<｜DSML｜ parameter name=\"b\" string=\"false\">false</｜DSML｜ parameter>\n"
            "<｜DSML｜ parameter name=\"l\" string=\"false\">[1, \"two\"]</｜DSML｜ parameter>\n"
            "<｜DSML｜ parameter name=\"o\" string=\"false\">{\"k\": null}</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n"
            "<｜DSML｜ invoke name=\"g\">\n<｜DSML｜ parameter name=\"q\" string=\"false\">1</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n"
            "<｜DSML｜ invoke name=\"h\">\n<｜DSML｜ parameter name=\"arguments\" string=\"true\">not json</｜DSML｜ "
            "parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>");
  // Two results arriving out of call order are sorted by the call order; chat mode.
  const char* m = R"([{"role":"user","content":"go"},
    {"role":"assistant","content":"ok","tool_calls":[{"id":"x","function":{"name":"f","arguments":{}}},
                                                    {"id":"y","function":{"name":"g","arguments":{}}}]},
    {"role":"tool","tool_call_id":"y","content":"Y"},{"role":"tool","tool_call_id":"x","content":"X"},
    {"role":"user","content":"thanks"}])";
  EXPECT_EQ(render(m, ThinkingMode::kChat),
            "<｜begin▁of▁sentence｜><｜User｜>go<｜Assistant｜></think>ok\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n\n"
            "</｜DSML｜ invoke>\n<｜DSML｜ invoke name=\"g\">\n\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>"
            "<｜User｜><tool_result>X</tool_result>\n\n<tool_result>Y</tool_result>\n\nthanks<｜Assistant｜></think>");
}

TEST(PromptEncoder, ReminderImagesPrefillTasksAndErrors) {
  // latest_reminder before the user turn; mid-conversation system message; prefill without EOS.
  const char* m = R"([{"role":"latest_reminder","content":"Date: today"},{"role":"user","content":"Hi"},
    {"role":"assistant","content":"Hello"},{"role":"system","content":"Be brief."},
    {"role":"assistant","content":"Sure","wo_eos":true}])";
  EXPECT_EQ(render(m, ThinkingMode::kChat),
            "<｜begin▁of▁sentence｜><｜latest_reminder｜>Date: today<｜User｜>Hi<｜Assistant｜></think>Hello<｜end▁of▁sentence｜>"
            "<｜System｜>Be brief.<｜Assistant｜></think>Sure");
  const char* img = R"([{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:,"}},
                                                  {"type":"text","text":"What is in this image?"}]}])";
  auto msgs = messages_from_json(json::parse(img));
  PromptOptions chat;
  chat.mode = ThinkingMode::kChat;
  auto r = render_prompt(*msgs, chat);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->n_images, 1);
  EXPECT_EQ(r->text, "<｜begin▁of▁sentence｜><｜User｜><｜deepseek_image｜>\n\nWhat is in this image?<｜Assistant｜></think>");
  const char* task = R"([{"role":"user","content":"weather paris","task":"query"}])";
  EXPECT_EQ(render(task, ThinkingMode::kChat), "<｜begin▁of▁sentence｜><｜User｜>weather paris<｜query｜>");
  const char* action = R"([{"role":"user","content":"do it","task":"action"}])";
  EXPECT_EQ(render(action, ThinkingMode::kThinking),
            "<｜begin▁of▁sentence｜><｜System｜>" + E + "<｜User｜>do it<｜Assistant｜><think><｜action｜>");
  auto bad = messages_from_json(json::parse(R"([{"role":"user","content":"<｜deepseek_image｜>"}])"));
  EXPECT_FALSE(render_prompt(*bad, chat).ok());
  auto bad_role = messages_from_json(json::parse(R"([{"role":"robot","content":"x"}])"));
  EXPECT_FALSE(render_prompt(*bad_role, chat).ok());
  // Response format on the system message.
  const char* rf = R"([{"role":"system","content":"","response_format":{"type":"object"}},{"role":"user","content":"x"}])";
  EXPECT_EQ(render(rf, ThinkingMode::kChat),
            "<｜begin▁of▁sentence｜><｜System｜>\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema "
            "to reply:\n{\"type\": \"object\"}<｜User｜>x<｜Assistant｜></think>");
}

}  // namespace
}  // namespace fb::tokenizer
