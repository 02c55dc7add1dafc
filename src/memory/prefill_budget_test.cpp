// prefill_budget.h: the step's bytes grow with rows and context as counted, and the chunk policy
// picks the largest quantum multiple that fits (with the arena's 25% slack), nothing when none does.
#include "memory/prefill_budget.h"

#include <gtest/gtest.h>

#include <string>

namespace fb::memory {
namespace {

model::Config released() {
  auto c = model::Config::from_file(std::string(FB_SOURCE_DIR) + "/tests/data/released_config.json");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return *c;
}

TEST(PrefillBudget, StepBytesScaleWithRowsAndContext) {
  const model::Config c = released();
  const PrefillStepBytes a = prefill_step_bytes(c, 2048, 32768), b = prefill_step_bytes(c, 4096, 32768);
  EXPECT_GT(a.step, 0u);
  EXPECT_GT(a.moe, a.step / 4) << "the grouped MoE is the largest op";
  EXPECT_EQ(b.step, 2 * a.step);  // per-row buffers only
  EXPECT_EQ(b.moe, 2 * a.moe);
  EXPECT_EQ(b.attention, 2 * a.attention);
  EXPECT_GT(b.tc, a.tc);  // the expanded activations grow with rows ...
  EXPECT_LT(b.tc, 2 * a.tc);  // ... beside a fixed part (weights, index dots)
  EXPECT_GT(prefill_step_bytes(c, 2048, 131072).attention, a.attention) << "indexer scores grow with the context";
  const PrefillStepBytes z = prefill_step_bytes(c, 0, 32768);
  EXPECT_EQ(z.arena(), 0u);
  EXPECT_GT(z.tc, 0u);
  // Released dims: the per-row part of a 32K-row step is tens of GiB, not MiB or TiB.
  const double gib = double(prefill_step_bytes(c, 32768, 32768).total()) / double(1ull << 30);
  EXPECT_GT(gib, 4.0);
  EXPECT_LT(gib, 64.0);
}

TEST(PrefillBudget, ChunkIsTheLargestThatFits) {
  const model::Config c = released();
  const int64_t ctx = 65536;
  auto need = [&](int64_t r) {
    const PrefillStepBytes b = prefill_step_bytes(c, r, ctx);
    return b.arena() + b.arena() / 4 + b.tc;
  };
  EXPECT_EQ(prefill_chunk_rows(c, need(8192), ctx), 8192);
  EXPECT_EQ(prefill_chunk_rows(c, need(8192) - 1, ctx), 6144);
  EXPECT_EQ(prefill_chunk_rows(c, prefill_step_bytes(c, 2048, ctx).total(), ctx), 0) << "2,048 rows need their 25% slack too";
  EXPECT_EQ(prefill_chunk_rows(c, uint64_t(1) << 50, ctx, 16384), 16384) << "capped by max_rows";
}

}  // namespace
}  // namespace fb::memory
