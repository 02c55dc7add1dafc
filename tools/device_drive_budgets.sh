#!/usr/bin/env bash
# Issue 22's "the plan predicts measured tok/s within 10% at three budget settings", on the GPU
# machine: the drive tier of the synthetic released-dimension bench (bench/drive_tier.h: 384
# experts, two replica files of DRIVE_RECORDS records on the machine's one disk, Zipf routing at
# one skew, the HBM slots and host cache warmed to steady state without the drives first) run
# once per budget setting "SLOTS:HOST" (HBM expert slots per layer : page-locked host records),
# or "SLOTS:HOST:DRIVE@AFTER:KIND" with a replica fault injected mid-run (bench --drive-fault, e.g.
# 0@400:unlink: drive 0's record file unlinked after 400 of its reads; the run must go on).
# Builds flashbox into build/device first when it is not there (a warm machine keeps it).
# Usage, in the repo root:  tools/device_drive_budgets.sh [SETTINGS] [SKEW]
#   default SETTINGS "96:64 128:64 128:1536 128:64:0@400:unlink", SKEW 0.45
# Warm-up (session 24): FB_DRIVE_REPLAY_TOKENS decode tokens (default 3000, the plan's steady state)
# are replayed in the HBM slot caches and the host cache without kernels (bench
# --drive-replay-tokens), then FB_WARM_STEPS real decode steps from the pool (default 128) also look
# every slot miss up in the host cache, whose records are then read from the drives: the timed steps
# start with the slots and the host cache as the plan models them.
# Env: FB_DRIVE_REPLAY_TOKENS (3000), FB_WARM_STEPS (128), FB_STEPS (timed per arm, 16),
#      FB_DRIVE_WARM_STEPS (steps through the drives before each timed arm, 3),
#      FB_DRIVE_RECORDS (per file, 64), FB_RUN_TIMEOUT (s per setting, 150).
# Logs and the CSVs go to $OUT (or /tmp/fb_out); the table is printed LAST. The plan to compare
# with: `flashbox probe --drive-gbps G --expert-slots S --host-experts H ...` with the drives' rate
# the run measured, or the rate `probe --store` reads from the run's own record files after it
# (printed per setting; docs/tiers.md).
set -u
SETTINGS=${1:-"96:64 128:64 128:1536 128:64:0@400:unlink"}
SKEW=${2:-0.45}
LOG=${OUT:-/tmp/fb_out}
mkdir -p "$LOG"
T="$LOG/drive_budgets_table.txt"
: >"$T"
row() { printf '%-26s %s\n' "$1" "$2" >>"$T"; }
t0=$(date +%s)
if [ ! -x build/device/flashbox ]; then
  cmake --preset device -DCMAKE_CXX_FLAGS="-include cstdint" ${FB_GIT_COMMIT:+-DFB_GIT_COMMIT=$FB_GIT_COMMIT} >"$LOG/db_configure.log" 2>&1
  timeout 420 cmake --build build/device -j16 --target flashbox >"$LOG/db_build.log" 2>&1
  row build "rc=$? $(($(date +%s) - t0))s"
fi
FB=build/device/flashbox
[ -x $FB ] || { row flashbox "missing"; cat "$T"; exit 1; }
W=/tmp/fb_drive_budgets  # on the disk, not tmpfs (O_DIRECT)
# The disk as the plan should see it: each replica dir alone, then both at the reader's depth.
mkdir -p "$W/d0" "$W/d1"
timeout 90 $FB probe --dir "$W/d0" --dir "$W/d1" --seconds 1 --file-mib 512 --no-sim >"$LOG/db_probe_disk.log" 2>&1
row "disk (probe, O_DIRECT)" "$(grep -oE 'sequential 1M [0-9.]+ GB/s, random 1M [0-9.]+ GB/s' "$LOG/db_probe_disk.log" | head -1)"
row "drives together (probe)" "$(grep -oE 'drives together .*' "$LOG/db_probe_disk.log" | head -1 | cut -c1-160)"
for s in $SETTINGS; do
  IFS=: read -r S H F1 F2 <<<"$s"
  FAULT=""
  [ -n "${F1:-}" ] && FAULT="--drive-fault $F1:$F2"
  tag="${S}_${H}${F1:+_fault}"
  rm -rf "$W"
  mkdir -p "$W/d0" "$W/d1"
  s0=$(date +%s)
  timeout ${FB_RUN_TIMEOUT:-150} $FB bench --synthetic --experts 384 --expert-slots "$S" --expert-drives "$W/d0,$W/d1" --host-experts "$H" \
    --drive-records ${FB_DRIVE_RECORDS:-64} --skews "$SKEW" --steps ${FB_STEPS:-16} --tier-warm-steps ${FB_WARM_STEPS:-128} \
    --drive-replay-tokens ${FB_DRIVE_REPLAY_TOKENS:-3000} --drive-warm-steps ${FB_DRIVE_WARM_STEPS:-3} --contexts 4096 $FAULT \
    >"$LOG/db_$tag.csv" 2>"$LOG/db_$tag.err"
  row "slots $S host $H${F1:+ fault $F1:$F2}" "rc=$? $(($(date +%s) - s0))s"
  grep -E "^bench: drive" "$LOG/db_$tag.err" | cut -c1-330 | sed 's/^bench: /  /' >>"$T"
  grep -iE "error|fail" "$LOG/db_$tag.err" | head -3 | cut -c1-200 | sed 's/^/  /' >>"$T"
  # The plan's drive rate read from this run's own record files, as the reader reads them
  # (`probe --store`, nothing written), right after the run: the rate to plan this setting with.
  timeout 60 $FB probe --store "$W/d0" --store "$W/d1" --dir "$W" --seconds 2 --file-mib 256 --no-sim >"$LOG/db_probe_$tag.log" 2>&1
  grep -E "^(drives reading the store|drives together|probe:)" "$LOG/db_probe_$tag.log" | cut -c1-220 | sed 's/^/  probe: /' >>"$T"
done
rm -rf "$W"
row total "$(($(date +%s) - t0))s"
echo "==================== device_drive_budgets summary ===================="
cat "$T"
