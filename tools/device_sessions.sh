#!/usr/bin/env bash
# One device call for issue 20's device acceptance (several sessions at once): configure with the
# `device` preset, build only the row-invariance GPU test and the CLI, run the test (a decode
# session's logits alone == beside other sessions' rows and a prompt chunk, both numerics classes),
# then the sessions bench on the released-dimension synthetic model (contexts fake-filled, a line
# per phase on stderr), and print a short table LAST with the acceptance checks.
# Usage, in the repo root on the GPU machine:  tools/device_sessions.sh [FIXTURES_DIR] [bench args...]
# FIXTURES_DIR (default .fixtures): tiny-s0/ for the test's fixture case (skipped when absent).
# Default bench args: --synthetic --experts 16 --reps 3 --sessions 1,2,4,8,16 --sessions-context 4096
#   --session-rounds 16 --arrival-prompt 32768 --arrival-tail 4096
# FB_BENCH_TIMEOUT (default 170 s) bounds the bench; logs and the CSV go to $OUT (or /tmp/fb_out).
set -u
FIX=${1:-.fixtures}
shift || true
LOG=${OUT:-/tmp/fb_out}
mkdir -p "$LOG"
BUILD=build/device
: >"$LOG/table.txt"
row() { printf '%-40s %s\n' "$1" "$2" >>"$LOG/table.txt"; }
csv() { awk -F, -v r="$1" '$7 == r { v = $9 } END { print v }' "$LOG/sessions.csv" 2>/dev/null; }
nvidia-smi -L 2>&1 | head -1

t0=$(date +%s)
cmake --preset device -DCMAKE_CXX_FLAGS="-include cstdint" ${FB_GIT_COMMIT:+-DFB_GIT_COMMIT=$FB_GIT_COMMIT} >"$LOG/configure.log" 2>&1
row "configure (device preset)" "rc=$? $(($(date +%s) - t0))s"
t1=$(date +%s)
cmake --build "$BUILD" -j16 --target cuda_row_invariance_test flashbox >"$LOG/build.log" 2>&1
bt=$?
row "build row-invariance test + flashbox" "rc=$bt $(($(date +%s) - t1))s"
[ $bt -ne 0 ] && grep -E "error|Error" "$LOG/build.log" | head -20

if [ $bt -eq 0 ]; then
  t2=$(date +%s)
  FB_FIXTURES_DIR="$PWD/$FIX" timeout 150 "$BUILD/tests/cuda_row_invariance_test" >"$LOG/row_invariance.log" 2>&1
  rc=$?
  row "cuda_row_invariance_test" "rc=$rc $(($(date +%s) - t2))s ok=$(grep -c '\[       OK \]' "$LOG/row_invariance.log") skipped=$(grep -cE '\[  SKIPPED \] [A-Za-z0-9_./]+ \(' "$LOG/row_invariance.log") failed=$(grep -cE '\[  FAILED  \] [A-Za-z0-9_./]+ \(' "$LOG/row_invariance.log")"
  grep -E "steps of [0-9]+ rows" "$LOG/row_invariance.log" | sort -u | sed 's/^/    /' >>"$LOG/table.txt"
  grep -E "Failure|changed beside|tap rows of step|\[  FAILED" "$LOG/row_invariance.log" | head -20

  ARGS=("$@")
  [ ${#ARGS[@]} -eq 0 ] && ARGS=(--synthetic --experts 16 --reps 3 --sessions 1,2,4,8,16 --sessions-context 4096 --session-rounds 16
                                 --arrival-prompt 32768 --arrival-tail 4096)
  t3=$(date +%s)
  timeout "${FB_BENCH_TIMEOUT:-170}" "$BUILD/flashbox" bench "${ARGS[@]}" --csv "$LOG/sessions.csv" >"$LOG/bench.out" 2>"$LOG/bench.err"
  brc=$?
  echo "==================== bench (rc=$brc, $(($(date +%s) - t3))s): ${ARGS[*]} ===================="
  tail -40 "$LOG/bench.err"
  row "bench --sessions" "rc=$brc $(($(date +%s) - t3))s (124: timed out; the phase lines above say where)"
  for n in 1 2 4 8 16; do
    v=$(csv "sessions_${n}_tok_s")
    [ -n "$v" ] && row "  $n sessions" "$v tok/s, x$(csv "sessions_${n}_speedup"), gap p50 $(csv "sessions_${n}_gap_p50_ms") p99 $(csv "sessions_${n}_gap_p99_ms") ms, session 0's tokens equal: $(csv "sessions_${n}_tokens_equal")"
  done
  s8=$(csv sessions_8_speedup)
  p1=$(csv sessions_1_gap_p99_ms)
  p8=$(csv sessions_8_gap_p99_ms)
  ar=$(csv arrival_gap_ratio)
  [ -n "$s8" ] && row "  accept: 8 sessions >= 5x one" "$(awk -v s="$s8" 'BEGIN { printf "%.2fx %s", s, (s >= 5 ? "MET" : "NOT MET") }')"
  [ -n "$p1" ] && [ -n "$p8" ] && row "  accept: p99 gap at 8 <= 1.5x one's" "$(awk -v a="$p8" -v b="$p1" 'BEGIN { r = a / b; printf "%.2fx %s", r, (r <= 1.5 ? "MET" : "NOT MET") }')"
  [ -n "$ar" ] && row "  accept: arrival worst gap < 3x median" "$(awk -v r="$ar" 'BEGIN { printf "%.2fx %s", r, (r < 3 ? "MET" : "NOT MET") }') (prefilled rows: $(csv arrival_prefilled_rows))"
fi
echo "==================== device_sessions summary ($(($(date +%s) - t0))s) ===================="
cat "$LOG/table.txt"
