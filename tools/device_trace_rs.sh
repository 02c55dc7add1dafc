#!/usr/bin/env bash
# CUPTI traces (`bench --trace-steps 3`) of a decode step and a 6-row verify step at 4K context on the
# released-dimension synthetic model, once with the tile GEMVs (rs_gemv=0) and once with the
# register-streamed ones (rs_gemv=1): span, busy / idle time, PDL overlap and the kernels by time, to
# find where one arm loses (session 22: the verify step's grouped MXFP4 launches). Builds flashbox
# (device preset) first; a warm machine keeps the build.
# Usage, in the repo root on the GPU machine:  tools/device_trace_rs.sh
# Output: $OUT/trace_rs{0,1}.{out,err}; prints each arm's trace headers and its 6-row kernel table.
set -u
LOG=${OUT:-/tmp/fb_out}
mkdir -p "$LOG"
cmake --preset device -DCMAKE_CXX_FLAGS="-include cstdint" ${FB_GIT_COMMIT:+-DFB_GIT_COMMIT=$FB_GIT_COMMIT} >"$LOG/configure.log" 2>&1
timeout 300 cmake --build build/device -j16 --target flashbox >"$LOG/build.log" 2>&1
echo "build rc=$?"
FB=build/device/flashbox
for rs in 0 1; do
  timeout 150 $FB bench --synthetic --experts 16 --contexts 4096 --verify-rows 6 --steps 2 --reps 1 --trace-steps 3 --cuda-opt rs_gemv=$rs \
    >"$LOG/trace_rs$rs.out" 2>"$LOG/trace_rs$rs.err"
  echo "rs_gemv=$rs rc=$?"
done
for rs in 0 1; do
  echo "=== rs_gemv=$rs"
  grep -E "^bench: trace" "$LOG/trace_rs$rs.err" | cut -c1-330
  grep -A30 "6-row step" "$LOG/trace_rs$rs.err" | tail -30 | cut -c1-100
done
