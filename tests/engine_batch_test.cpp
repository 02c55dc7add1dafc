// Several sessions at once (issue 20) through the Engine on the CPU executor and the built-in tiny
// model: greedy answers (tokens AND logprobs) of requests that share steps equal their solo runs
// bit for bit, with DSpark on and off and prompts prefilled in chunks next to other sessions'
// decode rows; a cancelled request frees its session for a waiting one; a full queue refuses and
// the engine recovers; the KV budget admits by the spec/12 estimate.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "engine/engine.h"
#include "engine/executor_factory.h"
#include "engine/kv_store.h"
#include "memory/plan.h"
#include "tiny_model_util.h"
#include "tokenizer/test_assets.h"

namespace fb::engine {
namespace {

using tokenizer::v41_tokenizer;

const std::string& model_dir() {
  static const std::string dir = [] {
    auto d = testing_util::write_test_tiny_model("fb_engine_batch", 7, false);
    FB_CHECK(d.ok()) << d.status().to_string();
    return *d;
  }();
  return dir;
}

// The CPU executor, counting the engine's draft_many calls and the blocks in them.
class DraftCounter final : public model::Executor {
 public:
  explicit DraftCounter(std::unique_ptr<model::Executor> in) : in_(std::move(in)) {}
  const model::Config& config() const override { return in_->config(); }
  const char* name() const override { return in_->name(); }
  bool supports_bounded_replay() const override { return in_->supports_bounded_replay(); }
  bool packs_prompts() const override { return in_->packs_prompts(); }
  int64_t preferred_prefill_chunk() const override { return in_->preferred_prefill_chunk(); }
  std::unique_ptr<model::SessionState> new_session() const override { return in_->new_session(); }
  Result<model::StepOutput> forward(const model::Step& st, const std::vector<model::SessionState*>& ss, model::Taps* t) override {
    auto r = in_->forward(st, ss, t);
    if (r.ok() && !st.logits_to_host) {  // the greedy rows' argmax only
      ++argmax_steps;
      if (!r->logits.empty() || r->argmax.size() != r->logit_rows.size()) ++argmax_bad;
    }
    return r;
  }
  Status draft_commit(model::SessionState& s, int64_t p, const uint16_t* r, int64_t n) override { return in_->draft_commit(s, p, r, n); }
  Result<model::DraftOutput> draft(model::SessionState& s, int32_t a, const uint16_t* r, int64_t p) override { return in_->draft(s, a, r, p); }
  Result<model::DraftOutput> draft_sampled(model::SessionState& s, int32_t a, const uint16_t* r, int64_t p,
                                           const model::DraftPicker& pick) override {
    return in_->draft_sampled(s, a, r, p, pick);
  }
  std::vector<Result<model::DraftOutput>> draft_many(const std::vector<model::DraftJob>& jobs) override {
    ++calls;
    blocks += int64_t(jobs.size());
    max_blocks = std::max(max_blocks.load(), int64_t(jobs.size()));
    return in_->draft_many(jobs);
  }
  std::atomic<int64_t> calls{0}, blocks{0}, max_blocks{0};  // written by the engine thread
  std::atomic<int64_t> argmax_steps{0}, argmax_bad{0};

