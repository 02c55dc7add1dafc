#!/usr/bin/env bash
# Issue 22 on the GPU machine: Engram tables on the drives under the CUDA executor.
#   1. cuda_fixture_parity_test's Engram cases: rows read from the checkpoint's shards with O_DIRECT
#      through a 2,000-byte row cache (EngramRowsFromTheDrivesBitForBit) and from the mapped tables
#      on the host (EngramOnHostAndExpertSlotsBitForBit): bit for bit against the CPU.
#   2. check-fixture --backend cuda --numerics exact on the tiny fixtures: resident, then Engram rows
#      from the drives (2,000-byte cache), then from a replica after the checkpoint's own shard is
#      unlinked mid-run (a copy of the fixture), then from Engram stores (convert --engram, two
#      replicas): stdout must equal the resident run's.
#   3. bench --synthetic (16 experts, 4K context) with the synthetic Engram tables on the disk
#      (an Engram store, DIR/engram.fbe, in two replica dirs, read with O_DIRECT): no row cache and a 64 MiB one,
#      each with an interleaved A/B of engram_prefetch_tasks=0,4 (rows staged ahead or by their
#      layer), beside the tables in host memory (--engram-place host): ms/token, rows read from the
#      drives per step row, exposed wait.
# Usage, in the repo root on the GPU machine:  tools/device_engram_drive.sh [FIXTURES_DIR]
# FIXTURES_DIR (default .fixtures) holds tiny-s0/ and tiny-s1-long/ (carry it). Logs go to $OUT
# (or /tmp/fb_out); the table is printed LAST. FB_SKIP_BUILD=1 uses an existing $FB_BUILD.
set -u
FIX=${1:-.fixtures}
LOG=${OUT:-/tmp/fb_out}
mkdir -p "$LOG"
BUILD=${FB_BUILD:-build/device}
W=/tmp/fb_engram_drive  # on the disk, not tmpfs (O_DIRECT)
rm -rf "$W"
mkdir -p "$W/e0" "$W/e1"
T="$LOG/engram_drive_table.txt"
: >"$T"
row() { printf '%-44s %s\n' "$1" "$2" >>"$T"; }

t0=$(date +%s)
bc=0
if [ -z "${FB_SKIP_BUILD:-}" ]; then
  cmake --preset device -DCMAKE_CXX_FLAGS="-include cstdint" ${FB_GIT_COMMIT:+-DFB_GIT_COMMIT=$FB_GIT_COMMIT} >"$LOG/configure.log" 2>&1
  row "configure" "rc=$?"
  cmake --build "$BUILD" -j16 --target flashbox cuda_fixture_parity_test >"$LOG/build.log" 2>&1
  bc=$?
fi
row "build" "rc=$bc $(($(date +%s) - t0))s"
if [ $bc -ne 0 ]; then
  grep -E "error" "$LOG/build.log" | head -20
  cat "$T"
  exit 1
fi
FB="$BUILD/flashbox"

FB_FIXTURES_DIR="$FIX" timeout 300 "$BUILD/src/cuda/cuda_fixture_parity_test" \
  --gtest_filter='*EngramRowsFromTheDrives*:*EngramOnHost*' >"$LOG/ed_parity.log" 2>&1
row "parity tests (Engram)" "rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$LOG/ed_parity.log" | tr '\n' ' ')"

