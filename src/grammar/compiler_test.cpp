// Constrained decoding on the real V4.1 vocabulary (129,280 ids): JSON and schema acceptance
// through the tokenizer's own tokens, the schema subset's 400s, masks checked token by token
// against the recognizer, the DSpark rule (mask after drafts == mask after emitting them), the
// thinking phase, and the per-token mask cost.
#include "grammar/compiler.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "grammar/schema_check.h"
#include "tokenizer/test_assets.h"

namespace fb::grammar {
namespace {

using ojson = nlohmann::ordered_json;
constexpr int64_t kVocab = 129280;
constexpr int32_t kEos = 1;

const Compiler& compiler() {
  static const Compiler* c = [] {
    auto r = Compiler::create(tokenizer::v41_tokenizer(), kVocab, kEos);
    FB_CHECK(r.ok()) << r.status().to_string();
    return r.value().release();
  }();
  return *c;
}

bool bit(const std::vector<uint32_t>& b, int32_t t) { return (b[size_t(t / 32)] >> (t % 32)) & 1u; }

ResponseFormat schema_format(const char* schema, bool strict = true) {
  ResponseFormat f;
  f.kind = ResponseFormat::Kind::kJsonSchema;
  f.schema = ojson::parse(schema);
  f.strict = strict;
  return f;
}

// The text as the model would emit it (the tokenizer's ids), each token accepted, then EOS allowed.
bool complete_value(const ResponseFormat& f, const std::string& text) {
  auto c = compiler().compile(f);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  if (!c.ok()) return false;
  for (int32_t t : tokenizer::v41_tokenizer().encode(text))
    if (!(*c)->accept(t)) return false;
  std::vector<uint32_t> bits;
  (*c)->allowed({}, &bits);
  return bit(bits, kEos);
}

bool schema_accepts(const char* schema, const std::string& text, bool strict = true) {
  return complete_value(schema_format(schema, strict), text);
}

TEST(GrammarJson, ObjectAcceptsValidJsonOnly) {
  ResponseFormat obj;
  EXPECT_TRUE(complete_value(obj, R"({"a": [1, -2.5e3, true, false, null, "x\"y\\u00e9"], "b": {"c": {}}})"));
  EXPECT_TRUE(complete_value(obj, R"({"k": "héllo 世界"})"));
  EXPECT_FALSE(complete_value(obj, "{\n  \"k\": 1\n}"));  // [policy] one layout: single line, ", " and ": "
  EXPECT_TRUE(complete_value(obj, "{}"));
  EXPECT_FALSE(complete_value(obj, R"({"a": })"));
  EXPECT_FALSE(complete_value(obj, R"({"a": 1,})"));
  EXPECT_FALSE(complete_value(obj, R"({'a': 1})"));
  EXPECT_FALSE(complete_value(obj, R"({"a": 01})"));
  EXPECT_FALSE(complete_value(obj, R"({"a": tru})"));
  EXPECT_FALSE(complete_value(obj, "[1, 2]"));          // json_object is an object
  EXPECT_FALSE(complete_value(obj, R"({"a": 1)"));      // incomplete: EOS not allowed yet
  EXPECT_FALSE(complete_value(obj, R"({"a": 1}} )"));
  EXPECT_FALSE(complete_value(obj, "{\"a\": \"line\nbreak\"}"));  // raw control character in a string
}

TEST(GrammarSchema, EnforcesEachSupportedKeyword) {
  const char* person = R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
      "tags":{"type":"array","items":{"type":"string"}},"ok":{"type":"boolean"},"x":{"type":"null"},"w":{"type":"number"}},
      "required":["name","age"],"additionalProperties":false})";
  EXPECT_TRUE(schema_accepts(person, R"({"name": "Ann", "age": 31, "tags": ["a", "b"], "ok": true, "x": null, "w": 1.5})"));
  EXPECT_TRUE(schema_accepts(person, R"({"name": "Ann", "age": 31})"));
  EXPECT_FALSE(schema_accepts(person, R"({"name": "Ann"})"));                 // required
  EXPECT_FALSE(schema_accepts(person, R"({"name": "Ann", "age": 3.5})"));     // integer
  EXPECT_FALSE(schema_accepts(person, R"({"name": 7, "age": 3})"));           // string
  EXPECT_FALSE(schema_accepts(person, R"({"name": "A", "age": 3, "z": 1})")); // additionalProperties false
  EXPECT_FALSE(schema_accepts(person, R"({"name": "A", "age": 3, "tags": [1]})"));  // items
  EXPECT_FALSE(schema_accepts(person, R"({"name": "A", "age": 3, "ok": "yes"})"));  // boolean
  EXPECT_FALSE(schema_accepts(person, R"({"name": "A", "age": 3, "x": 0})"));       // null
  // strict off: extra members where the schema does not forbid them.
  const char* open = R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})";
  EXPECT_TRUE(schema_accepts(open, R"({"a": 1, "b": [true]})", false));
  EXPECT_FALSE(schema_accepts(open, R"({"a": 1, "b": [true]})", true));
  EXPECT_TRUE(schema_accepts(R"({"enum":["red","green",3]})", R"("green")"));
  EXPECT_TRUE(schema_accepts(R"({"enum":["red","green",3]})", "3"));
  EXPECT_FALSE(schema_accepts(R"({"enum":["red","green",3]})", R"("blue")"));
  // const and enum values are emitted in their compact serialization (one spelling of the value).
  EXPECT_TRUE(schema_accepts(R"({"const":{"k":[1,2]}})", R"({"k":[1,2]})"));
  EXPECT_FALSE(schema_accepts(R"({"const":{"k":[1,2]}})", R"({"k":[1,3]})"));
  EXPECT_TRUE(schema_accepts(R"({"anyOf":[{"type":"integer"},{"type":"string"}]})", R"("s")"));
  EXPECT_FALSE(schema_accepts(R"({"anyOf":[{"type":"integer"},{"type":"string"}]})", "true"));
  EXPECT_TRUE(schema_accepts(R"({"type":["integer","null"]})", "null"));
  EXPECT_FALSE(schema_accepts(R"({"type":["integer","null"]})", "1.5"));
  const char* arr = R"({"type":"array","items":{"type":"integer","minimum":-3,"maximum":12},"minItems":2,"maxItems":3})";
  EXPECT_TRUE(schema_accepts(arr, "[1, 12]"));
  EXPECT_TRUE(schema_accepts(arr, "[-3, 0, 5]"));
  EXPECT_FALSE(schema_accepts(arr, "[1]"));
  EXPECT_FALSE(schema_accepts(arr, "[1, 2, 3, 4]"));
  EXPECT_FALSE(schema_accepts(arr, "[1, 13]"));
  EXPECT_FALSE(schema_accepts(arr, "[-4, 1]"));
  const char* str = R"({"type":"string","minLength":2,"maxLength":4})";
  EXPECT_TRUE(schema_accepts(str, R"("ab")"));
  EXPECT_TRUE(schema_accepts(str, R"("abcd")"));
  EXPECT_FALSE(schema_accepts(str, R"("a")"));
  EXPECT_FALSE(schema_accepts(str, R"("abcde")"));
  const char* refs = R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},
      "required":["v"],"additionalProperties":false}},"$ref":"#/$defs/node"})";
  EXPECT_TRUE(schema_accepts(refs, R"({"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]})"));
  EXPECT_FALSE(schema_accepts(refs, R"({"v": 1, "kids": [{"kids": []}]})"));
  EXPECT_TRUE(schema_accepts(R"({"type":"object","title":"T","description":"d","properties":{"a":{"type":"string","default":"x"}},"required":["a"]})",
                             R"({"a": "y"})"));
}

