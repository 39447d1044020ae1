#!/usr/bin/env python3
"""Per-thread CPU use of every process named COMM over SECONDS, summed by thread name.

Usage: thread-cpu.py COMM SECONDS. Reads /proc/<pid>/task/<tid>/stat twice (utime, stime);
prints one line per thread name (how many threads, user and system CPU in % of one core)
and the total, so a run shows where a collective's host CPU time goes."""
import os
import sys
import time


def snap(comm):
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != comm:
                    continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    s = f.read()
                name = s[s.index("(") + 1:s.rindex(")")]
                fields = s[s.rindex(")") + 2:].split()
                out[(pid, tid)] = (name, int(fields[11]), int(fields[12]))
        except OSError:
            continue  # a thread or process that ended between the listing and the read
    return out


def main():
    comm, secs = sys.argv[1], float(sys.argv[2])
    a = snap(comm)
    t0 = time.time()
    time.sleep(secs)
    b = snap(comm)
    dt = time.time() - t0
    hz = os.sysconf("SC_CLK_TCK")
    by_name = {}
    for key, (name, u, s) in b.items():
        if key not in a:
            continue
        row = by_name.setdefault(name, [0, 0.0, 0.0])
        row[0] += 1
        row[1] += (u - a[key][1]) / hz / dt * 100
        row[2] += (s - a[key][2]) / hz / dt * 100
    if not by_name:
        print(f"thread-cpu: no process named {comm}")
        sys.exit(1)
    for name, (n, u, s) in sorted(by_name.items(), key=lambda x: -(x[1][1] + x[1][2])):
        print(f"  {name:20s} threads {n:3d}  user {u:7.1f}%  sys {s:7.1f}%")
    tu = sum(r[1] for r in by_name.values())
    ts = sum(r[2] for r in by_name.values())
    print(f"  total over {dt:.1f} s: user {tu:.1f}% sys {ts:.1f}% (of one core)")


main()
