#!/usr/bin/env bash
# One device call for session 21's unrun GPU code: the register-streamed GEMVs (rs_gemv.h, issue
# 19) and the CUDA executor's Engram staging (issue 22). Builds (device preset) flashbox and the
# test binaries, then, each step with its own timeout so a hang costs one step:
#   1. cuda_fast_gemv_test *Rs* (correctness: NMSE vs exact, row invariance, determinism, pairs,
#      special scales, rows grouped by expert), cuda_options_test, cuda_fixture_parity_test *Engram*
#      (bits with the tables on the host; hidden + exposed rows), cuda_row_invariance_test (exact,
#      fast, fast with rs_gemv);
#   2. check-fixture --cuda-opt rs_gemv=1 on every fixture in FIXTURES_DIR (the fast-class gates);
#   3. the micro-bench FastGemv.RsBench (rs vs the tiles at the released shapes, then the knobs);
#   4. bench --synthetic --experts 16 at 4K with 6 verify rows: interleaved A/B rs_gemv=0,1, then
#      with --engram-place host the A/B engram_prefetch_tasks=0,4.
# Prints a short table LAST; $OUT gets the logs (rs_logs.tar.gz) and the bench CSVs.
# Usage, in the repo root on the GPU machine:  tools/device_rs.sh [FIXTURES_DIR]   (default .fixtures)
# Env: FB_SKIP_BENCH=1 (steps 1-3 only), FB_AB_ROUNDS (default 5), FB_ENGRAM_AB=0 (no Engram A/B),
#      FB_QUICK=1 (the rs tests, fast_rs row invariance, the micro-bench and the rs_gemv A/B only: a short budget).
set -u
FIX=${1:-.fixtures}
LOG=${OUT:-/tmp/fb_out}
mkdir -p "$LOG"
T="$LOG/table.txt"
: >"$T"
row() { printf '%-34s %s\n' "$1" "$2" >>"$T"; }
t0=$(date +%s)
cmake --preset device -DCMAKE_CXX_FLAGS="-include cstdint" ${FB_GIT_COMMIT:+-DFB_GIT_COMMIT=$FB_GIT_COMMIT} >"$LOG/configure.log" 2>&1 || row configure FAILED
timeout ${FB_BUILD_TIMEOUT:-400} cmake --build build/device -j16 --target flashbox cuda_fast_gemv_test cuda_options_test cuda_fixture_parity_test cuda_row_invariance_test \
  >"$LOG/build.log" 2>&1
rc=$?
row build "rc=$rc $(($(date +%s) - t0))s"
[ $rc -ne 0 ] && grep -m8 -E "error" "$LOG/build.log" | cut -c1-200 >>"$T"
. "$(dirname "$0")/device_gtest.sh"
gtest rs_tests cuda_fast_gemv_test '*Rs*:-*RsBench' 120
Q=${FB_QUICK:-0}
[ "$Q" = 1 ] || gtest options cuda_options_test '*' 30
[ "$Q" = 1 ] || gtest engram_parity cuda_fixture_parity_test '*Engram*' 180
if [ "$Q" = 1 ]; then gtest row_invariance cuda_row_invariance_test '*fast_rs*' 120; else gtest row_invariance cuda_row_invariance_test '*' 300; fi
FB=build/device/flashbox
if [ -x $FB ] && [ "$Q" != 1 ]; then
  for c in tiny-s0 tiny-s1-long tiny-smooth tiny-vision; do
    [ -d "$FIX/$c" ] || continue
    timeout 120 $FB check-fixture "$FIX/$c" --backend cuda --cuda-opt rs_gemv=1 >"$LOG/cf_$c.out" 2>"$LOG/cf_$c.err"
    row "check-fixture $c rs_gemv=1" "rc=$? $(grep -oE 'PASS|FAIL' "$LOG/cf_$c.out" | head -1) $(grep -m1 -iE 'max \|dlogit\||top-1' "$LOG/cf_$c.out" | cut -c1-90)"
  done
fi
gtest rs_bench cuda_fast_gemv_test '*RsBench' 200
grep -E "^(tc tiles|rs \()" "$LOG/gtest_rs_bench.log" | cut -c1-230 | sed 's/^/  /' >>"$T"
grep -E "^rs depth" "$LOG/gtest_rs_bench.log" | cut -c1-230 | sed 's/^/  /' >>"$T"
grep -E "^(rs   |tiles|rs groups of 8|rs rows staged per group|rs group ctas [0-9]+) FP8 M=" "$LOG/gtest_rs_bench.log" | cut -c1-230 | sed 's/^/  /' >>"$T"
if [ "${FB_SKIP_BENCH:-0}" != 1 ] && [ -x $FB ]; then
  s=$(date +%s)
  timeout 240 $FB bench --synthetic --experts 16 --contexts 4096 --verify-rows 6 --steps 3 --reps 3 --ab rs_gemv=0,1 \
    --ab-rounds ${FB_AB_ROUNDS:-5} --csv "$LOG/bench_rs_ab.csv" >"$LOG/bench_rs_ab.out" 2>"$LOG/bench_rs_ab.err"
  row "bench A/B rs_gemv=0,1 (4K)" "rc=$? $(($(date +%s) - s))s"
  grep -E "A/B rs_gemv" "$LOG/bench_rs_ab.err" | cut -c1-200 | sed 's/^bench: /  /' >>"$T"
  s=$(date +%s)
  [ "$Q" = 1 ] || timeout 200 $FB bench --synthetic --experts 16 --contexts 4096 --verify-rows 6 --steps 3 --reps 3 --cuda-opt rs_gemv=1 --ab rs_group_ctas=${FB_GROUP_CTAS_AB:-4,16} \
    --ab-rounds ${FB_AB_ROUNDS:-5} --csv "$LOG/bench_rs_group_ab.csv" >"$LOG/bench_rs_group_ab.out" 2>"$LOG/bench_rs_group_ab.err"
  row "bench A/B rs_group_ctas (rs on)" "rc=$? $(($(date +%s) - s))s"
  grep -E "A/B rs_group_ctas" "$LOG/bench_rs_group_ab.err" | cut -c1-200 | sed 's/^bench: /  /' >>"$T"
  if [ "${FB_ENGRAM_AB:-1}" = 1 ]; then
    s=$(date +%s)
    timeout 200 $FB bench --synthetic --experts 16 --contexts 4096 --verify-rows 6 --steps 3 --reps 3 --engram-place host \
      --ab engram_prefetch_tasks=0,4 --ab-rounds ${FB_AB_ROUNDS:-5} --csv "$LOG/bench_engram_ab.csv" >"$LOG/bench_engram_ab.out" 2>"$LOG/bench_engram_ab.err"
    row "bench engram host, tasks 0,4" "rc=$? $(($(date +%s) - s))s"
    grep -E "A/B engram|Engram rows" "$LOG/bench_engram_ab.err" | cut -c1-200 | sed 's/^bench: /  /' >>"$T"
  fi
fi
row total "$(($(date +%s) - t0))s"
tar czf "$LOG/rs_logs.tar.gz" -C "$LOG" --exclude=rs_logs.tar.gz $(cd "$LOG" && ls | grep -v '\.csv$') 2>/dev/null &&
  (cd "$LOG" && for f in *; do case "$f" in *.csv | rs_logs.tar.gz | table.txt) ;; *) rm -f -- "$f" ;; esac; done)
echo "==================== device_rs summary ===================="
cat "$T"
