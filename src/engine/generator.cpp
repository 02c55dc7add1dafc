#include "engine/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>

#include "base/check.h"
#include "base/log.h"

namespace fb::engine {

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
constexpr int64_t kTapHistoryExtra = 16;  // tap rows kept past the window, to re-seed after a rollback
}  // namespace

Generator::Generator(model::Executor& ex, GeneratorOptions opt) : ex_(&ex), opt_(opt) {
  const model::Config& c = ex.config();
  vocab_ = c.vocab_size;
  window_ = c.window_size;
  tap_w_ = int64_t(c.dspark_target_layer_ids.size()) * c.dim;
  block_ = c.dspark_block_size;
  dspark_ok_ = opt.dspark && c.n_mtp_layers > 0 && block_ > 0 && tap_w_ > 0;
  max_context_ = c.max_position_embeddings > 0 ? c.max_position_embeddings : (int64_t(1) << 20);
  if (opt.max_context > 0) max_context_ = std::min(max_context_, opt.max_context);
  if (opt_.prefill_chunk <= 0) opt_.prefill_chunk = int(ex.preferred_prefill_chunk());
  counters_.accepted_hist.assign(size_t(std::max(block_, 0) + 1), 0);
  counters_.verify_hist.assign(size_t(std::max(block_, 0) + 1), 0);
  cost_.steps_per_s = opt_.dspark_verify_sps;
  cost_.draft_s = opt_.dspark_draft_s;
  reset();
}

void DsparkCounters::add_since(const DsparkCounters& now, const DsparkCounters& before) {
  steps += now.steps - before.steps;
  proposals += now.proposals - before.proposals;
  accepted += now.accepted - before.accepted;
  verify_rows += now.verify_rows - before.verify_rows;
  sampled_steps += now.sampled_steps - before.sampled_steps;
  residual_draws += now.residual_draws - before.residual_draws;
  auto hist = [](std::vector<int64_t>& h, const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    if (h.size() < a.size()) h.resize(a.size(), 0);
    for (size_t i = 0; i < a.size(); ++i) h[i] += a[i] - (i < b.size() ? b[i] : 0);
  };
  hist(accepted_hist, now.accepted_hist, before.accepted_hist);
  hist(verify_hist, now.verify_hist, before.verify_hist);
  draft_s += now.draft_s - before.draft_s;
  verify_s += now.verify_s - before.verify_s;
  calibrate_s += now.calibrate_s - before.calibrate_s;
  backoff_steps += now.backoff_steps - before.backoff_steps;
}

void Generator::reset() {
  session_ = ex_->new_session();
  sess_ = {session_.get()};
  history_.clear();
  hist_key_.clear();
  have_logits_ = pending_ = false;
  tap_hist_.assign(dspark_ok_ ? size_t((window_ + kTapHistoryExtra) * tap_w_) : 0, 0);
  tap_hist_pos_.assign(dspark_ok_ ? size_t(window_ + kTapHistoryExtra) : 0, -1);
  reused_ = 0;
  backoff_left_ = backoff_next_ = 0;
  pf_next_ = pf_end_ = pf_planned_ = 0;
  pf_embeds_ = nullptr;
  round_ = Round{};
}

Status Generator::adopt_context(std::span<const int32_t> history, int32_t next_token) {
  FB_CHECK(!awaiting_step() && !prepared()) << "adopt_context with a round in flight";
  const int64_t H = int64_t(history.size());
  if (session_->n_pos() != H)
    return FB_ERROR(kInvalidArgument) << "the session holds " << session_->n_pos() << " positions, the history " << H;
  for (int32_t id : history)
    if (id < 0 || id >= vocab_) return FB_ERROR(kInvalidArgument) << "history token id " << id << " is outside the vocabulary";
  if (next_token >= vocab_) return FB_ERROR(kInvalidArgument) << "next token id " << next_token << " is outside the vocabulary";
  if (H + (next_token >= 0 ? 1 : 0) >= max_context_) return FB_ERROR(kResourceExhausted) << "a history of " << H << " tokens fills the context";
  history_.assign(history.begin(), history.end());
  hist_key_.clear();
  have_logits_ = false;
  pending_ = next_token >= 0;
  pending_token_ = pending_ ? next_token : 0;
  tap_.clear();  // no tap row of position H - 1: prepare_next decodes plainly first
  std::fill(tap_hist_pos_.begin(), tap_hist_pos_.end(), -1);
  reused_ = restored_ = 0;
  ckpt_upto_ = H;  // nothing of it is ours to checkpoint
  generated_.clear();
  backoff_left_ = backoff_next_ = 0;
  pf_next_ = pf_end_ = pf_planned_ = 0;
  pf_embeds_ = nullptr;
  round_ = Round{};
  return Status();
}

int64_t Generator::reusable_prefix(std::span<const int32_t> prompt, const PromptEmbeddings* embeds) const {
  int64_t c = 0;
  const int64_t n = std::min<int64_t>(int64_t(history_.size()), int64_t(prompt.size()) - 1);
  const bool keyed = embeds && embeds->key.size() == prompt.size();
  auto cached_key = [&](int64_t p) { return size_t(p) < hist_key_.size() ? hist_key_[size_t(p)] : uint64_t(0); };
  auto prompt_key = [&](int64_t p) { return keyed ? embeds->key[size_t(p)] : uint64_t(0); };
  while (c < n && history_[size_t(c)] == prompt[size_t(c)] && cached_key(c) == prompt_key(c)) ++c;
  return c;
}

