// The device timeline of a few steps as they really run (issue 19): every kernel and copy with
// its GPU start and end, from CUPTI's activity records (concurrent-kernel mode, so PDL overlap and
// the side stream stay as in production; ncu serialises kernels and cannot show the time between
// them). Then the numbers that say where a step's time goes: its span, the time some kernel or copy
// runs (busy) and the time nothing does (idle), and per kernel name its calls and time.
// CUDA builds with CUPTI only (FB_HAVE_CUPTI); `flashbox bench --trace-steps N`.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace fb::bench {

struct TraceRecord {
  std::string name;  // demangled kernel name without arguments, or "memcpy HtoD" / "memcpy DtoH" / ...
  uint32_t stream = 0;
  uint64_t start_ns = 0, end_ns = 0;  // GPU timestamps
  uint32_t grid = 0;                  // blocks (x * y * z); 0 for copies
  bool kernel = true;
};

// Span, busy and idle time of one traced step; the records' intervals unioned.
struct TraceSummary {
  double span_us = 0;  // first start to last end
  double busy_us = 0;  // time covered by at least one record
  double idle_us = 0;  // span - busy: nothing on the GPU
  double kernel_us = 0;  // sum of kernel durations (overlapping ones counted each)
  int64_t kernels = 0, copies = 0;
  double main_gap_us = 0;      // on the stream with the most kernels: sum of positive gaps between consecutive records
  double main_overlap_us = 0;  // ... and of negative ones (the next starts before the last ends: PDL)
};
TraceSummary summarize(const std::vector<TraceRecord>& recs);

// How host-to-device copies and kernels share a traced interval (cold prefill streaming experts a
// layer ahead, issue 26): the union of the kernels' intervals (K), of the HtoD copies' (C), and
// their intersection. copy_only = |C| - both is the copy time no kernel ran beside (exposed copies);
// idle = span - |K u C| the time neither ran (the GPU waiting on the host).
struct CopyOverlap {
  double span_us = 0, kernel_us = 0, copy_us = 0, both_us = 0, copy_only_us = 0, kernel_only_us = 0, idle_us = 0;
  double hidden_share() const { return copy_us > 0 ? both_us / copy_us : 0.0; }  // of the copy time, the part beside kernels
};
CopyOverlap copy_overlap(const std::vector<TraceRecord>& recs);

// The records (sorted by start) after the n-th one named `name`, e.g. the second of two steps
// traced together after the first step's two result copies; *boundary_end_ns: that record's end
// (0 and every record when there are fewer than n).
std::vector<TraceRecord> records_after(const std::vector<TraceRecord>& recs, const std::string& name, int n, uint64_t* boundary_end_ns);

// Kernel name from a mangled or demangled CUPTI name: arguments and the fb::cuda / anonymous
// namespace prefixes dropped, template arguments kept ("tc_gemv_kernel<1, 1>").
std::string short_kernel_name(const std::string& demangled);

// The records as CSV (name, stream, start_us, end_us, grid, kernel), times from the first
// record's start: the raw timeline for a script to cut by layer or stream.
Status write_trace_csv(const std::string& path, const std::vector<TraceRecord>& recs);

bool kernel_trace_available();

// CUPTI activity recording from start() to destruction (enabling it costs the first launch after
// it most of a millisecond: trace several steps under one tracer and drop the first).
class KernelTracer {
 public:
  static Result<std::unique_ptr<KernelTracer>> start();
  ~KernelTracer();
  KernelTracer(const KernelTracer&) = delete;
  KernelTracer& operator=(const KernelTracer&) = delete;
  // The device activity of whatever `work` enqueues (the device is synchronised after it), sorted
  // by start; records of earlier work not yet delivered are dropped.
  Result<std::vector<TraceRecord>> capture(const std::function<Status()>& work);

 private:
  KernelTracer() = default;
};

}  // namespace fb::bench