TEST(GrammarSchema, RefusesWhatItCannotEnforceNamingIt) {
  auto err = [](const char* schema) {
    auto r = compiler().compile(schema_format(schema));
    EXPECT_FALSE(r.ok()) << schema;
    return r.ok() ? std::string() : r.status().to_string();
  };
  EXPECT_NE(err(R"({"type":"string","pattern":"^a+$"})").find("'pattern'"), std::string::npos);
  EXPECT_NE(err(R"({"type":"object","properties":{"a":{"not":{"type":"null"}}}})").find("/properties/a"), std::string::npos);
  EXPECT_NE(err(R"({"oneOf":[{"type":"integer"}]})").find("'oneOf'"), std::string::npos);
  EXPECT_NE(err(R"({"type":"string","format":"date-time"})").find("'format'"), std::string::npos);
  EXPECT_NE(err(R"({"type":"array","uniqueItems":true})").find("'uniqueItems'"), std::string::npos);
  EXPECT_NE(err(R"({"type":"strnig"})").find("'type'"), std::string::npos);
  EXPECT_NE(err(R"({"enum":[]})").find("'enum'"), std::string::npos);
  EXPECT_NE(err(R"({"type":"integer","minimum":5,"maximum":3})").find("'minimum'"), std::string::npos);
  EXPECT_NE(err(R"({"$ref":"#/$defs/missing"})").find("names nothing"), std::string::npos);
  EXPECT_NE(err(R"({"$ref":"http://example.com/s.json"})").find("'$ref'"), std::string::npos);
  EXPECT_NE(err(R"({"type":"object","required":["b"],"properties":{"a":{}},"additionalProperties":false})").find("'b'"), std::string::npos);
  EXPECT_NE(err(R"(false)").find("admits no value"), std::string::npos);
  EXPECT_NE(err(R"({"type":"integer","minimum":0.2,"maximum":0.7})").find("schema"), std::string::npos);  // no integer in range
  EXPECT_TRUE(check_schema(ojson::parse(R"({"type":"object","properties":{}})")).ok());
}

// The mask of a state, checked id by id against accepting that id (all 129,280 of them).
void expect_mask_matches_recognizer(engine::TokenConstraint& c) {
  std::vector<uint32_t> bits;
  c.allowed({}, &bits);
  ASSERT_GE(int64_t(bits.size()) * 32, kVocab);
  int64_t n_allowed = 0;
  for (int32_t t = 0; t < kVocab; ++t) {
    const bool ok = c.accept(t);
    if (ok) c.rollback(1);
    ASSERT_EQ(ok, bit(bits, t)) << "token " << t << " '" << tokenizer::v41_tokenizer().token_bytes(t) << "'";
    n_allowed += ok;
  }
  EXPECT_GT(n_allowed, 0);
}

TEST(GrammarMask, EqualsTheRecognizerOnTheRealVocabulary) {
  const auto& tok = tokenizer::v41_tokenizer();
  auto c = compiler().compile(schema_format(R"({"type":"object","properties":{"name":{"type":"string"},"n":{"type":"integer"}},"required":["name","n"]})"));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  std::vector<uint32_t> bits;
  (*c)->allowed({}, &bits);
  EXPECT_FALSE(bit(bits, kEos));  // nothing generated: EOS not allowed
  for (int32_t t = 0; t < tok.vocab_size(); ++t)
    if (tok.is_special(t) || tok.is_added(t)) EXPECT_FALSE(bit(bits, t)) << "markup token " << t;
  expect_mask_matches_recognizer(**c);  // at the start
  for (int32_t t : tok.encode(R"({"name": "Bo)")) ASSERT_TRUE((*c)->accept(t));
  expect_mask_matches_recognizer(**c);  // inside a string
  for (int32_t t : tok.encode(R"(b", "n": 4)")) ASSERT_TRUE((*c)->accept(t));
  expect_mask_matches_recognizer(**c);  // inside a number, the object completable
  for (int32_t t : tok.encode("}")) ASSERT_TRUE((*c)->accept(t));
  (*c)->allowed({}, &bits);
  EXPECT_TRUE(bit(bits, kEos));
  int64_t n = 0;
  for (uint32_t w : bits) n += __builtin_popcount(w);
  EXPECT_EQ(n, 1) << "after the value only EOS";
}

// Found by the 100-seed tiny-model run: a raw control byte inside a string is invalid JSON, so no
// token carrying one may be allowed there (nor anywhere in the value).
TEST(GrammarMask, NoControlBytesInsideStrings) {
  const auto& tok = tokenizer::v41_tokenizer();
  auto c = compiler().compile(schema_format(R"({"type":"object","properties":{"name":{"type":"string","maxLength":8}},"required":["name"]})"));
  ASSERT_TRUE(c.ok());
  for (int32_t t : tok.encode(R"({"name": "ab)")) ASSERT_TRUE((*c)->accept(t));
  std::vector<uint32_t> bits;
  (*c)->allowed({}, &bits);
  int64_t n_allowed = 0;
  for (int32_t t = 0; t < tok.vocab_size(); ++t) {
    if (!bit(bits, t)) continue;
    ++n_allowed;
    for (unsigned char ch : tok.token_bytes(t)) EXPECT_GE(ch, 0x20) << "token " << t << " carries control byte " << int(ch);
  }
  EXPECT_GT(n_allowed, 1000);
}

TEST(GrammarMask, DraftsGiveTheMaskOfEmittedTokens) {
  const auto& tok = tokenizer::v41_tokenizer();
  auto c = compiler().compile(schema_format(R"({"type":"array","items":{"type":"integer"}})"));
  ASSERT_TRUE(c.ok());
  const std::vector<int32_t> toks = tok.encode("[12, 3");
  std::vector<uint32_t> after_drafts, after_emit, start, again;
  (*c)->allowed({}, &start);
  (*c)->allowed(toks, &after_drafts);
  (*c)->allowed({}, &again);
  EXPECT_EQ(start, again);  // drafts leave no trace
  for (int32_t t : toks) ASSERT_TRUE((*c)->accept(t));
  (*c)->allowed({}, &after_emit);
  EXPECT_EQ(after_drafts, after_emit);
  EXPECT_NE(start, after_emit);
  (*c)->rollback(int(toks.size()));
  (*c)->allowed({}, &again);
  EXPECT_EQ(start, again);
  // After EOS a DSpark block may hold more tokens: accepted, and the mask is EOS alone.
  for (int32_t t : tok.encode("[1]")) ASSERT_TRUE((*c)->accept(t));
  ASSERT_TRUE((*c)->accept(kEos));
  EXPECT_TRUE((*c)->accept(tok.encode("x")[0]));
  (*c)->allowed({}, &again);
  EXPECT_TRUE(bit(again, kEos));
}

TEST(GrammarMask, ThinkingRunsFreeUntilTheReasoningEnds) {
  const auto& tok = tokenizer::v41_tokenizer();
  ResponseFormat f = schema_format(R"({"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"]})");
  f.after_reasoning = true;
  auto c = compiler().compile(f);
  ASSERT_TRUE(c.ok());
  std::vector<uint32_t> bits;
  (*c)->allowed({}, &bits);
  EXPECT_FALSE(bit(bits, kEos));  // no answer yet
  for (int32_t t : tok.encode("Let me think [not json] {")) ASSERT_TRUE((*c)->accept(t));
  const int32_t think_end = tok.token_id("</think>");
  ASSERT_GE(think_end, 0);
  ASSERT_TRUE((*c)->accept(think_end));
  EXPECT_FALSE((*c)->accept(tok.encode("x")[0]));
  for (int32_t t : tok.encode(R"({"a": false})")) ASSERT_TRUE((*c)->accept(t));
  (*c)->allowed({}, &bits);
  EXPECT_TRUE(bit(bits, kEos));
  (*c)->rollback(int(tok.encode(R"({"a": false})").size()) + 1);  // back into the reasoning
  (*c)->allowed({}, &bits);
  EXPECT_TRUE(bit(bits, tok.encode("x")[0]));
}

// The per-token cost of a mask on the released vocabulary: the grammar's bitmask plus applying it
// to a logits row (what Generator::processed_row does), over a realistic document.
TEST(GrammarMask, CostPerToken) {
  const auto& tok = tokenizer::v41_tokenizer();
  auto c = compiler().compile(schema_format(R"({"type":"object","properties":{"city":{"type":"string"},"days":{"type":"array","items":{"type":"object",
      "properties":{"date":{"type":"string"},"high_c":{"type":"number"},"rain":{"type":"boolean"}},"required":["date","high_c","rain"],
      "additionalProperties":false}}},"required":["city","days"],"additionalProperties":false})"));
  ASSERT_TRUE(c.ok());
  std::string doc = R"({"city": "Lisbon, Portugal", "days": [)";
  for (int i = 0; i < 12; ++i) doc += std::string(i ? ", " : "") + R"({"date": "2026-12-0)" + std::to_string(i % 9 + 1) + R"(", "high_c": 17.5, "rain": false})";
  doc += "]}";
  const std::vector<int32_t> toks = tok.encode(doc);
  std::vector<uint32_t> bits;
  std::vector<float> row(size_t(kVocab), 0.5f);
  using clk = std::chrono::steady_clock;
  double mask_us = 0, apply_us = 0;
  for (int32_t t : toks) {
    const auto a = clk::now();
    (*c)->allowed({}, &bits);
    const auto b = clk::now();
    for (int64_t w = 0; w * 32 < kVocab; ++w)
      if (bits[size_t(w)] != 0xffffffffu)
        for (int64_t i = w * 32; i < std::min<int64_t>(kVocab, w * 32 + 32); ++i)
          if (!((bits[size_t(w)] >> (i - w * 32)) & 1u)) row[size_t(i)] = -1e30f;
    const auto e = clk::now();
    mask_us += std::chrono::duration<double, std::micro>(b - a).count();
    apply_us += std::chrono::duration<double, std::micro>(e - b).count();
    ASSERT_TRUE(bit(bits, t)) << "the document's own token " << t << " is masked";
    ASSERT_TRUE((*c)->accept(t));
  }
  std::printf("mask cost over %zu tokens, vocab %lld: grammar bitmask %.1f us/token, applied to a logits row %.1f us/token\n", toks.size(),
              (long long)kVocab, mask_us / double(toks.size()), apply_us / double(toks.size()));
}

// ---- Tool calls (tool_choice forcing, strict tools): the DSML syntax of spec/15 §8.1 ----

const char* kWeatherParams = R"({"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer","minimum":1,"maximum":7},
  "units":{"enum":["c","f"]}},"required":["city","days"]})";

ToolCallFormat weather_tools(ToolCallFormat::Choice choice, bool strict = true) {
  ToolCallFormat f;
  f.choice = choice;
  f.tools.push_back({"get_weather", ojson::parse(kWeatherParams), strict});
  f.tools.push_back({"get_time", ojson::parse(R"({"type":"object","properties":{"tz":{"type":"string"}}})"), strict});
  if (choice == ToolCallFormat::Choice::kNamed) f.name = "get_weather";
  return f;
}

std::string param(const std::string& k, bool str, const std::string& v) {
  return "<｜DSML｜ parameter name=\"" + k + "\" string=\"" + (str ? "true" : "false") + "\">" + v + "</｜DSML｜ parameter>";
}
std::string invoke(const std::string& name, const std::vector<std::string>& params) {
  std::string s = "<｜DSML｜ invoke name=\"" + name + "\">\n";
  for (size_t i = 0; i < params.size(); ++i) s += params[i] + "\n";
  return s + "</｜DSML｜ invoke>";
}
// The block as the V4.1 encoder writes it (spec/15 §8.1): invokes joined by "\n".
std::string block(const std::vector<std::string>& invokes) {
  std::string s = "\n\n<｜DSML｜ calls>\n";
  for (size_t i = 0; i < invokes.size(); ++i) s += (i ? "\n" : "") + invokes[i];
  return s + "\n</｜DSML｜ calls>";
}

// Every token of the text (the tokenizer's ids: the DSML marker is its own token) accepted, then
// EOS allowed: the text is a complete output under the format.
bool tool_output(const ToolCallFormat& f, const std::string& text) {
  auto c = compiler().compile(f);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  if (!c.ok() || !*c) return false;
  for (int32_t t : tokenizer::v41_tokenizer().encode(text))
    if (!(*c)->accept(t)) return false;
  std::vector<uint32_t> bits;
  (*c)->allowed({}, &bits);
  return bit(bits, kEos);
}

TEST(GrammarToolCalls, NamedToolForcesOneConformingCall) {
  const auto f = weather_tools(ToolCallFormat::Choice::kNamed);
  EXPECT_TRUE(tool_output(f, block({invoke("get_weather", {param("city", true, "Paris"), param("days", false, "2")})})));
  EXPECT_TRUE(tool_output(f, block({invoke("get_weather", {param("city", true, "New\nYork <b>"), param("days", false, "7"), param("units", true, "f")})})));
  EXPECT_FALSE(tool_output(f, "Sure." + block({invoke("get_weather", {param("city", true, "Paris"), param("days", false, "2")})})))
      << "no text before the call";
  EXPECT_FALSE(tool_output(f, block({invoke("get_time", {param("tz", true, "UTC")})}))) << "another tool";
  EXPECT_FALSE(tool_output(f, block({invoke("get_weather", {param("city", true, "Paris")})}))) << "a required parameter missing";
  EXPECT_FALSE(tool_output(f, block({invoke("get_weather", {param("city", true, "Paris"), param("days", false, "9")})}))) << "maximum";
  EXPECT_FALSE(tool_output(f, block({invoke("get_weather", {param("city", true, "Paris"), param("days", false, "\"2\"")})}))) << "type";
  EXPECT_FALSE(tool_output(f, block({invoke("get_weather", {param("city", true, "Paris"), param("days", false, "2"), param("units", true, "k")})})))
      << "enum";
  EXPECT_FALSE(tool_output(f, block({invoke("get_weather", {param("city", true, "Paris"), param("days", false, "2")}),
                                     invoke("get_weather", {param("city", true, "Rome"), param("days", false, "1")})})))
      << "one call";
  EXPECT_FALSE(tool_output(f, "")) << "nothing is not a call";
}

TEST(GrammarToolCalls, RequiredAllowsAnyToolAndParallelCalls) {
  auto f = weather_tools(ToolCallFormat::Choice::kRequired);
  const std::string w = invoke("get_weather", {param("city", true, "Oslo"), param("days", false, "3")});
  const std::string t = invoke("get_time", {param("tz", true, "Europe/Oslo")});
  EXPECT_TRUE(tool_output(f, block({w})));
  EXPECT_TRUE(tool_output(f, block({t})));
  EXPECT_TRUE(tool_output(f, block({invoke("get_time", {})}))) << "no parameters: tz is optional";
  EXPECT_TRUE(tool_output(f, block({w, t})));
  EXPECT_FALSE(tool_output(f, "I will not call a tool."));
  EXPECT_FALSE(tool_output(f, block({invoke("get_news", {})})));
  f.parallel = false;
  EXPECT_TRUE(tool_output(f, block({w})));
  EXPECT_FALSE(tool_output(f, block({w, t})));
}

TEST(GrammarToolCalls, AutoWithStrictToolsLeavesTextFreeAndConstrainsCalls) {
  const auto f = weather_tools(ToolCallFormat::Choice::kAuto);
  const std::string w = invoke("get_weather", {param("city", true, "Oslo"), param("days", false, "3")});
  EXPECT_TRUE(tool_output(f, "It is sunny, no tool needed."));
  EXPECT_TRUE(tool_output(f, "Let me check." + block({w})));
  EXPECT_TRUE(tool_output(f, block({w})));
  EXPECT_FALSE(tool_output(f, "Let me check." + block({invoke("get_weather", {param("city", true, "Oslo"), param("days", false, "30")})})));
  EXPECT_FALSE(tool_output(f, "Let me check." + block({invoke("get_news", {})})));
  EXPECT_FALSE(tool_output(f, "Let me check." + block({w}) + " Done.")) << "the turn ends after the block";
  // A non-strict tool beside a strict one: its name is checked, its arguments are free.
  auto mixed = f;
  mixed.tools[1].strict = false;
  EXPECT_TRUE(tool_output(mixed, block({invoke("get_time", {param("anything", false, "[1, 2]")})})));
  EXPECT_FALSE(tool_output(mixed, block({invoke("get_weather", {param("city", true, "Oslo")})})));
  // No strict tool: nothing to enforce.
  auto c = compiler().compile(weather_tools(ToolCallFormat::Choice::kAuto, false));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, nullptr);
}