Status Generator::forward_rows(const model::Step& st, model::StepOutput* out) {
  auto r = ex_->forward(st, sess_, nullptr);
  if (!r.ok()) return r.status();
  *out = std::move(r).value();
  return Status();
}

int64_t Generator::prefill_taps_from_row(int64_t rows, int64_t window) {
  return std::max<int64_t>(0, rows - (window + kTapHistoryExtra) - window);
}

void Generator::remember_taps(int64_t first_pos, const uint16_t* rows, int64_t n) {
  if (!dspark_ok_) return;
  const int64_t S = int64_t(tap_hist_pos_.size());
  for (int64_t i = std::max<int64_t>(0, n - S); i < n; ++i) {
    const int64_t p = first_pos + i, slot = p % S;
    std::copy(rows + i * tap_w_, rows + (i + 1) * tap_w_, tap_hist_.begin() + slot * tap_w_);
    tap_hist_pos_[size_t(slot)] = p;
  }
}

Status Generator::commit_taps(int64_t first_pos, const uint16_t* rows, int64_t n) {
  if (!dspark_ok_ || n <= 0) return Status();
  remember_taps(first_pos, rows, n);
  // Only the last `window` positions can still be read by a draft.
  const int64_t skip = std::max<int64_t>(0, n - window_);
  return ex_->draft_commit(*session_, first_pos + skip, rows + skip * tap_w_, n - skip);
}

namespace {

// The disk KV cache's key of a prompt: its token ids, with each image row's id replaced by a
// negative id derived from the row's content key (image hash and slot), so a stored prefix is only
// found for the same images at the same places (real ids are >= 0; a false match would need the
// 31-bit ids of every row of a different image to collide).
std::vector<int32_t> store_key(std::span<const int32_t> prompt, std::span<const uint64_t> key) {
  std::vector<int32_t> k(prompt.begin(), prompt.end());
  for (size_t p = 0; p < k.size() && p < key.size(); ++p) {
    if (key[p] == 0) continue;
    uint64_t h = key[p] * 0x9E3779B97F4A7C15ull;
    h ^= h >> 31;
    k[p] = int32_t(-1 - int64_t(h & 0x7FFFFFFF));
  }
  return k;
}
std::vector<int32_t> store_key(std::span<const int32_t> prompt, const PromptEmbeddings* e) {
  return e ? store_key(prompt, std::span<const uint64_t>(e->key)) : std::vector<int32_t>(prompt.begin(), prompt.end());
}

// A disk KV cache checkpoint as the generator stores it: the last prompt row's logits and DSpark
// tap row (so a repeated prompt needs no prefill), then the executor's session bytes.
constexpr char kCheckpointMagic[8] = {'F', 'B', 'G', 'C', 'K', 'P', 'T', '1'};

std::string pack_checkpoint(const std::vector<float>& logits, const std::vector<uint16_t>& tap, const std::string& session) {
  std::string b(kCheckpointMagic, sizeof kCheckpointMagic);
  const uint64_t nl = logits.size(), nt = tap.size();
  b.append(reinterpret_cast<const char*>(&nl), 8);
  b.append(reinterpret_cast<const char*>(logits.data()), logits.size() * 4);
  b.append(reinterpret_cast<const char*>(&nt), 8);
  b.append(reinterpret_cast<const char*>(tap.data()), tap.size() * 2);
  b += session;
  return b;
}

struct CheckpointParts {
  std::vector<float> logits;
  std::vector<uint16_t> tap;
  std::string session;
};

Status unpack_checkpoint(std::string_view b, CheckpointParts* p) {
  if (b.size() < 8 || std::memcmp(b.data(), kCheckpointMagic, 8) != 0) return FB_ERROR(kCorrupt) << "not a generator checkpoint";
  size_t at = 8;
  // A u64 count, then that many elements of T.
  auto array = [&](auto* v) -> bool {
    using T = typename std::remove_pointer_t<decltype(v)>::value_type;
    uint64_t n = 0;
    if (b.size() - at < 8) return false;
    std::memcpy(&n, b.data() + at, 8);
    at += 8;
    if (n > (b.size() - at) / sizeof(T)) return false;
    v->resize(size_t(n));
    std::memcpy(v->data(), b.data() + at, size_t(n) * sizeof(T));
    at += size_t(n) * sizeof(T);
    return true;
  };
  if (!array(&p->logits) || !array(&p->tap)) return FB_ERROR(kCorrupt) << "generator checkpoint truncated";
  p->session.assign(b.substr(at));
  return Status();
}

}  // namespace

Status Generator::prefill(std::span<const int32_t> prompt, const std::function<bool(int64_t, int64_t)>& progress,
                          const PromptEmbeddings* embeds) {
  FB_RETURN_IF_ERROR(begin_prefill(prompt, embeds));
  while (prefill_rows_left() > 0) {
    model::Step st;
    plan_prefill(opt_.prefill_chunk, 0, &st);
    model::StepOutput out;
    Status s = forward_rows(st, &out);
    if (!s.ok()) {
      reset();  // the cache may hold part of a chunk
      return s;
    }
    FB_RETURN_IF_ERROR(finish_prefill(out));
    if (progress && !progress(prefill_done(), prefill_total())) return FB_ERROR(kCancelled) << "cancelled during prefill";
  }
  return Status();
}

