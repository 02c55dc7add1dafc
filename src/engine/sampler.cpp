#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "model/step.h"

namespace fb::engine {

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// Descending by value, ties to the lower id: the one order every truncation step uses.
struct ByValueDesc {
  const std::vector<double>* v;
  const std::vector<int32_t>* ids;
  bool operator()(size_t a, size_t b) const {
    if ((*v)[a] != (*v)[b]) return (*v)[a] > (*v)[b];
    return (*ids)[a] < (*ids)[b];
  }
};
}  // namespace

Rng::Rng(uint64_t seed) : seed_(seed) {
  uint64_t x = seed;
  for (auto& s : s_) s = splitmix64(x);
}

Rng Rng::stream(int64_t position, uint32_t purpose) const {
  // Chain the key parts through splitmix64 so nearby (position, purpose) pairs land far apart.
  uint64_t x = seed_ ^ 0x6A09E667F3BCC909ull;
  uint64_t k = splitmix64(x);
  x = k ^ uint64_t(position);
  k = splitmix64(x);
  x = k ^ (uint64_t(purpose) << 32 | 0x5bd1e995u);
  return Rng(splitmix64(x));
}

uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return double(next_u64() >> 11) * 0x1.0p-53; }

int32_t argmax(const float* x, int64_t n) { return model::logits_argmax(x, n); }

Candidates sampling_distribution(const float* logits, int64_t n, const SamplingParams& p) {
  Candidates c;
  if (p.greedy()) {
    c.ids = {argmax(logits, n)};
    c.probs = {1.0};
    return c;
  }
  // Step 4: temperature (fp32 logits, the scaled values kept in double for the softmax).
  std::vector<double> z;
  z.reserve(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(logits[i]) || logits[i] == -INFINITY) continue;
    c.ids.push_back(int32_t(i));
    z.push_back(double(logits[i]) / double(p.temperature));
  }
  if (c.ids.empty()) {  // every logit masked: fall back to argmax rather than divide by zero
    c.ids = {argmax(logits, n)};
    c.probs = {1.0};
    return c;
  }
  std::vector<size_t> order(c.ids.size());
  std::iota(order.begin(), order.end(), 0);
  bool sorted = false;
  auto apply_order = [&](size_t keep) {
    std::vector<int32_t> ids(keep);
    std::vector<double> zz(keep);
    for (size_t i = 0; i < keep; ++i) {
      ids[i] = c.ids[order[i]];
      zz[i] = z[order[i]];
    }
    c.ids = std::move(ids);
    z = std::move(zz);
    order.resize(keep);
    std::iota(order.begin(), order.end(), 0);
  };
  // Step 5: top-k.
  if (p.top_k > 0 && size_t(p.top_k) < c.ids.size()) {
    const size_t k = size_t(p.top_k);
    std::partial_sort(order.begin(), order.begin() + ptrdiff_t(k), order.end(), ByValueDesc{&z, &c.ids});
    apply_order(k);
    sorted = true;
  }
  // Step 6: softmax.
  const double zmax = *std::max_element(z.begin(), z.end());
  double sum = 0;
  for (double& v : z) sum += (v = std::exp(v - zmax));
  for (double& v : z) v /= sum;
  // Step 7: top-p, shortest descending prefix with mass >= top_p (the first always kept).
  if (p.top_p > 0.0f && p.top_p < 1.0f) {
    if (!sorted) {
      std::sort(order.begin(), order.end(), ByValueDesc{&z, &c.ids});
      apply_order(order.size());
      sorted = true;
    }
    double acc = 0;
    size_t keep = 0;
    while (keep < z.size()) {
      acc += z[keep++];
      if (acc >= double(p.top_p)) break;
    }
    order.resize(keep);
    apply_order(keep);
  }
  // Step 8: min-p relative to the most likely kept token.
  if (p.min_p > 0.0f) {
    const double pmax = *std::max_element(z.begin(), z.end());
    std::vector<int32_t> ids;
    std::vector<double> zz;
    for (size_t i = 0; i < z.size(); ++i)
      if (z[i] >= double(p.min_p) * pmax) {
        ids.push_back(c.ids[i]);
        zz.push_back(z[i]);
      }
    c.ids = std::move(ids);
    z = std::move(zz);
  }
  // Step 9: renormalise.
  sum = std::accumulate(z.begin(), z.end(), 0.0);
  for (double& v : z) v /= sum;
  c.probs = std::move(z);
  return c;
}

int32_t draw(const Candidates& c, double u) {
  double acc = 0;
  for (size_t i = 0; i < c.ids.size(); ++i) {
    acc += c.probs[i];
    if (u < acc) return c.ids[i];
  }
  // Rounding left u above the last partial sum: the last id with mass.
  for (size_t i = c.ids.size(); i-- > 0;)
    if (c.probs[i] > 0) return c.ids[i];
  return c.ids.back();
}

int32_t sample(const float* logits, int64_t n, const SamplingParams& p, Rng& rng) {
  if (p.greedy()) return argmax(logits, n);
  return draw(sampling_distribution(logits, n, p), rng.uniform());
}

