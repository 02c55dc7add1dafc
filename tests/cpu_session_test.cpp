// Cross-module checks of the CPU executor's session semantics on the official fixture checkpoints:
// chunked prefill equals one-shot prefill bit for bit (spec/11 §8.3 via Row::prefill_end), decode
// rows after either are identical, and rollback leaves every cache byte as a run that never saw
// the rejected rows (spec/12 §1.1, spec/13 §6.5).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>

#include "base/crc32c.h"
#include "base/mapped_file.h"
#include "cpu/executor.h"
#include "fixture_util.h"

namespace fb {
namespace {

namespace fs = std::filesystem;

using Fixture = testing_util::CpuFixture;
Fixture load(const char* name) { return testing_util::load_cpu_fixture(name); }

// Prefills `prompt` in chunks of `chunk` rows (0 = one shot); returns the last row's logits.
std::vector<float> prefill(const cpu::CpuModel& m, cpu::SessionCache& s, const std::vector<int32_t>& prompt, int64_t chunk) {
  const int64_t N = int64_t(prompt.size());
  if (chunk <= 0) chunk = N;
  std::vector<float> last;
  for (int64_t s0 = 0; s0 < N; s0 += chunk) {
    model::Step st;
    for (int64_t p = s0; p < std::min(N, s0 + chunk); ++p) {
      st.rows.push_back(model::prefill_row(p, prompt[size_t(p)], N));
    }
    auto out = m.forward_cpu(st, {&s});
    EXPECT_TRUE(out.ok());
    if (!out->logits.empty()) last = out->logits;
  }
  return last;
}

std::vector<float> decode(const cpu::CpuModel& m, cpu::SessionCache& s, int32_t token) {
  model::Step st;
  st.rows.push_back(model::decode_row(s.next_pos, token));
  auto out = m.forward_cpu(st, {&s});
  EXPECT_TRUE(out.ok());
  return out->logits;
}

// Every cache byte a future query can read: the last `window` ring rows, all compressed entries.
void expect_same_caches(const cpu::SessionCache& a, const cpu::SessionCache& b, int window) {
  testing_util::expect_same_caches(a, b, window, false);
}

class Chunking : public ::testing::TestWithParam<const char*> {};

TEST_P(Chunking, ChunkedPrefillIsBitIdenticalToOneShot) {
  Fixture f = load(GetParam());
  if (!f.model) GTEST_SKIP() << "fixture not present";
  cpu::SessionCache ref(f.model->config());
  const auto want = prefill(*f.model, ref, f.prompt, 0);
  std::vector<std::vector<float>> want_dec;
  for (int k = 0; k < 6; ++k) want_dec.push_back(decode(*f.model, ref, 100 + k));
  for (int64_t chunk : {1, 7, 16}) {
    cpu::SessionCache s(f.model->config());
    const auto got = prefill(*f.model, s, f.prompt, chunk);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "chunk " << chunk;
    for (int k = 0; k < 6; ++k) {
      const auto d = decode(*f.model, s, 100 + k);
      EXPECT_EQ(std::memcmp(d.data(), want_dec[size_t(k)].data(), d.size() * 4), 0) << "chunk " << chunk << " decode " << k;
    }
    expect_same_caches(s, ref, f.model->config().window_size);
  }
}

TEST_P(Chunking, RollbackEqualsNeverSeen) {
  Fixture f = load(GetParam());
  if (!f.model) GTEST_SKIP() << "fixture not present";
  // Run A: prompt, then tokens t1..t3 accepted, then t4' ; run B: prompt, t1..t3, five rejected
  // rows (as a DSpark verify would add), rollback, then t4'.
  cpu::SessionCache a(f.model->config()), b(f.model->config());
  prefill(*f.model, a, f.prompt, 0);
  prefill(*f.model, b, f.prompt, 0);
  for (int32_t t : {11, 12, 13}) {
    decode(*f.model, a, t);
    decode(*f.model, b, t);
  }
  const int64_t keep = b.next_pos;
  model::Step verify;
  for (int k = 0; k < 5; ++k) {
    model::Row r;
    r.pos = keep + k;
    r.token = 40 + k;
    r.kind = model::RowKind::kDecode;
    r.want_logits = true;
    verify.rows.push_back(r);
  }
  ASSERT_TRUE(f.model->forward_cpu(verify, {&b}).ok());
  ASSERT_TRUE(b.rollback(keep).ok());
  const auto la = decode(*f.model, a, 77);
  const auto lb = decode(*f.model, b, 77);
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * 4), 0);
  expect_same_caches(a, b, f.model->config().window_size);
  // Rolling back further than the ring headroom past overwritten slots is refused, not silent.
  cpu::SessionCache c(f.model->config());
  prefill(*f.model, c, f.prompt, 0);
  for (int k = 0; k < cpu::kRingHeadroom + 4; ++k) decode(*f.model, c, 20 + k);
  EXPECT_FALSE(c.rollback(c.next_pos - cpu::kRingHeadroom - 4).ok());
}

