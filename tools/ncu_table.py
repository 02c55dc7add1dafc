#!/usr/bin/env python3
"""Summarises an Nsight Compute text report (tools/device_ncu.sh's ncu.txt) per kernel: launches,
median duration, median DRAM throughput (% of peak and GB/s when bytes are reported), achieved
occupancy and registers. Usage: ncu_table.py ncu.txt"""
import re
import statistics
import sys


def main():
    rows = {}
    cur = None
    metrics = {}
    for line in open(sys.argv[1], errors="replace"):
        m = re.match(r"^  (?:void )?(\S+?)(?:<[^(]*>)?\(.*\)\s+\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", line)
        if m:
            if cur:
                rows.setdefault(cur, []).append(metrics)
            cur = m.group(1)
            grid = re.search(r"\((\d+, \d+, \d+)\)x\((\d+, \d+, \d+)\)", line)
            metrics = {"grid": grid.group(1) + " x " + grid.group(2) if grid else ""}
            continue
        if cur is None:
            continue
        m = re.match(r"^\s+(Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per Thread)\s+(\S+)\s+([\d.,]+)", line)
        if m:
            name, unit, val = m.group(1), m.group(2), float(m.group(3).replace(",", ""))
            if name == "Duration":
                val *= {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(unit, 1.0)
            metrics.setdefault(name, (val, unit))
    if cur:
        rows.setdefault(cur, []).append(metrics)
    print(f"{'kernel':34s} {'n':>3s} {'us (med)':>9s} {'DRAM %':>7s} {'mem %':>7s} {'occ %':>6s} {'regs':>5s}  grid x block")
    for k, ms in sorted(rows.items(), key=lambda kv: -sum(m.get("Duration", (0, ""))[0] for m in kv[1])):
        def med(key):
            v = [m[key][0] for m in ms if key in m]
            return statistics.median(v) if v else float("nan")
        print(f"{k[:34]:34s} {len(ms):3d} {med('Duration'):9.2f} {med('DRAM Throughput'):7.1f} {med('Memory Throughput'):7.1f} "
              f"{med('Achieved Occupancy'):6.1f} {med('Registers Per Thread'):5.0f}  {ms[0].get('grid', '')}")


if __name__ == "__main__":
    main()
