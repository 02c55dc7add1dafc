// Server units: the Status -> HTTP table, error bodies in both formats, request JSON parsing
// (types, defaults, thinking, tools onto the system message, Anthropic and Responses mapping).
#include <gtest/gtest.h>

#if FB_SERVER_HAS_GRAMMAR
#include "grammar/compiler.h"
#endif
#include "server/http_status.h"
#include "server/request_parse.h"
#include "server/test_parse_context.h"
#include "tokenizer/test_assets.h"

namespace fb::server {
namespace {

ParseContext ctx() { return test_parse_context(); }
Result<ParsedRequest> parse(Endpoint ep, const char* body) { return parse_request(ep, ojson::parse(body), ctx()); }

TEST(HttpStatus, Table) {
  EXPECT_EQ(http_error_for(StatusCode::kInvalidArgument).http, 400);
  EXPECT_EQ(http_error_for(StatusCode::kResourceExhausted).http, 400);
  EXPECT_EQ(http_error_for(StatusCode::kUnsupported).http, 400);
  EXPECT_EQ(http_error_for(StatusCode::kNotFound).http, 404);
  EXPECT_EQ(http_error_for(StatusCode::kInternal).http, 500);
  EXPECT_EQ(http_error_for(StatusCode::kOutOfMemory).http, 503);
  auto o = nlohmann::json::parse(error_body(Api::kOpenAi, http_error_for(StatusCode::kInvalidArgument), "bad"));
  EXPECT_EQ(o["error"]["message"], "bad");
  EXPECT_EQ(o["error"]["type"], "invalid_request_error");
  auto a = nlohmann::json::parse(error_body(Api::kAnthropic, http_error_for_http(413), "big"));
  EXPECT_EQ(a["type"], "error");
  EXPECT_EQ(a["error"]["type"], "request_too_large");
}

TEST(RequestParse, ChatDefaultsAndThinking) {
  auto r = parse(Endpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"Hi"}]})");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->req.thinking);
  EXPECT_FLOAT_EQ(r->req.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r->req.sampling.top_p, 0.95f);
  EXPECT_NE(r->prompt_text.find("<｜Assistant｜><think>"), std::string::npos);
  auto c = parse(Endpoint::kChat, R"({"messages":[{"role":"user","content":"Hi"}],"thinking":{"type":"disabled"},"max_tokens":5,"temperature":0,"stop":"x","seed":3})");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->req.thinking);
  EXPECT_EQ(c->prompt_text, "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>");
  EXPECT_EQ(c->req.max_tokens, 5);
  EXPECT_TRUE(c->req.sampling.greedy());
  EXPECT_EQ(c->req.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(*c->req.sampling.seed, 3u);
  auto e = parse(Endpoint::kChat, R"({"messages":[{"role":"user","content":"Hi"}],"reasoning_effort":"none"})");
  ASSERT_TRUE(e.ok());
  EXPECT_FALSE(e->req.thinking);
}

TEST(RequestParse, WrongTypesAreInvalidArgument) {
  for (const char* b : {R"({"messages":"hi"})", R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})",
                        R"({"messages":[{"role":"user","content":"x"}],"max_tokens":1.5})", R"({"messages":[{"role":"user","content":"x"}],"stop":[1]})",
                        R"({"messages":[{"role":"user","content":"x"}],"top_p":0})", R"({"messages":[{"content":"x"}]})",
                        R"({"messages":[{"role":"user","content":"x"}],"thinking":"yes"})", R"([1,2])"}) {
    auto r = parse(Endpoint::kChat, b);
    EXPECT_FALSE(r.ok()) << b;
    if (!r.ok()) EXPECT_EQ(http_error_for(r.status().code()).http, 400) << b;
  }
  EXPECT_FALSE(parse(Endpoint::kMessages, R"({"messages":[{"role":"user","content":"x"}]})").ok());  // max_tokens required
}

// Issue 27: an explicit max_tokens beyond the context is a 400 naming the numbers (the default is
// clamped); a bad max_tokens names the value it got, on the Anthropic path too.
TEST(RequestParse, MaxTokensBeyondContextAndBadValues) {
  auto huge = parse(Endpoint::kChat, R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":1000000000})");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(http_error_for(huge.status().code()).http, 400);
  EXPECT_NE(huge.status().message().find("maximum context length is 4096"), std::string::npos) << huge.status().message();
  EXPECT_NE(huge.status().message().find("1000000000"), std::string::npos) << huge.status().message();
  auto fits = parse(Endpoint::kChat, R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":4000})");
  ASSERT_TRUE(fits.ok()) << fits.status().to_string();
  EXPECT_EQ(fits->req.max_tokens, 4000);
  auto dflt = parse(Endpoint::kChat, R"({"messages":[{"role":"user","content":"Hi"}]})");
  ASSERT_TRUE(dflt.ok());
  EXPECT_LE(dflt->req.max_tokens, 4096 - int64_t(dflt->req.prompt.size()));  // the default is clamped, not refused
  auto neg = parse(Endpoint::kMessages, R"({"messages":[{"role":"user","content":"x"}],"max_tokens":-1})");
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("'max_tokens' must be at least 1 (got -1)"), std::string::npos) << neg.status().message();
  auto missing = parse(Endpoint::kMessages, R"({"messages":[{"role":"user","content":"x"}]})");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("required"), std::string::npos);
  auto other = parse(Endpoint::kResponses, R"({"input":"x","max_output_tokens":0})");
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("'max_output_tokens' must be at least 1 (got 0)"), std::string::npos) << other.status().message();
}

