#!/usr/bin/env bash
# One device call for the speed work (issues 6, 7, 11): tools/device_run.sh (build, GPU parity
# tests, fixture checks with --compare-cpu), then `flashbox bench` with the given arguments, and the
# summary table LAST. Usage on the GPU machine, in the repo root:
#   tools/device_perf.sh FIXTURES_DIR [bench args...]
# default bench args: --synthetic --experts 16 --contexts 4096 --steps 4 --reps 3 --profile
set -u
FIX=${1:-.fixtures}
shift || true
LOG=${OUT:-/tmp/fb_out}
mkdir -p "$LOG"
bash tools/device_run.sh "$FIX" >"$LOG/device_run.out" 2>&1
ARGS=("$@")
[ ${#ARGS[@]} -eq 0 ] && ARGS=(--synthetic --experts 16 --contexts 4096 --steps 4 --reps 3 --profile)
b0=$(date +%s)
timeout 420 build/device/flashbox bench "${ARGS[@]}" --csv "$LOG/bench.csv" >"$LOG/bench.out" 2>"$LOG/bench.err"
brc=$?
echo "==================== bench (rc=$brc, $(($(date +%s) - b0))s): ${ARGS[*]} ===================="
grep -vE "^  k:" "$LOG/bench.err" | tail -70
echo "---- top kernels (ms/step) ----"
grep -E "^  k:" "$LOG/bench.err" | head -40
echo "---- csv ----"
grep -E "decode|verify|prefill|draft" "$LOG/bench.csv" | grep -v profile_ | cut -c1-160 | head -30
sed -n '/device_run summary/,$p' "$LOG/device_run.out"
