// The engine's rounds under a step cost that grows with the step's rows (issue 20): three
// streams decode while a long prompt arrives. With the measured prefill policy (the default) the
// streams' worst inter-token gap while the prompt prefills stays within 3x their median gap
// without it (the bound), the prompt still comes in over many steps and answers; a fixed
// quarter-chunk policy on the same workload breaks that bound (so the check has teeth). Step cost:
// the scripted executor plus a sleep of 30 ms + 1.5 ms per row, like a CPU step (long enough that
// the scheduler's wake-up jitter of a loaded machine stays small against the bound's margin).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include "engine/engine.h"
#include "engine/scripted_executor.h"
#include "tokenizer/test_assets.h"

namespace fb::engine {
namespace {

using tokenizer::v41_tokenizer;
using Clock = std::chrono::steady_clock;

class TimedExecutor final : public model::Executor {
 public:
  TimedExecutor(std::unique_ptr<model::Executor> in, double base_s, double row_s) : in_(std::move(in)), base_s_(base_s), row_s_(row_s) {}
  const model::Config& config() const override { return in_->config(); }
  const char* name() const override { return "timed"; }
  std::unique_ptr<model::SessionState> new_session() const override { return in_->new_session(); }
  int64_t preferred_prefill_chunk() const override { return 512; }
  Result<model::StepOutput> forward(const model::Step& st, const std::vector<model::SessionState*>& ss, model::Taps* t) override {
    std::this_thread::sleep_for(std::chrono::duration<double>(base_s_ + row_s_ * double(st.rows.size())));
    return in_->forward(st, ss, t);
  }
  Status draft_commit(model::SessionState& s, int64_t p, const uint16_t* r, int64_t n) override { return in_->draft_commit(s, p, r, n); }
  Result<model::DraftOutput> draft(model::SessionState& s, int32_t a, const uint16_t* r, int64_t p) override { return in_->draft(s, a, r, p); }

