"""Builds the comparison table from one run's logs: railcc JSON, Gloo and MPI text lines."""
import json, re, sys, pathlib

out = pathlib.Path(sys.argv[1])
ranks = [int(x) for x in sys.argv[2:]]
sizes = [8, 1024, 65536, 1048576, 16777216, 67108864]

def baseline(path):
    res = {}
    for line in path.read_text().splitlines():
        m = re.search(r"n=(\d+)\s+(\d+) B\s+([\d.]+) us\s+algbw\s+([\d.]+)\s+busbw\s+([\d.]+)", line)
        if m:
            res[int(m.group(2))] = (float(m.group(3)), float(m.group(5)))
    return res

def human(n):
    for unit, f in (("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= f:
            return f"{n // f} {unit}"
    return f"{n} B"

print("all_reduce, float32, TCP over loopback, one run; time in us, busbw in GB/s;")
print("ratio = baseline time / railcc time (= railcc busbw / baseline busbw), > 1 means railcc is faster\n")
print("| ranks | size | railcc us | Gloo us | MPI-TCP us | railcc busbw | Gloo busbw | MPI busbw | vs Gloo | vs MPI | algo | #wrong |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for n in ranks:
    gloo, mpi = baseline(out / f"gloo-n{n}.log"), baseline(out / f"mpi-n{n}.log")
    for s in sizes:
        rows = json.loads((out / f"railcc-n{n}-{s}.json").read_text())
        r = rows[0]["out_of_place"]
        algo = rows[0]["algo"]
        wrong = r["wrong"] + rows[0]["in_place"]["wrong"]
        g, m = gloo.get(s), mpi.get(s)
        cells = [str(n), human(s), f"{r['time_us']:.1f}",
                 f"{g[0]:.1f}" if g else "-", f"{m[0]:.1f}" if m else "-",
                 f"{r['busbw_gbs']:.3f}", f"{g[1]:.3f}" if g else "-", f"{m[1]:.3f}" if m else "-",
                 f"{g[0] / r['time_us']:.2f}x" if g else "-", f"{m[0] / r['time_us']:.2f}x" if m else "-",
                 algo, str(wrong)]
        print("| " + " | ".join(cells) + " |")
