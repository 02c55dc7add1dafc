// Engine: the one thread that owns the Executor and every session (DESIGN-AHEAD item 5). Callers
// (server, CLI, benchmarks) talk to it through a narrow interface: submit(Request, sink) puts
// token ids in; events come out (prefill progress, reasoning and answer text, tool calls,
// logprobs, then exactly one terminal Done or Error). Cancellation is a message.
// Several sessions at once (issue 20): the thread runs ROUNDS; each round is one forward step
// carrying the decode (or DSpark verify) rows of every active session plus, while prompts wait,
// one prefill chunk of the oldest prompt, sized by engine::PrefillPolicy so that such a step takes
// at most mixed_step_factor times a decode-only step (the streams' inter-token gap). A request is admitted from the FIFO queue when a
// session is free (--max-sessions) and its KV estimate fits the budget; it is never preempted.
// Outputs never depend on the batching: each session's rows are computed as if alone (the
// executors are row-invariant; engine_batch_test checks it).
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "engine/generator.h"
#include "engine/prefill_policy.h"
#include "engine/sampler.h"
#include "memory/ledger.h"
#include "model/executor.h"
#include "storage/tiered_experts.h"
#include "tokenizer/output_parser.h"
#include "tokenizer/tokenizer.h"

namespace fb::engine {

// One image of the prompt (spec/14 §6), preprocessed but not yet encoded: the engine thread runs
// the tower on its executor (model::Executor::encode_image, the GPU one under --backend cuda) and
// the span's rows then enter the forward pass with embeddings instead of the token's (every span
// id is the config's image_token_id). Span layout: nlh = ceil(nvh / downsample) rows of
// nlw = ceil(nvw / downsample) slots + newline, between START and END (vision::span_types).
struct ImageInput {
  int64_t pos = 0;                // first prompt position of the span
  int nvh = 0, nvw = 0;           // ViT patch grid
  std::vector<uint16_t> patches;  // bf16 [nvh * nvw, 3 * patch_size^2] (vision::load_image)
  uint64_t hash = 0;              // content hash (bytes + preprocessing): keys prefix reuse
};

struct Request {
  std::vector<int32_t> prompt;       // rendered and tokenized by the caller (image spans expanded)
  SamplingParams sampling;
  int64_t max_tokens = 8192;         // generated tokens (reasoning + answer + calls)
  std::vector<std::string> stop;     // stop strings, matched on answer text
  int logprobs = -1;                 // -1 off; n >= 0: raw logprob of each token plus top n
  bool thinking = false;             // the prompt ends in <think>: output starts as reasoning
  std::vector<ImageInput> images;    // in prompt order, non-overlapping
};

enum class FinishReason { kStop, kStopString, kLength, kToolCalls, kCancelled };
const char* finish_reason_name(FinishReason r);  // "stop", "stop_string", "length", ...

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t reasoning_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens reused from a cached session
};

struct TokenInfo {
  int32_t id = 0;
  std::string text;   // lossy UTF-8 of the token alone
  std::string bytes;  // raw bytes
  double logprob = 0;
  std::vector<TokenInfo> top;
};

struct Event {
  enum class Kind { kPrefill, kReasoning, kText, kToolCall, kLogprob, kDone, kError };
  Kind kind = Kind::kText;
  std::string text;                  // kReasoning, kText
  tokenizer::ParsedToolCall call;    // kToolCall
  int64_t done = 0, total = 0;       // kPrefill: prompt rows prefilled so far / to prefill
  TokenInfo token;                   // kLogprob
  FinishReason finish = FinishReason::kStop;  // kDone
  std::string stop_matched;          // kDone with kStopString
  Usage usage;                       // kDone
  Status status;                     // kError
};

// Called on the engine thread, in order; must return quickly (copy into a queue).
using EventSink = std::function<void(const Event&)>;

