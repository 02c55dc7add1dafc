// Issue 27 at the parse level: OpenAI tool_choice allowed_tools (Chat and Responses shapes; the
// calls may name only the listed functions, every tool stays in the prompt; 400s naming the bad
// entry), and structured output on the other APIs: Anthropic Messages output_config.format (and the
// beta's output_format), legacy Completions response_format. Through the SDKs on the tiny model:
// tests/server/test_structured_output.py.
#include <gtest/gtest.h>

#include "server/http_status.h"
#include "server/request_parse.h"
#include "server/test_parse_context.h"
#include "tokenizer/test_assets.h"
#if FB_SERVER_HAS_GRAMMAR
#include "grammar/compiler.h"
#endif

namespace fb::server {
namespace {

#if FB_SERVER_HAS_GRAMMAR
ParseContext grammar_ctx() {
  ParseContext c = test_grammar_parse_context();
  EXPECT_NE(c.grammar, nullptr) << "the grammar engine over the V4.1 vocabulary";
  return c;
}

// Feeds `text`'s tokens to a fresh constraint; false at the first token it refuses.
bool allows(const std::shared_ptr<engine::TokenConstraint>& k, const std::string& text) {
  if (!k) return true;
  for (int32_t t : tokenizer::v41_tokenizer().encode(text))
    if (!k->accept(t)) return false;
  return true;
}

std::string call_of(const std::string& name) {
  return "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"" + name + "\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
}

const char* kTools = R"([
  {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}},
  {"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{}}}},
  {"type":"function","function":{"name":"get_news","parameters":{"type":"object","properties":{}}}}])";

Result<ParsedRequest> chat(const ParseContext& c, const std::string& tool_choice, const std::string& tools = kTools) {
  std::string body = R"({"messages":[{"role":"user","content":"Weather?"}],"thinking":{"type":"disabled"})";
  if (!tools.empty()) body += R"(,"tools":)" + tools;
  body += R"(,"tool_choice":)" + tool_choice + "}";
  return parse_request(Endpoint::kChat, ojson::parse(body), c);
}

TEST(AllowedTools, RequiredNamesOnlyTheListedFunctions) {
  const ParseContext c = grammar_ctx();
  const std::string tc = R"({"type":"allowed_tools","allowed_tools":{"mode":"required","tools":[{"type":"function","function":{"name":"get_time"}},
                             {"type":"function","function":{"name":"get_news"}}]}})";
  auto r = chat(c, tc);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_NE(r->req.sampling.constraint, nullptr);
  for (const char* name : {"get_weather", "get_time", "get_news"})
    EXPECT_NE(r->prompt_text.find(name), std::string::npos) << "every tool stays in the prompt: " << name;
  EXPECT_TRUE(allows(chat(c, tc)->req.sampling.constraint, call_of("get_time")));
  EXPECT_TRUE(allows(chat(c, tc)->req.sampling.constraint, call_of("get_news")));
  EXPECT_FALSE(allows(chat(c, tc)->req.sampling.constraint, call_of("get_weather")));
  EXPECT_FALSE(allows(chat(c, tc)->req.sampling.constraint, "Sure."));
  // Responses shape (flat), on the Responses API.
  auto resp = parse_request(Endpoint::kResponses, ojson::parse(R"({"input":"Weather?","reasoning":{"effort":"none"},
    "tools":[{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{}}},
             {"type":"function","name":"get_time","parameters":{"type":"object","properties":{}}}],
    "tool_choice":{"type":"allowed_tools","mode":"required","tools":[{"type":"function","name":"get_weather"}]}})"), c);
  ASSERT_TRUE(resp.ok()) << resp.status().to_string();
  EXPECT_TRUE(allows(resp->req.sampling.constraint, call_of("get_weather")));
  EXPECT_EQ(resp->echo["tool_choice"]["type"], "allowed_tools") << "echoed as sent";
  auto resp2 = parse_request(Endpoint::kResponses, ojson::parse(R"({"input":"Weather?","reasoning":{"effort":"none"},
    "tools":[{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{}}},
             {"type":"function","name":"get_time","parameters":{"type":"object","properties":{}}}],
    "tool_choice":{"type":"allowed_tools","mode":"required","tools":[{"type":"function","name":"get_weather"}]}})"), c);
  EXPECT_FALSE(allows(resp2->req.sampling.constraint, call_of("get_time")));
}

