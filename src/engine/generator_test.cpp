// Generator on the official fixture checkpoints (skipped when ../shared is absent): greedy with
// DSpark (scheduled, measured cost table) equals greedy without it (spec/13 §6.1, issue 11),
// chunked prefill equals one-shot, prefix reuse equals a fresh session, oracle drafts and forced
// rejections (rollback only, no replay) stay exact; sampled DSpark runs and reproduces by seed.
#include "engine/generator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <unistd.h>

#include "base/mapped_file.h"
#include "cpu/executor.h"
#include "engine/dspark_harness.h"
#include "engine/kv_store.h"
#include "loader/tiny_model.h"

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

// The fixture's CPU model, or nullptr when the fixture is absent (the caller skips); a fixture that
// is present but does not load fails the test.
std::unique_ptr<cpu::CpuModel> fixture_model(const std::string& dir) {
  if (!fs::exists(dir + "/checkpoint/config.json")) return nullptr;
  auto ex = cpu::CpuModel::load(dir + "/checkpoint");
  if (!ex.ok()) {
    ADD_FAILURE() << ex.status().to_string();
    return nullptr;
  }
  return std::move(ex.value());
}

// Every case runs on one fixture's CPU model and prompt; skipped when the fixture is absent.
class GeneratorFixture : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir = fixture(GetParam());
    ex = fixture_model(dir);
    if (!ex) GTEST_SKIP() << "no fixture at " << dir;
    prompt = load_prompt(dir);
  }
  std::string dir;
  std::unique_ptr<cpu::CpuModel> ex;
  std::vector<int32_t> prompt;
};

TEST_P(GeneratorFixture, DsparkGreedyEqualsPlainGreedy) {
  const int n = 48, B = ex->config().dspark_block_size;
  GeneratorOptions off;
  off.dspark = false;
  const auto plain = run(*ex, prompt, n, off);
  // spec/13 §10 item 3: forced L = 1..B, then the scheduler on a cost table measured here.
  for (int L = 1; L <= B + 1; ++L) {
    GeneratorOptions on;
    on.dspark_verify = L <= B ? L : -1;
    DsparkCounters cnt;
    const auto spec = run(*ex, prompt, n, on, &cnt);
    EXPECT_EQ(plain, spec) << "verify " << on.dspark_verify;
    EXPECT_GT(cnt.steps, 0);
    EXPECT_EQ(cnt.verify_rows, cnt.proposals + cnt.steps);
    if (L <= B) {
      EXPECT_EQ(cnt.verify_hist[size_t(L)], cnt.steps);
    }
    std::printf("%s L=%d: dspark rounds=%lld proposals=%lld accepted=%lld hist=", GetParam(), on.dspark_verify,
                (long long)cnt.steps, (long long)cnt.proposals, (long long)cnt.accepted);
    for (auto h : cnt.accepted_hist) std::printf("%lld ", (long long)h);
    if (L > B) {
      std::printf("calibrate_s=%.3f verify lengths=", cnt.calibrate_s);
      for (auto h : cnt.verify_hist) std::printf("%lld ", (long long)h);
    }
    std::printf("\n");
  }
  // Chunked prefill (7 rows) reproduces the one-shot prefill's continuation.
  GeneratorOptions chunked;
  chunked.dspark_verify = B;
  chunked.prefill_chunk = 7;
  EXPECT_EQ(run(*ex, prompt, 16, chunked), std::vector<int32_t>(plain.begin(), plain.begin() + 16));
}

TEST_P(GeneratorFixture, PrefixReuseEqualsFreshSession) {
  GeneratorOptions on;
  Generator g(*ex, on);
  const auto first = run(*ex, prompt, 10, on, nullptr, &g);
  // Next turn: the old prompt, 9 of the generated tokens and a new tail; the cache keeps all of
  // the common prefix (and rolls back the rows the new prompt does not share).
  std::vector<int32_t> turn2 = prompt;
  turn2.insert(turn2.end(), first.begin(), first.begin() + 9);
  turn2.push_back(5);
  turn2.push_back(7);
  const auto reused = run(*ex, turn2, 12, on, nullptr, &g);
  EXPECT_GE(g.reused_tokens(), int64_t(prompt.size()));
  EXPECT_EQ(reused, run(*ex, turn2, 12, on));
}

