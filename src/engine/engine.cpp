#include "engine/engine.h"

#include <algorithm>

#include <chrono>
#include <random>

#include "base/check.h"
#include "base/log.h"
#include "memory/plan.h"
#include "engine/stop_strings.h"
#include "tokenizer/stream_decoder.h"
#include "vision/span.h"

namespace fb::engine {

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kStopString: return "stop_string";
    case FinishReason::kLength: return "length";
    case FinishReason::kToolCalls: return "tool_calls";
    case FinishReason::kCancelled: return "cancelled";
  }
  return "stop";
}

EventSink EventQueue::sink() {
  std::shared_ptr<State> st = st_;
  return [st](const Event& e) {
    {
      std::lock_guard<std::mutex> l(st->mu);
      st->q.push_back(e);
    }
    st->cv.notify_one();
  };
}

bool EventQueue::pop(Event* e, int timeout_ms) {
  std::unique_lock<std::mutex> l(st_->mu);
  if (!st_->cv.wait_for(l, std::chrono::milliseconds(timeout_ms), [&] { return !st_->q.empty(); })) return false;
  *e = std::move(st_->q.front());
  st_->q.pop_front();
  return true;
}

Engine::Engine(std::unique_ptr<model::Executor> ex, const tokenizer::Tokenizer& tok, EngineOptions opt)
    : ex_(std::move(ex)), tok_(&tok), opt_(opt) {
  if (opt_.max_sessions < 1) opt_.max_sessions = 1;
  // One generator up front so max_context and DSpark availability are known.
  gens_.push_back(std::make_unique<Generator>(*ex_, opt_.generator));
  gen_last_use_.push_back(0);
  gen_busy_.push_back(false);
  max_context_ = gens_[0]->max_context();
  kv_dspark_ = gens_[0]->dspark_available();
  if (opt_.generator.prefill_chunk <= 0) opt_.generator.prefill_chunk = int(ex_->preferred_prefill_chunk());
  {
    PrefillPolicyOptions po;
    po.chunk = opt_.generator.prefill_chunk;
    po.fixed_rows = std::max<int64_t>(0, opt_.mixed_prefill_rows);
    po.step_factor = opt_.mixed_step_factor;
    prefill_policy_ = PrefillPolicy(po);
  }
  // The KV budget is a ledger of its own: the executors do not report their allocations to one
  // yet, so what it admits is the spec/12 estimate of each active request's KV.
  kv_tier_ = std::string(ex_->name()) == "cuda" ? memory::Tier::kHbm : memory::Tier::kHost;
  if (opt_.kv_budget_bytes > 0) {
    std::array<uint64_t, memory::kTierCount> t{};
    t[size_t(kv_tier_)] = opt_.kv_budget_bytes;
    kv_ledger_ = std::make_unique<memory::Ledger>(t);
  }
  stats_.max_sessions = opt_.max_sessions;
  stats_.kv_budget_bytes = opt_.kv_budget_bytes;
  stats_.sessions_cached = 1;
  {  // which counters exist (the counts are the engine's steps' share, from zero)
    const model::ExecutorStats x = ex_->stats();
    model::add_delta(stats_.executor, x, x);
  }
  stats_.dspark.accepted_hist.assign(size_t(std::max(0, ex_->config().dspark_block_size) + 1), 0);
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
    for (auto& [id, flag] : live_) flag->store(true);
  }
  cv_.notify_all();
  thread_.join();
}

