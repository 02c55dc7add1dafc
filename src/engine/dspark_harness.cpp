#include "engine/dspark_harness.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace fb::engine {

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Greedy generation of n tokens; decode time excludes the prefill.
Status generate(model::Executor& ex, std::span<const int32_t> prompt, int64_t n, const GeneratorOptions& opt,
                std::vector<int32_t>* out, DsparkCounters* cnt, double* decode_s) {
  Generator g(ex, opt);
  FB_RETURN_IF_ERROR(g.prefill(prompt));
  SamplingParams sp;
  sp.temperature = 0;
  Rng rng(0);
  out->clear();
  const double t0 = now_s();
  while (int64_t(out->size()) < n) FB_RETURN_IF_ERROR(g.next(sp, rng, out));
  *decode_s = now_s() - t0 - g.counters().calibrate_s;
  out->resize(size_t(n));
  if (cnt) *cnt = g.counters();
  return Status();
}
}  // namespace

ForcedAcceptanceExecutor::ForcedAcceptanceExecutor(model::Executor& inner, std::vector<int32_t> transcript, double p, uint64_t seed)
    : in_(&inner), transcript_(std::move(transcript)), p_(p), seed_(seed) {}

Result<model::DraftOutput> ForcedAcceptanceExecutor::draft(model::SessionState& s, int32_t anchor, const uint16_t* tap_row, int64_t p) {
  auto d = in_->draft(s, anchor, tap_row, p);
  if (!d.ok()) return d;
  const int32_t V = int32_t(config().vocab_size);
  // One stream per round (keyed by the anchor position): the coin of draft k.
  Rng coins = Rng(seed_).stream(p + 1, 0x46414343u);
  const double pc = std::clamp(p_, 1e-9, 1.0 - 1e-9);
  const float z = float(std::log(pc / (1.0 - pc)));
  for (size_t k = 1; k < d->ids.size(); ++k) {
    const int64_t pos = p + 1 + int64_t(k);  // draft d_k sits at position p+1+k
    const bool known = pos < int64_t(transcript_.size());
    const int32_t right = known ? transcript_[size_t(pos)] : 0;
    const bool hit = coins.uniform() < p_;
    d->ids[k] = known && hit ? right : (right + 1 + int32_t(coins.next_u64() % uint64_t(V - 1))) % V;
    if (k - 1 < d->confidence.size()) d->confidence[k - 1] = z;
  }
  return d;
}

Result<std::vector<ForcedAcceptanceReport>> run_forced_acceptance(model::Executor& ex, std::span<const int32_t> prompt,
                                                                  int64_t n_tokens, std::span<const double> ps,
                                                                  GeneratorOptions opt, uint64_t seed,
                                                                  const std::function<void(int64_t, int64_t)>& on_run) {
  GeneratorOptions off = opt;
  off.dspark = false;
  // The transcript runs a block past n_tokens, so the last round's drafts are known too.
  const int64_t n_plain = n_tokens + ex.config().dspark_block_size + 1;
  std::vector<int32_t> plain;
  double plain_s = 0;
  FB_RETURN_IF_ERROR(generate(ex, prompt, n_plain, off, &plain, nullptr, &plain_s));
  const int64_t n_runs = 1 + int64_t(ps.size());
  if (on_run) on_run(1, n_runs);
  std::vector<int32_t> transcript(prompt.begin(), prompt.end());
  transcript.insert(transcript.end(), plain.begin(), plain.end());
  plain.resize(size_t(n_tokens));
  GeneratorOptions on = opt;
  on.dspark = true;
  if (on.dspark_verify < 0 && on.dspark_verify_sps.empty()) {
    // Measure the verify cost table once, so every p runs under the same schedule inputs.
    Generator g(ex, on);
    FB_RETURN_IF_ERROR(g.prefill(prompt));
    SamplingParams sp;
    sp.temperature = 0;
    Rng rng(0);
    std::vector<int32_t> first;
    FB_RETURN_IF_ERROR(g.next(sp, rng, &first));
    FB_RETURN_IF_ERROR(g.calibrate_verify_cost());
    on.dspark_verify_sps = g.verify_cost().steps_per_s;
    on.dspark_draft_s = g.verify_cost().draft_s;
  }
  std::vector<ForcedAcceptanceReport> reports;
  for (double p : ps) {
    ForcedAcceptanceExecutor forced(ex, transcript, p, seed);
    std::vector<int32_t> spec;
    DsparkCounters c;
    ForcedAcceptanceReport r;
    FB_RETURN_IF_ERROR(generate(forced, prompt, n_tokens, on, &spec, &c, &r.decode_s));
    r.p = p;
    r.rounds = c.steps;
    r.accepted = c.accepted;
    r.verify_rows = c.verify_rows;
    r.tokens_per_round = c.steps ? double(c.accepted + c.steps) / double(c.steps) : 0;
    double expect = 0;
    for (size_t L = 0; L < c.verify_hist.size(); ++L) {
      double t = 1, pj = 1;
      for (size_t j = 1; j <= L; ++j) t += (pj *= p);
      expect += double(c.verify_hist[L]) * t;
    }
    r.expected_tokens_per_round = c.steps ? expect / double(c.steps) : 0;
    r.accepted_hist = c.accepted_hist;
    r.verify_hist = c.verify_hist;
    r.draft_s = c.draft_s;
    r.backoff_steps = c.backoff_steps;
    r.verify_s = c.verify_s;
    r.tok_per_s = r.decode_s > 0 ? double(n_tokens) / r.decode_s : 0;
    r.plain_tok_per_s = plain_s > 0 ? double(n_plain) / plain_s : 0;
    r.matches_plain = spec == plain;
    reports.push_back(std::move(r));
    if (on_run) on_run(1 + int64_t(reports.size()), n_runs);
  }
  return reports;
}

}  // namespace fb::engine
