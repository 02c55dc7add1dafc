#include "engine/session_rounds.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "engine/generator.h"
#include "engine/prefill_policy.h"

namespace fb::engine {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Token ids away from the special ones at the low end of the vocabulary, different per session.
std::vector<int32_t> synthetic_prompt(int64_t n, int64_t vocab, uint64_t salt) {
  const uint64_t lo = uint64_t(std::min<int64_t>(1000, vocab / 4)), span = uint64_t(vocab) - 2 * lo;
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = int32_t(lo + (uint64_t(i) * 7919 + salt * 104729 + 17) % span);
  return p;
}

struct Sess {
  std::unique_ptr<Generator> gen;
  SamplingParams sp;
  Rng rng;
  std::vector<int32_t> prompt;
};

struct RoundOut {
  double wall_s = 0, step_s = 0;  // the whole round (the sessions' gap) / its forward step
  int64_t rows = 0, prefill_rows = 0, tokens = 0;
};

// One round as the engine runs it (engine.cpp Engine::round): the prompt chunk of `pf` first (when
// pf_rows > 0), then every session's decode or verify rows, their drafts in one draft_many call.
Result<RoundOut> run_round(model::Executor& ex, const std::vector<Sess*>& ss, Generator* pf, int64_t pf_rows,
                           std::vector<int32_t>* tok0) {
  RoundOut out;
  const double t0 = now_s();
  model::Step st;
  std::vector<model::SessionState*> sess;
  if (pf && pf_rows > 0) {
    pf->plan_prefill(pf_rows, 0, &st);
    sess.push_back(pf->session());
  }
  out.prefill_rows = int64_t(st.rows.size());
  auto emitted = [&](const Sess* s, const std::vector<int32_t>& toks) {
    out.tokens += int64_t(toks.size());
    if (tok0 && s == ss.front()) tok0->insert(tok0->end(), toks.begin(), toks.end());
  };
  std::vector<Sess*> planned;
  std::vector<model::DraftJob> jobs;
  for (Sess* s : ss) {
    // One verify cost table for all (the engine shares the first one measured, too).
    if (s->gen->verify_cost().empty() && !ss.front()->gen->verify_cost().empty()) s->gen->set_verify_cost(ss.front()->gen->verify_cost());
    std::vector<int32_t> toks;
    FB_RETURN_IF_ERROR(s->gen->prepare_next(s->sp, s->rng, &toks));
    emitted(s, toks);
    if (!s->gen->prepared()) continue;
    if (const model::DraftJob* j = s->gen->draft_job()) jobs.push_back(*j);
    planned.push_back(s);
  }
  std::vector<Result<model::DraftOutput>> drafts;
  if (!jobs.empty()) drafts = ex.draft_many(jobs);
  std::vector<int64_t> row0;
  size_t next = 0;
  for (Sess* s : planned) {
    row0.push_back(int64_t(st.rows.size()));
    Result<model::DraftOutput>* d = s->gen->draft_job() ? &drafts[next++] : nullptr;
    FB_RETURN_IF_ERROR(s->gen->plan_drafted(s->sp, int(sess.size()), &st, d));
    sess.push_back(s->gen->session());
  }
  out.rows = int64_t(st.rows.size());
  if (st.rows.empty()) return out;
  st.logits_to_host = out.prefill_rows > 0;  // as Engine::round: greedy rows read only their argmax
  for (const Sess* s : planned) st.logits_to_host = st.logits_to_host || reads_logit_rows(s->sp, false);
  const double ts = now_s();
  auto r = ex.forward(st, sess);
  out.step_s = now_s() - ts;
  if (!r.ok()) return r.status();
  const int64_t V = ex.config().vocab_size, n = out.rows;
  const int64_t tap_w = int64_t(ex.config().dspark_target_layer_ids.size()) * ex.config().dim;
  auto mine = [&](int64_t first, int64_t count) { return sess.size() == 1 ? *r : rows_of(*r, n, first, count, V, tap_w); };
  if (out.prefill_rows > 0) FB_RETURN_IF_ERROR(pf->finish_prefill(mine(0, out.prefill_rows)));
  for (size_t i = 0; i < planned.size(); ++i) {
    const int64_t end = i + 1 < planned.size() ? row0[i + 1] : n;
    std::vector<int32_t> toks;
    FB_RETURN_IF_ERROR(planned[i]->gen->finish_next(mine(row0[i], end - row0[i]), planned[i]->sp, planned[i]->rng, &toks));
    emitted(planned[i], toks);
  }
  out.wall_s = now_s() - t0;
  return out;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5));
  return v[i];
}

}  // namespace

