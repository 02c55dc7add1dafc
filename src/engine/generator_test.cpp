// Generator on the official fixture checkpoints (skipped when ../shared is absent): greedy with
// DSpark equals greedy without it (spec/13 §6.1, issue 11), chunked prefill equals one-shot,
// prefix reuse equals a fresh session, oracle drafts (forced acceptance) stay exact.
#include "engine/generator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "base/mapped_file.h"
#include "cpu/executor.h"

namespace fb::engine {
namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& name) { return std::string(FB_SHARED_DIR) + "/fixtures/" + name; }

std::vector<int32_t> load_prompt(const std::string& dir) {
  auto b = read_file_bytes(dir + "/prompt.i32");
  EXPECT_TRUE(b.ok());
  std::vector<int32_t> v(b->size() / 4);
  std::memcpy(v.data(), b->data(), v.size() * 4);
  return v;
}

std::vector<int32_t> run(model::Executor& ex, const std::vector<int32_t>& prompt, int n, GeneratorOptions opt,
                         DsparkCounters* counters = nullptr, Generator* reuse = nullptr) {
  std::unique_ptr<Generator> own;
  Generator* g = reuse;
  if (!g) {
    own = std::make_unique<Generator>(ex, opt);
    g = own.get();
  }
  Status s = g->prefill(prompt);
  EXPECT_TRUE(s.ok()) << s.to_string();
  SamplingParams sp;
  sp.temperature = 0;
  Rng rng(0);
  std::vector<int32_t> out;
  while (int(out.size()) < n) {
    Status st = g->next(sp, rng, &out);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) break;
  }
  out.resize(size_t(std::min<size_t>(out.size(), size_t(n))));
  if (counters) *counters = g->counters();
  return out;
}

class GeneratorFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(GeneratorFixture, DsparkGreedyEqualsPlainGreedy) {
  const std::string dir = fixture(GetParam());
  if (!fs::exists(dir + "/checkpoint/config.json")) GTEST_SKIP() << "no fixture at " << dir;
  auto ex = cpu::CpuModel::load(dir + "/checkpoint");
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  const auto prompt = load_prompt(dir);
  const int n = 48;
  GeneratorOptions off;
  off.dspark = false;
  GeneratorOptions on;
  on.dspark = true;
  const auto plain = run(**ex, prompt, n, off);
  DsparkCounters cnt;
  const auto spec = run(**ex, prompt, n, on, &cnt);
  EXPECT_EQ(plain, spec);
  EXPECT_GT(cnt.steps, 0);
  EXPECT_EQ(cnt.verify_rows, cnt.proposals + cnt.steps);
  std::printf("%s: dspark rounds=%lld proposals=%lld accepted=%lld hist=", GetParam(), (long long)cnt.steps,
              (long long)cnt.proposals, (long long)cnt.accepted);
  for (auto h : cnt.accepted_hist) std::printf("%lld ", (long long)h);
  std::printf("\n");
  // Chunked prefill (7 rows) reproduces the one-shot prefill's continuation.
  GeneratorOptions chunked = on;
  chunked.prefill_chunk = 7;
  EXPECT_EQ(run(**ex, prompt, 16, chunked), std::vector<int32_t>(plain.begin(), plain.begin() + 16));
}

TEST_P(GeneratorFixture, PrefixReuseEqualsFreshSession) {
  const std::string dir = fixture(GetParam());
  if (!fs::exists(dir + "/checkpoint/config.json")) GTEST_SKIP() << "no fixture at " << dir;
  auto ex = cpu::CpuModel::load(dir + "/checkpoint");
  ASSERT_TRUE(ex.ok());
  const auto prompt = load_prompt(dir);
  GeneratorOptions on;
  Generator g(**ex, on);
  const auto first = run(**ex, prompt, 10, on, nullptr, &g);
  // Next turn: the old prompt, 9 of the generated tokens and a new tail; the cache keeps all of
  // the common prefix (and rolls back the rows the new prompt does not share).
  std::vector<int32_t> turn2 = prompt;
  turn2.insert(turn2.end(), first.begin(), first.begin() + 9);
  turn2.push_back(5);
  turn2.push_back(7);
  const auto reused = run(**ex, turn2, 12, on, nullptr, &g);
  EXPECT_GE(g.reused_tokens(), int64_t(prompt.size()));
  EXPECT_EQ(reused, run(**ex, turn2, 12, on));
}

