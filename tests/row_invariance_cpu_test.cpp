// The row-invariance harness of cuda_row_invariance_test on the CPU executor and the tiny model:
// the CPU reference is row-invariant by construction, so this checks the harness itself (the
// positions, session lists and row bookkeeping of its shared steps, up to 149 rows, and of
// draft_many with a sampled job) where a GPU is absent. Label fast.
#include <gtest/gtest.h>

#include "engine/executor_factory.h"
#include "row_invariance_harness.h"
#include "tiny_model_util.h"

namespace fb {
namespace {

const std::string& model_dir() {
  static const std::string dir = [] {
    auto d = testing_util::write_test_tiny_model("fb_row_invariance_cpu", 5, false);
    FB_CHECK(d.ok()) << d.status().to_string();
    return *d;
  }();
  return dir;
}

TEST(RowInvarianceCpu, DecodeRowsAloneEqualBesideOthers) {
  auto ex = engine::make_executor("cpu", model_dir());
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  for (const row_invariance::Case& c : row_invariance::kCases) {
    SCOPED_TRACE(c.name);
    row_invariance::check_case(**ex, c, "cpu", 3);  // 3 shared steps a case: the CPU reference is slow
  }
}

TEST(RowInvarianceCpu, DraftManyEqualsDraftAlone) {
  auto ex = engine::make_executor("cpu", model_dir());
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  row_invariance::check_draft_many(**ex, false);  // the default draft_many runs the jobs as given
}

}  // namespace
}  // namespace fb
