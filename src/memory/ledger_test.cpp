#include "memory/ledger.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <random>
#include <vector>

#include "memory/plan.h"

namespace fb::memory {
namespace {

TEST(Ledger, AdmitsUpToTargetAndRefusesBeyond) {
  Ledger l({1000, 500});
  auto a = l.admit(Tier::kHbm, Kind::kMandatory, 600, "a");
  ASSERT_TRUE(a.ok());
  auto b = l.admit(Tier::kHbm, Kind::kElastic, 400, "b");
  ASSERT_TRUE(b.ok());
  auto c = l.admit(Tier::kHbm, Kind::kElastic, 1, "c");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("c:"), std::string::npos);
  EXPECT_EQ(l.usage(Tier::kHbm).used_bytes(), 1000u);
  EXPECT_EQ(l.usage(Tier::kHost).used_bytes(), 0u);
  a->release();
  EXPECT_EQ(l.usage(Tier::kHbm).used_bytes(), 400u);
  EXPECT_TRUE(b->resize(900).ok());
  EXPECT_FALSE(b->resize(1001).ok());
  EXPECT_EQ(b->bytes(), 900u);
}

TEST(Ledger, MandatoryReclaimsFromElasticOwners) {
  Ledger l({1000, 0});
  std::vector<Grant> slots;  // an elastic owner: 10 slots of 100 B
  for (int i = 0; i < 10; ++i) slots.push_back(std::move(l.admit(Tier::kHbm, Kind::kElastic, 100, "slot").value()));
  int calls = 0;
  const int id = l.register_owner(Tier::kHbm, "slots", 0, [&](uint64_t want) {
    ++calls;
    uint64_t freed = 0;
    while (freed < want && !slots.empty()) {
      freed += slots.back().bytes();
      slots.pop_back();
    }
    return freed;
  });
  auto m = l.admit(Tier::kHbm, Kind::kMandatory, 250, "kv");
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(slots.size(), 7u);
  EXPECT_EQ(l.usage(Tier::kHbm).used_bytes(), 950u);
  // Elastic admission never reclaims.
  EXPECT_FALSE(l.admit(Tier::kHbm, Kind::kElastic, 100, "more").ok());
  EXPECT_EQ(calls, 1);
  // Mandatory beyond target - mandatory is refused without asking anyone.
  EXPECT_FALSE(l.admit(Tier::kHbm, Kind::kMandatory, 751, "huge").ok());
  EXPECT_EQ(calls, 1);
  l.unregister_owner(id);
}

// Property: random admissions, resizes, releases and reclaims from several elastic owners never
// take a tier past its target, and the ledger's books equal the sum of live grants.
TEST(Ledger, RandomizedNeverExceedsTarget) {
  std::mt19937_64 rng(12345);
  for (int round = 0; round < 40; ++round) {
    const uint64_t target = 1000 + rng() % 100000;
    Ledger l({target, target / 2});
    struct Owner {
      Tier tier;
      std::deque<Grant> grants;
    };
    std::vector<Owner> owners(4);
    std::vector<int> ids;
    for (size_t i = 0; i < owners.size(); ++i) {
      owners[i].tier = Tier(i % 2);
      ids.push_back(l.register_owner(owners[i].tier, "owner" + std::to_string(i), int(rng() % 3), [&owners, i](uint64_t want) {
        uint64_t freed = 0;
        auto& g = owners[i].grants;
        while (freed < want && !g.empty()) {
          freed += g.front().bytes();
          g.pop_front();
        }
        return freed;
      }));
    }
    std::vector<Grant> mandatory;
    for (int step = 0; step < 3000; ++step) {
      const Tier t = Tier(rng() % 2);
      const uint64_t tgt = l.usage(t).target_bytes;
      const uint64_t n = rng() % (tgt / 4 + 1);
      switch (rng() % 6) {
        case 0: {
          auto g = l.admit(t, Kind::kMandatory, n, "m");
          if (g.ok()) mandatory.push_back(std::move(g.value()));
          else ASSERT_EQ(g.status().code(), StatusCode::kResourceExhausted);
          break;
        }
        case 1:
        case 2: {
          auto g = l.admit(t, Kind::kElastic, n, "e");
          if (g.ok()) owners[size_t(rng() % 2) * 2 + size_t(t)].grants.push_back(std::move(g.value()));
          break;
        }
        case 3:
          if (!mandatory.empty()) mandatory.erase(mandatory.begin() + int64_t(rng() % mandatory.size()));
          break;
        case 4:
          if (!mandatory.empty()) (void)mandatory[rng() % mandatory.size()].resize(n);
          break;
        case 5:
          l.reclaim(t, n);
          break;
      }
      for (int ti = 0; ti < kTierCount; ++ti) {
        const TierUsage u = l.usage(Tier(ti));
        ASSERT_LE(u.used_bytes(), u.target_bytes);
        uint64_t m = 0, e = 0;
        for (const Grant& g : mandatory)
          if (g.tier() == Tier(ti)) m += g.bytes();
        for (const Owner& o : owners)
          for (const Grant& g : o.grants)
            if (g.tier() == Tier(ti)) e += g.bytes();
        ASSERT_EQ(u.mandatory_bytes, m);
        ASSERT_EQ(u.elastic_bytes, e);
      }
    }
    mandatory.clear();
    for (int id : ids) l.unregister_owner(id);
    for (auto& o : owners) o.grants.clear();
  }
}

TEST(Plan, ReleasedModelOnH200) {
  auto c = model::Config::from_file(std::string(FB_SOURCE_DIR) + "/tests/data/released_config.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(session_kv_bytes(*c, 0, false), 40u * 128 * 528 + 3 * 4096 + 64);
  // spec/12: 890 B of global KV per token.
  EXPECT_EQ(session_kv_bytes(*c, 1 << 20, false) - session_kv_bytes(*c, 0, false), 890ull << 20);
  PlanInputs in;
  in.hbm_target_bytes = 137 * kGiB;
  in.host_target_bytes = 100 * kGiB;
  auto p = plan_memory(*c, in);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->expert_bytes, 18800640u);
  // The BF16 copies of wo_a the CUDA executor holds beside the checkpoint's FP8 (40 layers and 3
  // DSpark stages of 8 x 1024 x 4096 elements, 2 bytes each) are planned, not left to the slack.
  uint64_t wo_a = 0;
  for (const auto& it : p->items)
    if (it.name.rfind("wo_a BF16", 0) == 0) wo_a = it.bytes;
  EXPECT_EQ(wo_a, uint64_t(43) * 8 * 1024 * 4096 * 2);
  EXPECT_GT(p->hbm_slots_per_layer, 100);
  EXPECT_LT(p->hbm_slots_per_layer, 384);
  EXPECT_LE(p->mandatory_bytes(Tier::kHbm) + p->elastic_bytes(Tier::kHbm), in.hbm_target_bytes);
  EXPECT_LE(p->mandatory_bytes(Tier::kHost) + p->elastic_bytes(Tier::kHost), in.host_target_bytes);
  Ledger l({in.hbm_target_bytes, in.host_target_bytes});
  auto grants = admit_plan(l, *p);
  ASSERT_TRUE(grants.ok()) << grants.status().to_string();
  grants->clear();
  in.hbm_target_bytes = 10 * kGiB;
  auto bad = plan_memory(*c, in);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kResourceExhausted);

