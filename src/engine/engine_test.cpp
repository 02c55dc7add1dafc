// Engine with the scripted executor and the real V4.1 tokenizer: the request/event contract
// (reasoning, text, tool calls, usage, finish reasons), stop strings across tokens, max_tokens,
// logprobs, validation errors, cancellation.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include "engine/scripted_executor.h"
#include "tokenizer/test_assets.h"

namespace fb::engine {
namespace {

using tokenizer::v41_tokenizer;

std::vector<Event> collect(Engine& e, Request r) {
  EventQueue q;
  auto id = e.submit(std::move(r), q.sink());
  EXPECT_TRUE(id.ok()) << id.status().to_string();
  std::vector<Event> out;
  Event ev;
  while (q.pop(&ev, 10000)) {
    out.push_back(ev);
    if (ev.kind == Event::Kind::kDone || ev.kind == Event::Kind::kError) break;
  }
  return out;
}

std::string join(const std::vector<Event>& evs, Event::Kind k) {
  std::string s;
  for (auto& e : evs)
    if (e.kind == k) s += e.text;
  return s;
}

std::unique_ptr<Engine> make(std::vector<std::string> scripts) {
  const auto& tok = v41_tokenizer();
  std::vector<std::vector<int32_t>> ids;
  for (auto& s : scripts) ids.push_back(tok.encode(s));
  return std::make_unique<Engine>(std::make_unique<ScriptedExecutor>(tok.vocab_size(), ids, 4096), tok, EngineOptions{});
}

Request req(bool thinking = false) {
  Request r;
  r.prompt = v41_tokenizer().encode("<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜></think>");
  r.sampling.temperature = 0;
  r.thinking = thinking;
  return r;
}

TEST(Engine, ReasoningTextAndToolCall) {
  auto e = make({"Let me check the weather.</think>Sure, checking.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n"
                 "<｜DSML｜ parameter name=\"city\" string=\"true\">Paris</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>"});
  auto evs = collect(*e, req(true));
  ASSERT_FALSE(evs.empty());
  EXPECT_EQ(join(evs, Event::Kind::kReasoning), "Let me check the weather.");
  EXPECT_EQ(join(evs, Event::Kind::kText), "Sure, checking.");
  int calls = 0;
  for (auto& ev : evs)
    if (ev.kind == Event::Kind::kToolCall) {
      ++calls;
      EXPECT_EQ(ev.call.name, "get_weather");
      EXPECT_EQ(ev.call.arguments, "{\"city\": \"Paris\"}");
    }
  EXPECT_EQ(calls, 1);
  const Event& d = evs.back();
  ASSERT_EQ(d.kind, Event::Kind::kDone);
  EXPECT_EQ(d.finish, FinishReason::kToolCalls);
  EXPECT_GT(d.usage.reasoning_tokens, 0);
  EXPECT_GT(d.usage.completion_tokens, d.usage.reasoning_tokens);
  EXPECT_EQ(d.usage.prompt_tokens, int64_t(req().prompt.size()));
}

TEST(Engine, StopStringAcrossTokensAndMaxTokens) {
  auto e = make({"Hello world, the END is near", "one two three four five six"});
  Request r = req();
  r.stop = {"END"};
  auto evs = collect(*e, r);
  EXPECT_EQ(join(evs, Event::Kind::kText), "Hello world, the ");
  EXPECT_EQ(evs.back().finish, FinishReason::kStopString);
  EXPECT_EQ(evs.back().stop_matched, "END");
  Request r2 = req();
  r2.max_tokens = 3;
  evs = collect(*e, r2);
  EXPECT_EQ(evs.back().finish, FinishReason::kLength);
  EXPECT_EQ(evs.back().usage.completion_tokens, 3);
  EXPECT_EQ(join(evs, Event::Kind::kText), "one two three");
}

// A calls block cut by max_tokens at every length (issue 27): finish is length, every call
// reported is whole (name and arguments equal one of the script's invokes, in order) and only
// those whose closing tag came before the cut are reported; the rest of the block is text.
TEST(Engine, ToolCallsCutByMaxTokensAreNeverHalfReported) {
  const std::string inv_a = "<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ parameter name=\"city\" string=\"true\">Paris</｜DSML｜ parameter>\n"
                            "<｜DSML｜ parameter name=\"days\" string=\"false\">2</｜DSML｜ parameter>\n</｜DSML｜ invoke>";
  const std::string inv_b = "<｜DSML｜ invoke name=\"get_time\">\n<｜DSML｜ parameter name=\"tz\" string=\"true\">UTC</｜DSML｜ parameter>\n</｜DSML｜ invoke>";
  const std::string script = "Checking.\n\n<｜DSML｜ calls>\n" + inv_a + "\n" + inv_b + "\n</｜DSML｜ calls>";
  const std::vector<std::pair<std::string, std::string>> want = {{"get_weather", "{\"city\": \"Paris\", \"days\": 2}"}, {"get_time", "{\"tz\": \"UTC\"}"}};
  const auto& tok = v41_tokenizer();
  const std::vector<int32_t> ids = tok.encode(script);
  auto e = make({script});
  const std::string close_tag = "</｜DSML｜ invoke>";
  for (size_t n = 1; n <= ids.size() + 1; ++n) {
    Request r = req();
    r.max_tokens = int64_t(n);
    auto evs = collect(*e, r);
    ASSERT_EQ(evs.back().kind, Event::Kind::kDone) << n;
    const bool whole = n > ids.size();  // the script and its EOS fit
    EXPECT_EQ(evs.back().finish, whole ? FinishReason::kToolCalls : FinishReason::kLength) << "max_tokens " << n;
    // Invokes closed within the first n tokens.
    const std::string prefix = tok.decode(std::span<const int32_t>(ids.data(), std::min(n, ids.size())));
    size_t closed = 0;
    for (size_t p = prefix.find(close_tag); p != std::string::npos; p = prefix.find(close_tag, p + 1)) ++closed;
    std::vector<std::pair<std::string, std::string>> got;
    for (auto& ev : evs)
      if (ev.kind == Event::Kind::kToolCall) got.emplace_back(ev.call.name, ev.call.arguments);
    const std::vector<std::pair<std::string, std::string>> expect(want.begin(), want.begin() + ptrdiff_t(closed));
    EXPECT_EQ(got, expect) << "max_tokens " << n;
    // Nothing is lost: the text is the prefix less the calls reported (and the block's own markup once closed).
    const std::string text = join(evs, Event::Kind::kText);
    if (closed == 0) EXPECT_EQ(text, prefix) << "max_tokens " << n;
    else EXPECT_EQ(text.rfind("Checking.", 0), 0u) << text;
  }
}

TEST(Engine, PlainTextEndsWithStopAndLogprobs) {
  auto e = make({"Plain answer."});
  Request r = req();
  r.logprobs = 2;
  auto evs = collect(*e, r);
  EXPECT_EQ(join(evs, Event::Kind::kText), "Plain answer.");
  EXPECT_EQ(evs.back().finish, FinishReason::kStop);
  int lp = 0;
  for (auto& ev : evs)
    if (ev.kind == Event::Kind::kLogprob) {
      ++lp;
      EXPECT_EQ(ev.token.top.size(), 2u);
      EXPECT_NEAR(ev.token.logprob, 0.0, 1e-6);  // one-hot script logits: certainty
    }
  EXPECT_EQ(lp, evs.back().usage.completion_tokens);
}

TEST(Engine, ValidationErrors) {
  auto e = make({"x"});
  Request r = req();
  r.prompt.push_back(1 << 30);
  auto s = e->submit(r, [](const Event&) {});
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  Request big = req();
  big.prompt.assign(5000, 100);
  s = e->submit(big, [](const Event&) {});
  EXPECT_EQ(s.status().code(), StatusCode::kResourceExhausted);
  Request empty;
  EXPECT_FALSE(e->submit(empty, [](const Event&) {}).ok());
}

TEST(Engine, CancelEndsTheRequest) {
  std::string longtext;
  for (int i = 0; i < 300; ++i) longtext += "word ";
  auto e = make({longtext});
  EventQueue q;
  auto id = e->submit(req(), q.sink());
  ASSERT_TRUE(id.ok());
  e->cancel(*id);
  Event ev;
  bool ended = false;
  while (q.pop(&ev, 10000))
    if (ev.kind == Event::Kind::kDone) {
      EXPECT_EQ(ev.finish, FinishReason::kCancelled);
      ended = true;
      break;
    }
  EXPECT_TRUE(ended);
  // The engine keeps serving.
  auto evs = collect(*e, req());
  EXPECT_EQ(evs.back().kind, Event::Kind::kDone);
}

}  // namespace
}  // namespace fb::engine