struct EngineOptions {
  GeneratorOptions generator;
  // Sessions generating at once; each holds its own KV. Finished sessions stay cached (prefix
  // reuse across turns) until a new request needs the slot.
  int max_sessions = 8;
  int max_queue = 64;     // waiting requests before submit() refuses (kUnavailable -> HTTP 429)
  // KV admission through a memory::Ledger: a request's session KV at prompt + max_tokens
  // positions (memory::session_kv_bytes, spec/12 sizes) is granted before it starts; requests
  // wait in the queue while the budget is short. 0: no byte limit (max_sessions only).
  uint64_t kv_budget_bytes = 0;
  // Prompt rows in a step that also carries decode rows (they bound the other sessions'
  // inter-token gap while a prompt prefills). > 0: this many. 0: measured (PrefillPolicy): as many
  // as keep such a step within mixed_step_factor times a decode-only step. A step without decode
  // rows takes a whole prefill chunk.
  int64_t mixed_prefill_rows = 0;
  double mixed_step_factor = 2.0;  // [policy]
  // The routed experts' host tiers the executor reads through (engine::make_executor's tiers_out),
  // for stats() only (null: every expert resident, no tier counters).
  std::shared_ptr<const storage::TieredExperts> expert_tiers;
};

struct EngineStats {
  int64_t requests_total = 0, requests_failed = 0, requests_cancelled = 0;
  int64_t queue_depth = 0, active = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0, cached_tokens = 0;
  int64_t emitted_tokens = 0;        // tokens delivered so far, as they come (generated_tokens: finished requests)
  int64_t prefill_tokens = 0;        // prompt rows run through prefill (prompt - cached)
  int64_t images = 0, image_rows = 0;  // images in accepted requests / their span rows
  int64_t images_encoded = 0;          // tower runs (images whose KV was reused are not encoded)
  double image_encode_s = 0;           // the vision tower on the engine thread
  double prefill_s = 0, decode_s = 0;   // rounds whose step carried prompt rows / only decode rows
  // Sessions (issue 20).
  int64_t max_sessions = 0, sessions_cached = 0;  // the limit / sessions holding a KV cache
  uint64_t kv_budget_bytes = 0, kv_admitted_bytes = 0;  // the budget (0: none) / granted to active requests
  int64_t queue_rejected = 0;          // submits refused because the queue was full (429)
  int64_t steps = 0, step_rows = 0, step_prefill_rows = 0, step_decode_rows = 0;
  int64_t step_sessions = 0;           // sum over steps of the sessions in the step
  int64_t packed_prompt_steps = 0;     // steps carrying rows of two or more prompts (Executor::packs_prompts)
  int64_t draft_calls = 0, draft_blocks = 0;  // executor draft calls (one per round that drafts) / the sessions' blocks in them
  double step_s = 0;                   // time in forward steps
  double queue_wait_s = 0;  int64_t queue_waits = 0;     // submit -> admitted
  double ttft_s = 0;        int64_t ttfts = 0;           // submit -> first token
  double session_tok_s = 0; int64_t session_rates = 0;   // per finished request: tokens/s after the first
  // Inter-token gaps: time between two consecutive deliveries of tokens to one request (a DSpark
  // round delivers several at once), as a histogram over kGapBuckets (+ one bucket above).
  static constexpr std::array<double, 10> kGapBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0};
  std::array<int64_t, 11> gap_hist{};  // per bucket, not cumulative: gap_hist[i] counts gaps <= kGapBuckets[i] and > the one before
  double gap_s = 0, gap_max_s = 0;     int64_t gaps = 0;
  // The prefill policy: its last chunk beside decode rows, its decode-only step time estimate,
  // and the decode-only steps it asked for while a prompt waited.
  int64_t mixed_prefill_rows = 0;
  double policy_decode_step_s = 0;
  int64_t reference_steps = 0;
  struct SessionRate {
    uint64_t id = 0;
    double tok_s = 0;  // tokens after the first / time since the first (0 until the first token)
    int64_t tokens = 0;                       // generated so far
    int64_t prefill_done = 0, prefill_total = 0;  // prompt rows prefilled so far / to prefill
    double prefill_tok_s = 0;                 // prefill_done / time since admission (until the first token)
    bool decoding() const { return tokens > 0; }
  };
  std::vector<SessionRate> active_rates;  // every active request, in admission order
  DsparkCounters dspark;
  bool has_kv_cache = false;         // --kv-cache is on
  KvStoreStats kv;                   // the disk KV cache (--kv-cache), as of the last request
  int64_t kv_restored_tokens = 0;    // prompt positions restored from it
  // The KV admission ledger (--kv-budget-bytes) by tier; absent without a budget.
  bool has_kv_ledger = false;
  memory::Tier kv_ledger_tier = memory::Tier::kHost;
  memory::TierUsage kv_ledger;
  // The routed experts' tiers (EngineOptions::expert_tiers); absent when every expert is resident.
  bool has_expert_tiers = false;
  storage::TierStats expert_tiers;
  // The executor's own counters (model::Executor::stats) over the engine's steps (the rounds
  // counted in `steps`): routed-expert traffic by supplying tier (HBM / host / drives), step time
  // by op family.
  model::ExecutorStats executor;
};

