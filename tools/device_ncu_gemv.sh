#!/usr/bin/env bash
# Nsight Compute sections of the tensor-core decode GEMVs at released shapes (device only):
# builds cuda_fast_gemv_test (device preset) and profiles FastGemv.DISABLED_ProfileShapes (wq_b,
# wo_b at one row, MXFP4 experts w1 at 6 rows; 3 launches each) with the speed-of-light,
# occupancy, launch, scheduler and warp-state sections. Writes $OUT/ncu_gemv.csv (raw page) and
# prints the few lines that matter per kernel.
set -u
LOG=${OUT:-/tmp/fb_out}
mkdir -p "$LOG"
cmake --preset device -DCMAKE_CXX_FLAGS="-include cstdint" ${FB_GIT_COMMIT:+-DFB_GIT_COMMIT=$FB_GIT_COMMIT} >"$LOG/configure.log" 2>&1 || { tail -5 "$LOG/configure.log"; exit 1; }
cmake --build build/device -j16 --target cuda_fast_gemv_test >"$LOG/build_gemv.log" 2>&1 || { grep -E "error" "$LOG/build_gemv.log" | head; exit 1; }
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu"; exit 1; }
t0=$(date +%s)
timeout 300 "$NCU" --clock-control none -k "regex:tc_gemv_kernel" --csv --page details \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis \
  build/device/src/cuda/cuda_fast_gemv_test --gtest_also_run_disabled_tests --gtest_filter='FastGemv.DISABLED_ProfileShapes' >"$LOG/ncu_gemv.csv" 2>"$LOG/ncu_gemv.err"
echo "ncu rc=$? $(($(date +%s) - t0))s"
grep -E '"(Duration|DRAM Throughput|Memory Throughput|Registers Per Thread|Achieved Occupancy|Theoretical Occupancy|Block Limit Registers|Block Limit Shared Mem|Issue Slots Busy|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Warp Cycles Per Issued Instruction|Grid Size|Cluster Size|Dynamic Shared Memory Per Block|L2 Hit Rate|Mem Busy|Max Bandwidth)"' "$LOG/ncu_gemv.csv" \
  | awk -F'","' '{print $5 " | " $(NF-2) " = " $NF}' | sed 's/"$//' | head -150