Result<uint64_t> Engine::submit(Request req, EventSink sink) {
  const int64_t V = ex_->config().vocab_size;
  if (req.prompt.empty()) return FB_ERROR(kInvalidArgument) << "empty prompt";
  for (int32_t id : req.prompt)
    if (id < 0 || id >= V)
      return FB_ERROR(kInvalidArgument) << "prompt token id " << id << " is outside the model's vocabulary of " << V
                                        << " (does the tokenizer belong to this model?)";
  if (int64_t(req.prompt.size()) >= max_context_)
    return FB_ERROR(kResourceExhausted) << "the prompt has " << req.prompt.size() << " tokens but the context holds " << max_context_
                                        << " (prompt plus at least one generated token)";
  if (req.max_tokens < 1) return FB_ERROR(kInvalidArgument) << "max_tokens must be at least 1";
  if (req.logprobs > 20) return FB_ERROR(kInvalidArgument) << "at most 20 top logprobs";
  if (req.sampling.top_p <= 0 || req.sampling.top_p > 1) return FB_ERROR(kInvalidArgument) << "top_p must be in (0, 1]";
  if (req.sampling.min_p < 0 || req.sampling.min_p > 1) return FB_ERROR(kInvalidArgument) << "min_p must be in [0, 1]";
  if (req.sampling.top_k < 0) return FB_ERROR(kInvalidArgument) << "top_k must be >= 0";
  // Image spans -> per-position embedding rows and content keys (spec/14 §6). Only the shapes
  // are checked here (the caller's thread); the tower runs on the engine thread (run()).
  PromptEmbeddings embeds;
  int64_t image_rows = 0;
  if (!req.images.empty()) {
    const model::Config& c = ex_->config();
    if (!c.has_vision()) return FB_ERROR(kUnsupported) << "model has no vision tower";
    const int64_t N = int64_t(req.prompt.size()), P = 3LL * c.vision.patch_size * c.vision.patch_size, r = c.vision.downsample;
    embeds.row.assign(size_t(N), -1);
    embeds.key.assign(size_t(N), 0);
    int64_t end = 0;
    for (size_t i = 0; i < req.images.size(); ++i) {
      const ImageInput& im = req.images[i];
      if (im.nvh <= 0 || im.nvw <= 0 || int64_t(im.patches.size()) != int64_t(im.nvh) * im.nvw * P)
        return FB_ERROR(kInvalidArgument) << "image " << i << ": " << im.patches.size() << " patch values for a " << im.nvh << "x" << im.nvw
                                          << " grid of " << P;
      const int64_t nlh = (im.nvh + r - 1) / r, nlw = (im.nvw + r - 1) / r, L = nlh * (nlw + 1) + 2;
      if (im.pos < end || im.pos + L > N)
        return FB_ERROR(kInvalidArgument) << "image " << i << ": span [" << im.pos << ", " << im.pos + L << ") is outside the prompt or overlaps";
      for (int64_t k = 0; k < L; ++k) {
        const size_t p = size_t(im.pos + k);
        if (req.prompt[p] != c.image_token_id)
          return FB_ERROR(kInvalidArgument) << "image " << i << ": prompt position " << p << " is not the image token";
        embeds.row[p] = int32_t(image_rows + k);
        uint64_t key = (im.hash ^ (uint64_t(k + 1) * 0x9e3779b97f4a7c15ull)) * 0xbf58476d1ce4e5b9ull;
        embeds.key[p] = key ? key : 1;
      }
      image_rows += L;
      end = im.pos + L;
    }
  }
  const int64_t n_images = int64_t(req.images.size());
  // The session's KV at its longest (prompt + max_tokens, within the context): what admission
  // grants. A request that could never fit the budget is refused now rather than waiting forever.
  const int64_t kv_tokens = std::min<int64_t>(max_context_, int64_t(req.prompt.size()) + req.max_tokens);
  const uint64_t kv_bytes = memory::session_kv_bytes(ex_->config(), kv_tokens, kv_dspark_);
  if (opt_.kv_budget_bytes > 0 && kv_bytes > opt_.kv_budget_bytes)
    return FB_ERROR(kResourceExhausted) << "the request's KV (" << kv_tokens << " positions, " << kv_bytes << " bytes) exceeds the KV budget of "
                                        << opt_.kv_budget_bytes << " bytes (lower max_tokens or shorten the prompt)";
  std::lock_guard<std::mutex> l(mu_);
  if (stopping_) return FB_ERROR(kCancelled) << "the engine is shutting down";
  if (int64_t(queue_.size()) >= opt_.max_queue) {
    ++stats_.queue_rejected;
    return FB_ERROR(kUnavailable) << "the server is busy: the request queue is full (" << opt_.max_queue << " waiting); retry later";
  }
  Job j;
  j.kv_bytes = kv_bytes;
  j.t_submit = now_s();
  j.id = next_id_++;
  j.req = std::move(req);
  j.embeds = std::move(embeds);
  j.sink = std::move(sink);
  j.cancelled = std::make_shared<std::atomic<bool>>(false);
  live_[j.id] = j.cancelled;
  const uint64_t id = j.id;
  queue_.push_back(std::move(j));
  ++stats_.requests_total;
  stats_.images += n_images;
  stats_.image_rows += image_rows;
  stats_.queue_depth = int64_t(queue_.size());
  cv_.notify_one();
  return id;
}

