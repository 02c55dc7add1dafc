#!/usr/bin/env bash
# Issue 26: cold prefill at one prompt length with the CUDA driver's hardware queues set per
# process (`flashbox --cuda-connections N`, i.e. CUDA_DEVICE_MAX_CONNECTIONS, read when the
# context is made, so each value is its own process; the list's order interleaves them, e.g.
# "32 8 32 8"). Each process: the synthetic released-dimension model, 384 experts, 128 HBM
# slots per layer, uniform routing, one streamed run of PROMPT tokens; with FB_TRACE=1 the first
# process also traces one run and tools/trace_layers.py cuts it into layer steps.
# Usage on the GPU machine, in the repo root: tools/device_cold_connections.sh [PROMPT] [LIST]
#   default 32768 and "32 8 32"
set -u
PROMPT=${1:-32768}
LIST=${2:-"32 8 32"}
LOG=${OUT:-/tmp/fb_out}
mkdir -p "$LOG"
T="$LOG/connections_table.txt"
: >"$T"
t0=$(date +%s)
cmake --preset device -DCMAKE_CXX_FLAGS="-include cstdint" ${FB_GIT_COMMIT:+-DFB_GIT_COMMIT=$FB_GIT_COMMIT} >"$LOG/configure.log" 2>&1
timeout ${FB_BUILD_TIMEOUT:-300} cmake --build build/device -j16 --target flashbox >"$LOG/build.log" 2>&1
echo "build rc=$? $(($(date +%s) - t0))s" >>"$T"
i=0
for n in $LIST; do
  TR=""
  [ "${FB_TRACE:-0}" = 1 ] && [ $i = 0 ] && TR="--cold-prefill-trace --trace-csv $LOG/trace_c$n"
  s=$(date +%s)
  timeout ${FB_RUN_TIMEOUT:-170} build/device/flashbox --cuda-connections "$n" bench --synthetic --experts 384 --expert-slots 128 --cold-prefill "$PROMPT" \
    --cold-prefill-routing uniform --cold-prefill-serial 0 --cold-prefill-deadline 60 $TR --csv "$LOG/conn_${i}_c$n.csv" >"$LOG/conn_${i}_c$n.out" 2>"$LOG/conn_${i}_c$n.err"
  rc=$?
  line=$(grep -E "^bench: cold prefill +[0-9]+ +[0-9]+ +stream" "$LOG/conn_${i}_c$n.err" | head -1 | sed 's/^bench: cold prefill *//')
  echo "connections $n (run $i): rc=$rc $(($(date +%s) - s))s | $line" >>"$T"
  [ $rc -ne 0 ] && tail -2 "$LOG/conn_${i}_c$n.err" | cut -c1-200 | sed 's/^/  /' >>"$T"
  grep -E "^bench: cold prefill trace [0-9]+ \(" "$LOG/conn_${i}_c$n.err" | cut -c1-400 | sed 's/^bench: /  /' >>"$T"
  i=$((i + 1))
done
for f in "$LOG"/trace_c*.cold*.csv; do
  [ -f "$f" ] || continue
  python3 tools/trace_layers.py "$f" --show 3 2>&1 | sed 's/^/  layers /' >>"$T"
  gzip -f "$f"
done
echo "total $(($(date +%s) - t0))s" >>"$T"
echo "==================== device_cold_connections summary ===================="
cat "$T"