// Test doubles: an executor that forwards everything to another; subclasses override what they
// change.
class Forwarding : public model::Executor {
 public:
  explicit Forwarding(model::Executor& inner) : in_(inner) {}
  const model::Config& config() const override { return in_.config(); }
  std::unique_ptr<model::SessionState> new_session() const override { return in_.new_session(); }
  int64_t preferred_prefill_chunk() const override { return in_.preferred_prefill_chunk(); }
  Result<model::StepOutput> forward(const model::Step& st, const std::vector<model::SessionState*>& s, model::Taps* t) override {
    return in_.forward(st, s, t);
  }
  Status draft_commit(model::SessionState& s, int64_t f, const uint16_t* r, int64_t n) override { return in_.draft_commit(s, f, r, n); }
  Result<model::DraftOutput> draft(model::SessionState& s, int32_t anchor, const uint16_t* tap, int64_t p) override {
    return in_.draft(s, anchor, tap, p);
  }

 protected:
  model::Executor& in_;
};

// Drafts from an oracle (the plain greedy continuation, every fourth position corrupted) exercise
// acceptance of 1..B drafts, partial rejections and rollbacks, which a random tiny model's own
// drafts almost never reach; the output must still equal plain greedy decoding.
class OracleDrafts final : public Forwarding {
 public:
  OracleDrafts(model::Executor& inner, std::vector<int32_t> full) : Forwarding(inner), full_(std::move(full)) {}
  const char* name() const override { return "oracle-drafts"; }
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
  std::vector<int32_t> full_;
};

// Step::taps_from_row: the executor returns only the tap rows from it on. This double hands the
// generator every row instead, the skipped ones poisoned (0xFFFF, a bf16 NaN), and flags any
// poisoned value the generator passes to the draft later, also when a rollback re-seeds the
// rings from the generator's tap history.
class TapPoison final : public Forwarding {
 public:
  explicit TapPoison(model::Executor& inner) : Forwarding(inner) {}
  const char* name() const override { return "tap-poison"; }
  Result<model::StepOutput> forward(const model::Step& st, const std::vector<model::SessionState*>& s, model::Taps* t) override {
    auto o = in_.forward(st, s, t);
    if (!o.ok()) return o;
    const int64_t skipped = o->taps_first_row, rows = int64_t(st.rows.size());
    const size_t w = config().dspark_target_layer_ids.size() * size_t(config().dim);
    if (skipped == 0 || o->taps.empty()) return o;
    EXPECT_EQ(o->taps.size(), size_t(rows - skipped) * w) << "rows from taps_first_row only";
    o->taps.insert(o->taps.begin(), size_t(skipped) * w, uint16_t(0xFFFF));
    o->taps_first_row = 0;
    poisoned_rows += skipped;
    return o;
  }
  Status draft_commit(model::SessionState& s, int64_t f, const uint16_t* r, int64_t n) override {
    count_poison(r, n);
    return in_.draft_commit(s, f, r, n);
  }
  Result<model::DraftOutput> draft(model::SessionState& s, int32_t anchor, const uint16_t* tap, int64_t p) override {
    count_poison(tap, 1);
    return in_.draft(s, anchor, tap, p);
  }
  int64_t poisoned_rows = 0, read_poison = 0;

 private:
  void count_poison(const uint16_t* rows, int64_t n) {
    const size_t w = config().dspark_target_layer_ids.size() * size_t(config().dim);
    for (size_t i = 0; i < size_t(n) * w; ++i) read_poison += rows[i] == 0xFFFF;
  }
};


std::vector<int32_t> plain_greedy(model::Executor& ex, const std::vector<int32_t>& prompt, int n) {
  GeneratorOptions off;
  off.dspark = false;
  return run(ex, prompt, n, off);
}

// GeneratorOptions::prefill_chunk = 0 takes the executor's preferred_prefill_chunk().
class PrefersSevenRows final : public Forwarding {
 public:
  explicit PrefersSevenRows(model::Executor& inner) : Forwarding(inner) {}
  const char* name() const override { return "prefers-7"; }
  int64_t preferred_prefill_chunk() const override { return 7; }
  Result<model::StepOutput> forward(const model::Step& st, const std::vector<model::SessionState*>& s, model::Taps* t) override {
    if (!st.rows.empty() && st.rows[0].kind == model::RowKind::kPrefill) {
      ++prefill_steps;
      max_rows = std::max(max_rows, int64_t(st.rows.size()));
    }
    return in_.forward(st, s, t);
  }
  int64_t prefill_steps = 0, max_rows = 0;
};