void Engine::cancel(uint64_t id) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = live_.find(id);
  if (it != live_.end()) it->second->store(true);
}

EngineStats Engine::stats() const {
  EngineStats s;
  {
    std::lock_guard<std::mutex> l(mu_);
    s = stats_;
  }
  // The ledger and the tiers lock themselves; read outside mu_ so no lock order forms.
  s.has_kv_cache = opt_.generator.kv_store != nullptr;
  if (kv_ledger_) {
    s.has_kv_ledger = true;
    s.kv_ledger_tier = kv_tier_;
    s.kv_ledger = kv_ledger_->usage(kv_tier_);
  }
  if (opt_.expert_tiers) {
    s.has_expert_tiers = true;
    s.expert_tiers = opt_.expert_tiers->stats();
  }
  return s;
}

// An admitted request: its job, its session (a generator of gens_) and the state that turns its
// tokens into events. Held by unique_ptr: the job's image prepare hook points into it.
struct Engine::Active {
  Job job;
  size_t gen = 0;
  bool has_gen = false;        // gen is this request's (busy) session
  memory::Grant kv;            // the KV estimate, granted at admission (empty without a budget)
  bool prefilling = true;
  bool finished = false;
  tokenizer::StreamDecoder dec;
  tokenizer::OutputParser parser;
  StopStrings stops;
  Rng rng;
  bool in_reasoning = false, saw_call = false;
  FinishReason reason = FinishReason::kStop;
  Event done;
  DsparkCounters before;       // the generator's counters at admission (per-request deltas)
  double t_admit = 0, t_first = 0, t_last = 0;
  bool prefill_round = false;  // its prefill chunk is in this round's step
  int64_t row0 = 0, n_rows = 0, step_session = -1;  // this round's rows and session index
  std::vector<int32_t> toks;
  std::vector<TokenLogprob> lps;
  Active(Job j, const tokenizer::Tokenizer& tok)
      : job(std::move(j)), dec(tok), parser(job.req.thinking), stops(job.req.stop),
        rng(job.req.sampling.seed ? *job.req.sampling.seed : std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32)),
        in_reasoning(job.req.thinking) {
    done.kind = Event::Kind::kDone;
    done.usage.prompt_tokens = int64_t(job.req.prompt.size());
  }
};

void Engine::loop() {
  std::vector<std::unique_ptr<Active>> active;  // in admission order (the prefill order)
  for (;;) {
    std::vector<std::unique_ptr<Active>> admitted;
    {
      std::unique_lock<std::mutex> l(mu_);
      if (active.empty()) cv_.wait(l, [&] { return stopping_ || !queue_.empty(); });
      if (active.empty() && queue_.empty()) return;  // stopping and drained
      // Cancelled jobs leave the queue at once, whatever the capacity (they need no session).
      for (auto it = queue_.begin(); it != queue_.end();) {
        if (!it->cancelled->load()) {
          ++it;
          continue;
        }
        admitted.push_back(std::make_unique<Active>(std::move(*it), *tok_));
        it = queue_.erase(it);
      }
      // FIFO admission: the head waits for a free session and for its KV to fit (no overtaking,
      // so a large request is not starved by small ones).
      while (!queue_.empty() && int(active.size() + admitted.size()) < opt_.max_sessions) {
        memory::Grant g;
        if (kv_ledger_) {
          auto r = kv_ledger_->admit(kv_tier_, memory::Kind::kMandatory, queue_.front().kv_bytes, "session KV");
          if (!r.ok()) break;  // submit() refused what can never fit: an active request frees some
          g = std::move(r).value();
        }
        admitted.push_back(std::make_unique<Active>(std::move(queue_.front()), *tok_));
        admitted.back()->kv = std::move(g);
        queue_.pop_front();
      }
      stats_.queue_depth = int64_t(queue_.size());
    }
    for (auto& a : admitted)
      if (start(*a)) active.push_back(std::move(a));
    if (!active.empty()) round(active);
    // Finished requests leave; their sessions stay cached for prefix reuse.
    std::erase_if(active, [](const std::unique_ptr<Active>& a) { return a->finished; });
    std::lock_guard<std::mutex> l(mu_);
    stats_.active = int64_t(active.size());
    stats_.active_rates.clear();
    const double t = now_s();
    for (auto& a : active) {
      EngineStats::SessionRate r;
      r.id = a->job.id;
      r.tokens = a->done.usage.completion_tokens;
      if (a->t_first > 0 && t > a->t_first) r.tok_s = double(r.tokens - 1) / (t - a->t_first);
      if (a->has_gen) {
        const Generator& g = *gens_[a->gen];
        r.prefill_total = g.prefill_total();
        r.prefill_done = a->prefilling ? g.prefill_done() : r.prefill_total;
        const double t_end = a->t_first > 0 ? a->t_first : t;
        if (t_end > a->t_admit && r.prefill_done > 0) r.prefill_tok_s = double(r.prefill_done) / (t_end - a->t_admit);
      }
      stats_.active_rates.push_back(r);
    }
  }
}

