// split_step / part_step / append_part_output: the parts of a shared step (prefill chunk first,
// then whole sessions' runs of at most max_rows rows) and an output joined from the parts equal to
// the whole step's, on a stand-in executor whose outputs are functions of each row.
#include "model/step_parts.h"

#include <gtest/gtest.h>

namespace fb::model {
namespace {

// Session runs of the given lengths (decode rows), after `prefill` prefill rows of session 0.
Step make_step(int64_t prefill, const std::vector<int64_t>& runs) {
  Step st;
  for (int64_t p = 0; p < prefill; ++p) st.rows.push_back(prefill_row(100 + p, 7, 100 + prefill));
  int s = prefill > 0 ? 1 : 0;
  for (int64_t n : runs) {
    for (int64_t i = 0; i < n; ++i) {
      Row r;
      r.session = s;
      r.pos = 50 + i;
      r.want_logits = true;
      st.rows.push_back(r);
    }
    ++s;
  }
  return st;
}

std::vector<std::pair<int64_t, int64_t>> ranges(const std::vector<StepPart>& parts) {
  std::vector<std::pair<int64_t, int64_t>> v;
  for (const StepPart& p : parts) v.push_back({p.begin, p.end});
  return v;
}

using R = std::vector<std::pair<int64_t, int64_t>>;

TEST(StepParts, SmallOrAllPrefillStepsStayWhole) {
  EXPECT_EQ(ranges(split_step(make_step(10, {9, 9, 9}), 64)), (R{{0, 37}}));
  EXPECT_EQ(ranges(split_step(make_step(64, {}), 64)), (R{{0, 64}}));
  EXPECT_EQ(ranges(split_step(make_step(2048, {}), 64)), (R{{0, 2048}}));  // a tensor-core chunk
  EXPECT_EQ(ranges(split_step(make_step(0, {32, 32}), 64)), (R{{0, 64}}));
}

TEST(StepParts, PrefillChunkFirstThenWholeSessions) {
  // 10 prompt rows beside 7 x 9 verify rows and one decode row: 74 rows.
  EXPECT_EQ(ranges(split_step(make_step(10, {9, 9, 9, 9, 9, 9, 9, 1}), 64)), (R{{0, 10}, {10, 74}}));
  // A big chunk beside 8 decode rows.
  EXPECT_EQ(ranges(split_step(make_step(100, {1, 1, 1, 1, 1, 1, 1, 1}), 64)), (R{{0, 100}, {100, 108}}));
  // Decode only: 7 x 12 + 1 rows; no session's run is cut.
  EXPECT_EQ(ranges(split_step(make_step(0, {12, 12, 12, 12, 12, 12, 12, 1}), 64)), (R{{0, 60}, {60, 85}}));
  // 16 sessions of 6 verify rows.
  EXPECT_EQ(ranges(split_step(make_step(0, std::vector<int64_t>(16, 6)), 64)), (R{{0, 60}, {60, 96}}));
  // A run longer than max_rows is a part of its own.
  EXPECT_EQ(ranges(split_step(make_step(0, {3, 70, 3}), 64)), (R{{0, 3}, {3, 73}, {73, 76}}));
  // Any limit: the parts cover the step in order, a boundary never cuts a session's run (except
  // between its prompt rows and later rows), and a part over the limit is one session's run.
  const Step st = make_step(5, {9, 2, 30, 1, 17, 40});
  for (int64_t max_rows : {1, 5, 16, 64}) {
    const std::vector<StepPart> parts = split_step(st, max_rows);
    int64_t at = 0;
    for (const StepPart& p : parts) {
      EXPECT_EQ(p.begin, at);
      EXPECT_LT(p.begin, p.end);
      at = p.end;
      if (p.end - p.begin > max_rows) {
        EXPECT_EQ(st.rows[size_t(p.begin)].session, st.rows[size_t(p.end - 1)].session) << "max_rows " << max_rows;
      }
      if (p.begin > 0) {
        const Row& a = st.rows[size_t(p.begin - 1)];
        const Row& b = st.rows[size_t(p.begin)];
        EXPECT_TRUE(a.session != b.session || a.kind != b.kind) << "a session's run cut at row " << p.begin;
      }
    }
    EXPECT_EQ(at, int64_t(st.rows.size()));
  }
}

// A stand-in executor: logits row = (session, pos, token) of each row asking for logits, tap row =
// (session, pos) of each row from taps_from_row on.
StepOutput run(const Step& st) {
  StepOutput o;
  for (size_t t = 0; t < st.rows.size(); ++t) {
    const Row& r = st.rows[t];
    if (r.want_logits) {
      o.logit_rows.push_back(int(t));
      o.logits.insert(o.logits.end(), {float(r.session), float(r.pos), float(r.token)});
    }
  }
  o.taps_first_row = std::clamp<int64_t>(st.taps_from_row, 0, int64_t(st.rows.size()));
  for (size_t t = size_t(o.taps_first_row); t < st.rows.size(); ++t) o.taps.insert(o.taps.end(), {uint16_t(st.rows[t].session), uint16_t(st.rows[t].pos)});
  return o;
}

TEST(StepParts, JoinedOutputEqualsTheWholeStep) {
  for (int64_t taps_from : {0, 3, 12, 40, 200}) {
    Step st = make_step(12, {9, 9, 9, 9, 9, 9, 9, 1, 5});
    st.taps_from_row = taps_from;
    const std::vector<StepPart> parts = split_step(st, 64);
    ASSERT_GT(parts.size(), 1u);
    StepOutput joined;
    for (const StepPart& p : parts) append_part_output(&joined, run(part_step(st, p)), p, int64_t(st.rows.size()), st.taps_from_row);
    const StepOutput whole = run(st);
    EXPECT_EQ(joined.logit_rows, whole.logit_rows) << "taps_from " << taps_from;
    EXPECT_EQ(joined.logits, whole.logits);
    EXPECT_EQ(joined.taps, whole.taps);
    EXPECT_EQ(joined.taps_first_row, whole.taps_first_row);
  }
}

}  // namespace
}  // namespace fb::model
