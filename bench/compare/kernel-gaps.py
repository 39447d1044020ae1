#!/usr/bin/env python3
"""Kernel durations and the gaps between kernels on each stream, from an nsys cuda_gpu_trace
CSV (`nsys stats -r cuda_gpu_trace -f csv`). Usage: kernel-gaps.py CSV [NAME_SUBSTRING].

Prints, per kernel name (filtered by NAME_SUBSTRING if given): count, median and p90
duration, and the median gap from the previous kernel's end on the same stream to its
start, in microseconds: where a small call's time goes on the GPU."""
import csv
import statistics
import sys


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def main():
    path = sys.argv[1]
    want = sys.argv[2] if len(sys.argv) > 2 else ""
    with open(path) as f:
        lines = [l for l in f if "," in l]
    rows = list(csv.DictReader(lines))
    if not rows:
        print(f"kernel-gaps: no rows in {path}")
        return
    key = lambda r, *names: next((r[n] for n in names if n in r), None)
    by_stream = {}
    for r in rows:
        name = key(r, "Name") or ""
        start, dur = key(r, "Start (ns)", "Start"), key(r, "Duration (ns)", "Duration")
        if start is None or dur is None:
            continue
        strm = key(r, "Strm", "Stream") or "?"
        by_stream.setdefault(strm, []).append((int(float(start)), int(float(dur)), name))
    stats = {}
    for evs in by_stream.values():
        evs.sort()
        prev_end = None
        for start, dur, name in evs:
            if want in name:
                s = stats.setdefault(name[:60], ([], []))
                s[0].append(dur / 1e3)
                if prev_end is not None:
                    s[1].append((start - prev_end) / 1e3)
            prev_end = start + dur
    for name, (durs, gaps) in sorted(stats.items(), key=lambda x: -len(x[1][0])):
        print(f"  {name:60s} n {len(durs):5d}  dur med {statistics.median(durs):8.1f} p90 {pct(durs, 0.9):8.1f}  "
              f"gap before med {statistics.median(gaps) if gaps else float('nan'):8.1f} p90 {pct(gaps, 0.9):8.1f} us")


main()
