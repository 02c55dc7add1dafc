// The fast sparse attention (fast_attention.h) against the CPU reference (cpu::sparse_attention,
// which the exact CUDA kernels equal bit for bit, ops_test.cpp) at the released shape (64 heads,
// head_dim 512, window 128 + 512 selected entries) and at the tiny fixtures' (4 heads, 64):
//  (1) accuracy: per row NMSE <= 1e-4 and max |err| <= 2^-5 of the row's largest |o|. Expected
//      error: both sides round p to bf16 (2^-9 relative) but relative to different maxima (the
//      running max vs the block's own), the dots sum in another order, and the outputs round to
//      bf16 once; a wrong key, block or weight gives NMSE ~1;
//  (2) row invariance: a row's bits alone equal its bits among 3 and 7 rows;
//  (3) determinism, and the same bits with programmatic dependent launch on and off.
// Label: gpu (skipped without a device).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "cpu/ops.h"
#include "cuda/fast_attention.h"
#include "cuda/fast_small.h"
#include "cuda/ops_test_util.h"

namespace fb::cuda {
namespace {

using namespace ops_test_util;

// One row's key list: window FP8 rows (some empty), then selected FP4 ids (some -1).
struct RowKeys {
  int n_win = 0, n_sel = 0;
};

struct Case {
  int H, d;
  int64_t T;
  std::vector<RowKeys> rows;
  std::vector<uint8_t> win_rows, comp;
  std::vector<bf16_t> win_val, comp_val, q;
  std::vector<float> sinks;
  std::vector<std::vector<int>> win_idx;  // per row: window row index or -1
  std::vector<std::vector<int32_t>> sel;  // per row: compressed ids
  int64_t n_comp;

  Case(Rng& rng, int heads, int dim, std::vector<RowKeys> r, float q_scale) : H(heads), d(dim), T(int64_t(r.size())), rows(std::move(r)) {
    int total_win = 0;
    for (const auto& k : rows) total_win += k.n_win;
    n_comp = 700;
    QdqRows win = fp8_window_rows(rng, total_win, d);
    QdqRows cmp = fp4_comp_rows(rng, n_comp, d);
    win_rows = std::move(win.rows);
    win_val = std::move(win.values);
    comp = std::move(cmp.rows);
    comp_val = std::move(cmp.values);
    q = rng.act(T * H * d, q_scale);
    sinks = rng.f32(H, 1.0f);
    int w0 = 0;
    for (const auto& k : rows) {
      std::vector<int> wi;
      for (int i = 0; i < k.n_win; ++i) wi.push_back(rng.uniform(0, 9) == 0 ? -1 : w0 + i);
      w0 += k.n_win;
      win_idx.push_back(wi);
      std::vector<int32_t> s;
      for (int i = 0; i < k.n_sel; ++i) s.push_back(rng.uniform(0, 7) == 0 ? -1 : rng.uniform(0, int(n_comp) - 1));
      sel.push_back(s);
    }
  }

  // CPU reference outputs of rows [t0, t0 + n).
  std::vector<bf16_t> reference() const {
    std::vector<bf16_t> want(size_t(T * H * d));
    for (int64_t t = 0; t < T; ++t) {
      std::vector<const bf16_t*> keys;
      for (int i : win_idx[size_t(t)]) keys.push_back(i < 0 ? nullptr : &win_val[size_t(i) * d]);
      for (int32_t id : sel[size_t(t)]) keys.push_back(id < 0 ? nullptr : &comp_val[size_t(id) * d]);
      cpu::sparse_attention(&q[size_t(t * H * d)], H, d, keys, sinks.data(), 1.0f / std::sqrt(float(d)), &want[size_t(t * H * d)]);
    }
    return want;
  }