TEST_P(GeneratorFixture, DefaultPrefillStepIsTheExecutors) {
  PrefersSevenRows seven(*ex);
  GeneratorOptions opt;  // prefill_chunk = 0
  EXPECT_EQ(run(seven, prompt, 4, opt), plain_greedy(*ex, prompt, 4));
  EXPECT_EQ(seven.max_rows, 7);
  EXPECT_EQ(seven.prefill_steps, (int64_t(prompt.size()) + 6) / 7);
}

TEST_P(GeneratorFixture, DraftReadsOnlyRequestedTaps) {
  const auto plain = plain_greedy(*ex, prompt, 20);
  TapPoison tp(*ex);
  GeneratorOptions on;
  on.prefill_chunk = 1 << 20;  // one step: the longest prompt asks for the fewest taps
  EXPECT_EQ(run(tp, prompt, 20, on), plain);
  std::printf("%s: %lld tap rows not requested, %lld poisoned values read\n", GetParam(), (long long)tp.poisoned_rows,
              (long long)tp.read_poison);
  EXPECT_EQ(tp.read_poison, 0);
}

TEST_P(GeneratorFixture, OracleDraftsAcceptAndStayExact) {
  const auto plain = plain_greedy(*ex, prompt, 44);
  std::vector<int32_t> full = prompt;
  full.insert(full.end(), plain.begin(), plain.end());
  OracleDrafts oracle(*ex, full);
  DsparkCounters cnt;
  GeneratorOptions on;
  on.dspark_verify = ex->config().dspark_block_size;
  EXPECT_EQ(run(oracle, prompt, 44, on, &cnt), plain);
  EXPECT_GT(cnt.accepted, 0);
  int shapes = 0;
  for (auto h : cnt.accepted_hist) shapes += h > 0;
  EXPECT_GE(shapes, 2) << "want rounds with different accepted counts";
  std::printf("%s oracle: rounds=%lld proposals=%lld accepted=%lld\n", GetParam(), (long long)cnt.steps,
              (long long)cnt.proposals, (long long)cnt.accepted);
}

// Rollback is the only undo (spec/13 §6.5): forced acceptance p = 0.3 / 0.7 with full blocks
// rejects 2..5 rows in most rounds, at every position parity and ring slot; the output must
// still equal plain greedy decoding.
TEST_P(GeneratorFixture, ManyRejectionsStayExact) {
  GeneratorOptions opt;
  opt.dspark_verify = ex->config().dspark_block_size;
  const std::vector<double> ps = {0.3, 0.7};
  std::vector<std::pair<int64_t, int64_t>> runs;  // progress: (done, total) after the plain run and each p
  auto r = run_forced_acceptance(*ex, prompt, 40, ps, opt, 11, [&](int64_t done, int64_t total) { runs.emplace_back(done, total); });
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(runs, (std::vector<std::pair<int64_t, int64_t>>{{1, 3}, {2, 3}, {3, 3}}));
  for (const auto& x : *r) {
    EXPECT_TRUE(x.matches_plain) << "p=" << x.p;
    int64_t multi = 0;  // rounds that rejected >= 2 rows
    for (size_t a = 0; a + 2 < x.accepted_hist.size(); ++a) multi += x.accepted_hist[a];
    EXPECT_GT(multi, 0);
    std::printf("%s p=%.1f: rounds=%lld tokens/round=%.2f (model %.2f), rounds rejecting >= 2 rows: %lld\n", GetParam(), x.p,
                (long long)x.rounds, x.tokens_per_round, x.expected_tokens_per_round, (long long)multi);
  }
}

// n tokens after `prompt`, with DSpark (verifying full blocks) or without, sampled with `sp` from a
// generator seeded with `seed`.
std::vector<int32_t> generate_n(model::Executor& ex, const std::vector<int32_t>& prompt, bool dspark, const SamplingParams& sp, int n,
                                uint64_t seed) {
  GeneratorOptions opt;
  opt.dspark = dspark;
  opt.dspark_verify = dspark ? ex.config().dspark_block_size : -1;
  Generator g(ex, opt);
  EXPECT_TRUE(g.prefill(prompt).ok());
  Rng rng(seed);
  std::vector<int32_t> out;
  while (int(out.size()) < n) EXPECT_TRUE(g.next(sp, rng, &out).ok());
  out.resize(size_t(n));
  return out;
}

