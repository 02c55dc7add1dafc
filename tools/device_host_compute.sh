#!/usr/bin/env bash
# Issue 22, cold experts computed on the host CPU beside the copies (CudaRunOptions::host_compute),
# on the GPU machine: builds flashbox and the fixture parity test into build/device, runs the
# parity cases that cover the tiers (the exact class equal to the CPU bit for bit with misses
# computed on the host, split or all), the probe's host-expert lines (the pool's rate, one thread,
# the pool's round trip with and without spinning), then the expert-tier sweep of the synthetic
# released-dimension model (384 experts, 128 HBM slots per layer) once per host_compute mode.
# Usage, in the repo root:  tools/device_host_compute.sh [FIXTURES_DIR] [MODES]
#   defaults .fixtures, "0 1"; a list such as "0 1 0 1" alternates the modes (a CSV and log per run)
# Env: FB_SKEWS (0.3,0.45,0.6), FB_SWEEP_TIMEOUT (s per sweep, 220), FB_SKIP_TESTS=1,
#      FB_SWEEP_ARGS (more bench options, e.g. "--cuda-opt numerics=exact").
# Logs to $OUT (or /tmp/fb_out); the table is printed LAST.
set -u
FIX=${1:-.fixtures}
MODES=${2:-"0 1"}
LOG=${OUT:-/tmp/fb_out}
mkdir -p "$LOG"
T="$LOG/host_compute_table.txt"
: >"$T"
row() { printf '%-30s %s\n' "$1" "$2" >>"$T"; }
t0=$(date +%s)
cmake --preset device -DCMAKE_CXX_FLAGS="-include cstdint" ${FB_GIT_COMMIT:+-DFB_GIT_COMMIT=$FB_GIT_COMMIT} >"$LOG/hc_configure.log" 2>&1
targets="flashbox"
[ "${FB_SKIP_TESTS:-0}" = 1 ] || targets="flashbox cuda_fixture_parity_test cpu_host_expert_test"
timeout 480 cmake --build build/device -j16 --target $targets >"$LOG/hc_build.log" 2>&1
rc=$?
row build "rc=$rc $(($(date +%s) - t0))s"
[ $rc -ne 0 ] && grep -E "error" "$LOG/hc_build.log" | head -20
FB=build/device/flashbox
if [ "${FB_SKIP_TESTS:-0}" != 1 ] && [ $rc -eq 0 ]; then
  build/device/src/cpu/cpu_host_expert_test >"$LOG/hc_cpu_test.log" 2>&1
  row "cpu_host_expert_test" "rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$LOG/hc_cpu_test.log" | tr '\n' ' ')"
  FB_FIXTURES_DIR="$PWD/$FIX" timeout 240 build/device/src/cuda/cuda_fixture_parity_test \
    --gtest_filter='Fixtures/FixtureParity.HostComputed*:Fixtures/FixtureParity.ExpertSlots*:Fixtures/FixtureParity.CudaMatchesCpu*' >"$LOG/hc_parity.log" 2>&1
  row "fixture parity (tiers)" "rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$LOG/hc_parity.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED|Failure|Expected|Which is" "$LOG/hc_parity.log" | head -20 >>"$T"
  grep -oE "\[ tc \] .* host compute .*" "$LOG/hc_parity.log" | cut -c1-230 | sed 's/^/  /' >>"$T"
fi
[ -x $FB ] || { row flashbox "missing"; cat "$T"; exit 1; }
# The fast class's quality with the host computing misses (its outputs are the reference's, not the
# fast GEMV's): the fixture gates and the distance to the CPU with 2 HBM slots, every miss on the
# host (2) against none (0).
if [ "${FB_SKIP_TESTS:-0}" != 1 ]; then
  for c in tiny-smooth tiny-s1-long; do
    for hm in 0 2; do
      timeout 90 $FB check-fixture "$FIX/$c" --backend cuda --numerics fast --compare-cpu --expert-slots 2 --cuda-opt host_compute=$hm \
        >"$LOG/hc_quality_${c}_$hm.log" 2>&1
      row "fast $c slots 2 host_compute=$hm" "rc=$?"
      grep -E "^compare |^check-fixture $c|misses computed on the host" "$LOG/hc_quality_${c}_$hm.log" | sed 's/^check-fixture: //' | cut -c1-240 | sed 's/^/  /' >>"$T"
    done
  done
fi
timeout 90 $FB probe --no-sim --seconds 2 --file-mib 64 >"$LOG/hc_probe.log" 2>&1
row probe "rc=$?"
grep -E "^host experts" "$LOG/hc_probe.log" | cut -c1-300 | sed 's/^/  /' >>"$T"
i=0
for m in $MODES; do  # a mode listed twice runs twice (alternating modes: an interleaved A/B)
  i=$((i + 1))
  s0=$(date +%s)
  timeout ${FB_SWEEP_TIMEOUT:-220} $FB bench --synthetic --experts 384 --expert-slots 128 --skews ${FB_SKEWS:-0.3,0.45,0.6} --contexts 4096 \
    --cuda-opt host_compute=$m ${FB_SWEEP_ARGS:-} --csv "$LOG/hc_sweep_${i}_$m.csv" >/dev/null 2>"$LOG/hc_sweep_${i}_$m.err"
  row "tier sweep $i host_compute=$m" "rc=$? $(($(date +%s) - s0))s"
  grep -E "bench: tiers top-10 share" "$LOG/hc_sweep_${i}_$m.err" | sed 's/^bench: tiers //' | cut -c1-330 | sed 's/^/  /' >>"$T"
  tail -2 "$LOG/hc_sweep_${i}_$m.err" | grep -iE "error|fail" | sed 's/^/  /' >>"$T"
done
row total "$(($(date +%s) - t0))s"
echo "==================== host compute summary ===================="
cat "$T"