Status Generator::begin_prefill(std::span<const int32_t> prompt, const PromptEmbeddings* embeds) {
  FB_CHECK(!awaiting_step()) << "begin_prefill with a decode round in flight";
  pf_next_ = pf_end_ = pf_planned_ = 0;  // nothing to prefill until the prompt is accepted
  const int64_t N = int64_t(prompt.size());
  if (N == 0) return FB_ERROR(kInvalidArgument) << "empty prompt";
  backoff_left_ = backoff_next_ = 0;  // a new prompt: draft again from its first round
  generated_.clear();                 // a new request: the penalties count its own tokens only
  const int64_t dim = ex_->config().dim;
  if (embeds && (embeds->row.size() != prompt.size() || embeds->key.size() != prompt.size()))
    return FB_ERROR(kInvalidArgument) << "prompt embeddings cover " << embeds->row.size() << " positions, the prompt has " << N;
  if (embeds)
    for (int32_t r : embeds->row)
      if (r >= 0 && int64_t(r + 1) * dim > int64_t(embeds->data.size()))
        return FB_ERROR(kInvalidArgument) << "prompt embedding row " << r << " is outside the embeddings";
  for (int32_t id : prompt)
    if (id < 0 || id >= vocab_)
      return FB_ERROR(kInvalidArgument) << "prompt token id " << id << " is outside the model's vocabulary of " << vocab_
                                        << " (does the tokenizer belong to this model?)";
  if (N >= max_context_)
    return FB_ERROR(kResourceExhausted) << "the prompt has " << N << " tokens; the context holds " << max_context_
                                        << " (prompt + at least one generated token)";
  // Prefix reuse: keep what the cache already holds when it can roll back to the divergence.
  int64_t c = reusable_prefix(prompt, embeds);
  if (c < int64_t(history_.size())) {
    // A rollback can be refused when a slot it needs was reused (a window row, or an odd
    // position's pending compressor tail): one position less may still be fine, else start over.
    bool rolled = c > 0 && session_->rollback(c).ok();
    if (!rolled && c > 1 && session_->rollback(c - 1).ok()) {
      rolled = true;
      --c;
    }
    if (!rolled) {
      reset();
      c = 0;
    } else {
      history_.resize(size_t(c));
      // Positions >= c written to the draft rings evicted older slots: re-seed the window.
      if (dspark_ok_) {
        const int64_t S = int64_t(tap_hist_pos_.size());
        for (int64_t q = std::max<int64_t>(0, c - window_); q < c; ++q) {
          if (tap_hist_pos_[size_t(q % S)] != q) continue;
          FB_RETURN_IF_ERROR(ex_->draft_commit(*session_, q, &tap_hist_[size_t((q % S) * tap_w_)], 1));
        }
      }
    }
  }
  // Disk KV cache: a longer stored prefix of the prompt (images matched by content, store_key)
  // replaces the in-memory reuse. The restore validates the bytes before it touches the session; a
  // refused one is logged and the prompt runs as it would without the store.
  restored_ = 0;
  std::vector<float> restored_logits;  // a checkpoint of the whole prompt: its last row's logits
  if (opt_.kv_store && c < N) {
    const std::vector<int32_t> key = store_key(prompt, embeds);
    auto hit = opt_.kv_store->longest_prefix(key, N);
    CheckpointParts parts;
    Status r = hit ? unpack_checkpoint(hit->state, &parts) : Status();
    if (hit && r.ok() && hit->tokens == N && parts.logits.empty()) {
      // a conversation checkpoint (no logits row) of exactly this prompt: the longest shorter one
      hit = opt_.kv_store->longest_prefix(key, N - 1);
      parts = CheckpointParts{};
      r = hit ? unpack_checkpoint(hit->state, &parts) : Status();
    }
    if (hit && hit->tokens > c) {
      if (r.ok() && hit->tokens == N && (int64_t(parts.logits.size()) != vocab_ || (dspark_ok_ && int64_t(parts.tap.size()) != tap_w_)))
        r = FB_ERROR(kCorrupt) << "the checkpoint of the whole prompt lacks its logits or tap row";
      if (r.ok()) r = ex_->restore_session(*session_, parts.session);
      if (r.ok()) {
        c = hit->tokens;
        restored_ = c;
        history_.assign(prompt.begin(), prompt.begin() + c);
        std::fill(tap_hist_pos_.begin(), tap_hist_pos_.end(), -1);  // the draft rings came with the state
        if (c == N) {
          restored_logits = std::move(parts.logits);
          tap_ = std::move(parts.tap);
        }
      } else {
        FB_LOG(kWarn) << "kv cache: could not restore a " << hit->tokens << "-token prefix: " << r.to_string();
      }
    }
  }
  reused_ = c;
  // Positions < c are reused and agree with the new prompt's keys, so the state stays consistent
  // when prepare fails (nothing of the new prompt has run yet).
  if (embeds && embeds->prepare) FB_RETURN_IF_ERROR(embeds->prepare(c));
  if (embeds) hist_key_ = embeds->key;
  else hist_key_.clear();
  have_logits_ = pending_ = false;
  // Bounded replay: the new rows before the last `window` positions stop after the encoder.
  // When the cached prefix already covers them there is nothing to skip and prefill is exact.
  int64_t replay = 0;
  if (opt_.prefill_replay) {
    if (!ex_->supports_bounded_replay()) return FB_ERROR(kUnsupported) << "the " << ex_->name() << " executor does not run bounded-replay prefill";
    if (N - window_ > c) replay = N - window_;
  }
  pf_prompt_.assign(prompt.begin(), prompt.end());
  pf_embeds_ = embeds;
  pf_replay_ = replay;
  pf_next_ = c;
  pf_end_ = N;
  if (c == N && !restored_logits.empty()) {  // the whole prompt came from the disk KV cache
    logits_ = std::move(restored_logits);
    have_logits_ = true;
  }
  if (c == N) complete_prefill();
  return Status();
}


