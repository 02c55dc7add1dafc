// Sampler: the per-position sampling pipeline of spec/16 §2 (temperature, top-k, softmax, top-p,
// min-p, seeded draw), raw logprobs (spec/16 §4) and the exact speculative acceptance rule of
// spec/13 §6.2. Pure functions over fp32 logits rows; no model or tokenizer knowledge. Invariant: greedy = argmax with ties to the lowest id, the
// rule the DSpark verifier shares so speculative greedy output equals plain greedy output.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <string>
#include <vector>

#include "engine/token_constraint.h"

namespace fb::engine {

// A bias on a multi-token phrase (issue 27, [policy]): while the tokens generated so far end with
// the first k tokens of `tokens` (1 <= k < size), `bias` is added to the logit of token k, the one
// that continues the phrase; a one-token phrase biases its token everywhere, like logit_bias.
// The phrase's first token is not biased on its own (so -100 bans finishing a phrase, never the
// word it starts with). Matching is on token ids: another tokenization of the same text is not
// caught.
struct PhraseBias {
  std::vector<int32_t> tokens;  // 1..kMaxPhraseTokens ids
  float bias = 0.0f;
};
constexpr int kMaxPhraseTokens = 64;

struct SamplingParams {
  float temperature = 1.0f;  // <= 0: greedy
  float top_p = 1.0f;        // (0, 1): nucleus; >= 1 off
  int top_k = 0;             // > 0: keep the k largest logits
  float min_p = 0.0f;        // > 0: drop p < min_p * p_max
  std::optional<uint64_t> seed;
  // Logit processing before every step above, greedy included (OpenAI semantics): `logit_bias`
  // adds to the raw logits of the listed ids; the penalties subtract presence_penalty once from
  // every token generated so far in this request and frequency_penalty times its count.
  std::vector<std::pair<int32_t, float>> logit_bias;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<PhraseBias> phrase_bias;  // after logit_bias, before the penalties
  // Constrained decoding (response_format): tokens the grammar does not allow get -inf before the
  // steps above, on every row the generator samples or verifies. The request's own grammar state:
  // the generator advances it as tokens are emitted (shared, never between requests).
  std::shared_ptr<TokenConstraint> constraint;
  bool greedy() const { return temperature <= 0.0f; }
  bool processes_logits() const {
    return !logit_bias.empty() || !phrase_bias.empty() || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
};

// Tokens generated so far in a request: counts (the penalties) and order (phrase bias).
using TokenCounts = std::unordered_map<int32_t, int32_t>;
struct GeneratedTokens {
  TokenCounts counts;
  std::vector<int32_t> ids;
  void add(int32_t t) {
    ++counts[t];
    ids.push_back(t);
  }
  void clear() {
    counts.clear();
    ids.clear();
  }
};
// out = logits with p's bias, phrase bias and penalties applied; `gen` then `extra` (tokens
// generated after them, e.g. the accepted drafts before a verify row) are the generated tokens. A
// row for which p.processes_logits() is false is returned unchanged (the caller may skip the copy).
void process_logits(const float* logits, int64_t n, const SamplingParams& p, const GeneratedTokens& gen, std::span<const int32_t> extra,
                    std::vector<float>* out);

// Deterministic per-request generator (xoshiro256** seeded through splitmix64), so a seeded
// request reproduces on every platform (std:: distributions are not portable).
class Rng {
 public:
  explicit Rng(uint64_t seed = 0x9E3779B97F4A7C15ull);
  uint64_t next_u64();
  double uniform();  // [0, 1), 53 random bits
  // An independent stream keyed by (this generator's seed, position, purpose), whatever has been
  // drawn from this one: speculative sampling draws from one stream per purpose and round
  // (spec/13 §6.2), so a seeded transcript reproduces.
  Rng stream(int64_t position, uint32_t purpose) const;

 private:
  uint64_t seed_;
  uint64_t s_[4];
};

// Stream purposes of a DSpark round (spec/13 §6.2), keyed by the round's anchor position.
enum RngPurpose : uint32_t { kRngDraftDraw = 1, kRngAcceptTest = 2, kRngFinalDraw = 3 };

// Index of the largest logit; ties go to the lowest id. NaN never wins.
int32_t argmax(const float* logits, int64_t n);

// The processed distribution plain sampling draws from (steps 4-9 of spec/16 §2): kept ids and
// their renormalised probabilities, in descending probability (ties: lower id first) when a
// truncation sorted them, else in id order. Greedy params give the one-hot argmax.
struct Candidates {
  std::vector<int32_t> ids;
  std::vector<double> probs;  // sums to 1
};
Candidates sampling_distribution(const float* logits, int64_t n, const SamplingParams& p);

// One draw from sampling_distribution (argmax when greedy; no random number consumed then).
int32_t sample(const float* logits, int64_t n, const SamplingParams& p, Rng& rng);

// Inverse-CDF draw from a distribution with the uniform u in [0, 1) (walks ids in stored order).
int32_t draw(const Candidates& c, double u);
// Probability of `id` under c (0 when not kept).
double prob_of(const Candidates& c, int32_t id);

// Exact speculative (rejection) sampling over one verified block (spec/13 §6.2). target[i] =
// pi_i, the processed target distribution of verify row i (i = 0..L; row i judges draft i+1);
// draft[k-1] = q_k, the distribution d_k = drafts[k-1] was drawn from (one-hot = deterministic
// proposal). Accept d_k while u_k * q_k(d_k) < pi_{k-1}(d_k) (u_k from `accept`); then the bonus
// token ~ pi_L if all L were accepted, else the residual max(0, pi_a - q_{a+1}) renormalised
// (pi_a if it is empty), drawn with one uniform from `final_draw`. The emitted tokens are
// distributed exactly as plain sampling from pi. `target` rows past the rejection are not read,
// so a caller may fill them lazily (get_target).
struct SpecVerdict {
  int64_t accepted = 0;     // a: drafts d_1..d_a kept
  int32_t next = 0;         // the token after them (bonus or residual draw)
  bool residual = false;    // next came from the residual of a rejection
};
SpecVerdict speculative_accept(int64_t L, const std::function<const Candidates&(int64_t i)>& target,
                               const std::vector<Candidates>& draft, const std::vector<int32_t>& drafts, Rng& accept,
                               Rng& final_draw);
// The residual distribution max(0, pi - q) renormalised, or pi when it is empty (spec/13 §6.2).
Candidates residual_distribution(const Candidates& pi, const Candidates& q);

// Raw model log-softmax (before temperature and truncation; spec/16 §4 default "raw").
struct TokenLogprob {
  int32_t id = 0;
  double logprob = 0;
  std::vector<std::pair<int32_t, double>> top;  // [top_n] (id, logprob), descending
};
TokenLogprob token_logprob(const float* logits, int64_t n, int32_t id, int top_n);

}  // namespace fb::engine
