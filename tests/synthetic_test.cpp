// The in-memory synthetic snapshot (benchmarks at released dimensions) matches the schema and runs
// through the CPU executor with finite outputs; checked here on the tiny shape.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu/executor.h"
#include "loader/synthetic.h"
#include "loader/tiny_model.h"
#include "model/schema.h"

namespace fb {
namespace {

constexpr uint64_t kSyntheticHash = 0xe5237fe8c4e6a88bull;  // the tiny synthetic model of PooledScalesKeepTheBytes, as built before the scales were pooled

// The tiny-shaped synthetic snapshot two tests below build.
Result<std::unique_ptr<loader::Snapshot>> tiny_synthetic() {
  loader::TinyModelOptions o;
  o.vocab_size = 2048;
  o.engram_compressed_vocab = 1500;
  return loader::synthetic_snapshot(loader::tiny_config_json(o), 7);
}

TEST(Synthetic, TinyShapeValidatesAndRuns) {
  auto snap = tiny_synthetic();
  ASSERT_TRUE(snap.ok()) << snap.status().to_string();
  EXPECT_TRUE((*snap)->validate().ok()) << (*snap)->validate().to_string();
  auto map = (*snap)->engram_token_map();
  cpu::CpuModel m(std::move(snap.value()), map);
  cpu::SessionCache s(m.config());
  model::Step st;
  for (int p = 0; p < 12; ++p) {
    model::Row r;
    r.pos = p;
    r.token = 100 + p;
    r.kind = model::RowKind::kPrefill;
    r.prefill_end = 12;
    r.want_logits = p == 11;
    st.rows.push_back(r);
  }
  auto out = m.forward_cpu(st, {&s});
  ASSERT_TRUE(out.ok());
  double rms = 0;
  for (float v : out->logits) {
    ASSERT_TRUE(std::isfinite(v));
    rms += double(v) * v;
  }
  rms = std::sqrt(rms / double(out->logits.size()));
  EXPECT_GT(rms, 1e-3);
  EXPECT_LT(rms, 1e3);
}

// The build reports its progress (issue 24; bench --synthetic waits on it at the released size):
// bytes generated and tensors, ending at the totals, in a final line. Forced on with a fake clock.
TEST(Synthetic, BuildReportsProgress) {
  loader::TinyModelOptions o;
  o.vocab_size = 2048;
  o.engram_compressed_vocab = 1500;
  std::vector<std::string> writes;
  double t = 0;
  ProgressOptions po;
  po.mode = ProgressOptions::Mode::kOn;
  po.sink = [&](std::string_view s) { writes.emplace_back(s); };
  po.clock = [&] { return t += 0.05; };  // every update is due: one line per tensor
  auto snap = loader::synthetic_snapshot(loader::tiny_config_json(o), 7, 0, po);
  ASSERT_TRUE(snap.ok()) << snap.status().to_string();
  const size_t n_tensors = model::expected_tensors((*snap)->config()).size();
  ASSERT_GE(writes.size(), 3u);
  EXPECT_EQ(writes.front().find("\rsynthetic model: "), 0u) << writes.front();
  const std::string& last = writes.back();
  EXPECT_EQ(last.find("\rsynthetic model: "), 0u) << last;
  EXPECT_NE(last.find(" in "), std::string::npos) << last;
  EXPECT_NE(last.find(", " + std::to_string(n_tensors) + " tensors"), std::string::npos) << last;
  EXPECT_EQ(last.back(), '\n');
  // A line per update while it runs, each counting more tensors than the one before.
  int64_t prev = -1, increases = 0;
  for (size_t i = 0; i + 1 < writes.size(); ++i) {
    const size_t slash = writes[i].rfind('/'), sp = writes[i].rfind(' ', slash);
    ASSERT_NE(slash, std::string::npos) << writes[i];
    const int64_t k = std::stoll(writes[i].substr(sp + 1, slash - sp - 1));
    increases += k > prev;
    prev = k;
  }
  EXPECT_EQ(increases, int64_t(writes.size()) - 1);
  // Off: nothing written.
  writes.clear();
  po.mode = ProgressOptions::Mode::kOff;
  ASSERT_TRUE(loader::synthetic_snapshot(loader::tiny_config_json(o), 7, 0, po).ok());
  EXPECT_TRUE(writes.empty());
}

TEST(Synthetic, ReleasedDimensionsValidate) {
  auto snap = loader::synthetic_snapshot(loader::released_synthetic_config_json(8, 4, 1000), 1);
  ASSERT_TRUE(snap.ok()) << snap.status().to_string();
  EXPECT_TRUE((*snap)->validate().ok());
  EXPECT_EQ((*snap)->config().dim, 5120);
  // Every expert's scales sit inside one large block, so the bench's page-locking of the blocks
  // of at least 1 MB covers them (issue 26: scales in blocks of their own stayed pageable, and
  // each prefetched expert made three pageable copies, which hold the issuing thread).
  const auto blocks = (*snap)->memory_blocks();
  int scales = 0;
  for (const std::string& name : (*snap)->tensor_names()) {
    if (name.find(".experts.") == std::string::npos || name.size() < 6 || name.compare(name.size() - 6, 6, ".scale") != 0) continue;
    const TensorView& v = (*snap)->get(name);
    const auto* p = static_cast<const uint8_t*>(v.data);
    bool inside = false;
    for (const auto& [b, size] : blocks) inside = inside || (size >= (size_t(1) << 20) && p >= b && p + v.nbytes() <= b + size);
    EXPECT_TRUE(inside) << name;
    ++scales;
  }
  EXPECT_GT(scales, 0);
}

// The tensors keep the bytes they had before the scales were pooled (ReleasedDimensionsValidate):
// the FNV-1a hash of every tensor's name and bytes, pinned from the build before the change.
TEST(Synthetic, PooledScalesKeepTheBytes) {
  auto snap = tiny_synthetic();
  ASSERT_TRUE(snap.ok()) << snap.status().to_string();
  uint64_t h = 1469598103934665603ull;
  for (const std::string& name : (*snap)->tensor_names()) {
    const TensorView& v = (*snap)->get(name);
    const auto* p = static_cast<const uint8_t*>(v.data);
    for (const char ch : name) h = (h ^ uint8_t(ch)) * 1099511628211ull;
    for (int64_t i = 0; i < v.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  EXPECT_EQ(h, kSyntheticHash) << std::hex << "0x" << h;
}

}  // namespace
}  // namespace fb
