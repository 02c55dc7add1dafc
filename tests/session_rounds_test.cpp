// engine::run_session_rounds (the N-session bench of issue 20) on the CPU executor and the tiny
// model: every session count decodes one row per session per step, the round-time percentiles
// are ordered, session 0's greedy tokens are the same alone and beside others (with DSpark on and
// off), and the arrival case prefills its prompt in chunks beside the streams. The filled variant
// (the GPU bench's fake contexts) with a filler that really prefills through the executor:
// Generator::adopt_context continues exactly as after Generator::prefill, every phase logs a line,
// and only the arrival prompt's tail is prefilled beside the streams.
#include "engine/session_rounds.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/executor_factory.h"
#include "engine/generator.h"
#include "tiny_model_util.h"

namespace fb::engine {
namespace {

const std::string& model_dir() {
  static const std::string dir = [] {
    auto d = testing_util::write_test_tiny_model("fb_session_rounds", 11, false);
    FB_CHECK(d.ok()) << d.status().to_string();
    return *d;
  }();
  return dir;
}

class SessionRounds : public ::testing::TestWithParam<bool> {
 protected:
  // 1 and 3 sessions at context 40 for 5 rounds (DSpark per the parameter), then a 100-token
  // prompt arriving beside 2 streams after 3 rounds.
  SessionRoundsOptions small_options() const {
    SessionRoundsOptions o;
    o.sessions = {1, 3};
    o.context = 40;
    o.rounds = 5;
    o.dspark = GetParam();
    o.prefill_chunk = 32;
    o.arrival_prompt = 100;
    o.arrival_streams = 2;
    o.arrival_before = 3;
    return o;
  }
};

TEST_P(SessionRounds, CountsGapsAndTokens) {
  auto ex = make_executor("cpu", model_dir());
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  SessionRoundsOptions o = small_options();
  auto r = run_session_rounds(**ex, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->rows.size(), 2u);
  for (const SessionRoundsRow& row : r->rows) {
    if (!o.dspark) EXPECT_DOUBLE_EQ(row.rows_per_step, double(row.sessions));
    else EXPECT_GE(row.rows_per_step, double(row.sessions));
    EXPECT_GT(row.tok_s, 0);
    EXPECT_GT(row.gap_p50_ms, 0);
    EXPECT_LE(row.gap_p50_ms, row.gap_p99_ms);
    EXPECT_LE(row.gap_p99_ms, row.gap_max_ms);
    EXPECT_GE(int64_t(row.first_session_tokens.size()), o.rounds);
  }
  // Session 0's tokens alone and beside two others (DSpark may emit more per round: compare the
  // common prefix, which is most of it).
  const auto& a = r->rows[0].first_session_tokens;
  const auto& b = r->rows[1].first_session_tokens;
  const size_t n = std::min(a.size(), b.size());
  EXPECT_GE(n, size_t(o.rounds));
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + n, b.begin())) << "batching changed session 0's tokens";
  ASSERT_TRUE(r->has_arrival);
  EXPECT_GE(r->arrival.rounds, 100 / 32) << "the prompt came in over several rounds";
  EXPECT_GT(r->arrival.median_gap_ms, 0);
  EXPECT_GT(r->arrival.worst_gap_ms, 0);
  EXPECT_GE(r->arrival.last_chunk, 1);
  EXPECT_GT(r->arrival.prefill_s, 0);
  std::printf("dspark %d: 1 session %.1f tok/s, 3 sessions %.1f tok/s; arrival: %lld rounds, worst %.1f ms vs median %.1f ms\n",
              int(o.dspark), r->rows[0].tok_s, r->rows[1].tok_s, (long long)r->arrival.rounds, r->arrival.worst_gap_ms,
              r->arrival.median_gap_ms);
}

INSTANTIATE_TEST_SUITE_P(Dspark, SessionRounds, ::testing::Bool(), [](const auto& i) { return i.param ? "on" : "off"; });

// A context filler as the GPU bench's, but exact: the tokens prefilled in one step straight through
// the executor (no generator), and the last window's DSpark tap rows committed to the draft rings.
Status fill_by_forward(model::Executor& ex, model::SessionState& s, std::span<const int32_t> tokens) {
  const model::Config& c = ex.config();
  const int64_t n = int64_t(tokens.size());
  model::Step st;
  for (int64_t p = 0; p < n; ++p) st.rows.push_back(model::prefill_row(p, tokens[size_t(p)], n));
  st.taps_from_row = std::max<int64_t>(0, n - c.window_size);
  std::vector<model::SessionState*> ss{&s};
  auto out = ex.forward(st, ss);
  if (!out.ok()) return out.status();
  if (out->taps.empty()) return Status();
  return ex.draft_commit(s, out->taps_first_row, out->taps.data(), n - out->taps_first_row);
}

