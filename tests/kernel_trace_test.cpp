// The arithmetic of `bench --trace-steps` (bench/kernel_trace.h) on hand-made records: span, busy
// and idle time with overlapping records on two streams, the main stream's gaps and PDL overlap,
// and kernel names as CUPTI reports them. Host code only (no device, no CUPTI). Label: fast.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "bench/kernel_trace.h"

namespace fb {
namespace {

bench::TraceRecord rec(uint32_t stream, uint64_t s, uint64_t e, bool kernel = true) {
  bench::TraceRecord r;
  r.name = kernel ? "k" : "memcpy HtoD";
  r.stream = stream;
  r.start_ns = s;
  r.end_ns = e;
  r.kernel = kernel;
  return r;
}

TEST(KernelTrace, SpanBusyIdleAndMainStreamGaps) {
  // stream 7 (main, 3 kernels): [0,10us) [8,20us) (PDL overlap 2us) [25,30us) (gap 5us)
  // stream 9: a kernel [12,27us) covering part of the main gap; a copy [40,45us) after an idle 10us
  std::vector<bench::TraceRecord> r = {rec(7, 0, 10000), rec(7, 8000, 20000), rec(7, 25000, 30000), rec(9, 12000, 27000),
                                       rec(9, 40000, 45000, false)};
  const bench::TraceSummary t = bench::summarize(r);
  EXPECT_DOUBLE_EQ(t.span_us, 45.0);
  EXPECT_DOUBLE_EQ(t.busy_us, 35.0);  // [0,30) and [40,45)
  EXPECT_DOUBLE_EQ(t.idle_us, 10.0);
  EXPECT_DOUBLE_EQ(t.kernel_us, 10.0 + 12.0 + 5.0 + 15.0);
  EXPECT_EQ(t.kernels, 4);
  EXPECT_EQ(t.copies, 1);
  EXPECT_DOUBLE_EQ(t.main_gap_us, 5.0);
  EXPECT_DOUBLE_EQ(t.main_overlap_us, 2.0);
}

TEST(KernelTrace, EmptyAndUnorderedRecords) {
  EXPECT_DOUBLE_EQ(bench::summarize({}).span_us, 0.0);
  // out of order, one nested inside another: busy is the union, nothing idle
  std::vector<bench::TraceRecord> r = {rec(1, 5000, 6000), rec(1, 0, 10000), rec(1, 10000, 12000)};
  const bench::TraceSummary t = bench::summarize(r);
  EXPECT_DOUBLE_EQ(t.span_us, 12.0);
  EXPECT_DOUBLE_EQ(t.busy_us, 12.0);
  EXPECT_DOUBLE_EQ(t.idle_us, 0.0);
}

TEST(KernelTrace, RecordsAfterTheNthNamedOne) {
  std::vector<bench::TraceRecord> r = {rec(1, 0, 10), rec(1, 20, 30, false), rec(1, 40, 50, false), rec(1, 60, 70), rec(1, 80, 90, false)};
  uint64_t end = 0;
  auto after = bench::records_after(r, "memcpy HtoD", 2, &end);  // rec(..., false) is named "memcpy HtoD"
  ASSERT_EQ(after.size(), 2u);
  EXPECT_EQ(after[0].start_ns, 60u);
  EXPECT_EQ(end, 50u);
  after = bench::records_after(r, "memcpy HtoD", 4, &end);  // fewer than 4: all, boundary 0
  EXPECT_EQ(after.size(), r.size());
  EXPECT_EQ(end, 0u);
}

TEST(KernelTrace, CopyOverlapSplitsCopiesBesideKernelsFromExposedOnes) {
  // kernels [0,10us) and [5,20us) (union [0,20)); copies [15,30us) and [28,35us) (union [15,35));
  // a DtoH copy [40,41us) counts for neither side but ends the span; idle: [35,40) and nothing else
  bench::TraceRecord d2h = rec(3, 40000, 41000, false);
  d2h.name = "memcpy DtoH";
  std::vector<bench::TraceRecord> r = {rec(1, 5000, 20000), rec(1, 0, 10000), rec(2, 15000, 30000, false), rec(2, 28000, 35000, false), d2h};
  const bench::CopyOverlap o = bench::copy_overlap(r);
  EXPECT_DOUBLE_EQ(o.span_us, 41.0);
  EXPECT_DOUBLE_EQ(o.kernel_us, 20.0);
  EXPECT_DOUBLE_EQ(o.copy_us, 20.0);
  EXPECT_DOUBLE_EQ(o.both_us, 5.0);  // [15,20)
  EXPECT_DOUBLE_EQ(o.copy_only_us, 15.0);
  EXPECT_DOUBLE_EQ(o.kernel_only_us, 15.0);
  EXPECT_DOUBLE_EQ(o.idle_us, 6.0);  // [35,41): the DtoH copy is not a kernel or an HtoD copy
  EXPECT_DOUBLE_EQ(o.hidden_share(), 0.25);
  EXPECT_DOUBLE_EQ(bench::copy_overlap({}).copy_us, 0.0);
  EXPECT_DOUBLE_EQ(bench::copy_overlap({}).hidden_share(), 0.0);
}

TEST(KernelTrace, ShortNames) {
  // mangled: void fb::cuda::(anonymous namespace)::tc_gemv_kernel<1, 2>(float const*, int)
  EXPECT_EQ(bench::short_kernel_name("_ZN2fb4cuda12_GLOBAL__N_114tc_gemv_kernelILi1ELi2EEEvPKfi"), "tc_gemv_kernel<1, 2>");
  EXPECT_EQ(bench::short_kernel_name("void fb::cuda::rms_norm_kernel(float*, int)"), "rms_norm_kernel");
  EXPECT_EQ(bench::short_kernel_name("memcpy HtoD"), "memcpy HtoD");
  // an argument of a type in an anonymous namespace, and a function pointer argument
  EXPECT_EQ(bench::short_kernel_name("void fb::cuda::(anonymous namespace)::tc_gemv_kernel<0, 0>(unsigned char const*, fb::cuda::(anonymous "
                                     "namespace)::TcPart, void (*)(int))"),
            "tc_gemv_kernel<0, 0>");
  // parentheses inside template arguments stay
  EXPECT_EQ(bench::short_kernel_name("void fb::cuda::k<(int)3>(int)"), "k<(int)3>");
}

// The records as CSV (bench --trace-csv; tools/trace_layers.py reads it): one header, one line a
// record in the given order, times in microseconds from the earliest start (not the first
// record's), names quoted; a path that cannot be opened is an error.
TEST(KernelTrace, WriteTraceCsv) {
  std::vector<bench::TraceRecord> r = {rec(7, 3000, 4500), rec(9, 1000, 2250, false)};
  r[0].name = "tc_gemv_kernel<1, 2>";
  r[0].grid = 132;
  const std::string path = ::testing::TempDir() + "trace_csv_test.csv";
  ASSERT_TRUE(bench::write_trace_csv(path, r).ok());
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_EQ(ss.str(),
            "name,stream,start_us,end_us,grid,kernel\n"
            "\"tc_gemv_kernel<1, 2>\",7,2.000,3.500,132,1\n"
            "\"memcpy HtoD\",9,0.000,1.250,0,0\n");
  std::remove(path.c_str());
  EXPECT_FALSE(bench::write_trace_csv("/nonexistent-dir/x.csv", r).ok());
}

}  // namespace
}  // namespace fb
