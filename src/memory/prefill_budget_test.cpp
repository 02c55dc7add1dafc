// prefill_budget.h: the step's count, buffer by buffer, against sizes written out here from the
// CUDA step's allocations (cuda/layer_ops.h, cuda/executor.cu) at the released dimensions; a
// buffer left out of the count (or counted at a different size) fails by name. Then the chunk
// policy: the largest quantum multiple whose whole step (arena + tc scratch + session) fits.
#include "memory/prefill_budget.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

namespace fb::memory {
namespace {

model::Config released() {
  auto c = model::Config::from_file(std::string(FB_SOURCE_DIR) + "/tests/data/released_config.json");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return *c;
}

uint64_t r256(uint64_t b) { return (b + 255) / 256 * 256; }

TEST(PrefillBudget, EveryBufferOfTheReleasedStepIsCounted) {
  const model::Config c = released();
  ASSERT_EQ(c.dim, 5120);
  ASSERT_EQ(c.moe_inter_dim, 2304);
  const uint64_t T = 8192, N = 32768;
  const PrefillStepBytes b = prefill_step_bytes(c, int64_t(T), int64_t(N));
  std::map<std::string, uint64_t> got;
  for (const PrefillBuffer& x : b.buffers) got[x.name] = x.bytes;
  // Written from the CUDA code at released dims (D 5120, hc 4, I 2304, head 512, q 64 x 512,
  // q_lora 1280, o 8 x 1024, indexer 32 x 128, top-k 512, 6 of 384 experts, 3 DSpark taps,
  // Engram 2 tables x 3 orders x 8 heads x 256; kv sources 2, 8, 14 (ratio 2) and 20 (ratio 1);
  // index layers 2, 8, 14 (ratio 2) and 20-36 (ratio 1), candidate pool at 20), 8,192 rows at 32K.
  const uint64_t n = T * 6;
  const std::map<std::string, uint64_t> want = {
      {"step.X", T * 4 * 5120 * 2},
      {"step.residual", T * 4 * 5120 * 2},
      {"step.pre", T * 4 * 4},
      {"step.mix_a", T * 1152},
      {"step.mix_f", T * 1152},
      {"step.u", T * 5120 * 2},
      {"step.y", T * 5120 * 2},
      {"step.h", T * 5120 * 2},
      {"step.qr", T * 1280 * 2},
      {"step.q", T * 32768 * 2},
      {"step.o", T * 32768 * 2},
      {"step.kv", T * 512 * 2},
      {"step.kv_raw", T * 512 * 2},
      {"step.kv_codes", T * 528},
      {"step.q_buf.codes", T * 15360},  // widest GEMM input: the 3 DSpark taps' 3 x 5120
      {"step.q_buf.scales", r256((T * 15360 / 32 + 1) * 4)},
      {"step.uq.codes", T * 5120},
      {"step.uq.scales", r256((T * 5120 / 32 + 1) * 4)},
      {"step.qrq.codes", T * 1280},
      {"step.qrq.scales", r256((T * 1280 / 32 + 1) * 4)},
      {"step.rows", T * 9},
      {"step.taps", T * 3 * 5120 * 2},
      {"embed.src", T * 8},
      {"engram.hashes", T * 2 * 3 * 8 * 8},
      {"engram.E", T * 24 * 256 * 2},
      {"engram.kv", T * 5 * 5120 * 2},
      {"attn_q.a", T * 1280 * 2},
      {"compress.kg", 3 * T * 2 * 512 * 4},
      {"compress.lat1", T * 512 * 2},
      {"compress.latent", 3 * (T / 2) * 512 * 2 + T * 512 * 2},
      {"compress.tmp", 3 * (T / 2) * 128 * 2 + T * 128 * 2},
      {"compress.key", 3 * (T / 2) * 128 * 2 + T * 128 * 2},
      {"compress.kv_stage", 3 * (T / 2) * 288 + T * 288},
      {"compress.key_stage", 3 * r256((T / 2) * 68) + r256(T * 68)},
      {"compress.gpos", 3 * (T / 2) * 8 + T * 8},
      {"compress.pooled", 3 * (T / 2) * 512 * 2},
      {"compress.even_odd", 3 * (T / 2) * 16},
      {"compress.copy_lists", 3 * (T / 2) * 32 + T * 32},
      {"compress.tails", 3 * 256},
      {"index.sel_ids", 8 * T * 512 * 4},
      {"index.sel_count", 8 * T * 4},
      {"index.n_scored", 8 * T * 8},
      {"index.pool", T * N},
      {"index.iq", T * 32 * 128 * 2},
      {"index.wts", T * 32 * 2},
      {"index.scores", T * N * 4},  // ratio-1 layers score every position
      {"index.lists", T * 16},
      {"attention.keys", r256(T * 128 * 8 + ((T + 1) * 4 + 15) / 16 * 16 + T * 8)},  // one packed upload
      {"attn_output.z", T * 8192 * 2},
      {"moe.experts", n * 4},
      {"moe.weights", n * 4},
      {"moe.a", T * 2304 * 2},
      {"moe.b", T * 2304 * 2},
      {"moe.ye", n * 5120 * 2},
      {"moe.ys", T * 5120 * 2},
      {"moe.route_scratch", 2 * T * 384 * 4},
      {"moe.perm", n * 4},
      {"moe.xp", n * 5120 * 2},
      {"moe.ap", n * 2304 * 2},
      {"moe.bp", n * 2304 * 2},
      {"moe.hp", n * 2304 * 2},
      {"moe.yp", n * 5120 * 2},
      {"moe.wp", n * 4},
      {"end_layer.ring_lists", 40 * r256(136 * 16)},
      {"head.logits", 129280 * 4},
      {"head.hrows", 5120 * 2},
      {"head.nrm", 5120 * 2},
      {"head.rows", 256},
  };
  for (const auto& [name, bytes] : want) {
    auto it = got.find(name);
    if (it == got.end()) {
      ADD_FAILURE() << name << " (" << bytes << " B) is not in the count";
      continue;
    }
    EXPECT_EQ(it->second, bytes) << name;
  }
  uint64_t held = 0, moe = 0;
  for (const PrefillBuffer& x : b.buffers) {
    if (x.name.rfind("tc.", 0) == 0 || x.name.rfind("session.", 0) == 0) continue;
    EXPECT_TRUE(want.count(x.name)) << x.name << " is counted but not listed here";
    if (x.held) held += x.bytes;
    if (x.name.rfind("moe.", 0) == 0) moe += x.bytes;
  }
  EXPECT_EQ(b.step, held);
  EXPECT_EQ(b.moe, moe);
  // The peak is the last layer's MoE: everything held by then (all but its ring lists and the
  // head) plus the MoE's temporaries.
  const uint64_t after_last_moe = r256(136 * 16) + got["head.logits"] + got["head.hrows"] + got["head.nrm"] + got["head.rows"];
  EXPECT_EQ(b.arena(), b.step - after_last_moe + b.moe);
  // tc scratch: the largest expanded FP8 weight (Engram's wkv, 25600 x 6144) and input (wo_b's
  // 8192 columns), the three expanded expert matrices, the indexer's keys and ~1 GiB of dots,
  // attention's batches, hc mixes, each +1/8, and cuBLASLt's 64 MiB.
  std::map<int, uint64_t> slot;
  for (int s = 0; s < 8; ++s) slot[s] = got["tc.slot" + std::to_string(s)];
  EXPECT_EQ(slot[0], 25600ull * 6144 * 2 * 9 / 8);
  EXPECT_EQ(slot[1], 2304ull * 5120 * 2 * 9 / 8);
  EXPECT_EQ(slot[3], T * 8192 * 2 * 9 / 8);
  const uint64_t dots = (1ull << 30) / (32 * N * 2) * 32 * N * 2;
  EXPECT_EQ(slot[5], dots + dots / 8);
  EXPECT_EQ(b.tc, slot[0] + slot[1] + slot[2] + slot[3] + slot[4] + slot[5] + slot[6] + slot[7] + (64ull << 20));
  EXPECT_EQ(b.total(), b.arena() + b.tc + b.session);
  EXPECT_GT(b.session, 0u);
  // Released dims: an 8K-row step at 32K is about 8 GiB in all, more than half of it outside the
  // MoE's temporaries.
  const double gib = double(b.total()) / double(1ull << 30);
  EXPECT_GT(gib, 7.0);
  EXPECT_LT(gib, 9.0);
}

TEST(PrefillBudget, StepBytesGrowWithRowsAndContext) {
  const model::Config c = released();
  const PrefillStepBytes a = prefill_step_bytes(c, 2048, 32768), b = prefill_step_bytes(c, 4096, 32768);
  EXPECT_GT(b.step, a.step);
  EXPECT_LE(b.step, 2 * a.step + 64 * 1024);  // per-row buffers and a few fixed ones
  EXPECT_EQ(b.moe, 2 * a.moe);
  EXPECT_GT(b.arena(), a.arena());
  EXPECT_GT(prefill_step_bytes(c, 2048, 131072).arena(), a.arena()) << "indexer scores and the pool grow with the context";
  EXPECT_GT(prefill_step_bytes(c, 2048, 131072).session, a.session);
  EXPECT_EQ(prefill_step_bytes(c, 0, 32768).total(), 0u);
}

TEST(PrefillBudget, ChunkIsTheLargestThatFits) {
  const model::Config c = released();
  const int64_t ctx = 65536;
  auto need = [&](int64_t r) { return prefill_step_bytes(c, r, ctx).total(); };
  EXPECT_EQ(prefill_chunk_rows(c, need(8192), ctx), 8192);
  EXPECT_EQ(prefill_chunk_rows(c, need(8192) - 1, ctx), 6144);
  EXPECT_EQ(prefill_chunk_rows(c, need(2048) - 1, ctx), 0);
  EXPECT_EQ(prefill_chunk_rows(c, uint64_t(1) << 50, ctx, 16384), 16384) << "capped by max_rows";
}

TEST(PrefillBudget, BalancedChunksKeepTheFewestChunks) {
  EXPECT_EQ(prefill_balanced_chunk(26624, 32768), 16384);
  EXPECT_EQ(prefill_balanced_chunk(26624, 8192), 8192) << "one chunk: the prompt";
  EXPECT_EQ(prefill_balanced_chunk(16384, 131072), 16384);
  EXPECT_EQ(prefill_balanced_chunk(24576, 65536), 22528);  // 3 chunks: 21,846 rows rounded up to 2,048
  EXPECT_EQ(prefill_balanced_chunk(0, 32768), 0);
  for (int64_t max_rows : {2048, 6144, 10240, 26624, 40960})
    for (int64_t prompt : {4096, 8192, 32768, 100000, 131072}) {
      const int64_t c = prefill_balanced_chunk(max_rows, prompt);
      EXPECT_LE(c, std::max(max_rows, int64_t(0)));
      EXPECT_EQ((prompt + c - 1) / c, (prompt + max_rows - 1) / max_rows) << max_rows << " " << prompt << ": no extra chunk";
    }
}

// The H200 run of session 11 (139.8 GiB device, the released-dim model with 128 slots per layer
// and two 256-expert staging buffers resident): whatever HBM is left, the chosen chunk's whole
// step plus the margin stays within the free bytes, and one more quantum would not fit.
TEST(PrefillBudget, ChunkFromFreeHbmLeavesTheMargin) {
  const model::Config c = released();
  const uint64_t gib = 1ull << 30, total = uint64_t(139.8 * double(gib));
  EXPECT_EQ(prefill_budget_from_free(3 * gib, total), 0u);
  for (double free_gib : {12.0, 18.0, 24.0, 30.0})
    for (int64_t ctx : {8192, 32768, 131072}) {
      const uint64_t free_b = uint64_t(free_gib * double(gib)), budget = prefill_budget_from_free(free_b, total);
      EXPECT_EQ(budget, free_b - 2 * gib - uint64_t(double(total) * 0.02));
      const int64_t rows = prefill_chunk_rows(c, budget, ctx);
      if (rows == 0) continue;
      const uint64_t used = prefill_step_bytes(c, rows, std::max(ctx, rows)).total();
      EXPECT_LE(used + 2 * gib, free_b) << free_gib << " GiB free, " << ctx << " context: " << rows << " rows";
      if (rows < 65536) {
        EXPECT_GT(prefill_step_bytes(c, rows + 2048, std::max(ctx, rows + 2048)).total(), budget);
      }
    }
  // 24 GiB free at 32K gives a chunk of thousands of rows, not none.
  EXPECT_GE(prefill_chunk_rows(c, prefill_budget_from_free(24 * gib, total), 32768), 8192);
}

// The cold-prefill plan by hand: 4 layers (the decoder from layer 2), 8 experts with 4 slots, top
// 2, 1 GB experts at 1 GB/s (4 s of copies per layer and chunk); a layer step computes in 100 ms +
// 1 ms a row; a 2,000-token prompt in two chunks of 1,000 and a window of 10 rows.
TEST(ColdPrefillEstimate, ByHand) {
  ColdPrefillCompute c;
  c.fixed_ms = 100;
  c.row_us = 1000;
  const ColdPrefillEstimate e = cold_prefill_estimate(2000, 1000, 4, 2, 10, 8, 4, 2, 1e9, 1e9, c);
  EXPECT_EQ(e.chunks, 2);
  EXPECT_DOUBLE_EQ(e.copy_s, 16.0);
  EXPECT_DOUBLE_EQ(e.serial_s, 2 * 4 * (1.1 + 4.0));
  EXPECT_DOUBLE_EQ(e.streamed_s, 2 * 4 * 4.0) << "copy-bound: the copies per layer step";
  // encoder: 2 layers x max(1.1 s, 4 s) per chunk; decoder, last chunk only: 10 rows (0.11 s) reach
  // 8 (1 - (3/4)^10) experts, half of them not resident, 2 layers
  const double distinct = 8.0 * (1.0 - std::pow(0.75, 10.0));
  EXPECT_NEAR(e.replay_s, 2 * 2 * 4.0 + 2 * distinct * 0.5, 1e-9);
  EXPECT_LT(e.replay_s, e.streamed_s);
  // the executor's replay stages every non-resident expert of a decoder layer: a streamed layer's copies
  EXPECT_NEAR(cold_prefill_estimate(2000, 1000, 4, 2, 10, 8, 4, 2, 1e9, 1e9, c, true).replay_s, 2 * 2 * 4.0 + 2 * 4.0, 1e-9);
  // no decoder (decoder_start <= 0): no replay figure; compute-bound chunks stream at the compute
  EXPECT_EQ(cold_prefill_estimate(2000, 1000, 4, -1, 10, 8, 4, 2, 1e9, 1e9, c).replay_s, 0.0);
  EXPECT_DOUBLE_EQ(cold_prefill_estimate(64000, 32000, 4, -1, 10, 8, 4, 2, 1e9, 1e9, c).streamed_s, 2 * 4 * 32.1);
  // every expert resident: nothing to copy, serial == streamed == compute, nothing exposed
  c.exposed_copy_ms = 500;
  const ColdPrefillEstimate r = cold_prefill_estimate(2000, 1000, 4, 2, 10, 8, 8, 2, 1e9, 1e9, c);
  EXPECT_DOUBLE_EQ(r.serial_s, 2 * 4 * 1.1);
  EXPECT_DOUBLE_EQ(r.streamed_s, 2 * 4 * 1.1);
  // a copy-bound step leaves exposed_copy_ms beside its copies; a compute-bound one does not
  EXPECT_DOUBLE_EQ(cold_prefill_estimate(2000, 1000, 4, -1, 10, 8, 4, 2, 1e9, 1e9, c).streamed_s, 2 * 4 * 4.5);
  EXPECT_DOUBLE_EQ(cold_prefill_estimate(64000, 32000, 4, -1, 10, 8, 4, 2, 1e9, 1e9, c).streamed_s, 2 * 4 * 32.1);
  // copies at half the H2D rate take twice as long
  c.exposed_copy_ms = 0;
  c.copy_efficiency = 0.5;
  EXPECT_DOUBLE_EQ(cold_prefill_estimate(2000, 1000, 4, -1, 10, 8, 4, 2, 1e9, 1e9, c).streamed_s, 2 * 4 * 8.0);
  // the attention's growth with the position: each chunk at its own middle (500 and 1,500)
  c.copy_efficiency = 1;
  c.ctx_ns = 2.0;  // 1,000 rows x 500 tokens x 2 ns = 1 ms; x 1,500 = 3 ms
  EXPECT_DOUBLE_EQ(cold_prefill_estimate(2000, 1000, 4, -1, 10, 8, 8, 2, 1e9, 1e9, c).serial_s, 4 * (1.101 + 1.103));
  EXPECT_DOUBLE_EQ(c.layer_ms(1000, 500), 1101.0);
}

}  // namespace
}  // namespace fb::memory