size_t Engine::pick_generator(const std::vector<int32_t>& prompt, const PromptEmbeddings* embeds) {
  size_t best = gens_.size();
  int64_t best_len = -1;
  for (size_t i = 0; i < gens_.size(); ++i) {
    if (gen_busy_[i]) continue;
    const int64_t c = gens_[i]->reusable_prefix(prompt, embeds);
    if (c > best_len) {
      best_len = c;
      best = i;
    }
  }
  if (best_len <= 0 && int(gens_.size()) < opt_.max_sessions) {
    gens_.push_back(std::make_unique<Generator>(*ex_, opt_.generator));
    gen_last_use_.push_back(0);
    gen_busy_.push_back(false);
    best = gens_.size() - 1;
  } else if (best_len <= 0) {
    uint64_t oldest = UINT64_MAX;
    for (size_t i = 0; i < gens_.size(); ++i)
      if (!gen_busy_[i] && gen_last_use_[i] < oldest) {
        oldest = gen_last_use_[i];
        best = i;
      }
  }
  FB_CHECK_LT(best, gens_.size()) << "no idle session (admission keeps active < max_sessions)";
  gen_last_use_[best] = ++use_clock_;
  return best;
}

Status Engine::encode_images(Job& job, int64_t first_pos) {
  const model::Config& c = ex_->config();
  if (span_markers_.empty()) span_markers_ = FB_TRY(ex_->image_span_markers());
  const int r = c.vision.downsample;
  const int64_t D = c.dim;
  std::vector<uint16_t>& data = job.embeds.data;
  // Span rows in prompt order (as Engine::submit numbered them); data holds every row, so rows of
  // skipped images stay zero and are never read (their positions are reused, < first_pos).
  std::vector<int64_t> row0(job.req.images.size() + 1, 0);
  for (size_t i = 0; i < job.req.images.size(); ++i) {
    const ImageInput& im = job.req.images[i];
    const int64_t L = int64_t((im.nvh + r - 1) / r) * ((im.nvw + r - 1) / r + 1) + 2;
    row0[i + 1] = row0[i] + L;
  }
  if (int64_t(data.size()) != row0.back() * D) data.assign(size_t(row0.back() * D), 0);
  int64_t encoded = 0;
  for (size_t i = 0; i < job.req.images.size(); ++i) {
    ImageInput& im = job.req.images[i];
    const int64_t L = row0[i + 1] - row0[i];
    if (im.pos + L <= first_pos || im.patches.empty()) continue;  // KV reused (or already encoded)
    if (job.cancelled->load()) return FB_ERROR(kCancelled) << "cancelled while encoding images";
    auto aligned = ex_->encode_image(im.patches, im.nvh, im.nvw);
    if (!aligned.ok()) return aligned.status().with_context("image " + std::to_string(i) + ": the vision tower");
    const std::vector<int32_t> types = vision::span_types((im.nvh + r - 1) / r, (im.nvw + r - 1) / r);
    const std::vector<uint16_t> rows = vision::span_embeddings(types, *aligned, span_markers_, c.dim);
    if (int64_t(rows.size()) != L * D) return FB_ERROR(kInternal) << "image " << i << ": span rows do not match its grid";
    std::copy(rows.begin(), rows.end(), data.begin() + row0[i] * D);
    std::vector<uint16_t>().swap(im.patches);  // the rows replace the patches
    ++encoded;
  }
  std::lock_guard<std::mutex> l(mu_);
  stats_.images_encoded += encoded;
  return Status();
}