  // fast_sparse_attention over the rows listed in `which` (in that order), as one step.
  // rope: 0 none; 1 q rotated by the rope() kernel before and o un-rotated after (the launches the
  // executor made before the fold); 2 the same RoPE folded into the kernels (AttnRope). Row t sits
  // at position 37 + 411 t of random cos / sin tables (any values: the fold must give the same bits).
  std::vector<bf16_t> run_fast(const std::vector<int64_t>& which, bool pdl, int rope = 0) const {
    const int64_t R = int64_t(which.size()), rb8 = d + d / 32;
    Dev<uint8_t> dwin(win_rows), dcomp(comp);
    std::vector<uint64_t> win_ptr, comp_base(size_t(R), reinterpret_cast<uint64_t>(dcomp.p()));
    std::vector<int32_t> off{0}, cnt;
    int64_t sel_ld = 1;
    for (int64_t t : which) sel_ld = std::max<int64_t>(sel_ld, int64_t(sel[size_t(t)].size()));
    std::vector<int32_t> sl(size_t(R * sel_ld), -1);
    std::vector<bf16_t> qr;
    int max_keys = 1;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t t = which[size_t(r)];
      for (int i : win_idx[size_t(t)]) win_ptr.push_back(i < 0 ? 0 : reinterpret_cast<uint64_t>(dwin.p() + size_t(i) * size_t(rb8)));
      off.push_back(int32_t(win_ptr.size()));
      cnt.push_back(int32_t(sel[size_t(t)].size()));
      std::copy(sel[size_t(t)].begin(), sel[size_t(t)].end(), sl.begin() + r * sel_ld);
      qr.insert(qr.end(), q.begin() + t * H * d, q.begin() + (t + 1) * H * d);
      max_keys = std::max(max_keys, int(win_idx[size_t(t)].size() + sel[size_t(t)].size()));
    }
    if (win_ptr.empty()) win_ptr.push_back(0);
    Dev<uint64_t> dwp(win_ptr), dcb(comp_base);
    Dev<int32_t> doff(off), dsel(sl), dcnt(cnt);
    Dev<bf16_t> dq(qr), dout(size_t(R * H * d));
    Dev<float> dsink(sinks), scratch(size_t(fast_attention_floats(R, H, d, max_keys)));
    AttnKeys k{dwp.p(), doff.p(), dsel.p(), dcnt.p(), sel_ld, dcb.p()};
    k.max_keys = max_keys;
    constexpr int kRopeDim = 64;
    const int64_t n_pos = 37 + 411 * T;
    Rng trng(99);
    Dev<float> dcos(trng.f32(n_pos * kRopeDim / 2)), dsin(trng.f32(n_pos * kRopeDim / 2));
    std::vector<int64_t> pos;
    for (int64_t t : which) pos.push_back(37 + 411 * t);
    Dev<int64_t> dpos(pos);
    AttnRope fold;
    if (rope == 1) {
      EXPECT_TRUE(cuda::rope(dq.p(), R, H, d, kRopeDim, dpos.p(), dcos.p(), dsin.p(), false, nullptr).ok());
    }
    if (rope == 2) fold = AttnRope{dpos.p(), dcos.p(), dsin.p(), kRopeDim / 2, true, true};
    set_fast_pdl(pdl);
    EXPECT_TRUE(fast_sparse_attention(dq.p(), R, H, d, k, dsink.p(), 1.0f / std::sqrt(float(d)), scratch.p(), dout.p(), nullptr, fold).ok());
    set_fast_pdl(false);
    if (rope == 1) {
      EXPECT_TRUE(cuda::rope(dout.p(), R, H, d, kRopeDim, dpos.p(), dcos.p(), dsin.p(), true, nullptr).ok());
    }
    return dout.get();
  }
};

void expect_close(const std::vector<bf16_t>& got, const std::vector<bf16_t>& want, int64_t T, int64_t width, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double worst_nmse = 0, worst_rel = 0;
  for (int64_t t = 0; t < T; ++t) {
    double se = 0, ss = 0, amax = 0, emax = 0;
    for (int64_t i = t * width; i < (t + 1) * width; ++i) {
      const double a = bf16_to_f32(got[size_t(i)]), b = bf16_to_f32(want[size_t(i)]);
      ASSERT_TRUE(std::isfinite(a)) << what << " row " << t << " element " << i - t * width;
      se += (a - b) * (a - b);
      ss += b * b;
      amax = std::max(amax, std::fabs(b));
      emax = std::max(emax, std::fabs(a - b));
    }
    ASSERT_GT(ss, 0.0) << what;
    worst_nmse = std::max(worst_nmse, se / ss);
    worst_rel = std::max(worst_rel, emax / amax);
  }
  std::printf("  %-44s worst row nmse %.3g, max |err| / max |o| %.3g\n", what, worst_nmse, worst_rel);
  EXPECT_LE(worst_nmse, 1e-4) << what;
  EXPECT_LE(worst_rel, 1.0 / 32) << what;
}

std::vector<int64_t> all_rows(int64_t T) {
  std::vector<int64_t> v(static_cast<size_t>(T));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

TEST(FastAttention, ReleasedShapeAgainstCpu) {
  FB_NEED_GPU();
  Rng rng(11);
  // A decode row at a long context (window 128 + 512 selected), a window-only row (ratio-0
  // layer), rows ending inside a block, a row of 3 keys; and peaked scores (q x 4).
  for (float qs : {1.0f, 4.0f}) {
    Case c(rng, 64, 512, {{128, 512}, {128, 0}, {100, 37}, {3, 0}, {128, 200}}, qs);
    expect_close(c.run_fast(all_rows(c.T), false), c.reference(), c.T, int64_t(c.H) * c.d, qs == 1.0f ? "64 heads x 512, 5 rows" : "64 heads x 512, peaked");
  }
}

TEST(FastAttention, TinyShapeAgainstCpu) {
  FB_NEED_GPU();
  Rng rng(12);
  Case c(rng, 4, 64, {{16, 8}, {16, 0}, {5, 3}, {1, 0}}, 1.0f);
  expect_close(c.run_fast(all_rows(c.T), false), c.reference(), c.T, int64_t(c.H) * c.d, "4 heads x 64 (tiny fixtures)");
}

// Key lists longer than 64 blocks (a long prefill window) and rows split into launch batches:
// accurate, and a row's bits do not depend on the batch it ran in.
TEST(FastAttention, LongListsAndRowBatches) {
  FB_NEED_GPU();
  Rng rng(14);
  Case c(rng, 4, 64, {{4200, 8}, {4100, 0}, {30, 8}, {4200, 0}, {7, 2}}, 1.0f);
  const auto all = c.run_fast(all_rows(c.T), false);
  expect_close(all, c.reference(), c.T, int64_t(c.H) * c.d, "4 heads x 64, 4,208 keys");
  fast_attention_set_batch_floats(int64_t(c.H) * 66 * (c.d + 2) * 2);  // 2 rows per batch
  const auto batched = c.run_fast(all_rows(c.T), false);
  fast_attention_set_batch_floats(0);
  EXPECT_EQ(batched, all) << "rows in batches of 2 vs one batch";
}

// Fewer heads per tile CTA (more CTAs per row): accurate, and row-invariant in the same way.
TEST(FastAttention, HeadsPerCta) {
  FB_NEED_GPU();
  Rng rng(15);
  Case c(rng, 64, 512, {{128, 512}, {128, 0}, {77, 300}}, 1.0f);
  const auto want = c.reference();
  for (int hpc : {8, 5}) {
    fast_attention_set_heads_per_cta(hpc);
    const auto all = c.run_fast(all_rows(c.T), false);
    expect_close(all, want, c.T, int64_t(c.H) * c.d, hpc == 8 ? "8 heads per CTA" : "5 heads per CTA");
    const auto alone = c.run_fast({2}, false);
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), all.begin() + 2 * int64_t(c.H) * c.d)) << hpc << " heads per CTA: row 2 alone";
  }
  fast_attention_set_heads_per_cta(16);
}

