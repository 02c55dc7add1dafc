#include "cpu/host_expert.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <tuple>
#include <random>
#include <vector>

#include "base/check.h"
#include "base/thread_pool.h"
#include "cpu/block_gemm_simd.h"
#include "cpu/ops.h"

namespace fb::cpu {

namespace {

// Blocks of 32 a quantisation item covers; rows a GEMM item covers (even: the kernels' pairs).
constexpr int64_t kQuantBlocks = 16;

int64_t row_chunk(int64_t rows_total) {
  const int64_t want = std::max<int64_t>(1, 4 * thread_count());
  const int64_t c = std::max<int64_t>(16, (rows_total + want - 1) / want);
  return (c + 1) / 2 * 2;
}

void run(int64_t n, bool parallel, const std::function<void(int64_t)>& fn) {
  if (parallel) return parallel_for(0, n, fn);
  for (int64_t i = 0; i < n; ++i) fn(i);
}

// An act_quant'd row as the vector kernels read it (values: e4m3 values as f32).
struct Quant {
  std::vector<uint8_t> codes;
  std::vector<float> values, scales;
  simd::QuantRowT t;
  explicit Quant(int64_t K) : codes(size_t(K)), values(size_t(K)), scales(size_t(K / 32)) {}
  // blocks [b0, b1) of x
  void blocks(const uint16_t* x, int64_t b0, int64_t b1) {
    act_quant_row(x + b0 * 32, (b1 - b0) * 32, codes.data() + b0 * 32, scales.data() + b0);
    for (int64_t k = b0 * 32; k < b1 * 32; ++k) values[size_t(k)] = e4m3_to_f32(codes[size_t(k)]);
  }
};

// y rows [a, b) of x . w: the vector kernels on the row's quantisation, or the scalar reference
// on the rows as a weight of their own (the same sums either way).
void gemm_rows(const uint16_t* x, const Quant& q, const model::Fp4Linear& w, int64_t a, int64_t b, uint16_t* y) {
  if (simd::enabled()) return simd::fp4_rows(q.t, w.w.data, w.scale.data, a, b, y + a);
  const int64_t half_k = w.w.dim(1), kb = w.scale.dim(1);
  const TensorView ws{w.w.dtype, {b - a, half_k}, w.w.data + a * half_k};
  const TensorView ss{w.scale.dtype, {b - a, kb}, w.scale.data + a * kb};
  fp4_gemm(x, 1, ws, ss, y + a);
}

}  // namespace

void experts_on_host(const std::vector<HostExpertJob>& jobs, float swiglu_limit, bool parallel) {
  if (jobs.empty()) return;
  const int64_t D = jobs[0].ex.w2.w.dim(0), I = jobs[0].ex.w1.w.dim(0), J = int64_t(jobs.size());
  for (const HostExpertJob& j : jobs)
    FB_CHECK(j.ex.w1.w.dim(0) == I && j.ex.w3.w.dim(0) == I && j.ex.w2.w.dim(0) == D && j.ex.w1.w.dim(1) * 2 == D && j.ex.w2.w.dim(1) * 2 == I)
        << "host experts: one batch, one shape";
  // The distinct input rows (a token's experts share one), each quantised once, by block ranges.
  std::vector<const uint16_t*> rows;
  std::vector<int> row_of(static_cast<size_t>(J));
  for (int64_t j = 0; j < J; ++j) {
    auto it = std::find(rows.begin(), rows.end(), jobs[size_t(j)].u);
    row_of[size_t(j)] = int(it - rows.begin());
    if (it == rows.end()) rows.push_back(jobs[size_t(j)].u);
  }
  std::vector<std::unique_ptr<Quant>> qu, qh;
  for (size_t r = 0; r < rows.size(); ++r) qu.push_back(std::make_unique<Quant>(D));
  for (int64_t j = 0; j < J; ++j) qh.push_back(std::make_unique<Quant>(I));
  const int64_t qd = (D / 32 + kQuantBlocks - 1) / kQuantBlocks, qi = (I / 32 + kQuantBlocks - 1) / kQuantBlocks;
  const bool vec = simd::enabled();
  if (vec) {
    run(int64_t(rows.size()) * qd, parallel, [&](int64_t i) {
      const int64_t r = i / qd, b0 = (i % qd) * kQuantBlocks;
      qu[size_t(r)]->blocks(rows[size_t(r)], b0, std::min(D / 32, b0 + kQuantBlocks));
    });
    for (auto& q : qu) q->t.set(q->values.data(), q->scales.data(), D);
  }
  // w1 and w3 of every job: items of c rows.
  std::vector<uint16_t> a(size_t(J * I)), b(size_t(J * I)), h(size_t(J * I));
  const int64_t c1 = row_chunk(2 * J * I), n1 = (I + c1 - 1) / c1;
  run(J * 2 * n1, parallel, [&](int64_t i) {
    const int64_t j = i / (2 * n1), which = (i / n1) % 2, r0 = (i % n1) * c1;
    const HostExpertJob& job = jobs[size_t(j)];
    gemm_rows(job.u, *qu[size_t(row_of[size_t(j)])], which ? job.ex.w3 : job.ex.w1, r0, std::min(I, r0 + c1),
              (which ? b.data() : a.data()) + j * I);
  });
  // SwiGLU (routing weight applied) and the down projection's quantisation, by block ranges.
  run(J * qi, parallel, [&](int64_t i) {
    const int64_t j = i / qi, b0 = (i % qi) * kQuantBlocks, b1 = std::min(I / 32, b0 + kQuantBlocks);
    const int64_t o = j * I + b0 * 32;
    swiglu_row(a.data() + o, b.data() + o, (b1 - b0) * 32, swiglu_limit, jobs[size_t(j)].weight, true, h.data() + o);
    if (vec) qh[size_t(j)]->blocks(h.data() + j * I, b0, b1);
  });
  if (vec)
    for (auto& q : qh) q->t.set(q->values.data(), q->scales.data(), I);
  const int64_t c2 = row_chunk(J * D), n2 = (D + c2 - 1) / c2;
  run(J * n2, parallel, [&](int64_t i) {
    const int64_t j = i / n2, r0 = (i % n2) * c2;
    gemm_rows(h.data() + j * I, *qh[size_t(j)], jobs[size_t(j)].ex.w2, r0, std::min(D, r0 + c2), jobs[size_t(j)].ye);
  });
}

namespace {

class PoolHostExperts final : public model::HostExpertCompute {
 public:
  void run(const std::vector<HostExpertJob>& jobs, float swiglu_limit) const override { experts_on_host(jobs, swiglu_limit); }
  double ms_per_expert(int64_t D, int64_t I) const override {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& [d, i, ms] : known_)
      if (d == D && i == I) return ms;
    const double ms = measure_host_experts(D, I, 2, 0.3).ms_per_expert;
    known_.emplace_back(D, I, ms);
    return ms;
  }

