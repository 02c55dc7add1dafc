#!/usr/bin/env bash
# Nsight Compute on the decode step's kernels (device only): builds flashbox (device preset) and
# profiles the first launches of the kernels matching REGEX during a one-step synthetic decode
# bench. Usage: tools/device_ncu.sh REGEX [COUNT]   (report in $OUT/ncu.txt, summary printed)
set -u
RE=${1:-'fp4_gemv2|attn_split|rms_norm_block|hc_sinkhorn|fp8_gemv'}
N=${2:-30}
LOG=${OUT:-/tmp/fb_out}
mkdir -p "$LOG"
cmake --preset device -DCMAKE_CXX_FLAGS="-include cstdint" >"$LOG/configure.log" 2>&1 || { tail -5 "$LOG/configure.log"; exit 1; }
cmake --build build/device -j16 --target flashbox >"$LOG/build_cli.log" 2>&1 || { grep -E "error" "$LOG/build_cli.log" | head; exit 1; }
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu"; exit 1; }
timeout 400 "$NCU" --clock-control none -k "regex:$RE" --launch-count "$N" \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
  build/device/flashbox bench --synthetic --experts 16 --contexts 4096 --steps 1 --verify-rows 1 --reps 1 >"$LOG/ncu.txt" 2>&1
echo "ncu rc=$?"
grep -E "^  [a-z_0-9]+.*\(|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Block Limit|Theoretical Occ|Compute \(SM\) Thr|Stall|Warp Cycles Per Issued|Grid Size|Block Size|Dynamic Shared" "$LOG/ncu.txt" | head -400 | cut -c1-150