void Generator::plan_prefill(int64_t max_rows, int session, model::Step* st) {
  for (const model::Row& r : st->rows) FB_CHECK(r.kind == model::RowKind::kPrefill) << "prefill rows come before decode rows";
  const bool opens = st->rows.empty();
  FB_CHECK_GT(prefill_rows_left(), 0);
  const int64_t dim = ex_->config().dim, N = pf_end_, s0 = pf_next_, s1 = std::min(N, s0 + std::max<int64_t>(1, max_rows));
  const PromptEmbeddings* embeds = pf_embeds_;
  for (int64_t p = s0; p < s1; ++p) {
    model::Row r = model::prefill_row(p, pf_prompt_[size_t(p)], N, pf_replay_);
    r.session = session;
    if (embeds && embeds->row[size_t(p)] >= 0) {  // an image row (spec/14 §6)
      r.image = true;
      r.embed_row = int32_t(st->embeddings.size() / size_t(dim));
      const auto* e = &embeds->data[size_t(embeds->row[size_t(p)]) * size_t(dim)];
      st->embeddings.insert(st->embeddings.end(), e, e + dim);
    }
    st->rows.push_back(r);
  }
  // Only the chunk's last rows' taps are kept (remember_taps / commit_taps in finish_prefill).
  if (opens) st->taps_from_row = prefill_taps_from_row(s1 - s0, window_);
  pf_planned_ = s1 - s0;
}

Status Generator::finish_prefill(const model::StepOutput& out) {
  FB_CHECK_GT(pf_planned_, 0) << "finish_prefill without planned rows";
  const int64_t N = pf_end_, s0 = pf_next_, s1 = s0 + pf_planned_;
  pf_planned_ = 0;
  history_.insert(history_.end(), pf_prompt_.begin() + s0, pf_prompt_.begin() + s1);
  pf_next_ = s1;
  if (dspark_ok_) {
    const int64_t have = s0 + out.taps_first_row;  // the first row with tap values
    FB_CHECK_EQ(int64_t(out.taps.size()), (s1 - have) * tap_w_);
    // Rows that left at the encoder have no tap rows of decoder layers: commit replayed rows only.
    const int64_t first = std::max({s0, pf_replay_, have});
    if (first < s1) {
      FB_RETURN_IF_ERROR(commit_taps(first, out.taps.data() + (first - have) * tap_w_, s1 - first));
      tap_.assign(out.taps.end() - tap_w_, out.taps.end());
    }
  }
  if (s1 == N) {
    FB_CHECK_EQ(int64_t(out.logits.size()), vocab_);
    logits_ = out.logits;
    have_logits_ = true;
    complete_prefill();
  }
  return Status();
}

void Generator::checkpoint_history(int64_t max_positions) {
  const int64_t P = int64_t(history_.size());
  if (!opt_.kv_store || awaiting_step() || P <= ckpt_upto_ || P == 0 || P > max_positions) return;
  auto state = ex_->save_session(*session_);
  if (!state.ok()) {
    if (state.status().code() != StatusCode::kUnsupported) FB_LOG(kWarn) << "kv cache: conversation state not saved: " << state.status().to_string();
    return;
  }
  // The executor's state must cover exactly the history (docs/formats.md: i64 position at byte 24).
  int64_t pos = -1;
  if (state->size() >= 32) std::memcpy(&pos, state->data() + 24, 8);
  if (pos != P) {
    FB_LOG(kWarn) << "kv cache: the session holds " << pos << " positions, the history " << P << "; no checkpoint";
    return;
  }
  // No logits row: this checkpoint serves longer prompts (the next turn), never this exact one.
  Status st = opt_.kv_store->put(store_key(history_, std::span<const uint64_t>(hist_key_)), pack_checkpoint({}, {}, *state));
  if (st.ok()) ckpt_upto_ = P;
  else FB_LOG(kWarn) << "kv cache: checkpoint of " << P << " positions not stored: " << st.to_string();
}

void Generator::complete_prefill() {
  const int64_t N = pf_end_;
  ckpt_upto_ = N;  // the prompt's own checkpoint (below, or the one it was restored from)
  // Disk KV cache: the prompt's state (with its last logits and tap row, so the same prompt needs
  // no prefill at all) for the next request that starts with it (image rows keyed by content,
  // store_key; a store error costs the checkpoint, never the request).
  if (opt_.kv_store && N > restored_) {
    auto state = ex_->save_session(*session_);
    Status st = state.ok() ? opt_.kv_store->put(store_key(pf_prompt_, pf_embeds_),
                                                pack_checkpoint(logits_, dspark_ok_ ? tap_ : std::vector<uint16_t>{}, *state))
                           : state.status();
    if (!st.ok() && st.code() != StatusCode::kUnsupported) FB_LOG(kWarn) << "kv cache: checkpoint of " << N << " tokens not stored: " << st.to_string();
  }
  pf_embeds_ = nullptr;  // the caller's rows are not read after the prefill
}

