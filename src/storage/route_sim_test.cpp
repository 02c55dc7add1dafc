#include "storage/route_sim.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

namespace fb::storage {
namespace {

TEST(ZipfRouting, RowsAreDistinctAscendingAndSkewed) {
  ZipfRouting r(2, 384, 7);
  r.set_skew(0.45);
  std::vector<int32_t> ids(6 * 1000);
  std::vector<int64_t> count(384, 0);
  for (int rep = 0; rep < 20; ++rep) {
    r.draw(1, ids, 1000, 6);
    for (int64_t row = 0; row < 1000; ++row)
      for (int k = 0; k < 6; ++k) {
        const int32_t e = ids[size_t(row * 6 + k)];
        ASSERT_TRUE(e >= 0 && e < 384);
        if (k > 0) ASSERT_LT(ids[size_t(row * 6 + k - 1)], e);
        ++count[size_t(e)];
      }
  }
  std::sort(count.begin(), count.end(), std::greater<>());
  int64_t top = 0, all = 0;
  for (int i = 0; i < 384; ++i) (i < 10 ? top : all) += count[size_t(i)];
  all += top;
  // Six distinct picks per row flatten the law a little: the 10 hottest carry somewhat less than 45%.
  EXPECT_NEAR(double(top) / double(all), 0.45, 0.05);
  EXPECT_NEAR(r.static_hit(10), 0.45, 1e-6);
}

// The sweep's next-layer guess: the kept routing comes back on the next draw, the guess holds the
// chosen share of its picks (rows distinct and ascending), accuracy 1 is the routing itself, 0
// holds none of it; a draw with no guess kept is a fresh one.
TEST(PredictedRouting, GuessHoldsTheChosenShare) {
  ZipfRouting z(3, 384, 11);
  z.set_skew(0.45);
  for (double acc : {0.0, 0.5, 0.8, 1.0}) {
    PredictedRouting p(z, acc, 5);
    int64_t held = 0, picks = 0;
    for (int rep = 0; rep < 400; ++rep) {
      std::vector<int32_t> guess, real;
      p.predict(2, guess, 2, 6);
      p.draw(2, real, 2, 6);
      ASSERT_EQ(guess.size(), 12u);
      ASSERT_EQ(real.size(), 12u);
      for (int r = 0; r < 2; ++r)
        for (int i = 0; i < 6; ++i) {
          const int32_t* g = guess.data() + r * 6;
          if (i > 0) {
            ASSERT_LT(g[i - 1], g[i]);
          }
          const int32_t e = real[size_t(r * 6 + i)];
          held += std::find(g, g + 6, e) != g + 6;
          ++picks;
        }
    }
    EXPECT_NEAR(double(held) / double(picks), acc, 0.03) << acc;
  }
  PredictedRouting p(z, 1.0, 5);
  std::vector<int32_t> a, b;
  p.predict(1, a, 1, 6);
  p.draw(0, b, 1, 6);  // another layer: a fresh draw, layer 1's routing still kept
  p.draw(1, b, 1, 6);
  EXPECT_EQ(a, b);
  p.draw(1, b, 1, 6);  // used once
  EXPECT_EQ(b.size(), 6u);
}

// Replays the device sweeps (bench/tier_sweep.cpp; 40 tiered layers, 384 experts, top-6, 128
// slots) in their order: the all-hit baseline (uniform over a layer's 128 hottest experts) first,
// then each skew's warm-up and 24 counted tokens, a 2,048-row prefill chunk after each point when
// the sweep ran one. Measured on the H200 (docs/history.md): aging 8, 192 warm-up tokens, prefill:
// 70.6 / 78.6 / 86.6 % at 30 / 45 / 60 %; aging 64, 512 tokens, no prefill, 60 % then 45 %:
// 88.5 / 81.6 %.
double replay(ZipfRouting& r, SlotSim& sim, double share, int64_t warm, int64_t prefill_rows) {
  r.set_skew(share);
  sim.decode(r, warm);
  sim.reset_counts();
  sim.decode(r, 24);
  const double hit = sim.result().hit_rate;
  if (prefill_rows > 0) sim.prefill(r, prefill_rows);
  return hit;
}

// Properties of the replayed sweeps, not the measured numbers (a better policy would change those;
// the device's figures are printed beside the replay for comparison): the hit rate rises with the
// skew, stays above what random residency gives (slots / experts) and does not beat the best static
// placement by more than sampling noise over 24 tokens.
TEST(SlotSim, ReplaysTheDeviceSweeps) {
  const double random_hit = 128.0 / 384.0;
  auto check_sweep = [&](const char* what, const std::vector<double>& shares, const std::vector<double>& hits, ZipfRouting& r) {
    for (size_t i = 0; i < hits.size(); ++i) {
      r.set_skew(shares[i]);
      EXPECT_GT(hits[i], random_hit) << what << " share " << shares[i];
      EXPECT_LE(hits[i], r.static_hit(128) + 0.03) << what << " share " << shares[i];
      if (i > 0) EXPECT_GT(hits[i], hits[i - 1]) << what << ": the hit rate must rise with the skew";
    }
  };
  ZipfRouting r(40, 384, 7);
  SlotSimOptions o;
  o.aging = 8;
  SlotSim sim(40, o);
  r.set_skew(0, 10, 128);
  sim.decode(r, 192 + 256);
  sim.prefill(r, 2048);
  const double d[3] = {0.706, 0.786, 0.866};
  const std::vector<double> sh = {0.30, 0.45, 0.60};
  std::vector<double> h8;
  for (int i = 0; i < 3; ++i) {
    h8.push_back(replay(r, sim, sh[size_t(i)], 192, 2048));
    std::printf("aging 8 sweep, top-10 share %.2f: replayed %.3f, device %.3f, static %.3f\n", sh[size_t(i)], h8.back(), d[i],
                r.static_hit(128));
  }
  check_sweep("aging 8", sh, h8, r);
  ZipfRouting r2(40, 384, 7);
  o.aging = 64;
  SlotSim sim2(40, o);
  r2.set_skew(0, 10, 128);
  sim2.decode(r2, 512 + 256);
  const double h60 = replay(r2, sim2, 0.60, 512, 0), h45 = replay(r2, sim2, 0.45, 512, 0);
  std::printf("aging 64 sweep: 60%% replayed %.3f (device 0.885), 45%% replayed %.3f (device 0.816)\n", h60, h45);
  check_sweep("aging 64", {0.45, 0.60}, {h45, h60}, r2);
}

// Steady state from a cold start (5,000 warm-up tokens): LFU with a long window comes within 3
// points of the best static placement, a short window and LRU stay below it, admission adds
// little (docs/tiers.md).
TEST(SlotSim, SteadyStatePolicies) {
  auto steady = [](double share, EvictionPolicy p, int aging, int staging) {
    ZipfRouting r(40, 384, 11);
    r.set_skew(share);
    SlotSimOptions o;
    o.policy = p;
    o.aging = aging;
    o.staging = staging;
    SlotSim sim(40, o);
    sim.decode(r, 5000);
    sim.reset_counts();
    sim.decode(r, 300);
    return std::make_pair(sim.result().hit_rate, r.static_hit(128));
  };
  for (double share : {0.30, 0.60}) {
    const auto [lfu64, stat] = steady(share, EvictionPolicy::kLfu, 64, 0);
    const double lfu8 = steady(share, EvictionPolicy::kLfu, 8, 0).first;
    const double lru = steady(share, EvictionPolicy::kLru, 8, 0).first;
    const double adm = steady(share, EvictionPolicy::kLfu, 64, 8).first;
    std::printf("steady state, top-10 share %.2f: LFU(64) %.3f, LFU(8) %.3f, LRU %.3f, LFU(64) + 8 staging %.3f, static %.3f\n", share,
                lfu64, lfu8, lru, adm, stat);
    EXPECT_GT(lfu64, stat - 0.03);
    EXPECT_LT(lfu64, stat + 0.005);
    EXPECT_LT(lfu8, lfu64);
    EXPECT_LT(lru, lfu8);
    EXPECT_NEAR(adm, lfu64, 0.01);
  }
}

// The host cache under the slots (TieredExperts with host views: one LFU cache of every layer's
// records, looked up once per slot miss). It never changes the slots' hits; every slot miss is a
// host hit or a drive read; a larger cache holds more; the slots and the host cache together do
// not beat the best static placement of their capacity per layer; 64 records for 40 layers hold
// almost nothing (the H200 drive bench: 0.0 host hits a token).
TEST(SlotSim, HostCacheUnderTheSlots) {
  auto run = [](int64_t host) {
    ZipfRouting r(40, 384, 3);
    r.set_skew(0.45);
    SlotSimOptions o;
    o.slots = 128;
    o.aging = 64;
    o.host_records = host;
    SlotSim sim(40, o);
    sim.decode(r, 1000);
    sim.reset_counts();
    sim.decode(r, 200);
    const SlotSimResult x = sim.result();
    EXPECT_EQ(sim.host_hits() + sim.drive_reads(), uint64_t(x.misses_per_token * 200 + 0.5)) << host;
    return std::make_pair(x, r.static_hit(128 + int(host / 40)));
  };
  const SlotSimResult none = run(0).first;
  EXPECT_EQ(none.host_hit_rate, 0.0);
  EXPECT_DOUBLE_EQ(none.drive_reads_per_token, none.misses_per_token);
  double last = -1;
  for (int64_t host : {64, 512, 1536}) {
    const auto [x, stat] = run(host);
    std::printf("host cache %lld records: HBM %.3f, host %.4f (%.2f a token), drive reads %.2f a token, static bound %.3f\n",
                (long long)host, x.hit_rate, x.host_hit_rate, x.host_hit_rate * 240, x.drive_reads_per_token, stat);
    EXPECT_DOUBLE_EQ(x.hit_rate, none.hit_rate) << "the host cache must not change the slots' policy";
    EXPECT_GT(x.host_hit_rate, last);
    EXPECT_LE(x.hit_rate + x.host_hit_rate, stat + 0.01);
    if (host == 64) {
      EXPECT_LT(x.host_hit_rate, 0.002);
    }
    last = x.host_hit_rate;
  }
  EXPECT_GT(last, 0.01);
}

}  // namespace
}  // namespace fb::storage
