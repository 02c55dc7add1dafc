#!/usr/bin/env bash
# Issue 22, next-layer expert prediction (CudaRunOptions::expert_predict), on the GPU machine:
# builds flashbox and the fixture parity test into build/device (incremental on a warm machine),
# runs the parity cases of the tiers (the exact class equal to the CPU bit for bit with guesses
# copied ahead), check-fixture with 2 HBM slots and the router's own guesses (how many it copies
# ahead and how many its layer then uses), then the expert-tier sweep of the synthetic
# released-dimension model (384 experts, 128 HBM slots per layer) with prediction arms run in turn
# at each skew (bench --predict-accuracy: -1 off, A a guess holding a share A of the drawn routing),
# and the drive tier with a third arm (reads at routing time plus prediction).
# Usage, in the repo root:  tools/device_predict.sh [FIXTURES_DIR] [ARMS] [HOST_COMPUTE_MODES]
#   defaults .fixtures, "-1,0.8,1,-1", "0"
# Env: FB_SKEWS (0.3,0.45,0.6), FB_SWEEP_TIMEOUT (s per sweep, 400), FB_SKIP_TESTS=1, FB_SWEEP_ARGS,
#      FB_SLOTS (HBM slots per layer; default 128 on a card of > 100 GB, else 48), FB_SKIP_DRIVES=1,
#      FB_DRIVE_SKEWS (0.45), FB_DRIVE_ACCURACY (0.8), FB_DRIVE_TIMEOUT (240).
# Logs to $OUT (or /tmp/fb_out); the table is printed LAST.
set -u
FIX=${1:-.fixtures}
ARMS=${2:-"-1,0.8,1,-1"}
MODES=${3:-"0"}
LOG=${OUT:-/tmp/fb_out}
mkdir -p "$LOG"
T="$LOG/predict_table.txt"
: >"$T"
row() { printf '%-30s %s\n' "$1" "$2" >>"$T"; }
t0=$(date +%s)
[ -f build/device/build.ninja ] || cmake --preset device -DCMAKE_CXX_FLAGS="-include cstdint" ${FB_GIT_COMMIT:+-DFB_GIT_COMMIT=$FB_GIT_COMMIT} >"$LOG/pr_configure.log" 2>&1
targets="flashbox"
[ "${FB_SKIP_TESTS:-0}" = 1 ] || targets="flashbox cuda_fixture_parity_test"
timeout 480 cmake --build build/device -j16 --target $targets >"$LOG/pr_build.log" 2>&1
rc=$?
row build "rc=$rc $(($(date +%s) - t0))s"
[ $rc -ne 0 ] && grep -E "error" "$LOG/pr_build.log" | head -20
FB=build/device/flashbox
if [ "${FB_SKIP_TESTS:-0}" != 1 ] && [ $rc -eq 0 ]; then
  FB_FIXTURES_DIR="$PWD/$FIX" timeout 240 build/device/src/cuda/cuda_fixture_parity_test \
    --gtest_filter='Fixtures/FixtureParity.ExpertPredict*' >"$LOG/pr_parity.log" 2>&1
  row "fixture parity (predict)" "rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$LOG/pr_parity.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure|Expected|Which is" "$LOG/pr_parity.log" | head -20 >>"$T"
  grep -oE "\[ tc \] .* expert predict .*" "$LOG/pr_parity.log" | cut -c1-230 | sed 's/^/  /' >>"$T"
  for c in tiny-s0 tiny-s1-long tiny-smooth; do
    for nm in exact fast; do
      timeout 90 $FB check-fixture "$FIX/$c" --backend cuda --numerics $nm --compare-cpu --expert-slots 2 --cuda-opt expert_predict=1 \
        >"$LOG/pr_fixture_${c}_$nm.log" 2>&1
      row "check-fixture $c $nm slots 2 predict" "rc=$?"
      grep -E "^compare |next-layer prediction|HBM expert slots" "$LOG/pr_fixture_${c}_$nm.log" | sed 's/^check-fixture: //' | cut -c1-200 | sed 's/^/  /' >>"$T"
    done
  done
  # Host tiers under the slots (views expire between layers): the guesses start drive reads a
  # layer early instead of copies; the output must stay IDENTICAL, the exposed drive wait is printed.
  ST=/tmp/fb_predict_store
  rm -rf $ST && mkdir -p $ST
  timeout 120 $FB convert --model "$FIX/tiny-s1-long/checkpoint" --out $ST/a --replicas $ST/b >"$LOG/pr_convert.log" 2>&1
  row "convert tiny-s1-long" "rc=$?"
  for pr in 0 1; do
    timeout 120 $FB check-fixture "$FIX/tiny-s1-long" --backend cuda --numerics exact --compare-cpu --expert-slots 1 --host-experts 2 \
      --expert-store $ST/a $ST/b --cuda-opt expert_predict=$pr >"$LOG/pr_store_$pr.log" 2>&1
    row "store slots 1 host 2 predict=$pr" "rc=$?"
    grep -E "^compare |next-layer prediction|exposed drive wait|expert tiers:" "$LOG/pr_store_$pr.log" | sed 's/^check-fixture: //' | cut -c1-260 | sed 's/^/  /' >>"$T"
  done
