#!/usr/bin/env bash
# Nsight Compute over every kernel of one decode step (device only): builds flashbox (device
# preset), runs a one-step synthetic decode bench under ncu with a few metrics per kernel (time,
# DRAM bytes read / written), writes the raw CSV to $OUT/ncu_step.csv. The first decode step's
# kernels are the first launches whose names match the step's kernels (the bench's fill and
# limit kernels do not match). tools/ncu_table.py turns the CSV into the per-kernel table.
# Usage: tools/device_ncu_step.sh [LAUNCHES]   (default 1400: a whole 4K decode step)
# FB_NCU_BENCH_ARGS: extra bench arguments (e.g. --cuda-opt NAME=VALUE); FB_NCU_CONTEXT: the step's
# context (default 4096; the bench fake-fills it with a kernel the regex does not match);
# FB_NCU_RE: the kernel-name regex (default: every kernel of the step).
set -u
N=${1:-1400}
LOG=${OUT:-/tmp/fb_out}
mkdir -p "$LOG"
cmake --preset device -DCMAKE_CXX_FLAGS="-include cstdint" ${FB_GIT_COMMIT:+-DFB_GIT_COMMIT=$FB_GIT_COMMIT} >"$LOG/configure.log" 2>&1 || { tail -5 "$LOG/configure.log"; exit 1; }
cmake --build build/device -j16 --target flashbox >"$LOG/build_cli.log" 2>&1 || { grep -E "error" "$LOG/build_cli.log" | head; exit 1; }
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu"; exit 1; }
RE=${FB_NCU_RE:-}
[ -n "$RE" ] || RE='(tc_gemv|fast_|attn|rope|rms_norm|qdq|route|moe_|index_|topk|candidate|copy_rows|embed_rows|engram|hc_|stream_mean|scale_bf16|argmax|markov|confidence|gather|swiglu|act_quant|bf16_gemm|fp8_gemm|fp4_gemm|dequant|ratio2|scatter|bias_round|split_f32|sparse_attention)'
t0=$(date +%s)
timeout 420 "$NCU" --clock-control none -k "regex:$RE" --launch-count "$N" --csv --page raw \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size \
  build/device/flashbox bench --synthetic --experts 16 --contexts ${FB_NCU_CONTEXT:-4096} --steps 1 --verify-rows 1 --reps 1 ${FB_NCU_BENCH_ARGS:-} >"$LOG/ncu_step.csv" 2>"$LOG/ncu_step.err"
echo "ncu rc=$? $(($(date +%s) - t0))s, $(grep -c '^"' "$LOG/ncu_step.csv") csv lines"
tail -3 "$LOG/ncu_step.err"