TEST(FastAttention, RowInvariantDeterministicAndPdl) {
  FB_NEED_GPU();
  Rng rng(13);
  Case c(rng, 64, 512, {{128, 512}, {128, 0}, {77, 300}, {128, 512}, {40, 0}, {128, 128}, {128, 511}}, 1.0f);
  const int64_t W = int64_t(c.H) * c.d;
  const auto all = c.run_fast(all_rows(c.T), false);
  EXPECT_EQ(c.run_fast(all_rows(c.T), false), all) << "two runs differ";
  EXPECT_EQ(c.run_fast(all_rows(c.T), true), all) << "PDL on changes bits";
  for (int64_t t : {0, 2, 6}) {
    const auto alone = c.run_fast({t}, false);
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), all.begin() + t * W)) << "row " << t << " alone vs among 7";
    const auto three = c.run_fast({(t + 1) % c.T, t, (t + 3) % c.T}, false);
    EXPECT_TRUE(std::equal(three.begin() + W, three.begin() + 2 * W, all.begin() + t * W)) << "row " << t << " among 3";
  }
}

// The q / o RoPE folded into the kernels (AttnRope, the executor's attn_fuse_rope) gives the bits of
// the rope() launches around the unfolded kernels, at the released shape (rotated dims 448..511 of
// 512) and the tiny one (all 64 dims rotated), with PDL, for every row alone and together; and the
// rotation is not a no-op (the outputs differ from a run without it).
TEST(FastAttention, RopeFoldedSameBits) {
  FB_NEED_GPU();
  Rng rng(17);
  const Case big(rng, 64, 512, {{128, 512}, {77, 300}, {128, 0}, {40, 511}}, 1.0f);
  const Case tiny(rng, 4, 64, {{16, 8}, {5, 0}, {16, 3}}, 1.0f);
  for (const Case* c : {&big, &tiny}) {
    SCOPED_TRACE("d=" + std::to_string(c->d));
    const auto launches = c->run_fast(all_rows(c->T), true, 1);
    const auto folded = c->run_fast(all_rows(c->T), true, 2);
    EXPECT_EQ(folded, launches) << "folded RoPE changes bits";
    EXPECT_NE(c->run_fast(all_rows(c->T), true, 0), launches) << "the RoPE did nothing";
    const int64_t W = int64_t(c->H) * c->d;
    for (int64_t t = 0; t < c->T; ++t) {
      const auto alone = c->run_fast({t}, false, 2);
      EXPECT_TRUE(std::equal(alone.begin(), alone.end(), launches.begin() + t * W)) << "row " << t << " alone, folded";
    }
  }
}

