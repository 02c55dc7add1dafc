// flashbox bench: benchmark rows as CSV with commit, GPU, driver and clocks, each next to the
// physical limit measured in the same run. `--limits` measures the ceilings alone.
#include <cstdio>
#include <ctime>
#include <memory>

#include "bench/limits.h"
#include "cmd/commands.h"

namespace fb::cmd {

namespace {

struct Args {
  bool limits = true;
  std::string csv;
  int reps = 10;
};

int run(const Args& a) {
  auto dev = bench::device_info();
  if (!dev.ok()) {
    std::fprintf(stderr, "bench: no usable GPU: %s\n", dev.status().to_string().c_str());
    return 2;
  }
  auto lim = bench::measure_limits(a.reps);
  if (!lim.ok()) {
    std::fprintf(stderr, "bench: %s\n", lim.status().to_string().c_str());
    return 1;
  }
  FILE* out = a.csv.empty() ? stdout : std::fopen(a.csv.c_str(), "w");
  if (!out) {
    std::fprintf(stderr, "bench: cannot write %s\n", a.csv.c_str());
    return 1;
  }
  std::fprintf(out, "commit,gpu,driver,runtime,sm_clock_mhz,mem_clock_mhz,row,value,unit\n");
  auto row = [&](const char* name, double v, const char* unit) {
    std::fprintf(out, "%s,%s,%d,%d,%d,%d,%s,%.3f,%s\n", FB_GIT_COMMIT, dev->name.c_str(), dev->driver_version, dev->runtime_version,
                 dev->sm_clock_mhz, dev->mem_clock_mhz, name, v, unit);
  };
  row("hbm_d2d_copy", lim->d2d_gbps, "GB/s (read+write)");
  row("h2d_pinned", lim->h2d_pinned_gbps, "GB/s");
  row("h2d_pageable", lim->h2d_pageable_gbps, "GB/s");
  row("gemm_bf16_8192", lim->bf16_tflops, "TFLOP/s");
  row("gemm_fp8_8192", lim->fp8_tflops, "TFLOP/s");
  if (out != stdout) std::fclose(out);
  return 0;
}

}  // namespace

Runner add_bench(CLI::App& app) {
  auto a = std::make_shared<Args>();
  app.add_flag("--limits", a->limits, "measure the physical limits (HBM copy, tensor-core GEMM, H2D)");
  app.add_option("--csv", a->csv, "write CSV here (default stdout)");
  app.add_option("--reps", a->reps, "timed repetitions per measurement (median reported)");
  return [a] { return run(*a); };
}

}  // namespace fb::cmd
