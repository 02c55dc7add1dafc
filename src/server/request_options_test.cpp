// Request options of issue 27 at the parse level: phrase bias (request and server lists, the forms,
// the 400s), response_format combined with tools (the value or a call under auto; the call alone
// when forced), and the Responses object's echo of the request's options.
#include <gtest/gtest.h>

#if FB_SERVER_HAS_GRAMMAR
#include "grammar/compiler.h"
#endif
#include "server/http_status.h"
#include "server/phrase_bias.h"
#include "server/request_parse.h"
#include "server/responder.h"
#include "server/test_parse_context.h"
#include "tokenizer/test_assets.h"

namespace fb::server {
namespace {

ParseContext base_ctx() { return test_parse_context(); }

std::vector<int32_t> ids(const std::string& text) { return tokenizer::v41_tokenizer().encode(text); }

const engine::PhraseBias* find(const std::vector<engine::PhraseBias>& v, const std::vector<int32_t>& tokens) {
  for (const auto& e : v)
    if (e.tokens == tokens) return &e;
  return nullptr;
}

TEST(PhraseBias, FormsVariantsAndErrors) {
  const auto& tok = tokenizer::v41_tokenizer();
  auto obj = parse_phrase_bias(ojson::parse(R"({"as an AI": -100, " of course": 4})"), tok, "'phrase_bias'");
  ASSERT_TRUE(obj.ok()) << obj.status().to_string();
  // "as an AI" as written and after a space; " of course" only as written (it starts with a space).
  ASSERT_EQ(obj->size(), 3u);
  ASSERT_NE(find(*obj, ids("as an AI")), nullptr);
  EXPECT_EQ(find(*obj, ids("as an AI"))->bias, -100.0f);
  ASSERT_NE(find(*obj, ids(" as an AI")), nullptr);
  EXPECT_EQ(find(*obj, ids(" of course"))->bias, 4.0f);
  EXPECT_GT(ids(" as an AI").size(), 1u) << "a multi-token phrase";
  auto list = parse_phrase_bias(ojson::parse(R"([{"tokens": [5, 6, 7], "bias": 2.5}, {"phrase": "\nNote:", "bias": -3}, {"tokens": [5, 6, 7], "bias": 1}])"),
                                tok, "'phrase_bias'");
  ASSERT_TRUE(list.ok()) << list.status().to_string();
  ASSERT_EQ(list->size(), 2u) << "the same tokens twice: one entry, the later bias";
  EXPECT_EQ(find(*list, {5, 6, 7})->bias, 1.0f);
  EXPECT_EQ(find(*list, ids("\nNote:"))->bias, -3.0f);
  for (const char* bad : {R"("x")", R"({"": 1})", R"({"a": 101})", R"({"a": "lots"})", R"([{"phrase": "a"}])", R"([{"bias": 1}])",
                          R"([{"phrase": "a", "tokens": [1], "bias": 1}])", R"([{"tokens": [], "bias": 1}])", R"([{"tokens": [-1], "bias": 1}])",
                          R"([{"tokens": [129280], "bias": 1}])", R"([{"tokens": ["a"], "bias": 1}])", R"([{"phrase": 5, "bias": 1}])"}) {
    auto e = parse_phrase_bias(ojson::parse(bad), tok, "'phrase_bias'");
    EXPECT_FALSE(e.ok()) << bad;
    if (!e.ok()) {
      EXPECT_EQ(http_error_for(e.status().code()).http, 400) << bad;
      EXPECT_NE(e.status().message().find("'phrase_bias'"), std::string::npos) << e.status().message();
    }
  }
  std::string long_phrase;
  for (int i = 0; i < 70; ++i) {
    long_phrase += " word";
    long_phrase += std::to_string(i);
  }
  EXPECT_FALSE(parse_phrase_bias(ojson{{long_phrase, 1}}, tok, "'phrase_bias'").ok()) << "more than 64 tokens";
  ojson many = ojson::object();
  for (size_t i = 0; i <= kMaxPhraseBiasEntries; ++i) many[std::to_string(i) + "w"] = 1;
  EXPECT_FALSE(parse_phrase_bias(many, tok, "'phrase_bias'").ok());
  EXPECT_TRUE(parse_phrase_bias(many, tok, "file", 4 * kMaxPhraseBiasEntries).ok());
}

TEST(PhraseBias, RequestOverridesTheServerList) {
  const auto& tok = tokenizer::v41_tokenizer();
  const auto defaults = parse_phrase_bias(ojson::parse(R"([{"tokens": [10, 11], "bias": -50}, {"tokens": [20, 21], "bias": 5}])"), tok, "file").value();
  ParseContext c = base_ctx();
  c.phrase_bias = &defaults;
  auto r = parse_request(Endpoint::kChat, ojson::parse(R"({"messages":[{"role":"user","content":"Hi"}],
    "phrase_bias":[{"tokens":[10, 11],"bias":0},{"tokens":[30, 31, 32],"bias":-7}]})"), c);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const auto& pb = r->req.sampling.phrase_bias;
  EXPECT_EQ(find(pb, {10, 11}), nullptr) << "bias 0 switches a default off";
  ASSERT_NE(find(pb, {20, 21}), nullptr);
  EXPECT_EQ(find(pb, {20, 21})->bias, 5.0f);
  ASSERT_NE(find(pb, {30, 31, 32}), nullptr);
  EXPECT_EQ(find(pb, {30, 31, 32})->bias, -7.0f);
  // Without the field the server's list applies; Anthropic and completions requests carry it too.
  auto d = parse_request(Endpoint::kMessages, ojson::parse(R"({"max_tokens":5,"messages":[{"role":"user","content":"Hi"}],
    "phrase_bias":{"hello there":2}})"), c);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->req.sampling.phrase_bias.size(), 4u);
  EXPECT_NE(find(d->req.sampling.phrase_bias, ids(" hello there")), nullptr);
  auto k = parse_request(Endpoint::kCompletions, ojson::parse(R"({"prompt":"x","max_tokens":5})"), c);
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k->req.sampling.phrase_bias.size(), 2u);
  EXPECT_TRUE(k->req.sampling.processes_logits());
  auto bad = parse_request(Endpoint::kChat, ojson::parse(R"({"messages":[{"role":"user","content":"Hi"}],"phrase_bias":{"x":500}})"), c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("[-100, 100]"), std::string::npos) << bad.status().message();
}

// The Responses object echoes tool_choice, tools, temperature, top_p, max_output_tokens,
// parallel_tool_calls and instructions as sent (defaults when absent), streamed and not.
TEST(Responder, ResponsesEchoTheRequestsOptions) {
  const ParseContext c = base_ctx();
  auto pr = parse_request(Endpoint::kResponses, ojson::parse(R"({"input":"Weather?","instructions":"Be brief.","reasoning":{"effort":"none"},
    "temperature":0.3,"top_p":0.9,"max_output_tokens":40,"parallel_tool_calls":false,
    "tools":[{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}],
    "tool_choice":"none"})"), c);
  ASSERT_TRUE(pr.ok()) << pr.status().to_string();
  engine::Event done;
  done.kind = engine::Event::Kind::kDone;
  done.finish = engine::FinishReason::kStop;
  Responder r(*pr, "m");
  const ojson body = ojson::parse(r.body(done));
  EXPECT_EQ(body["tool_choice"], "none");
  ASSERT_EQ(body["tools"].size(), 1u);
  EXPECT_EQ(body["tools"][0]["name"], "get_weather");
  EXPECT_FLOAT_EQ(body["temperature"].get<float>(), 0.3f);
  EXPECT_FLOAT_EQ(body["top_p"].get<float>(), 0.9f);
  EXPECT_EQ(body["max_output_tokens"], 40);
  EXPECT_EQ(body["parallel_tool_calls"], false);
  EXPECT_EQ(body["instructions"], "Be brief.");
  Responder s(*pr, "m");
  const std::string start = s.stream_start();
  const ojson created = ojson::parse(start.substr(start.find("data: ") + 6, start.find("\n\n") - start.find("data: ") - 6));
  EXPECT_EQ(created["response"]["tool_choice"], "none") << start;
  auto plain = parse_request(Endpoint::kResponses, ojson::parse(R"({"input":"x"})"), c);
  ASSERT_TRUE(plain.ok());
  const ojson b2 = ojson::parse(Responder(*plain, "m").body(done));
  EXPECT_EQ(b2["tool_choice"], "auto");
  EXPECT_EQ(b2["tools"], ojson::array());
  EXPECT_TRUE(b2["max_output_tokens"].is_null());
  EXPECT_FLOAT_EQ(b2["top_p"].get<float>(), 0.95f) << "spec/16 defaults, applied";
}

#if FB_SERVER_HAS_GRAMMAR
TEST(RequestParse, ResponseFormatWithTools) {
  const ParseContext c = test_grammar_parse_context();
  ASSERT_NE(c.grammar, nullptr) << "the grammar engine over the V4.1 vocabulary";
  const std::string tools = R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])";
  const std::string rf = R"("response_format":{"type":"json_schema","json_schema":{"name":"w","schema":{"type":"object","properties":{"temp":{"type":"integer"}},"required":["temp"]}}})";
  auto chat = [&](const std::string& extra) {
    return parse_request(Endpoint::kChat, ojson::parse(R"({"messages":[{"role":"user","content":"Weather?"}],"thinking":{"type":"disabled"},"tools":)" + tools +
                                                       "," + extra + "}"), c);
  };
  auto allows = [](engine::TokenConstraint& k, const std::string& text) {
    for (int32_t t : tokenizer::v41_tokenizer().encode(text))
      if (!k.accept(t)) return false;
    return true;
  };
  const std::string call = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ parameter name=\"city\" string=\"true\">Oslo</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  auto a = chat(rf);  // auto: the value or a call
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_NE(a->req.sampling.constraint, nullptr);
  EXPECT_NE(a->prompt_text.find("## Tools"), std::string::npos);
  EXPECT_NE(a->prompt_text.find("\"temp\""), std::string::npos) << "the schema is rendered too";
  EXPECT_TRUE(allows(*a->req.sampling.constraint, R"({"temp": 3})"));
  EXPECT_TRUE(allows(*chat(rf)->req.sampling.constraint, call));
  EXPECT_FALSE(allows(*chat(rf)->req.sampling.constraint, "Sunny"));
  EXPECT_FALSE(allows(*chat(rf)->req.sampling.constraint, R"({"temp": "x")"));
  auto forced = chat(rf + R"(,"tool_choice":"required")");  // forced: the call only
  ASSERT_TRUE(forced.ok()) << forced.status().to_string();
  EXPECT_TRUE(allows(*forced->req.sampling.constraint, call));
  EXPECT_FALSE(allows(*chat(rf + R"(,"tool_choice":"required")")->req.sampling.constraint, R"({"temp": 3})"));
  auto none = chat(rf + R"(,"tool_choice":"none")");  // no tools: the value only
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_TRUE(allows(*none->req.sampling.constraint, R"({"temp": 3})"));
  EXPECT_FALSE(allows(*chat(rf + R"(,"tool_choice":"none")")->req.sampling.constraint, call));
  auto bad = chat(R"("response_format":{"type":"json_schema","json_schema":{"schema":{"type":"string","format":"date"}}})");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(http_error_for(bad.status().code()).http, 400);
  EXPECT_NE(bad.status().message().find("'format'"), std::string::npos) << bad.status().message();
}