bool Engine::start(Active& a) {
  Job& job = a.job;
  a.t_admit = now_s();
  {
    std::lock_guard<std::mutex> l(mu_);
    stats_.queue_wait_s += a.t_admit - job.t_submit;
    ++stats_.queue_waits;
  }
  if (job.cancelled->load()) {
    end(a);
    return false;
  }
  const Request& req = job.req;
  if (!req.images.empty()) {
    // The tower runs inside begin_prefill, once the reused prefix is known (cached images are
    // skipped); the rows are allocated now (zeros where an image is not encoded: never read).
    const int64_t n_rows = std::count_if(job.embeds.row.begin(), job.embeds.row.end(), [](int32_t r) { return r >= 0; });
    job.embeds.data.assign(size_t(n_rows * ex_->config().dim), 0);
    job.embeds.prepare = [this, &job](int64_t first_pos) {
      const double te = now_s();
      Status es = encode_images(job, first_pos);
      std::lock_guard<std::mutex> l(mu_);
      stats_.image_encode_s += now_s() - te;
      return es;
    };
  }
  const PromptEmbeddings* embeds = job.embeds.row.empty() ? nullptr : &job.embeds;
  a.gen = pick_generator(req.prompt, embeds);
  a.has_gen = true;
  gen_busy_[a.gen] = true;
  Generator& gen = *gens_[a.gen];
  a.before = gen.counters();
  Status s = gen.begin_prefill(req.prompt, embeds);
  if (!s.ok()) {
    end(a, s.code() == StatusCode::kCancelled ? Status() : s);
    return false;
  }
  a.done.usage.cached_tokens = gen.reused_tokens();
  a.prefilling = gen.prefill_rows_left() > 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    stats_.sessions_cached = int64_t(gens_.size());
    stats_.kv_admitted_bytes += a.kv.bytes();
  }
  return true;
}

