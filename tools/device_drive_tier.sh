#!/usr/bin/env bash
# Issue 22 on the GPU machine: routed experts through all three tiers under the CUDA executor
# (HBM slots <- page-locked host cache <- O_DIRECT reads of two expert-store replica files on the
# machine's one disk), budgets forced small on the tiny fixtures (2 HBM slots per layer of 4
# experts, 2 host records: every tier serves, the drives serve real reads all run long), with
# reads started when the router has run (and without), a replica unlinked, truncated or failing
# with EIO mid-run, and a slow replica (hedged reads). Every run's stdout must equal the
# all-resident run's (--numerics exact); one run also compares with the CPU in lockstep. Then
# the drive tier of the synthetic released-dimension bench (bench/drive_tier.h; FB_DRIVE_BENCH=0
# skips it, FB_DRIVE_SKEWS picks the skews, default 0.45).
# Usage, in the repo root on the GPU machine:  tools/device_drive_tier.sh [FIXTURES_DIR]
# FIXTURES_DIR (default .fixtures) holds tiny-s0/ and tiny-s1-long/ (carry it). Logs go to $OUT
# (or /tmp/fb_out); the table is printed LAST. A dry run of the script on a CPU build:
#   FB_BUILD=build/cpu FB_BACKEND=cpu FB_SKIP_BUILD=1 tools/device_drive_tier.sh ../shared/fixtures
set -u
FIX=${1:-.fixtures}
LOG=${OUT:-/tmp/fb_out}
mkdir -p "$LOG"
BUILD=${FB_BUILD:-build/device}
BE=${FB_BACKEND:-cuda}
W=/tmp/fb_drive_tier  # on the disk, not tmpfs (O_DIRECT)
rm -rf "$W"
mkdir -p "$W"
T="$LOG/drive_tier_table.txt"
: >"$T"
row() { printf '%-30s %s\n' "$1" "$2" >>"$T"; }

t0=$(date +%s)
bc=0
if [ -z "${FB_SKIP_BUILD:-}" ]; then
  cmake --preset device -DCMAKE_CXX_FLAGS="-include cstdint" >"$LOG/configure.log" 2>&1
  row "configure" "rc=$?"
  cmake --build "$BUILD" -j16 --target flashbox >"$LOG/build_cli.log" 2>&1
  bc=$?
fi
row "build flashbox" "rc=$bc $(($(date +%s) - t0))s"
if [ $bc -ne 0 ]; then
  grep -E "error" "$LOG/build_cli.log" | head -20
  cat "$T"
  exit 1
fi
FB="$BUILD/flashbox"

timeout 60 "$FB" probe --dir "$W" --seconds 1 --file-mib 512 --no-sim >"$LOG/probe.log" 2>&1
row "disk (probe, O_DIRECT)" "$(grep -oE 'sequential 1M [0-9.]+ GB/s, random 1M [0-9.]+ GB/s' "$LOG/probe.log" | head -1)"

