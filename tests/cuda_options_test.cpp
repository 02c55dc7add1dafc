// The CUDA executor's run options from the command line (`--cuda-opt NAME=VALUE`, `bench --ab`):
// cuda::set_run_option parses them without a device (host code only), so this runs everywhere
// the CUDA executor is built. Label: fast.
#include <gtest/gtest.h>

#include "cuda/executor.h"

namespace fb {
namespace {

TEST(CudaRunOptions, FlagsIntegersAndErrors) {
  cuda::CudaRunOptions o;
  EXPECT_TRUE(cuda::set_run_option(o, "numerics", "exact").ok());
  EXPECT_EQ(o.numerics, cuda::Numerics::kExact);
  EXPECT_FALSE(cuda::set_run_option(o, "numerics", "fastest").ok());
  EXPECT_TRUE(o.tc_route);  // the router's dots of tensor-core prefill steps on tensor cores, on by default
  EXPECT_TRUE(cuda::set_run_option(o, "tc_route", "0").ok());
  EXPECT_FALSE(o.tc_route);
  EXPECT_TRUE(cuda::set_run_option(o, "tc_global_fold", "0").ok());
  EXPECT_FALSE(o.tc_global_fold);
  EXPECT_FALSE(cuda::set_run_option(o, "tc_global_fold", "yes").ok());
  // integers: in range accepted, out of range / not a number refused, the option unchanged
  EXPECT_TRUE(cuda::set_run_option(o, "tc_cluster_fold_ctas", "0").ok());
  EXPECT_EQ(o.tc_cluster_fold_ctas, 0);
  EXPECT_TRUE(cuda::set_run_option(o, "tc_cluster_fold_ctas", "2500").ok());
  EXPECT_EQ(o.tc_cluster_fold_ctas, 2500);
  EXPECT_FALSE(cuda::set_run_option(o, "tc_cluster_fold_ctas", "-1").ok());
  EXPECT_FALSE(cuda::set_run_option(o, "tc_cluster_fold_ctas", "12x").ok());
  EXPECT_FALSE(cuda::set_run_option(o, "tc_cluster_fold_ctas", "").ok());
  EXPECT_EQ(o.tc_cluster_fold_ctas, 2500);
  EXPECT_TRUE(cuda::set_run_option(o, "attn_heads_per_cta", "8").ok());
  EXPECT_EQ(o.attn_heads_per_cta, 8);
  EXPECT_FALSE(cuda::set_run_option(o, "attn_heads_per_cta", "17").ok());
  EXPECT_FALSE(cuda::set_run_option(o, "attn_heads_per_cta", "0").ok());
  EXPECT_EQ(o.attn_heads_per_cta, 8);
  EXPECT_FALSE(cuda::set_run_option(o, "tc_prefill_min_rows", "0").ok());
  EXPECT_TRUE(cuda::set_run_option(o, "tc_prefill_min_rows", "128").ok());
  EXPECT_EQ(o.tc_prefill_min_rows, 128);
  EXPECT_TRUE(cuda::set_run_option(o, "expert_prefetch_entries", "0").ok());
  EXPECT_EQ(o.expert_prefetch_entries, 0);
  EXPECT_FALSE(cuda::set_run_option(o, "expert_prefetch_min_rows", "0").ok());
  EXPECT_FALSE(cuda::set_run_option(o, "expert_prefetch_entries", "2000000000").ok());
  EXPECT_EQ(o.engram_prefetch_tasks, 4);  // the default: the host tables' rows copied ahead by four threads
  EXPECT_TRUE(cuda::set_run_option(o, "engram_prefetch_tasks", "0").ok());
  EXPECT_EQ(o.engram_prefetch_tasks, 0);
  EXPECT_FALSE(cuda::set_run_option(o, "engram_prefetch_tasks", "65").ok());
  EXPECT_FALSE(cuda::set_run_option(o, "engram_prefetch_tasks", "-1").ok());
  // the register-streamed GEMVs: off by default; groups of 4 or 8 rows, 1..64 CTAs a stripe
  EXPECT_EQ(o.rs_gemv, 0);
  EXPECT_TRUE(cuda::set_run_option(o, "rs_gemv", "2").ok());  // FP8 calls only
  EXPECT_EQ(o.rs_gemv, 2);
  EXPECT_FALSE(cuda::set_run_option(o, "rs_gemv", "3").ok());
  EXPECT_TRUE(cuda::set_run_option(o, "rs_gemv", "1").ok());
  EXPECT_EQ(o.rs_gemv, 1);
  EXPECT_EQ(o.rs_group_rows, 4);
  EXPECT_TRUE(cuda::set_run_option(o, "rs_group_rows", "8").ok());
  EXPECT_EQ(o.rs_group_rows, 8);
  EXPECT_FALSE(cuda::set_run_option(o, "rs_group_rows", "6").ok());
  EXPECT_EQ(o.rs_group_rows, 8) << "a refused value leaves the option as it was";
  EXPECT_EQ(o.rs_group_ctas, 8);
  EXPECT_TRUE(cuda::set_run_option(o, "rs_group_ctas", "64").ok());
  EXPECT_EQ(o.rs_group_ctas, 64);
  EXPECT_FALSE(cuda::set_run_option(o, "rs_group_ctas", "0").ok());
  EXPECT_FALSE(cuda::set_run_option(o, "rs_group_ctas", "65").ok());
  // an unknown name is refused with the list of known ones
  const Status st = cuda::set_run_option(o, "tc_fold", "1");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.to_string().find("tc_cluster_fold_ctas"), std::string::npos) << st.to_string();
  EXPECT_NE(st.to_string().find("rs_group_ctas"), std::string::npos) << st.to_string();
}

// NAME1+NAME2 = V1+V2 sets both (an A/B of options that move together), or neither.
TEST(CudaRunOptions, SeveralOptionsJoinedByPlus) {
  cuda::CudaRunOptions o;
  ASSERT_TRUE(cuda::set_run_option(o, "reuse_staging+sm_uploads", "0+1").ok());
  EXPECT_FALSE(o.reuse_staging);
  EXPECT_TRUE(o.sm_uploads);
  ASSERT_TRUE(cuda::set_run_option(o, "reuse_staging+sm_uploads+rs_gemv", "1+0+2").ok());
  EXPECT_TRUE(o.reuse_staging);
  EXPECT_FALSE(o.sm_uploads);
  EXPECT_EQ(o.rs_gemv, 2);
  // a bad value or a count that does not match leaves every option as it was
  EXPECT_FALSE(cuda::set_run_option(o, "reuse_staging+rs_gemv", "0+7").ok());
  EXPECT_TRUE(o.reuse_staging);
  EXPECT_EQ(o.rs_gemv, 2);
  EXPECT_FALSE(cuda::set_run_option(o, "reuse_staging+sm_uploads", "0").ok());
  EXPECT_FALSE(cuda::set_run_option(o, "reuse_staging+sm_uploads", "0+1+1").ok());
  EXPECT_TRUE(o.reuse_staging);
  EXPECT_FALSE(o.sm_uploads);
}

TEST(CudaRunOptions, DefaultsOfTheFastClass) {
  const cuda::CudaRunOptions o;
  EXPECT_EQ(o.numerics, cuda::Numerics::kFast);
  EXPECT_TRUE(o.tc_gemv && o.tc_global_fold && o.pdl);
  EXPECT_EQ(o.tc_cluster_fold_ctas, 1000);  // docs/results.md: the one-row launches' cluster fold
  EXPECT_TRUE(o.reuse_staging && o.pinned_ids && o.sm_uploads);
}

}  // namespace
}  // namespace fb