// response_format with tools under tool_choice auto: the answer is the JSON value (validating
// against the schema) or one calls block, nothing else; the schema's own 400s still name it; a
// forced choice ignores the answer format (the answer is the call).
TEST(GrammarToolCalls, AnswerFormatOrACall) {
  auto f = weather_tools(ToolCallFormat::Choice::kAuto, /*strict=*/false);
  f.answer = schema_format(R"({"type":"object","properties":{"temp":{"type":"number"},"sky":{"enum":["sun","rain"]}},"required":["temp"]})", false);
  const std::string w = invoke("get_weather", {param("city", true, "Oslo"), param("days", false, "3")});
  EXPECT_TRUE(tool_output(f, R"({"temp": 21.5, "sky": "sun"})"));
  EXPECT_TRUE(tool_output(f, R"({"temp": -3})"));
  EXPECT_TRUE(tool_output(f, block({w})));
  EXPECT_TRUE(tool_output(f, block({invoke("get_weather", {param("anything", true, "x")})}))) << "non-strict tool: free arguments";
  EXPECT_FALSE(tool_output(f, R"({"sky": "sun"})")) << "required";
  EXPECT_FALSE(tool_output(f, R"({"temp": "warm"})")) << "type";
  EXPECT_FALSE(tool_output(f, "It is warm.")) << "free text is not the value";
  EXPECT_FALSE(tool_output(f, "Let me check." + block({w}))) << "no text before the call";
  EXPECT_FALSE(tool_output(f, R"({"temp": 1})" + block({w}))) << "the value, then the turn ends";
  EXPECT_FALSE(tool_output(f, block({invoke("get_news", {})})));
  EXPECT_FALSE(tool_output(f, "{\n\"temp\": 1}")) << "the value's one layout, as response_format alone";
  EXPECT_TRUE(tool_output(f, R"({"temp": 1, "extra": true})")) << "strict false: members beyond properties allowed";
  auto s = f;
  s.answer->strict = true;
  EXPECT_FALSE(tool_output(s, R"({"temp": 1, "extra": true})")) << "strict true: none";
  // Strict tools stay constrained beside the answer format.
  auto g = weather_tools(ToolCallFormat::Choice::kAuto, /*strict=*/true);
  g.answer = f.answer;
  EXPECT_TRUE(tool_output(g, block({w})));
  EXPECT_FALSE(tool_output(g, block({invoke("get_weather", {param("city", true, "Oslo"), param("days", false, "30")})})));
  // json_object: any object.
  auto o = weather_tools(ToolCallFormat::Choice::kAuto, false);
  o.answer = ResponseFormat();
  EXPECT_TRUE(tool_output(o, R"({"a": [1, {"b": null}], "c": "d"})"));
  EXPECT_FALSE(tool_output(o, "[1]"));
  // Thinking: the reasoning is free, then the value or a call; the answer is not optional here.
  auto t = f;
  t.after_reasoning = true;
  EXPECT_TRUE(tool_output(t, "hmm</think>" + std::string(R"({"temp": 4})")));
  EXPECT_TRUE(tool_output(t, "hmm</think>" + block({w})));
  EXPECT_FALSE(tool_output(t, "only reasoning"));
  // The schema's errors name the response_format, not the tools.
  auto bad = f;
  bad.answer = schema_format(R"({"type":"string","pattern":"a+"})");
  auto c = compiler().compile(bad);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("pattern"), std::string::npos) << c.status().message();
  bad.answer = schema_format(R"({"type":"integer","minimum":2,"maximum":1})");
  c = compiler().compile(bad);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("response_format"), std::string::npos) << c.status().message();
  // Forced: the answer format is not applied (the output is the call).
  auto forced = weather_tools(ToolCallFormat::Choice::kNamed);
  forced.answer = f.answer;
  EXPECT_TRUE(tool_output(forced, block({w})));
  EXPECT_FALSE(tool_output(forced, R"({"temp": 1})"));
}