Result<SessionRoundsResult> run_session_rounds(model::Executor& ex, const SessionRoundsOptions& o) {
  const model::Config& c = ex.config();
  const double t_run = now_s();
  // One progress line: what runs now, seconds since the run began.
  auto say = [&](const char* fmt, auto... args) {
    if (!o.log) return;
    char line[320];
    const int n = std::snprintf(line, sizeof line, fmt, args...);
    if (n < 0) return;
    char tail[48];
    std::snprintf(tail, sizeof tail, " (%.1f s)", now_s() - t_run);
    o.log(std::string(line) + tail);
  };
  GeneratorOptions go;
  go.dspark = o.dspark;
  go.prefill_chunk = o.prefill_chunk;
  int n_max = o.arrival_prompt > 0 ? o.arrival_streams : 0;
  for (int n : o.sessions) {
    if (n < 1) return FB_ERROR(kInvalidArgument) << "session counts must be >= 1";
    n_max = std::max(n_max, n);
  }
  if (o.context < 2 || o.rounds < 1) return FB_ERROR(kInvalidArgument) << "context >= 2 and rounds >= 1";
  std::vector<Sess> all(static_cast<size_t>(n_max));
  for (int i = 0; i < n_max; ++i) {
    all[size_t(i)].gen = std::make_unique<Generator>(ex, go);
    all[size_t(i)].sp.temperature = 0;
    all[size_t(i)].prompt = synthetic_prompt(o.context, c.vocab_size, o.seed + uint64_t(i));
  }
  if (o.context + 2 + o.rounds * (c.dspark_block_size + 1) >= all[0].gen->max_context())
    return FB_ERROR(kInvalidArgument) << "context " << o.context << " plus the rounds' tokens exceeds the model's context";
  // The first N sessions at their prompts and decoding. Prefilled: prefix reuse makes the repeats
  // cheap. Filled: a fresh session each time, its prompt's first token pending, so every count
  // starts from the same state (session 0's tokens can be compared across counts).
  auto start = [&](int n) -> Result<std::vector<Sess*>> {
    std::vector<Sess*> ss;
    say("sessions: %d session%s: %s %lld-token contexts", n, n == 1 ? "" : "s", o.fill_context ? "filling" : "prefilling",
        (long long)o.context);
    for (int i = 0; i < n; ++i) {
      Sess& s = all[size_t(i)];
      if (o.fill_context) {
        s.gen->reset();
        FB_RETURN_IF_ERROR(o.fill_context(*s.gen->session(), s.prompt));
        FB_RETURN_IF_ERROR(s.gen->adopt_context(s.prompt, s.prompt.front()));
      } else {
        FB_RETURN_IF_ERROR(s.gen->prefill(s.prompt));
      }
      ss.push_back(&s);
    }
    say("sessions: %d session%s: warm-up rounds", n, n == 1 ? "" : "s");
    for (int w = 0; w < 2; ++w) FB_TRY(run_round(ex, ss, nullptr, 0, nullptr));  // first tokens, DSpark calibration
    return ss;
  };
  SessionRoundsResult res;
  for (int n : o.sessions) {
    const std::vector<Sess*> ss = FB_TRY(start(n));
    say("sessions: %d session%s: %d timed rounds", n, n == 1 ? "" : "s", o.rounds);
    SessionRoundsRow row;
    row.sessions = n;
    std::vector<double> gaps, steps;
    double total = 0;
    int64_t tokens = 0, rows = 0;
    for (int k = 0; k < o.rounds; ++k) {
      const RoundOut r = FB_TRY(run_round(ex, ss, nullptr, 0, &row.first_session_tokens));
      gaps.push_back(r.wall_s);
      steps.push_back(r.step_s);
      total += r.wall_s;
      tokens += r.tokens;
      rows += r.rows;
    }
    row.tok_s = total > 0 ? double(tokens) / total : 0;
    row.rows_per_step = double(rows) / double(o.rounds);
    row.gap_p50_ms = percentile(gaps, 0.5) * 1e3;
    row.gap_p99_ms = percentile(gaps, 0.99) * 1e3;
    row.gap_max_ms = percentile(gaps, 1.0) * 1e3;
    row.step_p50_ms = percentile(steps, 0.5) * 1e3;
    say("sessions: %d session%s: %.1f tok/s, %.1f rows/step, round p50 %.2f ms (its step %.2f ms), p99 %.2f ms", n, n == 1 ? "" : "s", row.tok_s,
        row.rows_per_step, row.gap_p50_ms, row.step_p50_ms, row.gap_p99_ms);
    res.rows.push_back(std::move(row));
  }
  if (o.arrival_prompt > 0) {
    const std::vector<Sess*> ss = FB_TRY(start(o.arrival_streams));
    PrefillPolicyOptions po;
    po.chunk = o.prefill_chunk > 0 ? o.prefill_chunk : ex.preferred_prefill_chunk();
    po.fixed_rows = o.fixed_rows;
    po.step_factor = o.step_factor;
    PrefillPolicy pol(po);
    std::vector<double> before;
    say("arrival: %d streams: %d rounds before the prompt", o.arrival_streams, o.arrival_before);
    for (int k = 0; k < o.arrival_before; ++k) {
      const RoundOut r = FB_TRY(run_round(ex, ss, nullptr, 0, nullptr));
      before.push_back(r.wall_s);
      pol.observe(r.rows, 0, r.step_s);
    }
    Generator pf(ex, go);
    const std::vector<int32_t> prompt = synthetic_prompt(o.arrival_prompt, c.vocab_size, o.seed + 7777);
    // A filled prefix: the prompt's cache up to its last arrival_tail positions is written before
    // it arrives; begin_prefill reuses it and prefills the tail beside the streams.
    const int64_t tail = o.fill_context && o.arrival_tail > 0 && o.arrival_tail < o.arrival_prompt ? o.arrival_tail : o.arrival_prompt;
    if (tail < o.arrival_prompt) {
      say("arrival: filling the prompt's first %lld tokens", (long long)(o.arrival_prompt - tail));
      const std::span<const int32_t> head(prompt.data(), size_t(o.arrival_prompt - tail));
      FB_RETURN_IF_ERROR(o.fill_context(*pf.session(), head));
      FB_RETURN_IF_ERROR(pf.adopt_context(head, -1));
    }
    FB_RETURN_IF_ERROR(pf.begin_prefill(prompt));
    ArrivalResult& a = res.arrival;
    a.prefilled_rows = pf.prefill_total();
    say("arrival: a %lld-token prompt arrives beside %d streams; %lld rows to prefill", (long long)o.arrival_prompt, o.arrival_streams,
        (long long)a.prefilled_rows);
    const int64_t refs0 = pol.reference_steps();
    const double t_arrive = now_s();
    while (pf.prefill_rows_left() > 0) {
      const RoundOut r = FB_TRY(run_round(ex, ss, &pf, pol.rows(true), nullptr));
      pol.observe(r.rows - r.prefill_rows, r.prefill_rows, r.step_s);
      if (r.wall_s * 1e3 > a.worst_gap_ms) {
        a.worst_gap_ms = r.wall_s * 1e3;
        a.worst_round = a.rounds;
        a.worst_prefill_rows = r.prefill_rows;
        a.worst_step_ms = r.step_s * 1e3;
      }
      if (a.rounds < 3)
        say("arrival: round %lld: %lld prompt rows beside %lld, %.2f ms (its step %.2f ms)", (long long)a.rounds, (long long)r.prefill_rows,
            (long long)(r.rows - r.prefill_rows), r.wall_s * 1e3, r.step_s * 1e3);
      ++a.rounds;
      if (o.log_every_rounds > 0 && a.rounds % o.log_every_rounds == 0)
        say("arrival: %lld of %lld rows after %lld rounds, worst gap %.2f ms, chunk %lld rows", (long long)pf.prefill_done(),
            (long long)pf.prefill_total(), (long long)a.rounds, a.worst_gap_ms, (long long)pol.last_mixed_rows());
    }
    a.prefill_s = now_s() - t_arrive;
    a.median_gap_ms = percentile(before, 0.5) * 1e3;
    a.reference_steps = pol.reference_steps() - refs0;
    a.last_chunk = pol.last_mixed_rows();
    res.has_arrival = true;
  }
  return res;
}

}  // namespace fb::engine
