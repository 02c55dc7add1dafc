// `bench --trace-steps N`: decode (and verify) steps as they run in production, traced with CUPTI.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>

#include "bench/decode_bench.h"
#include "bench/kernel_trace.h"
#include "cmd/bench_rows.h"

namespace fb::cmd {

int trace_decode_rows(const BenchArgs& a, Csv& csv, cuda::CudaExecutor& ex, model::SessionState& s, int64_t L, int rows) {
  if (!bench::kernel_trace_available()) return bench_failed(FB_ERROR(kUnsupported) << "this build has no CUPTI", "--trace-steps");
  if (Status st = bench::run_decode_steps(ex, s, 2, rows); !st.ok()) return bench_failed(st, "trace warm-up");
  struct Traced {
    std::vector<bench::TraceRecord> recs;
    bench::TraceSummary sum;
    double lead_us = 0;  // from the first step's last result copy to this step's first record
  };
  auto started = bench::KernelTracer::start();
  if (!started.ok()) return bench_failed(started.status(), "--trace-steps");
  std::unique_ptr<bench::KernelTracer> tracer = std::move(started).value();
  std::vector<Traced> steps;
  // Two steps back to back per capture, as in a decode loop; the second is the one measured, from
  // the first's last result copy (logits, then taps: two device-to-host copies) on, so its span
  // and idle time include the host's work between steps and before the step's first copy.
  for (int k = 0; k <= a.trace_steps; ++k) {  // the first capture carries the tracer's start-up: dropped
    auto recs = tracer->capture([&] { return bench::run_decode_steps(ex, s, 2, rows); });
    if (!recs.ok()) return bench_failed(recs.status(), "trace at " + std::to_string(L));
    if (k == 0) continue;
    uint64_t t0 = 0;
    Traced t;
    t.recs = bench::records_after(*recs, "memcpy DtoH", 2, &t0);
    t.sum = bench::summarize(t.recs);
    if (t0 > 0 && !t.recs.empty() && t.recs.front().start_ns > t0) {
      t.lead_us = double(t.recs.front().start_ns - t0) * 1e-3;
      t.sum.span_us += t.lead_us;
      t.sum.idle_us += t.lead_us;
    }
    steps.push_back(std::move(t));
  }
  tracer.reset();  // tracing off before anything else is timed
  std::sort(steps.begin(), steps.end(), [](const Traced& x, const Traced& y) { return x.sum.span_us < y.sum.span_us; });
  const Traced& med = steps[steps.size() / 2];
  const bench::TraceSummary& m = med.sum;
  const std::string what = rows == 1 ? "decode step" : std::to_string(rows) + "-row step";
  std::fprintf(stderr,
               "bench: trace of a %s at context %lld (median span of %zu, from the previous step's last copy): span %.1f us, GPU busy %.1f us, "
               "idle %.1f us (%.1f%%; %.1f us of it before the step's first copy); "
               "%lld kernels (sum of their times %.1f us), %lld copies; main stream: gaps %.1f us, PDL overlap %.1f us\n",
               what.c_str(), (long long)L, steps.size(), m.span_us, m.busy_us, m.idle_us, m.span_us > 0 ? 100 * m.idle_us / m.span_us : 0.0, med.lead_us,
               (long long)m.kernels, m.kernel_us, (long long)m.copies, m.main_gap_us, m.main_overlap_us);
  const std::string tag = rows == 1 ? "trace_decode_" : "trace_rows" + std::to_string(rows) + "_";
  csv.row(tag + "span_us", L, m.span_us, "us, the previous step's last copy to this step's last end (median traced step)");
  csv.row(tag + "lead_us", L, med.lead_us, "us from the previous step's last copy to this step's first (host work between steps)");
  csv.row(tag + "busy_us", L, m.busy_us, "us with at least one kernel or copy running");
  csv.row(tag + "idle_us", L, m.idle_us, "us with nothing running", m.span_us > 0 ? m.idle_us / m.span_us : -1);
  csv.row(tag + "kernel_sum_us", L, m.kernel_us, "us, kernel durations summed (overlaps counted twice)");
  csv.row(tag + "kernels", L, double(m.kernels), "kernel launches");
  csv.row(tag + "main_gap_us", L, m.main_gap_us, "us, positive gaps between consecutive records on the main stream");
  csv.row(tag + "main_overlap_us", L, m.main_overlap_us, "us, the next record starting before the last ended (PDL)");
  struct ByName {
    int64_t calls = 0;
    double us = 0;
    uint64_t grid = 0;
  };
  std::map<std::string, ByName> by;
  for (const bench::TraceRecord& r : med.recs) {
    ByName& b = by[r.name];
    ++b.calls;
    b.us += double(r.end_ns - r.start_ns) * 1e-3;
    b.grid = std::max<uint64_t>(b.grid, r.grid);
  }
  std::vector<std::pair<double, std::string>> order;
  for (const auto& [n, b] : by) order.push_back({b.us, n});
  std::sort(order.rbegin(), order.rend());
  std::fprintf(stderr, "  %-44s %6s %10s %9s %7s\n", "kernel (as run: PDL waits inside)", "calls", "us/step", "us/call", "grid");
  for (size_t i = 0; i < order.size() && i < 30; ++i) {
    const ByName& b = by[order[i].second];
    std::fprintf(stderr, "  %-44.44s %6lld %10.1f %9.2f %7llu\n", order[i].second.c_str(), (long long)b.calls, b.us, b.us / double(b.calls),
                 (unsigned long long)b.grid);
  }
  if (!a.trace_csv.empty()) {
    const std::string path = a.trace_csv + "." + tag + std::to_string(L) + ".csv";
    if (Status st = bench::write_trace_csv(path, med.recs); !st.ok()) return bench_failed(st, "--trace-csv");
    std::fprintf(stderr, "bench: trace records written to %s\n", path.c_str());
  }
  return 0;
}

}  // namespace fb::cmd