model::StepOutput rows_of(const model::StepOutput& all, int64_t n_step_rows, int64_t first_row, int64_t n_rows, int64_t vocab,
                          int64_t tap_w) {
  model::StepOutput o;
  const int64_t end = first_row + n_rows;
  if (!all.logits.empty()) o.logits.reserve(size_t(std::min<int64_t>(int64_t(all.logit_rows.size()), n_rows) * vocab));
  for (size_t i = 0; i < all.logit_rows.size(); ++i) {
    const int r = all.logit_rows[i];
    if (r < first_row || r >= end) continue;
    o.logit_rows.push_back(int(r - first_row));
    if (i < all.argmax.size()) o.argmax.push_back(all.argmax[i]);
    if (!all.logits.empty()) o.logits.insert(o.logits.end(), all.logits.begin() + int64_t(i) * vocab, all.logits.begin() + int64_t(i + 1) * vocab);
  }
  const int64_t tfr = std::min(all.taps_first_row, n_step_rows);
  if (tap_w > 0 && int64_t(all.taps.size()) == (n_step_rows - tfr) * tap_w) {
    const int64_t from = std::max(first_row, tfr);
    o.taps_first_row = from - first_row;
    if (from < end) o.taps.assign(all.taps.begin() + (from - tfr) * tap_w, all.taps.begin() + (end - tfr) * tap_w);
  } else {
    o.taps_first_row = n_rows;
  }
  return o;
}

const float* Generator::processed_row(const float* row, const SamplingParams& sp, std::span<const int32_t> extra) {
  if (!sp.processes_logits() && !sp.constraint) return row;
  if (sp.processes_logits()) process_logits(row, vocab_, sp, generated_, extra, &processed_);
  else processed_.assign(row, row + vocab_);
  if (sp.constraint) {
    // spec/16 §2 step 1: disallowed ids to -inf (exp gives 0; argmax never picks them while one
    // allowed id is finite, and the grammar always allows one: EOS once the value is complete).
    sp.constraint->allowed(extra, &allowed_);
    FB_CHECK_GE(int64_t(allowed_.size()) * 32, vocab_);
    const float ninf = -std::numeric_limits<float>::infinity();
    for (int64_t w = 0; w * 32 < vocab_; ++w) {
      const uint32_t m = allowed_[size_t(w)];
      if (m == 0xffffffffu) continue;
      if (m == 0) {  // most words of a number or punctuation state
        std::fill(processed_.begin() + w * 32, processed_.begin() + std::min<int64_t>(vocab_, w * 32 + 32), ninf);
        continue;
      }
      for (int64_t t = w * 32; t < std::min<int64_t>(vocab_, w * 32 + 32); ++t)
        if (!((m >> (t - w * 32)) & 1u)) processed_[size_t(t)] = ninf;
    }
  }
  return processed_.data();
}

Status Generator::constrain_emitted(const SamplingParams& sp, std::span<const int32_t> toks) {
  if (!sp.constraint) return Status();
  for (int32_t t : toks)
    if (!sp.constraint->accept(t)) return FB_ERROR(kInternal) << "token " << t << " was emitted but the response format does not allow it";
  return Status();
}

Status Generator::emit_from_logits(const SamplingParams& sp, Rng& rng, std::vector<int32_t>* out, std::vector<TokenLogprob>* lp,
                                   int top_n, const float* row) {
  const float* x = row ? row : logits_.data();
  const int32_t t = sample(processed_row(x, sp), vocab_, sp, rng);
  FB_RETURN_IF_ERROR(constrain_emitted(sp, std::span<const int32_t>(&t, 1)));
  if (lp && top_n >= 0) lp->push_back(token_logprob(x, vocab_, t, top_n));  // raw logprobs (spec/16 §4)
  return emit_checked(t, out);
}

Status Generator::emit_token(const SamplingParams& sp, int32_t t, std::vector<int32_t>* out) {
  FB_RETURN_IF_ERROR(constrain_emitted(sp, std::span<const int32_t>(&t, 1)));
  return emit_checked(t, out);
}

Status Generator::emit_checked(int32_t t, std::vector<int32_t>* out) {
  generated_.add(t);
  out->push_back(t);
  pending_ = true;
  pending_token_ = t;
  have_logits_ = false;
  return Status();
}

Status Generator::next(const SamplingParams& sp, Rng& rng, std::vector<int32_t>* out, std::vector<TokenLogprob>* lp, int top_n) {
  model::Step st;
  FB_RETURN_IF_ERROR(plan_next(sp, rng, 0, &st, out, lp, top_n));
  if (!awaiting_step()) return Status();
  st.logits_to_host = reads_logit_rows(sp, lp && top_n >= 0) || has_prefill_rows(st);
  model::StepOutput o;
  Status s = forward_rows(st, &o);
  if (!s.ok()) {
    round_ = Round{};
    return s;
  }
  return finish_next(o, sp, rng, out, lp, top_n);
}

