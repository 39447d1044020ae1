#!/usr/bin/env python3
"""Medians over interleaved rounds of a gpu-net-kernel.sh compare() log.

Usage: rounds.py LOG. The log holds "== label" sections, each followed by nccl-tests output;
a label appears once per round. Prints, per label and size, the median out-of-place time
(us) and busbw (GB/s) over the rounds and the busbw's lowest and highest, then each label's
ratio to the first label whose name starts with "nccl" (busbw; time below 64 KB, where the
ratio is NCCL's time over railcc's): on a machine whose loopback network swings from run to
run (NCCL itself read half its busbw in one device call), one run per setting says little."""
import re
import statistics
import sys


def parse(path):
    runs = {}  # label -> size -> [(time, busbw)]
    label = None
    for line in open(path, errors="replace"):
        if line.startswith("== exit"):
            continue
        if line.startswith("== "):
            label = line[3:].strip()
            continue
        f = line.split()
        if label and len(f) >= 8 and re.fullmatch(r"\d+", f[0]) and re.fullmatch(r"\d+", f[1]):
            try:
                t, bw = float(f[5]), float(f[7])
            except ValueError:
                continue
            runs.setdefault(label, {}).setdefault(int(f[0]), []).append((t, bw))
    return runs


def main():
    runs = parse(sys.argv[1])
    if not runs:
        print(f"rounds: no result rows in {sys.argv[1]}")
        return
    base = next((l for l in runs if l.startswith("nccl")), None)
    print(f"{'label':22s} {'size':>11s} {'n':>2s} {'time us':>10s} {'busbw':>7s} {'low-high':>13s} {'vs ' + (base or '-'):>14s}")
    for label, sizes in runs.items():
        for size, vals in sorted(sizes.items()):
            t = statistics.median(v[0] for v in vals)
            bw = statistics.median(v[1] for v in vals)
            lo, hi = min(v[1] for v in vals), max(v[1] for v in vals)
            ratio = ""
            if base and size in runs[base]:
                bt = statistics.median(v[0] for v in runs[base][size])
                bb = statistics.median(v[1] for v in runs[base][size])
                r = bt / t if size < 65536 else (bw / bb if bb > 0 else float("nan"))
                ratio = f"{r:.2f}x"
            print(f"{label:22s} {size:>11d} {len(vals):>2d} {t:>10.1f} {bw:>7.2f} {lo:>6.2f}-{hi:<6.2f} {ratio:>14s}")


main()
