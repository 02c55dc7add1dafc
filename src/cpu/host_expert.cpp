#include "cpu/host_expert.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

#include "base/thread_pool.h"
#include "cpu/block_gemm_simd.h"
#include "cpu/ops.h"

namespace fb::cpu {

namespace {

// y = fp4_gemm(x, w) with w's rows in chunks over the pool: rows [a, b) are their own [b - a, K]
// weight, so every output is the same sum as in one call.
void fp4_gemv_rows_parallel(const uint16_t* x, const model::Fp4Linear& w, uint16_t* y) {
  const int64_t N = w.w.dim(0), half_k = w.w.dim(1), kb = w.scale.dim(1);
  const int64_t chunk = std::max<int64_t>(16, (N + 4 * thread_count() - 1) / (4 * thread_count()));
  parallel_for(0, (N + chunk - 1) / chunk, [&](int64_t c) {
    const int64_t a = c * chunk, b = std::min(N, a + chunk);
    const TensorView ws{w.w.dtype, {b - a, half_k}, w.w.data + a * half_k};
    const TensorView ss{w.scale.dtype, {b - a, kb}, w.scale.data + a * kb};
    fp4_gemm(x, 1, ws, ss, y + a);
  });
}

}  // namespace

void expert_one_token(const uint16_t* u, const model::ExpertWeights& ex, float swiglu_limit, float weight, uint16_t* ye) {
  const int64_t I = ex.w1.w.dim(0);
  std::vector<uint16_t> a(static_cast<size_t>(I)), b(static_cast<size_t>(I)), h(static_cast<size_t>(I));
  fp4_gemv_rows_parallel(u, ex.w1, a.data());
  fp4_gemv_rows_parallel(u, ex.w3, b.data());
  swiglu_row(a.data(), b.data(), I, swiglu_limit, weight, true, h.data());
  fp4_gemv_rows_parallel(h.data(), ex.w2, ye);
}

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
  std::vector<double> ms;
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0;; ++i) {
    const model::ExpertWeights ex = view(experts[i % experts.size()], D, I);
    const auto t0 = std::chrono::steady_clock::now();
    expert_one_token(u.data(), ex, 0.0f, 1.0f, ye.data());
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= 2) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());  // the first two warm the pool up
    if (ms.size() >= 5 && std::chrono::duration<double>(t1 - start).count() > seconds) break;
  }
  std::sort(ms.begin(), ms.end());
  HostExpertRate r;
  r.ms_per_expert = ms[ms.size() / 2];
  r.weight_bytes = double(3 * I * D / 2 + 2 * I * KB_d + D * KB_i);
  r.threads = thread_count();
  r.simd = simd::enabled();
  return r;
}

}  // namespace fb::cpu