std::vector<int32_t> greedy_tokens(Generator& g, int n) {
  SamplingParams sp;
  sp.temperature = 0;
  Rng rng(0);
  std::vector<int32_t> out;
  while (int(out.size()) < n) {
    Status st = g.next(sp, rng, &out);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) break;
  }
  out.resize(size_t(std::min<size_t>(out.size(), size_t(n))));
  return out;
}

// adopt_context(prompt, t0) on a session that holds the prompt continues bit for bit as prefill(prompt)
// followed by the emission of t0; with DSpark on, its first round decodes plainly (no tap row).
TEST_P(SessionRounds, AdoptedContextContinuesAsAfterPrefill) {
  auto ex = make_executor("cpu", model_dir());
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  GeneratorOptions go;
  go.dspark = GetParam();
  go.prefill_chunk = 16;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 45; ++i) prompt.push_back(int32_t(1000 + (i * 7919) % 50000));
  Generator a(**ex, go);
  ASSERT_TRUE(a.prefill(prompt).ok());
  const std::vector<int32_t> want = greedy_tokens(a, 24);
  ASSERT_EQ(want.size(), 24u);
  Generator b(**ex, go);
  ASSERT_TRUE(fill_by_forward(**ex, *b.session(), prompt).ok());
  EXPECT_FALSE(b.adopt_context(std::span<const int32_t>(prompt.data(), prompt.size() - 1), want[0]).ok()) << "a history shorter than the cache";
  ASSERT_TRUE(b.adopt_context(prompt, want[0]).ok());
  const std::vector<int32_t> got = greedy_tokens(b, 23);
  EXPECT_EQ(got, std::vector<int32_t>(want.begin() + 1, want.end()));
  if (go.dspark) {
    EXPECT_GT(b.counters().steps, 0) << "drafting resumed after the first plain round";
  }
  // Nothing pending: a prompt that extends the adopted history prefills only its new rows.
  Generator d(**ex, go);
  ASSERT_TRUE(fill_by_forward(**ex, *d.session(), std::span<const int32_t>(prompt.data(), 30)).ok());
  ASSERT_TRUE(d.adopt_context(std::span<const int32_t>(prompt.data(), 30), -1).ok());
  ASSERT_TRUE(d.prefill(prompt).ok());
  EXPECT_EQ(d.reused_tokens(), 30);
  EXPECT_EQ(greedy_tokens(d, 24), want);
}

TEST_P(SessionRounds, FilledContextsLogEveryPhase) {
  auto ex = make_executor("cpu", model_dir());
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  SessionRoundsOptions o = small_options();
  o.arrival_tail = 30;
  o.log_every_rounds = 2;
  std::vector<int64_t> filled;
  o.fill_context = [&](model::SessionState& s, std::span<const int32_t> toks) {
    filled.push_back(int64_t(toks.size()));
    return fill_by_forward(**ex, s, toks);
  };
  std::vector<std::string> lines;
  o.log = [&](const std::string& l) { lines.push_back(l); };
  auto r = run_session_rounds(**ex, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  // 1 + 3 sessions, 2 arrival streams at 40 tokens, then the arrival prompt's first 70.
  EXPECT_EQ(filled, (std::vector<int64_t>{40, 40, 40, 40, 40, 40, 70}));
  ASSERT_EQ(r->rows.size(), 2u);
  const auto& x = r->rows[0].first_session_tokens;
  const auto& y = r->rows[1].first_session_tokens;
  const size_t n = std::min(x.size(), y.size());
  EXPECT_GE(n, size_t(o.rounds));
  EXPECT_TRUE(std::equal(x.begin(), x.begin() + n, y.begin())) << "batching changed session 0's tokens";
  ASSERT_TRUE(r->has_arrival);
  EXPECT_EQ(r->arrival.prefilled_rows, 30);
  EXPECT_GE(r->arrival.rounds, 2);
  auto count = [&](const std::string& what) {
    return std::count_if(lines.begin(), lines.end(), [&](const std::string& l) { return l.find(what) != std::string::npos; });
  };
  EXPECT_EQ(count("filling 40-token contexts"), 3);  // 1 and 3 sessions, the arrival's streams
  EXPECT_EQ(count("timed rounds"), 2);
  EXPECT_EQ(count("tok/s"), 2);
  EXPECT_EQ(count("filling the prompt's first 70 tokens"), 1);
  EXPECT_EQ(count("30 rows to prefill"), 1);
  EXPECT_GE(count("rows after"), 1);  // the arrival's progress (every 2 rounds here)
  for (const std::string& l : lines) EXPECT_NE(l.find(" s)"), std::string::npos) << "no elapsed time: " << l;
}

TEST(SessionRoundsArgs, RefusesBadCounts) {
  auto ex = make_executor("cpu", model_dir());
  ASSERT_TRUE(ex.ok());
  SessionRoundsOptions o;
  o.sessions = {0};
  EXPECT_FALSE(run_session_rounds(**ex, o).ok());
}

}  // namespace
}  // namespace fb::engine