class Engine {
 public:
  Engine(std::unique_ptr<model::Executor> ex, const tokenizer::Tokenizer& tok, EngineOptions opt);
  ~Engine();  // cancels everything still queued or running, joins the thread
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates (ids, context) and queues; the id names the request for cancel(). Errors here
  // mean no event will ever be sent.
  Result<uint64_t> submit(Request req, EventSink sink);
  // The request ends with a Done(kCancelled) event soon after (or never starts).
  void cancel(uint64_t id);

  EngineStats stats() const;
  const model::Config& config() const { return ex_->config(); }
  const char* backend_name() const { return ex_->name(); }
  int64_t max_context() const { return max_context_; }
  const tokenizer::Tokenizer& tokenizer() const { return *tok_; }

 private:
  struct Job {
    uint64_t id = 0;
    Request req;              // req.images: patches until start() encodes them into embeds.data
    PromptEmbeddings embeds;  // from req.images (row empty: text only)
    EventSink sink;
    std::shared_ptr<std::atomic<bool>> cancelled;
    uint64_t kv_bytes = 0;    // the KV estimate admission grants
    double t_submit = 0;
  };
  struct Active;  // an admitted request and its session (engine.cpp)
  void loop();
  // Admitted: picks a session and begins its prefill (false: the request already ended).
  bool start(Active& a);
  // One round: one step over every active session's rows (plus one prefill chunk).
  void round(std::vector<std::unique_ptr<Active>>& active);
  // Routes emitted tokens to the request's events; marks it finished on EOS, a stop string or
  // max_tokens.
  void deliver(Active& a, const std::vector<int32_t>& toks, const std::vector<TokenLogprob>& lps);
  void route(Active& a, std::vector<tokenizer::OutputEvent> evs);
  // Ends a request: flushes its text, sends Done (or Error when !err.ok()), frees its session.
  void end(Active& a, const Status& err = Status());
  // Runs the tower over the job's images whose span reaches position first_pos or later, into
  // their rows of job.embeds.data (engine thread; called by the generator's prefill once it knows
  // how much of the prompt it reuses, so a cached image is not encoded again).
  Status encode_images(Job& job, int64_t first_pos);
  // An idle session for the prompt: the cached one with the longest reusable prefix, a new one
  // while fewer than max_sessions exist, else the least recently used idle one.
  size_t pick_generator(const std::vector<int32_t>& prompt, const PromptEmbeddings* embeds);

  std::unique_ptr<model::Executor> ex_;
  const tokenizer::Tokenizer* tok_;
  EngineOptions opt_;
  int64_t max_context_ = 0;
  std::vector<std::unique_ptr<Generator>> gens_;  // engine thread only
  std::vector<uint16_t> span_markers_;            // engine thread only: bf16 [3, dim], fetched once
  std::vector<uint64_t> gen_last_use_;
  std::vector<bool> gen_busy_;                    // engine thread only: serving an active request
  uint64_t use_clock_ = 0;
  memory::Tier kv_tier_ = memory::Tier::kHost;    // where the executor keeps KV (the ledger's name for it)
  std::unique_ptr<memory::Ledger> kv_ledger_;     // null: no byte budget
  VerifyCostTable verify_cost_;                   // engine thread only: the first one a session measured
  bool kv_dspark_ = false;                        // sessions hold draft rings (the KV estimate counts them)
  PrefillPolicy prefill_policy_{PrefillPolicyOptions{}};  // engine thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::map<uint64_t, std::shared_ptr<std::atomic<bool>>> live_;  // queued or running
  uint64_t next_id_ = 1;
  bool stopping_ = false;
  EngineStats stats_;
  std::thread thread_;
};

// A blocking queue adapter for callers that consume events on their own thread. The sink keeps
// the state alive, so the queue may be destroyed before the engine stops calling it.
class EventQueue {
 public:
  EventQueue() : st_(std::make_shared<State>()) {}
  EventSink sink();
  // Waits up to timeout_ms for the next event; false on timeout.
  bool pop(Event* e, int timeout_ms);

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Event> q;
  };
  std::shared_ptr<State> st_;
};

}  // namespace fb::engine