void Engine::round(std::vector<std::unique_ptr<Active>>& active) {
  const double t0 = now_s();
  model::Step st;
  std::vector<model::SessionState*> sess;
  std::vector<Active*> in_step;
  // Cancellation is seen once per round: the request ends before its next rows are planned.
  for (auto& a : active)
    if (!a->finished && a->job.cancelled->load()) {
      a->reason = FinishReason::kCancelled;
      end(*a);
    }
  // One prefill chunk opens the step: rows of the oldest prompt still prefilling, and when it has
  // fewer left than the chunk holds, of the next prompts too (executors that pack prompts). Next
  // to decode rows the policy sizes the chunk so the other sessions' next tokens are not held up by
  // a whole one (0 rows: a decode-only step it measures).
  int64_t decoding = 0;
  std::vector<Active*> prompts;
  for (auto& a : active) {
    a->prefill_round = false;
    decoding += !a->finished && !a->prefilling;
    if (!a->finished && a->prefilling) prompts.push_back(a.get());
  }
  const bool pack = ex_->packs_prompts() && !opt_.generator.prefill_replay;
  auto plan_prompts = [&](int64_t budget) {
    for (Active* p : prompts) {
      if (budget <= 0 || p->finished || (!in_step.empty() && !pack)) break;
      const int64_t r0 = int64_t(st.rows.size());
      gens_[p->gen]->plan_prefill(budget, int(sess.size()), &st);
      p->prefill_round = true;
      p->row0 = r0;
      p->n_rows = int64_t(st.rows.size()) - r0;
      p->step_session = int64_t(sess.size());
      sess.push_back(gens_[p->gen]->session());
      in_step.push_back(p);
      budget -= p->n_rows;
    }
  };
  if (!prompts.empty()) plan_prompts(prefill_policy_.rows(decoding > 0));
  // Every decoding session's rows: one decode row, or a DSpark verify block. First each session
  // decides its round; the drafts of every drafting session then run in ONE executor call
  // (draft_many); then each appends its rows, in admission order.
  std::vector<Active*> planned;
  std::vector<model::DraftJob> jobs;
  for (auto& ap : active) {
    Active& a = *ap;
    if (a.finished || a.prefilling) continue;
    Generator& gen = *gens_[a.gen];
    a.toks.clear();
    a.lps.clear();
    // The verify cost table belongs to the executor, not the session: a session takes the one
    // measured already instead of timing its own (the schedule never changes greedy output).
    if (gen.verify_cost().empty() && !verify_cost_.empty()) gen.set_verify_cost(verify_cost_);
    Status s = gen.prepare_next(a.job.req.sampling, a.rng, &a.toks, &a.lps, a.job.req.logprobs);
    if (s.code() == StatusCode::kResourceExhausted) {  // context limit
      a.reason = FinishReason::kLength;
      end(a);
      continue;
    }
    if (!s.ok()) {
      end(a, s);
      continue;
    }
    if (verify_cost_.empty()) verify_cost_ = gen.verify_cost();
    if (!gen.prepared()) {  // emitted from the logits a prefill left
      deliver(a, a.toks, a.lps);
      continue;
    }
    if (const model::DraftJob* j = gen.draft_job()) jobs.push_back(*j);
    planned.push_back(&a);
  }
  std::vector<Result<model::DraftOutput>> drafts;
  if (!jobs.empty()) {
    drafts = ex_->draft_many(jobs);
    FB_CHECK_EQ(drafts.size(), jobs.size()) << "draft_many answers every job";
    std::lock_guard<std::mutex> l(mu_);
    ++stats_.draft_calls;
    stats_.draft_blocks += int64_t(jobs.size());
  }
  size_t next_draft = 0;
  for (Active* ap : planned) {
    Active& a = *ap;
    Generator& gen = *gens_[a.gen];
    Result<model::DraftOutput>* d = gen.draft_job() ? &drafts[next_draft++] : nullptr;
    const int64_t r0 = int64_t(st.rows.size());
    Status s = gen.plan_drafted(a.job.req.sampling, int(sess.size()), &st, d);
    if (!s.ok()) {
      end(a, s);
      continue;
    }
    a.row0 = r0;
    a.n_rows = int64_t(st.rows.size()) - r0;
    a.step_session = int64_t(sess.size());
    sess.push_back(gen.session());
    in_step.push_back(&a);
  }
  // The decode-only step the policy asked for found no decode rows after all: a prompt chunk.
  if (st.rows.empty() && !prompts.empty()) plan_prompts(prefill_policy_.rows(false));
  int64_t prefill_rows = 0, step_prompts = 0;
  for (Active* p : in_step)
    if (p->prefill_round) {
      prefill_rows += p->n_rows;
      ++step_prompts;
    }
  if (st.rows.empty()) return;
  // Greedy rows that nobody reads beyond their argmax leave their logits on the device.
  st.logits_to_host = prefill_rows > 0;
  for (const Active* p : in_step) st.logits_to_host = st.logits_to_host || reads_logit_rows(p->job.req.sampling, p->job.req.logprobs >= 0);
  const model::ExecutorStats x0 = ex_->stats();  // this thread runs the steps: no race
  const double ts = now_s();
  auto r = ex_->forward(st, sess, nullptr);
  const double te = now_s();
  const model::ExecutorStats x1 = ex_->stats();
  if (r.ok()) prefill_policy_.observe(int64_t(st.rows.size()) - prefill_rows, prefill_rows, te - ts);
  const int64_t V = ex_->config().vocab_size;
  const int64_t tap_w = int64_t(ex_->config().dspark_target_layer_ids.size()) * ex_->config().dim;
  const int64_t n = int64_t(st.rows.size());
  for (Active* ap : in_step) {
    Active& a = *ap;
    Generator& gen = *gens_[a.gen];
    if (!r.ok()) {
      // The caches of every session in the step may hold part of it: each starts over.
      gen.abandon_step();
      end(a, r.status());
      continue;
    }
    const model::StepOutput mine = in_step.size() == 1 ? *r : rows_of(*r, n, a.row0, a.n_rows, V, tap_w);
    if (a.prefill_round) {
      Status s = gen.finish_prefill(mine);
      if (!s.ok()) {
        end(a, s);
        continue;
      }
      Event e;
      e.kind = Event::Kind::kPrefill;
      e.done = gen.prefill_done();
      e.total = gen.prefill_total();
      a.job.sink(e);
      if (gen.prefill_rows_left() > 0) continue;
      a.prefilling = false;
      // The first token comes from the prompt's last logits now (time to first token), not a
      // round later.
      a.toks.clear();
      a.lps.clear();
      model::Step none;
      s = gen.plan_next(a.job.req.sampling, a.rng, 0, &none, &a.toks, &a.lps, a.job.req.logprobs);
      FB_CHECK(none.rows.empty() && !gen.awaiting_step()) << "the first token after a prefill needs no step";
      if (!s.ok()) {
        end(a, s);
        continue;
      }
      deliver(a, a.toks, a.lps);
      continue;
    }
    a.toks.clear();
    a.lps.clear();
    Status s = gen.finish_next(mine, a.job.req.sampling, a.rng, &a.toks, &a.lps, a.job.req.logprobs);
    if (!s.ok()) {
      end(a, s);
      continue;
    }
    deliver(a, a.toks, a.lps);
  }
  const double t1 = now_s();
  std::lock_guard<std::mutex> l(mu_);
  // The executor's counters, read on this thread around the step and published with the step's
  // (/v1/stats never reaches into the executor): only this step's share, so op times and expert
  // bytes line up with steps and step_rows.
  model::add_delta(stats_.executor, x0, x1);
  ++stats_.steps;
  stats_.step_rows += n;
  stats_.step_prefill_rows += prefill_rows;
  stats_.step_decode_rows += n - prefill_rows;
  stats_.packed_prompt_steps += step_prompts > 1;
  stats_.step_sessions += int64_t(sess.size());
  stats_.step_s += te - ts;
  (prefill_rows > 0 ? stats_.prefill_s : stats_.decode_s) += t1 - t0;
  stats_.mixed_prefill_rows = prefill_policy_.last_mixed_rows();
  stats_.policy_decode_step_s = prefill_policy_.decode_step_s();
  stats_.reference_steps = prefill_policy_.reference_steps();
}