printf '%-26s %-4s %-9s %-11s %-10s %-22s %s\n' "case / mode" "rc" "output" "drive reads" "wait ms" "prefetch: used/unused" "replica A" >>"$T"
for c in tiny-s1-long tiny-s0; do
  [ -d "$FIX/$c" ] || { row "$c" "absent from $FIX"; continue; }
  timeout 120 "$FB" convert --model "$FIX/$c/checkpoint" --out "$W/$c/a" --replicas "$W/$c/b" >"$LOG/dt_convert_$c.log" 2>&1 || row "convert $c" "FAILED"
  timeout 120 "$FB" check-fixture "$FIX/$c" --backend $BE --numerics exact >"$LOG/dt_${c}_resident.out" 2>"$LOG/dt_${c}_resident.err"
  row "$c resident" "rc=$? $(grep -oE 'PASS|FAIL' "$LOG/dt_${c}_resident.out" | head -1)"
  modes="tiers noprefetch unlink truncate eio slow"
  [ $c = tiny-s0 ] && modes="tiers unlink"
  for m in $modes; do
    args="--expert-slots 2 --host-experts 2"
    if [ $m = tiers ] || [ $m = noprefetch ]; then
      args="$args --expert-store $W/$c/a $W/$c/b"
      [ $m = noprefetch ] && args="$args --no-expert-prefetch"
    else
      mkdir -p "$W/$c/${m}_a" "$W/$c/${m}_b"
      cp "$W/$c/a/experts.fbx" "$W/$c/${m}_a/"
      cp "$W/$c/a/experts.fbx" "$W/$c/${m}_b/"
      f="0@0:$m"
      [ $m = slow ] && f="0@0:delay=3000"
      args="$args --expert-store $W/$c/${m}_a $W/$c/${m}_b --fault-replica $f"
    fi
    timeout 120 "$FB" check-fixture "$FIX/$c" --backend $BE --numerics exact $args >"$LOG/dt_${c}_$m.out" 2>"$LOG/dt_${c}_$m.err"
    rc=$?
    same=DIFFERS
    cmp -s "$LOG/dt_${c}_resident.out" "$LOG/dt_${c}_$m.out" && same=IDENTICAL
    tiers=$(grep -m1 "expert tiers:" "$LOG/dt_${c}_$m.err")
    reads=$(echo "$tiers" | grep -oE 'drive reads [0-9]+' | awk '{print $3}')
    wait=$(echo "$tiers" | grep -oE 'drive wait [0-9.]+' | awk '{print $3}')
    pf=$(echo "$tiers" | grep -oE 'prefetch [0-9]+ reads \([0-9]+ used, [0-9]+ unused' | sed -E 's/prefetch ([0-9]+) reads \(([0-9]+) used, ([0-9]+) unused/\1: \2\/\3/')
    a=$(grep -m1 -E "check-fixture:   drive 0 " "$LOG/dt_${c}_$m.err" | grep -oE '[0-9]+ reads|[0-9]+ errors|FAILED: .*' | tr '\n' ' ' | cut -c1-60)
    printf '%-26s %-4s %-9s %-11s %-10s %-22s %s\n' "$c $m" "$rc" "$same" "${reads:-?}" "${wait:-?}" "${pf:-?}" "$a" >>"$T"
  done
  grep -m1 "HBM expert slots" "$LOG/dt_${c}_tiers.err" | cut -c1-150 | sed 's/^/  /' >>"$T"
  grep "check-fixture:   drive 1 " "$LOG/dt_${c}_slow.err" 2>/dev/null | head -1 | cut -c1-150 | sed 's/^/  slow A, B: /' >>"$T"
done
# CPU lockstep through the failing replica: bit identity with the CPU reference (exact class).
c=tiny-s1-long
if [ -d "$FIX/$c" ]; then
  mkdir -p "$W/cmp_a" "$W/cmp_b"
  cp "$W/$c/a/experts.fbx" "$W/cmp_a/"
  cp "$W/$c/a/experts.fbx" "$W/cmp_b/"
  timeout 180 "$FB" check-fixture "$FIX/$c" --backend $BE --numerics exact --compare-cpu --expert-slots 2 --host-experts 2 \
    --expert-store "$W/cmp_a" "$W/cmp_b" --fault-replica 0@0:unlink >"$LOG/dt_compare.out" 2>"$LOG/dt_compare.err"
  row "$c unlink --compare-cpu" "rc=$? $(grep -E '^compare' "$LOG/dt_compare.out" | cut -c1-110)"
fi
# The released dimensions (synthetic model, 384 experts, 128 HBM slots per layer, 64 page-locked
# host records, 64 records of 18.8 MB per drive file): one skew, reads at routing time vs when asked.
if [ "${FB_DRIVE_BENCH:-1}" = 1 ] && [ "$BE" = cuda ]; then
  mkdir -p "$W/d0" "$W/d1"
  s0=$(date +%s)
  timeout 150 "$FB" bench --synthetic --experts 384 --expert-slots 128 --expert-drives "$W/d0,$W/d1" --host-experts 64 \
    --drive-records 64 --skews ${FB_DRIVE_SKEWS:-0.45} --steps 6 --tier-warm-steps 64 --drive-warm-steps 3 --contexts 4096 \
    >"$LOG/dt_bench.csv" 2>"$LOG/dt_bench.err"
  row "bench drive tier (released dims)" "rc=$? $(($(date +%s) - s0))s"
  grep -E "^bench: (wrote|drive)" "$LOG/dt_bench.err" | cut -c1-260 | sed 's/^bench: /  /' >>"$T"
  grep -iE "error|fail" "$LOG/dt_bench.err" | head -3 | cut -c1-200 | sed 's/^/  /' >>"$T"
fi
row "total" "$(($(date +%s) - t0))s"
rm -rf "$W"
cat "$T"
