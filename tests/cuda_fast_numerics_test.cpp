// Gate 3 of the fast numerics class (CLARIFICATIONS "Numerics classes"): end to end on a smooth
// tiny model at wider dims (make-tiny --smooth: hidden 1024, every selection complete), the fast
// class teacher-forced against the exact class (bit-identical to the CPU reference) over >= 200
// decode steps: max |dlogit| <= 0.25, mean |dlogit| <= 0.05, greedy ids equal except where the
// exact logits' top-1/top-2 margin is within 2 x that row's max |dlogit|; mean KL(exact || fast)
// reported. Also: the fast class is deterministic (a second run gives the same bits). Label: gpu.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "cuda/executor.h"
#include "tiny_model_util.h"

namespace fb {
namespace {

struct Trace {
  std::vector<std::vector<float>> logits;  // [1 + steps][vocab]
  std::vector<int32_t> ids;                // greedy id of each logits row
};

int argmax(const std::vector<float>& x) { return int(std::max_element(x.begin(), x.end()) - x.begin()); }

// Prefill `prompt`, then `steps` decode steps; step k feeds `forced[k-1]` when given (teacher
// forcing), else the run's own argmax.
Trace run(model::Executor& ex, const std::vector<int32_t>& prompt, int steps, const std::vector<int32_t>* forced) {
  Trace r;
  auto s = ex.new_session();
  std::vector<model::SessionState*> ss{s.get()};
  model::Step st;
  for (size_t p = 0; p < prompt.size(); ++p) {
    model::Row row;
    row.pos = int64_t(p);
    row.token = prompt[p];
    row.kind = model::RowKind::kPrefill;
    row.prefill_end = int64_t(prompt.size());
    row.want_logits = p + 1 == prompt.size();
    st.rows.push_back(row);
  }
  auto out = ex.forward(st, ss);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  if (!out.ok()) return r;
  r.logits.push_back(out->logits);
  r.ids.push_back(argmax(out->logits));
  for (int k = 1; k <= steps; ++k) {
    model::Step d;
    model::Row row;
    row.pos = int64_t(prompt.size()) + k - 1;
    row.token = forced ? (*forced)[size_t(k - 1)] : r.ids.back();
    row.want_logits = true;
    d.rows.push_back(row);
    auto o = ex.forward(d, ss);
    EXPECT_TRUE(o.ok()) << o.status().to_string();
    if (!o.ok()) return r;
    r.logits.push_back(o->logits);
    r.ids.push_back(argmax(o->logits));
  }
  return r;
}

TEST(CudaFastNumerics, SmoothModelFastAgainstExactEndToEnd) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) GTEST_SKIP() << "no CUDA device";
  auto made = testing_util::write_test_tiny_model("fb_cuda_fast_smooth_tiny", 11, true);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  cuda::CudaLoadOptions exact_o, fast_o;
  exact_o.run.numerics = cuda::Numerics::kExact;
  fast_o.run.numerics = cuda::Numerics::kFast;
  auto exact = cuda::CudaExecutor::load(*made, {}, exact_o);
  auto fast = cuda::CudaExecutor::load(*made, {}, fast_o);
  ASSERT_TRUE(exact.ok() && fast.ok());
  ASSERT_GE((*exact)->config().dim, 1024);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 96; ++i) prompt.push_back(int32_t((7919 * i + 13) % 120000 + 100));
  const int steps = 208;
  const Trace want = run(**exact, prompt, steps, nullptr);
  ASSERT_EQ(int(want.logits.size()), steps + 1);
  const std::vector<int32_t> forced(want.ids.begin(), want.ids.end() - 1);
  const Trace got = run(**fast, prompt, steps, &forced);
  ASSERT_EQ(got.logits.size(), want.logits.size());
  double max_d = 0, sum_d = 0, sum_kl = 0;
  int64_t n = 0;
  int ids_equal = 0, near_ties = 0, unexplained = 0;
  for (size_t k = 0; k < want.logits.size(); ++k) {
    const auto& a = want.logits[k];
    const auto& b = got.logits[k];
    ASSERT_EQ(a.size(), b.size());
    double row_max = 0;
    for (size_t v = 0; v < a.size(); ++v) {
      const double d = std::fabs(double(a[v]) - double(b[v]));
      ASSERT_FALSE(std::isnan(d)) << "row " << k << " vocab " << v;
      row_max = std::max(row_max, d);
      sum_d += d;
      ++n;
    }
    max_d = std::max(max_d, row_max);
    // KL(exact || fast) of the softmax distributions, in f64.
    const double ma = *std::max_element(a.begin(), a.end()), mb = *std::max_element(b.begin(), b.end());
    double za = 0, zb = 0;
    for (size_t v = 0; v < a.size(); ++v) {
      za += std::exp(double(a[v]) - ma);
      zb += std::exp(double(b[v]) - mb);
    }
    double kl = 0;
    for (size_t v = 0; v < a.size(); ++v) {
      const double la = double(a[v]) - ma - std::log(za), lb = double(b[v]) - mb - std::log(zb);
      kl += std::exp(la) * (la - lb);
    }
    sum_kl += kl;
    if (got.ids[k] == want.ids[k]) {
      ++ids_equal;
    } else {
      std::vector<float> s(a);
      std::nth_element(s.begin(), s.begin() + 1, s.end(), std::greater<float>());
      const double margin = double(s[0]) - double(s[1]);
      if (margin <= 2 * row_max) ++near_ties;
      else ++unexplained;
    }
  }
  const double mean_d = sum_d / double(n), mean_kl = sum_kl / double(want.logits.size());
  std::printf("[ tc ] fast vs exact, smooth tiny model (dim %lld, %d steps): max |dlogit| %.4g, mean %.4g, mean KL %.3g, ids %d/%zu equal, %d near-ties\n",
              (long long)(*exact)->config().dim, steps, max_d, mean_d, mean_kl, ids_equal, want.logits.size(), near_ties);
  EXPECT_LE(max_d, 0.25);
  EXPECT_LE(mean_d, 0.05);
  EXPECT_EQ(unexplained, 0) << "greedy ids differ away from near-ties";
  // Deterministic: the same teacher-forced run again gives the same bits.
  const Trace again = run(**fast, prompt, 8, &forced);
  for (size_t k = 0; k < again.logits.size(); ++k) EXPECT_EQ(again.logits[k], got.logits[k]) << "fast class not deterministic at row " << k;
  std::filesystem::remove_all(*made);
}