for c in tiny-s1-long tiny-s0; do
  [ -d "$FIX/$c" ] || { row "$c" "absent from $FIX"; continue; }
  timeout 120 "$FB" check-fixture "$FIX/$c" --backend cuda --numerics exact >"$W/${c}_resident.out" 2>"$LOG/ed_${c}_resident.err"
  row "$c resident" "rc=$? $(tail -1 "$W/${c}_resident.out" | cut -c1-60)"
  timeout 120 "$FB" check-fixture "$FIX/$c" --backend cuda --numerics exact --engram-cache-bytes 2000 \
    >"$W/${c}_drives.out" 2>"$LOG/ed_${c}_drives.err"
  rc=$?
  same=$(cmp -s "$W/${c}_resident.out" "$W/${c}_drives.out" && echo IDENTICAL || echo DIFFERENT)
  row "$c Engram from the drives" "rc=$rc $same; $(grep -oE '[0-9]+ read from the drives \([0-9]+ B in [0-9]+ submissions, waited [0-9.]+ ms\)' "$LOG/ed_${c}_drives.err" | head -1)"
  mkdir -p "$W/copy" "$W/rep_$c"
  cp -r "$FIX/$c" "$W/copy/"
  cp -r "$FIX/$c/checkpoint" "$W/rep_$c/"
  timeout 120 "$FB" check-fixture "$W/copy/$c" --backend cuda --numerics exact --engram-cache-bytes 0 \
    --engram-replica "$W/rep_$c/checkpoint" --engram-fault 0@3:unlink >"$W/${c}_unlink.out" 2>"$LOG/ed_${c}_unlink.err"
  rc=$?
  same=$(cmp -s "$W/${c}_resident.out" "$W/${c}_unlink.out" && echo IDENTICAL || echo DIFFERENT)
  row "$c Engram, own shard unlinked" "rc=$rc $same; $(grep -c 'engram drive 0 .*failed' "$LOG/ed_${c}_unlink.err") drive-0 failure line(s)"
  timeout 120 "$FB" convert --model "$FIX/$c/checkpoint" --out "$W/es_$c/a" --replicas "$W/es_$c/b" --engram >"$LOG/ed_${c}_convert.log" 2>&1
  timeout 120 "$FB" check-fixture "$FIX/$c" --backend cuda --numerics exact --engram-cache-bytes 2000 --engram-store "$W/es_$c/a" "$W/es_$c/b" \
    >"$W/${c}_store.out" 2>"$LOG/ed_${c}_store.err"
  rc=$?
  same=$(cmp -s "$W/${c}_resident.out" "$W/${c}_store.out" && echo IDENTICAL || echo DIFFERENT)
  row "$c Engram store (one read a row)" "rc=$rc $same; $(grep -oE '[0-9]+ read from the drives \([0-9]+ B in [0-9]+ submissions, waited [0-9.]+ ms\)' "$LOG/ed_${c}_store.err" | head -1)"
done

B="--synthetic --experts 16 --contexts 4096 --verify-rows 1 --steps 5 --reps 3"
timeout 200 "$FB" bench $B --engram-place host --ab engram_prefetch_tasks=0,4 --ab-rounds 5 \
  --csv "$LOG/ed_bench_host.csv" >"$LOG/ed_bench_host.out" 2>"$LOG/ed_bench_host.err"
row "bench, tables in host memory" "rc=$? $(grep -oE 'A/B engram_prefetch_tasks=[0-9]+: [0-9.]+ ms/token' "$LOG/ed_bench_host.err" | tr '\n' ' ')"
for cache in 0 67108864; do
  timeout 240 "$FB" bench $B --engram-drives "$W/e0,$W/e1" --engram-cache-bytes $cache --ab engram_prefetch_tasks=0,4 --ab-rounds 5 \
    --csv "$LOG/ed_bench_drives_$cache.csv" >"$LOG/ed_bench_drives_$cache.out" 2>"$LOG/ed_bench_drives_$cache.err"
  row "bench, tables on the disk, cache $cache B" "rc=$? $(grep -oE 'A/B engram_prefetch_tasks=[0-9]+: [0-9.]+ ms/token' "$LOG/ed_bench_drives_$cache.err" | tr '\n' ' ')"
  row "  rows from the drives (decode rows)" "$(grep -oE 'Engram rows from the drives: [^(]*\([^)]*\)' "$LOG/ed_bench_drives_$cache.err" | head -1)"
  row "  hidden / exposed" "$(grep -oE 'Engram rows from host tables: .*' "$LOG/ed_bench_drives_$cache.err" | head -1)"
done
timeout 60 "$FB" probe --dir "$W" --seconds 1 --file-mib 256 --no-sim --no-host-experts >"$LOG/ed_probe.log" 2>&1
row "disk (probe)" "$(grep -oE 'random 4K [0-9.]+ GB/s \([0-9]+ IOPS\)' "$LOG/ed_probe.log" | head -1)"
row "total" "$(($(date +%s) - t0))s"
cat "$T"
