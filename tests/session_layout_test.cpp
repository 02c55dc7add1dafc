// The map of the session format (model/session_layout.h) against the CPU executor's serializer, on
// the official fixtures: layout + host fields + cache bytes + seal rebuild SessionCache::serialize's
// bytes exactly (fresh, after a prefill, after decode and a rollback), and parse_session_layout
// accepts and refuses exactly what SessionCache::restore does (damage, truncation, another model,
// structural edits under a recomputed checksum). The CUDA executor writes and reads through this
// map, so these are its format checks that need no GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "base/crc32c.h"
#include "model/session_layout.h"
#include "fixture_util.h"

namespace fb {
namespace {

using testing_util::CpuFixture;

void prefill(const cpu::CpuModel& m, cpu::SessionCache& s, const std::vector<int32_t>& prompt, int64_t chunk) {
  const int64_t N = int64_t(prompt.size());
  for (int64_t s0 = 0; s0 < N; s0 += chunk) {
    model::Step st;
    for (int64_t p = s0; p < std::min(N, s0 + chunk); ++p) {
      st.rows.push_back(model::prefill_row(p, prompt[size_t(p)], N));
    }
    ASSERT_TRUE(m.forward_cpu(st, {&s}).ok());
  }
}

void decode(const cpu::CpuModel& m, cpu::SessionCache& s, int32_t token) {
  model::Step st;
  st.rows.push_back(model::decode_row(s.next_pos, token));
  ASSERT_TRUE(m.forward_cpu(st, {&s}).ok());
}

// The state's bytes written the way the CUDA executor writes them: fields through the layout,
// each cache copied to its offset, then the seal.
std::string rebuild(const cpu::CpuModel& m, const cpu::SessionCache& s) {
  const model::SessionLayout l = model::session_layout(m.config(), s.next_pos);
  std::string out(l.total_bytes, '\x5A');  // poison: every byte must be written
  model::SessionFields f;
  f.tokens = s.tokens.data();
  f.image = s.image.data();
  for (const auto& r : s.rings) f.ring_pos.push_back(r.pos.data());
  for (const auto& c : s.comp) f.tail_pos.push_back(c.tail_pos.data());
  for (const auto& r : s.draft_rings) f.draft_pos.push_back(r.pos.data());
  model::write_session_fields(l, m.model_id(), f, out.data());
  for (size_t i = 0; i < l.rings.size(); ++i) {
    EXPECT_EQ(l.rings[i].data_bytes(), s.rings[i].data.size());
    std::memcpy(out.data() + l.rings[i].data_at, s.rings[i].data.data(), l.rings[i].data_bytes());
  }
  for (size_t i = 0; i < l.comp.size(); ++i) {
    const model::CompLayout& c = l.comp[i];
    EXPECT_EQ(c.kv_size(), s.comp[i].kv.size()) << "layer " << i;
    EXPECT_EQ(c.keys_size(), s.comp[i].keys.size()) << "layer " << i;
    EXPECT_EQ(c.tail_size(), s.comp[i].tail.size() * sizeof(float)) << "layer " << i;
    if (c.kv_size()) std::memcpy(out.data() + c.kv_at, s.comp[i].kv.data(), c.kv_size());
    if (c.keys_size()) std::memcpy(out.data() + c.keys_at, s.comp[i].keys.data(), c.keys_size());
    if (c.tail_size()) std::memcpy(out.data() + c.tail_at, s.comp[i].tail.data(), c.tail_size());
  }
  for (size_t i = 0; i < l.draft_rings.size(); ++i)
    std::memcpy(out.data() + l.draft_rings[i].data_at, s.draft_rings[i].data.data(), l.draft_rings[i].data_bytes());
  model::seal_session(out.data(), l.total_bytes);
  return out;
}

// parse_session_layout and SessionCache::restore give the same verdict (and code) on `b`.
void expect_same_verdict(const cpu::CpuModel& m, const std::string& b, const std::string& what) {
  cpu::SessionCache target(m.config());
  const Status restored = target.restore(b, m.model_id());
  const auto parsed = model::parse_session_layout(m.config(), b, m.model_id());
  EXPECT_EQ(parsed.ok(), restored.ok()) << what << ": restore says " << restored.to_string() << ", parse says "
                                        << (parsed.ok() ? std::string("ok") : parsed.status().to_string());
  if (!parsed.ok() && !restored.ok()) {
    EXPECT_EQ(parsed.status().code(), restored.code()) << what << ": " << parsed.status().to_string();
  }
}

std::string reseal(std::string b) {
  const uint32_t crc = crc32c(b.data(), b.size() - 4);
  std::memcpy(b.data() + b.size() - 4, &crc, 4);
  return b;
}

class SessionLayoutTest : public ::testing::TestWithParam<const char*> {};

TEST_P(SessionLayoutTest, RebuildsTheSerializersBytes) {
  CpuFixture f = testing_util::load_cpu_fixture(GetParam());
  if (!f.model) GTEST_SKIP() << "fixture not present";
  const cpu::CpuModel& m = *f.model;
  cpu::SessionCache s(m.config());
  EXPECT_EQ(rebuild(m, s), s.serialize(m.model_id())) << "fresh session";
  // What a CUDA session that never ran writes (it has no caches to copy from).
  EXPECT_EQ(model::fresh_session_bytes(m.config(), m.model_id()), s.serialize(m.model_id())) << "fresh session bytes";
  prefill(m, s, f.prompt, 7);
  EXPECT_EQ(rebuild(m, s), s.serialize(m.model_id())) << "after the prefill";
  for (int32_t t : {11, 12, 13, 14, 15}) decode(m, s, t);
  ASSERT_TRUE(s.rollback(s.next_pos - 3).ok());  // odd/even position change, stale ring rows
  const std::string bytes = s.serialize(m.model_id());
  EXPECT_EQ(rebuild(m, s), bytes) << "after decode and a rollback";
  // Parsing the serializer's bytes gives the layout of their position.
  auto l = model::parse_session_layout(m.config(), bytes, m.model_id());
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  const model::SessionLayout want = model::session_layout(m.config(), s.next_pos);
  EXPECT_EQ(l->next_pos, s.next_pos);
  EXPECT_EQ(l->total_bytes, bytes.size());
  ASSERT_EQ(l->comp.size(), want.comp.size());
  for (size_t i = 0; i < want.comp.size(); ++i) {
    EXPECT_EQ(l->comp[i].kv_at, want.comp[i].kv_at);
    EXPECT_EQ(l->comp[i].entries, int64_t(s.comp[i].n_entries()));
    if (l->comp[i].kv_size()) {
      EXPECT_EQ(std::memcmp(bytes.data() + l->comp[i].kv_at, s.comp[i].kv.data(), l->comp[i].kv_size()), 0);
    }
  }
}

TEST_P(SessionLayoutTest, ParseRefusesWhatRestoreRefuses) {
  CpuFixture f = testing_util::load_cpu_fixture(GetParam());
  if (!f.model) GTEST_SKIP() << "fixture not present";
  const cpu::CpuModel& m = *f.model;
  const model::Config& c = m.config();
  cpu::SessionCache s(c);
  prefill(m, s, f.prompt, 16);
  decode(m, s, 42);
  const std::string bytes = s.serialize(m.model_id());
  const model::SessionLayout l = model::session_layout(c, s.next_pos);
  expect_same_verdict(m, bytes, "intact");
  std::string flipped = bytes;
  flipped[flipped.size() / 2] ^= 0x10;
  expect_same_verdict(m, flipped, "flipped byte");
  EXPECT_EQ(model::parse_session_layout(c, flipped, m.model_id()).status().code(), StatusCode::kCorrupt);
  for (size_t cut : {size_t(0), size_t(5), size_t(12), size_t(39), bytes.size() / 3, bytes.size() - 9, bytes.size() - 1}) {
    expect_same_verdict(m, bytes.substr(0, cut), "truncated to " + std::to_string(cut));
    expect_same_verdict(m, reseal(bytes.substr(0, cut + 4 <= bytes.size() ? cut + 4 : bytes.size())), "resealed cut " + std::to_string(cut));
  }
  expect_same_verdict(m, reseal(bytes + std::string(8, '\0')), "trailing bytes");
  EXPECT_EQ(model::parse_session_layout(c, reseal(bytes + std::string(8, '\0')), m.model_id()).status().code(), StatusCode::kCorrupt);
  expect_same_verdict(m, "not a session at all", "garbage");
  // Another model identity, version, shape fields, counts, token ids and ring positions, each under
  // a recomputed checksum so the structural checks decide.
  auto edit = [&](size_t at, auto v, const std::string& what) {
    std::string b = bytes;
    std::memcpy(b.data() + at, &v, sizeof v);
    expect_same_verdict(m, reseal(b), what);
    return model::parse_session_layout(c, reseal(b), m.model_id()).status().code();
  };
  EXPECT_EQ(edit(16, uint64_t(m.model_id() + 1), "model id"), StatusCode::kInvalidArgument);
  EXPECT_EQ(edit(8, uint32_t(2), "version"), StatusCode::kUnsupported);
  EXPECT_NE(edit(24, int64_t(s.next_pos + 1), "position + 1"), StatusCode::kOk);
  EXPECT_NE(edit(24, int64_t(-1), "negative position"), StatusCode::kOk);
  EXPECT_NE(edit(24, int64_t(1) << 60, "huge position"), StatusCode::kOk);
  edit(32, int32_t(c.n_layers + 1), "layers");
  edit(36, int32_t(c.n_mtp_layers + 1), "draft stages");
  EXPECT_EQ(edit(l.tokens_at, int32_t(c.vocab_size), "token id past the vocabulary"), StatusCode::kCorrupt);
  edit(l.tokens_at + 4, int32_t(-2), "negative token id");
  edit(l.rings[0].at, int32_t(l.rings[0].slots + 1), "ring slots");
  edit(l.rings[0].at + 4, int32_t(l.rings[0].row_bytes - 1), "ring row bytes");
  EXPECT_EQ(edit(l.rings[1].pos_at + 8, int64_t(l.rings[1].slots * 3), "ring slot holding another slot's position"), StatusCode::kCorrupt);
  edit(l.rings[1].pos_at, int64_t(-7), "ring position below -1");
  for (size_t i = 0; i < l.comp.size(); ++i) {
    if (!l.comp[i].ratio) continue;
    const std::string li = "layer " + std::to_string(i);
    edit(l.comp[i].at, int32_t(l.comp[i].ratio + 1), li + " ratio");
    edit(l.comp[i].at + 4, int32_t(l.comp[i].kv_bytes + 16), li + " kv bytes");
    EXPECT_EQ(edit(l.comp[i].at + 12, int64_t(l.comp[i].entries + 1), li + " entries"), StatusCode::kCorrupt);
    EXPECT_EQ(edit(l.comp[i].n_tail_at, int64_t(l.comp[i].tail_slots + 1), li + " tail slots"), StatusCode::kCorrupt);
  }
  if (!l.draft_rings.empty()) edit(l.draft_rings[0].pos_at + 16, int64_t(1), "draft slot 2 holding position 1");
  // Random single-byte edits of the state's small fields (header, tokens, ring and tail
  // positions, section headers) under a recomputed checksum: the same verdict every time.
  std::vector<std::pair<size_t, size_t>> fields = {{0, 40}, {l.tokens_at, size_t(s.next_pos) * 5}};
  for (const auto& r : l.rings) fields.push_back({r.at, 8 + size_t(r.slots) * 8});
  for (const auto& cc : l.comp) {
    fields.push_back({cc.at, 20});
    fields.push_back({cc.n_tail_at, 8 + size_t(cc.tail_slots) * 8});
  }
  for (const auto& r : l.draft_rings) fields.push_back({r.at, 8 + size_t(r.slots) * 8});
  std::mt19937_64 rng(21);
  for (int k = 0; k < 300; ++k) {
    const auto& [at, n] = fields[rng() % fields.size()];
    std::string b = bytes;
    const size_t i = at + size_t(rng() % n);
    b[i] = char(uint8_t(b[i]) ^ uint8_t(1u << (rng() % 8)));
    expect_same_verdict(m, reseal(b), "byte " + std::to_string(i));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SessionLayoutTest, ::testing::Values("tiny-s0", "tiny-s1-long"));

}  // namespace
}  // namespace fb