fi
[ -x $FB ] || { row flashbox "missing"; cat "$T"; exit 1; }
# 128 slots x 40 layers x 18.8 MB = 96 GB: an H200's sweep; an 80 GB card gets 48 slots.
mem_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
SLOTS=${FB_SLOTS:-$([ "${mem_mib:-0}" -gt 100000 ] && echo 128 || echo 48)}
i=0
for m in $MODES; do
  i=$((i + 1))
  s0=$(date +%s)
  timeout ${FB_SWEEP_TIMEOUT:-400} $FB bench --synthetic --experts 384 --expert-slots $SLOTS --skews ${FB_SKEWS:-0.3,0.45,0.6} --contexts 4096 \
    --tier-prefill-rows 0 --predict-accuracy="$ARMS" --cuda-opt host_compute=$m ${FB_SWEEP_ARGS:-} --csv "$LOG/pr_sweep_${i}_$m.csv" \
    >/dev/null 2>"$LOG/pr_sweep_${i}_$m.err"
  rc=$?
  row "tier sweep $i host_compute=$m" "rc=$rc $(($(date +%s) - s0))s arms $ARMS, $SLOTS slots"
  grep -E "bench: tiers top-10 share" "$LOG/pr_sweep_${i}_$m.err" | sed 's/^bench: tiers //' | sed 's/(static placement [0-9.%]*), //; s/ (peak [0-9.]*)//; s/model floor/floor/' | cut -c1-300 | sed 's/^/  /' >>"$T"
  [ $rc -ne 0 ] && tail -4 "$LOG/pr_sweep_${i}_$m.err" | cut -c1-300 | sed 's/^/  /' >>"$T"
done
# The drive tier at released dimensions with a third arm: reads at routing time plus prediction
# (two replica files on the machine's disk, 64 page-locked host records; FB_SKIP_DRIVES=1 skips).
if [ "${FB_SKIP_DRIVES:-0}" != 1 ]; then
  W=/tmp/fb_predict_drives
  rm -rf $W && mkdir -p $W/d0 $W/d1
  s0=$(date +%s)
  timeout ${FB_DRIVE_TIMEOUT:-240} $FB bench --synthetic --experts 384 --expert-slots $SLOTS --expert-drives "$W/d0,$W/d1" --host-experts 64 \
    --drive-records 64 --skews ${FB_DRIVE_SKEWS:-0.45} --steps 6 --tier-warm-steps 64 --drive-warm-steps 3 --predict-accuracy=${FB_DRIVE_ACCURACY:-0.8} \
    --contexts 4096 --csv "$LOG/pr_drive.csv" >/dev/null 2>"$LOG/pr_drive.err"
  rc=$?
  row "drive tier + prediction" "rc=$rc $(($(date +%s) - s0))s, $SLOTS slots"
  grep -E "bench: drive tier top-10 share .*(HBM hits|prediction)" "$LOG/pr_drive.err" | sed 's/^bench: drive tier //' | cut -c1-330 | sed 's/^/  /' >>"$T"
  [ $rc -ne 0 ] && tail -4 "$LOG/pr_drive.err" | cut -c1-300 | sed 's/^/  /' >>"$T"
  rm -rf $W
fi
row total "$(($(date +%s) - t0))s"
echo "==================== expert prediction summary ===================="
cat "$T"
