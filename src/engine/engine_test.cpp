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
