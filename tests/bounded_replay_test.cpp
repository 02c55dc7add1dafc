// SWA bounded replay (spec/11 §8.4, issue 7; [approx-approved], off by default) on the CPU
// executor: prompts no longer than the window give exact results bit for bit; on longer prompts
// the encoder, Engram, every compressed cache and index key and the decoder's first window stay
// exact while the decoder layers above it run only over the last window (so the mode cannot
// silently be exact mode); chunking never changes a bit; decode, DSpark and rollback work after it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <unistd.h>

#include "base/mapped_file.h"
#include "cpu/executor.h"
#include "fixture_util.h"
#include "engine/generator.h"
#include "engine/replay_quality.h"
#include "engine/scripted_executor.h"
#include "loader/tiny_model.h"

namespace fb {
namespace {

namespace fs = std::filesystem;

using Fixture = testing_util::CpuFixture;
Fixture load(const char* name) { return testing_util::load_cpu_fixture(name); }

struct Prefilled {
  std::vector<float> logits;                   // last prompt row
  std::vector<std::vector<uint16_t>> blocks;   // after_block taps, concatenated over chunks
  std::vector<uint16_t> dspark;                // DSpark tap rows of every prompt row
};

// Prefill in chunks (0 = one shot) with every row carrying replay_start.
Prefilled prefill(const cpu::CpuModel& m, cpu::SessionCache& s, const std::vector<int32_t>& prompt, int64_t replay_start,
                  int64_t chunk = 0) {
  const int64_t N = int64_t(prompt.size());
  if (chunk <= 0) chunk = N;
  Prefilled out;
  out.blocks.resize(size_t(m.config().n_layers));
  for (int64_t s0 = 0; s0 < N; s0 += chunk) {
    model::Step st;
    for (int64_t p = s0; p < std::min(N, s0 + chunk); ++p) {
      st.rows.push_back(model::prefill_row(p, prompt[size_t(p)], N, replay_start));
    }
    model::Taps taps;
    taps.enabled = true;
    auto o = m.forward_cpu(st, {&s}, &taps);
    EXPECT_TRUE(o.ok()) << o.status().to_string();
    if (!o.ok()) return out;
    if (!o->logits.empty()) out.logits = o->logits;
    for (size_t l = 0; l < out.blocks.size(); ++l)
      out.blocks[l].insert(out.blocks[l].end(), taps.after_block[l].begin(), taps.after_block[l].end());
    out.dspark.insert(out.dspark.end(), o->taps.begin(), o->taps.end());
  }
  return out;
}

std::vector<float> decode(const cpu::CpuModel& m, cpu::SessionCache& s, int32_t token) {
  model::Step st;
  st.rows.push_back(model::decode_row(s.next_pos, token));
  auto out = m.forward_cpu(st, {&s});
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? out->logits : std::vector<float>{};
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every byte a later query can read, including which window slots exist at all, and the tails.
void expect_same_caches(const cpu::SessionCache& a, const cpu::SessionCache& b) {
  testing_util::expect_same_caches(a, b, a.rings.empty() ? 0 : a.rings[0].slots, true);
}

class ReplayFixture : public ::testing::TestWithParam<const char*> {};

// N <= window: the mode's rule (replay start max(0, N - window)) leaves nothing to skip, so
// logits, every cache byte and the decode that follows equal exact prefill bit for bit, and the
// generator with the option on emits exactly what it emits with the option off.
TEST_P(ReplayFixture, PromptsWithinTheWindowAreBitIdentical) {
  Fixture f = load(GetParam());
  if (!f.model) GTEST_SKIP() << "fixture not present";
  const int64_t W = f.model->config().window_size;
  for (int64_t N : {int64_t(1), W / 2, W}) {
    const std::vector<int32_t> prompt(f.prompt.begin(), f.prompt.begin() + N);
    cpu::SessionCache e(f.model->config()), r(f.model->config());
    const Prefilled pe = prefill(*f.model, e, prompt, 0);
    const Prefilled pr = prefill(*f.model, r, prompt, std::max<int64_t>(0, N - W));
    EXPECT_TRUE(same(pe.logits, pr.logits)) << "N " << N;
    for (int k = 0; k < 4; ++k) EXPECT_TRUE(same(decode(*f.model, e, 60 + k), decode(*f.model, r, 60 + k))) << "N " << N << " step " << k;
    expect_same_caches(e, r);

    engine::GeneratorOptions off, on;
    on.prefill_replay = true;
    engine::Generator ge(*f.model, off), gr(*f.model, on);
    ASSERT_TRUE(ge.prefill(prompt).ok());
    ASSERT_TRUE(gr.prefill(prompt).ok());
    engine::SamplingParams sp;
    sp.temperature = 0;
    engine::Rng a(0), b(0);
    std::vector<int32_t> oe, orp;
    std::vector<engine::TokenLogprob> le, lr;
    while (oe.size() < 12) ASSERT_TRUE(ge.next(sp, a, &oe, &le, 0).ok());
    while (orp.size() < 12) ASSERT_TRUE(gr.next(sp, b, &orp, &lr, 0).ok());
    oe.resize(12);
    orp.resize(12);
    EXPECT_EQ(oe, orp) << "N " << N;
    for (size_t i = 0; i < std::min(le.size(), lr.size()); ++i) EXPECT_EQ(le[i].logprob, lr[i].logprob) << "N " << N << " token " << i;
  }
}

// N > window: what §8.4 keeps exact is bit-identical to exact prefill; the decoder above its
// first layer holds only the replayed positions, and the last row's logits move (a silently
// exact run fails here).
TEST_P(ReplayFixture, LongPromptKeepsEncoderAndGlobalKvExact) {
  Fixture f = load(GetParam());
  if (!f.model) GTEST_SKIP() << "fixture not present";
  const model::Config& c = f.model->config();
  const int64_t N = int64_t(f.prompt.size()), W = c.window_size, s = N - W, D = c.decoder_start;
  ASSERT_GT(N, W) << "the fixture prompt must be longer than the window";
  ASSERT_GT(D, 0);
  cpu::SessionCache e(c), r(c);
  const Prefilled pe = prefill(*f.model, e, f.prompt, 0);
  const Prefilled pr = prefill(*f.model, r, f.prompt, s);
  EXPECT_FALSE(same(pe.logits, pr.logits)) << "bounded replay gave the exact logits";
  for (float x : pr.logits) ASSERT_TRUE(std::isfinite(x));
  // Encoder blocks (Engram included) bit-identical for every row.
  for (int64_t l = 0; l < D; ++l) EXPECT_EQ(pe.blocks[size_t(l)], pr.blocks[size_t(l)]) << "encoder block " << l;
  // Global KV and index keys of every source, the decoder's included, bit-identical.
  for (int64_t l = 0; l < c.n_layers; ++l) {
    EXPECT_EQ(e.comp[size_t(l)].kv, r.comp[size_t(l)].kv) << "compressed KV layer " << l;
    EXPECT_EQ(e.comp[size_t(l)].keys, r.comp[size_t(l)].keys) << "index keys layer " << l;
  }
  int rows_differ = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const cpu::Ring& re = e.rings[size_t(l)];
    const cpu::Ring& rr = r.rings[size_t(l)];
    for (int64_t q = std::max<int64_t>(0, N - re.slots); q < N; ++q) {
      const uint8_t* a = re.find(q);
      const uint8_t* b = rr.find(q);
      ASSERT_TRUE(a) << "exact ring layer " << l << " pos " << q;
      if (l >= D && q < s) {
        EXPECT_EQ(b, nullptr) << "decoder ring layer " << l << " holds non-replayed position " << q;
        continue;
      }
      ASSERT_TRUE(b) << "ring layer " << l << " pos " << q;
      const bool eq = std::memcmp(a, b, size_t(re.row_bytes)) == 0;
      // Encoder windows and the decoder's first window (its input is the exact encoder output).
      if (l <= D) EXPECT_TRUE(eq) << "ring layer " << l << " pos " << q;
      rows_differ += !eq;
    }
  }
  EXPECT_GT(rows_differ, 0) << "no decoder window row changed: the decoder was not replayed";
  // DSpark tap rows: replayed rows carry them; rows that left at the encoder carry zeros for taps
  // of decoder layers (the draft rings only ever read the last window).
  const int64_t tap_w = int64_t(c.dspark_target_layer_ids.size()) * c.dim;
  for (size_t i = 0; i < c.dspark_target_layer_ids.size(); ++i) {
    const bool decoder_tap = c.dspark_target_layer_ids[i] >= D;
    for (int64_t p = 0; p < N; ++p) {
      const uint16_t* tr = &pr.dspark[size_t(p * tap_w + int64_t(i) * c.dim)];
      const uint16_t* te = &pe.dspark[size_t(p * tap_w + int64_t(i) * c.dim)];
      bool zero = true;
      for (int64_t d = 0; d < c.dim; ++d) zero = zero && tr[d] == 0;
      if (decoder_tap && p < s) EXPECT_TRUE(zero) << "tap " << i << " pos " << p;
      else if (!decoder_tap) EXPECT_EQ(std::memcmp(tr, te, size_t(c.dim) * 2), 0) << "encoder tap " << i << " pos " << p;
    }
  }
  // Decode afterwards runs every layer over the replayed decoder windows.
  for (int k = 0; k < 2 * W; ++k) {
    const auto l = decode(*f.model, r, 90 + k % 7);
    ASSERT_EQ(int64_t(l.size()), c.vocab_size);
    for (float x : l) ASSERT_TRUE(std::isfinite(x));
  }
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (int64_t q = r.next_pos - W; q < r.next_pos; ++q) EXPECT_TRUE(r.rings[size_t(l)].find(q)) << "layer " << l << " pos " << q;
}

// Replay start and prefill end travel with every row, so any chunking (including chunks that
// straddle the replay start or hold only encoder rows) reproduces the one-shot bits.
TEST_P(ReplayFixture, ChunkedReplayIsBitIdenticalToOneShot) {
  Fixture f = load(GetParam());
  if (!f.model) GTEST_SKIP() << "fixture not present";
  const model::Config& c = f.model->config();
  const int64_t N = int64_t(f.prompt.size()), s = N - c.window_size;
  cpu::SessionCache ref(c);
  const Prefilled want = prefill(*f.model, ref, f.prompt, s);
  std::vector<std::vector<float>> want_dec;
  for (int k = 0; k < 5; ++k) want_dec.push_back(decode(*f.model, ref, 100 + k));
  for (int64_t chunk : {int64_t(1), int64_t(7), int64_t(c.window_size), s + 1}) {
    cpu::SessionCache x(c);
    const Prefilled got = prefill(*f.model, x, f.prompt, s, chunk);
    EXPECT_TRUE(same(got.logits, want.logits)) << "chunk " << chunk;
    for (int k = 0; k < 5; ++k) EXPECT_TRUE(same(decode(*f.model, x, 100 + k), want_dec[size_t(k)])) << "chunk " << chunk << " step " << k;
    expect_same_caches(x, ref);
  }
}

TEST_P(ReplayFixture, RejectsRowsItCannotHonour) {
  Fixture f = load(GetParam());
  if (!f.model) GTEST_SKIP() << "fixture not present";
  const int64_t N = int64_t(f.prompt.size());
  auto one = [&](model::RowKind kind, int64_t replay_start, bool logits) {
    cpu::SessionCache s(f.model->config());
    model::Step st;
    model::Row r;
    r.pos = 0;
    r.token = f.prompt[0];
    r.kind = kind;
    r.prefill_end = kind == model::RowKind::kPrefill ? N : 0;
    r.replay_start = replay_start;
    r.want_logits = logits;
    st.rows.push_back(r);
    return f.model->forward_cpu(st, {&s}).status();
  };
  EXPECT_FALSE(one(model::RowKind::kDecode, 3, true).ok());   // decode rows are never replayed
  EXPECT_FALSE(one(model::RowKind::kPrefill, N, false).ok()); // nothing left to replay
  EXPECT_FALSE(one(model::RowKind::kPrefill, 5, true).ok());  // an encoder-only row has no logits
  EXPECT_TRUE(one(model::RowKind::kPrefill, 5, false).ok());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ReplayFixture, ::testing::Values("tiny-s0", "tiny-s1-long"));

// An executor that does not run bounded replay is refused, never run exactly in its place.
TEST(ReplayGenerator, RefusedByExecutorsWithoutIt) {
  engine::ScriptedExecutor ex(1000, {{5, 6, 7}});
  EXPECT_FALSE(ex.supports_bounded_replay());
  engine::GeneratorOptions on;
  on.prefill_replay = true;
  engine::Generator g(ex, on);
  const std::vector<int32_t> prompt(300, 9);
  EXPECT_EQ(g.prefill(prompt).code(), StatusCode::kUnsupported);
}

// A written tiny model (window 32, decoder = layers 4-7) with a prompt of several windows,
// through the generator: chunking does not change the output, DSpark greedy equals plain
// greedy after a replayed prefill (draft rings seeded from replayed rows only), and the
// measurement tool reports KL 0 within the window and > 0 beyond it.
TEST(ReplayGenerator, TinyModelLongPrompt) {
  const std::string dir = (fs::temp_directory_path() / ("fb_replay_tiny_" + std::to_string(::getpid()))).string();
  loader::TinyModelOptions to;
  to.out_dir = dir;
  to.seed = 5;
  to.vocab_size = 2048;
  to.engram_compressed_vocab = 1500;
  ASSERT_TRUE(loader::write_tiny_model(to).ok());
  std::vector<int32_t> token_map(size_t(to.vocab_size));
  for (size_t i = 0; i < token_map.size(); ++i) token_map[i] = int32_t(i * 7 % size_t(to.engram_compressed_vocab));
  auto ex = cpu::CpuModel::load(dir, token_map);
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  const model::Config& c = (*ex)->config();
  ASSERT_EQ(c.decoder_start, 4);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 5 * c.window_size + 3; ++i) prompt.push_back(int32_t((i * 131 + 17) % 2000));
  auto gen = [&](engine::GeneratorOptions opt, int n) {
    engine::Generator g(**ex, opt);
    EXPECT_TRUE(g.prefill(prompt).ok());
    engine::SamplingParams sp;
    sp.temperature = 0;
    engine::Rng rng(0);
    std::vector<int32_t> out;
    while (int(out.size()) < n) {
      Status st = g.next(sp, rng, &out);
      EXPECT_TRUE(st.ok()) << st.to_string();
      if (!st.ok()) break;
    }
    out.resize(size_t(n));
    return out;
  };
  engine::GeneratorOptions a, b, d;
  a.prefill_replay = b.prefill_replay = d.prefill_replay = true;
  a.dspark = false;
  b.dspark = false;
  b.prefill_chunk = 45;
  d.dspark_verify = c.dspark_block_size;
  const auto plain = gen(a, 24);
  EXPECT_EQ(plain, gen(b, 24));
  EXPECT_EQ(plain, gen(d, 24));

  engine::ReplayQualityOptions qo;
  qo.prompt = std::vector<int32_t>(prompt.begin(), prompt.begin() + c.window_size);
  qo.steps = 4;
  auto within = engine::replay_quality(**ex, qo);
  ASSERT_TRUE(within.ok()) << within.status().to_string();
  EXPECT_EQ(within->max_kl(), 0.0);
  EXPECT_EQ(within->top1_agree(), 5);
  qo.prompt = prompt;
  auto beyond = engine::replay_quality(**ex, qo);
  ASSERT_TRUE(beyond.ok()) << beyond.status().to_string();
  EXPECT_GT(beyond->kl[0], 0.0);
  EXPECT_EQ(beyond->kl.size(), 5u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fb