#if FB_SERVER_HAS_GRAMMAR
// Issue 27: response_format becomes the request's token constraint (thinking: after </think>);
// unsupported types, keywords and unsatisfiable schemas are 400s naming them.
TEST(RequestParse, ResponseFormat) {
  const ParseContext c = test_grammar_parse_context();
  ASSERT_NE(c.grammar, nullptr) << "the grammar engine over the V4.1 vocabulary";
  auto p = [&](const std::string& rf, bool thinking = false) {
    const std::string body = std::string(R"({"messages":[{"role":"user","content":"Hi"}],"thinking":{"type":")") +
                             (thinking ? "enabled" : "disabled") + R"("},"response_format":)" + rf + "}";
    return parse_request(Endpoint::kChat, ojson::parse(body), c);
  };
  auto allows = [](engine::TokenConstraint& k, const std::string& text) {
    for (int32_t t : tokenizer::v41_tokenizer().encode(text))
      if (!k.accept(t)) return false;
    return true;
  };
  auto text = p(R"({"type":"text"})");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->req.sampling.constraint, nullptr);
  auto obj = p(R"({"type":"json_object"})");
  ASSERT_TRUE(obj.ok()) << obj.status().to_string();
  ASSERT_NE(obj->req.sampling.constraint, nullptr);
  EXPECT_FALSE(allows(*obj->req.sampling.constraint, "Sure"));
  const char* schema_rf = R"({"type":"json_schema","json_schema":{"name":"n","strict":true,"schema":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}}})";
  auto sch = p(schema_rf);
  ASSERT_TRUE(sch.ok()) << sch.status().to_string();
  EXPECT_NE(sch->prompt_text.find("\"required\""), std::string::npos) << "the schema is also rendered into the prompt";
  EXPECT_TRUE(allows(*sch->req.sampling.constraint, R"({"a": 5})"));
  EXPECT_FALSE(allows(*p(schema_rf)->req.sampling.constraint, R"({"b")"));  // a fresh request's state
  auto think = p(R"({"type":"json_object"})", true);
  ASSERT_TRUE(think.ok());
  EXPECT_TRUE(allows(*think->req.sampling.constraint, "Let me think."));
  for (const char* bad : {R"({"type":"xml"})", R"("json")", R"({"type":"json_schema"})",
                          R"({"type":"json_schema","json_schema":{"schema":{"type":"string","pattern":"a"}}})",
                          R"({"type":"json_schema","json_schema":{"schema":{"enum":[]}}})",
                          R"({"type":"json_schema","json_schema":{"strict":"yes","schema":{}}})"}) {
    auto e = p(bad);
    EXPECT_FALSE(e.ok()) << bad;
    if (!e.ok()) {
      EXPECT_EQ(http_error_for(e.status().code()).http, 400) << bad << ": " << e.status().message();
    }
  }
  EXPECT_NE(p(R"({"type":"json_schema","json_schema":{"schema":{"type":"string","pattern":"a"}}})").status().message().find("'pattern'"), std::string::npos);
  ParseContext none = ctx();  // a server without the grammar engine refuses rather than ignore
  auto r = parse_request(Endpoint::kChat, ojson::parse(R"({"messages":[{"role":"user","content":"Hi"}],"response_format":{"type":"json_object"}})"), none);
  EXPECT_FALSE(r.ok());
}
#endif

