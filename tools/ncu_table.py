#!/usr/bin/env python3
"""Per-kernel table of one decode step from tools/device_ncu_step.sh's raw ncu CSV.

Usage: tools/ncu_table.py ncu_step.csv [--graph-ms MS] [--md]
The step is the launches from the first embed_rows_kernel up to (not including) the second one.
For each kernel (name, grid shape class) it prints calls, total and mean time, DRAM bytes and the
achieved DRAM rate; the sum of kernel times against the step's graph-replay time (--graph-ms)
gives the time between kernels (launch latency, PDL waits, tails)."""
import argparse
import collections
import csv
import gzip
import re

SCALE = {'ns': 1e-9, 'usecond': 1e-6, 'us': 1e-6, 'msecond': 1e-3, 'ms': 1e-3, 'second': 1.0, 's': 1.0,
         'byte': 1.0, 'Kbyte': 1e3, 'Mbyte': 1e6, 'Gbyte': 1e9, 'KB': 1e3, 'MB': 1e6, 'GB': 1e9, 'nsecond': 1e-9}


def short(name):
    name = re.sub(r'\(.*', '', name)            # parameters
    name = re.sub(r'.*::', '', name)            # namespaces
    return name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('csv')
    ap.add_argument('--graph-ms', type=float, default=0.0)
    ap.add_argument('--md', action='store_true')
    a = ap.parse_args()
    opener = gzip.open if a.csv.endswith(".gz") else open
    rows = list(csv.reader(opener(a.csv, "rt")))
    hi = next(i for i, r in enumerate(rows) if r and r[0] == 'ID')
    head, units, data = rows[hi], rows[hi + 1], rows[hi + 2:]
    col = {n: i for i, n in enumerate(head)}

    def val(r, metric):
        i = col[metric]
        v = r[i].replace(',', '')
        return float(v) * SCALE.get(units[i], 1.0) if v not in ('', 'n/a') else 0.0

    starts = [i for i, r in enumerate(data) if short(r[col['Kernel Name']]).startswith('embed_rows_kernel')]
    if not starts:
        raise SystemExit('no embed_rows_kernel: not a decode step capture')
    end = starts[1] if len(starts) > 1 else len(data)
    step = data[starts[0]:end]
    agg = collections.OrderedDict()
    tot_t = tot_b = 0.0
    for r in step:
        k = short(r[col['Kernel Name']])
        t = val(r, 'gpu__time_duration.sum')
        b = val(r, 'dram__bytes_read.sum') + val(r, 'dram__bytes_write.sum')
        e = agg.setdefault(k, [0, 0.0, 0.0])
        e[0] += 1
        e[1] += t
        e[2] += b
        tot_t += t
        tot_b += b
    items = sorted(agg.items(), key=lambda kv: -kv[1][1])
    fmt = '| {} | {} | {:.3f} | {:.1f} | {:.1f} | {:.0f} |' if a.md else '{:<34} {:>6} {:>9.3f} {:>9.1f} {:>10.1f} {:>8.0f}'
    if a.md:
        print('| kernel | calls | ms per step | us per call | MB per step | GB/s |')
        print('|---|---|---|---|---|---|')
    else:
        print('{:<34} {:>6} {:>9} {:>9} {:>10} {:>8}'.format('kernel', 'calls', 'ms/step', 'us/call', 'MB/step', 'GB/s'))
    for k, (n, t, b) in items:
        print(fmt.format(k, n, t * 1e3, t / n * 1e6, b / 1e6, b / t / 1e9 if t > 0 else 0))
    print(('| **all {} kernels** | {} | {:.3f} | | {:.1f} | {:.0f} |' if a.md else 'all {} kernels: {} launches, {:.3f} ms, {:.1f} MB, {:.0f} GB/s').format(
        len(agg), len(step), tot_t * 1e3, tot_b / 1e6, tot_b / tot_t / 1e9))
    if a.graph_ms > 0:
        gap = a.graph_ms - tot_t * 1e3
        if gap >= 0:
            print('graph replay {:.3f} ms - kernels {:.3f} ms = {:.3f} ms between kernels ({:.2f} us per launch)'.format(
                a.graph_ms, tot_t * 1e3, gap, gap * 1e3 / len(step)))
        else:
            print('graph replay {:.3f} ms < kernels {:.3f} ms one at a time: {:.3f} ms of kernel time overlaps (PDL, the side '
                  'stream); the gaps between kernels are not separable from this capture'.format(a.graph_ms, tot_t * 1e3, -gap))


if __name__ == '__main__':
    main()