TEST(GrammarToolCalls, ThinkingRunsFreeThenTheCall) {
  auto f = weather_tools(ToolCallFormat::Choice::kNamed);
  f.after_reasoning = true;
  EXPECT_TRUE(tool_output(f, "The user wants weather { not a call }</think>" + block({invoke("get_weather", {param("city", true, "Lima"), param("days", false, "1")})})));
  EXPECT_FALSE(tool_output(f, "No call</think>Sunny."));
  EXPECT_FALSE(tool_output(f, "Only reasoning")) << "a forced call must follow the reasoning";
  // Under auto (strict tools) the answer may be empty, so EOS may end the reasoning as it may
  // unconstrained; after it only EOS (a DSpark block may hold more tokens).
  auto a = weather_tools(ToolCallFormat::Choice::kAuto);
  a.after_reasoning = true;
  EXPECT_TRUE(tool_output(a, "Only reasoning"));
  EXPECT_TRUE(tool_output(a, "Thought</think>Answer."));
  auto c = compiler().compile(a);
  ASSERT_TRUE(c.ok());
  const auto& tok = tokenizer::v41_tokenizer();
  ASSERT_TRUE((*c)->accept(tok.encode("x")[0]));
  ASSERT_TRUE((*c)->accept(kEos));
  EXPECT_TRUE((*c)->accept(tok.encode("y")[0]));
  std::vector<uint32_t> bits;
  (*c)->allowed({}, &bits);
  EXPECT_TRUE(bit(bits, kEos));
  EXPECT_FALSE(bit(bits, tok.encode("y")[0]));
  (*c)->rollback(2);
  (*c)->allowed({}, &bits);
  EXPECT_TRUE(bit(bits, tok.encode("y")[0])) << "rolled back into the reasoning";
}

