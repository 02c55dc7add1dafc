#!/usr/bin/env bash
# Session 22: CUPTI traces (bench --trace-steps 3) of decode and 6-row verify steps at 4K with rs_gemv=0 and 1, to find where the verify step loses.
set -u
cmake --preset device -DCMAKE_CXX_FLAGS="-include cstdint" >/dev/null 2>&1; timeout 300 cmake --build build/device -j16 --target flashbox >/dev/null 2>&1; echo "build rc=$?"
FB=build/device/flashbox
mkdir -p $OUT
for rs in 0 1; do
  timeout 150 $FB bench --synthetic --experts 16 --contexts 4096 --verify-rows 6 --steps 2 --reps 1 --trace-steps 3 --cuda-opt rs_gemv=$rs >$OUT/trace_rs$rs.out 2>$OUT/trace_rs$rs.err
  echo "rs=$rs rc=$?"
done
for rs in 0 1; do echo "=== rs=$rs"; grep -A22 -iE "verify|rows" $OUT/trace_rs$rs.err | grep -vE "^--$" | head -60 | cut -c1-120; done