TEST_P(Chunking, VerifyRowsMatchSingleTokenDecode) {
  // Rows of one multi-row decode step give the same logits as feeding them one per step.
  Fixture f = load(GetParam());
  if (!f.model) GTEST_SKIP() << "fixture not present";
  cpu::SessionCache a(f.model->config()), b(f.model->config());
  prefill(*f.model, a, f.prompt, 0);
  prefill(*f.model, b, f.prompt, 0);
  std::vector<std::vector<float>> single;
  for (int k = 0; k < 4; ++k) single.push_back(decode(*f.model, a, 30 + k));
  model::Step st;
  for (int k = 0; k < 4; ++k) {
    model::Row r;
    r.pos = b.next_pos + k;
    r.token = 30 + k;
    r.kind = model::RowKind::kDecode;
    r.want_logits = true;
    st.rows.push_back(r);
  }
  auto out = f.model->forward_cpu(st, {&b});
  ASSERT_TRUE(out.ok());
  const size_t V = size_t(f.model->config().vocab_size);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(std::memcmp(&out->logits[size_t(k) * V], single[size_t(k)].data(), V * 4), 0) << "row " << k;
}

// Prefill rows [from, N) of a prompt whose positions in `image` are image rows taking their input
// embedding from `emb` (bf16 [n_image, dim] in position order); returns the last row's logits.
std::vector<float> prefill_mixed(const cpu::CpuModel& m, cpu::SessionCache& s, const std::vector<int32_t>& tokens,
                                 const std::vector<bool>& image, const std::vector<uint16_t>& emb, int64_t from) {
  const int64_t N = int64_t(tokens.size()), D = m.config().dim;
  model::Step st;
  int32_t k = 0;
  for (int64_t p = 0; p < N; ++p) {
    if (p >= from) {
      model::Row r;
      r.pos = p;
      r.token = tokens[size_t(p)];
      r.kind = model::RowKind::kPrefill;
      r.prefill_end = N;
      r.want_logits = p == N - 1;
      if (image[size_t(p)]) {
        r.image = true;
        r.embed_row = int32_t(st.embeddings.size() / size_t(D));
        st.embeddings.insert(st.embeddings.end(), emb.begin() + int64_t(k) * D, emb.begin() + int64_t(k + 1) * D);
      }
      st.rows.push_back(r);
    }
    if (image[size_t(p)]) ++k;
  }
  auto out = m.forward_cpu(st, {&s});
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? out->logits : std::vector<float>{};
}