  // The executor's default placement: an H200's free HBM tiers the experts with the plan's slot
  // count; a GPU large enough for every expert keeps them all resident; too little HBM is refused.
  auto h200 = auto_expert_placement(*c, uint64_t(139.3 * double(kGiB)), 100 * kGiB, 131072);
  ASSERT_TRUE(h200.ok()) << h200.status().to_string();
  EXPECT_EQ(h200->expert_slots, h200->plan.hbm_slots_per_layer);
  EXPECT_GT(h200->expert_slots, 100);
  EXPECT_LT(h200->expert_slots, 384);
  EXPECT_GT(h200->host_experts, 0);
  auto huge = auto_expert_placement(*c, 1024 * kGiB, 100 * kGiB, 131072);
  ASSERT_TRUE(huge.ok()) << huge.status().to_string();
  EXPECT_EQ(huge->expert_slots, 0);
  EXPECT_FALSE(auto_expert_placement(*c, 12 * kGiB, 100 * kGiB, 131072).ok());
}

}  // namespace
}  // namespace fb::memory

#include "memory/tier_model.h"

namespace fb::memory {
namespace {

// Misses split between the copies and the host CPU (issue 22's lever), by hand: with the host as
// fast as a copy, half the misses go each way and take half the copy time; the experts computed
// on the host leave the HBM term.
TEST(TierModel, HostComputeSplitsTheMisses) {
  const double E = 18800640, h2d = 55e9, t_copy = E / h2d;
  DecodeLoad l{8.52e9, E, 240, 0.75, 0.25};  // 60 misses, all in the host cache
  TierRates r{4.3e12, h2d, 7e9};
  const DecodeBound copy_only = decode_bound(l, r);
  EXPECT_NEAR(copy_only.h2d_s, 60 * t_copy, 1e-12);
  r.host_expert_s = t_copy;
  const DecodeBound both = decode_bound(l, r);
  EXPECT_NEAR(both.host_share, 0.5, 1e-12);
  EXPECT_NEAR(both.h2d_s, 30 * t_copy, 1e-12);
  EXPECT_NEAR(both.host_s, 30 * t_copy, 1e-12);
  EXPECT_NEAR(both.hbm_s, (8.52e9 + 240 * E - 30 * E) / 4.3e12, 1e-12);
  EXPECT_NEAR(both.serial_s, both.hbm_s + 30 * t_copy, 1e-12);
  EXPECT_EQ(both.drive_s, 0);
  // a slow host takes a small share: t_host = 3 t_copy -> f = 1/4
  r.host_expert_s = 3 * t_copy;
  const DecodeBound slow = decode_bound(l, r);
  EXPECT_NEAR(slow.host_share, 0.25, 1e-12);
  EXPECT_NEAR(slow.h2d_s, slow.host_s, 1e-12);
  EXPECT_LT(slow.serial_s, copy_only.serial_s);
}

// Next-layer prediction: accuracy 0 is the serial bound; a perfect guess hides the transfers
// behind the kernels up to the longer of the two; in between, the unguessed share stays serial.
TEST(TierModel, PredictionHidesTheGuessedTransfers) {
  const double E = 18800640, h2d = 50e9;
  DecodeLoad l{8.52e9, E, 240, 0.8, 0.2};  // 48 misses from the host cache
  const DecodeBound b = decode_bound(l, {4.3e12, h2d, 7e9});
  EXPECT_NEAR(b.predicted_s(0), b.serial_s, 1e-12);
  EXPECT_NEAR(b.predicted_s(1), std::max(b.hbm_s, b.h2d_s), 1e-12);
  EXPECT_NEAR(b.predicted_s(0.5), std::max(b.hbm_s, 0.5 * b.h2d_s) + 0.5 * b.h2d_s, 1e-12);
  EXPECT_NEAR(b.predicted_s(2), b.predicted_s(1), 1e-12);  // clamped
  for (double a = 0; a < 1; a += 0.1) EXPECT_GE(b.predicted_s(a), b.predicted_s(a + 0.1) - 1e-15);
  EXPECT_GE(b.predicted_s(1), b.overlapped_s - 1e-15);
}

TEST(TierModel, AllInHbmIsTheHbmRoofline) {
  DecodeLoad l{8.52e9, 18800640, 240, 1.0, 0.0};
  DecodeBound b = decode_bound(l, {4.3e12, 53e9, 7e9});
  EXPECT_NEAR(b.serial_s, (8.52e9 + 240 * 18800640.0) / 4.3e12, 1e-9);
  EXPECT_EQ(b.h2d_s, 0);
  l.hbm_hit = 0.5;
  l.host_hit = 0.3;
  b = decode_bound(l, {4.3e12, 53e9, 7e9});
  EXPECT_NEAR(b.drive_s, 0.2 * 240 * 18800640.0 / 7e9, 1e-9);
  EXPECT_GT(b.ceiling_tok_per_s(), b.floor_tok_per_s());
  const double s = zipf_exponent_for_top_share(384, 10, 0.45);
  EXPECT_NEAR(zipf_top_share(384, 10, s), 0.45, 1e-6);
  EXPECT_EQ(b.host_s, 0);  // no host compute unless its rate is given
  EXPECT_EQ(b.host_share, 0);
  EXPECT_NEAR(zipf_top_share(384, 384, s), 1.0, 1e-12);
}

// LFU slots that lose hits against static placement send them to the drives unless the host cache
// is large enough to hold what the slots evicted (the H200 drive-tier bench: 128 slots, 1.5 host
// records per layer, 0.0 host hits; the plan had counted the whole loss as host hits).
TEST(TierModel, LfuLossReachesTheHostOnlyAsFarAsItsSize) {
  // skew 0.60 at 128 slots: static HBM 90.6%, host (1.5 records per layer) 0.1%, LFU HBM 87.8%
  EXPECT_NEAR(lfu_host_hit(0.906, 0.001, 0.878, 128, 1.5), 0.001 + 0.028 * 1.5 / 128, 1e-12);
  EXPECT_NEAR(lfu_host_hit(0.906, 0.05, 0.878, 128, 128), 0.078, 1e-12);   // a host cache the size of the slots
  EXPECT_NEAR(lfu_host_hit(0.906, 0.05, 0.878, 128, 500), 0.078, 1e-12);   // larger: still at most the loss
  EXPECT_NEAR(lfu_host_hit(0.80, 0.05, 0.82, 128, 10), 0.03, 1e-12);       // the policy beat static placement
}

}  // namespace
}  // namespace fb::memory

