#!/usr/bin/env bash
# One device call for the CUDA executor (issue 5): configure with the `device` preset, build the
# executor, its GPU tests and the CLI, run `ctest -L gpu` and the fixture checks with
# `--backend cuda --numerics exact|fast --compare-cpu` (the fixture gates), and print a short table LAST (the device reply keeps the tail).
# Usage, in the repo root on the GPU machine:  tools/device_run.sh [FIXTURES_DIR]
# FIXTURES_DIR (default .fixtures) holds tiny-s0/, tiny-s1-long/, tiny-smooth/ and tiny-vision/ copied from ../shared/fixtures
# (../shared does not travel to the device; carry the folder). Logs go to $OUT (or /tmp/fb_out).
set -u
FIX=${1:-.fixtures}
LOG=${OUT:-/tmp/fb_out}
mkdir -p "$LOG"
BUILD=build/device
row() { printf '%-34s %s\n' "$1" "$2" >>"$LOG/table.txt"; }
: >"$LOG/table.txt"
nvidia-smi -L 2>&1 | head -2

t0=$(date +%s)
# -include cstdint: gcc 13 no longer pulls <cstdint> in transitively; guards against a header that forgot it.
# FB_GIT_COMMIT (env) names the commit of an exported tree in the bench CSVs.
cmake --preset device -DCMAKE_CXX_FLAGS="-include cstdint" ${FB_GIT_COMMIT:+-DFB_GIT_COMMIT=$FB_GIT_COMMIT} >"$LOG/configure.log" 2>&1
cfg=$?
row "configure (device preset)" "rc=$cfg"
t1=$(date +%s)
# FB_GPU_TESTS (optional): a subset of the GPU test binaries to build and run (a short call).
GPU_TESTS=${FB_GPU_TESTS:-cuda_ops_test cuda_fast_gemv_test cuda_fast_small_test cuda_fast_attention_test cuda_session_io_test cuda_fast_numerics_test cuda_fixture_parity_test cuda_dspark_test cuda_vision_test cuda_row_invariance_test}
cmake --build "$BUILD" -j16 --target $GPU_TESTS >"$LOG/build_tests.log" 2>&1
bt=$?
t2=$(date +%s)
cmake --build "$BUILD" -j16 --target flashbox >"$LOG/build_cli.log" 2>&1
bc=$?
t3=$(date +%s)
row "build fb_cuda + gpu tests" "rc=$bt $((t2 - t1))s"
row "build flashbox" "rc=$bc $((t3 - t2))s"
[ $bt -ne 0 ] && grep -E "error|Error" "$LOG/build_tests.log" | head -20
[ $bc -ne 0 ] && grep -E "error|Error" "$LOG/build_cli.log" | head -10

if [ $bt -eq 0 ]; then
  FB_FIXTURES_DIR="$PWD/$FIX" timeout 360 ctest --test-dir "$BUILD" -L gpu -R "^($(echo $GPU_TESTS | tr ' ' '|'))\$" -V --timeout 300 >"$LOG/ctest.log" 2>&1
  ct=$?
  grep -E "Failure|differ|Expected|Which is|Value of|\[  FAILED|compare |check-fixture " "$LOG/ctest.log" | head -60
  row "ctest -L gpu -R ^cuda_" "rc=$ct $(grep -E 'tests passed|tests failed' "$LOG/ctest.log" | tail -1)"
  row "  gtest cases" "ok=$(grep -c '\[       OK \]' "$LOG/ctest.log") skipped=$(grep -cE '\[  SKIPPED \] [A-Za-z0-9_./]+ \(' "$LOG/ctest.log") failed=$(grep -cE '\[  FAILED  \] [A-Za-z0-9_./]+ \(' "$LOG/ctest.log")"
  for t in $(grep -oE '\[  FAILED  \] [A-Za-z0-9_./]+' "$LOG/ctest.log" | awk '{print $4}' | sort -u); do row "  FAILED" "$t"; done
  grep -oE '\[ tc \].*' "$LOG/ctest.log" | sed 's/^/  /' >>"$LOG/table.txt"
