// Sampler: the per-position sampling pipeline of spec/16 §2 (temperature, top-k, softmax, top-p,
// min-p, seeded draw) and raw logprobs (spec/16 §4). Pure functions over one fp32 logits row;
// no model or tokenizer knowledge. Invariant: greedy = argmax with ties to the lowest id, the
// rule the DSpark verifier shares so speculative greedy output equals plain greedy output.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fb::engine {

struct SamplingParams {
  float temperature = 1.0f;  // <= 0: greedy
  float top_p = 1.0f;        // (0, 1): nucleus; >= 1 off
  int top_k = 0;             // > 0: keep the k largest logits
  float min_p = 0.0f;        // > 0: drop p < min_p * p_max
  std::optional<uint64_t> seed;
  bool greedy() const { return temperature <= 0.0f; }
};

// Deterministic per-request generator (xoshiro256** seeded through splitmix64), so a seeded
// request reproduces on every platform (std:: distributions are not portable).
class Rng {
 public:
  explicit Rng(uint64_t seed = 0x9E3779B97F4A7C15ull);
  uint64_t next_u64();
  double uniform();  // [0, 1), 53 random bits

 private:
  uint64_t s_[4];
};

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

// Raw model log-softmax (before temperature and truncation; spec/16 §4 default "raw").
struct TokenLogprob {
  int32_t id = 0;
  double logprob = 0;
  std::vector<std::pair<int32_t, double>> top;  // [top_n] (id, logprob), descending
};
TokenLogprob token_logprob(const float* logits, int64_t n, int32_t id, int top_n);

}  // namespace fb::engine