Status Generator::plan_next(const SamplingParams& sp, Rng& rng, int session, model::Step* st, std::vector<int32_t>* out,
                            std::vector<TokenLogprob>* lp, int top_n) {
  FB_RETURN_IF_ERROR(prepare_next(sp, rng, out, lp, top_n));
  if (!prepared()) return Status();  // emitted from the logits a prefill left
  if (const model::DraftJob* j = draft_job()) {
    std::vector<Result<model::DraftOutput>> d = ex_->draft_many({*j});
    FB_CHECK_EQ(d.size(), 1u);
    return plan_drafted(sp, session, st, &d[0]);
  }
  return plan_drafted(sp, session, st, nullptr);
}

Status Generator::prepare_next(const SamplingParams& sp, Rng& rng, std::vector<int32_t>* out, std::vector<TokenLogprob>* lp,
                               int top_n) {
  FB_CHECK(have_logits_ || pending_) << "Generator::next before prefill";
  FB_CHECK(!awaiting_step() && !prepared()) << "plan_next with a round in flight";
  if (have_logits_) return emit_from_logits(sp, rng, out, lp, top_n);
  // The pending token goes to position H; it must fit, and so must the token it predicts.
  const int64_t H = int64_t(history_.size());
  if (H + 1 >= max_context_) return FB_ERROR(kResourceExhausted) << "context limit of " << max_context_ << " tokens reached";
  // spec/13 §5: drafting at p = H-1 needs p >= 1 (a one-token prompt decodes plainly first).
  // (A history adopted without its last tap row, adopt_context, decodes plainly first.)
  if (dspark_ok_ && H >= 2 && H + 2 < max_context_ && int64_t(tap_.size()) == tap_w_) {
    if (backoff_left_ <= 0) return prepare_draft(sp, rng);
    --backoff_left_;
    ++counters_.backoff_steps;
  }
  round_ = Round{};
  round_.prep = Round::Prep::kPlain;
  return Status();
}

Status Generator::plan_drafted(const SamplingParams& sp, int session, model::Step* st, Result<model::DraftOutput>* drafted) {
  const Round::Prep prep = round_.prep;
  FB_CHECK(prep != Round::Prep::kNone) << "plan_drafted without prepare_next";
  round_.prep = Round::Prep::kNone;
  if (prep == Round::Prep::kPlain) {
    plan_plain(session, st);
    return Status();
  }
  FB_CHECK(drafted != nullptr) << "a drafting round without its draft";
  if (!drafted->ok()) {
    const Status err = drafted->status();
    round_ = Round{};
    return err;
  }
  round_.d = std::move(*drafted).value();
  return plan_verify(sp, session, st);
}

Status Generator::finish_next(const model::StepOutput& o, const SamplingParams& sp, Rng& rng, std::vector<int32_t>* out,
                              std::vector<TokenLogprob>* lp, int top_n) {
  const Round::Kind k = round_.kind;
  FB_CHECK(k != Round::Kind::kNone) << "finish_next without a planned round";
  Status s = k == Round::Kind::kPlain ? finish_plain(o, sp, rng, out, lp, top_n) : finish_dspark(o, sp, rng, out, lp, top_n);
  round_ = Round{};
  return s;
}

void Generator::plan_plain(int session, model::Step* st) {
  model::Row r = model::decode_row(int64_t(history_.size()), pending_token_);
  r.session = session;
  st->rows.push_back(r);
  round_.kind = Round::Kind::kPlain;
}

Status Generator::finish_plain(const model::StepOutput& o, const SamplingParams& sp, Rng& rng, std::vector<int32_t>* out,
                               std::vector<TokenLogprob>* lp, int top_n) {
  const int64_t H = int64_t(history_.size());
  const bool rows = !o.logits.empty();  // else the step returned only the row's argmax (Step::logits_to_host)
  FB_CHECK(rows ? int64_t(o.logits.size()) == vocab_ : o.argmax.size() == 1 && !reads_logit_rows(sp, lp && top_n >= 0))
      << "decode row without its logits";
  history_.push_back(pending_token_);
  pending_ = false;
  if (dspark_ok_) {
    FB_CHECK(o.taps_first_row == 0 && int64_t(o.taps.size()) == tap_w_) << "decode row without its tap row";
    FB_RETURN_IF_ERROR(commit_taps(H, o.taps.data(), 1));
    tap_ = o.taps;
  }
  if (!rows) return emit_token(sp, o.argmax[0], out);
  return emit_from_logits(sp, rng, out, lp, top_n, o.logits.data());  // straight from the step's row (no copy)
}

