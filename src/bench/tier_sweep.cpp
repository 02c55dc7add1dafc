#include "bench/tier_sweep.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>

#include "bench/decode_bench.h"
#include "storage/route_sim.h"

namespace fb::bench {

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

namespace {

class ColdBytesHostExperts final : public model::HostExpertCompute {
 public:
  ColdBytesHostExperts(std::shared_ptr<const model::HostExpertCompute> inner, int n) : inner_(std::move(inner)), n_(std::max(1, n)) {}
  void run(const std::vector<model::HostExpertJob>& jobs, float limit) const override {
    std::vector<model::HostExpertJob> cold = jobs;
    std::lock_guard<std::mutex> lk(mu_);
    for (model::HostExpertJob& j : cold) {
      const int64_t I = j.ex.w1.w.dim(0), D = j.ex.w2.w.dim(0);
      if (bytes_.empty() || I != I_ || D != D_) make(D, I);
      const Bytes& b = bytes_[size_t(next_++ % uint64_t(n_))];
      j.ex.w1 = {TensorView{j.ex.w1.w.dtype, {I, D / 2}, b.w1.data()}, TensorView{j.ex.w1.scale.dtype, {I, D / 32}, b.s1.data()}};
      j.ex.w3 = {TensorView{j.ex.w3.w.dtype, {I, D / 2}, b.w3.data()}, TensorView{j.ex.w3.scale.dtype, {I, D / 32}, b.s3.data()}};
      j.ex.w2 = {TensorView{j.ex.w2.w.dtype, {D, I / 2}, b.w2.data()}, TensorView{j.ex.w2.scale.dtype, {D, I / 32}, b.s2.data()}};
    }
    inner_->run(cold, limit);
  }
  double ms_per_expert(int64_t D, int64_t I) const override { return inner_->ms_per_expert(D, I); }

 private:
  struct Bytes {
    std::vector<uint8_t> w1, s1, w3, s3, w2, s2;
  };
  void make(int64_t D, int64_t I) const {
    D_ = D, I_ = I;
    bytes_.assign(size_t(n_), Bytes{});
    uint64_t x = 0x9E3779B97F4A7C15ull;
    auto fill = [&](std::vector<uint8_t>& v, int64_t n, bool scale) {
      v.resize(size_t(n));
      for (auto& c : v) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        c = scale ? uint8_t(120 + (x >> 60)) : uint8_t(x >> 24);
      }
    };
    for (Bytes& b : bytes_) {
      fill(b.w1, I * D / 2, false), fill(b.s1, I * D / 32, true), fill(b.w3, I * D / 2, false), fill(b.s3, I * D / 32, true);
      fill(b.w2, D * I / 2, false), fill(b.s2, D * I / 32, true);
    }
  }
  std::shared_ptr<const model::HostExpertCompute> inner_;
  int n_;
  mutable std::mutex mu_;
  mutable std::vector<Bytes> bytes_;
  mutable int64_t D_ = 0, I_ = 0;
  mutable uint64_t next_ = 0;
};

}  // namespace

std::shared_ptr<const model::HostExpertCompute> cold_bytes_host_experts(std::shared_ptr<const model::HostExpertCompute> inner, int n) {
  return std::make_shared<ColdBytesHostExperts>(std::move(inner), n);
}

void use_predicted_routing(cuda::CudaExecutor& ex, const cuda::CudaRunOptions& base, const std::shared_ptr<storage::PredictedRouting>& guess,
                           double accuracy) {
  cuda::CudaRunOptions o = base;
  o.expert_predict = accuracy >= 0;
  ex.set_run_options(o);
  guess->set_accuracy(std::max(0.0, accuracy));
  guess->forget();
  ex.set_predict_override(accuracy >= 0 ? cuda::CudaExecutor::RouteOverride([guess](int layer, std::vector<int32_t>& ids, int64_t rows, int top_k) {
    guess->predict(layer, ids, rows, top_k);
  })
                                        : nullptr);
}

