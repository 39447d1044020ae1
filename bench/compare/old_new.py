"""Old build against new build from one log of bench/compare/gpu-old-new.sh (issue 28).

usage: python3 old_new.py LOG MODE ROWS COLL...

LOG holds runs framed by "== run BUILD COLL K: command" and "== exit BUILD COLL K: STATUS"
(STATUS a number, or "skipped ..."), BUILD old or new, each run an nccl-tests table. ROWS is
the number of result rows a whole run prints. A run fails when its status is not 0, it has no
exit line, it prints fewer than ROWS rows, its "Out of bounds values" line is not "0 OK", or a
row has a #wrong other than 0 or N/A. Per size, each build's best of its passing runs (out of
place): below 64 KB the least time, ratio = old time / new time; from 64 KB the highest busbw,
ratio = new busbw / old busbw. So a ratio above 1 means the new build is faster. Prints a
table per collective, a summary line per collective and one for all; exit status 1 only when
a run failed.
"""
import os
import re
import sys

TIME_BELOW = 65536  # compare time below this many bytes, busbw from here on
LOW, HIGH = 0.97, 1.03
ROW = re.compile(r"^\s+\d+\s+\d+\s+\S+\s")


def parse_row(line):
    """nccl-tests result row -> (size, oop time us, oop busbw GB/s, oop wrong, ip wrong)."""
    t = line.split()
    rest = t[5:] if re.fullmatch(r"[a-z_]+", t[3]) else t[4:]  # with or without a redop
    if len(rest) < 8:
        raise ValueError(f"short row: {line.strip()}")
    return int(t[0]), float(rest[0]), float(rest[2]), rest[3], rest[7]


def parse_log(path):
    """-> list of runs: dict(build, coll, k, status, rows={size: (time, busbw)}, problems=[])."""
    runs, cur = [], None
    for line in open(path, errors="replace"):
        m = re.match(r"^== run (\w+) (\w+) (\d+):", line)
        if m:
            cur = dict(build=m[1], coll=m[2], k=int(m[3]), status=None, rows={}, oob=[],
                       problems=[])
            runs.append(cur)
            continue
        m = re.match(r"^== exit (\w+) (\w+) (\d+): (.*)$", line)
        if m and cur is not None:
            cur["status"] = m[4].strip()
            cur = None
            continue
        if cur is None:
            continue
        if "Out of bounds values" in line:
            cur["oob"].append(line.strip())
        elif ROW.match(line):
            try:
                size, time, busbw, w1, w2 = parse_row(line)
            except (ValueError, IndexError) as e:
                cur["problems"].append(f"unreadable row ({e})")
                continue
            for w in (w1, w2):
                if w not in ("0", "N/A"):
                    cur["problems"].append(f"#wrong {w} at {size} B")
            cur["rows"][size] = (time, busbw)
    return runs


def judge(run, rows):
    p = list(run["problems"])
    st = run["status"]
    if st is None:
        p.insert(0, "no exit line (killed?)")
    elif st.split()[0] != "0":
        p.insert(0, f"exit {st}")
    # Rank-blocked collectives print one row fewer per doubling of the GPU count: nccl-tests
    # folds sizes below one float per rank (8 and 16 B on 4 GPUs) into one 0 B row.
    if run["coll"] in ("all_gather", "reduce_scatter", "alltoall"):
        ng = int(os.environ.get("OLD_NEW_NG", "2"))
        rows -= max(ng.bit_length() - 1, 0)
    if len(run["rows"]) < rows:
        p.append(f"{len(run['rows'])} of {rows} rows")
    for o in run["oob"]:
        if not re.search(r"Out of bounds values\s*:\s*0 OK", o):
            p.append(o.lstrip("# "))
    return p


def human(n):
    for unit, f in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f} {unit}"
    return f"{n} B"


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    log, mode, rows, colls = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    runs = parse_log(log)
    failed, summaries, slower_all, total_all = [], [], 0, 0
    for coll in colls:
        mine = [r for r in runs if r["coll"] == coll]
        best = {"old": {}, "new": {}}
        for b in ("old", "new"):
            good = 0
            for r in (r for r in mine if r["build"] == b):
                why = judge(r, rows)
                if why:
                    failed.append(f"{b} {coll} run {r['k']}: {'; '.join(why)}")
                    continue
                good += 1
                for size, (t, bw) in r["rows"].items():
                    ot, obw = best[b].get(size, (float("inf"), 0.0))
                    best[b][size] = (min(ot, t), max(obw, bw))
            if good == 0:
                failed.append(f"{b} {coll}: no passing run")
        print(f"\n{coll} ({mode}): best of each build's runs, out of place; time us, busbw GB/s;"
              f" ratio > 1: new faster (time below {human(TIME_BELOW)}, busbw from there)")
        print(f"{'size':>8} {'old us':>9} {'new us':>9} {'old bw':>7} {'new bw':>7} {'by':>4}"
              f" {'ratio':>6}")
        n = slower = 0
        worst = None
        for size in sorted(set(best["old"]) | set(best["new"])):
            o, w = best["old"].get(size), best["new"].get(size)
            if o is None or w is None:
                print(f"{human(size):>8} {'-' if o is None else f'{o[0]:.2f}':>9}"
                      f" {'-' if w is None else f'{w[0]:.2f}':>9}  missing in one build")
                continue
            by = "time" if size < TIME_BELOW else "bw"
            if by == "time":
                ratio = o[0] / w[0] if w[0] > 0 else float("inf")
            else:
                ratio = w[1] / o[1] if o[1] > 0 else float("inf")
            mark = "SLOWER" if ratio < LOW else ("faster" if ratio > HIGH else "")
            note = ""
            if size == 0:
                note = " (0 B: not counted)"
            else:
                n += 1
                slower += ratio < LOW
                if worst is None or ratio < worst[0]:
                    worst = (ratio, size)
            print(f"{human(size):>8} {o[0]:>9.2f} {w[0]:>9.2f} {o[1]:>7.2f} {w[1]:>7.2f} {by:>4}"
                  f" {ratio:>6.3f} {mark}{note}")
        ws = f"{worst[0]:.3f} at {human(worst[1])}" if worst else "-"
        summaries.append(f"old-new {mode} {coll}: {n} sizes, worst ratio {ws}, {slower} below {LOW}")
        slower_all += slower
        total_all += n
    print()
    for s in summaries:
        print(s)
    print(f"old-new {mode}: {slower_all} of {total_all} sizes below {LOW}")
    if failed:
        print(f"old-new {mode}: FAILED runs ({len(failed)}):")
        for f in failed:
            print(f"  {f}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
