#!/usr/bin/env python3
"""tools/trace_layers.py (issue 26): a hand-made trace of two layer steps whose every figure is
worked out here by hand (kernels, prefetch copies, exposed copies, idle, the compute stream's
upload and its gaps, split by what ends them), read back through the CLI from a CSV and from a
gzipped CSV; then the committed 32K trace (docs/bench), whose layer steps must tile the span
between the first and last router and keep every part inside its step."""
import csv, gzip, importlib.util, os, subprocess, sys, tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
SCRIPT = os.path.join(ROOT, "tools", "trace_layers.py")
TRACE = os.path.join(ROOT, "docs", "bench", "h200-s24-cold-prefill-trace-c9677de-32k.csv.gz")


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def near(a, b, what):
    if abs(a - b) > 1e-6:
        fail(f"{what}: {a} != {b}")


spec = importlib.util.spec_from_file_location("trace_layers", SCRIPT)
tl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tl)

# (name, stream, start_us, end_us, kernel); stream 1 computes, stream 2 prefetches.
rows = [
    ("route_scores_kernel", 1, 0, 100, True),
    ("gemm", 1, 100, 1100, True),
    ("memcpy DtoH", 1, 1500, 1510, False),  # 400 us without work before it: the host reading the routing
    ("memcpy HtoD", 1, 3000, 3010, False),  # 1,490 us: an upload queued behind the prefetch
    ("gemm", 1, 3010, 4000, True),
    ("attn", 1, 4500, 5000, True),  # 500 us: another gap
    ("memcpy HtoD", 2, 200, 1100, False),
    ("memcpy HtoD", 2, 1100, 2000, False),
    ("memcpy HtoD", 2, 2000, 2900, False),
    ("route_scores_kernel", 1, 5000, 5100, True),
    ("gemm", 1, 5100, 5900, True),
    ("route_scores_kernel", 1, 6000, 6050, True),
]
compute, prefetch, steps = tl.analyse(sorted(rows, key=lambda r: r[2]))
if (compute, prefetch) != (1, 2):
    fail(f"streams {compute}, {prefetch}")
if len(steps) != 2:
    fail(f"{len(steps)} layer steps, expected 2")
a, b = steps
want_a = dict(start=0, span=5000, kernels=2590, copies=2700, copies_alone=1800, idle=610, uploads=1, upload_time=10, upload_max=10,
              gap_at_upload=1490, gap_at_download=400, gap_other=500)
want_b = dict(start=5000, span=1000, kernels=900, copies=0, copies_alone=0, idle=100, uploads=0, upload_time=0, upload_max=0,
              gap_at_upload=0, gap_at_download=0, gap_other=0)
for got, want, tag in ((a, want_a, "step 1"), (b, want_b, "step 2")):
    for k, v in want.items():
        near(got[k], v, f"{tag} {k}")

with tempfile.TemporaryDirectory() as d:
    plain = os.path.join(d, "t.csv")
    with open(plain, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "stream", "start_us", "end_us", "grid", "kernel"])
        for n, s, t0, t1, k in rows:
            w.writerow([n, s, t0, t1, 1 if k else 0, int(k)])
    packed = plain + ".gz"
    with open(plain, "rb") as src, gzip.open(packed, "wb") as dst:
        dst.write(src.read())
    for path in (plain, packed):
        out = subprocess.run([sys.executable, SCRIPT, path, "--show", "1"], capture_output=True, text=True)
        if out.returncode != 0:
            fail(f"{path}: rc {out.returncode}: {out.stderr}")
        lines = out.stdout.splitlines()
        if "2 layer steps" not in lines[0]:
            fail("header: " + lines[0])
        med = lines[2].split()
        if med[0] != "median" or abs(float(med[1]) - 3.0) > 1e-9:  # the median of 5.0 and 1.0 ms
            fail("median row: " + lines[2])
    bad = os.path.join(d, "bad.csv")
    with open(bad, "w") as f:
        f.write("name,stream,start_us,end_us,grid,kernel\n\"gemm\",1,0,10,1,1\n")
    out = subprocess.run([sys.executable, SCRIPT, bad], capture_output=True, text=True)
    if out.returncode == 0:
        fail("a trace without two routers must be refused")

if not os.path.exists(TRACE):
    fail("missing " + TRACE)
recs = tl.load(TRACE)
compute, prefetch, steps = tl.analyse(recs)
marks = [r[2] for r in recs if r[4] and r[0].startswith("route_scores")]
if len(steps) != len(marks) - 1 or len(steps) < 40:
    fail(f"{len(steps)} steps for {len(marks)} routers")
near(sum(s["span"] for s in steps), marks[-1] - marks[0], "spans tile the traced run")
for i, s in enumerate(steps):
    for part in ("kernels", "copies", "idle", "gap_at_upload", "gap_at_download", "gap_other"):
        if s[part] < -1e-6 or s[part] > s["span"] + 1e-6:
            fail(f"step {i}: {part} {s[part]} outside its span {s['span']}")
    if s["copies_alone"] > s["copies"] + 1e-6:
        fail(f"step {i}: exposed copies above the copies")
print(f"trace_layers: hand-made steps as worked out; the 32K trace: {len(steps)} layer steps tile {(marks[-1] - marks[0]) / 1e3:.1f} ms")