// Responses text.format: the same formats with the json_schema fields flat; rendered into the
// prompt, enforced, echoed; 400s name 'text.format'.
TEST(RequestParse, ResponsesTextFormat) {
  const ParseContext c = test_grammar_parse_context();
  ASSERT_NE(c.grammar, nullptr) << "the grammar engine over the V4.1 vocabulary";
  auto resp = [&](const std::string& format) {
    return parse_request(Endpoint::kResponses, ojson::parse(R"({"input":"Temperature?","reasoning":{"effort":"none"},"text":{"format":)" + format + "}}"), c);
  };
  auto allows = [](engine::TokenConstraint& k, const std::string& text) {
    for (int32_t t : tokenizer::v41_tokenizer().encode(text))
      if (!k.accept(t)) return false;
    return true;
  };
  const std::string f = R"({"type":"json_schema","name":"t","strict":true,"schema":{"type":"object","properties":{"temp":{"type":"integer"}},"required":["temp"]}})";
  auto r = resp(f);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_NE(r->req.sampling.constraint, nullptr);
  EXPECT_NE(r->prompt_text.find("\"temp\""), std::string::npos) << "the schema is rendered into the prompt";
  EXPECT_TRUE(allows(*r->req.sampling.constraint, R"({"temp": 3})"));
  EXPECT_FALSE(allows(*resp(f)->req.sampling.constraint, R"({"temp": 3, "x": 1})")) << "strict";
  EXPECT_FALSE(allows(*resp(f)->req.sampling.constraint, "Warm"));
  EXPECT_EQ(r->echo["text"]["format"]["name"], "t");
  auto obj = resp(R"({"type":"json_object"})");
  ASSERT_TRUE(obj.ok());
  EXPECT_TRUE(allows(*obj->req.sampling.constraint, R"({"a": 1})"));
  auto text = resp(R"({"type":"text"})");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->req.sampling.constraint, nullptr);
  for (const char* bad : {R"({"type":"xml"})", R"("json")", R"({"type":"json_schema","schema":{"type":"string","pattern":"a"}})",
                          R"({"type":"json_schema","strict":"yes","schema":{}})"}) {
    auto e = resp(bad);
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_EQ(http_error_for(e.status().code()).http, 400) << bad;
  }
  EXPECT_NE(resp(R"({"type":"xml"})").status().message().find("'text.format.type'"), std::string::npos);
  EXPECT_NE(resp(R"({"type":"json_schema","strict":"yes","schema":{}})").status().message().find("'text.format.strict'"), std::string::npos);
  auto plain = parse_request(Endpoint::kResponses, ojson::parse(R"({"input":"x"})"), c);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->echo["text"]["format"]["type"], "text");
}
#endif

}  // namespace
}  // namespace fb::server
