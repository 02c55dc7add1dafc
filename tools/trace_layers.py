#!/usr/bin/env python3
"""Cut a cold-prefill CUPTI trace (`bench --cold-prefill-trace --trace-csv P`, P.cold<N>.csv) into
layer steps and say where each one's time goes (issue 26).

A layer step runs from one `route_scores_kernel` start (the router of a MoE layer) to the next.
Streams are told apart by what they carry: the compute stream has the most kernels, the prefetch
stream the most host-to-device copies; host-to-device copies on the compute stream are the step's
own uploads (key tables, permutations), which queue on the copy engines with the prefetch.
Per layer step: span; kernels busy (union); prefetch copies busy; copies with no kernel beside
them (exposed); idle (neither); the compute stream's uploads (count, their time, the largest) and
its gaps (no record on the compute stream) split by the record that ends them: an upload (waiting
behind the copy engine's queue), a download (device to host: the host waiting to read the routing),
anything else (a kernel or an event wait: the host late with its work, or the step waiting on the
prefetch).
Prints the median layer step and the slowest few.

Usage: python3 tools/trace_layers.py TRACE.csv[.gz] [--show 5]
"""
import argparse
import csv
import gzip
import statistics
import sys
from collections import Counter


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        rows = []
        for r in csv.DictReader(f):
            rows.append((r["name"], int(r["stream"]), float(r["start_us"]), float(r["end_us"]), r["kernel"] == "1"))
    rows.sort(key=lambda r: r[2])
    return rows


def union(intervals):
    """Sorted, merged intervals."""
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def length(iv):
    return sum(b - a for a, b in iv)


def intersect(x, y):
    i = j = 0
    out = []
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append([a, b])
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def clip(iv, lo, hi):
    return [[max(a, lo), min(b, hi)] for a, b in iv if b > lo and a < hi]


def analyse(rows):
    kern_by_stream = Counter(s for n, s, a, b, k in rows if k)
    copy_by_stream = Counter(s for n, s, a, b, k in rows if not k and "HtoD" in n)
    if not kern_by_stream:
        raise SystemExit("trace_layers: no kernels in the trace")
    compute = kern_by_stream.most_common(1)[0][0]
    prefetch = next((s for s, _ in copy_by_stream.most_common() if s != compute), None)
    marks = [a for n, s, a, b, k in rows if k and n.startswith("route_scores")]
    if len(marks) < 2:
        raise SystemExit("trace_layers: fewer than two route_scores_kernel records: no layer steps to cut")
    kern = union([[a, b] for n, s, a, b, k in rows if k])
    pf = union([[a, b] for n, s, a, b, k in rows if not k and "HtoD" in n and s == prefetch])
    on_compute = [(n, a, b, k) for n, s, a, b, k in rows if s == compute]
    steps = []
    for lo, hi in zip(marks, marks[1:]):
        k = clip(kern, lo, hi)
        c = clip(pf, lo, hi)
        both = length(intersect(k, c))
        busy = length(union(k + c))
        ups = [(a, b) for n, a, b, kk in on_compute if not kk and "HtoD" in n and lo <= a < hi]
        # gaps on the compute stream: from the latest end so far to the next record's start
        gap_up = gap_down = gap_other = 0.0
        end = None
        for n, a, b, kk in on_compute:
            if b < lo:
                end = b if end is None else max(end, b)
                continue
            if a >= hi:
                break
            if end is not None and a > end:
                g = min(a, hi) - max(end, lo)
                if g > 0:
                    if not kk and "HtoD" in n:
                        gap_up += g
                    elif not kk and "DtoH" in n:
                        gap_down += g
                    else:
                        gap_other += g
            end = b if end is None else max(end, b)
        steps.append(dict(
            start=lo, span=hi - lo, kernels=length(k), copies=length(c), copies_alone=length(c) - both,
            idle=(hi - lo) - busy, uploads=len(ups), upload_time=sum(b - a for a, b in ups),
            upload_max=max((b - a for a, b in ups), default=0.0), gap_at_upload=gap_up, gap_at_download=gap_down, gap_other=gap_other))
    return compute, prefetch, steps


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--show", type=int, default=5, help="also print this many of the slowest layer steps")
    args = p.parse_args()
    compute, prefetch, steps = analyse(load(args.trace))
    cols = ["span", "kernels", "copies", "copies_alone", "idle", "upload_time", "upload_max", "gap_at_upload", "gap_at_download", "gap_other"]
    print(f"compute stream {compute}, prefetch stream {prefetch}, {len(steps)} layer steps (router to router), ms:")
    print(f"{'':>10} " + " ".join(f"{c:>13}" for c in cols) + f" {'uploads':>8}")
    med = {c: statistics.median(s[c] for s in steps) for c in cols + ["uploads"]}
    print(f"{'median':>10} " + " ".join(f"{med[c] / 1e3:13.2f}" for c in cols) + f" {med['uploads']:8.0f}")
    tot = {c: sum(s[c] for s in steps) for c in cols}
    print(f"{'sum':>10} " + " ".join(f"{tot[c] / 1e3:13.1f}" for c in cols))
    for s in sorted(steps, key=lambda s: -s["span"])[: args.show]:
        print(f"{s['start'] / 1e3:9.1f}: " + " ".join(f"{s[c] / 1e3:13.2f}" for c in cols) + f" {s['uploads']:8d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
