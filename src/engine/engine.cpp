#include "engine/engine.h"

#include <algorithm>

#include <chrono>
#include <random>

#include "base/log.h"
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
  max_context_ = gens_[0]->max_context();
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
  std::lock_guard<std::mutex> l(mu_);
  if (stopping_) return FB_ERROR(kCancelled) << "the engine is shutting down";
  if (int64_t(queue_.size()) >= opt_.max_queue)
    return FB_ERROR(kUnavailable) << "the server is busy: the request queue is full (" << opt_.max_queue << " waiting); retry later";
  Job j;
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
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

void Engine::loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      job = std::move(queue_.front());
      queue_.pop_front();
      stats_.queue_depth = int64_t(queue_.size());
      stats_.active = 1;
    }
    run(job);
    std::lock_guard<std::mutex> l(mu_);
    live_.erase(job.id);
    stats_.active = 0;
  }
}

Generator& Engine::pick_generator(const std::vector<int32_t>& prompt, const PromptEmbeddings* embeds) {
  size_t best = 0;
  int64_t best_len = -1;
  for (size_t i = 0; i < gens_.size(); ++i) {
    const int64_t c = gens_[i]->reusable_prefix(prompt, embeds);
    if (c > best_len) {
      best_len = c;
      best = i;
    }
  }
  if (best_len <= 0 && int(gens_.size()) < opt_.max_sessions) {
    gens_.push_back(std::make_unique<Generator>(*ex_, opt_.generator));
    gen_last_use_.push_back(0);
    best = gens_.size() - 1;
  } else if (best_len <= 0) {
    best = size_t(std::min_element(gen_last_use_.begin(), gen_last_use_.end()) - gen_last_use_.begin());
  }
  gen_last_use_[best] = ++use_clock_;
  return *gens_[best];
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

void Engine::run(Job& job) {
  const Request& req = job.req;
  auto send = [&](Event e) { job.sink(e); };
  auto fail = [&](const Status& s) {
    Event e;
    e.kind = Event::Kind::kError;
    e.status = s;
    send(std::move(e));
    std::lock_guard<std::mutex> l(mu_);
    ++stats_.requests_failed;
  };
  Event done;
  done.kind = Event::Kind::kDone;
  done.usage.prompt_tokens = int64_t(req.prompt.size());
  auto finish_cancelled = [&] {
    done.finish = FinishReason::kCancelled;
    send(done);
    std::lock_guard<std::mutex> l(mu_);
    ++stats_.requests_cancelled;
  };
  if (job.cancelled->load()) return finish_cancelled();
  if (!req.images.empty()) {
    // The tower runs inside prefill, once the reused prefix is known (cached images are skipped);
    // the rows are allocated now (zeros where an image is not encoded: those rows are not read).
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
  Generator& gen = pick_generator(req.prompt, embeds);
  const DsparkCounters before = gen.counters();
  const double t0 = now_s();
  Status s = gen.prefill(req.prompt, [&](int64_t d, int64_t t) {
    Event e;
    e.kind = Event::Kind::kPrefill;
    e.done = d;
    e.total = t;
    send(std::move(e));
    return !job.cancelled->load();
  }, embeds);
  const double t1 = now_s();
  if (s.code() == StatusCode::kCancelled) return finish_cancelled();
  if (!s.ok()) return fail(s);
  done.usage.cached_tokens = gen.reused_tokens();

  tokenizer::StreamDecoder dec(*tok_);
  tokenizer::OutputParser parser(req.thinking);
  StopStrings stops(req.stop);
  Rng rng(req.sampling.seed ? *req.sampling.seed : std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32));
  bool in_reasoning = req.thinking, saw_call = false, finished = false;
  FinishReason reason = FinishReason::kStop;

  // Routes parser events to the sink; answer text goes through the stop strings first.
  auto route = [&](std::vector<tokenizer::OutputEvent> evs) {
    for (auto& oe : evs) {
      if (stops.stopped()) return;
      Event e;
      if (oe.kind == tokenizer::OutputEvent::Kind::kReasoning) {
        if (oe.text.empty()) continue;
        e.kind = Event::Kind::kReasoning;
        e.text = std::move(oe.text);
      } else if (oe.kind == tokenizer::OutputEvent::Kind::kText) {
        in_reasoning = false;
        e.kind = Event::Kind::kText;
        e.text = stops.feed(oe.text);
        if (stops.stopped()) {
          reason = FinishReason::kStopString;
          finished = true;
          done.stop_matched = stops.matched();
        }
        if (e.text.empty()) continue;
      } else {
        in_reasoning = false;
        saw_call = true;
        e.kind = Event::Kind::kToolCall;
        e.call = std::move(oe.call);
      }
      send(std::move(e));
    }
  };

  std::vector<int32_t> toks;
  std::vector<TokenLogprob> lps;
  const int64_t eos = ex_->config().eos_token_id;
  while (!finished) {
    if (job.cancelled->load()) {
      reason = FinishReason::kCancelled;
      break;
    }
    toks.clear();
    lps.clear();
    Status st = gen.next(req.sampling, rng, &toks, &lps, req.logprobs);
    if (st.code() == StatusCode::kResourceExhausted) {  // context limit
      reason = FinishReason::kLength;
      break;
    }
    if (!st.ok()) {
      fail(st);
      return;
    }
    // spec/13 §6.4: scan a DSpark block in order; the first stop ends the request there.
    for (size_t i = 0; i < toks.size() && !finished; ++i) {
      const int32_t t = toks[i];
      ++done.usage.completion_tokens;
      if (in_reasoning) ++done.usage.reasoning_tokens;
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
        send(std::move(e));
      }
      if (t == eos) {
        reason = FinishReason::kStop;
        finished = true;
        break;
      }
      route(parser.feed(tok_->is_valid_id(t) ? dec.push(t) : std::string()));
      if (finished) break;
      if (done.usage.completion_tokens >= req.max_tokens) {
        reason = FinishReason::kLength;
        finished = true;
      }
    }
  }
  if (reason != FinishReason::kStopString && reason != FinishReason::kCancelled) {
    route(parser.feed(dec.finish()));
    route(parser.finish());
    if (!stops.stopped()) {
      std::string tail = stops.finish();
      if (!tail.empty()) {
        Event e;
        e.kind = Event::Kind::kText;
        e.text = std::move(tail);
        send(std::move(e));
      }
    } else {
      reason = FinishReason::kStopString;
    }
  }
  if (reason == FinishReason::kStop && saw_call) reason = FinishReason::kToolCalls;
  const double t2 = now_s();
  done.finish = reason;
  {
    std::lock_guard<std::mutex> l(mu_);
    stats_.prompt_tokens += done.usage.prompt_tokens;
    stats_.cached_tokens += done.usage.cached_tokens;
    stats_.prefill_tokens += done.usage.prompt_tokens - done.usage.cached_tokens;
    stats_.generated_tokens += done.usage.completion_tokens;
    stats_.prefill_s += t1 - t0;
    stats_.decode_s += t2 - t1;
    stats_.dspark.add_since(gen.counters(), before);
    stats_.kv_restored_tokens += gen.restored_tokens();
    if (opt_.generator.kv_store) stats_.kv = opt_.generator.kv_store->stats();  // engine thread: the store's owner
    if (reason == FinishReason::kCancelled) ++stats_.requests_cancelled;
  }
  send(done);
}

}  // namespace fb::engine
