#!/usr/bin/env bash
# railcc vs Gloo vs Open MPI (TCP only), all-reduce float32 over loopback, in one run on this
# machine. Usage: bench/compare/cpu.sh [NRANKS ...]   (default: 2 4)
# Writes the raw logs and a table to bench/results/cpu-<date>/ and prints the table.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BASE="$ROOT/../shared/baselines/cpu"
RANKS=("${@:-2 4}")
RANKS=(${RANKS[@]})
OUT="$ROOT/bench/results/cpu-$(date -u +%Y%m%d-%H%M%S)"
mkdir -p "$OUT"

missing=()
/usr/bin/python3 -c "import torch" 2>/dev/null || missing+=(python3-torch)
/usr/bin/python3 -c "import mpi4py, numpy" 2>/dev/null || missing+=(python3-mpi4py python3-numpy)
command -v mpirun >/dev/null || missing+=(openmpi-bin)
if [ "${#missing[@]}" -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
bash "$ROOT/scripts/setup.sh"
(cd "$ROOT" && cargo build --release -q -p railcc-bench)
RAILCC="$ROOT/target/release/railcc"

# Same sizes as the baseline scripts.
SIZES=(8 1024 65536 1048576 16777216 67108864)
# railcc runs 1000 iterations at small sizes (the baselines run 200): 200 x 7 us is a 1.4 ms
# window that a single scheduler hiccup doubles. Large sizes use the baselines' counts.
iters() { if [ "$1" -le 65536 ]; then echo 1000; elif [ "$1" -le 16777216 ]; then echo 20; else echo 5; fi; }

for n in "${RANKS[@]}"; do
    echo "== $n ranks" >&2
    sleep 2 # let the previous phase's processes (Open MPI's daemons) finish exiting
    for s in "${SIZES[@]}"; do
        "$RAILCC" bench all_reduce --ranks "$n" -b "$s" -e "$s" -n "$(iters "$s")" -w 3 -d float -o sum \
            --json "$OUT/railcc-n$n-$s.json" >> "$OUT/railcc-n$n.log"
    done
    sleep 2
    /usr/bin/python3 "$BASE/gloo_allreduce.py" "$n" > "$OUT/gloo-n$n.log" 2>"$OUT/gloo-n$n.err"
    sleep 2
    mpirun --allow-run-as-root --oversubscribe -np "$n" --mca btl tcp,self \
        /usr/bin/python3 "$BASE/mpi_allreduce.py" > "$OUT/mpi-n$n.log" 2>"$OUT/mpi-n$n.err"
done

/usr/bin/python3 "$ROOT/bench/compare/table.py" "$OUT" "${RANKS[@]}" | tee "$OUT/table.md"
echo "results in $OUT" >&2
