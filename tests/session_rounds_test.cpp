// engine::run_session_rounds (the N-session bench of issue 20) on the CPU executor and the tiny
// model: every session count decodes one row per session per step, the round-time percentiles
// are ordered, session 0's greedy tokens are the same alone and beside others (with DSpark on and
// off), and the arrival case prefills its prompt in chunks beside the streams.
#include "engine/session_rounds.h"

#include <gtest/gtest.h>

#include "engine/executor_factory.h"
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

class SessionRounds : public ::testing::TestWithParam<bool> {};

TEST_P(SessionRounds, CountsGapsAndTokens) {
  auto ex = make_executor("cpu", model_dir());
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  SessionRoundsOptions o;
  o.sessions = {1, 3};
  o.context = 40;
  o.rounds = 5;
  o.dspark = GetParam();
  o.prefill_chunk = 32;
  o.arrival_prompt = 100;
  o.arrival_streams = 2;
  o.arrival_before = 3;
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

TEST(SessionRoundsArgs, RefusesBadCounts) {
  auto ex = make_executor("cpu", model_dir());
  ASSERT_TRUE(ex.ok());
  SessionRoundsOptions o;
  o.sessions = {0};
  EXPECT_FALSE(run_session_rounds(**ex, o).ok());
}

}  // namespace
}  // namespace fb::engine