TEST(AllowedTools, AutoAllowsTextAndRestrictsTheCalls) {
  const ParseContext c = grammar_ctx();
  const std::string tc = R"({"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[{"type":"function","function":{"name":"get_time"}}]}})";
  auto r = chat(c, tc);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_NE(r->req.sampling.constraint, nullptr) << "a subset: the calls block is constrained";
  EXPECT_TRUE(allows(r->req.sampling.constraint, "No tool is needed here."));
  EXPECT_TRUE(allows(chat(c, tc)->req.sampling.constraint, call_of("get_time")));
  EXPECT_FALSE(allows(chat(c, tc)->req.sampling.constraint, call_of("get_news")));
  // Every tool listed under auto: nothing to restrict, no constraint (no cost).
  auto all = chat(c, R"({"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[{"type":"function","function":{"name":"get_time"}},
    {"type":"function","function":{"name":"get_weather"}},{"type":"function","function":{"name":"get_news"}},{"type":"function","function":{"name":"get_news"}}]}})");
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  EXPECT_EQ(all->req.sampling.constraint, nullptr);
}

TEST(AllowedTools, BadInputIs400NamingIt) {
  const ParseContext c = grammar_ctx();
  struct Case {
    std::string tool_choice, tools, needle;
  };
  const std::vector<Case> cases = {
      {R"({"type":"allowed_tools","allowed_tools":{"mode":"required","tools":[{"type":"function","function":{"name":"get_stock"}}]}})", kTools,
       "'tool_choice.allowed_tools.tools' names function 'get_stock', which is not in 'tools' (get_weather, get_time, get_news)"},
      {R"({"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[]}})", kTools, "'tool_choice.allowed_tools.tools' is empty"},
      {R"({"type":"allowed_tools","allowed_tools":{"mode":"any","tools":[{"type":"function","function":{"name":"get_time"}}]}})", kTools,
       "'tool_choice.allowed_tools.mode' must be \"auto\" or \"required\" (got \"any\")"},
      {R"({"type":"allowed_tools","allowed_tools":{"tools":[{"type":"function","function":{"name":"get_time"}}]}})", kTools,
       "'tool_choice.allowed_tools.mode'"},
      {R"({"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[{"type":"mcp","server_label":"deepwiki"}]}})", kTools,
       "'tool_choice.allowed_tools.tools[0]' has type \"mcp\""},
      {R"({"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[{"type":"function","function":{}}]}})", kTools,
       "'tool_choice.allowed_tools.tools[0]' needs the function's name"},
      {R"({"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[{"type":"function","function":{"name":"get_time"}}, 5]}})", kTools,
       "'tool_choice.allowed_tools.tools[1]' must be an object"},
      {R"({"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":{"type":"function"}}})", kTools, "'tool_choice.allowed_tools.tools' must be a list"},
      {R"({"type":"allowed_tools","allowed_tools":"get_time"})", kTools, "'tool_choice.allowed_tools' must be an object"},
      {R"({"type":"allowed_tools","mode":"required","tools":[{"type":"function","name":"get_stock"}]})", kTools,
       "'tool_choice.tools' names function 'get_stock'"},
      {R"({"type":"allowed_tools","allowed_tools":{"mode":"required","tools":[{"type":"function","function":{"name":"get_time"}}]}})", "",
       "no function tools"},
  };
  for (const Case& k : cases) {
    auto r = chat(c, k.tool_choice, k.tools);
    ASSERT_FALSE(r.ok()) << k.tool_choice;
    EXPECT_EQ(http_error_for(r.status().code()).http, 400) << k.tool_choice;
    EXPECT_NE(r.status().message().find(k.needle), std::string::npos) << k.tool_choice << "\n  got: " << r.status().message();
  }
}