TEST_P(Chunking, PromptReuseAfterAnImagePromptEqualsFreshPrefill) {
  // Session A: 5 text rows, 12 image rows, 3 text rows, 3 decode rows; roll back into the shared
  // text prefix; then prompt B (the same 5 text rows, 9 other image rows, 4 text rows) from there.
  // A fresh session prefilling B must give the same logits, decode and caches (the serving path's
  // prefix reuse).
  Fixture f = load(GetParam());
  if (!f.model) GTEST_SKIP() << "fixture not present";
  const int64_t D = f.model->config().dim;
  const int32_t img = int32_t(std::min<int64_t>(f.model->config().image_token_id, f.model->config().vocab_size - 1));
  std::vector<int32_t> ta, tb;
  std::vector<bool> ia, ib;
  for (int i = 0; i < 5; ++i) ta.push_back(f.prompt[size_t(i)]), ia.push_back(false);
  tb = ta;
  ib = ia;
  for (int i = 0; i < 12; ++i) ta.push_back(img), ia.push_back(true);
  for (int i = 0; i < 3; ++i) ta.push_back(f.prompt[size_t(10 + i)]), ia.push_back(false);
  for (int i = 0; i < 9; ++i) tb.push_back(img), ib.push_back(true);
  for (int i = 0; i < 4; ++i) tb.push_back(f.prompt[size_t(20 + i)]), ib.push_back(false);
  auto emb = [&](int n, uint32_t seed) {
    std::vector<uint16_t> e(size_t(n * D));
    for (size_t i = 0; i < e.size(); ++i) {
      seed = seed * 1664525u + 1013904223u;
      const float v = (float(seed >> 8) / 16777216.0f - 0.5f) * 0.4f;
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      e[i] = uint16_t(bits >> 16);
    }
    return e;
  };
  const auto ea = emb(12, 1), eb = emb(9, 2);
  cpu::SessionCache s(f.model->config()), fresh(f.model->config());
  prefill_mixed(*f.model, s, ta, ia, ea, 0);
  for (int k = 0; k < 3; ++k) decode(*f.model, s, 60 + k);  // A's generated tokens
  // Position 4's pending ratio-2 tail (slot 4 % 16) was reused by position 20: rolling back to 5
  // must be refused, not silently read the wrong tail; rolling back to 4 needs no tail.
  EXPECT_FALSE(s.rollback(5).ok());
  ASSERT_TRUE(s.rollback(4).ok());
  const auto got = prefill_mixed(*f.model, s, tb, ib, eb, 4);
  const auto want = prefill_mixed(*f.model, fresh, tb, ib, eb, 0);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "last prompt row";
  for (int k = 0; k < 3; ++k) {
    const auto a = decode(*f.model, s, 50 + k), b = decode(*f.model, fresh, 50 + k);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "decode " << k;
  }
  expect_same_caches(s, fresh, f.model->config().window_size);
}

// Batching never changes an answer (issue 20, row invariance): a session decoded greedily alone
// and the same session decoded inside steps that carry the decode rows of 7 other sessions (other
// prompts, other positions, rows in any session order) produce the same logits bit for bit.
TEST_P(Chunking, BatchedDecodeRowsEqualDecodingAlone) {
  Fixture f = load(GetParam());
  if (!f.model) GTEST_SKIP() << "fixture not present";
  const cpu::CpuModel& m = *f.model;
  constexpr int kSessions = 8;
  std::vector<std::unique_ptr<cpu::SessionCache>> batch;
  for (int i = 0; i < kSessions; ++i) {
    batch.push_back(std::make_unique<cpu::SessionCache>(m.config()));
    std::vector<int32_t> prompt(f.prompt.begin(), f.prompt.end() - i);  // other lengths, other positions
    if (i % 2) prompt[0] = int32_t((prompt[0] + 7 * i) % m.config().vocab_size);
    prefill(m, *batch.back(), prompt, 0);
  }
  cpu::SessionCache alone(m.config());
  prefill(m, alone, f.prompt, 0);
  int32_t next_alone = 17, next_batch = 17;
  for (int step = 0; step < 10; ++step) {
    const auto la = decode(m, alone, next_alone);
    model::Step st;
    std::vector<cpu::SessionCache*> ss;
    for (int k = 0; k < kSessions; ++k) {
      const int i = (k + step) % kSessions;  // session 0's row moves through the step
      model::Row r;
      r.session = k;
      r.pos = batch[size_t(i)]->next_pos;
      r.token = i == 0 ? next_batch : int32_t(100 + 13 * i + step);
      r.kind = model::RowKind::kDecode;
      r.want_logits = true;
      st.rows.push_back(r);
      ss.push_back(batch[size_t(i)].get());
    }
    auto out = m.forward_cpu(st, ss);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    const int64_t V = m.config().vocab_size;
    const int row0 = (kSessions - step % kSessions) % kSessions;  // the row of session 0
    ASSERT_EQ(int64_t(out->logits.size()), kSessions * V);
    EXPECT_EQ(std::memcmp(out->logits.data() + row0 * V, la.data(), size_t(V) * 4), 0) << "step " << step;
    next_alone = int32_t(std::max_element(la.begin(), la.end()) - la.begin());
    next_batch = int32_t(std::max_element(out->logits.begin() + row0 * V, out->logits.begin() + (row0 + 1) * V) - (out->logits.begin() + row0 * V));
    EXPECT_EQ(next_alone, next_batch);
  }
}