#if FB_SERVER_HAS_GRAMMAR
// Issue 27: tool_choice required / named (OpenAI Chat and Responses, Anthropic any / tool) and
// strict tools become a token constraint in the DSML syntax; a name not among the tools, forcing
// without tools and unsupported forms are 400s naming them.
TEST(RequestParse, ToolChoiceForcesACallInTheModelsSyntax) {
  const ParseContext c = test_grammar_parse_context();
  ASSERT_NE(c.grammar, nullptr) << "the grammar engine over the V4.1 vocabulary";
  const std::string tools = R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}},
    {"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{}}}}])";
  auto chat = [&](const std::string& extra, const std::string& t = "") {
    const std::string body = R"({"messages":[{"role":"user","content":"Weather?"}],"thinking":{"type":"disabled"},"tools":)" + (t.empty() ? tools : t) +
                             (extra.empty() ? "" : "," + extra) + "}";
    return parse_request(Endpoint::kChat, ojson::parse(body), c);
  };
  auto allows = [](engine::TokenConstraint& k, const std::string& text) {
    for (int32_t t : tokenizer::v41_tokenizer().encode(text))
      if (!k.accept(t)) return false;
    return true;
  };
  const std::string weather = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ parameter name=\"city\" string=\"true\">Oslo</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  const std::string time = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_time\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";

  auto none = chat("");  // auto, no strict tool: nothing enforced (as before)
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_EQ(none->req.sampling.constraint, nullptr);
  auto req = chat(R"("tool_choice":"required")");
  ASSERT_TRUE(req.ok()) << req.status().to_string();
  ASSERT_NE(req->req.sampling.constraint, nullptr);
  EXPECT_NE(req->prompt_text.find("## Tools"), std::string::npos) << "the tools stay in the prompt";
  EXPECT_FALSE(allows(*req->req.sampling.constraint, "Sure"));
  EXPECT_TRUE(allows(*chat(R"("tool_choice":"required")")->req.sampling.constraint, time));
  auto named = chat(R"("tool_choice":{"type":"function","function":{"name":"get_weather"}})");
  ASSERT_TRUE(named.ok()) << named.status().to_string();
  EXPECT_TRUE(allows(*named->req.sampling.constraint, weather));
  EXPECT_FALSE(allows(*chat(R"("tool_choice":{"type":"function","function":{"name":"get_weather"}})")->req.sampling.constraint, time));
  auto strict = chat("", R"([{"type":"function","function":{"name":"get_weather","strict":true,"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])");
  ASSERT_TRUE(strict.ok()) << strict.status().to_string();
  ASSERT_NE(strict->req.sampling.constraint, nullptr) << "strict: arguments constrained under auto";
  EXPECT_TRUE(allows(*strict->req.sampling.constraint, "No tool needed."));
  auto off = chat(R"("tool_choice":"none")");
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->req.sampling.constraint, nullptr);
  EXPECT_EQ(off->prompt_text.find("## Tools"), std::string::npos);

  auto bad_name = chat(R"("tool_choice":{"type":"function","function":{"name":"get_news"}})");
  ASSERT_FALSE(bad_name.ok());
  EXPECT_EQ(http_error_for(bad_name.status().code()).http, 400);
  EXPECT_NE(bad_name.status().message().find("'get_news'"), std::string::npos) << bad_name.status().message();
  for (const char* bad : {R"("tool_choice":"always")", R"("tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[]}})",
                          R"("tool_choice":{"type":"function"})", R"("tool_choice":5)"}) {
    auto e = chat(bad);
    EXPECT_FALSE(e.ok()) << bad;
    if (!e.ok()) {
      EXPECT_EQ(http_error_for(e.status().code()).http, 400) << bad << ": " << e.status().message();
    }
  }
  auto no_tools = parse_request(Endpoint::kChat, ojson::parse(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})"), c);
  ASSERT_FALSE(no_tools.ok());
  EXPECT_NE(no_tools.status().message().find("no function tools"), std::string::npos) << no_tools.status().message();
  auto bad_schema = chat(R"("tool_choice":"required")", R"([{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"string","format":"email"}}}}}])");
  ASSERT_FALSE(bad_schema.ok());
  EXPECT_NE(bad_schema.status().message().find("tool 'f' parameters schema at '/properties/a'"), std::string::npos) << bad_schema.status().message();
  ParseContext plain = ctx();  // a server without the grammar engine refuses rather than ignore
  EXPECT_FALSE(parse_request(Endpoint::kChat, ojson::parse(R"({"messages":[{"role":"user","content":"x"}],"tools":)" + tools + R"(,"tool_choice":"required"})"), plain).ok());

  // Anthropic: any / tool / none, disable_parallel_tool_use; Responses: {"type":"function","name"}.
  const std::string atools = R"([{"name":"get_weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}])";
  auto msg = [&](const std::string& tc) {
    return parse_request(Endpoint::kMessages, ojson::parse(R"({"max_tokens":50,"thinking":{"type":"disabled"},"messages":[{"role":"user","content":"Weather?"}],"tools":)" +
                                                           atools + R"(,"tool_choice":)" + tc + "}"), c);
  };
  auto any = msg(R"({"type":"any","disable_parallel_tool_use":true})");
  ASSERT_TRUE(any.ok()) << any.status().to_string();
  ASSERT_NE(any->req.sampling.constraint, nullptr);
  EXPECT_FALSE(any->parallel_tool_calls);
  EXPECT_TRUE(allows(*any->req.sampling.constraint, weather));
  auto tool = msg(R"({"type":"tool","name":"get_weather"})");
  ASSERT_TRUE(tool.ok()) << tool.status().to_string();
  EXPECT_FALSE(allows(*tool->req.sampling.constraint, "Hello"));
  auto missing = msg(R"({"type":"tool","name":"lookup"})");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("'lookup'"), std::string::npos) << missing.status().message();
  auto resp = parse_request(Endpoint::kResponses, ojson::parse(R"({"input":"Weather?","reasoning":{"effort":"none"},
    "tools":[{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}],
    "tool_choice":{"type":"function","name":"get_weather"}})"), c);
  ASSERT_TRUE(resp.ok()) << resp.status().to_string();
  EXPECT_TRUE(allows(*resp->req.sampling.constraint, weather));
}
#endif