// Parser events to the sink; answer text goes through the stop strings first (a match finishes
// the request there).
void Engine::route(Active& a, std::vector<tokenizer::OutputEvent> evs) {
  for (auto& oe : evs) {
    if (a.stops.stopped()) return;
    Event e;
    if (oe.kind == tokenizer::OutputEvent::Kind::kReasoning) {
      if (oe.text.empty()) continue;
      e.kind = Event::Kind::kReasoning;
      e.text = std::move(oe.text);
    } else if (oe.kind == tokenizer::OutputEvent::Kind::kText) {
      a.in_reasoning = false;
      e.kind = Event::Kind::kText;
      e.text = a.stops.feed(oe.text);
      if (a.stops.stopped()) {
        a.reason = FinishReason::kStopString;
        a.finished = true;
        a.done.stop_matched = a.stops.matched();
      }
      if (e.text.empty()) continue;
    } else {
      a.in_reasoning = false;
      a.saw_call = true;
      e.kind = Event::Kind::kToolCall;
      e.call = std::move(oe.call);
    }
    a.job.sink(e);
  }
}

void Engine::deliver(Active& a, const std::vector<int32_t>& toks, const std::vector<TokenLogprob>& lps) {
  const Request& req = a.job.req;
  const int64_t eos = ex_->config().eos_token_id;
  const double t = now_s();
  if (a.t_first == 0 && !toks.empty()) {
    a.t_first = t;
    std::lock_guard<std::mutex> l(mu_);
    stats_.ttft_s += t - a.job.t_submit;
    ++stats_.ttfts;
  } else if (!toks.empty() && a.t_last > 0) {
    const double gap = t - a.t_last;
    const size_t b = size_t(std::lower_bound(EngineStats::kGapBuckets.begin(), EngineStats::kGapBuckets.end(), gap) -
                            EngineStats::kGapBuckets.begin());
    std::lock_guard<std::mutex> l(mu_);
    ++stats_.gap_hist[b];
    stats_.gap_s += gap;
    stats_.gap_max_s = std::max(stats_.gap_max_s, gap);
    ++stats_.gaps;
  }
  if (!toks.empty()) a.t_last = t;
  const int64_t n_before = a.done.usage.completion_tokens;
  // spec/13 §6.4: scan a DSpark block in order; the first stop ends the request there.
  for (size_t i = 0; i < toks.size() && !a.finished; ++i) {
    const int32_t t = toks[i];
    ++a.done.usage.completion_tokens;
    if (a.in_reasoning) ++a.done.usage.reasoning_tokens;
    if (req.logprobs >= 0 && i < lps.size()) {
      Event e;
      e.kind = Event::Kind::kLogprob;
      auto info = [&](int32_t id, double lp) {
        TokenInfo ti;
        ti.id = id;
        ti.bytes = tok_->is_valid_id(id) ? tok_->token_bytes(id) : std::string();
        const int32_t one[1] = {id};
        ti.text = tok_->is_valid_id(id) ? tok_->decode(one) : std::string();
        ti.logprob = lp;
        return ti;
      };
      e.token = info(t, lps[i].logprob);
      for (auto& [id, lp] : lps[i].top) e.token.top.push_back(info(id, lp));
      a.job.sink(e);
    }
    if (t == eos) {
      a.reason = FinishReason::kStop;
      a.finished = true;
      break;
    }
    route(a, a.parser.feed(tok_->is_valid_id(t) ? a.dec.push(t) : std::string()));
    if (a.finished) break;
    if (a.done.usage.completion_tokens >= req.max_tokens) {
      a.reason = FinishReason::kLength;
      a.finished = true;
    }
  }
  if (a.done.usage.completion_tokens > n_before) {
    std::lock_guard<std::mutex> l(mu_);
    stats_.emitted_tokens += a.done.usage.completion_tokens - n_before;
  }
  // Disk KV cache: a long generation is checkpointed as it goes (GeneratorOptions::kv_checkpoint_every).
  if (!a.finished && a.has_gen && opt_.generator.kv_store && opt_.generator.kv_checkpoint_every > 0 &&
      gens_[a.gen]->uncheckpointed() >= opt_.generator.kv_checkpoint_every)
    gens_[a.gen]->checkpoint_history(a.done.usage.prompt_tokens + a.done.usage.completion_tokens);
  if (a.finished) end(a);
}