 private:
  std::unique_ptr<model::Executor> in_;
};

std::unique_ptr<Engine> make_engine(int max_sessions, bool dspark, int max_queue = 64, uint64_t kv_budget = 0,
                                    DraftCounter** counter = nullptr, int dspark_verify = -1) {
  auto cpu = make_executor("cpu", model_dir());
  FB_CHECK(cpu.ok()) << cpu.status().to_string();
  auto dc = std::make_unique<DraftCounter>(std::move(*cpu));
  if (counter) *counter = dc.get();
  std::unique_ptr<model::Executor> ex = std::move(dc);
  EngineOptions o;
  o.generator.dspark_verify = dspark_verify;
  o.max_sessions = max_sessions;
  o.max_queue = max_queue;
  o.kv_budget_bytes = kv_budget;
  o.generator.dspark = dspark;
  // Small chunks so prompts take several steps and share them with other sessions' decode rows.
  o.generator.prefill_chunk = 16;
  o.mixed_prefill_rows = 5;
  return std::make_unique<Engine>(std::move(ex), v41_tokenizer(), o);
}

Request req(const std::string& user, int64_t max_tokens) {
  Request r;
  r.prompt = v41_tokenizer().encode("<｜begin▁of▁sentence｜><｜User｜>" + user + "<｜Assistant｜></think>");
  r.sampling.temperature = 0;
  r.max_tokens = max_tokens;
  r.logprobs = 3;
  return r;
}

struct Answer {
  std::vector<int32_t> ids;
  std::vector<double> logprobs;  // the token's, then its top 3 (ids and values)
  std::vector<int32_t> top_ids;
  FinishReason finish = FinishReason::kStop;
  bool ok = false;
};

Answer wait_answer(EventQueue& q) {
  Answer a;
  Event ev;
  while (q.pop(&ev, 60000)) {
    if (ev.kind == Event::Kind::kLogprob) {
      a.ids.push_back(ev.token.id);
      a.logprobs.push_back(ev.token.logprob);
      for (auto& t : ev.token.top) {
        a.top_ids.push_back(t.id);
        a.logprobs.push_back(t.logprob);
      }
    }
    if (ev.kind == Event::Kind::kError) return a;
    if (ev.kind == Event::Kind::kDone) {
      a.finish = ev.finish;
      a.ok = true;
      return a;
    }
  }
  return a;
}

// Different lengths (several prefill chunks each) and different answer lengths.
std::vector<Request> workload() {
  const char* users[] = {
      "Hello",
      "Tell me about the sea and the sky in a few words, please, and do not hurry.",
      "What is two plus two?",
      "Write a short poem about a cat that sits on a warm windowsill in the afternoon sun while the city hums below.",
      "Explain DSpark.",
      "Name three colours.",
      "Why is the sky blue? Give a long and careful answer with several steps of reasoning and an example or two.",
      "Count: one two three four five six seven eight nine ten eleven twelve",
  };
  std::vector<Request> rs;
  for (int i = 0; i < 8; ++i) rs.push_back(req(users[i], 6 + 3 * (i % 4)));
  return rs;
}

void expect_same(const Answer& solo, const Answer& batched, int i) {
  ASSERT_TRUE(solo.ok && batched.ok) << "request " << i;
  EXPECT_EQ(solo.ids, batched.ids) << "request " << i << ": tokens differ when batched";
  EXPECT_EQ(solo.top_ids, batched.top_ids) << "request " << i;
  ASSERT_EQ(solo.logprobs.size(), batched.logprobs.size()) << "request " << i;
  for (size_t k = 0; k < solo.logprobs.size(); ++k)  // bit for bit, not within a tolerance
    EXPECT_EQ(solo.logprobs[k], batched.logprobs[k]) << "request " << i << " logprob " << k;
  EXPECT_EQ(solo.finish, batched.finish) << "request " << i;
}

// Waits until `pred(stats)` holds (the engine thread updates them between rounds).
template <class P>
bool eventually(Engine& e, P pred) {
  for (int i = 0; i < 3000; ++i) {
    if (pred(e.stats())) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

class EngineBatch : public ::testing::TestWithParam<bool> {};

TEST_P(EngineBatch, ConcurrentGreedyEqualsSolo) {
  const bool dspark = GetParam();
  const std::vector<Request> rs = workload();
  std::vector<Answer> solo;
  {
    auto e = make_engine(1, dspark);
    for (const Request& r : rs) {
      EventQueue q;
      ASSERT_TRUE(e->submit(r, q.sink()).ok());
      solo.push_back(wait_answer(q));
    }
    EXPECT_EQ(e->stats().step_sessions, e->stats().steps) << "one session: one session per step";
  }
  auto e = make_engine(8, dspark);
  std::vector<EventQueue> qs(rs.size());
  for (size_t i = 0; i < rs.size(); ++i) ASSERT_TRUE(e->submit(rs[i], qs[i].sink()).ok());
  for (size_t i = 0; i < rs.size(); ++i) expect_same(solo[i], wait_answer(qs[i]), int(i));
  const EngineStats s = e->stats();
  // The steps really were shared (else this test would prove nothing), and prompts were
  // prefilled next to decode rows.
  EXPECT_GT(double(s.step_sessions) / double(s.steps), 2.0) << s.step_sessions << " sessions in " << s.steps << " steps";
  EXPECT_GT(s.step_prefill_rows, 0);
  EXPECT_GT(s.step_decode_rows, 0);
  EXPECT_EQ(s.ttfts, int64_t(rs.size()));
  EXPECT_TRUE(eventually(*e, [](const EngineStats& s) { return s.active == 0 && s.kv_admitted_bytes == 0; }));
  EXPECT_LE(s.sessions_cached, 8);
  if (dspark) {
    EXPECT_GT(s.dspark.steps, 0);
    // Prompts come in one after the other and drafts back off while they do not pay (the tiny
    // model's rarely do), so fewer sessions draft per round than decode; some calls are shared.
    EXPECT_GT(s.draft_blocks, s.draft_calls) << "the sessions' drafts share executor calls";
  } else {
    EXPECT_EQ(s.draft_calls, 0);
  }
}

// Greedy requests that ask for no logprobs read only their rows' argmax (Step::logits_to_host
// false: the executor returns no logits rows); their text equals the same requests' with logprobs
// (which read the rows), alone and beside others, DSpark on and off.
TEST_P(EngineBatch, GreedyWithoutLogprobsReadsArgmaxOnly) {
  const bool dspark = GetParam();
  std::vector<Request> with = workload(), without = workload();
  for (Request& r : without) r.logprobs = -1;
  auto text_of = [](EventQueue& q) {
    std::string t;
    Event ev;
    while (q.pop(&ev, 60000)) {
      if (ev.kind == Event::Kind::kText || ev.kind == Event::Kind::kReasoning) t += ev.text;
      if (ev.kind == Event::Kind::kError) return std::string("error: ") + ev.status.to_string();
      if (ev.kind == Event::Kind::kDone) return t + "|done " + std::to_string(ev.usage.completion_tokens);
    }
    return std::string("timeout");
  };
  for (const int sessions : {1, 8}) {
    SCOPED_TRACE(sessions);
    std::vector<std::string> a, b;
    DraftCounter* dc = nullptr;
    for (auto* rs : {&with, &without}) {
      auto e = make_engine(sessions, dspark, 64, 0, &dc);
      std::vector<EventQueue> qs(rs->size());
      for (size_t i = 0; i < rs->size(); ++i) ASSERT_TRUE(e->submit((*rs)[i], qs[i].sink()).ok());
      for (EventQueue& q : qs) (rs == &with ? a : b).push_back(text_of(q));
      if (rs == &with) EXPECT_EQ(dc->argmax_steps.load(), 0) << "logprobs read the rows";
      else EXPECT_GT(dc->argmax_steps.load(), 0) << "no step left the rows on the device";
      EXPECT_EQ(dc->argmax_bad.load(), 0) << "a step without rows returned logits, or no argmax per row";
    }
    EXPECT_EQ(a, b);
  }
}

// DSpark with several sessions: the drafts of a round run in ONE executor call (draft_many) and
// the verify blocks share the step. Sampled requests (seeded, temperature 0.8; a forced verify
// length, since the measured cost table of each engine would choose lengths by the clock) give
// the same tokens and logprobs alone and beside 4 others.
TEST(EngineSessions, SampledDsparkDraftsShareOneCallAndEqualSolo) {
  std::vector<Request> rs = workload();
  rs.resize(5);
  for (size_t i = 0; i < rs.size(); ++i) {
    rs[i].max_tokens = 20;  // long enough for every session to be drafting while the others still are
    rs[i].sampling.temperature = 0.8;
    rs[i].sampling.seed = 1000 + i;
  }
  std::vector<Answer> solo;
  DraftCounter* dc = nullptr;
  {
    auto e = make_engine(1, true, 64, 0, &dc, /*dspark_verify=*/3);
    for (const Request& r : rs) {
      EventQueue q;
      ASSERT_TRUE(e->submit(r, q.sink()).ok());
      solo.push_back(wait_answer(q));
    }
    EXPECT_EQ(dc->max_blocks.load(), 1);
    EXPECT_GT(dc->calls.load(), 0);
  }
  auto e = make_engine(8, true, 64, 0, &dc, 3);
  std::vector<EventQueue> qs(rs.size());
  for (size_t i = 0; i < rs.size(); ++i) ASSERT_TRUE(e->submit(rs[i], qs[i].sink()).ok());
  for (size_t i = 0; i < rs.size(); ++i) expect_same(solo[i], wait_answer(qs[i]), int(i));
  const EngineStats s = e->stats();
  EXPECT_GE(dc->max_blocks.load(), 3) << "drafts of several sessions in one call";
  EXPECT_EQ(s.draft_calls, dc->calls.load());
  EXPECT_EQ(s.draft_blocks, dc->blocks.load());
  std::printf("sampled DSpark: %lld draft blocks in %lld calls (at most %lld in one)\n", (long long)s.draft_blocks,
              (long long)s.draft_calls, (long long)dc->max_blocks.load());
  EXPECT_GT(s.dspark.sampled_steps, 0);
}

// Prompts that arrive together share a step (the CPU executor packs prompts): three short prompts
// queued while a longer one prefills come in beside it and each other, in steps carrying rows of
// two or more prompts, and every answer equals its solo run.
TEST(EngineSessions, PromptsArrivingTogetherShareStepsAndEqualSolo) {
  std::vector<Request> rs = {req("Why is the sky blue? Give a long and careful answer with several steps of reasoning.", 1),
                             req("Hello", 5), req("Name three colours.", 4), req("What is two plus two?", 3)};
  std::vector<Answer> solo;
  {
    auto e = make_engine(1, false);
    for (const Request& r : rs) {
      EventQueue q;
      ASSERT_TRUE(e->submit(r, q.sink()).ok());
      solo.push_back(wait_answer(q));
    }
    EXPECT_EQ(e->stats().packed_prompt_steps, 0);
  }
  auto e = make_engine(8, false);
  std::vector<EventQueue> qs(rs.size());
  for (size_t i = 0; i < rs.size(); ++i) ASSERT_TRUE(e->submit(rs[i], qs[i].sink()).ok());
  for (size_t i = 0; i < rs.size(); ++i) expect_same(solo[i], wait_answer(qs[i]), int(i));
  EXPECT_GT(e->stats().packed_prompt_steps, 0) << "no step carried two prompts";
}

INSTANTIATE_TEST_SUITE_P(Dspark, EngineBatch, ::testing::Bool(), [](const auto& i) { return i.param ? "on" : "off"; });

TEST(EngineSessions, CancelFreesTheSessionForAWaitingRequest) {
  auto e = make_engine(2, true);
  EventQueue qa, qb, qc;
  auto a = e->submit(req("Tell a very long story about everything.", 100000), qa.sink());
  auto b = e->submit(req("Tell another very long story.", 100000), qb.sink());
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(eventually(*e, [](const EngineStats& s) { return s.active == 2 && s.ttfts == 2; }));
  ASSERT_TRUE(e->submit(req("Hello", 4), qc.sink()).ok());
  // Both sessions are busy: the third request waits, whatever the rounds do meanwhile.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(e->stats().queue_depth, 1);
  e->cancel(*a);
  EXPECT_EQ(wait_answer(qa).finish, FinishReason::kCancelled);
  const Answer c = wait_answer(qc);  // admitted into the freed session and completed
  EXPECT_TRUE(c.ok);
  EXPECT_EQ(c.finish, FinishReason::kLength);
  EXPECT_EQ(c.ids.size(), 4u);
  e->cancel(*b);
  EXPECT_EQ(wait_answer(qb).finish, FinishReason::kCancelled);
  EXPECT_TRUE(eventually(*e, [](const EngineStats& s) { return s.active == 0 && s.requests_cancelled == 2; }));
  EXPECT_EQ(e->stats().kv_admitted_bytes, 0u);
}

TEST(EngineSessions, FullQueueRefusesAndRecovers) {
  auto e = make_engine(1, false, /*max_queue=*/1);
  EventQueue qa, qb;
  auto a = e->submit(req("Tell a very long story.", 100000), qa.sink());
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(eventually(*e, [](const EngineStats& s) { return s.active == 1; }));
  ASSERT_TRUE(e->submit(req("Hello", 3), qb.sink()).ok());  // waits
  auto refused = e->submit(req("Hi", 3), [](const Event&) {});
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);  // the server's 429
  EXPECT_EQ(e->stats().queue_rejected, 1);
  e->cancel(*a);
  EXPECT_TRUE(wait_answer(qb).ok);
  EventQueue qc;
  ASSERT_TRUE(e->submit(req("Hi", 3), qc.sink()).ok());  // recovered
  EXPECT_TRUE(wait_answer(qc).ok);
}

TEST(EngineSessions, KvBudgetAdmitsByEstimate) {
  const Request small = req("Hello", 8);
  auto probe = make_executor("cpu", model_dir());
  ASSERT_TRUE(probe.ok());
  const model::Config& c = (*probe)->config();
  const uint64_t one = memory::session_kv_bytes(c, int64_t(small.prompt.size()) + 8, c.n_mtp_layers > 0);
  // Room for one such request, not two: they run one after the other, each still completes.
  auto e = make_engine(4, true, 64, one + one / 2);
  EventQueue q1, q2;
  ASSERT_TRUE(e->submit(small, q1.sink()).ok());
  ASSERT_TRUE(e->submit(small, q2.sink()).ok());
  const Answer a1 = wait_answer(q1), a2 = wait_answer(q2);
  EXPECT_TRUE(a1.ok && a2.ok);
  EXPECT_EQ(a1.ids, a2.ids);
  EXPECT_EQ(e->stats().step_sessions, e->stats().steps) << "the budget let two sessions share a step";
  // A request whose KV alone exceeds the budget is refused up front (never waits forever).
  auto big = e->submit(req("Hello", 100000), [](const Event&) {});
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
}

// Disk KV cache through the engine (issue 21): a long generation is checkpointed as it goes
// (kv_checkpoint_every) and the whole conversation at its end; the next turn, which resends the
// answer, restores past the first prompt, and its answer equals one without the cache.
TEST(EngineSessions, ConversationCheckpointsServeTheNextTurn) {
  namespace fs = std::filesystem;
  const std::string dir = (fs::temp_directory_path() / ("fb_engine_kv_" + std::to_string(getpid()))).string();
  fs::remove_all(dir);
  auto make = [&](bool with_store) {
    auto ex = make_executor("cpu", model_dir());
    FB_CHECK(ex.ok()) << ex.status().to_string();
    EngineOptions o;
    o.generator.dspark = false;
    if (with_store) {
      auto store = KvStore::open(dir, 256 << 20, (*ex)->identity());
      FB_CHECK(store.ok()) << store.status().to_string();
      o.generator.kv_store = std::shared_ptr<KvStore>(std::move(store.value()));
      o.generator.kv_checkpoint_every = 8;
    }
    return std::make_pair(std::make_unique<Engine>(std::move(*ex), v41_tokenizer(), o), o.generator.kv_store);
  };
  auto [e, store] = make(true);
  Request first = req("Tell me a long story about the sea.", 30);
  EventQueue q1;
  ASSERT_TRUE(e->submit(first, q1.sink()).ok());
  const Answer a1 = wait_answer(q1);
  ASSERT_TRUE(a1.ok);
  ASSERT_EQ(a1.ids.size(), 30u);
  // the prompt's checkpoint, three on the way (every 8 generated tokens) and the conversation's
  EXPECT_GE(store->stats().entries, 4);
  EXPECT_GT(store->stats().deltas, 0);
  // The next turn: the first prompt, the answer as generated, then the user's next message.
  Request second = first;
  second.prompt.insert(second.prompt.end(), a1.ids.begin(), a1.ids.end());
  const auto more = v41_tokenizer().encode("<｜User｜>And then?<｜Assistant｜></think>");
  second.prompt.insert(second.prompt.end(), more.begin(), more.end());
  second.max_tokens = 8;
  EventQueue q2;
  ASSERT_TRUE(e->submit(second, q2.sink()).ok());
  Event ev;
  Answer a2;
  int64_t cached = 0;
  while (q2.pop(&ev, 60000)) {
    if (ev.kind == Event::Kind::kLogprob) a2.ids.push_back(ev.token.id);
    if (ev.kind == Event::Kind::kDone || ev.kind == Event::Kind::kError) {
      a2.ok = ev.kind == Event::Kind::kDone;
      cached = ev.usage.cached_tokens;
      break;
    }
  }
  ASSERT_TRUE(a2.ok);
  EXPECT_GT(cached, int64_t(first.prompt.size())) << "the answer restores from the conversation checkpoint";
  EXPECT_LE(cached, int64_t(first.prompt.size() + a1.ids.size()));
  auto [cold, none] = make(false);
  EventQueue q3;
  ASSERT_TRUE(cold->submit(second, q3.sink()).ok());
  Answer a3;
  while (q3.pop(&ev, 60000)) {
    if (ev.kind == Event::Kind::kLogprob) a3.ids.push_back(ev.token.id);
    if (ev.kind == Event::Kind::kDone || ev.kind == Event::Kind::kError) break;
  }
  EXPECT_EQ(a2.ids, a3.ids);
  fs::remove_all(dir);
}

// Shutdown: destroying the engine cancels the requests still running, and a cancelled request's
// conversation (prompt plus the tokens it was given) is checkpointed like a finished one.
TEST(EngineSessions, ShutdownCheckpointsRunningConversations) {
  namespace fs = std::filesystem;
  const std::string dir = (fs::temp_directory_path() / ("fb_engine_kv_stop_" + std::to_string(getpid()))).string();
  fs::remove_all(dir);
  auto ex = make_executor("cpu", model_dir());
  ASSERT_TRUE(ex.ok());
  EngineOptions o;
  o.generator.dspark = false;
  auto store = KvStore::open(dir, 256 << 20, (*ex)->identity());
  ASSERT_TRUE(store.ok());
  o.generator.kv_store = std::shared_ptr<KvStore>(std::move(store.value()));
  o.generator.kv_checkpoint_every = 0;  // only at the end
  auto kv = o.generator.kv_store;
  auto e = std::make_unique<Engine>(std::move(*ex), v41_tokenizer(), o);
  EventQueue q;
  ASSERT_TRUE(e->submit(req("Tell me a very long story about the sea.", 100000), q.sink()).ok());
  Event ev;
  int tokens = 0;
  while (tokens < 12 && q.pop(&ev, 60000))
    if (ev.kind == Event::Kind::kLogprob) ++tokens;
  ASSERT_EQ(tokens, 12);
  const int64_t before = kv->stats().entries;  // the prompt's checkpoint
  e.reset();  // shutdown with the request running
  EXPECT_EQ(kv->stats().entries, before + 1) << "the running conversation's checkpoint";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fb::engine