// Logit bias and presence / frequency penalties (issue 27) are applied to every row the sampler
// reads, verify rows included, with the drafts accepted before a row counted as generated: greedy
// output with DSpark equals plain greedy output under them, a +100 bias forces its token, and the
// penalties change the output (they are applied) without breaking that identity.
TEST_P(GeneratorFixture, BiasAndPenaltiesKeepDsparkExact) {
  auto gen = [&](bool dspark, const SamplingParams& sp, int n) { return generate_n(*ex, prompt, dspark, sp, n, 7); };
  SamplingParams greedy;
  greedy.temperature = 0;
  const auto plain = gen(false, greedy, 32);
  // +100 on one id: every greedy token is that id, with and without DSpark.
  SamplingParams forced = greedy;
  forced.logit_bias = {{int32_t(plain[3] == 77 ? 78 : 77), 100.0f}};
  const auto f_plain = gen(false, forced, 12), f_spec = gen(true, forced, 12);
  EXPECT_EQ(f_plain, std::vector<int32_t>(12, forced.logit_bias[0].first));
  EXPECT_EQ(f_spec, f_plain);
  // Penalties large enough to forbid repeats: no id twice, and DSpark agrees with plain decoding.
  SamplingParams pen = greedy;
  pen.presence_penalty = 1.5f;
  pen.frequency_penalty = 1000.0f;
  const auto p_plain = gen(false, pen, 32), p_spec = gen(true, pen, 32);
  EXPECT_EQ(p_spec, p_plain);
  std::vector<int32_t> sorted(p_plain);
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "a token repeated under a 1000 frequency penalty";
  std::vector<int32_t> plain_sorted(plain);
  std::sort(plain_sorted.begin(), plain_sorted.end());
  if (std::adjacent_find(plain_sorted.begin(), plain_sorted.end()) != plain_sorted.end()) EXPECT_NE(p_plain, plain);
  // Sampled with bias and penalties: DSpark runs (rejection sampling on processed rows) and a seed reproduces.
  SamplingParams samp;
  samp.temperature = 0.9f;
  samp.presence_penalty = 0.5f;
  samp.frequency_penalty = 0.3f;
  samp.logit_bias = {{5, 2.0f}, {9, -100.0f}};
  const auto s1 = gen(true, samp, 24), s2 = gen(true, samp, 24);
  EXPECT_EQ(s1, s2);
  EXPECT_EQ(std::count(s1.begin(), s1.end(), 9), 0) << "a -100 bias must keep id 9 out";
}

// Phrase bias (issue 27): a -100 bias on a phrase of the greedy output leaves every token before
// the phrase's continuation and changes that one (never the phrase's first token); +100 on another
// continuation forces it; greedy DSpark equals plain greedy under phrase bias (verify rows count
// the accepted drafts as generated); sampled, a banned phrase never completes and a seed reproduces.
TEST_P(GeneratorFixture, PhraseBiasKeepsDsparkExact) {
  auto gen = [&](bool dspark, const SamplingParams& sp, int n) { return generate_n(*ex, prompt, dspark, sp, n, 11); };
  SamplingParams greedy;
  greedy.temperature = 0;
  const int n = 24;
  const auto plain = gen(false, greedy, n);
  // Ban plain[4..7): the first position where plain continues a prefix of the phrase changes.
  SamplingParams ban = greedy;
  ban.phrase_bias = {{{plain[4], plain[5], plain[6]}, -100.0f}};
  size_t diverge = 0;
  for (size_t i = 1; i < plain.size() && !diverge; ++i)
    for (size_t k = 1; k < 3 && k <= i && !diverge; ++k)
      if (std::equal(plain.begin() + ptrdiff_t(i - k), plain.begin() + ptrdiff_t(i), ban.phrase_bias[0].tokens.begin()) &&
          plain[i] == ban.phrase_bias[0].tokens[k])
        diverge = i;
  ASSERT_GT(diverge, 0u);
  ASSERT_LE(diverge, 6u);
  const auto b_plain = gen(false, ban, n), b_spec = gen(true, ban, n);
  EXPECT_TRUE(std::equal(plain.begin(), plain.begin() + ptrdiff_t(diverge), b_plain.begin())) << "tokens before the continuation changed";
  EXPECT_NE(b_plain[diverge], plain[diverge]) << "the banned continuation was emitted at " << diverge;
  EXPECT_EQ(b_spec, b_plain);
  // +100 on [plain[0], x]: the token after plain[0] is x (plain[0] itself unbiased, so still first).
  SamplingParams push = greedy;
  const int32_t x = plain[1] == 77 ? 78 : 77;
  push.phrase_bias = {{{plain[0], x}, 100.0f}};
  const auto p_plain = gen(false, push, 8), p_spec = gen(true, push, 8);
  EXPECT_EQ(p_plain[0], plain[0]);
  EXPECT_EQ(p_plain[1], x);
  EXPECT_EQ(p_spec, p_plain);
  // Sampled: the bigram plain[0] plain[1] is banned and never appears; a seed reproduces with DSpark.
  SamplingParams samp;
  samp.temperature = 1.0f;
  samp.phrase_bias = {{{plain[0], plain[1]}, -100.0f}, {{plain[2]}, 3.0f}};
  const auto s1 = gen(true, samp, 32), s2 = gen(true, samp, 32), s3 = gen(false, samp, 32);
  EXPECT_EQ(s1, s2);
  for (const auto* s : {&s1, &s3})
    for (size_t i = 1; i < s->size(); ++i) EXPECT_FALSE((*s)[i - 1] == plain[0] && (*s)[i] == plain[1]) << "banned bigram at " << i;
}