// Issue 27: logit_bias and the penalties reach the sampler; bad values are 400s naming them.
TEST(RequestParse, LogitBiasAndPenalties) {
  auto r = parse(Endpoint::kChat, R"({"messages":[{"role":"user","content":"Hi"}],"logit_bias":{"15":-100,"42":2.5},"presence_penalty":0.5,"frequency_penalty":-1})");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::vector<std::pair<int32_t, float>> want = {{15, -100.0f}, {42, 2.5f}};
  EXPECT_EQ(r->req.sampling.logit_bias, want);
  EXPECT_FLOAT_EQ(r->req.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r->req.sampling.frequency_penalty, -1.0f);
  for (const char* bad : {R"("logit_bias":{"x":1})", R"("logit_bias":{"-3":1})", R"("logit_bias":{"5":101})", R"("logit_bias":{"5":"a"})",
                          R"("logit_bias":[1])", R"("logit_bias":{"999999":1})", R"("presence_penalty":3)", R"("frequency_penalty":"lots")"}) {
    const std::string body = std::string(R"({"messages":[{"role":"user","content":"Hi"}],)") + bad + "}";
    auto e = parse(Endpoint::kChat, body.c_str());
    EXPECT_FALSE(e.ok()) << body;
    if (!e.ok()) {
      EXPECT_EQ(http_error_for(e.status().code()).http, 400) << body;
    }
  }
}

TEST(RequestParse, ContextOverflow) {
  std::string big(20000, 'a');
  for (size_t i = 0; i < big.size(); i += 2) big[i] = ' ';
  ojson b = {{"messages", ojson::array({{{"role", "user"}, {"content", big}}})}};
  auto r = parse_request(Endpoint::kChat, b, ctx());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
}

TEST(RequestParse, ToolsGoOnTheSystemMessageAndHistoryRoundTrips) {
  auto r = parse(Endpoint::kChat, R"({"messages":[{"role":"user","content":"Weather?"},
    {"role":"assistant","content":"","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
    {"role":"tool","tool_call_id":"call_1","content":"18C"}],
    "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],"thinking":{"type":"disabled"}})");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->prompt_text.rfind("<｜begin▁of▁sentence｜><｜System｜>\n\n## Tools", 0), 0u) << r->prompt_text;
  EXPECT_NE(r->prompt_text.find("<｜DSML｜ parameter name=\"city\" string=\"true\">Paris</｜DSML｜ parameter>"), std::string::npos);
  EXPECT_NE(r->prompt_text.find("<tool_result>18C</tool_result>"), std::string::npos);
  auto none = parse(Endpoint::kChat, R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"none"})");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->prompt_text.find("## Tools"), std::string::npos);
}

TEST(RequestParse, AnthropicAndResponsesMapToTheSamePrompt) {
  auto a = parse(Endpoint::kMessages, R"({"max_tokens":10,"system":"Be brief.","thinking":{"type":"disabled"},
    "messages":[{"role":"user","content":"Weather?"},
    {"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},
    {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"18C"}]}],
    "tools":[{"name":"get_weather","input_schema":{"type":"object"}}]})");
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  auto o = parse(Endpoint::kResponses, R"({"instructions":"Be brief.","reasoning":{"effort":"none"},
    "input":[{"role":"user","content":"Weather?"},
    {"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\": \"Paris\"}"},
    {"type":"function_call_output","call_id":"c1","output":"18C"}],
    "tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}]})");
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(a->prompt_text, o->prompt_text);
  EXPECT_NE(a->prompt_text.find("<tool_result>18C</tool_result><｜Assistant｜></think>"), std::string::npos) << a->prompt_text;
}

}  // namespace
}  // namespace fb::server