fi
# FB_SKIP_FIXTURE_CLI=1: skip the check-fixture command lines (a short speed call; FixtureGates runs them in ctest).
if [ $bc -eq 0 ] && [ "${FB_SKIP_FIXTURE_CLI:-0}" != 1 ]; then
  # The fixture gates (CLARIFICATIONS "Fixture gates") on both numerics classes: exact must also be
  # bit-identical to the CPU in lockstep (--compare-cpu); fast must PASS the gates.
  for c in tiny-s0 tiny-s1-long tiny-smooth tiny-vision; do
    [ -d "$FIX/$c" ] || { row "check-fixture $c" "absent from $FIX"; continue; }
    for nm in exact fast; do
      s0=$(date +%s)
      timeout 120 "$BUILD/flashbox" check-fixture "$FIX/$c" --backend cuda --numerics $nm --compare-cpu >"$LOG/fixture_${c}_$nm.log" 2>&1
      rc=$?
      row "check-fixture $c cuda $nm" "rc=$rc $(($(date +%s) - s0))s"
      grep -E "^compare " "$LOG/fixture_${c}_$nm.log" | cut -c1-150 | sed 's/^/    /' >>"$LOG/table.txt"
      grep -oE "(e2e|layer|vision)=[A-Za-z]+\([^)]*\)" "$LOG/fixture_${c}_$nm.log" | tail -3 | cut -c1-160 | sed 's/^/    /' >>"$LOG/table.txt"
    done
  done
  # chunked prefill (rows of one prompt over several steps: ring reads, ratio-2 tails, key lists)
  timeout 90 "$BUILD/flashbox" check-fixture "$FIX/tiny-s1-long" --backend cuda --numerics exact --compare-cpu --chunk 7 >"$LOG/fixture_chunk7.log" 2>&1
  row "check-fixture tiny-s1-long --chunk 7 exact" "rc=$?"
  grep -E "^compare " "$LOG/fixture_chunk7.log" | cut -c1-150 | sed 's/^/    /' >>"$LOG/table.txt"
  # Routed experts through 2 HBM slots per layer (4 experts, 2 per row: misses and waves).
  timeout 90 "$BUILD/flashbox" check-fixture "$FIX/tiny-s1-long" --backend cuda --numerics exact --compare-cpu --expert-slots 2 --chunk 7 \
    >"$LOG/fixture_slots.log" 2>&1
  row "check-fixture tiny-s1-long, 2 expert slots" "rc=$?"
  grep -E "compare|HBM expert slots" "$LOG/fixture_slots.log" | head -2 | cut -c1-150 | sed 's/^/    /' >>"$LOG/table.txt"
  # SWA bounded replay ([approx-approved], off by default) on the GPU: the same bits as the CPU's
  # replay, one shot and chunked (the fixtures are exact prefill, so the e2e figures move).
  for c in tiny-s0 tiny-s1-long; do
    for k in 0 7; do
      timeout 90 "$BUILD/flashbox" check-fixture "$FIX/$c" --backend cuda --numerics exact --compare-cpu --bounded-replay --chunk $k \
        >"$LOG/fixture_replay_${c}_$k.log" 2>&1
      row "check-fixture $c --bounded-replay --chunk $k" "rc=$?"
      grep -E "compare" "$LOG/fixture_replay_${c}_$k.log" | head -1 | cut -c1-150 | sed 's/^/    /' >>"$LOG/table.txt"
    done
  done
fi
# FB_PROBE=1: the machine's probe (no LFU simulation, short drive reads): the host's rate for
# routed experts computed on its CPU (issue 22) beside the pinned copy, and its CPU flags.
if [ $bc -eq 0 ] && [ "${FB_PROBE:-0}" = 1 ]; then
  timeout 120 "$BUILD/flashbox" probe --no-sim --seconds 1 --file-mib 256 >"$LOG/probe.log" 2>&1
  row "probe" "rc=$?"
  grep -E "^host|^gpu:|^host experts" "$LOG/probe.log" | cut -c1-260 | sed 's/^/    /' >>"$LOG/table.txt"
  printf '    cpu: %s; flags: %s\n' "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" \
    "$(grep -m1 -oE 'avx512f|avx512bw|avx512vl' /proc/cpuinfo | sort -u | tr '\n' ' ')" >>"$LOG/table.txt"
fi
# FB_MMA_EQUIV=1: issue 19's question (tools/device_mma_equiv.cu): one m16n8k32 e4m3 mma against two
# chained m16n8k16 f16 mmas on the same exact operands, bit for bit.
if [ "${FB_MMA_EQUIV:-0}" = 1 ]; then
  nvcc -std=c++17 -O2 -arch=sm_90a tools/device_mma_equiv.cu -o "$LOG/mma_equiv" >"$LOG/mma_equiv.log" 2>&1 && "$LOG/mma_equiv" >>"$LOG/mma_equiv.log" 2>&1
  row "mma_equiv" "rc=$?"
  tail -8 "$LOG/mma_equiv.log" | cut -c1-200 | sed 's/^/    /' >>"$LOG/table.txt"
  rm -f "$LOG/mma_equiv"
fi
row "total" "$(($(date +%s) - t0))s"
echo "==================== device_run summary ===================="
cat "$LOG/table.txt"