// CudaRunOptions::attn_fuse_rope: the fast attention kernels rotate q on load and un-rotate o
// instead of two rope() launches per layer; the same bits end to end (prefill on the tensor-core
// path, which keeps its launches, then decode steps on the folded path), in both settings' runs.
TEST(CudaFastNumerics, FoldedRopeSameBits) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) GTEST_SKIP() << "no CUDA device";
  auto made = testing_util::write_test_tiny_model("fb_cuda_fast_rope_tiny", 11, true);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  cuda::CudaLoadOptions on_o, off_o;
  off_o.run.attn_fuse_rope = false;
  ASSERT_TRUE(on_o.run.attn_fuse_rope) << "the default";
  auto on = cuda::CudaExecutor::load(*made, {}, on_o);
  auto off = cuda::CudaExecutor::load(*made, {}, off_o);
  ASSERT_TRUE(on.ok() && off.ok());
  std::vector<int32_t> prompt;
  for (int i = 0; i < 80; ++i) prompt.push_back(int32_t((104729 * i + 7) % 120000 + 100));
  const Trace want = run(**off, prompt, 24, nullptr);
  const Trace got = run(**on, prompt, 24, nullptr);
  ASSERT_EQ(got.logits.size(), want.logits.size());
  for (size_t k = 0; k < want.logits.size(); ++k) EXPECT_EQ(got.logits[k], want.logits[k]) << "logits row " << k;
  std::filesystem::remove_all(*made);
}