TEST(GrammarToolCalls, RefusesWhatItCannotEnforceNamingIt) {
  auto named = weather_tools(ToolCallFormat::Choice::kNamed);
  named.name = "get_news";
  auto r = compiler().compile(named);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'get_news'"), std::string::npos) << r.status().message();
  auto pattern = weather_tools(ToolCallFormat::Choice::kRequired);
  pattern.tools[1].parameters = ojson::parse(R"({"type":"object","properties":{"tz":{"type":"string","pattern":"^[A-Z]+$"}}})");
  r = compiler().compile(pattern);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tool 'get_time' parameters schema at '/properties/tz'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("'pattern'"), std::string::npos) << r.status().message();
  auto scalar = weather_tools(ToolCallFormat::Choice::kRequired);
  scalar.tools[0].parameters = ojson::parse(R"({"type":"string"})");
  r = compiler().compile(scalar);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("object schema"), std::string::npos) << r.status().message();
  auto quote = weather_tools(ToolCallFormat::Choice::kRequired);
  quote.tools[0].name = "say\"hi";
  EXPECT_FALSE(compiler().compile(quote).ok());
  ToolCallFormat empty;
  empty.choice = ToolCallFormat::Choice::kRequired;
  EXPECT_FALSE(compiler().compile(empty).ok());
  // A non-strict tool under auto is not checked (nothing of it is enforced).
  auto lax = weather_tools(ToolCallFormat::Choice::kAuto);
  lax.tools[1] = {"get_time", ojson::parse(R"({"type":"object","properties":{"tz":{"type":"string","pattern":"^[A-Z]+$"}}})"), false};
  EXPECT_TRUE(compiler().compile(lax).ok());
}