// Serialized sessions (DESIGN-AHEAD item 4, docs/formats.md): a state saved after a prefill, some
// decode steps and a rollback (stale ring rows past the position), restored into a fresh session,
// continues bit for bit (logits and DSpark drafts) and holds the same cache bytes; damaged bytes,
// truncations and another model's state are refused and leave the target session unchanged.
TEST_P(Chunking, SerializedSessionRestoresBitForBit) {
  Fixture f = load(GetParam());
  if (!f.model) GTEST_SKIP() << "fixture not present";
  const cpu::CpuModel& m = *f.model;
  cpu::SessionCache a(m.config());
  prefill(m, a, f.prompt, 7);
  for (int32_t t : {11, 12, 13, 14, 15}) decode(m, a, t);
  ASSERT_TRUE(a.rollback(a.next_pos - 2).ok());  // rows past the position stay in the rings
  auto bytes = m.save_session(a);
  ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
  cpu::SessionCache b(m.config());
  Status st = m.restore_session(b, *bytes);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(b.next_pos, a.next_pos);
  EXPECT_EQ(b.tokens, a.tokens);
  expect_same_caches(a, b, m.config().window_size);
  EXPECT_EQ(*m.save_session(b), *bytes) << "restore then save must give the same bytes";
  for (int32_t t : {21, 22, 23, 24}) {
    const auto la = decode(m, a, t), lb = decode(m, b, t);
    ASSERT_EQ(la.size(), lb.size());
    EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * 4), 0) << "decode after restore differs at token " << t;
  }
  if (m.config().n_mtp_layers > 0) {
    const int64_t tw = int64_t(m.config().dspark_target_layer_ids.size()) * m.config().dim;
    std::vector<uint16_t> tap(size_t(tw), 0x3F80);  // 1.0 in bf16
    const auto da = m.draft_cpu(a, 30, tap.data(), a.next_pos - 1), db = m.draft_cpu(b, 30, tap.data(), b.next_pos - 1);
    EXPECT_EQ(da.ids, db.ids);
    EXPECT_EQ(da.logits, db.logits);
  }
  // Damage: every refusal leaves c as it was (one decoded token), and it still runs.
  cpu::SessionCache c(m.config());
  prefill(m, c, f.prompt, 0);
  const int64_t c_pos = c.next_pos;
  std::string flipped = *bytes;
  flipped[flipped.size() / 2] = char(flipped[flipped.size() / 2] ^ 0x10);
  EXPECT_EQ(m.restore_session(c, flipped).code(), StatusCode::kCorrupt);
  EXPECT_EQ(m.restore_session(c, bytes->substr(0, bytes->size() - 9)).code(), StatusCode::kCorrupt);
  EXPECT_EQ(m.restore_session(c, std::string_view()).code(), StatusCode::kCorrupt);
  EXPECT_EQ(m.restore_session(c, "not a session at all").code(), StatusCode::kCorrupt);
  // A consistent checksum over inconsistent content (the position field moved on by one): the
  // structural checks refuse it too (docs/formats.md: position at byte 24).
  std::string shifted = *bytes;
  int64_t pos = 0;
  std::memcpy(&pos, shifted.data() + 24, 8);
  ++pos;
  std::memcpy(shifted.data() + 24, &pos, 8);
  const uint32_t crc = crc32c(shifted.data(), shifted.size() - 4);
  std::memcpy(shifted.data() + shifted.size() - 4, &crc, 4);
  EXPECT_FALSE(m.restore_session(c, shifted).ok());
  // Another model's state (same shapes, other weights and config): refused by identity.
  Fixture other = load("tiny-smooth");
  if (other.model) {
    Status o = other.model->restore_session(*other.model->new_session(), *bytes);
    EXPECT_FALSE(o.ok());
    EXPECT_NE(o.message().find("another model"), std::string::npos) << o.to_string();
  }
  EXPECT_EQ(c.next_pos, c_pos);
  EXPECT_EQ(decode(m, c, 5).size(), size_t(m.config().vocab_size));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Chunking, ::testing::Values("tiny-s0", "tiny-s1-long"));

}  // namespace
}  // namespace fb