void Engine::end(Active& a, const Status& err) {
  a.finished = true;
  Job& job = a.job;
  const bool had_session = a.has_gen;
  // The whole conversation (prompt and answer) for the next turn, which resends both.
  if (a.has_gen && err.ok() && opt_.generator.kv_store)
    gens_[a.gen]->checkpoint_history(a.done.usage.prompt_tokens + a.done.usage.completion_tokens);
  if (a.has_gen) gen_busy_[a.gen] = false;  // idle now: cached for prefix reuse
  a.has_gen = false;
  const uint64_t granted = a.kv.bytes();
  a.kv.release();
  if (!err.ok()) {
    Event e;
    e.kind = Event::Kind::kError;
    e.status = err;
    job.sink(e);
    std::lock_guard<std::mutex> l(mu_);
    ++stats_.requests_failed;
    stats_.kv_admitted_bytes -= std::min(stats_.kv_admitted_bytes, granted);
    live_.erase(job.id);
    return;
  }
  if (job.cancelled->load() && a.reason != FinishReason::kStopString) a.reason = FinishReason::kCancelled;
  if (a.reason != FinishReason::kStopString && a.reason != FinishReason::kCancelled) {
    route(a, a.parser.feed(a.dec.finish()));
    route(a, a.parser.finish());
    if (!a.stops.stopped()) {
      std::string tail = a.stops.finish();
      if (!tail.empty()) {
        Event e;
        e.kind = Event::Kind::kText;
        e.text = std::move(tail);
        job.sink(e);
      }
    }
  }
  if (a.reason == FinishReason::kStop && a.saw_call) a.reason = FinishReason::kToolCalls;
  a.done.finish = a.reason;
  {
    std::lock_guard<std::mutex> l(mu_);
    stats_.kv_admitted_bytes -= std::min(stats_.kv_admitted_bytes, granted);
    if (had_session && (a.done.usage.completion_tokens > 0 || a.reason != FinishReason::kCancelled)) {
      Generator& gen = *gens_[a.gen];
      stats_.prompt_tokens += a.done.usage.prompt_tokens;
      stats_.cached_tokens += a.done.usage.cached_tokens;
      stats_.prefill_tokens += a.done.usage.prompt_tokens - a.done.usage.cached_tokens;
      stats_.generated_tokens += a.done.usage.completion_tokens;
      stats_.dspark.add_since(gen.counters(), a.before);
      stats_.kv_restored_tokens += gen.restored_tokens();
      if (opt_.generator.kv_store) stats_.kv = opt_.generator.kv_store->stats();  // engine thread: the store's owner
    }
    if (a.t_first > 0 && a.t_last > a.t_first) {
      stats_.session_tok_s += double(a.done.usage.completion_tokens - 1) / (a.t_last - a.t_first);
      ++stats_.session_rates;
    }
    if (a.reason == FinishReason::kCancelled) ++stats_.requests_cancelled;
    live_.erase(job.id);
  }
  job.sink(a.done);
}

}  // namespace fb::engine
