// Physical limits measured in the same run as a benchmark (METHOD.md: measure the ceilings, don't
// trust datasheets): device-to-device copy bandwidth (read + write bytes), dense tensor-core GEMM
// rate (BF16 and FP8 through cuBLASLt), pinned and pageable host-to-device copy rate.
#pragma once

#include <string>

#include "base/status.h"

namespace fb::bench {

struct DeviceInfo {
  std::string name;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  int driver_version = 0, runtime_version = 0;
  double hbm_gib = 0;
  int sm_clock_mhz = 0, mem_clock_mhz = 0;
};

struct Limits {
  double d2d_gbps = 0;        // (read + write) bytes / s, GB = 1e9
  double h2d_pinned_gbps = 0;
  double h2d_pageable_gbps = 0;
  double bf16_tflops = 0;     // dense 8192^3
  double fp8_tflops = 0;      // dense 8192^3, e4m3 x e4m3 -> bf16, f32 accumulate
};

Result<DeviceInfo> device_info();
// Each measurement: warm-up, then the median of `reps` timed runs (CUDA events).
Result<Limits> measure_limits(int reps = 10);

}  // namespace fb::bench
