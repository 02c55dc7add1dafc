#!/usr/bin/env bash
# A short device call for one change (device only): incremental build (device preset) of flashbox
# and the named GPU test binaries, the named gtest filters, then the synthetic decode bench with an
# interleaved A/B of one run option, optionally Nsight Compute over one decode step
# (tools/device_ncu_step.sh) and over the GEMV shapes (tools/device_ncu_gemv.sh). Prints a short
# table LAST. $OUT gets benchN.csv (and ncu_step.csv.gz / ncu_gemv.csv) plus logs.tgz.
# Usage, in the repo root on the GPU machine:
#   FB_TESTS="cuda_fast_attention_test:*Rope* cuda_fast_numerics_test:*Folded*" \
#   tools/device_ab.sh "NAME=a,b [NAME2=c,d ...]" [CONTEXTS] [VERIFY_ROWS]   (one bench run per A/B;
#   "NAME=a,b;NAME2=c,d" runs both A/Bs one after the other in one bench run, one model build)
# Env: FB_NCU_STEP=1 (whole-step ncu at 4K), FB_NCU_GEMV=1 (GEMV sections), FB_BENCH_TIMEOUT (200 s),
#      FB_BENCH_ARGS (extra bench arguments, e.g. "--profile").
set -u
AB=${1:?NAME=a,b}
CTX=${2:-4096}
VR=${3:-6}
LOG=${OUT:-/tmp/fb_out}
mkdir -p "$LOG"
T="$LOG/table.txt"
: >"$T"
row() { printf '%-28s %s\n' "$1" "$2" >>"$T"; }
t0=$(date +%s)
cmake --preset device -DCMAKE_CXX_FLAGS="-include cstdint" ${FB_GIT_COMMIT:+-DFB_GIT_COMMIT=$FB_GIT_COMMIT} >"$LOG/configure.log" 2>&1 || row configure FAILED
TARGETS="flashbox"
for t in ${FB_TESTS:-}; do TARGETS="$TARGETS ${t%%:*}"; done
timeout ${FB_BUILD_TIMEOUT:-400} cmake --build build/device -j16 --target $TARGETS >"$LOG/build.log" 2>&1
rc=$?
row build "rc=$rc $(($(date +%s) - t0))s ($TARGETS)"
[ $rc -ne 0 ] && grep -m6 -E "error" "$LOG/build.log" | cut -c1-220 >>"$T"
for t in ${FB_TESTS:-}; do
  bin=${t%%:*}
  filt=${t#*:}
  exe=$(find build/device -name "$bin" -type f -perm -u+x | head -1)
  if [ -z "$exe" ]; then row "$bin" "not built"; continue; fi
  FB_FIXTURES_DIR="$PWD/.fixtures" timeout ${FB_GTEST_TIMEOUT:-120} "$exe" --gtest_filter="$filt" >"$LOG/gtest_$bin.log" 2>&1
  rc=$?
  row "$bin $filt" "rc=$rc ok=$(grep -c '^\[       OK \]' "$LOG/gtest_$bin.log") failed=$(grep -cE '^\[  FAILED  \] [A-Za-z0-9_./]+ \(' "$LOG/gtest_$bin.log")"
  grep -E '^\[  FAILED  \] [A-Za-z0-9_./]+ \(' "$LOG/gtest_$bin.log" | head -5 >>"$T"
  grep -E "Failure|Expected|Which is|differ|changes bits" "$LOG/gtest_$bin.log" | head -6 | cut -c1-200 >>"$T"
done
if [ -x build/device/flashbox ]; then
  i=0
  for ab in $AB; do  # one bench run per word (a word may hold several A/Bs: "A=0,1;B=0,1")
    i=$((i + 1))
    b0=$(date +%s)
    timeout ${FB_BENCH_TIMEOUT:-200} build/device/flashbox bench --synthetic --experts 16 --contexts "$CTX" --verify-rows "$VR" --steps 3 --reps 5 \
      --ab "$ab" ${FB_BENCH_ARGS:-} --csv "$LOG/bench$i.csv" >"$LOG/bench$i.out" 2>"$LOG/bench$i.err"
    row "bench $i" "rc=$? $(($(date +%s) - b0))s --ab $ab --contexts $CTX --verify-rows $VR"
    grep -E ",(ab_|decode_ms|verify)" "$LOG/bench$i.csv" | cut -d, -f7-10 | head -60 >>"$T"
  done
fi
if [ "${FB_NCU_GEMV:-0}" = 1 ]; then
  OUT="$LOG" timeout 200 bash tools/device_ncu_gemv.sh >"$LOG/ncu_gemv.out" 2>&1
  row ncu_gemv "rc=$? (ncu_gemv.csv)"
fi
if [ "${FB_NCU_STEP:-0}" = 1 ]; then
  OUT="$LOG" timeout ${FB_NCU_TIMEOUT:-300} bash tools/device_ncu_step.sh >"$LOG/ncu_step.out" 2>&1
  row ncu_step "rc=$? $(tail -2 "$LOG/ncu_step.out" | head -1)"
  [ -f "$LOG/ncu_step.csv" ] && gzip -f "$LOG/ncu_step.csv"
fi
row total "$(($(date +%s) - t0))s"
tar czf /tmp/fb_ab_logs.tgz -C "$LOG" --exclude='*.csv' --exclude='*.gz' --exclude=table.txt . &&
  find "$LOG" -maxdepth 1 -type f ! -name '*.csv' ! -name '*.gz' ! -name table.txt -delete && mv /tmp/fb_ab_logs.tgz "$LOG/logs.tgz"
cat "$T"