namespace fb::memory {
namespace {

// Issue 25's projection: the busiest GPU's share of a layer's picks, by hand, and the bound with
// the experts on several GPUs.
TEST(TierModel, ExpectedMaxLoadByHand) {
  EXPECT_DOUBLE_EQ(expected_max_load(6, 1), 6.0);
  // two GPUs: max(X, 6 - X), X ~ Binomial(6, 1/2): (6 + 6 x 5 + 15 x 4 + 20 x 3 + 15 x 4 + 6 x 5 + 6) / 64
  EXPECT_DOUBLE_EQ(expected_max_load(6, 2), 252.0 / 64.0);
  // one pick: always 1; two picks on 3 bins: 2 with probability 1/3
  EXPECT_DOUBLE_EQ(expected_max_load(1, 4), 1.0);
  EXPECT_NEAR(expected_max_load(2, 3), 1.0 + 1.0 / 3.0, 1e-12);
  EXPECT_EQ(expected_max_load(0, 3), 0.0);
  // more bins never load the busiest one more
  for (int g = 1; g < 8; ++g) EXPECT_GE(expected_max_load(6, g), expected_max_load(6, g + 1));
  // against a brute-force enumeration of every assignment, for small cases
  for (int d = 1; d <= 7; ++d)
    for (int g = 2; g <= 5; ++g) {
      std::vector<int> pick(size_t(d), 0);
      double total = 0, count = 0;
      while (true) {
        std::vector<int> c(size_t(g), 0);
        for (int x : pick) ++c[size_t(x)];
        total += *std::max_element(c.begin(), c.end());
        count += 1;
        int i = 0;
        while (i < d && ++pick[size_t(i)] == g) pick[size_t(i++)] = 0;
        if (i == d) break;
      }
      EXPECT_NEAR(expected_max_load(d, g), total / count, 1e-12) << d << " picks, " << g << " bins";
    }
  // a large top-k costs no enumeration: 16 picks over 8 GPUs
  EXPECT_GT(expected_max_load(16, 8), 2.0);
  EXPECT_LT(expected_max_load(16, 8), 16.0);
}

TEST(TierModel, SeveralGpusSplitTheExpertReadsAndPayTheExchanges) {
  const DecodeLoad l{8.52e9, 18800640, 240, 0.8, 0.15};
  const TierRates r{4.3e12, 53e9, 7e9};
  // one GPU: exactly decode_bound, no exchanges
  const MultiGpuBound one = decode_bound_gpus(l, r, 1, 40, 6, 10240, {400e9, 10e-6});
  const DecodeBound ref = decode_bound(l, r);
  EXPECT_DOUBLE_EQ(one.bound.serial_s, ref.serial_s);
  EXPECT_DOUBLE_EQ(one.bound.overlapped_s, ref.overlapped_s);
  EXPECT_EQ(one.comm_s, 0.0);
  // two GPUs: the busiest GPU reads 3.9375 of a layer's 6 experts; two exchanges per layer
  const MultiGpuBound two = decode_bound_gpus(l, r, 2, 40, 6, 10240, {400e9, 10e-6});
  const double routed = 240 * 18800640.0 * (3.9375 / 6.0);
  EXPECT_NEAR(two.busiest_share, 3.9375 / 6.0, 1e-12);
  EXPECT_NEAR(two.bound.hbm_s, (8.52e9 + routed) / 4.3e12, 1e-12);
  EXPECT_NEAR(two.bound.h2d_s, routed * 0.2 / 53e9, 1e-12);
  EXPECT_NEAR(two.bound.drive_s, 240 * 18800640.0 * 0.05 / 7e9, 1e-12);  // the drives are shared
  EXPECT_NEAR(two.comm_s, 40 * 2 * (10e-6 + 10240.0 / 400e9), 1e-15);
  EXPECT_NEAR(two.bound.serial_s, two.bound.hbm_s + two.bound.h2d_s + two.bound.drive_s + two.comm_s, 1e-15);
  EXPECT_LT(two.bound.hbm_s, ref.hbm_s);
}

}  // namespace
}  // namespace fb::memory
