#include "bench/drive_tier.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "bench/decode_bench.h"
#include "bench/tier_sweep.h"
#include "loader/bind.h"
#include "storage/record_file.h"
#include "storage/route_sim.h"

namespace fb::bench {

namespace {

double now_ms() { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count(); }


}  // namespace

Result<std::shared_ptr<storage::TieredExperts>> make_drive_tiers(const loader::Snapshot& snap, const std::vector<std::string>& dirs,
                                                                 int records, int64_t host_experts,
                                                                 std::function<void(void*, size_t)> on_alloc,
                                                                 std::function<void(void*, size_t)> on_free,
                                                                 std::vector<storage::ReaderFault> faults, int epochs_kept) {
  if (dirs.empty()) return FB_ERROR(kInvalidArgument) << "--expert-drives needs at least one directory";
  const model::Config& c = snap.config();
  const storage::ExpertLayout lay = FB_TRY(storage::expert_layout(snap));
  std::vector<int> n_experts;
  int first = -1;
  for (int l = 0; l < c.n_total_layers(); ++l) {
    n_experts.push_back(c.roles[size_t(l)].n_experts);
    if (first < 0 && n_experts.back() > 0) first = l;
  }
  loader::SnapshotExperts pool(snap);
  const int E = n_experts[size_t(first)];
  for (const std::string& d : dirs) {
    const double t0 = now_ms();
    FB_RETURN_IF_ERROR(storage::write_record_file(d + "/" + storage::kRecordFile, lay, records, [&](int r) { return pool.expert(first, r % E); }));
    std::fprintf(stderr, "bench: wrote %d expert records (%.2f GB) to %s/%s in %.1f s\n", records, double(records) * double(lay.stride_bytes) / 1e9,
                 d.c_str(), storage::kRecordFile, (now_ms() - t0) / 1e3);
  }
  storage::TieredOptions to;
  to.slots_per_layer = 1;  // unused with host views
  to.host_views = true;
  to.host_experts = host_experts;
  to.on_host_alloc = std::move(on_alloc);
  to.on_host_free = std::move(on_free);
  to.faults = std::move(faults);
  to.epochs_kept = epochs_kept;
  return storage::TieredExperts::create(storage::cyclic_locator(lay, n_experts, records, storage::kRecordFile), dirs, to);
}

Result<std::shared_ptr<storage::EngramRowCache>> make_engram_drive_cache(const loader::Snapshot& snap, const std::vector<std::string>& dirs,
                                                                         uint64_t cache_bytes) {
  if (dirs.empty()) return FB_ERROR(kInvalidArgument) << "--engram-drives needs at least one directory";
  const double t0 = now_ms();
  storage::EngramCacheOptions eo;
  eo.capacity_bytes = cache_bytes;
  auto c = storage::engram_store_from_memory(snap, dirs, eo);
  if (c.ok())
    std::fprintf(stderr, "bench: the synthetic Engram tables as an Engram store in %zu dir(s) (%s), ready in %.1f s\n", dirs.size(),
                 storage::kEngramStoreFile, (now_ms() - t0) / 1e3);
  return c;
}

Result<std::vector<DriveTierPoint>> run_drive_tier(cuda::CudaExecutor& ex, model::SessionState& s, SwitchExperts& src,
                                                   const DriveTierOptions& opt) {
  const model::Config& c = ex.config();
  std::shared_ptr<cuda::DevExpertSlots> slots = ex.expert_slots();
  if (!slots) return FB_ERROR(kInvalidArgument) << "the drive tier needs an executor with expert slots";
  int n_exp = 0;
  for (int l = 0; l < c.n_total_layers(); ++l)
    if (slots->slots(l) > 0) n_exp = c.roles[size_t(l)].n_experts;
  if (n_exp == 0) return FB_ERROR(kInvalidArgument) << "no layer has fewer slots than experts";
  auto draw = std::make_shared<storage::ZipfRouting>(c.n_total_layers(), n_exp, opt.seed);
  // Through PredictedRouting: with the prediction arm, the routing a guess was made for comes back
  // when its layer routes (otherwise every draw is fresh, as before).
  auto guess = std::make_shared<storage::PredictedRouting>(*draw, std::max(0.0, opt.predict_accuracy), opt.seed + 1);
  ex.set_route_override([guess](int layer, std::vector<int32_t>& ids, int64_t rows, int top_k) { guess->draw(layer, ids, rows, top_k); });
  const int arms = opt.predict_accuracy >= 0 ? 3 : 2;
  const cuda::CudaRunOptions run0 = ex.run_options();
  auto predict = [&](bool on) { use_predicted_routing(ex, run0, guess, on ? opt.predict_accuracy : -1); };
  std::string phase;
  int64_t done = 0;
  const int64_t total = int64_t(opt.pool_warm_steps) + arms * (int64_t(opt.drive_warm_steps) + opt.steps);
  const std::function<void()> tick = [&] {
    if (opt.progress) opt.progress(phase, ++done, total, "steps");
  };
  auto decode_steps = [&](int n, std::vector<double>* ms) { return run_decode_steps(ex, s, n, 1, ms, tick); };
  storage::TieredExperts& tiers = src.drives();
  std::vector<DriveTierPoint> out;
  Status st;
  for (double share : opt.skews) {
    DriveTierPoint p;
    p.top10_share = share;
    char name[64];
    std::snprintf(name, sizeof name, "bench drive tier top-10 share %.2f", share);
    phase = name;
    done = 0;
    if (opt.progress) opt.progress(phase, 0, total, "steps");
    draw->set_skew(share);
    src.use_drives(false);
    if (opt.replay_tokens > 0) {
      // The same routing law, the executor's own slot calls (no kernels), each slot miss looked up
      // in the host cache's policy as the drive tiers would: the caches' steady state in seconds.
      const double r0 = now_ms();
      std::vector<int32_t> ids;
      for (int t = 0; t < opt.replay_tokens && st.ok(); ++t)
        for (int l = 0; l < c.n_layers && st.ok(); ++l) {
          if (slots->slots(l) == 0) continue;
          const int k = c.roles[size_t(l)].n_active;  // the executor's top-k of the layer (what the route override gets)
          ids.resize(size_t(k));
          draw->draw(l, ids, 1, k);
          std::vector<int32_t> want(ids);
          std::sort(want.begin(), want.end());
          want.erase(std::unique(want.begin(), want.end()), want.end());
          Status host_st;
          st = slots->replay(l, std::move(want), [&](int32_t e) {
            if (host_st.ok()) host_st = tiers.replay_lookup(l, int(e));
          });
          if (st.ok()) st = host_st;
        }
      if (!st.ok()) break;
      auto copied = slots->load_replayed();
      if (!copied.ok()) {
        st = copied.status();
        break;
      }
      p.replayed_slot_copies = *copied;
      std::fprintf(stderr, "bench: drive tier top-10 share %.2f: %d decode tokens replayed in the caches (%lld slots loaded) in %.1f s\n", share,
                   opt.replay_tokens, (long long)*copied, (now_ms() - r0) / 1e3);
    }
    src.replay_host(true);
    st = decode_steps(opt.pool_warm_steps, nullptr);
    src.replay_host(false);
    if (!st.ok()) break;
    {
      const double f0 = now_ms();
      auto filled = tiers.fill_host(16);
      if (!filled.ok()) {
        st = filled.status();
        break;
      }
      p.host_fill_s = (now_ms() - f0) / 1e3;
      std::fprintf(stderr, "bench: drive tier top-10 share %.2f: host cache warmed: %lld records read from the drives in %.1f s, %lld hold an expert\n",
                   share, (long long)*filled, p.host_fill_s, (long long)tiers.host_records_filled());
    }
    src.use_drives(true);
    for (int arm = 0; arm < arms && st.ok(); ++arm) {
      tiers.set_prefetch(arm != 1);
      if (arm == 2) predict(true);
      st = decode_steps(opt.drive_warm_steps, nullptr);
      if (!st.ok()) break;
      if (arm == 0) p.host_filled = tiers.host_records_filled();
      slots->reset_stats();
      const storage::TierStats t0 = tiers.stats();
      std::vector<double> ms;
      const double w0 = now_ms();
      st = decode_steps(opt.steps, &ms);
      if (!st.ok()) break;
      const double wall_s = (now_ms() - w0) / 1e3;
      const storage::TierStats t1 = tiers.stats();
      const cuda::ExpertSlotStats d = slots->stats();
      std::sort(ms.begin(), ms.end());
      const double n = double(opt.steps);
      p.ms_token[arm] = ms[ms.size() / 2];
      p.wait_ms_token[arm] = double(t1.drive_wait_ns - t0.drive_wait_ns) / 1e6 / n;
      p.host_hits_token[arm] = double(t1.host_hits - t0.host_hits) / n;
      p.drive_reads_token[arm] = double(t1.drive_reads - t0.drive_reads) / n;
      p.drive_gbps[arm] = wall_s > 0 ? double(t1.drive_bytes - t0.drive_bytes) / wall_s / 1e9 : 0;
      if (arm == 0) p.hbm_hit = d.hit_rate();
      if (arm == 1) p.hbm_hit_asked = d.hit_rate();
      if (arm == 2) {
        p.predicted_token = double(d.predicted) / n;
        p.predict_used_token = double(d.predict_used) / n;
        p.predict_hinted_token = double(d.predict_hinted) / n;
        predict(false);
      }
    }
    if (arms == 3 && !st.ok()) predict(false);
    src.use_drives(false);
    tiers.set_prefetch(true);
    if (!st.ok()) break;
    std::fprintf(stderr,
                 "bench: drive tier top-10 share %.2f: HBM hits %.1f%%; reads at routing time: %.1f ms/token, exposed drive wait %.1f ms/token, "
                 "%.1f host hits + %.1f drive reads per token, drives %.2f GB/s; read when asked: %.1f ms/token, wait %.1f ms/token, %.1f + %.1f, "
                 "%.2f GB/s (HBM hits %.1f%%)\n",
                 share, 100 * p.hbm_hit, p.ms_token[0], p.wait_ms_token[0], p.host_hits_token[0], p.drive_reads_token[0], p.drive_gbps[0],
                 p.ms_token[1], p.wait_ms_token[1], p.host_hits_token[1], p.drive_reads_token[1], p.drive_gbps[1], 100 * p.hbm_hit_asked);
    if (arms == 3)
      std::fprintf(stderr,
                   "bench: drive tier top-10 share %.2f: with next-layer prediction at accuracy %.2f: %.1f ms/token, exposed drive wait %.1f "
                   "ms/token, %.1f host hits + %.1f drive reads per token, %.2f GB/s; %.1f copied ahead (%.1f used), %.1f guesses' reads started "
                   "per token\n",
                   share, opt.predict_accuracy, p.ms_token[2], p.wait_ms_token[2], p.host_hits_token[2], p.drive_reads_token[2], p.drive_gbps[2],
                   p.predicted_token, p.predict_used_token, p.predict_hinted_token);
    out.push_back(p);
  }
  ex.set_route_override(nullptr);
  src.use_drives(false);
  FB_RETURN_IF_ERROR(st);
  const storage::TierStats t = tiers.stats();
  for (const storage::DriveStats& d : t.drives)
    std::fprintf(stderr, "bench: drive %s: %llu reads, %.2f GB, estimate %.2f GB/s, %llu errors, %llu hedges (%llu won)%s\n", d.root.c_str(),
                 (unsigned long long)d.n_reads, double(d.bytes_read) / 1e9, d.bytes_per_s / 1e9, (unsigned long long)d.n_errors,
                 (unsigned long long)d.n_hedges, (unsigned long long)d.n_hedges_won, d.failed ? " FAILED" : "");
  return out;
}

}  // namespace fb::bench