// Anthropic Messages structured outputs: output_config.format {"type": "json_schema", "schema"};
// always strict; rendered into the prompt like Chat's; the beta's top-level output_format too.
TEST(StructuredOutput, AnthropicOutputConfigFormat) {
  const ParseContext c = grammar_ctx();
  auto msg = [&](const std::string& extra, bool thinking = false) {
    return parse_request(Endpoint::kMessages,
                         ojson::parse(std::string(R"({"max_tokens":64,"messages":[{"role":"user","content":"Temperature?"}],"thinking":{"type":")") +
                                      (thinking ? "enabled" : "disabled") + R"("},)" + extra + "}"),
                         c);
  };
  const std::string f = R"("output_config":{"format":{"type":"json_schema","schema":{"type":"object","properties":{"temp":{"type":"integer"}},"required":["temp"]}}})";
  auto r = msg(f);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_NE(r->req.sampling.constraint, nullptr);
  EXPECT_NE(r->prompt_text.find("\"temp\""), std::string::npos) << "the schema is rendered into the prompt";
  EXPECT_TRUE(allows(r->req.sampling.constraint, R"({"temp": 3})"));
  EXPECT_FALSE(allows(msg(f)->req.sampling.constraint, R"({"temp": 3, "x": 1})")) << "always strict";
  EXPECT_FALSE(allows(msg(f)->req.sampling.constraint, "Warm"));
  auto think = msg(f, true);
  ASSERT_TRUE(think.ok());
  EXPECT_TRUE(allows(think->req.sampling.constraint, "Let me think.")) << "the reasoning is free";
  auto beta = msg(R"("output_format":{"type":"json_schema","schema":{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"]}})");
  ASSERT_TRUE(beta.ok()) << beta.status().to_string();
  EXPECT_TRUE(allows(beta->req.sampling.constraint, R"({"ok": true})"));
  auto effort = msg(R"("output_config":{"effort":null,"format":null})");
  ASSERT_TRUE(effort.ok()) << effort.status().to_string();
  EXPECT_EQ(effort->req.sampling.constraint, nullptr);
  // With tools under auto: the value or a tool call, as on Chat.
  auto tools = msg(f + R"(,"tools":[{"name":"get_time","input_schema":{"type":"object","properties":{}}}])");
  ASSERT_TRUE(tools.ok()) << tools.status().to_string();
  EXPECT_TRUE(allows(tools->req.sampling.constraint, call_of("get_time")));
  struct Case {
    std::string extra, needle;
  };
  for (const Case& k : std::vector<Case>{
           {R"("output_config":{"format":{"type":"json_object"}})", "'output_config.format.type' must be json_schema"},
           {R"("output_config":{"format":{"type":"json_schema"}})", "'output_config.format.schema' must be a JSON schema object"},
           {R"("output_config":{"format":"json"})", "'output_config.format' must be an object"},
           {R"("output_format":{"type":"text"})", "'output_format.type' must be json_schema"},
           {R"("output_config":{"format":{"type":"json_schema","schema":{"type":"string","pattern":"a+"}}})",
            "output_config.format schema at '/': keyword 'pattern'"}}) {
    auto e = msg(k.extra);
    ASSERT_FALSE(e.ok()) << k.extra;
    EXPECT_EQ(http_error_for(e.status().code()).http, 400) << k.extra;
    EXPECT_NE(e.status().message().find(k.needle), std::string::npos) << k.extra << "\n  got: " << e.status().message();
  }
}

// Legacy Completions: response_format as on Chat (vLLM's extension); no template, so the value
// starts with the first generated token; the prompt is left as written.
TEST(StructuredOutput, CompletionsResponseFormat) {
  const ParseContext c = grammar_ctx();
  auto comp = [&](const std::string& rf) {
    return parse_request(Endpoint::kCompletions, ojson::parse(R"({"prompt":"The answer:","max_tokens":32,"response_format":)" + rf + "}"), c);
  };
  auto obj = comp(R"({"type":"json_object"})");
  ASSERT_TRUE(obj.ok()) << obj.status().to_string();
  ASSERT_NE(obj->req.sampling.constraint, nullptr);
  EXPECT_EQ(obj->prompt_text, "The answer:");
  EXPECT_TRUE(allows(obj->req.sampling.constraint, R"({"a": 1})"));
  EXPECT_FALSE(allows(comp(R"({"type":"json_object"})")->req.sampling.constraint, " 42"));
  const std::string sch = R"({"type":"json_schema","json_schema":{"name":"n","strict":true,"schema":{"type":"array","items":{"enum":["x","y"]},"maxItems":2}}})";
  EXPECT_TRUE(allows(comp(sch)->req.sampling.constraint, R"(["x", "y"])"));
  EXPECT_FALSE(allows(comp(sch)->req.sampling.constraint, R"(["z"])"));
  auto text = comp(R"({"type":"text"})");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->req.sampling.constraint, nullptr);
  auto bad = comp(R"({"type":"xml"})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'response_format.type'"), std::string::npos) << bad.status().message();
  ParseContext none = c;  // a server without the grammar engine refuses rather than ignore
  none.grammar = nullptr;
  EXPECT_FALSE(parse_request(Endpoint::kCompletions, ojson::parse(R"({"prompt":"x","response_format":{"type":"json_object"}})"), none).ok());
}
#endif

}  // namespace
}  // namespace fb::server
