// End-to-end parity on the official fixtures: the CUDA executor runs the check-fixture protocol
// with the CPU reference in lockstep (engine::check_fixture + make_reference). Gate: greedy ids
// identical to the CPU executor on every row, logits, after-block taps and drafts bit-identical
// (docs/numerics.md). Fixtures: $FB_FIXTURES_DIR, else FB_SHARED_DIR/fixtures. Label: gpu.
#include <gtest/gtest.h>

#include "cuda/gpu_test_util.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cpu/executor.h"
#include "cpu/host_expert.h"
#include "cuda/executor.h"
#include "engine/executor_factory.h"
#include "engine/fixture_check.h"
#include "model/schema.h"
#include "storage/engram_rows.h"

namespace fb::cuda {
namespace {

using test_util::fixtures_dir;
using test_util::runnable_fixture;

// tc false: the exact path (tensor-core prefill is on by default from 64 rows); true: tensor-core
// matmuls, attention and indexer dots for every prefill step ([reference-defining], tc_gemm.h).
// The run options of the two cases: tc false = the exact class; tc true = the fast class's
// tensor-core prefill for every prefill step with the fast GEMVs and fused small ops off (decode
// rows exact).
// The tiny models' short dots are exact in any order, so the tensor-core GEMMs, attention and
// indexer reproduce the CPU bit for bit here; the tensor-core mHC mixes sum 3 x 4 x 256 products
// per mix in another order and do not (ops_test TensorCoreHcMixes holds their tolerance), so this
// parity keeps them off.
using ExecutorFactory = std::function<Result<std::unique_ptr<model::Executor>>(const std::string&)>;

CudaRunOptions run_for(bool tc) {
  CudaRunOptions r;
  r.numerics = tc ? Numerics::kFast : Numerics::kExact;
  r.tc_prefill = tc;
  r.tc_prefill_min_rows = 1;
  r.tc_hc_mixes = false;
  r.fast_gemv = false;
  r.fast_small = false;  // its Sinkhorn / rsqrt are not the CPU's functions (fast_small.h)
  r.fast_attn = false;   // decode rows' attention on tensor cores: p relative to block maxima (fast_attention.h)
  r.bounded_replay = true;  // accepted where a test sends replay rows (BoundedReplayMatchesCpu lifts the product's gate)
  return r;
}
Result<std::unique_ptr<model::Executor>> load_cuda(const std::string& ckpt, const CudaLoadOptions& lo) {
  auto m = CudaExecutor::load(ckpt, {}, lo);
  if (!m.ok()) return m.status();
  return std::unique_ptr<model::Executor>(std::move(m.value()));
}
Result<std::unique_ptr<model::Executor>> load_cuda(const std::string& ckpt, bool tc) {
  CudaLoadOptions lo;
  lo.run = run_for(tc);
  return load_cuda(ckpt, lo);
}
Result<std::unique_ptr<model::Executor>> make_cuda(const std::string& ckpt) { return load_cuda(ckpt, false); }
Result<std::unique_ptr<model::Executor>> make_cuda_tc(const std::string& ckpt) { return load_cuda(ckpt, true); }

Result<std::unique_ptr<model::Executor>> make_cpu(const std::string& ckpt) {
  auto m = cpu::CpuModel::load(ckpt);
  if (!m.ok()) return m.status();
  return std::unique_ptr<model::Executor>(std::move(m.value()));
}

// The fixture check of the executors `make` loads, with the CPU reference run in lockstep.
Result<engine::FixtureReport> check_vs_cpu(const std::string& dir, const ExecutorFactory& make, int64_t chunk,
                                           bool bounded_replay = false) {
  engine::FixtureCheckOptions opt;
  opt.make_reference = make_cpu;
  opt.chunk = chunk;
  opt.bounded_replay = bounded_replay;
  return engine::check_fixture(dir, make, opt);
}

class FixtureParity : public test_util::FixtureTest {};

// The lookup, wave and prefetch counters of every tiered executor a fixture check made, summed.
ExpertSlotStats summed_stats(const std::vector<std::shared_ptr<DevExpertSlots>>& tiers) {
  ExpertSlotStats st;
  for (const auto& t : tiers) {
    const ExpertSlotStats x = t->stats();
    st.hits += x.hits;
    st.misses += x.misses;
    st.bypassed += x.bypassed;
    st.waves += x.waves;
    st.calls += x.calls;
    st.prefetched += x.prefetched;
    st.prefetch_used += x.prefetch_used;
    st.predicted += x.predicted;
    st.predict_used += x.predict_used;
  }
  return st;
}

// Greedy ids, logits rows, tap layers and draft rows all equal to the reference executor's, bit for bit.
void expect_bitwise(const engine::ReferenceComparison& c) {
  EXPECT_EQ(c.ids_same, c.rows) << "greedy ids differ from the reference";
  EXPECT_EQ(c.rows_bitwise, c.rows) << "max |dlogit| " << c.max_dlogit;
  EXPECT_EQ(c.tap_layers_bitwise, c.tap_layers) << "max tap |d| " << c.tap_max;
  EXPECT_EQ(c.draft_rows_bitwise, c.draft_rows) << "draft max |dlogit| " << c.draft_max_dlogit;
}

TEST_P(FixtureParity, CudaMatchesCpuBitForBit) {
  auto rep = check_vs_cpu(dir, make_cuda, 0);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  std::printf("%s\n%s\n", rep->reference.line().c_str(), rep->summary_line().c_str());
  const engine::ReferenceComparison& c = rep->reference;
  expect_bitwise(c);
  EXPECT_EQ(c.draft_ids_same, c.draft_ids_total);
  EXPECT_TRUE(rep->pass) << "the fixture gates (CLARIFICATIONS): " << rep->summary_line();
}

// SWA bounded replay ([approx-approved], spec/11 §8.4) on both executors: the prompt rows below
// the replay start leave at the decoder; the CUDA step advances its row buffers past them. Same
// bits as the CPU's replay, one shot and in chunks of 7 (rows of a later chunk all stay).
TEST_P(FixtureParity, BoundedReplayMatchesCpu) {
  for (int64_t chunk : {int64_t(0), int64_t(7)}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    auto rep = check_vs_cpu(dir, make_cuda, chunk, /*bounded_replay=*/true);
    ASSERT_TRUE(rep.ok()) << rep.status().to_string();
    std::printf("[ tc ] %s bounded replay, chunk %lld: %s\n", GetParam(), (long long)chunk, rep->reference.line().c_str());
    expect_bitwise(rep->reference);
  }
}

// Tensor-core prefill (decode rows stay exact): not bit-identical by design. Written-down
// tolerance: the same greedy ids as the CPU on every teacher-forced row and max |dlogit| <= 1e-3
// (measured on the H200: see docs/numerics.md). These fixtures are chaotic (one flipped indexer
// choice moves logits by O(1)), so this also shows no selection flipped.
TEST_P(FixtureParity, TensorCorePrefillNearCpu) {
  for (int64_t chunk : {int64_t(0), int64_t(7)}) {
    auto rep = check_vs_cpu(dir, make_cuda_tc, chunk);
    ASSERT_TRUE(rep.ok()) << rep.status().to_string();
    std::printf("[ tc ] %s chunk %lld: %s\n", GetParam(), (long long)chunk, rep->reference.line().c_str());
    const engine::ReferenceComparison& c = rep->reference;
    EXPECT_EQ(c.ids_same, c.rows) << "greedy ids differ from the CPU executor";
    EXPECT_LE(c.max_dlogit, 1e-3);
    EXPECT_EQ(c.draft_ids_same, c.draft_ids_total);
  }
}

// Routed experts through HBM slots (expert_slots.h): the tiny models have 4 experts and 2 per
// row, so 2 slots force misses on most calls and several waves in every prefill step; 3 slots
// mostly one wave. The bytes are copied, never changed: the exact path stays bit-identical to
// the CPU, and the tensor-core path to its all-resident self.
TEST_P(FixtureParity, ExpertSlotsBitForBit) {
  struct Case {
    int slots, staging;
  };
  for (bool tc : {false, true}) {
    for (const Case k : {Case{2, 0}, Case{3, 0}, Case{2, 2}}) {
      const int slots = k.slots;
      std::vector<std::shared_ptr<DevExpertSlots>> tiers;
      auto make_tiered = [&](const std::string& ckpt) -> Result<std::unique_ptr<model::Executor>> {
        CudaLoadOptions lo;
        lo.expert_slots = slots;
        lo.expert_staging = k.staging;  // 2: LFU admission, cold misses staged
        lo.run = run_for(tc);           // as make_cuda_tc, the reference of the tc case
        auto m = CudaExecutor::load(ckpt, {}, lo);
        if (!m.ok()) return m.status();
        if (auto t = m.value()->expert_slots()) tiers.push_back(t);
        return std::unique_ptr<model::Executor>(std::move(m.value()));
      };
      engine::FixtureCheckOptions opt;
      opt.make_reference = tc ? make_cuda_tc : make_cpu;  // tc: the all-resident tensor-core executor
      opt.chunk = 7;
      auto rep = engine::check_fixture(dir, make_tiered, opt);
      ASSERT_TRUE(rep.ok()) << rep.status().to_string();
      ASSERT_FALSE(tiers.empty()) << "the executor has no expert slots";
      const ExpertSlotStats st = summed_stats(tiers);
      std::printf("[ tc ] %s expert slots %d + %d staging (%s): %llu hits %llu misses (%llu staged), %llu waves / %llu calls: %s\n",
                  GetParam(), slots, k.staging,
                  tc ? "tensor-core prefill vs resident" : "exact vs cpu", (unsigned long long)st.hits, (unsigned long long)st.misses,
                  (unsigned long long)st.bypassed,
                  (unsigned long long)st.waves, (unsigned long long)st.calls, rep->reference.line().c_str());
      const engine::ReferenceComparison& c = rep->reference;
      EXPECT_GT(st.misses, 0u);
      if (k.staging == 0 && slots == 2) EXPECT_GT(st.waves, st.calls) << "7-row prefill steps route to more than 2 experts";
      if (k.staging > 0) EXPECT_GT(st.bypassed, 0u) << "no miss was staged";
      expect_bitwise(c);
    }
  }
}

// The host's experts (cpu::host_expert_compute) reporting a rate of 1.5 copies an expert, so
// that the split (DevExpertSlots::take_host) sends some misses of a call to the host and copies
// the others.
class SlowerHostExperts final : public model::HostExpertCompute {
 public:
  void run(const std::vector<model::HostExpertJob>& jobs, float limit) const override { real_->run(jobs, limit); }
  double ms_per_expert(int64_t D, int64_t I) const override { return 1.5 * double(I * D) * (1.5 + 3.0 / 32) / 50e9 * 1e3; }