Result<std::vector<TierPoint>> run_tier_sweep(cuda::CudaExecutor& ex, model::SessionState& s, const TierSweepOptions& opt,
                                              double h2d_peak_gbps,
                                              const std::function<model::Step(int64_t, int64_t, int64_t)>& prefill_step) {
  const model::Config& c = ex.config();
  std::shared_ptr<cuda::DevExpertSlots> slots = ex.expert_slots();
  if (!slots) return FB_ERROR(kInvalidArgument) << "the tier sweep needs an executor with expert slots";
  int n_exp = 0, S = 0, k = 0, n_tiered = 0;
  for (int l = 0; l < c.n_total_layers(); ++l)
    if (slots->slots(l) > 0) {
      ++n_tiered;
      n_exp = c.roles[size_t(l)].n_experts;
      S = slots->slots(l);
      k = c.roles[size_t(l)].n_active;
    }
  if (S == 0) return FB_ERROR(kInvalidArgument) << "no layer has fewer slots than experts";
  if (S < k) return FB_ERROR(kInvalidArgument) << S << " slots per layer cannot hold one row's " << k << " experts";
  // The routing the sweep forces: storage::ZipfRouting (route_sim.h replays these runs on the host).
  auto draw = std::make_shared<storage::ZipfRouting>(c.n_total_layers(), n_exp, opt.seed);
  // Through PredictedRouting: the routing a guess was made for comes back when its layer routes.
  auto guess = std::make_shared<storage::PredictedRouting>(*draw, 0.0, opt.seed + 1);
  ex.set_route_override([guess](int layer, std::vector<int32_t>& ids, int64_t rows, int top_k) { guess->draw(layer, ids, rows, top_k); });
  const cuda::CudaRunOptions run0 = ex.run_options();
  std::vector<double> arms = opt.predict_accuracy;
  if (arms.empty()) arms.push_back(-2);

  std::string phase;
  int64_t done = 0, total = 0;
  const std::function<void()> tick = [&] {
    if (opt.progress) opt.progress(phase, ++done, std::max(total, done), "steps");
  };
  auto decode_steps = [&](int n, std::vector<double>* ms) { return run_decode_steps(ex, s, n, 1, ms, tick); };
  const double expert_bytes = double(slots->slot_bytes());
  const double peak = h2d_peak_gbps * 1e9;
  std::vector<TierPoint> out;
  double base_ms = 0;
  std::vector<double> shares = {0.0};
  shares.insert(shares.end(), opt.skews.begin(), opt.skews.end());
  for (double share : shares) {
    for (size_t ai = 0; ai < arms.size(); ++ai) {
      const double arm = arms[ai];
      if (share <= 0 && ai > 0) continue;  // one all-hit baseline
      TierPoint p;
      p.top10_share = share;
      p.predict_accuracy = arm;
      if (arm >= -1) use_predicted_routing(ex, run0, guess, arm);
      char name[64];
      std::snprintf(name, sizeof name, share <= 0 ? "bench tiers all-hit" : "bench tiers top-10 share %.2f", share);
      phase = name;
      done = 0;
      // A later arm at the same skew starts from the caches the arm before it left at this skew's
      // steady state: a quarter of the warm-up lets its own policy settle.
      const int warm = share <= 0 || ai == 0 ? opt.warm_steps : std::max(32, opt.warm_steps / 4);
      total = int64_t(warm) + opt.steps;
      if (opt.progress) opt.progress(phase, 0, total, "steps");
      if (share <= 0) {
        draw->set_skew(0, 10, S);  // uniform over each layer's S hottest: every lookup hits once warm
        p.static_hit = 1.0;
      } else {
        draw->set_skew(share);
        p.static_hit = draw->static_hit(S);
      }
      FB_RETURN_IF_ERROR(decode_steps(warm, nullptr));
      if (share <= 0)  // the baseline must start with every pool expert resident: warm until a block misses none
        for (int b = 0; b < 64; ++b) {
          slots->reset_stats();
          total += 16;
          FB_RETURN_IF_ERROR(decode_steps(16, nullptr));
          if (slots->stats().misses == 0) break;
        }
      slots->reset_stats();
      std::vector<double> ms;
      FB_RETURN_IF_ERROR(decode_steps(opt.steps, &ms));
      const cuda::ExpertSlotStats t = slots->stats();
      std::sort(ms.begin(), ms.end());
      p.ms_token = ms[ms.size() / 2];
      p.hit_rate = t.hit_rate();
      p.misses_per_token = double(t.misses) / double(opt.steps);
      p.bypassed_per_token = double(t.bypassed) / double(opt.steps);
      p.host_per_token = double(t.host_experts) / double(opt.steps);
      p.host_ms_per_token = t.host_ms / double(opt.steps);
      p.copy_gbps = t.copy_gbps();
      p.predicted_per_token = double(t.predicted) / double(opt.steps);
      p.predict_used_per_token = double(t.predict_used) / double(opt.steps);
      if (share <= 0) base_ms = p.ms_token;
      const double copy_ms = (p.misses_per_token - p.host_per_token) * expert_bytes / peak * 1e3;  // the copied misses
      p.floor_ms = base_ms + copy_ms;
      p.ceiling_ms = std::max(base_ms, copy_ms);
      if (p.predict_accuracy >= 0) {
        const double one = expert_bytes / peak * 1e3, used = p.predict_used_per_token, late = p.misses_per_token - p.host_per_token;
        const double a = used + late > 0 ? used / (used + late) : 0, all = (used + late) * one;
        p.predict_model_ms = std::max(base_ms, a * all + (p.predicted_per_token - used) * one) + (1 - a) * all;
      }
      // The plan's prediction (docs/tiers.md, no drives: the host holds every expert): the best
      // static placement's misses, copied serially at the measured pinned peak, after the all-hit step.
      p.plan_ms = base_ms + (1.0 - p.static_hit) * double(n_tiered) * k * expert_bytes / peak * 1e3;
      if (opt.prefill_rows > 0) {
        auto ps = ex.new_session();
        std::vector<model::SessionState*> pss{ps.get()};
        slots->reset_stats();
        const double t0 = now_ms();
        FB_TRY(ex.forward(prefill_step(0, opt.prefill_rows, opt.prefill_rows), pss));
        p.prefill_s = (now_ms() - t0) / 1e3;
        const cuda::ExpertSlotStats pt = slots->stats();
        p.prefill_hit_rate = pt.hit_rate();
        p.prefill_copy_gbps = pt.copy_gbps();
        p.prefill_misses = double(pt.misses);
      }
      std::fprintf(stderr,
                   "bench: tiers top-10 share %.2f: %.2f ms/token, HBM hits %.1f%% (static placement %.1f%%), %.1f misses/token (%.1f staged), "
                   "copies %.1f GB/s (peak %.1f), model floor %.2f / ceiling %.2f ms, plan %.2f ms (measured %.2fx)",
                   share, p.ms_token, 100 * p.hit_rate, 100 * p.static_hit, p.misses_per_token, p.bypassed_per_token, p.copy_gbps, h2d_peak_gbps, p.floor_ms,
                   p.ceiling_ms, p.plan_ms, p.ms_token / p.plan_ms);
      if (p.host_per_token > 0) std::fprintf(stderr, "; %.1f misses/token on the host (%.2f ms of host time)", p.host_per_token, p.host_ms_per_token);
      if (p.predict_accuracy >= 0)
        std::fprintf(stderr, "; prediction at accuracy %.2f: %.1f experts/token copied ahead, %.1f used, model %.2f ms (measured %.2fx)",
                     p.predict_accuracy, p.predicted_per_token, p.predict_used_per_token, p.predict_model_ms,
                     p.predict_model_ms > 0 ? p.ms_token / p.predict_model_ms : 0.0);
      else if (p.predict_accuracy == -1)
        std::fprintf(stderr, "; prediction off");
      if (opt.prefill_rows > 0)
        std::fprintf(stderr, "; prefill %lld rows %.2f s (hits %.1f%%, %.0f misses, %.1f GB/s)", (long long)opt.prefill_rows, p.prefill_s,
                     100 * p.prefill_hit_rate, p.prefill_misses, p.prefill_copy_gbps);
      std::fprintf(stderr, "\n");
      out.push_back(p);
    }
  }
  ex.set_route_override(nullptr);
  ex.set_predict_override(nullptr);
  if (!opt.predict_accuracy.empty()) ex.set_run_options(run0);
  return out;
}

}  // namespace fb::bench