// Two sessions: both prompts, then steps of 3 verify rows per session in one step (6 rows of two
// sessions: the rings' writes, a multi-row router), then one-row decode steps of session 0. All
// logits rows of every step, in order.
std::vector<std::vector<float>> run_two_sessions(model::Executor& ex) {
  std::vector<std::vector<float>> all;
  auto s0 = ex.new_session();
  auto s1 = ex.new_session();
  std::vector<model::SessionState*> ss{s0.get(), s1.get()};
  auto push = [&](model::Step& st, int session, int64_t pos, int32_t token, model::RowKind kind, int64_t prefill_end) {
    model::Row row;
    row.session = session;
    row.pos = pos;
    row.token = token;
    row.kind = kind;
    row.prefill_end = prefill_end;
    row.want_logits = true;
    st.rows.push_back(row);
  };
  auto forward = [&](const model::Step& st) {
    auto out = ex.forward(st, ss);
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    if (out.ok()) all.push_back(out->logits);
    return out.ok();
  };
  int64_t len[2] = {72, 57};
  for (int s = 0; s < 2; ++s) {
    model::Step st;
    for (int64_t p = 0; p < len[s]; ++p)
      push(st, s, p, int32_t((104729 * p + 31 * s + 7) % 120000 + 100), model::RowKind::kPrefill, len[s]);
    if (!forward(st)) return all;
  }
  for (int k = 0; k < 6; ++k) {
    model::Step st;
    for (int s = 0; s < 2; ++s)
      for (int j = 0; j < 3; ++j) push(st, s, len[s] + j, int32_t((7919 * (k + 3 * j) + 11 * s) % 120000 + 100), model::RowKind::kDecode, 0);
    if (!forward(st)) return all;
    for (int s = 0; s < 2; ++s) {  // keep two of the three rows (as a verify step accepting one draft token)
      len[s] += 2;
      EXPECT_TRUE(ss[size_t(s)]->rollback(len[s]).ok());
    }
  }
  for (int k = 0; k < 10; ++k) {
    model::Step st;
    push(st, 0, len[0]++, int32_t((31337 * k + 5) % 120000 + 100), model::RowKind::kDecode, 0);
    if (!forward(st)) return all;
  }
  return all;
}

// The launch-saving switches of the fast class (CudaRunOptions defer_hc_post, defer_combine,
// fp4_early_tiles, early_uploads) change where and when kernels run, never what they compute: the same bits as
// with every switch off, over prompts, multi-session verify steps and decode.
TEST(CudaFastNumerics, LaunchSavingSwitchesSameBits) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) GTEST_SKIP() << "no CUDA device";
  auto made = testing_util::write_test_tiny_model("fb_cuda_fast_switches_tiny", 13, true);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  const std::vector<std::string> names{"defer_hc_post", "defer_combine", "fp4_early_tiles", "early_uploads"};
  auto load = [&](const std::vector<std::string>& on) {
    cuda::CudaLoadOptions o;
    for (const std::string& n : names) EXPECT_TRUE(cuda::set_run_option(o.run, n, std::count(on.begin(), on.end(), n) ? "1" : "0").ok()) << n;
    return cuda::CudaExecutor::load(*made, {}, o);
  };
  std::vector<std::vector<float>> want;
  {
    auto ex = load({});
    ASSERT_TRUE(ex.ok()) << ex.status().to_string();
    want = run_two_sessions(**ex);
  }
  ASSERT_EQ(want.size(), size_t(2 + 6 + 10));
  const std::vector<std::vector<std::string>> configs{{"defer_hc_post"}, {"defer_hc_post", "defer_combine"}, {"fp4_early_tiles"}, {"early_uploads"}, names};
  for (const auto& on : configs) {
    std::string tag;
    for (const auto& n : on) tag += n + " ";
    auto ex = load(on);
    ASSERT_TRUE(ex.ok()) << ex.status().to_string();
    const auto got = run_two_sessions(**ex);
    ASSERT_EQ(got.size(), want.size()) << tag;
    for (size_t k = 0; k < want.size(); ++k) EXPECT_EQ(got[k], want[k]) << tag << ": logits of step " << k;
  }
  std::filesystem::remove_all(*made);
}

}  // namespace
}  // namespace fb