// Disk KV cache (issue 21): a prompt's state stored by one generator is restored by a fresh one
// (another session, as after a restart) for a prompt that extends it; the continuation is bit for
// bit a cold run's, with and without DSpark, and the restored positions count as reused.
TEST_P(GeneratorFixture, DiskKvCacheRestoreEqualsColdPrefill) {
  const std::string kv = (fs::temp_directory_path() / ("fb_gen_kv_" + std::string(GetParam()) + "_" + std::to_string(getpid()))).string();
  fs::remove_all(kv);
  for (bool dspark : {false, true}) {
    auto store = KvStore::open(kv, 64 << 20, ex->identity());
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    GeneratorOptions with;
    with.dspark = dspark;
    with.kv_store = std::shared_ptr<KvStore>(std::move(store.value()));
    GeneratorOptions cold;
    cold.dspark = dspark;
    // The first turn stores the prompt; the second turn = the prompt + 5 more tokens.
    const std::vector<int32_t> first(prompt.begin(), prompt.end() - 6);
    const auto a = run(*ex, first, 8, with);
    EXPECT_GE(with.kv_store->stats().entries, 1);
    std::vector<int32_t> second(prompt.begin(), prompt.end() - 1);
    Generator g(*ex, with);  // a fresh session: nothing in memory
    const auto restored = run(*ex, second, 16, with, nullptr, &g);
    EXPECT_EQ(g.restored_tokens(), int64_t(first.size()));
    EXPECT_EQ(g.reused_tokens(), int64_t(first.size()));
    EXPECT_EQ(restored, run(*ex, second, 16, cold)) << "dspark " << dspark;
    // The same prompt again: restored whole (logits and tap row from the checkpoint, no prefill).
    Generator g2(*ex, with);
    const auto again = run(*ex, first, 8, with, nullptr, &g2);
    EXPECT_EQ(g2.restored_tokens(), int64_t(first.size()));
    EXPECT_EQ(again, a) << "dspark " << dspark;
    fs::remove_all(kv);
  }
}