 private:
  std::shared_ptr<const model::HostExpertCompute> real_ = cpu::host_expert_compute();
};

// A check_fixture factory of exact-class CUDA executors with 2 HBM expert slots per layer, the
// rest of the load options set by `set`; each executor's slots are kept in `tiers` (its stats).
std::function<Result<std::unique_ptr<model::Executor>>(const std::string&)> two_slot_executors(std::vector<std::shared_ptr<DevExpertSlots>>& tiers,
                                                                                             std::function<void(CudaLoadOptions&)> set) {
  return [&tiers, set](const std::string& ckpt) -> Result<std::unique_ptr<model::Executor>> {
    CudaLoadOptions lo;
    lo.expert_slots = 2;
    lo.run = run_for(false);
    set(lo);
    auto m = CudaExecutor::load(ckpt, {}, lo);
    if (!m.ok()) return m.status();
    if (auto t = m.value()->expert_slots()) tiers.push_back(t);
    return std::unique_ptr<model::Executor>(std::move(m.value()));
  };
}

// check_fixture of `dir` in 7-row chunks through two_slot_executors(tiers, set), against the CPU.
Result<engine::FixtureReport> two_slots_against_cpu(const std::string& dir, std::vector<std::shared_ptr<DevExpertSlots>>& tiers,
                                                    std::function<void(CudaLoadOptions&)> set) {
  engine::FixtureCheckOptions opt;
  opt.make_reference = make_cpu;
  opt.chunk = 7;
  auto rep = engine::check_fixture(dir, two_slot_executors(tiers, std::move(set)), opt);
  if (rep.ok() && tiers.empty()) return FB_ERROR(kInternal) << "the executor has no expert slots";
  return rep;
}

// Cold experts computed on the host CPU (CudaRunOptions::host_compute, issue 22): in the exact
// class the host runs the CPU reference's expert, so the logits, taps and drafts stay equal to the
// CPU's bit for bit, with every miss on the host (2) and with the misses split between the host
// and copies (1), in 7-row prefill chunks (rows sharing host experts) and decode steps, with and
// without staging entries. Each case must actually compute misses on the host, and the split
// must also copy some.
TEST_P(FixtureParity, HostComputedExpertsBitForBit) {
  struct Case {
    int mode, staging;
  };
  for (const Case k : {Case{2, 0}, Case{1, 0}, Case{1, 2}}) {
    std::vector<std::shared_ptr<DevExpertSlots>> tiers;
    auto rep = two_slots_against_cpu(dir, tiers, [&](CudaLoadOptions& lo) {
      lo.expert_staging = k.staging;
      lo.run.host_compute = k.mode;
      lo.host_compute = std::make_shared<SlowerHostExperts>();
    });
    ASSERT_TRUE(rep.ok()) << rep.status().to_string();
    uint64_t host = 0, pairs = 0, copied = 0, misses = 0;
    for (const auto& t : tiers) {
      host += t->stats().host_experts;
      pairs += t->stats().host_pairs;
      copied += t->stats().copied_bytes;
      misses += t->stats().misses;
    }
    std::printf("[ tc ] %s host compute %d, staging %d: %llu of %llu misses on the host (%llu pairs), %.1f MB copied: %s\n", GetParam(), k.mode,
                k.staging, (unsigned long long)host, (unsigned long long)misses, (unsigned long long)pairs, double(copied) / 1e6,
                rep->reference.line().c_str());
    EXPECT_GT(host, 0u) << "no miss was computed on the host";
    if (k.mode == 2) {
      EXPECT_EQ(host, misses) << "mode 2 computes every miss on the host";
      EXPECT_GT(pairs, host) << "no host expert served several rows";
    } else {
      EXPECT_LT(host, misses) << "the split copied no miss";
    }
    expect_bitwise(rep->reference);
  }
}

// Next-layer prediction (CudaRunOptions::expert_predict, issue 22): each tiered layer's call also
// routes its input through the next tiered layer's gate and copies the guessed experts into that
// layer's slots ahead of its call. Only which slot holds which bytes, and when, changes, so the
// exact class stays equal to the CPU bit for bit: in 7-row chunks and decode steps, with LFU
// admission's staging entries, and with cold experts on the host (the guesses' copies are issued
// before the host's work). Guesses must be copied, and some used.
TEST_P(FixtureParity, ExpertPredictBitForBit) {
  struct Case {
    int staging, host_compute;
  };
  for (const Case k : {Case{0, 0}, Case{2, 0}, Case{0, 1}}) {
    std::vector<std::shared_ptr<DevExpertSlots>> tiers;
    auto rep = two_slots_against_cpu(dir, tiers, [&](CudaLoadOptions& lo) {
      lo.expert_staging = k.staging;
      lo.run.expert_predict = true;
      lo.run.host_compute = k.host_compute;
      if (k.host_compute) lo.host_compute = std::make_shared<SlowerHostExperts>();
    });
    ASSERT_TRUE(rep.ok()) << rep.status().to_string();
    const ExpertSlotStats st = summed_stats(tiers);
    std::printf("[ tc ] %s expert predict (staging %d, host compute %d): %llu copied ahead, %llu used, %llu hits %llu misses: %s\n", GetParam(),
                k.staging, k.host_compute, (unsigned long long)st.predicted, (unsigned long long)st.predict_used, (unsigned long long)st.hits,
                (unsigned long long)st.misses, rep->reference.line().c_str());
    EXPECT_GT(st.predicted, 0u) << "no guess was copied ahead";
    EXPECT_GT(st.predict_used, 0u) << "no guess was used";
    EXPECT_LE(st.predict_used, st.predicted);
    expect_bitwise(rep->reference);
  }
}

// Cold prefill streaming (CudaRunOptions::expert_prefetch, issue 26): every prefill step copies
// the next tiered layer's non-resident experts into a staging buffer while the current layer
// runs, and reads them from there. Only copy timing and the buffer an expert is read from change,
// so the logits, taps and drafts equal the same tiered executor's with the option off, bit for
// bit, on both prefill paths (exact GEMVs, tensor cores), one shot and in 7-row chunks; with 2
// slots of the tiny models' 4 experts every prefill step must actually use staged experts. With
// one staging entry the other non-resident expert takes a slot in a second wave, whose copy on
// the tensor-core path waits only for its slot's last reader (DevExpertSlots::take per_slot).
TEST_P(FixtureParity, ExpertPrefetchBitForBit) {
  for (bool tc : {false, true})
    for (int entries : {0, 1})
      for (int64_t chunk : {int64_t(0), int64_t(7)}) {
        std::vector<std::shared_ptr<DevExpertSlots>> tiers;
        auto make = [&](bool prefetch) {
          return [&, prefetch](const std::string& ckpt) -> Result<std::unique_ptr<model::Executor>> {
            CudaLoadOptions lo;
            lo.expert_slots = 2;
            lo.run = run_for(tc);
            lo.run.expert_prefetch = prefetch;
            lo.run.expert_prefetch_min_rows = 1;
            lo.run.expert_prefetch_entries = entries;  // 0: the layer's experts beyond its slots (2)
            auto m = CudaExecutor::load(ckpt, {}, lo);
            if (!m.ok()) return m.status();
            if (prefetch)
              if (auto t = m.value()->expert_slots()) tiers.push_back(t);
            return std::unique_ptr<model::Executor>(std::move(m.value()));
          };
        };
        engine::FixtureCheckOptions opt;
        opt.make_reference = make(false);
        opt.chunk = chunk;
        auto rep = engine::check_fixture(dir, make(true), opt);
        ASSERT_TRUE(rep.ok()) << rep.status().to_string();
        ASSERT_FALSE(tiers.empty()) << "the executor has no expert slots";
        const ExpertSlotStats st = summed_stats(tiers);
        std::printf("[ tc ] %s expert prefetch (%s, %d staging entries, chunk %lld): %llu prefetched, %llu used, %llu slot misses: %s\n",
                    GetParam(), tc ? "tensor-core prefill" : "exact", entries == 0 ? 2 : entries, (long long)chunk, (unsigned long long)st.prefetched,
                    (unsigned long long)st.prefetch_used, (unsigned long long)st.misses, rep->reference.line().c_str());
        const engine::ReferenceComparison& c = rep->reference;
        EXPECT_GT(st.prefetched, 0u) << "no expert was prefetched";
        EXPECT_GT(st.prefetch_used, 0u) << "no MoE call read a staged expert";
        if (entries == 1) EXPECT_GT(st.misses, 0u) << "one staging entry leaves a miss for the slot waves";
        expect_bitwise(c);
      }
}

// The real model's configuration on one GPU: Engram tables gathered on the host and routed
// experts through HBM slots. Rows and experts are copied unchanged, so the exact path stays
// bit-identical to the CPU.
TEST_P(FixtureParity, EngramOnHostAndExpertSlotsBitForBit) {
  for (int slots : {0, 2}) {
    CudaLoadOptions lo;
    lo.engram = EngramPlace::kHost;
    lo.expert_slots = slots;
    lo.run = run_for(false);
    for (int64_t chunk : {int64_t(0), int64_t(7)}) {
      auto rep = check_vs_cpu(dir, [&](const std::string& ckpt) { return load_cuda(ckpt, lo); }, chunk);
      ASSERT_TRUE(rep.ok()) << rep.status().to_string();
      std::printf("[ tc ] %s engram on host, %d expert slots, chunk %lld: %s\n", GetParam(), slots, (long long)chunk,
                  rep->reference.line().c_str());
      const engine::ReferenceComparison& c = rep->reference;
      expect_bitwise(c);
    }
  }
}

// Engram tables on the drives (issue 22): each step's rows read from the checkpoint's shards with
// O_DIRECT through a small row cache (storage::EngramRowCache; evictions and drive reads), staged
// ahead by the tasks and uploaded: the same bytes as the mapped tables, so the exact path stays
// bit-identical to the CPU.
TEST_P(FixtureParity, EngramRowsFromTheDrivesBitForBit) {
  std::vector<std::shared_ptr<storage::EngramRowCache>> caches;
  CudaLoadOptions lo;
  lo.run = run_for(false);
  const auto make = [&](const std::string& ckpt) -> Result<std::unique_ptr<model::Executor>> {
    auto snap = loader::Snapshot::open(ckpt);
    if (!snap.ok()) return snap.status();
    storage::EngramCacheOptions eo;
    eo.capacity_bytes = 2000;
    auto cache = storage::engram_cache_for(**snap, {}, eo);
    if (!cache.ok()) return cache.status();
    caches.push_back(cache.value());
    CudaLoadOptions l = lo;
    l.engram_rows = cache.value();
    return load_cuda(ckpt, l);
  };
  for (int64_t chunk : {int64_t(0), int64_t(7)}) {
    caches.clear();
    auto rep = check_vs_cpu(dir, make, chunk);
    ASSERT_TRUE(rep.ok()) << rep.status().to_string();
    ASSERT_FALSE(caches.empty());
    const storage::EngramCacheStats st = caches.back()->stats();
    std::printf("[ tc ] %s Engram rows from the drives, chunk %lld: %s; %s\n", GetParam(), (long long)chunk, rep->reference.line().c_str(),
                st.to_string().c_str());
    EXPECT_GT(st.drive_rows, 0u);
    EXPECT_GT(st.evictions, 0u);
    expect_bitwise(rep->reference);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureParity, ::testing::Values("tiny-s0", "tiny-s1-long"));

// The fixture gates on both numerics classes (issue 18): every public fixture PASSes through the
// CUDA executor in the exact class and in the fast class (the default), one shot and in 7-row
// chunks; the layer gate runs on the fixtures with inject/, the vision gate on tiny-vision.
class FixtureGates : public test_util::FixtureTest {};

TEST_P(FixtureGates, ExactAndFastPass) {
  for (Numerics nm : {Numerics::kExact, Numerics::kFast})
    for (int64_t chunk : {int64_t(0), int64_t(7)}) {
      CudaLoadOptions lo;
      lo.run.numerics = nm;
      engine::FixtureCheckOptions opt;
      opt.chunk = chunk;
      auto rep = engine::check_fixture(dir, [&](const std::string& ckpt) { return load_cuda(ckpt, lo); }, opt);
      ASSERT_TRUE(rep.ok()) << rep.status().to_string();
      std::printf("[ tc ] %s %s chunk %lld: %s\n", GetParam(), numerics_name(nm), (long long)chunk, rep->summary_line().c_str());
      EXPECT_TRUE(rep->pass) << numerics_name(nm) << " chunk " << chunk << ": " << rep->summary_line();
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureGates, ::testing::Values("tiny-s0", "tiny-s1-long", "tiny-smooth", "tiny-vision"));

model::Row make_row(int s, int64_t pos, int32_t tok, model::RowKind kind, int64_t prefill_end, bool logits) {
  model::Row r;
  r.session = s;
  r.pos = pos;
  r.token = tok;
  r.kind = kind;
  r.prefill_end = prefill_end;
  r.want_logits = logits;
  return r;
}

// Ragged multi-session steps and a rollback: two sessions' prefill rows in one step, then decode
// and verify-style rows of both sessions together, then a rejected row rolled back and re-run.
TEST(FixtureParity, MultiSessionStepsAndRollback) {
  std::string why;
  const std::string dir = runnable_fixture("tiny-s1-long", &why);
  if (dir.empty()) GTEST_SKIP() << why;
  auto cu = make_cuda(dir + "/checkpoint");
  auto cp = make_cpu(dir + "/checkpoint");
  ASSERT_TRUE(cu.ok() && cp.ok());
  model::Executor* ex[2] = {cu.value().get(), cp.value().get()};
  std::unique_ptr<model::SessionState> s[2][2];
  std::vector<model::SessionState*> ss[2];
  for (int e = 0; e < 2; ++e) {
    for (int i = 0; i < 2; ++i) s[e][i] = ex[e]->new_session();
    ss[e] = {s[e][0].get(), s[e][1].get()};
  }
  const int V = 512;
  auto tok = [&](int64_t i) { return int32_t((i * 37 + 11) % V); };
  using model::RowKind;
  std::vector<model::Step> steps(4);
  for (int64_t p = 0; p < 20; ++p) steps[0].rows.push_back(make_row(0, p, tok(p), RowKind::kPrefill, 20, p == 19));
  for (int64_t p = 0; p < 45; ++p) steps[0].rows.push_back(make_row(1, p, tok(p + 3), RowKind::kPrefill, 45, p >= 43));
  steps[1].rows = {make_row(0, 20, tok(20), RowKind::kDecode, 0, true)};
  for (int64_t p = 45; p < 50; ++p) steps[1].rows.push_back(make_row(1, p, tok(p), RowKind::kDecode, 0, true));
  // after rolling session 1 back to 47 (three rejected rows, the even 48 among them, so the
  // ratio-2 tail of 46 must survive for the re-run of the odd 47): a different token at 47
  steps[2].rows = {make_row(0, 21, tok(21), RowKind::kDecode, 0, true), make_row(1, 47, tok(99), RowKind::kDecode, 0, true)};
  steps[3].rows = {make_row(1, 48, tok(100), RowKind::kDecode, 0, true), make_row(0, 22, tok(22), RowKind::kDecode, 0, true)};
  // step 3 lists session 1 first: rows of a session are contiguous, sessions in any order
  for (size_t k = 0; k < steps.size(); ++k) {
    if (k == 2)
      for (int e = 0; e < 2; ++e) ASSERT_TRUE(s[e][1]->rollback(47).ok());
    auto a = ex[0]->forward(steps[k], ss[0]);
    auto b = ex[1]->forward(steps[k], ss[1]);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    ASSERT_EQ(a->logits.size(), b->logits.size());
    EXPECT_EQ(a->logit_rows, b->logit_rows);
    EXPECT_EQ(std::memcmp(a->logits.data(), b->logits.data(), a->logits.size() * sizeof(float)), 0) << "step " << k << " logits differ";
    EXPECT_EQ(a->taps, b->taps) << "step " << k << " DSpark tap rows differ";
  }
}

// ---- the memory ledger by tier (issue 24, CudaExecutor::memory_by_tier) ----------------------

// Bytes of the snapshot's tensors whose names pass `keep`.
uint64_t tensor_bytes(const loader::Snapshot& snap, const std::function<bool(const std::string&)>& keep) {
  uint64_t n = 0;
  for (const std::string& name : snap.tensor_names())
    if (keep(name)) n += snap.get(name).nbytes();
  return n;
}
bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
bool has_part(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// What a session's device caches must hold, from the configuration and the compressed entries'
// capacity the session reports: window rings of window + headroom slots per backbone layer and of
// window slots per draft stage (head_dim e4m3 codes + head_dim/32 scales a row), the ratio-2
// tails, and capacity x (KV + index key) bytes per KV-source layer.
uint64_t expected_session_device_bytes(const model::Config& c, const CudaSession& s) {
  const uint64_t row = uint64_t(c.head_dim + c.head_dim / 32);
  uint64_t n = uint64_t(c.n_layers) * uint64_t(c.window_size + model::kRingHeadroom) * row + uint64_t(c.n_mtp_layers) * uint64_t(c.window_size) * row;
  for (int l = 0; l < c.n_layers; ++l) {
    const model::CompGeometry g = model::comp_geometry(c, l);
    n += uint64_t(g.tail_floats) * sizeof(float);
    n += uint64_t(s.comp[size_t(l)].capacity) * uint64_t(g.kv_bytes + g.key_bytes);
  }
  return n;
}

// Prompt rows [0, 16) of one session and a decode row at 16.
Status run_prompt_and_decode(model::Executor& ex, model::SessionState& s) {
  model::Step pre;
  for (int64_t p = 0; p < 16; ++p) pre.rows.push_back(model::prefill_row(p, int32_t((p * 37 + 11) % 512), 16));
  FB_RETURN_IF_ERROR(ex.forward(pre, {&s}).status());
  model::Step dec;
  dec.rows = {make_row(0, 16, 99, model::RowKind::kDecode, 0, true)};
  return ex.forward(dec, {&s}).status();
}

// HBM and host bytes of an executor with every expert resident, both numerics classes, checked
// against sizes counted here: weights = the snapshot's tensors (less the FP8 wo_a, which only the
// fast class keeps), weight copies = the BF16 wo_a, nothing in the expert tier, nothing in scratch
// before a step; sessions counted while they live (device bytes from the first step on), the step
// arena and the tensor-core scratch leaving the ledger when release_step_memory frees them, the
// page-locked upload staging on the host.
TEST(CudaMemoryLedger, ResidentWeightsSessionsScratch) {
  std::string why;
  const std::string dir = runnable_fixture("tiny-s0", &why);
  if (dir.empty()) GTEST_SKIP() << why;
  for (Numerics nm : {Numerics::kFast, Numerics::kExact}) {
    SCOPED_TRACE(numerics_name(nm));
    CudaLoadOptions lo;
    lo.run.numerics = nm;
    lo.run.tc_prefill_min_rows = 1;  // the fast class's 16-row prompt step runs on tensor cores (TcGemm scratch)
    auto loaded = CudaExecutor::load(dir + "/checkpoint", {}, lo);
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    CudaExecutor& ex = **loaded;
    const model::Config& c = ex.config();
    const loader::Snapshot& snap = ex.snapshot();
    const bool fast = nm == Numerics::kFast;
    const uint64_t all = tensor_bytes(snap, [](const std::string&) { return true; });
    const uint64_t wo_a = tensor_bytes(snap, [](const std::string& n) { return has_part(n, ".attn.wo_a."); });
    const uint64_t wo_a_bf16 = 2 * tensor_bytes(snap, [](const std::string& n) { return ends_with(n, ".attn.wo_a.weight"); });  // e4m3 -> bf16
    ASSERT_GT(wo_a, 0u);
    uint64_t host_scratch = 2 * uint64_t(c.rope_head_dim / 2) * sizeof(float);  // plain and YaRN frequencies
    const uint64_t per_table = 2 * uint64_t(c.engram_max_ngram - 1) * uint64_t(c.engram_n_heads) + uint64_t(c.engram_max_ngram);
    host_scratch += uint64_t(c.engram_layer_ids.size()) * per_table * sizeof(int64_t);  // primes, offsets, multipliers

    const model::MemoryByTier m0 = ex.stats().memory;
    ASSERT_TRUE(m0.has_hbm);
    ASSERT_TRUE(m0.has_host);
    EXPECT_FALSE(m0.has_drive);
    EXPECT_EQ(m0.hbm.weights, fast ? all : all - wo_a);
    EXPECT_EQ(m0.hbm.weight_copies, wo_a_bf16);
    EXPECT_EQ(m0.hbm.experts, 0u);
    EXPECT_EQ(m0.hbm.scratch, 0u) << "no step has run: no arena, RoPE table or GEMM scratch yet";
    EXPECT_EQ(m0.hbm.n_sessions, 0);
    EXPECT_EQ(m0.hbm.sessions, 0u);
    EXPECT_EQ(m0.host.weights, 0u) << "every weight is in HBM";
    EXPECT_EQ(m0.host.scratch, host_scratch);
    EXPECT_EQ(m0.host.experts, 0u);

    // Two sessions: one never used (its device caches are made by its first step), one after a
    // prompt and a decode step.
    auto fresh = ex.new_session();
    const model::MemoryByTier m1 = ex.stats().memory;
    EXPECT_EQ(m1.hbm.n_sessions, 1);
    EXPECT_EQ(m1.host.n_sessions, 1);
    EXPECT_EQ(m1.hbm.sessions, 0u);
    auto used = ex.new_session();
    const Status ran = run_prompt_and_decode(ex, *used);
    ASSERT_TRUE(ran.ok()) << ran.to_string();
    const auto& us = static_cast<const CudaSession&>(*used);
    const auto& fs = static_cast<const CudaSession&>(*fresh);
    int64_t comp_capacity = 0;
    for (const DevCompressed& cc : us.comp) comp_capacity += cc.capacity;
    EXPECT_GT(comp_capacity, 0) << "17 positions make compressed entries in the KV-source layers";
    const uint64_t ws = ex.workspace_bytes(), tc = ex.tc_scratch_bytes();
    EXPECT_GT(ws, 0u);
    if (fast) {
      EXPECT_GT(tc, 0u) << "the prompt step ran on tensor cores";
    }
    const model::MemoryByTier m2 = ex.stats().memory;
    EXPECT_EQ(m2.hbm.n_sessions, 2);
    EXPECT_EQ(m2.host.n_sessions, 2);
    EXPECT_EQ(m2.hbm.sessions, expected_session_device_bytes(c, us));
    EXPECT_EQ(us.device_bytes(), expected_session_device_bytes(c, us));
    EXPECT_EQ(fs.device_bytes(), 0u);
    EXPECT_GE(m2.host.sessions, 17 * (sizeof(int32_t) + 1)) << "token history and image flags of 17 positions";
    EXPECT_EQ(m2.host.sessions, us.host_bytes() + fs.host_bytes());
    EXPECT_EQ(m2.hbm.weights, m0.hbm.weights);
    EXPECT_EQ(m2.hbm.weight_copies, m0.hbm.weight_copies);
    // Scratch: at least the arena and both RoPE tables (cos and sin of 17 positions); the host's
    // page-locked staging of the steps' uploads (at least 1 MiB once made).
    const uint64_t rope = 2 * 2 * 17 * uint64_t(c.rope_head_dim / 2) * sizeof(float);
    EXPECT_GE(m2.hbm.scratch, ws + tc + rope);
    EXPECT_GE(m2.host.scratch, m0.host.scratch + (uint64_t(1) << 20));
    // Freed between steps: the arena and the GEMM scratch leave the ledger, byte for byte.
    ex.release_step_memory();
    EXPECT_EQ(ex.workspace_bytes(), 0u);
    const model::MemoryByTier m3 = ex.stats().memory;
    EXPECT_EQ(m2.hbm.scratch - m3.hbm.scratch, ws + tc);
    // A session leaves the ledger when it is destroyed.
    used.reset();
    const model::MemoryByTier m4 = ex.stats().memory;
    EXPECT_EQ(m4.hbm.n_sessions, 1);
    EXPECT_EQ(m4.host.n_sessions, 1);
    EXPECT_EQ(m4.hbm.sessions, 0u);
    EXPECT_EQ(m4.host.sessions, fs.host_bytes());
    fresh.reset();
    EXPECT_EQ(ex.stats().memory.hbm.n_sessions, 0);
  }
}

// Routed experts through 2 HBM slots per layer (the tiny models have 4) and the Engram tables on
// the host: HBM weights lose every tiered layer's experts and the tables, the expert tier holds
// 2 x one expert's bytes per tiered layer, and the host's weights are what the steps read from the
// mapping (the tables and the tiered experts, copied from the snapshot on a miss); no drives.
// Then the same slots over the host tiers (engine::make_executor): the host's expert bytes are
// the tiers' buffers and the drives' bytes the tiers' reads.
TEST(CudaMemoryLedger, ExpertSlotsEngramOnHostAndDrives) {
  std::string why;
  const std::string dir = runnable_fixture("tiny-s0", &why);
  if (dir.empty()) GTEST_SKIP() << why;
  const std::string ckpt = dir + "/checkpoint";
  {
    CudaLoadOptions lo;
    lo.expert_slots = 2;
    lo.engram = EngramPlace::kHost;
    auto loaded = CudaExecutor::load(ckpt, {}, lo);
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    CudaExecutor& ex = **loaded;
    const model::Config& c = ex.config();
    const loader::Snapshot& snap = ex.snapshot();
    ASSERT_NE(ex.expert_slots(), nullptr);
    uint64_t tiered_experts = 0, tier_bytes = 0;
    for (int l = 0; l < c.n_total_layers(); ++l) {
      if (ex.expert_slots()->slots(l) == 0) continue;
      const std::string p = model::layer_prefix(c, l) + "ffn.experts.";
      tiered_experts += tensor_bytes(snap, [&](const std::string& n) { return n.rfind(p, 0) == 0; });
      tier_bytes += 2 * tensor_bytes(snap, [&](const std::string& n) { return n.rfind(p + "0.", 0) == 0; });  // 2 slots of expert 0's size
    }
    ASSERT_GT(tiered_experts, 0u);
    const uint64_t all = tensor_bytes(snap, [](const std::string&) { return true; });
    const uint64_t tables = tensor_bytes(snap, [](const std::string& n) { return has_part(n, ".engram.embed."); });
    ASSERT_GT(tables, 0u);
    const model::MemoryByTier m0 = ex.stats().memory;
    ASSERT_TRUE(m0.has_hbm && m0.has_host);
    EXPECT_FALSE(m0.has_drive) << "misses copy from the mapped snapshot";
    EXPECT_EQ(m0.hbm.weights, all - tiered_experts - tables);
    EXPECT_EQ(m0.hbm.experts, tier_bytes);
    EXPECT_EQ(m0.host.weights, tables + tiered_experts);
    EXPECT_EQ(m0.host.experts, 0u);
    auto s = ex.new_session();
    const Status ran = run_prompt_and_decode(ex, *s);
    ASSERT_TRUE(ran.ok()) << ran.to_string();
    const model::MemoryByTier m1 = ex.stats().memory;
    EXPECT_GT(ex.expert_slots()->stats().misses, 0u);
    EXPECT_EQ(m1.hbm.experts, tier_bytes) << "the slots are allocated once";
    EXPECT_EQ(m1.host.weights, m0.host.weights);
    EXPECT_EQ(m1.hbm.n_sessions, 1);
  }
  {
    engine::ExecutorOptions o;
    o.expert_slots = 2;
    o.host_experts = 4;
    o.expert_prefetch = false;  // no read in flight between the two counts compared below
    std::shared_ptr<storage::TieredExperts> tiers;
    auto made = engine::make_executor("cuda", ckpt, o, &tiers);
    ASSERT_TRUE(made.ok()) << made.status().to_string();
    ASSERT_NE(tiers, nullptr);
    model::Executor& ex = **made;
    // (The slots read one expert per tiered layer through the tiers at load for their layout.)
    const model::MemoryByTier m0 = ex.stats().memory;
    EXPECT_TRUE(m0.has_drive);
    EXPECT_EQ(m0.drive.expert_bytes_read, tiers->stats().drive_bytes);
    EXPECT_EQ(m0.host.weights, 0u) << "the tiers read the experts themselves; the tables are in HBM";
    auto s = ex.new_session();
    const Status ran = run_prompt_and_decode(ex, *s);
    ASSERT_TRUE(ran.ok()) << ran.to_string();
    const model::MemoryByTier m1 = ex.stats().memory;
    EXPECT_GT(m1.host.experts, 0u) << "host cache records were allocated on use";
    EXPECT_EQ(m1.host.experts, tiers->host_bytes());
    EXPECT_GT(m1.drive.expert_bytes_read, m0.drive.expert_bytes_read) << "the step's misses were read from the drives";
    EXPECT_EQ(m1.drive.expert_bytes_read, tiers->stats().drive_bytes);
  }
}

// What the dashboard's step time by op family and Engram card read from the CUDA executor (issue
// 24): with profiling on, a prompt step and a decode step file device times under every family
// the tiny model runs (each with calls and time > 0, less in all than the host's wall clock of the
// two steps, which waits for their logits); off, no op times. Engram rows read in place with the
// tables in HBM; with them on the host every row is fetched there, hidden or exposed with the
// staging's tasks (the profiled runs), every one exposed without them (engram_prefetch_tasks 0).
TEST(CudaExecutorStats, OpTimesByFamilyAndEngramRows) {
  std::string why;
  const std::string dir = runnable_fixture("tiny-s0", &why);
  if (dir.empty()) GTEST_SKIP() << why;
  for (EngramPlace place : {EngramPlace::kHbm, EngramPlace::kHost}) {
    for (bool profile : {true, false}) {
      SCOPED_TRACE(std::string(place == EngramPlace::kHbm ? "tables in HBM" : "tables on the host") + (profile ? ", profiled" : ""));
      CudaLoadOptions lo;
      lo.engram = place;
      auto loaded = CudaExecutor::load(dir + "/checkpoint", {}, lo);
      ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
      CudaExecutor& ex = **loaded;
      ex.set_profile(profile);
      CudaRunOptions ro = ex.run_options();
      ro.engram_prefetch_tasks = profile ? 4 : 0;
      ex.set_run_options(ro);
      auto s = ex.new_session();
      const auto t0 = std::chrono::steady_clock::now();
      const Status ran = run_prompt_and_decode(ex, *s);
      const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ASSERT_TRUE(ran.ok()) << ran.to_string();
      const model::ExecutorStats st = ex.stats();
      EXPECT_EQ(st.has_op_times, profile);
      if (profile) {
        EXPECT_EQ(st.ops.steps, 2u);
        using model::OpFamily;
        for (OpFamily f : {OpFamily::kEmbed, OpFamily::kEngram, OpFamily::kMhc, OpFamily::kAttnProj, OpFamily::kIndex, OpFamily::kAttention,
                           OpFamily::kMoe, OpFamily::kHead}) {
          EXPECT_GT(st.ops.calls[size_t(f)], 0u) << model::op_family_name(f);
          EXPECT_GT(st.ops.s[size_t(f)], 0.0) << model::op_family_name(f);
        }
        EXPECT_LT(st.ops.total_s(), wall_s);
      } else {
        EXPECT_EQ(st.ops.steps, 0u);
        EXPECT_EQ(st.ops.total_s(), 0.0);
      }
      ASSERT_TRUE(st.has_engram);
      const model::Config& c = ex.config();
      const uint64_t per_row = uint64_t(c.engram_layer_ids.size()) * uint64_t(c.engram_max_ngram - 1) * uint64_t(c.engram_n_heads);
      EXPECT_EQ(st.engram.rows, 17 * per_row) << "17 positions, every Engram layer, order and head";
      if (place == EngramPlace::kHbm) {
        EXPECT_EQ(st.engram.hidden, 0u);
        EXPECT_EQ(st.engram.exposed, 0u);
        EXPECT_EQ(st.engram.in_place(), st.engram.rows);
      } else {
        EXPECT_EQ(st.engram.in_place(), 0u) << "every row fetched on the host";
        EXPECT_EQ(st.engram.hidden + st.engram.exposed, st.engram.rows);
        if (ro.engram_prefetch_tasks == 0) {
          EXPECT_EQ(st.engram.hidden, 0u);
          EXPECT_GT(st.engram.exposed_s, 0.0);
        }
        std::printf("engram rows on the host, %d tasks: %llu hidden, %llu exposed (%.3f ms waited)\n", ro.engram_prefetch_tasks,
                    (unsigned long long)st.engram.hidden, (unsigned long long)st.engram.exposed, st.engram.exposed_s * 1e3);
      }
    }
  }
}

}  // namespace
}  // namespace fb::cuda
