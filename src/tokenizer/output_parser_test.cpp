// Output parser: reasoning/text/tool-call split, typed parameters, streaming hold-back of the
// DSML opening, malformed and unterminated DSML falling back to text.
#include "tokenizer/output_parser.h"

#include <gtest/gtest.h>

namespace fb::tokenizer {
namespace {

using Kind = OutputEvent::Kind;

const std::string kCall =
    "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ parameter name=\"city\" "
    "string=\"true\">Paris</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"days\" string=\"false\">3</｜DSML｜ "
    "parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>";

// The one event that `text` parses to; any other count fails the calling test (and gives an
// empty event, so its later checks fail too).
OutputEvent only_event(const std::string& text, bool thinking = false) {
  const auto ev = parse_output(text, thinking);
  EXPECT_EQ(ev.size(), 1u) << text;
  return ev.size() == 1 ? ev[0] : OutputEvent{};
}

TEST(OutputParser, ThinkingTextAndCall) {
  const auto ev = parse_output("Need weather.</think>Let me check." + kCall, true);
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0].kind, Kind::kReasoning);
  EXPECT_EQ(ev[0].text, "Need weather.");
  EXPECT_EQ(ev[1].kind, Kind::kText);
  EXPECT_EQ(ev[1].text, "Let me check.");
  ASSERT_EQ(ev[2].kind, Kind::kToolCall);
  EXPECT_EQ(ev[2].call.name, "get_weather");
  EXPECT_EQ(ev[2].call.arguments, "{\"city\": \"Paris\", \"days\": 3}");
  ASSERT_EQ(ev[2].call.params.size(), 2u);
  EXPECT_TRUE(ev[2].call.params[0].value.is_string());
  EXPECT_TRUE(ev[2].call.params[1].value.is_number_integer());
  EXPECT_TRUE(ev[2].call.valid_json);
}

TEST(OutputParser, StreamingHoldsBackBlockOpening) {
  OutputParser p(false);
  std::string text;
  int calls = 0;
  for (char c : "Answer." + kCall) {
    for (const auto& e : p.feed(std::string(1, c))) {
      if (e.kind == Kind::kText) text += e.text;
      if (e.kind == Kind::kToolCall) ++calls;
    }
  }
  for (const auto& e : p.finish()) EXPECT_NE(e.kind, Kind::kText);
  EXPECT_EQ(text, "Answer.");  // no "\n\n" and no DSML leaked
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(p.saw_eos());
  // "\n\n" followed by ordinary text is released.
  OutputParser q(false);
  std::string t2;
  for (const auto& e : q.feed("a\n\n")) t2 += e.text;
  EXPECT_EQ(t2, "a");
  for (const auto& e : q.feed("b")) t2 += e.text;
  EXPECT_EQ(t2, "a\n\nb");
}

TEST(OutputParser, MultipleInvokesAndMultilineValues) {
  const std::string s =
      "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"write\">\n<｜DSML｜ parameter name=\"code\" string=\"true\">int main() {\n"
      "  return a < b;\n}</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n<｜DSML｜ invoke name=\"ls\">\n</｜DSML｜ invoke>\n</｜DSML｜ "
      "calls>";
  const auto ev = parse_output(s, false);
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].call.params[0].raw, "int main() {\n  return a < b;\n}");
  EXPECT_EQ(ev[1].call.name, "ls");
  EXPECT_EQ(ev[1].call.arguments, "{}");
}

TEST(OutputParser, InvalidJsonValueIsFlagged) {
  const OutputEvent e = only_event(
      "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"x\" string=\"false\">[1,</｜DSML｜ "
      "parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>");
  EXPECT_FALSE(e.call.valid_json);
  ASSERT_EQ(e.call.params.size(), 1u);
  EXPECT_EQ(e.call.params[0].value, "[1,");
}

TEST(OutputParser, MalformedFallsBackToText) {
  // Bad attribute, then unterminated block: everything is plain text, nothing is lost.
  const std::string bad = "Hi\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke nam=\"f\">\n</｜DSML｜ invoke>";
  const OutputEvent e = only_event(bad);
  EXPECT_EQ(e.kind, Kind::kText);
  EXPECT_EQ(e.text, bad);
  const std::string open = "x\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" string=\"true\">v";
  EXPECT_EQ(only_event(open).text, open);
  // Duplicate parameter names are malformed.
  const auto ev = parse_output(
      "<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" string=\"true\">1</｜DSML｜ "
      "parameter>\n<｜DSML｜ parameter name=\"a\" string=\"true\">2</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>",
      false);
  for (const auto& e : ev) EXPECT_NE(e.kind, Kind::kToolCall);
}

TEST(OutputParser, LenientV4AndAsciiTags) {
  const OutputEvent e = only_event(
      "<|DSML|tool_calls>\n<|DSML|invoke name=\"f\">\n<|DSML|parameter name=\"a\" string=\"true\">1</|DSML|parameter>\n"
      "</|DSML|invoke>\n</|DSML|tool_calls>");
  EXPECT_EQ(e.call.arguments, "{\"a\": \"1\"}");
}

TEST(OutputParser, MissingThinkEndStaysReasoning) {
  EXPECT_EQ(only_event("still thinking <｜DSML｜ calls>", true).kind, Kind::kReasoning);
}

}  // namespace
}  // namespace fb::tokenizer
