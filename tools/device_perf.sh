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
timeout ${FB_BENCH_TIMEOUT:-420} build/device/flashbox bench "${ARGS[@]}" --csv "$LOG/bench.csv" >"$LOG/bench.out" 2>"$LOG/bench.err"
brc=$?
echo "==================== bench (rc=$brc, $(($(date +%s) - b0))s): ${ARGS[*]} ===================="
grep -vE "^  k:" "$LOG/bench.err" | tail -70
echo "---- top kernels (ms/step) ----"
grep -E "^  k:" "$LOG/bench.err" | head -40
echo "---- csv ----"
grep -E "decode|verify|prefill|draft" "$LOG/bench.csv" | grep -v profile_ | cut -c1-160 | head -30
# Optional, same call: the expert-tier sweep (issue 9) and the reference side by side (issue 6).
#   FB_TIER_ARGS="--synthetic --experts 384 --expert-slots 128 ..."   a second bench invocation
#   FB_REF=1 with .oracle/ carried (never committed, ORACLE.md): reference vs flashbox on tiny-s0
if [ -n "${FB_TIER_ARGS:-}" ]; then
  timeout 200 build/device/flashbox bench $FB_TIER_ARGS --csv "$LOG/tiers.csv" >/dev/null 2>"$LOG/tiers.err"
  echo "==================== tier sweep (rc=$?): $FB_TIER_ARGS ===================="
  grep -E "^bench: (tiers|page-locked|synthetic)" "$LOG/tiers.err" | tail -8
fi
if [ "${FB_REF:-0}" = 1 ] && [ -f .oracle/bench_ref.py ]; then
  echo "==================== reference side by side (tiny-s0) ===================="
  timeout 120 python3 .oracle/bench_ref.py "$FIX/tiny-s0" 20 2>&1 | tail -2
  timeout 60 build/device/flashbox bench --model "$FIX/tiny-s0/checkpoint" --prompt-len 41 --steps 20 --csv "$LOG/ref_flashbox.csv" 2>&1 | tail -2
  grep -E "decode_ms|decode_tok_s" "$LOG/ref_flashbox.csv" | cut -d, -f7-10
fi
sed -n '/device_run summary/,$p' "$LOG/device_run.out"
# The device returns a handful of files: the CSVs, and everything else in one archive.
tar czf /tmp/fb_logs.tgz -C "$LOG" --exclude='*.csv' . && find "$LOG" -maxdepth 1 -type f ! -name '*.csv' -delete && mv /tmp/fb_logs.tgz "$LOG/logs.tgz"