// Drafts from an oracle (the plain greedy continuation, every fourth position corrupted) exercise
// acceptance of 1..B drafts, partial rejections and rollbacks, which a random tiny model's own
// drafts almost never reach; the output must still equal plain greedy decoding.
class OracleDrafts final : public model::Executor {
 public:
  OracleDrafts(model::Executor& inner, std::vector<int32_t> full) : in_(inner), full_(std::move(full)) {}
  const model::Config& config() const override { return in_.config(); }
  const char* name() const override { return "oracle-drafts"; }
  std::unique_ptr<model::SessionState> new_session() const override { return in_.new_session(); }
  Result<model::StepOutput> forward(const model::Step& st, const std::vector<model::SessionState*>& s, model::Taps* t) override {
    return in_.forward(st, s, t);
  }
  Status draft_commit(model::SessionState& s, int64_t f, const uint16_t* r, int64_t n) override { return in_.draft_commit(s, f, r, n); }
  Result<model::DraftOutput> draft(model::SessionState& s, int32_t anchor, const uint16_t* tap, int64_t p) override {
    auto d = in_.draft(s, anchor, tap, p);
    if (!d.ok()) return d;
    for (size_t i = 1; i < d->ids.size(); ++i) {
      const int64_t pos = p + 1 + int64_t(i);
      int32_t id = pos < int64_t(full_.size()) ? full_[size_t(pos)] : 0;
      if (pos % 4 == 1) id = (id + 1) % int32_t(config().vocab_size);
      d->ids[i] = id;
    }
    return d;
  }

 private:
  model::Executor& in_;
  std::vector<int32_t> full_;
};

TEST_P(GeneratorFixture, OracleDraftsAcceptAndStayExact) {
  const std::string dir = fixture(GetParam());
  if (!fs::exists(dir + "/checkpoint/config.json")) GTEST_SKIP() << "no fixture at " << dir;
  auto ex = cpu::CpuModel::load(dir + "/checkpoint");
  ASSERT_TRUE(ex.ok());
  const auto prompt = load_prompt(dir);
  GeneratorOptions off;
  off.dspark = false;
  const auto plain = run(**ex, prompt, 44, off);
  std::vector<int32_t> full = prompt;
  full.insert(full.end(), plain.begin(), plain.end());
  OracleDrafts oracle(**ex, full);
  DsparkCounters cnt;
  EXPECT_EQ(run(oracle, prompt, 44, GeneratorOptions{}, &cnt), plain);
  EXPECT_GT(cnt.accepted, 0);
  int shapes = 0;
  for (auto h : cnt.accepted_hist) shapes += h > 0;
  EXPECT_GE(shapes, 2) << "want rounds with different accepted counts";
  std::printf("%s oracle: rounds=%lld proposals=%lld accepted=%lld replayed=%lld\n", GetParam(), (long long)cnt.steps,
              (long long)cnt.proposals, (long long)cnt.accepted, (long long)cnt.replay_rows);
}

// The built-in tiny model (real V4.1 vocabulary, all structural features): set FB_TINY_MODEL to
// a `flashbox make-tiny` folder, or have tiny-model/ in the source tree. Skipped otherwise.
TEST(GeneratorTinyModel, DsparkGreedyEqualsPlainGreedy) {
  std::string dir = std::getenv("FB_TINY_MODEL") ? std::getenv("FB_TINY_MODEL") : std::string(FB_SOURCE_DIR) + "/tiny-model";
  if (!fs::exists(dir + "/config.json")) GTEST_SKIP() << "no tiny model at " << dir << " (flashbox make-tiny --out tiny-model)";
  auto ex = cpu::CpuModel::load(dir);
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  const std::vector<int32_t> prompt = {0, 128803, 19923, 14, 2295, 477, 260, 6464, 33, 128804, 128799 - 1};
  GeneratorOptions off;
  off.dspark = false;
  DsparkCounters cnt;
  EXPECT_EQ(run(**ex, prompt, 40, GeneratorOptions{}, &cnt), run(**ex, prompt, 40, off));
  EXPECT_GT(cnt.steps, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GeneratorFixture, ::testing::Values("tiny-s0", "tiny-s1-long"));

}  // namespace
}  // namespace fb::engine
