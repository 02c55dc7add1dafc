#include "engine/replay_quality.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <sstream>

#include "engine/sampler.h"

namespace fb::engine {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double log_sum_exp(const float* x, int64_t n) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) m = std::max(m, double(x[i]));
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(double(x[i]) - m);
  return m + std::log(s);
}

// One mode: fresh session, prefill (timed, best of reps), then teacher-forced decode rows.
struct ModeRun {
  std::vector<float> rows;  // f32 [1 + steps, vocab]
  double prefill_s = std::numeric_limits<double>::infinity();
};

Result<ModeRun> run_mode(model::Executor& ex, const ReplayQualityOptions& opt, int64_t replay_start, std::vector<int32_t>* chain) {
  const model::Config& c = ex.config();
  const int64_t N = int64_t(opt.prompt.size()), V = c.vocab_size;
  const int64_t chunk = opt.chunk > 0 ? opt.chunk : N;
  ModeRun run;
  std::unique_ptr<model::SessionState> session;
  std::vector<float> last;
  for (int rep = 0; rep < std::max(1, opt.reps); ++rep) {
    session = ex.new_session();
    std::vector<model::SessionState*> ss{session.get()};
    const double t0 = now_s();
    for (int64_t s0 = 0; s0 < N; s0 += chunk) {
      model::Step st;
      for (int64_t p = s0; p < std::min(N, s0 + chunk); ++p) {
        model::Row r;
        r.pos = p;
        r.token = opt.prompt[size_t(p)];
        r.kind = model::RowKind::kPrefill;
        r.prefill_end = N;
        r.replay_start = replay_start;
        r.want_logits = p == N - 1;
        st.rows.push_back(r);
      }
      model::StepOutput out = FB_TRY(ex.forward(st, ss));
      if (!out.logits.empty()) last = std::move(out.logits);
    }
    run.prefill_s = std::min(run.prefill_s, now_s() - t0);
  }
  if (int64_t(last.size()) != V) return FB_ERROR(kInternal) << "prefill returned no logits row";
  run.rows = std::move(last);
  std::vector<model::SessionState*> ss{session.get()};
  const bool own_chain = chain->empty();
  const int64_t steps = own_chain ? opt.steps : int64_t(chain->size());
  for (int64_t k = 1; k <= steps; ++k) {
    if (own_chain) chain->push_back(argmax(&run.rows[size_t((k - 1) * V)], V));
    model::Step st;
    st.rows.push_back(model::decode_row(N + k - 1, (*chain)[size_t(k - 1)]));
    model::StepOutput out = FB_TRY(ex.forward(st, ss));
    run.rows.insert(run.rows.end(), out.logits.begin(), out.logits.end());
  }
  return run;
}

void compare_rows(const ModeRun& exact, const ModeRun& replay, int64_t V, ReplayQualityReport* out);

}  // namespace

double softmax_kl(const float* a, const float* b, int64_t n) {
  const double la = log_sum_exp(a, n), lb = log_sum_exp(b, n);
  double kl = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double pa = double(a[i]) - la;
    kl += std::exp(pa) * (pa - (double(b[i]) - lb));
  }
  return std::max(kl, 0.0);  // rounding can leave a tiny negative for equal rows
}

double ReplayQualityReport::mean_kl() const {
  double s = 0;
  for (double k : kl) s += k;
  return kl.empty() ? 0 : s / double(kl.size());
}

double ReplayQualityReport::max_kl() const {
  double m = 0;
  for (double k : kl) m = std::max(m, k);
  return m;
}

int ReplayQualityReport::top1_agree() const {
  int n = 0;
  for (uint8_t t : top1_same) n += t;
  return n;
}

