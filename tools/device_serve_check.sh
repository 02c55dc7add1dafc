#!/usr/bin/env bash
# The dashboard's CUDA side (issue 24) on the GPU machine: `flashbox serve --backend "$BACKEND" --op-times`
# on a fresh tiny model, a few requests, then /v1/stats read back and checked: device op times by
# family, the memory ledger by tier (HBM rows), Engram rows, the backend named. Prints one line per
# check and "serve-check: PASS|FAIL" last. Needs a flashbox built with the server and make-tiny
# (PCRE2 and cpp-httplib: tools/setup.sh on Debian; the lent H200 machine has neither, so there the
# GPU test CudaExecutorStats.OpTimesByFamilyAndEngramRows checks what the page reads instead).
# FB_BIN picks the binary (default build/device/flashbox), FB_SERVE_BACKEND the backend (default cuda).
# Usage, in the repo root on the GPU machine: tools/device_serve_check.sh [PORT]
set -u
PORT=${1:-18431}
FB=${FB_BIN:-build/device/flashbox}
BACKEND=${FB_SERVE_BACKEND:-cuda}
LOG=${OUT:-/tmp/fb_out}
mkdir -p "$LOG"
TINY=$(mktemp -d)/tiny
"$FB" make-tiny --out "$TINY" >"$LOG/serve_check_make_tiny.log" 2>&1 || { echo "serve-check: FAIL (make-tiny)"; exit 1; }
"$FB" serve --model "$TINY" --backend "$BACKEND" --op-times --port "$PORT" >"$LOG/serve_check.out" 2>"$LOG/serve_check.err" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT
up=0
for _ in $(seq 1 120); do
  if curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1; then up=1; break; fi
  kill -0 $pid 2>/dev/null || break
  sleep 0.5
done
[ $up = 1 ] || { tail -5 "$LOG/serve_check.err"; echo "serve-check: FAIL (server did not come up)"; exit 1; }
for k in 1 2 3; do
  curl -sf "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' \
    -d "{\"model\":\"tiny\",\"max_tokens\":24,\"temperature\":0,\"messages\":[{\"role\":\"user\",\"content\":\"hello number $k\"}]}" \
    >"$LOG/serve_check_reply_$k.json" || { echo "serve-check: FAIL (request $k)"; exit 1; }
done
curl -sf "http://127.0.0.1:$PORT/v1/stats" >"$LOG/serve_check_stats.json" || { echo "serve-check: FAIL (/v1/stats)"; exit 1; }
curl -sf "http://127.0.0.1:$PORT/metrics" >"$LOG/serve_check_metrics.txt" || { echo "serve-check: FAIL (/metrics)"; exit 1; }
python3 - "$LOG/serve_check_stats.json" "$LOG/serve_check_metrics.txt" "$BACKEND" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
metrics = open(sys.argv[2]).read()
ok = True
def check(name, cond, detail):
    global ok
    ok &= bool(cond)
    print(f"  {'ok  ' if cond else 'FAIL'} {name}: {detail}")
def find(obj, key):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key:
                return v
            r = find(v, key)
            if r is not None:
                return r
    elif isinstance(obj, list):
        for v in obj:
            r = find(v, key)
            if r is not None:
                return r
    return None
backend = find(s, "backend")
check("backend", backend is not None and sys.argv[3] in json.dumps(backend).lower(), json.dumps(backend)[:80])
ops = s.get("op_time") or {}
secs = ops.get("seconds", {}) if isinstance(ops, dict) else {}
nonzero = [(k, v) for k, v in secs.items() if isinstance(v, (int, float)) and v > 0]
check("op_time (op seconds by family)", len(nonzero) >= 3,
      f"{len(nonzero)} families with time > 0: " + ", ".join(f"{k} {v:.3g} s" for k, v in nonzero[:9]))
mem = s.get("memory") or {}
tier = "host" if sys.argv[3] == "cpu" else "hbm"
check(f"memory ledger by tier ({tier})", isinstance(mem.get(tier), dict) and mem[tier].get("total_bytes", 0) > 0, json.dumps(mem.get(tier))[:200])
eng = s.get("engram")
check("engram rows reported", eng is not None, json.dumps(eng)[:160])
gen = find(s, "generated")
check("tokens generated counted", isinstance(gen, (int, float)) and gen >= 3, str(gen))
check("/metrics has op time", "flashbox_op" in metrics, str(sum(1 for l in metrics.splitlines() if l.startswith("flashbox_op"))) + " lines")
print("serve-check:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
EOF