// A conversation that grows turn by turn (each prompt extends the last): with delta checkpoints
// the store writes no more than whole checkpoints (tiny-s0: about half) and every turn's output
// is the cold run's, with deltas and without.
TEST_P(GeneratorFixture, DiskKvCacheGrowingConversationWritesDeltas) {
  const int64_t L = int64_t(prompt.size());
  uint64_t written[2] = {0, 0};
  std::vector<std::vector<int32_t>> outs[2];
  for (int deltas = 0; deltas < 2; ++deltas) {
    const std::string kv = (fs::temp_directory_path() / ("fb_gen_kvd_" + std::string(GetParam()) + "_" + std::to_string(getpid()))).string();
    fs::remove_all(kv);
    auto store = KvStore::open(kv, 256 << 20, ex->identity());
    ASSERT_TRUE(store.ok());
    (*store)->set_deltas(deltas == 1);
    GeneratorOptions with;
    with.kv_store = std::shared_ptr<KvStore>(std::move(store.value()));
    for (int64_t n = L / 2; n <= L; n += std::max<int64_t>(1, L / 8)) {
      const std::vector<int32_t> turn(prompt.begin(), prompt.begin() + n);
      Generator g(*ex, with);  // a new request: only the disk cache carries the conversation
      outs[deltas].push_back(run(*ex, turn, 4, with, nullptr, &g));
      if (n > L / 2) EXPECT_GT(g.restored_tokens(), 0) << n;
    }
    written[deltas] = with.kv_store->stats().written;
    fs::remove_all(kv);
  }
  EXPECT_EQ(outs[0], outs[1]);
  GeneratorOptions cold;
  for (size_t t = 0; t < outs[1].size(); ++t) {
    const int64_t n = L / 2 + int64_t(t) * std::max<int64_t>(1, L / 8);
    EXPECT_EQ(outs[1][t], run(*ex, std::vector<int32_t>(prompt.begin(), prompt.begin() + n), 4, cold)) << "turn " << t;
  }
  // A delta is written only when it is under half its full state (on small models the fixed-size
  // rings and the logits row can dominate, and every turn is whole): never more bytes than without.
  EXPECT_LE(written[1], written[0]);
  std::printf("  %zu turns: %llu bytes of checkpoints written with deltas, %llu without\n", outs[1].size(), (unsigned long long)written[1],
              (unsigned long long)written[0]);
}

// The conversation checkpoint at the end of a request (prompt + answer) serves the next turn,
// which resends the answer: more of it restores than the prompt alone, and the output is the cold
// run's. With DSpark the answer may be cut inside a round; then the checkpoint is skipped or
// still a prefix, and the output is the cold run's either way.
TEST_P(GeneratorFixture, DiskKvCacheConversationCheckpointServesTheNextTurn) {
  const size_t half = prompt.size() / 2;
  const std::vector<int32_t> first(prompt.begin(), prompt.begin() + int64_t(half));
  for (bool dspark : {false, true}) {
    SCOPED_TRACE(dspark ? "dspark" : "plain");
    const std::string kv = (fs::temp_directory_path() / ("fb_gen_kvc_" + std::string(GetParam()) + "_" + std::to_string(getpid()))).string();
    fs::remove_all(kv);
    auto store = KvStore::open(kv, 256 << 20, ex->identity());
    ASSERT_TRUE(store.ok());
    GeneratorOptions with;
    with.dspark = dspark;
    with.kv_store = std::shared_ptr<KvStore>(std::move(store.value()));
    GeneratorOptions cold;
    cold.dspark = dspark;
    Generator g(*ex, with);
    const auto answer = run(*ex, first, 12, with, nullptr, &g);
    const int64_t before = with.kv_store->stats().entries;
    g.checkpoint_history(int64_t(first.size() + answer.size()));
    if (!dspark) EXPECT_EQ(with.kv_store->stats().entries, before + 1) << "the conversation's checkpoint";
    std::vector<int32_t> second = first;
    second.insert(second.end(), answer.begin(), answer.end());
    second.insert(second.end(), prompt.begin() + int64_t(half), prompt.begin() + int64_t(std::min(prompt.size(), half + 6)));
    Generator g2(*ex, with);
    const auto out2 = run(*ex, second, 8, with, nullptr, &g2);
    if (!dspark) EXPECT_GT(g2.restored_tokens(), int64_t(first.size())) << "part of the answer restored";
    EXPECT_LE(g2.restored_tokens(), int64_t(first.size() + answer.size()));
    EXPECT_EQ(out2, run(*ex, second, 8, cold));
    fs::remove_all(kv);
  }
}

// Sampled requests run the DSpark loop with rejection sampling on the real draft (sampled
// Markov chain of the CPU executor); a seed reproduces its transcript.
TEST_P(GeneratorFixture, SampledDsparkRunsAndReproduces) {
  auto gen = [&](uint64_t seed, DsparkCounters* cnt) {
    GeneratorOptions opt;
    opt.dspark_verify_sps = {1.0, 1.0, 1.0, 1.0, 1.0, 1.0};
    Generator g(*ex, opt);
    EXPECT_TRUE(g.prefill(prompt).ok());
    SamplingParams sp;
    sp.temperature = 0.8f;
    sp.top_p = 0.95f;
    Rng rng(seed);
    std::vector<int32_t> out;
    while (out.size() < 24) EXPECT_TRUE(g.next(sp, rng, &out).ok());
    out.resize(24);
    *cnt = g.counters();
    return out;
  };
  DsparkCounters a, b;
  const auto x = gen(5, &a), y = gen(5, &b);
  EXPECT_EQ(x, y);
  EXPECT_GT(a.sampled_steps, 0);
  EXPECT_EQ(a.sampled_steps, a.steps);
  std::printf("%s sampled: rounds=%lld proposals=%lld accepted=%lld residual=%lld\n", GetParam(), (long long)a.steps,
              (long long)a.proposals, (long long)a.accepted, (long long)a.residual_draws);
}