std::string ReplayQualityReport::summary_line(const std::string& name) const {
  double h = 0;
  for (double e : exact_entropy) h += e;
  if (!exact_entropy.empty()) h /= double(exact_entropy.size());
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "replay-quality %s: N=%lld window=%lld decoder=%d..%d replayed=%lld..%lld rows=%zu kl_prompt=%.3e mean_kl=%.3e max_kl=%.3e "
                "top1=%d/%zu exact_entropy=%.3f prefill_exact_s=%.3f prefill_replay_s=%.3f speedup=%.2fx",
                name.c_str(), (long long)prompt_len, (long long)window, decoder_start, n_layers - 1, (long long)replay_start,
                (long long)prompt_len - 1, kl.size(), kl.empty() ? 0.0 : kl[0], mean_kl(), max_kl(), top1_agree(), top1_same.size(), h,
                exact_prefill_s, replay_prefill_s, replay_prefill_s > 0 ? exact_prefill_s / replay_prefill_s : 0.0);
  return buf;
}

Result<ReplayQualityReport> replay_quality(model::Executor& ex, const ReplayQualityOptions& opt) {
  const model::Config& c = ex.config();
  if (!ex.supports_bounded_replay()) return FB_ERROR(kUnsupported) << "the " << ex.name() << " executor does not run bounded replay";
  const int64_t N = int64_t(opt.prompt.size()), V = c.vocab_size;
  if (N == 0) return FB_ERROR(kInvalidArgument) << "empty prompt";
  const int64_t steps = opt.forced.empty() ? opt.steps : int64_t(opt.forced.size());
  if (N + steps > c.max_position_embeddings && c.max_position_embeddings > 0)
    return FB_ERROR(kInvalidArgument) << "prompt + decode steps (" << N + steps << ") exceed the context of " << c.max_position_embeddings;
  ReplayQualityReport rep;
  rep.prompt_len = N;
  rep.window = c.window_size;
  rep.replay_start = std::max<int64_t>(0, N - c.window_size);
  rep.decoder_start = c.decoder_start;
  rep.n_layers = c.n_layers;
  std::vector<int32_t> chain = opt.forced;
  ModeRun exact = FB_TRY(run_mode(ex, opt, 0, &chain));
  ModeRun replay = FB_TRY(run_mode(ex, opt, rep.replay_start, &chain));
  compare_rows(exact, replay, V, &rep);
  return rep;
}

Result<ReplayQualityReport> approx_quality(model::Executor& exact_ex, model::Executor& approx_ex, const ReplayQualityOptions& opt) {
  const model::Config& c = exact_ex.config();
  const int64_t N = int64_t(opt.prompt.size()), V = c.vocab_size;
  if (N == 0) return FB_ERROR(kInvalidArgument) << "empty prompt";
  if (approx_ex.config().vocab_size != V) return FB_ERROR(kInvalidArgument) << "the two executors run different models";
  ReplayQualityReport rep;
  rep.prompt_len = N;
  rep.window = c.window_size;
  rep.decoder_start = c.decoder_start;
  rep.n_layers = c.n_layers;
  std::vector<int32_t> chain = opt.forced;
  ModeRun exact = FB_TRY(run_mode(exact_ex, opt, 0, &chain));
  ModeRun approx = FB_TRY(run_mode(approx_ex, opt, 0, &chain));
  compare_rows(exact, approx, V, &rep);
  return rep;
}

namespace {

// Row k of `other` against row k of `exact`: KL, top-1, the exact row's margin and entropy.
void compare_rows(const ModeRun& exact, const ModeRun& replay, int64_t V, ReplayQualityReport* out) {
  ReplayQualityReport& rep = *out;
  rep.exact_prefill_s = exact.prefill_s;
  rep.replay_prefill_s = replay.prefill_s;
  const int64_t rows = int64_t(exact.rows.size()) / V;
  for (int64_t k = 0; k < rows; ++k) {
    const float* a = &exact.rows[size_t(k * V)];
    const float* b = &replay.rows[size_t(k * V)];
    rep.kl.push_back(softmax_kl(a, b, V));
    rep.top1_same.push_back(argmax(a, V) == argmax(b, V));
    const int32_t best = argmax(a, V);
    double second = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < V; ++i)
      if (i != best) second = std::max(second, double(a[i]));
    rep.exact_margin.push_back(double(a[best]) - second);
    const double la = log_sum_exp(a, V);
    double h = 0;
    for (int64_t i = 0; i < V; ++i) h -= std::exp(double(a[i]) - la) * (double(a[i]) - la);
    rep.exact_entropy.push_back(h);
  }
}

}  // namespace

}  // namespace fb::engine
