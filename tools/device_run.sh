#!/usr/bin/env bash
# One device call for the CUDA executor (issue 5): configure with the `device` preset, build the
# executor, its GPU tests and the CLI, run `ctest -L gpu` and the fixture checks with
# `--backend cuda --compare-cpu`, and print a short table LAST (the device reply keeps the tail).
# Usage, in the repo root on the GPU machine:  tools/device_run.sh [FIXTURES_DIR]
# FIXTURES_DIR (default .fixtures) holds tiny-s0/, tiny-s1-long/ and tiny-vision/ copied from ../shared/fixtures
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
GPU_TESTS=${FB_GPU_TESTS:-cuda_ops_test cuda_fixture_parity_test cuda_dspark_test cuda_vision_test}
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
  FB_FIXTURES_DIR="$PWD/$FIX" timeout 240 ctest --test-dir "$BUILD" -L gpu -R "^($(echo $GPU_TESTS | tr ' ' '|'))\$" -V --timeout 200 >"$LOG/ctest.log" 2>&1
  ct=$?
  grep -E "Failure|differ|Expected|Which is|Value of|\[  FAILED|compare |check-fixture " "$LOG/ctest.log" | head -60
  row "ctest -L gpu -R ^cuda_" "rc=$ct $(grep -E 'tests passed|tests failed' "$LOG/ctest.log" | tail -1)"
  row "  gtest cases" "ok=$(grep -c '\[       OK \]' "$LOG/ctest.log") skipped=$(grep -cE '\[  SKIPPED \] [A-Za-z0-9_./]+ \(' "$LOG/ctest.log") failed=$(grep -cE '\[  FAILED  \] [A-Za-z0-9_./]+ \(' "$LOG/ctest.log")"
  for t in $(grep -oE '\[  FAILED  \] [A-Za-z0-9_./]+' "$LOG/ctest.log" | awk '{print $4}' | sort -u); do row "  FAILED" "$t"; done
  grep -oE '\[ tc \].*' "$LOG/ctest.log" | sed 's/^/  /' >>"$LOG/table.txt"
fi
if [ $bc -eq 0 ]; then
  for c in tiny-s0 tiny-s1-long tiny-vision; do
    [ -d "$FIX/$c" ] || { row "check-fixture $c" "absent from $FIX"; continue; }
    s0=$(date +%s)
    FB_TC_PREFILL=0 timeout 90 "$BUILD/flashbox" check-fixture "$FIX/$c" --backend cuda --compare-cpu >"$LOG/fixture_$c.log" 2>&1
    rc=$?
    row "check-fixture $c (cuda exact+cpu)" "rc=$rc $(($(date +%s) - s0))s (rc 1 = oracle gate, see docs/numerics.md)"
    tail -2 "$LOG/fixture_$c.log" | sed 's/^/    /' >>"$LOG/table.txt"
  done
  # chunked prefill (rows of one prompt over several steps: ring reads, ratio-2 tails, key lists)
  FB_TC_PREFILL=0 timeout 90 "$BUILD/flashbox" check-fixture "$FIX/tiny-s1-long" --backend cuda --compare-cpu --chunk 7 >"$LOG/fixture_chunk7.log" 2>&1
  row "check-fixture tiny-s1-long --chunk 7" "rc=$?"
  tail -2 "$LOG/fixture_chunk7.log" | head -1 | sed 's/^/    /' >>"$LOG/table.txt"
  # Tensor-core prefill GEMMs forced on for every prefill step ([reference-defining], not bit-
  # identical by design): how far the fixture logits move from the exact CPU reference.
  # Tensor-core GEMVs for decode / verify rows (mma_gemv.h, off by default): distance from the CPU.
  for c in tiny-s0 tiny-s1-long; do
    FB_MMA_GEMV=1 FB_TC_PREFILL=0 timeout 90 "$BUILD/flashbox" check-fixture "$FIX/$c" --backend cuda --compare-cpu >"$LOG/fixture_mma_$c.log" 2>&1
    row "check-fixture $c, mma decode GEMVs" "rc=$?"
    tail -2 "$LOG/fixture_mma_$c.log" | head -1 | sed 's/^/    /' >>"$LOG/table.txt"
  done
  for c in tiny-s0 tiny-s1-long; do
    FB_TC_PREFILL_MIN_ROWS=1 FB_TC_HC_MIXES=1 timeout 90 "$BUILD/flashbox" check-fixture "$FIX/$c" --backend cuda --compare-cpu >"$LOG/fixture_tc_$c.log" 2>&1
    row "check-fixture $c, tensor-core prefill + mixes" "rc=$?"
    tail -2 "$LOG/fixture_tc_$c.log" | sed 's/^/    /' >>"$LOG/table.txt"
  done
  # Routed experts through 2 HBM slots per layer (4 experts, 2 per row: misses and waves).
  FB_TC_PREFILL=0 timeout 90 "$BUILD/flashbox" check-fixture "$FIX/tiny-s1-long" --backend cuda --compare-cpu --expert-slots 2 --chunk 7 \
    >"$LOG/fixture_slots.log" 2>&1
  row "check-fixture tiny-s1-long, 2 expert slots" "rc=$?"
  grep -E "compare|HBM expert slots" "$LOG/fixture_slots.log" | head -2 | sed 's/^/    /' >>"$LOG/table.txt"
  # SWA bounded replay ([approx-approved], off by default) on the GPU: the same bits as the CPU's
  # replay, one shot and chunked (the fixtures are exact prefill, so the oracle line FAILs).
  for c in tiny-s0 tiny-s1-long; do
    for k in 0 7; do
      FB_CUDA_REPLAY=1 FB_TC_PREFILL=0 timeout 90 "$BUILD/flashbox" check-fixture "$FIX/$c" --backend cuda --compare-cpu --bounded-replay --chunk $k \
        >"$LOG/fixture_replay_${c}_$k.log" 2>&1
      row "check-fixture $c --bounded-replay --chunk $k" "rc=$?"
      grep -E "compare" "$LOG/fixture_replay_${c}_$k.log" | head -1 | sed 's/^/    /' >>"$LOG/table.txt"
    done
  done
  # The three tiers under the GPU: HBM slots (2 per layer) <- page-locked host cache <- two
  # expert-store replicas on the disk (flashbox convert of the fixture's checkpoint); the outputs
  # must equal the CPU reference's bit for bit.
  T=/tmp/fb_tiers
  rm -rf "$T" && mkdir -p "$T"
  "$BUILD/flashbox" convert --model "$FIX/tiny-s1-long/checkpoint" --out "$T/store1" --replicas "$T/store2" >"$LOG/fixture_store.log" 2>&1
  FB_TC_PREFILL=0 timeout 90 "$BUILD/flashbox" check-fixture "$FIX/tiny-s1-long" --backend cuda --compare-cpu --expert-slots 2 --chunk 7 \
    --expert-store "$T/store1" "$T/store2" >>"$LOG/fixture_store.log" 2>&1
  row "check-fixture tiny-s1-long, 2 slots + host + drives" "rc=$?"
  grep -E "compare|HBM expert slots|expert tiers|convert: wrote" "$LOG/fixture_store.log" | head -4 | sed 's/^/    /' >>"$LOG/table.txt"
fi
row "total" "$(($(date +%s) - t0))s"
echo "==================== device_run summary ===================="
cat "$LOG/table.txt"