// A fresh tiny model (every structural feature, B = 5, window 32, ratio-2 and ratio-1 sources;
// a small vocabulary keeps it quick): forced acceptance with full blocks rejects 1..5 rows per
// round across ring wrap-around and ratio-2 pair boundaries, and greedy output stays exactly
// plain greedy output (rollback only, spec/13 §6.5, §10 item 5).
TEST(GeneratorTinyWrite, ManyRejectionsOfFullBlocksStayExact) {
  const std::string dir = (fs::temp_directory_path() / ("fb_gen_tiny_" + std::to_string(::getpid()))).string();
  loader::TinyModelOptions to;
  to.out_dir = dir;
  to.seed = 3;
  to.vocab_size = 2048;
  to.engram_compressed_vocab = 1500;
  ASSERT_TRUE(loader::write_tiny_model(to).ok());
  std::vector<int32_t> token_map(size_t(to.vocab_size));  // any map into the Engram classes
  for (size_t i = 0; i < token_map.size(); ++i) token_map[i] = int32_t(i * 7 % size_t(to.engram_compressed_vocab));
  auto ex = cpu::CpuModel::load(dir, token_map);
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  const int B = (*ex)->config().dspark_block_size;
  ASSERT_EQ(B, 5);
  const std::vector<int32_t> prompt = {0, 17, 300, 4, 1999, 52, 7, 7, 810, 33, 1024, 5};
  GeneratorOptions opt;
  opt.dspark_verify = B;
  const std::vector<double> ps = {0.3, 0.6, 0.85};
  auto r = run_forced_acceptance(**ex, prompt, 120, ps, opt, 21);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::vector<int64_t> rejected(size_t(B + 1), 0);  // rounds by rejected rows
  for (const auto& x : *r) {
    EXPECT_TRUE(x.matches_plain) << "p=" << x.p;
    for (int a = 0; a <= B; ++a) rejected[size_t(B - a)] += x.accepted_hist[size_t(a)];
    std::printf("tiny p=%.2f: rounds=%lld tokens/round=%.2f (model %.2f)\n", x.p, (long long)x.rounds, x.tokens_per_round,
                x.expected_tokens_per_round);
  }
  for (int k = 0; k <= B; ++k) EXPECT_GT(rejected[size_t(k)], 0) << "no round rejected " << k << " rows";
  fs::remove_all(dir);
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

// Prompt of 5 text tokens of `base`, n_img image rows (embeddings from `seed`, content keys
// seed:slot), then n_tail text tokens of `base` from tail_at.
void image_prompt(const std::vector<int32_t>& base, int32_t img, int64_t D, int n_img, int n_tail, int tail_at, uint32_t seed,
                  std::vector<int32_t>& prompt, PromptEmbeddings& e) {
  prompt.assign(base.begin(), base.begin() + 5);
  e.row.assign(5, -1);
  e.key.assign(5, 0);
  for (int i = 0; i < n_img; ++i) {
    prompt.push_back(img);
    e.row.push_back(i);
    e.key.push_back((uint64_t(seed) << 32) | uint64_t(i + 1));
  }
  for (int i = 0; i < n_tail; ++i) {
    prompt.push_back(base[size_t(tail_at + i)]);
    e.row.push_back(-1);
    e.key.push_back(0);
  }
  e.data.resize(size_t(n_img * D));
  for (auto& v : e.data) {
    seed = seed * 1664525u + 1013904223u;
    const float f = (float(seed >> 8) / 16777216.0f - 0.5f) * 0.4f;
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    v = uint16_t(bits >> 16);
  }
}

// n greedy tokens after prefilling `p` with its image rows `e` on g.
std::vector<int32_t> greedy_with_images(Generator& g, const std::vector<int32_t>& p, const PromptEmbeddings& e, size_t n) {
  Status s = g.prefill(p, {}, &e);
  EXPECT_TRUE(s.ok()) << s.to_string();
  SamplingParams sp;
  sp.temperature = 0;
  Rng rng(0);
  std::vector<int32_t> out;
  while (out.size() < n) {
    Status st = g.next(sp, rng, &out);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) break;
  }
  out.resize(std::min<size_t>(out.size(), n));
  return out;
}