// The markers never leak into values: the DSML token is allowed at the structure's places only,
// and response_format grammars never allow it.
TEST(GrammarToolCalls, DsmlTokenOnlyWhereTheSyntaxHasIt) {
  const auto& tok = tokenizer::v41_tokenizer();
  const int32_t dsml = tok.token_id("｜DSML｜");
  ASSERT_GE(dsml, 0);
  auto c = compiler().compile(weather_tools(ToolCallFormat::Choice::kNamed));
  ASSERT_TRUE(c.ok());
  std::vector<uint32_t> bits;
  for (int32_t t : tok.encode("\n\n<")) ASSERT_TRUE((*c)->accept(t));
  (*c)->allowed({}, &bits);
  EXPECT_TRUE(bit(bits, dsml));
  for (int32_t t : tok.encode("｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ parameter name=\"city\" string=\"true\">Pa"))
    ASSERT_TRUE((*c)->accept(t));
  (*c)->allowed({}, &bits);
  EXPECT_FALSE(bit(bits, dsml)) << "inside a raw string value";
  EXPECT_FALSE(bit(bits, kEos));
  auto j = compiler().compile(ResponseFormat{});
  ASSERT_TRUE(j.ok());
  for (int32_t t : tok.encode(R"({"a": "x)")) ASSERT_TRUE((*j)->accept(t));
  (*j)->allowed({}, &bits);
  EXPECT_FALSE(bit(bits, dsml));
}

TEST(GrammarToolCalls, CostPerToken) {
  const auto& tok = tokenizer::v41_tokenizer();
  for (auto choice : {ToolCallFormat::Choice::kNamed, ToolCallFormat::Choice::kAuto}) {
    auto c = compiler().compile(weather_tools(choice));
    ASSERT_TRUE(c.ok());
    const std::string text = (choice == ToolCallFormat::Choice::kAuto ? std::string("I will look up the weather for you in Oslo now.") : std::string()) +
                             block({invoke("get_weather", {param("city", true, "Oslo, Norway"), param("days", false, "3"), param("units", true, "c")})});
    const std::vector<int32_t> toks = tok.encode(text);
    std::vector<uint32_t> bits;
    double us = 0;
    for (int32_t t : toks) {
      const auto a = std::chrono::steady_clock::now();
      (*c)->allowed({}, &bits);
      us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count();
      ASSERT_TRUE(bit(bits, t)) << "token " << t << " '" << tok.token_bytes(t) << "' masked";
      ASSERT_TRUE((*c)->accept(t));
    }
    std::printf("tool-call mask (%s) over %zu tokens: %.1f us/token\n", choice == ToolCallFormat::Choice::kAuto ? "auto, strict" : "named",
                toks.size(), us / double(toks.size()));
  }
}

}  // namespace
}  // namespace fb::grammar
