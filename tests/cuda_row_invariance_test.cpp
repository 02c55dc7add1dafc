// Row invariance of shared steps on the CUDA executor (issue 20; CLARIFICATIONS "Numerics
// classes"): one decode session's logits and DSpark tap rows are the same bits whether each of its
// steps runs alone or beside other sessions' decode / verify rows and a prompt chunk, in both
// numerics classes, on steps of at most 64 rows and on larger ones (which the executor runs as
// parts: model::split_step), and draft_many's shared draft steps give each session the bits of its
// draft() alone. Models: the smooth tiny model at hidden 1,024 (where the fast
// kernels' bits differ from the exact ones, so a step that switched kernels would show) and the
// tiny-s0 fixture's checkpoint when present. Label gpu (skips without a device).
#include <gtest/gtest.h>

#include <cstdio>
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda/executor.h"
#include "row_invariance_harness.h"
#include "cuda/gpu_test_util.h"
#include "tiny_model_util.h"

namespace fb {
namespace {

using row_invariance::check_case;
using row_invariance::check_draft_many;
using row_invariance::kCases;

const std::string& smooth_model() {
  static const std::string dir = [] {
    auto d = testing_util::write_test_tiny_model("fb_cuda_row_invariance", 11, true);
    FB_CHECK(d.ok()) << d.status().to_string();
    return *d;
  }();
  return dir;
}

// The classes: exact, fast, and fast with the register-streamed GEMVs (rs_gemv, whose FP8 calls of
// up to 64 rows and MXFP4 calls grouped by expert or not must give a row the same bits).
enum class Mode { kExact, kFast, kFastRs, kFastRsFp8 };
const char* mode_name(Mode m) {
  return m == Mode::kExact ? "exact" : m == Mode::kFast ? "fast" : m == Mode::kFastRs ? "fast_rs" : "fast_rs_fp8";
}

class RowInvariance : public ::testing::TestWithParam<std::tuple<const char*, Mode>> {
 protected:
  // The parameter's model (the smooth tiny model, or a fixture's checkpoint) on the CUDA executor
  // in the parameter's numerics class; empty with `why` set when the fixture is absent.
  Result<std::unique_ptr<cuda::CudaExecutor>> load(std::string* why) {
    const std::string model = std::get<0>(GetParam());
    std::string dir;
    if (model == "smooth") {
      dir = smooth_model();
    } else {
      const std::string f = cuda::test_util::runnable_fixture(model, why);
      if (f.empty()) return std::unique_ptr<cuda::CudaExecutor>();
      dir = f + "/checkpoint";
    }
    cuda::CudaLoadOptions lo;
    lo.run.numerics = std::get<1>(GetParam()) == Mode::kExact ? cuda::Numerics::kExact : cuda::Numerics::kFast;
    lo.run.rs_gemv = std::get<1>(GetParam()) == Mode::kFastRs ? 1 : std::get<1>(GetParam()) == Mode::kFastRsFp8 ? 2 : 0;
    return cuda::CudaExecutor::load(dir, {}, lo);
  }
};

TEST_P(RowInvariance, DecodeRowsAloneEqualBesideOthers) {
  FB_NEED_GPU();
  std::string why;
  auto ex = load(&why);
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  if (!*ex) GTEST_SKIP() << why;
  for (const row_invariance::Case& c : kCases) {
    SCOPED_TRACE(c.name);
    check_case(**ex, c, mode_name(std::get<1>(GetParam())));
  }
}

TEST_P(RowInvariance, DraftManyEqualsDraftAlone) {
  FB_NEED_GPU();
  std::string why;
  auto ex = load(&why);
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  if (!*ex) GTEST_SKIP() << why;
  check_draft_many(**ex, true);
}

INSTANTIATE_TEST_SUITE_P(Models, RowInvariance,
                         ::testing::Combine(::testing::Values("smooth", "tiny-s0"), ::testing::Values(Mode::kFast, Mode::kExact, Mode::kFastRs, Mode::kFastRsFp8)),
                         [](const auto& i) {
                           std::string n = std::string(std::get<0>(i.param)) + "_" + mode_name(std::get<1>(i.param));
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace fb
