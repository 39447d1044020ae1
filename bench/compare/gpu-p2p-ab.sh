#!/usr/bin/env bash
# On a GPU machine (issue 30): sendrecv and alltoall through railcc's libnccl against NCCL in
# one call, copy-engine copies per message (RAILCC_GPU_P2P_BATCH=0), batch kernels (=1) and
# a batch in one launch (=2, "fused"), one process (-g NG) and one per GPU (mpirun -np NG).
# railcc's "batch" and "fused" runs are given NCCL's channel count as their block limit (read
# from NCCL's NCCL_DEBUG=INFO lines), "batch-all" one block per SM. Prints,
# per collective, way of running and size, each run's out-of-place busbw and its ratio to
# NCCL's. Logs: $OUT/p2p-ab-*.log. P2P_SIZES (default "-b 1M -e 256M -f 4"), P2P_COLLS
# (default "sendrecv alltoall"), NG (default every GPU), P2P_RUNS (default "copies batch
# batch-all fused"; also "fused-all": one launch, one block per SM, and "fused-nostage": the
# same with no staged sends, RAILCC_GPU_P2P_STAGE_BYTES=0), P2P_MIN_CHUNK (railcc's
# RAILCC_GPU_P2P_MIN_CHUNK for every run, default 65536).
# Prepare with bench/compare/gpu-prepare.sh; carry .device.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
source bench/compare/tables.sh
mkdir -p "$OUT"
NG=${NG:-$(nvidia-smi -L | wc -l)}
nccl_tests_build_both
FLAGS="${P2P_SIZES:--b 1M -e 256M -f 4} -n 20 -w 5 -c 1"
export RAILCC_GPU_P2P_MIN_CHUNK=${P2P_MIN_CHUNK:-65536}
MPIRUN="mpirun -np $NG --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x RAILCC_GPU_P2P_BATCH -x RAILCC_GPU_MAX_BLOCKS -x RAILCC_GPU_P2P_STAGE_BYTES -x RAILCC_GPU_P2P_MIN_CHUNK -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS"
run() {  # NAME WAY(g|mpi) COLL LIBDIR [VAR=VALUE...]
  local name=$1 way=$2 c=$3 lib=$4 rc why
  shift 4
  local log="$OUT/p2p-ab-$c-$way-$name.log"
  if [ "$way" = g ]; then
    env "$@" LD_LIBRARY_PATH="$lib:/usr/local/cuda/lib64" timeout 300 $NT/build/${c}_perf $FLAGS -g "$NG" > "$log" 2>&1
  else
    env "$@" LD_LIBRARY_PATH="$lib:/usr/local/cuda/lib64" timeout 300 $MPIRUN $NTM/build/${c}_perf $FLAGS -g 1 > "$log" 2>&1
  fi
  rc=$?
  why=$(table_problem "$log")
  [ "$rc" = 0 ] && [ -z "$why" ] || echo "FAIL  $c $way $name: exit $rc ${why}"
}
for c in ${P2P_COLLS:-sendrecv alltoall}; do
  for way in g mpi; do
    # Every run sets every variable mpirun forwards (-x of an unset one is refused).
    run nccl $way "$c" "$NCCL_HOME/lib" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT RAILCC_GPU_P2P_BATCH=0 RAILCC_GPU_MAX_BLOCKS=0 RAILCC_GPU_P2P_STAGE_BYTES=2097152
    ch=$(grep -o "[0-9]* coll channels" "$OUT/p2p-ab-$c-$way-nccl.log" | head -n 1 | awk '{print $1}')
    echo "== $c, $way: NCCL ${ch:-?} coll channels"
    q=(NCCL_DEBUG=WARN NCCL_DEBUG_SUBSYS=INIT RAILCC_GPU_P2P_STAGE_BYTES=2097152)
    for r in ${P2P_RUNS:-copies batch batch-all fused}; do
      case $r in
        copies) run $r $way "$c" "$PWD/.device/lib" "${q[@]}" RAILCC_GPU_P2P_BATCH=0 RAILCC_GPU_MAX_BLOCKS=0 ;;
        batch) run $r $way "$c" "$PWD/.device/lib" "${q[@]}" RAILCC_GPU_P2P_BATCH=1 RAILCC_GPU_MAX_BLOCKS="${ch:-24}" ;;
        batch-all) run $r $way "$c" "$PWD/.device/lib" "${q[@]}" RAILCC_GPU_P2P_BATCH=1 RAILCC_GPU_MAX_BLOCKS=0 ;;
        fused) run $r $way "$c" "$PWD/.device/lib" "${q[@]}" RAILCC_GPU_P2P_BATCH=2 RAILCC_GPU_MAX_BLOCKS="${ch:-24}" ;;
        fused-all) run $r $way "$c" "$PWD/.device/lib" "${q[@]}" RAILCC_GPU_P2P_BATCH=2 RAILCC_GPU_MAX_BLOCKS=0 ;;
        fused-nostage) run $r $way "$c" "$PWD/.device/lib" NCCL_DEBUG=WARN NCCL_DEBUG_SUBSYS=INIT RAILCC_GPU_P2P_STAGE_BYTES=0 RAILCC_GPU_P2P_BATCH=2 RAILCC_GPU_MAX_BLOCKS=0 ;;
        *) echo "gpu-p2p-ab: unknown run $r"; exit 2 ;;
      esac
    done
    python3 - "$OUT" "$c" "$way" nccl ${P2P_RUNS:-copies batch batch-all fused} <<'PY'
import re, sys
out, c, way, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
rows = {}
for n in names:
    try:
        lines = open(f"{out}/p2p-ab-{c}-{way}-{n}.log", errors="replace").read().splitlines()
    except OSError:
        continue
    for line in lines:
        f = line.split()
        # size count type redop root time algbw busbw #wrong ...
        if len(f) >= 12 and re.fullmatch(r"\d+", f[0]) and re.fullmatch(r"[\d.]+", f[7]):
            rows.setdefault(int(f[0]), {})[n] = float(f[7])
print("size        " + "".join(f"{n:>20}" for n in names))
for size in sorted(rows):
    r, base = rows[size], rows[size].get("nccl")
    cells = [f"{'-':>20}" if r.get(n) is None else (f"{r[n]:>9.1f} ({r[n] / base:5.2f}x)" if base else f"{r[n]:>20.1f}") for n in names]
    print(f"{size:<12}" + "".join(f"{x:>20}" for x in cells))
PY
  done
done