 private:
  mutable std::mutex mu_;
  mutable std::vector<std::tuple<int64_t, int64_t, double>> known_;
};

}  // namespace

std::shared_ptr<const model::HostExpertCompute> host_expert_compute() { return std::make_shared<PoolHostExperts>(); }

void expert_one_token(const uint16_t* u, const model::ExpertWeights& ex, float swiglu_limit, float weight, uint16_t* ye) {
  experts_on_host({HostExpertJob{u, ex, weight, ye}}, swiglu_limit);
}

namespace {

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

HostExpertRate measure_host_experts(int64_t D, int64_t I, int n_experts, double seconds) {
  std::mt19937 rng(1);
  const int64_t KB_d = D / 32, KB_i = I / 32;
  struct Bytes {
    std::vector<uint8_t> w1, s1, w3, s3, w2, s2;
  };
  std::vector<Bytes> experts(size_t(std::max(1, n_experts)));
  std::uniform_int_distribution<int> scale(118, 134);
  auto fill = [&](std::vector<uint8_t>& v, size_t n, bool is_scale) {
    v.resize(n);
    for (auto& x : v) x = is_scale ? uint8_t(scale(rng)) : uint8_t(rng());
  };
  for (Bytes& e : experts) {
    fill(e.w1, size_t(I * D / 2), false);
    fill(e.s1, size_t(I * KB_d), true);
    fill(e.w3, size_t(I * D / 2), false);
    fill(e.s3, size_t(I * KB_d), true);
    fill(e.w2, size_t(D * I / 2), false);
    fill(e.s2, size_t(D * KB_i), true);
  }
  auto view = [](const Bytes& e, int64_t D_, int64_t I_) {
    model::ExpertWeights x;
    x.w1 = {TensorView{DType::kI8, {I_, D_ / 2}, e.w1.data()}, TensorView{DType::kU8, {I_, D_ / 32}, e.s1.data()}};
    x.w3 = {TensorView{DType::kI8, {I_, D_ / 2}, e.w3.data()}, TensorView{DType::kU8, {I_, D_ / 32}, e.s3.data()}};
    x.w2 = {TensorView{DType::kI8, {D_, I_ / 2}, e.w2.data()}, TensorView{DType::kU8, {D_, I_ / 32}, e.s2.data()}};
    return x;
  };
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> u(static_cast<size_t>(D)), ye(static_cast<size_t>(D));
  for (auto& x : u) x = to_bf(nd(rng));
  // The first two runs of each kind warm the pool and the caches up and are not timed.
  auto time_runs = [&](bool parallel, double budget_s) {
    std::vector<double> ms;
    const auto start = std::chrono::steady_clock::now();
    for (size_t i = 0;; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      experts_on_host({HostExpertJob{u.data(), view(experts[i % experts.size()], D, I), 1.0f, ye.data()}}, 0.0f, parallel);
      const auto t1 = std::chrono::steady_clock::now();
      if (i >= 2) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      if (ms.size() >= 5 && std::chrono::duration<double>(t1 - start).count() > budget_s) break;
    }
    return median_of(ms);
  };
  HostExpertRate r;
  r.ms_per_expert = time_runs(true, 0.7 * seconds);
  r.ms_one_thread = time_runs(false, 0.2 * seconds);
  std::vector<double> us;
  for (int i = 0; i < 202; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    parallel_for(0, thread_count(), [](int64_t) {});
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= 2) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  r.pool_us = median_of(us);
  r.weight_bytes = double(3 * I * D / 2 + 2 * I * KB_d + D * KB_i);
  r.threads = thread_count();
  r.simd = simd::enabled();
  return r;
}

}  // namespace fb::cpu