// ---- the indexer's scores on tensor cores ---------------------------------------------------------

// fast_index_scores against the exact kernel (the CPU's bits, ops_test.cpp) at the released shape
// (32 heads x 128), rows of 1, 700 and 5,000 visible entries with scoring past n_vis, with and
// without a pool mask: the same -inf entries; finite entries NMSE <= 1e-5, at least half of them
// bit-identical (a score moves only where a dot's f32 sum rounds to the other neighbouring bf16);
// each row alone equals its bits among three (row invariance); two runs and PDL on/off equal.
TEST(FastAttention, IndexScoresAgainstExact) {
  FB_NEED_GPU();
  Rng rng(17);
  const int IH = 32, ihd = 128;
  const int64_t kb = ihd / 2 + ihd / 32;
  const std::vector<int64_t> n_vis = {1, 700, 5000}, n_scored = {1, 760, 5000};
  const int64_t T = 3, ld = 5000, n_keys = 5000;
  std::vector<uint8_t> keys(size_t(n_keys * kb));
  auto raw = rng.act(n_keys * ihd);
  std::vector<bf16_t> kv(static_cast<size_t>(ihd));
  for (int64_t j = 0; j < n_keys; ++j) cpu::fp4_e8m0_qdq_row(&raw[size_t(j * ihd)], ihd, &keys[size_t(j * kb)], &keys[size_t(j * kb + ihd / 2)], kv.data());
  auto iq = rng.act(T * IH * ihd);
  for (int64_t r = 0; r < T * IH; ++r) {  // the queries are FP4-QDQ'd too
    std::vector<uint8_t> pk(ihd / 2), ps(ihd / 32);
    cpu::fp4_e8m0_qdq_row(&iq[size_t(r * ihd)], ihd, pk.data(), ps.data(), &iq[size_t(r * ihd)]);
  }
  const auto wts = rng.act(T * IH, 0.3f);
  std::vector<uint8_t> mask(size_t(T * ld));
  for (auto& m : mask) m = uint8_t(rng.uniform(0, 3) != 0);
  Dev<uint8_t> dkeys(keys), dmask(mask);
  const std::vector<uint64_t> base(size_t(T), reinterpret_cast<uint64_t>(dkeys.p()));
  ASSERT_TRUE(fast_index_scores_ok(T, IH, ihd, kb, base));
  Dev<uint64_t> dbase(base);
  Dev<bf16_t> diq(iq), dwts(wts);
  Dev<int64_t> dnv(n_vis), dns(n_scored), dmlen(std::vector<int64_t>(size_t(T), ld));
  for (bool masked : {false, true}) {
    SCOPED_TRACE(masked ? "pool mask" : "no mask");
    const uint8_t* mk = masked ? dmask.p() : nullptr;
    const int64_t* ml = masked ? dmlen.p() : nullptr;
    Dev<float> exact(size_t(T * ld)), fast(size_t(T * ld));
    ASSERT_TRUE(index_scores(diq.p(), dwts.p(), T, IH, ihd, dbase.p(), kb, dnv.p(), dns.p(), exact.p(), ld, nullptr, mk, ld, ml).ok());
    ASSERT_TRUE(fast_index_scores(diq.p(), dwts.p(), T, IH, ihd, dbase.p(), kb, dnv.p(), dns.p(), fast.p(), ld, nullptr, mk, ld, ml).ok());
    const auto e = exact.get(), f = fast.get();
    double se = 0, sd = 0;
    size_t finite = 0, same = 0, inf_diff = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < n_scored[size_t(t)]; ++j) {
        const float a = f[size_t(t * ld + j)], b = e[size_t(t * ld + j)];
        if (std::isinf(a) || std::isinf(b)) {
          inf_diff += a != b;
          continue;
        }
        ++finite;
        same += a == b;
        se += double(b) * b;
        sd += (double(a) - b) * (double(a) - b);
      }
    EXPECT_EQ(inf_diff, 0u) << "-inf entries differ";
    EXPECT_GT(finite, 1000u);
    EXPECT_LE(sd / std::max(se, 1e-30), 1e-5) << "NMSE";
    EXPECT_GE(double(same), 0.5 * double(finite)) << same << " of " << finite << " bit-identical";
    std::printf("[ fast ] index scores%s: %zu of %zu finite entries bit-identical to exact, NMSE %.3g\n", masked ? " (pool)" : "", same, finite,
                sd / std::max(se, 1e-30));
    // row invariance: row 2 alone (its own n_vis / n_scored) equals its bits among three
    Dev<float> one(static_cast<size_t>(ld));
    Dev<int64_t> nv2(std::vector<int64_t>{n_vis[2]}), ns2(std::vector<int64_t>{n_scored[2]}), ml2(std::vector<int64_t>{ld});
    ASSERT_TRUE(fast_index_scores(diq.p() + 2 * IH * ihd, dwts.p() + 2 * IH, 1, IH, ihd, dbase.p(), kb, nv2.p(), ns2.p(), one.p(), ld, nullptr,
                                  masked ? dmask.p() + 2 * ld : nullptr, ld, masked ? ml2.p() : nullptr)
                    .ok());
    const auto o = one.get();
    EXPECT_TRUE(std::equal(o.begin(), o.begin() + n_scored[2], f.begin() + 2 * ld)) << "row 2 alone vs among three";
    // determinism and PDL
    for (bool pdl : {false, true}) {
      set_fast_pdl(pdl);
      Dev<float> again(size_t(T * ld));
      ASSERT_TRUE(fast_index_scores(diq.p(), dwts.p(), T, IH, ihd, dbase.p(), kb, dnv.p(), dns.p(), again.p(), ld, nullptr, mk, ld, ml).ok());
      const auto g = again.get();
      for (int64_t t = 0; t < T; ++t)
        EXPECT_TRUE(std::equal(g.begin() + t * ld, g.begin() + t * ld + n_scored[size_t(t)], f.begin() + t * ld)) << "row " << t << " pdl " << pdl;
    }
    set_fast_pdl(false);
  }
}

}  // namespace
}  // namespace fb::cuda
