#!/usr/bin/env bash
# One device call for issue 19's question "do the register-streamed FP8 GEMVs pay on their own?"
# (rs_gemv=2: every FP8 call of <= 64 rows on rs_gemv.h, every MXFP4 call on the tiles; 1: both
# kinds on rs; 0: the tiles). Builds (device preset) flashbox and the row-invariance / options
# tests, then, each step with its own timeout:
#   1. cuda_options_test, cuda_row_invariance_test *fast_rs_fp8* (a row's bits alone == beside
#      others with rs_gemv=2);
#   2. check-fixture --cuda-opt rs_gemv=2 on every fixture in FIXTURES_DIR (the fast-class gates);
#   3. bench --synthetic --experts 16, interleaved A/B rs_gemv=0,2,1 at 4K (one row, 6 verify rows,
#      the draft block), then rs_gemv=0,2 at 128K;
#   4. the sessions bench (shared steps of 1 / 8 / 16 sessions at 4K) with rs_gemv=0 and 2, one
#      after the other (the sessions bench has no interleaved A/B).
# Prints a short table LAST; $OUT gets the CSVs and rs_modes_logs.tar.gz.
# Usage, in the repo root on the GPU machine:  tools/device_rs_modes.sh [FIXTURES_DIR]   (default .fixtures)
# Env: FB_AB_ROUNDS (default 5), FB_SKIP_SESSIONS=1, FB_SKIP_128K=1, FB_AB (the 4K A/B, default
#      rs_gemv=0,2,1), FB_OPT (--cuda-opt NAME=VALUE words for every bench run and check-fixture, e.g. "rs_group_ctas=4"),
#      FB_SESSION_MODES (the rs_gemv values of the sessions runs, default "0 2"), FB_GEMV_TESTS=1 (also
#      cuda_fast_gemv_test *RsFp8*).
set -u
FIX=${1:-.fixtures}
LOG=${OUT:-/tmp/fb_out}
mkdir -p "$LOG"
T="$LOG/table.txt"
: >"$T"
row() { printf '%-34s %s\n' "$1" "$2" >>"$T"; }
t0=$(date +%s)
cmake --preset device -DCMAKE_CXX_FLAGS="-include cstdint" ${FB_GIT_COMMIT:+-DFB_GIT_COMMIT=$FB_GIT_COMMIT} >"$LOG/configure.log" 2>&1 || row configure FAILED
TARGETS="flashbox cuda_options_test cuda_row_invariance_test"
[ "${FB_GEMV_TESTS:-0}" = 1 ] && TARGETS="$TARGETS cuda_fast_gemv_test"
OPT=()
for o in ${FB_OPT:-}; do OPT+=(--cuda-opt "$o"); done
timeout ${FB_BUILD_TIMEOUT:-360} cmake --build build/device -j16 --target $TARGETS >"$LOG/build.log" 2>&1
rc=$?
row build "rc=$rc $(($(date +%s) - t0))s"
[ $rc -ne 0 ] && grep -m8 -E "error" "$LOG/build.log" | cut -c1-200 >>"$T"
. "$(dirname "$0")/device_gtest.sh"
gtest options cuda_options_test '*' 30
[ "${FB_GEMV_TESTS:-0}" = 1 ] && gtest rs_fp8_tests cuda_fast_gemv_test '*RsFp8*' 120
gtest row_invariance_rs_fp8 cuda_row_invariance_test '*fast_rs_fp8*' 150
FB=build/device/flashbox
if [ -x $FB ]; then
  for c in tiny-s0 tiny-s1-long tiny-smooth tiny-vision; do
    [ -d "$FIX/$c" ] || continue
    timeout 120 $FB check-fixture "$FIX/$c" --backend cuda --cuda-opt rs_gemv=2 "${OPT[@]}" >"$LOG/cf_$c.out" 2>"$LOG/cf_$c.err"
    row "check-fixture $c rs_gemv=2" "rc=$? $(grep -oE 'PASS|FAIL' "$LOG/cf_$c.out" | head -1) $(grep -m1 -iE 'max \|dlogit\||top-1' "$LOG/cf_$c.out" | cut -c1-90)"
  done
  s=$(date +%s)
  AB=${FB_AB:-rs_gemv=0,2,1}
  timeout 200 $FB bench --synthetic --experts 16 --contexts 4096 --verify-rows 6 --steps 3 --reps 3 "${OPT[@]}" --ab "$AB" \
    --ab-rounds ${FB_AB_ROUNDS:-5} --csv "$LOG/bench_rs_modes_4k.csv" >"$LOG/bench_4k.out" 2>"$LOG/bench_4k.err"
  row "bench A/B $AB ${FB_OPT:-} (4K)" "rc=$? $(($(date +%s) - s))s"
  grep -E "A/B ${AB%%=*}" "$LOG/bench_4k.err" | cut -c1-200 | sed 's/^bench: /  /' >>"$T"
  if [ "${FB_SKIP_128K:-0}" != 1 ]; then
    s=$(date +%s)
    timeout 200 $FB bench --synthetic --experts 16 --contexts 131072 --verify-rows 6 --steps 3 --reps 3 --ab rs_gemv=0,2 \
      --ab-rounds 3 --csv "$LOG/bench_rs_modes_128k.csv" >"$LOG/bench_128k.out" 2>"$LOG/bench_128k.err"
    row "bench A/B rs_gemv=0,2 (128K)" "rc=$? $(($(date +%s) - s))s"
    grep -E "A/B rs_gemv" "$LOG/bench_128k.err" | cut -c1-200 | sed 's/^bench: /  /' >>"$T"
  fi
  if [ "${FB_SKIP_SESSIONS:-0}" != 1 ]; then
    for m in ${FB_SESSION_MODES:-0 2}; do
      s=$(date +%s)
      timeout 150 $FB bench --synthetic --experts 16 --reps 3 --sessions 1,8,16 --sessions-context 4096 --session-rounds 16 "${OPT[@]}" --cuda-opt rs_gemv=$m \
        --csv "$LOG/bench_sessions_rs$m.csv" >"$LOG/sessions_rs$m.out" 2>"$LOG/sessions_rs$m.err"
      row "sessions 1,8,16 rs_gemv=$m ${FB_OPT:-}" "rc=$? $(($(date +%s) - s))s"
      grep -E "sessions at [0-9]+:|session 0's" "$LOG/sessions_rs$m.err" | cut -c1-200 | sed 's/^bench: /  /' >>"$T"
    done
  fi
fi
row total "$(($(date +%s) - t0))s"
tar czf "$LOG/rs_modes_logs.tar.gz" -C "$LOG" --exclude=rs_modes_logs.tar.gz $(cd "$LOG" && ls | grep -v '\.csv$') 2>/dev/null &&
  (cd "$LOG" && for f in *; do case "$f" in *.csv | rs_modes_logs.tar.gz | table.txt) ;; *) rm -f -- "$f" ;; esac; done)
echo "==================== device_rs_modes summary ===================="
cat "$T"
