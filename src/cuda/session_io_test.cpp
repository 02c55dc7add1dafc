// CudaExecutor::save_session / restore_session (issue 21) on the official fixtures: a CUDA state
// saved mid-conversation and restored into a fresh session continues bit for bit (logits and
// DSpark drafts, both numerics classes); CPU and CUDA write the same bytes for the same session in
// the exact class, and each restores the other's with the CPU's logits bit for bit; damaged,
// truncated and foreign bytes are refused and leave the target session as it was. Label: gpu.
#include <gtest/gtest.h>

#include "cuda/gpu_test_util.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "base/crc32c.h"
#include "base/mapped_file.h"
#include "cpu/executor.h"
#include "model/session_layout.h"
#include "cuda/executor.h"

namespace fb::cuda {
namespace {

using test_util::fixtures_dir;

std::vector<int32_t> prompt_of(const std::string& dir) {
  auto b = read_file_bytes(dir + "/prompt.i32");
  EXPECT_TRUE(b.ok());
  std::vector<int32_t> v(b.ok() ? b->size() / 4 : 0);
  if (!v.empty()) std::memcpy(v.data(), b->data(), v.size() * 4);
  return v;
}

std::unique_ptr<CudaExecutor> load_cuda(const std::string& dir, Numerics n) {
  CudaLoadOptions lo;
  lo.run.numerics = n;
  auto m = CudaExecutor::load(dir + "/checkpoint", {}, lo);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(m.value()) : nullptr;
}

// Prefills `prompt` in chunks of `chunk` rows; returns the last row's logits.
std::vector<float> prefill(model::Executor& ex, model::SessionState& s, const std::vector<int32_t>& prompt, int64_t chunk) {
  const int64_t N = int64_t(prompt.size());
  std::vector<float> last;
  for (int64_t s0 = 0; s0 < N; s0 += chunk) {
    model::Step st;
    for (int64_t p = s0; p < std::min(N, s0 + chunk); ++p) {
      st.rows.push_back(model::prefill_row(p, prompt[size_t(p)], N));
    }
    auto out = ex.forward(st, {&s});
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    if (out.ok() && !out->logits.empty()) last = out->logits;
  }
  return last;
}

std::vector<float> decode(model::Executor& ex, model::SessionState& s, int32_t token) {
  model::Step st;
  model::Row r;
  r.pos = s.n_pos();
  r.token = token;
  r.kind = model::RowKind::kDecode;
  r.want_logits = true;
  st.rows.push_back(r);
  auto out = ex.forward(st, {&s});
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? out->logits : std::vector<float>();
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && !a.empty() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Where byte `at` of a state of this layout lies, for failure messages.
std::string section_of(const model::SessionLayout& l, size_t at) {
  auto in = [at](size_t lo, size_t n) { return at >= lo && at < lo + n; };
  if (at < l.tokens_at) return "header";
  if (at < l.image_at) return "tokens";
  if (in(l.image_at, size_t(l.next_pos))) return "image flags";
  for (size_t i = 0; i < l.rings.size(); ++i)
    if (in(l.rings[i].at, l.rings[i].data_at + l.rings[i].data_bytes() - l.rings[i].at))
      return "window ring " + std::to_string(i) + (at < l.rings[i].data_at ? " positions" : " rows");
  for (size_t i = 0; i < l.comp.size(); ++i) {
    const model::CompLayout& c = l.comp[i];
    const std::string li = "layer " + std::to_string(i);
    if (in(c.kv_at, c.kv_size())) return li + " compressed KV entry " + std::to_string((at - c.kv_at) / size_t(c.kv_bytes));
    if (in(c.keys_at, c.keys_size())) return li + " index key " + std::to_string((at - c.keys_at) / size_t(c.key_bytes));
    if (in(c.tail_pos_at, size_t(c.tail_slots) * 8)) return li + " tail positions";
    if (in(c.tail_at, c.tail_size())) return li + " tail slot " + std::to_string((at - c.tail_at) / size_t(c.tail_floats / c.tail_slots * 4));
    if (in(c.at, c.tail_at + c.tail_size() - c.at)) return li + " compressor header";
  }
  for (size_t i = 0; i < l.draft_rings.size(); ++i)
    if (in(l.draft_rings[i].at, l.draft_rings[i].data_at + l.draft_rings[i].data_bytes() - l.draft_rings[i].at)) return "draft ring " + std::to_string(i);
  return "trailer";
}

// Equal bytes, or the first difference named by section.
::testing::AssertionResult same_state(const model::Config& c, const std::string& a, const std::string& b) {
  if (a == b) return ::testing::AssertionSuccess();
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  size_t i = 0;
  while (a[i] == b[i]) ++i;
  int64_t P = 0;
  std::memcpy(&P, a.data() + 24, 8);
  return ::testing::AssertionFailure() << "first difference at byte " << i << " of " << a.size() << ": "
                                       << section_of(model::session_layout(c, P), i);
}

std::vector<uint16_t> ones_tap(const model::Config& c) {
  return std::vector<uint16_t>(c.dspark_target_layer_ids.size() * size_t(c.dim), 0x3F80);  // bf16 1.0
}

// Every case runs on one fixture's checkpoint and prompt (test_util::FixtureTest: skipped where
// the fixture cannot run).
class CudaSessionIo : public test_util::FixtureTest {
 protected:
  void SetUp() override {
    test_util::FixtureTest::SetUp();
    if (!dir.empty()) prompt = prompt_of(dir);
  }
  std::vector<int32_t> prompt;
};

// Saved after a prefill, decode steps and a rollback (stale ring rows past the position), restored
// into a fresh session: the same bytes when saved again, and the same logits and drafts as the
// session that was never interrupted; then restored into a session already in use elsewhere.
TEST_P(CudaSessionIo, SaveRestoreContinuesBitForBit) {
  for (Numerics n : {Numerics::kExact, Numerics::kFast}) {
    SCOPED_TRACE(numerics_name(n));
    auto ex = load_cuda(dir, n);
    ASSERT_TRUE(ex);
    const model::Config& c = ex->config();
    auto a = ex->new_session();
    // The fast class prefills in one step (tensor-core prefill from 64 rows), the exact one in chunks.
    prefill(*ex, *a, prompt, n == Numerics::kFast ? int64_t(prompt.size()) : 7);
    for (int32_t t : {11, 12, 13, 14, 15}) decode(*ex, *a, t);
    ASSERT_TRUE(a->rollback(a->n_pos() - 2).ok());
    auto bytes = ex->save_session(*a);
    ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
    EXPECT_EQ(bytes->size(), model::session_layout(c, a->n_pos()).total_bytes);
    auto b = ex->new_session();
    Status st = ex->restore_session(*b, *bytes);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(b->n_pos(), a->n_pos());
    auto again = ex->save_session(*b);
    ASSERT_TRUE(again.ok());
    EXPECT_TRUE(same_state(c, *again, *bytes)) << "restore then save must give the same bytes";
    for (int32_t t : {21, 22, 23, 24, 25, 26}) {
      const auto la = decode(*ex, *a, t), lb = decode(*ex, *b, t);
      EXPECT_TRUE(same_bits(la, lb)) << "decode after restore differs at token " << t;
    }
    if (c.n_mtp_layers > 0) {
      const auto tap = ones_tap(c);
      auto da = ex->draft(*a, 30, tap.data(), a->n_pos() - 1);
      auto db = ex->draft(*b, 30, tap.data(), b->n_pos() - 1);
      ASSERT_TRUE(da.ok() && db.ok());
      EXPECT_EQ(da->ids, db->ids);
      EXPECT_TRUE(same_bits(da->logits, db->logits)) << "draft logits after restore";
    }
    // Into a session that holds another conversation (allocated, other position and capacity).
    auto later = ex->save_session(*a);
    ASSERT_TRUE(later.ok());
    auto other = ex->new_session();
    prefill(*ex, *other, std::vector<int32_t>(prompt.rbegin(), prompt.rend()), 16);
    ASSERT_TRUE(ex->restore_session(*other, *later).ok());
    auto other_bytes = ex->save_session(*other);
    ASSERT_TRUE(other_bytes.ok());
    EXPECT_TRUE(same_state(c, *other_bytes, *later));
    EXPECT_TRUE(same_bits(decode(*ex, *a, 31), decode(*ex, *other, 31))) << "decode after restoring over another conversation";
  }
}

// One format for both executors: in the exact class the CUDA session's caches are the CPU's byte
// for byte (the same bytes saved), CPU bytes restored on CUDA and CUDA bytes restored on the CPU
// both continue with the CPU's logits and drafts bit for bit.
TEST_P(CudaSessionIo, CpuAndCudaStatesAreOneFormat) {
  auto cu = load_cuda(dir, Numerics::kExact);
  auto cp = cpu::CpuModel::load(dir + "/checkpoint");
  ASSERT_TRUE(cu && cp.ok());
  cpu::CpuModel& m = **cp;
  const model::Config& c = m.config();
  ASSERT_EQ(cu->identity(), m.identity()) << "one model, one identity on both executors";
  auto fresh_cu = cu->save_session(*cu->new_session());
  auto fresh_cpu = m.save_session(*m.new_session());
  ASSERT_TRUE(fresh_cu.ok() && fresh_cpu.ok());
  EXPECT_TRUE(same_state(c, *fresh_cu, *fresh_cpu)) << "fresh sessions";
  auto ca = m.new_session();
  auto ga = cu->new_session();
  EXPECT_TRUE(same_bits(prefill(m, *ca, prompt, 7), prefill(*cu, *ga, prompt, 7))) << "prefill logits (exact class)";
  for (int32_t t : {11, 12, 13}) EXPECT_TRUE(same_bits(decode(m, *ca, t), decode(*cu, *ga, t))) << "decode " << t;
  auto cpu_bytes = m.save_session(*ca);
  auto cu_bytes = cu->save_session(*ga);
  ASSERT_TRUE(cpu_bytes.ok() && cu_bytes.ok());
  EXPECT_TRUE(same_state(c, *cu_bytes, *cpu_bytes)) << "CUDA and CPU states after the same prefill and decode (exact class)";
  auto gb = cu->new_session();
  Status st = cu->restore_session(*gb, *cpu_bytes);
  ASSERT_TRUE(st.ok()) << "CPU bytes on CUDA: " << st.to_string();
  auto cb = m.new_session();
  st = m.restore_session(*cb, *cu_bytes);
  ASSERT_TRUE(st.ok()) << "CUDA bytes on the CPU: " << st.to_string();
  for (int32_t t : {21, 22, 23, 24, 25}) {
    const auto want = decode(m, *ca, t);
    EXPECT_TRUE(same_bits(decode(*cu, *gb, t), want)) << "CUDA from CPU bytes, token " << t;
    EXPECT_TRUE(same_bits(decode(m, *cb, t), want)) << "CPU from CUDA bytes, token " << t;
  }
  if (c.n_mtp_layers > 0) {
    const auto tap = ones_tap(c);
    auto want = m.draft(*ca, 30, tap.data(), ca->n_pos() - 1);
    auto got = cu->draft(*gb, 30, tap.data(), gb->n_pos() - 1);
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_EQ(got->ids, want->ids);
    EXPECT_TRUE(same_bits(got->logits, want->logits)) << "draft logits, CUDA from CPU bytes";
  }
}

// Damaged bytes: refused with the CPU's codes, and the target session (in use, or never run) is
// unchanged: the same saved bytes, the same next logits as an untouched twin.
TEST_P(CudaSessionIo, DamagedBytesAreRefusedAndLeaveTheSession) {
  auto ex = load_cuda(dir, Numerics::kFast);
  ASSERT_TRUE(ex);
  const model::Config& c = ex->config();
  auto a = ex->new_session();
  prefill(*ex, *a, prompt, 16);
  auto good = ex->save_session(*a);
  ASSERT_TRUE(good.ok());
  const std::vector<int32_t> half(prompt.begin(), prompt.begin() + int64_t(prompt.size()) / 2);
  auto target = ex->new_session(), twin = ex->new_session(), never = ex->new_session();
  prefill(*ex, *target, half, 16);
  prefill(*ex, *twin, half, 16);
  auto before = ex->save_session(*target);
  auto never_before = ex->save_session(*never);
  ASSERT_TRUE(before.ok() && never_before.ok());
  auto reseal = [](std::string b) {
    const uint32_t crc = crc32c(b.data(), b.size() - 4);
    std::memcpy(b.data() + b.size() - 4, &crc, 4);
    return b;
  };
  const model::SessionLayout l = model::session_layout(c, a->n_pos());
  struct Bad {
    std::string what, bytes;
    StatusCode code;  // kOk: any refusal
  };
  std::vector<Bad> bad;
  std::string flipped = *good;
  flipped[flipped.size() / 2] ^= 0x10;
  bad.push_back({"flipped byte", flipped, StatusCode::kCorrupt});
  bad.push_back({"truncated", good->substr(0, good->size() - 9), StatusCode::kCorrupt});
  bad.push_back({"empty", std::string(), StatusCode::kCorrupt});
  bad.push_back({"garbage", "not a session at all", StatusCode::kCorrupt});
  bad.push_back({"trailing bytes", reseal(*good + std::string(16, '\0')), StatusCode::kCorrupt});
  std::string shifted = *good;
  int64_t pos = a->n_pos() + 1;
  std::memcpy(shifted.data() + 24, &pos, 8);
  bad.push_back({"position moved on, checksum recomputed", reseal(shifted), StatusCode::kOk});
  std::string token = *good;
  const int32_t big = int32_t(c.vocab_size);
  std::memcpy(token.data() + l.tokens_at, &big, 4);
  bad.push_back({"token id past the vocabulary, checksum recomputed", reseal(token), StatusCode::kCorrupt});
  std::string foreign = *good;
  const uint64_t id = ex->identity() ^ 1;
  std::memcpy(foreign.data() + 16, &id, 8);
  bad.push_back({"another model's identity, checksum recomputed", reseal(foreign), StatusCode::kInvalidArgument});
  for (size_t i = 0; i < l.comp.size(); ++i)
    if (l.comp[i].ratio) {
      std::string entries = *good;
      const int64_t e = l.comp[i].entries + 1;
      std::memcpy(entries.data() + l.comp[i].at + 12, &e, 8);
      bad.push_back({"layer " + std::to_string(i) + " entry count, checksum recomputed", reseal(entries), StatusCode::kCorrupt});
      break;
    }
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    for (model::SessionState* s : {target.get(), never.get()}) {
      const Status st = ex->restore_session(*s, b.bytes);
      EXPECT_FALSE(st.ok());
      if (b.code != StatusCode::kOk) {
        EXPECT_EQ(st.code(), b.code) << st.to_string();
      }
    }
    auto now = ex->save_session(*target);
    ASSERT_TRUE(now.ok());
    EXPECT_TRUE(same_state(c, *now, *before)) << "target changed by a refused restore";
    auto never_now = ex->save_session(*never);
    ASSERT_TRUE(never_now.ok());
    EXPECT_TRUE(same_state(c, *never_now, *never_before)) << "fresh session changed by a refused restore";
  }
  EXPECT_TRUE(same_bits(decode(*ex, *target, 7), decode(*ex, *twin, 7))) << "the refused restores left the session runnable and equal";
  // Another fixture's state (other config or weights): refused by identity or shape.
  const std::string other = fixtures_dir() + "/tiny-smooth";
  if (std::filesystem::exists(other) && std::string(GetParam()) != "tiny-smooth") {
    auto o = cpu::CpuModel::load(other + "/checkpoint");
    ASSERT_TRUE(o.ok());
    auto ob = (*o)->save_session(*(*o)->new_session());
    ASSERT_TRUE(ob.ok());
    EXPECT_FALSE(ex->restore_session(*never, *ob).ok());
  }
  // And the good bytes still restore into the session the damaged ones could not touch.
  ASSERT_TRUE(ex->restore_session(*target, *good).ok());
  EXPECT_TRUE(same_bits(decode(*ex, *target, 9), decode(*ex, *a, 9)));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaSessionIo, ::testing::Values("tiny-s0", "tiny-s1-long"));

}  // namespace
}  // namespace fb::cuda