 private:
  std::unique_ptr<model::Executor> in_;
  double base_s_, row_s_;
};

struct Stream {
  std::mutex mu;
  std::vector<double> t;  // arrival of each token (seconds since the test's start)
  bool done = false;
  int64_t prefill_events = 0;
};

struct Result_ {
  double worst_in = 0;       // the streams' worst gap that ended while the prompt prefilled
  double median_out = 0;     // their median gap outside that window
  int64_t prompt_chunks = 0; // prefill progress events of the long prompt
  bool prompt_answered = false;
  EngineStats stats;
};

Result_ run(int64_t fixed_rows) {
  const auto& tok = v41_tokenizer();
  const std::vector<int32_t> word = tok.encode(" sea");
  // Scripts go to prompts in prefill order: three long answers (the streams), then a short one.
  std::vector<std::vector<int32_t>> scripts(3, std::vector<int32_t>(120, word[0]));
  scripts.push_back(std::vector<int32_t>(3, word[0]));
  EngineOptions o;
  o.max_sessions = 4;
  o.generator.dspark = false;
  o.mixed_prefill_rows = fixed_rows;
  o.mixed_step_factor = 2.0;
  auto ex = std::make_unique<TimedExecutor>(std::make_unique<ScriptedExecutor>(tok.vocab_size(), scripts, 8192), 0.030, 0.0015);
  Engine e(std::move(ex), tok, o);
  const Clock::time_point t0 = Clock::now();
  auto secs = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  auto sink = [&](Stream& s) {
    return [&s, &secs](const Event& ev) {
      std::lock_guard<std::mutex> l(s.mu);
      if (ev.kind == Event::Kind::kLogprob) s.t.push_back(secs());
      if (ev.kind == Event::Kind::kPrefill) ++s.prefill_events;
      if (ev.kind == Event::Kind::kDone || ev.kind == Event::Kind::kError) s.done = ev.kind == Event::Kind::kDone;
    };
  };
  auto request = [&](int64_t prompt_len, int64_t max_tokens) {
    Request r;
    r.prompt = tok.encode("<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜></think>");
    while (int64_t(r.prompt.size()) < prompt_len) r.prompt.insert(r.prompt.begin() + 1, word[0]);
    r.sampling.temperature = 0;
    r.max_tokens = max_tokens;
    r.logprobs = 0;
    return r;
  };
  Stream streams[3], prompt;
  for (int i = 0; i < 3; ++i) {  // one after the other, so they take scripts 0..2
    EXPECT_TRUE(e.submit(request(12, 120), sink(streams[i])).ok());
    for (int k = 0; k < 500; ++k) {
      {
        std::lock_guard<std::mutex> l(streams[i].mu);
        if (streams[i].t.size() >= 2) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // decode-only steps: the reference gap
  const double t_in = secs();
  EXPECT_TRUE(e.submit(request(1000, 3), sink(prompt)).ok());
  double t_first = 0;
  for (int k = 0; k < 6000 && t_first == 0; ++k) {
    {
      std::lock_guard<std::mutex> l(prompt.mu);
      if (!prompt.t.empty()) t_first = prompt.t.front();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GT(t_first, 0) << "the long prompt never answered";
  for (int k = 0; k < 6000; ++k) {
    bool all = true;
    for (auto& s : streams) {
      std::lock_guard<std::mutex> l(s.mu);
      all = all && s.done;
    }
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  Result_ res;
  std::vector<double> out;
  for (auto& s : streams) {
    std::lock_guard<std::mutex> l(s.mu);
    EXPECT_TRUE(s.done);
    EXPECT_EQ(s.t.size(), 120u);
    for (size_t k = 1; k < s.t.size(); ++k) {
      const double gap = s.t[k] - s.t[k - 1];
      if (s.t[k] > t_in && s.t[k] <= t_first) res.worst_in = std::max(res.worst_in, gap);
      else out.push_back(gap);
    }
  }
  std::sort(out.begin(), out.end());
  if (!out.empty()) res.median_out = out[out.size() / 2];
  {
    std::lock_guard<std::mutex> l(prompt.mu);
    res.prompt_chunks = prompt.prefill_events;
  }
  for (int k = 0; k < 500 && !res.prompt_answered; ++k) {
    {
      std::lock_guard<std::mutex> l(prompt.mu);
      res.prompt_answered = prompt.done;
    }
    if (!res.prompt_answered) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  res.stats = e.stats();
  return res;
}

TEST(EngineRounds, MeasuredPolicyBoundsTheStreamsGapWhileAPromptComesIn) {
  const Result_ r = run(0);
  std::printf("measured policy: worst gap while prefilling %.1f ms, median gap otherwise %.1f ms (%.2fx), %lld chunks, "
              "last mixed chunk %lld rows, %lld reference steps\n",
              r.worst_in * 1e3, r.median_out * 1e3, r.worst_in / r.median_out, (long long)r.prompt_chunks,
              (long long)r.stats.mixed_prefill_rows, (long long)r.stats.reference_steps);
  EXPECT_LE(r.worst_in, 3.0 * r.median_out);
  EXPECT_GT(r.prompt_chunks, 8) << "the prompt came in over many steps";
  EXPECT_TRUE(r.prompt_answered);
  EXPECT_GE(r.stats.reference_steps, 1);
  EXPECT_GT(r.stats.mixed_prefill_rows, 4) << "the chunk grew past the floor";
  // The engine's own gap histogram saw the streams' tokens.
  int64_t n = 0;
  for (int64_t c : r.stats.gap_hist) n += c;
  EXPECT_EQ(n, r.stats.gaps);
  EXPECT_GE(r.stats.gaps, 3 * 119);
  EXPECT_GE(r.stats.gap_max_s, r.worst_in * 0.9);
}

TEST(EngineRounds, FixedQuarterChunkBreaksTheBoundOnThisWorkload) {
  const Result_ r = run(128);
  std::printf("fixed 128 rows: worst gap while prefilling %.1f ms, median gap otherwise %.1f ms (%.2fx)\n", r.worst_in * 1e3,
              r.median_out * 1e3, r.worst_in / r.median_out);
  EXPECT_GT(r.worst_in, 3.0 * r.median_out);
  EXPECT_TRUE(r.prompt_answered);
  EXPECT_EQ(r.stats.reference_steps, 0);
}

}  // namespace
}  // namespace fb::engine
