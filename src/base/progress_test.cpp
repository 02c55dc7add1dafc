#include "base/progress.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace fb {
namespace {

// Forced on, writes captured, time from a fake clock.
struct Harness {
  double t = 100.0;
  std::vector<std::string> writes;
  ProgressOptions opts(ProgressOptions::Mode mode = ProgressOptions::Mode::kOn) {
    ProgressOptions o;
    o.mode = mode;
    o.sink = [this](std::string_view s) { writes.emplace_back(s); };
    o.clock = [this] { return t; };
    return o;
  }
  // dt seconds pass, then p is updated (Progress::update's arguments).
  void update_after(double dt, Progress& p, int64_t done, int64_t items_done = -1) {
    t += dt;
    p.update(done, items_done);
  }
};

TEST(Progress, CountLinesWithRateEtaAndFinalLine) {
  Harness h;
  Progress p("make-tiny", 40, "tensors", h.opts());
  h.update_after(2.0, p, 10);
  ASSERT_EQ(h.writes.size(), 1u);
  EXPECT_EQ(h.writes[0], "\rmake-tiny: 10/40 tensors (25%), 5.00 tensors/s, ETA 6 s\033[K");
  h.update_after(4.0, p, 40);
  ASSERT_EQ(h.writes.size(), 2u);
  EXPECT_EQ(h.writes[1], "\rmake-tiny: 40/40 tensors (100%), 6.67 tensors/s\033[K");  // no ETA when done
  p.finish();
  ASSERT_EQ(h.writes.size(), 3u);
  EXPECT_EQ(h.writes[2], "\rmake-tiny: 40 tensors in 6.0 s (6.67 tensors/s)\033[K\n");
  p.finish();  // once
  p.update(41);
  EXPECT_EQ(h.writes.size(), 3u);
}

TEST(Progress, BytesInGigabytesWithASecondCounter) {
  Harness h;
  Progress p("load weights", int64_t(4'000'000'000), ProgressUnit::kBytes, h.opts());
  p.set_items_total(1400, "tensors");
  h.update_after(1.0, p, 1'500'000'000, 300);
  ASSERT_EQ(h.writes.size(), 1u);
  EXPECT_EQ(h.writes[0], "\rload weights: 1.50/4.00 GB (38%), 1.50 GB/s, ETA 2 s, 300/1400 tensors\033[K");
  h.update_after(2.0, p, 4'000'000'000, 1400);
  p.finish();
  EXPECT_EQ(h.writes.back(), "\rload weights: 4.00 GB in 3.0 s (1.33 GB/s), 1400 tensors\033[K\n");
}

TEST(Progress, SmallByteTotalsInMegabytes) {
  Harness h;
  Progress p("load weights", 156'000'000, ProgressUnit::kBytes, h.opts());
  h.update_after(0.5, p, 78'000'000);
  ASSERT_EQ(h.writes.size(), 1u);
  EXPECT_EQ(h.writes[0], "\rload weights: 78.0/156.0 MB (50%), 156.0 MB/s, ETA 1 s\033[K");
}

TEST(Progress, RateLimitedToTheMinimumInterval) {
  Harness h;
  Progress p("bench decode", 1000, "steps", h.opts());
  // 1,000 updates 1 ms apart over one second: the first draw comes 0.1 s after the start, then
  // at most one per 0.1 s.
  for (int i = 1; i <= 1000; ++i) h.update_after(0.001, p, i);
  EXPECT_GE(h.writes.size(), 9u);
  EXPECT_LE(h.writes.size(), 10u);
  p.finish();
  EXPECT_EQ(h.writes.back().back(), '\n');
}

TEST(Progress, ShortPhaseDrawsOnlyTheFinalLine) {
  Harness h;
  Progress p("load weights", 10, "tensors", h.opts());
  for (int i = 1; i <= 10; ++i) h.update_after(0.005, p, i);
  EXPECT_TRUE(h.writes.empty());
  p.finish();
  ASSERT_EQ(h.writes.size(), 1u);
  EXPECT_EQ(h.writes[0].find("load weights: 10 tensors in 0.05 s"), 1u) << h.writes[0];
}

TEST(Progress, UnknownTotalHasNoPercentOrEta) {
  Harness h;
  Progress p("prefill", 0, "tokens", h.opts());
  h.t += 2.0;
  p.add(100);
  p.add(100);  // rate limited: same instant
  h.t += 2.0;
  p.add(200);
  ASSERT_EQ(h.writes.size(), 2u);
  EXPECT_EQ(h.writes[1], "\rprefill: 400 tokens, 100 tokens/s\033[K");
}

TEST(Progress, OffWritesNothing) {
  Harness h;
  {
    Progress p("load weights", 10, "tensors", h.opts(ProgressOptions::Mode::kOff));
    EXPECT_FALSE(p.enabled());
    h.update_after(5, p, 5);
    p.finish();
  }
  EXPECT_TRUE(h.writes.empty());
}

TEST(Progress, AutoFollowsTheProcessDefault) {
  // ctest's stderr is a file or a pipe, so auto is off unless the process default forces it.
  set_progress_default(ProgressOptions::Mode::kOn);
  EXPECT_TRUE(progress_enabled());
  set_progress_default(ProgressOptions::Mode::kOff);
  EXPECT_FALSE(progress_enabled());
  set_progress_default(ProgressOptions::Mode::kAuto);
  EXPECT_EQ(progress_enabled(), isatty(fileno(stderr)) != 0);
}

TEST(Progress, UnfinishedLineIsErasedAndClearWritesNoFinalLine) {
  Harness h;
  {
    Progress p("convert", 8, "experts", h.opts());
    h.update_after(1, p, 3);
    ASSERT_EQ(h.writes.size(), 1u);
  }  // an error path: destroyed unfinished
  EXPECT_EQ(h.writes.back(), "\r\033[K");
  Progress q("prefill", 100, "tokens", h.opts());
  q.clear();  // nothing drawn yet: nothing to erase
  EXPECT_EQ(h.writes.size(), 2u);
  q.finish();
  EXPECT_EQ(h.writes.size(), 2u);
}

TEST(Progress, HideErasesTheLineAndTheNextDueUpdateRedraws) {
  Harness h;
  Progress p("bench decode", 3, "contexts", h.opts());
  p.hide();  // nothing open: nothing written
  EXPECT_TRUE(h.writes.empty());
  h.update_after(1, p, 1);
  ASSERT_EQ(h.writes.size(), 1u);
  p.hide();
  ASSERT_EQ(h.writes.size(), 2u);
  EXPECT_EQ(h.writes[1], "\r\033[K");
  h.update_after(1, p, 2);
  ASSERT_EQ(h.writes.size(), 3u);
  EXPECT_EQ(h.writes[2], "\rbench decode: 2/3 contexts (67%), 1.00 contexts/s, ETA 1 s\033[K");
}

TEST(Progress, NothingDoneLeavesNoLine) {
  Harness h;
  Progress p("bench decode", 0, "contexts", h.opts());
  h.t += 1;
  p.finish();
  EXPECT_TRUE(h.writes.empty());
}

TEST(Progress, EtaFormats) {
  EXPECT_EQ(Progress::format_eta(0.2), "1 s");
  EXPECT_EQ(Progress::format_eta(59.0), "59 s");
  EXPECT_EQ(Progress::format_eta(125.0), "2m05s");
  EXPECT_EQ(Progress::format_eta(3725.0), "1h02m");
}

// Phases reported through one callback: each phase its own line, a new name finishing the line of
// the one before (its final line first), the total taken from every report.
TEST(PhaseProgress, EachPhaseItsLineAndANewNameFinishesTheLast) {
  Harness h;
  PhaseProgress pp(h.opts());
  ProgressFn f = pp.fn();
  f("bench tier sweep", 0, 4, "points");  // a phase starts with its first report
  EXPECT_TRUE(h.writes.empty());
  h.t += 1;
  f("bench tier sweep", 1, 4, "points");
  ASSERT_EQ(h.writes.size(), 1u);
  EXPECT_EQ(h.writes[0], "\rbench tier sweep: 1/4 points (25%), 1.00 points/s, ETA 3 s\033[K");
  h.t += 1;
  f("bench tier sweep", 2, 5, "points");  // the total grew
  ASSERT_EQ(h.writes.size(), 2u);
  EXPECT_EQ(h.writes[1], "\rbench tier sweep: 2/5 points (40%), 1.00 points/s, ETA 3 s\033[K");
  pp.hide();
  EXPECT_EQ(h.writes.back(), "\r\033[K");
  h.t += 2;
  f("bench dspark sweep", 0, 3, "runs");
  ASSERT_EQ(h.writes.size(), 4u);
  EXPECT_EQ(h.writes[3], "\rbench tier sweep: 2 points in 4.0 s (0.50 points/s)\033[K\n");  // the last phase's final line first
  h.t += 1;
  f("bench dspark sweep", 3, 3, "runs");  // done: the final line at once
  EXPECT_EQ(h.writes.back(), "\rbench dspark sweep: 3 runs in 1.0 s (3.00 runs/s)\033[K\n");
  const size_t n = h.writes.size();
  pp.finish();  // nothing open
  pp.hide();
  EXPECT_EQ(h.writes.size(), n);
}

}  // namespace
}  // namespace fb
