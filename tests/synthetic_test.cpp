// The in-memory synthetic snapshot (benchmarks at released dimensions) matches the schema and runs
// through the CPU executor with finite outputs; checked here on the tiny shape.
#include <gtest/gtest.h>

#include <cmath>

#include "cpu/executor.h"
#include "loader/synthetic.h"
#include "loader/tiny_model.h"

namespace fb {
namespace {

TEST(Synthetic, TinyShapeValidatesAndRuns) {
  loader::TinyModelOptions o;
  o.vocab_size = 2048;
  o.engram_compressed_vocab = 1500;
  auto snap = loader::synthetic_snapshot(loader::tiny_config_json(o), 7);
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

TEST(Synthetic, ReleasedDimensionsValidate) {
  auto snap = loader::synthetic_snapshot(loader::released_synthetic_config_json(8, 4, 1000), 1);
  ASSERT_TRUE(snap.ok()) << snap.status().to_string();
  EXPECT_TRUE((*snap)->validate().ok());
  EXPECT_EQ((*snap)->config().dim, 5120);
}

}  // namespace
}  // namespace fb