Status Generator::calibrate_verify_cost() {
  FB_CHECK(pending_) << "calibrate_verify_cost needs an emitted token not yet fed";
  const int64_t H = int64_t(history_.size()), rows_max = block_ + 1;
  if (H + rows_max >= max_context_) {
    cost_ = VerifyCostTable::flat(rows_max);
    return Status();
  }
  const double t0 = now_s();
  std::vector<double> best(size_t(rows_max), std::numeric_limits<double>::infinity());
  const int reps = std::max(1, opt_.dspark_calibrate_reps);
  for (int rep = -1; rep < reps; ++rep) {  // rep -1: one untimed row warms up (lazy allocations, caches)
    for (int64_t n = 1; n <= (rep < 0 ? 1 : rows_max); ++n) {
      model::Step st;
      for (int64_t i = 0; i < n; ++i) st.rows.push_back(model::decode_row(H + i, pending_token_));
      model::StepOutput o;
      const double a = now_s();
      FB_RETURN_IF_ERROR(forward_rows(st, &o));
      const double dt = now_s() - a;
      FB_RETURN_IF_ERROR(session_->rollback(H));
      if (rep >= 0) best[size_t(n - 1)] = std::min(best[size_t(n - 1)], dt);
    }
  }
  cost_.steps_per_s.resize(size_t(rows_max));
  for (int64_t n = 0; n < rows_max; ++n) cost_.steps_per_s[size_t(n)] = 1.0 / std::max(best[size_t(n)], 1e-9);
  // The draft block at the same position (its ring write of H-1 repeats the committed row: same
  // bytes), so the back-off rule can weigh drafting's own cost.
  double draft_best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < reps; ++rep) {
    const double a = now_s();
    auto d = ex_->draft(*session_, pending_token_, tap_.data(), H - 1);
    if (!d.ok()) return d.status();
    draft_best = std::min(draft_best, now_s() - a);
  }
  cost_.draft_s = draft_best;
  counters_.calibrate_s += now_s() - t0;
  return Status();
}

int64_t Generator::verify_len(const model::DraftOutput& d, bool greedy, std::vector<double>* survival) const {
  const int64_t drafted = std::min<int64_t>(int64_t(d.ids.size()) - 1, block_);
  if (opt_.dspark_verify >= 0) return std::min<int64_t>(opt_.dspark_verify, drafted);
  // Missing confidences count as c = 1 (full block).
  std::vector<float> z(size_t(std::max<int64_t>(drafted, 0)), NAN);
  std::copy_n(d.confidence.begin(), std::min(z.size(), d.confidence.size()), z.begin());
  std::vector<double> S = dspark_survival(z, opt_.dspark_sts_temps);
  const int64_t L = choose_verify_len(S, cost_, int(drafted), greedy ? ScheduleRule::kArgmax : ScheduleRule::kEarlyStop);
  if (survival) *survival = std::move(S);
  return L;
}

Status Generator::prepare_draft(const SamplingParams& sp, Rng& rng) {
  if (opt_.dspark_verify < 0 && cost_.empty()) FB_RETURN_IF_ERROR(calibrate_verify_cost());
  const bool greedy = sp.greedy();
  const int64_t p = int64_t(history_.size()) - 1;
  Round& rd = round_;
  rd = Round{};
  rd.prep = Round::Prep::kDraft;
  rd.anchor = pending_token_;
  rd.t0 = now_s();
  // DRAFT (spec/13 §4): ring write of p from g(p), then a block [anchor, d1..dB]. Sampled
  // requests draw the chain from q_k = their own transform of the corrected rows (§4.6, §6.3).
  // The draft runs in draft_many, beside the other sessions' drafts of the round; the verify rows
  // join the shared step. rd.chain: drafts drawn so far (the penalties and the grammar count
  // them, as the target will).
  rd.job.session = session_.get();
  rd.job.anchor = rd.anchor;
  rd.job.tap_row = tap_.data();
  rd.job.p = p;
  if (greedy && !sp.constraint) {
    rd.job.want_logits = false;  // verification reads the target's rows, never the draft's
    return Status();
  }
  if (greedy) {
    // Under a grammar the greedy proposals are the argmax of the MASKED draft rows: exactness
    // never depends on the proposals (verification masks the target rows), acceptance does.
    rd.pick = [this, &sp](int64_t, const float* row) {
      round_.chain.push_back(argmax(processed_row(row, sp, round_.chain), vocab_));
      return round_.chain.back();
    };
  } else {
    rd.draws = rng.stream(p + 1, kRngDraftDraw);
    rd.pick = [this, &sp](int64_t k, const float* row) {
      Round& r = round_;
      FB_CHECK_EQ(k, int64_t(r.q.size()) + 1);
      r.q.push_back(sampling_distribution(processed_row(row, sp, r.chain), vocab_, sp));
      r.chain.push_back(draw(r.q.back(), r.draws.uniform()));
      return r.chain.back();
    };
  }
  rd.job.pick = &rd.pick;
  return Status();
}

Status Generator::plan_verify(const SamplingParams& sp, int session, model::Step* st) {
  const bool greedy = sp.greedy();
  const int64_t p = int64_t(history_.size()) - 1;
  Round& rd = round_;
  const model::DraftOutput& d = rd.d;
  rd.t1 = now_s();
  // SCHEDULE (spec/13 §7): from the confidences and the cost table only, before any acceptance
  // draw; rows p+1..p+1+L must fit the context.
  std::vector<double> S;
  int64_t L = verify_len(d, greedy, &S);
  L = std::min<int64_t>(L, max_context_ - (p + 2) - 1);
  L = std::max<int64_t>(L, 0);
  // Back-off ([policy], exact either way): when this round's drafts do not pay for the draft
  // block, the next rounds decode plainly (1, 2, 4, ... steps), probing again after them.
  if (opt_.dspark_verify < 0 && opt_.dspark_max_backoff > 0) {
    if (drafting_pays(S, cost_, int(L))) {
      backoff_next_ = 0;
    } else {
      backoff_next_ = std::min(opt_.dspark_max_backoff, std::max(1, 2 * backoff_next_));
      backoff_left_ = backoff_next_;
    }
  }
  if (!greedy) FB_CHECK_GE(int64_t(rd.q.size()), L);
  // VERIFY: one target step over [anchor, d1..dL], decode rows (same arithmetic as plain decode).
  for (int64_t i = 0; i <= L; ++i) {
    model::Row r = model::decode_row(p + 1 + i, i == 0 ? rd.anchor : d.ids[size_t(i)]);
    r.session = session;
    st->rows.push_back(r);
  }
  rd.L = L;
  rd.kind = Round::Kind::kVerify;
  return Status();
}