// Prefix reuse after a prompt with an image span: prompt A (5 text, 12 image rows, 3 text),
// greedy tokens, then prompt B (the same 5 text, 9 other image rows, 4 text) on the same
// generator must give the tokens a fresh generator gives for B (DSpark on and off). This failed
// before rollback checked the ratio-2 compressor tails (a reused tail slot was read silently).
TEST_P(GeneratorFixture, ReuseAfterAnImagePromptEqualsFresh) {
  const std::vector<int32_t>& base = prompt;
  const auto& c = ex->config();
  const int64_t D = c.dim;
  const int32_t img = int32_t(std::min<int64_t>(c.image_token_id, c.vocab_size - 1));
  std::vector<int32_t> pa, pb;
  PromptEmbeddings ea, eb;
  image_prompt(base, img, D, 12, 3, 10, 1, pa, ea);
  image_prompt(base, img, D, 9, 4, 20, 2, pb, eb);
  auto gen = [](Generator& g, const std::vector<int32_t>& p, const PromptEmbeddings& e, size_t n = 24) { return greedy_with_images(g, p, e, n); };
  for (bool dspark : {false, true}) {
    GeneratorOptions opt;
    opt.dspark = dspark;
    Generator reused(*ex, opt), fresh(*ex, opt);
    gen(reused, pa, ea, 3);  // short, so positions 0..4 are still in the window rings
    const auto got = gen(reused, pb, eb);
    // Position 4's pending ratio-2 tail was reused by position 20, so the cache steps back to 4.
    EXPECT_EQ(reused.reused_tokens(), 4) << "dspark " << dspark;
    EXPECT_EQ(got, gen(fresh, pb, eb)) << "dspark " << dspark;
  }
}

// The disk KV cache with image prompts: images are matched by content (PromptEmbeddings::key).
// The same image prompt restores whole in a fresh generator and gives the same tokens; the same
// text with a different image restores at most the text before it and equals a cold run.
TEST_P(GeneratorFixture, DiskKvCacheMatchesImagesByContent) {
  const std::vector<int32_t>& base = prompt;
  const auto& c = ex->config();
  const int32_t img = int32_t(std::min<int64_t>(c.image_token_id, c.vocab_size - 1));
  std::vector<int32_t> pa, pb;
  PromptEmbeddings ea, eb;
  image_prompt(base, img, c.dim, 12, 3, 10, 1, pa, ea);
  image_prompt(base, img, c.dim, 12, 3, 10, 2, pb, eb);  // same tokens, another image
  ASSERT_EQ(pa, pb);
  auto gen = [](Generator& g, const std::vector<int32_t>& p, const PromptEmbeddings& e) { return greedy_with_images(g, p, e, 12); };
  const std::string kv = (fs::temp_directory_path() / ("fb_gen_kv_img_" + std::string(GetParam()) + "_" + std::to_string(getpid()))).string();
  fs::remove_all(kv);
  auto store = KvStore::open(kv, 64 << 20, ex->identity());
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  GeneratorOptions with, cold;
  with.kv_store = std::shared_ptr<KvStore>(std::move(store.value()));
  Generator g1(*ex, with), cold_a(*ex, cold), cold_b(*ex, cold);
  const auto a = gen(g1, pa, ea);
  EXPECT_GE(with.kv_store->stats().entries, 1) << "an image prompt is stored";
  EXPECT_EQ(a, gen(cold_a, pa, ea));
  Generator g2(*ex, with);
  EXPECT_EQ(gen(g2, pa, ea), a) << "the same image prompt from the disk cache";
  EXPECT_EQ(g2.restored_tokens(), int64_t(pa.size())) << "restored whole";
  Generator g3(*ex, with);
  const auto b = gen(g3, pb, eb);
  EXPECT_LE(g3.restored_tokens(), 5) << "a different image must not be restored";
  EXPECT_EQ(b, gen(cold_b, pb, eb));
  fs::remove_all(kv);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GeneratorFixture, ::testing::Values("tiny-s0", "tiny-s1-long"));

}  // namespace
}  // namespace fb::engine