double prob_of(const Candidates& c, int32_t id) {
  for (size_t i = 0; i < c.ids.size(); ++i)
    if (c.ids[i] == id) return c.probs[i];
  return 0.0;
}

Candidates residual_distribution(const Candidates& pi, const Candidates& q) {
  // q by id for lookups (ids are in id order unless a truncation sorted them by probability).
  std::vector<std::pair<int32_t, double>> qs(q.ids.size());
  for (size_t i = 0; i < q.ids.size(); ++i) qs[i] = {q.ids[i], q.probs[i]};
  if (!std::is_sorted(qs.begin(), qs.end())) std::sort(qs.begin(), qs.end());
  Candidates r;
  double sum = 0;
  for (size_t i = 0; i < pi.ids.size(); ++i) {
    auto it = std::lower_bound(qs.begin(), qs.end(), std::pair<int32_t, double>(pi.ids[i], -1.0));
    const double qv = it != qs.end() && it->first == pi.ids[i] ? it->second : 0.0;
    const double d = pi.probs[i] - qv;
    if (d > 0) {
      r.ids.push_back(pi.ids[i]);
      r.probs.push_back(d);
      sum += d;
    }
  }
  if (!(sum > 0)) return pi;  // pi == q: rejection had probability 0 in exact arithmetic
  for (double& v : r.probs) v /= sum;
  return r;
}

SpecVerdict speculative_accept(int64_t L, const std::function<const Candidates&(int64_t i)>& target,
                               const std::vector<Candidates>& draft, const std::vector<int32_t>& drafts, Rng& accept,
                               Rng& final_draw) {
  SpecVerdict v;
  while (v.accepted < L) {
    const int64_t k = v.accepted + 1;
    const int32_t d = drafts[size_t(k - 1)];
    const double u = accept.uniform();
    // Accept w.p. min(1, pi/q): u * q < pi (q(d) > 0 because d was drawn from q).
    if (!(u * prob_of(draft[size_t(k - 1)], d) < prob_of(target(k - 1), d))) break;
    v.accepted = k;
  }
  if (v.accepted == L) {
    v.next = draw(target(L), final_draw.uniform());
  } else {
    v.residual = true;
    v.next = draw(residual_distribution(target(v.accepted), draft[size_t(v.accepted)]), final_draw.uniform());
  }
  return v;
}

TokenLogprob token_logprob(const float* logits, int64_t n, int32_t id, int top_n) {
  TokenLogprob t;
  t.id = id;
  double zmax = -INFINITY;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isnan(logits[i])) zmax = std::max(zmax, double(logits[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isnan(logits[i])) sum += std::exp(double(logits[i]) - zmax);
  const double lse = zmax + std::log(sum);
  t.logprob = double(logits[id]) - lse;
  if (top_n > 0) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    std::iota(ids.begin(), ids.end(), 0);
    const size_t k = std::min<size_t>(size_t(top_n), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + ptrdiff_t(k), ids.end(), [&](int32_t a, int32_t b) {
      if (logits[a] != logits[b]) return logits[a] > logits[b];
      return a < b;
    });
    for (size_t i = 0; i < k; ++i) t.top.emplace_back(ids[i], double(logits[ids[i]]) - lse);
  }
  return t;
}

void process_logits(const float* logits, int64_t n, const SamplingParams& p, const GeneratedTokens& gen, std::span<const int32_t> extra,
                    std::vector<float>* out) {
  out->assign(logits, logits + n);
  if (!p.processes_logits()) return;
  for (const auto& [id, b] : p.logit_bias)
    if (id >= 0 && id < n) (*out)[size_t(id)] += b;
  // Phrase bias: the generated sequence is gen.ids then extra; back(j) is its j-th token from the end.
  const size_t len = gen.ids.size() + extra.size();
  auto back = [&](size_t j) { return j < extra.size() ? extra[extra.size() - 1 - j] : gen.ids[gen.ids.size() - 1 - (j - extra.size())]; };
  std::vector<int32_t> targets;  // one phrase's continuations biased at this row (each once)
  for (const PhraseBias& ph : p.phrase_bias) {
    const size_t m = ph.tokens.size();
    targets.clear();
    if (m == 1) targets.push_back(ph.tokens[0]);
    for (size_t k = 1; k < m && k <= len; ++k) {
      // Does the sequence end with tokens[0..k)?
      bool match = true;
      for (size_t i = 0; i < k && match; ++i) match = back(i) == ph.tokens[k - 1 - i];
      if (match && std::find(targets.begin(), targets.end(), ph.tokens[k]) == targets.end()) targets.push_back(ph.tokens[k]);
    }
    for (int32_t t : targets)
      if (t >= 0 && t < n) (*out)[size_t(t)] += ph.bias;
  }
  if (p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f) return;
  TokenCounts all;
  const TokenCounts* c = &gen.counts;
  if (!extra.empty()) {
    all = gen.counts;
    for (int32_t t : extra) ++all[t];
    c = &all;
  }
  for (const auto& [id, k] : *c)
    if (id >= 0 && id < n && k > 0) (*out)[size_t(id)] -= p.presence_penalty + p.frequency_penalty * float(k);
}

}  // namespace fb::engine