Status Generator::finish_dspark(const model::StepOutput& o, const SamplingParams& sp, Rng& rng, std::vector<int32_t>* out,
                                std::vector<TokenLogprob>* lp, int top_n) {
  const bool greedy = sp.greedy();
  const int64_t H = int64_t(history_.size()), p = H - 1, L = round_.L;
  const int32_t anchor = round_.anchor;
  const model::DraftOutput& d = round_.d;
  // In a shared step this is the time from the draft's end to here: the step and the other
  // sessions' drafts included.
  const double t2 = now_s();
  const bool rows = !o.logits.empty();  // else only the rows' argmax (Step::logits_to_host)
  FB_CHECK(rows ? int64_t(o.logits.size()) == (L + 1) * vocab_
                : int64_t(o.argmax.size()) == L + 1 && !reads_logit_rows(sp, lp && top_n >= 0))
      << "verify rows without their logits";
  FB_CHECK(o.taps_first_row == 0 && int64_t(o.taps.size()) == (L + 1) * tap_w_) << "verify rows without their tap rows";
  // ACCEPT (spec/13 §6): greedy = prefix of drafts equal to the target's argmax, then one more
  // token; sampled = rejection sampling against the processed target rows pi_i.
  int64_t a = 0;
  int32_t t_next = 0;
  // Verify row i predicts the token after d_1..d_i: with bias or penalties its processed row counts
  // them as generated (so the accepted tokens are exactly what plain decoding would emit).
  auto target_row = [&](int64_t i) {
    return processed_row(&o.logits[size_t(i * vocab_)], sp, std::span<const int32_t>(d.ids.data() + 1, size_t(i)));
  };
  if (greedy) {
    auto best = [&](int64_t i) { return rows ? argmax(target_row(i), vocab_) : o.argmax[size_t(i)]; };
    while (a < L && d.ids[size_t(a + 1)] == best(a)) ++a;
    t_next = best(a);
  } else {
    std::vector<std::optional<Candidates>> pi(size_t(L + 1));
    auto target = [&](int64_t i) -> const Candidates& {
      if (!pi[size_t(i)]) pi[size_t(i)] = sampling_distribution(target_row(i), vocab_, sp);
      return *pi[size_t(i)];
    };
    const std::vector<int32_t> drafts(d.ids.begin() + 1, d.ids.begin() + 1 + L);
    Rng accept = rng.stream(p + 1, kRngAcceptTest), final_draw = rng.stream(p + 1, kRngFinalDraw);
    const SpecVerdict v = speculative_accept(L, target, round_.q, drafts, accept, final_draw);
    a = v.accepted;
    t_next = v.next;
    ++counters_.sampled_steps;
    counters_.residual_draws += v.residual;
  }
  const float* last = rows ? &o.logits[size_t(a * vocab_)] : nullptr;  // (logprobs imply rows)
  {
    std::vector<int32_t> emitted(d.ids.begin() + 1, d.ids.begin() + 1 + a);
    emitted.push_back(t_next);
    FB_RETURN_IF_ERROR(constrain_emitted(sp, emitted));
  }
  // COMMIT: keep positions p+1..p+1+a, roll back the rest (exact for the <= B rejected rows,
  // spec/13 §6.5), feed the kept taps to the rings.
  if (a < L) FB_RETURN_IF_ERROR(session_->rollback(p + 2 + a));
  history_.push_back(anchor);
  for (int64_t i = 1; i <= a; ++i) history_.push_back(d.ids[size_t(i)]);
  FB_RETURN_IF_ERROR(commit_taps(p + 1, o.taps.data(), a + 1));
  tap_.assign(o.taps.begin() + a * tap_w_, o.taps.begin() + (a + 1) * tap_w_);
  for (int64_t i = 1; i <= a; ++i) {
    out->push_back(d.ids[size_t(i)]);
    if (lp && top_n >= 0) lp->push_back(token_logprob(&o.logits[size_t((i - 1) * vocab_)], vocab_, d.ids[size_t(i)], top_n));
  }
  out->push_back(t_next);
  if (lp && top_n >= 0) lp->push_back(token_logprob(last, vocab_, t_next, top_n));
  for (int64_t i = 1; i <= a; ++i) generated_.add(d.ids[size_t(i)]);
  generated_.add(t_next);
  pending_token_ = t_next;
  pending_ = true;
  have_logits_ = false;
  ++counters_.steps;
  counters_.proposals += L;
  counters_.accepted += a;
  counters_.verify_rows += L + 1;
  ++counters_.accepted_hist[size_t(a)];
  ++counters_.verify_hist[size_t(L)];
  counters_.draft_s += round_.t1 - round_.t0;
  counters_.verify_s += t2 - round_.t1;
  return Status();
}

}  // namespace fb::engine
