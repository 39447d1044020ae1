#!/usr/bin/env bash
# On a GPU machine: small-message time of all_reduce, sendrecv and alltoall through railcc's
# libnccl against NCCL in the same call, under mpirun (one process per GPU: the path whose
# host work per call is the cost) and with -g NG. Prints, per collective, way and size, the
# out-of-place time in us of each and railcc's time over NCCL's (below 1: railcc faster).
# SMALL_SIZES (default "-b 8 -e 1M -f 8"), SMALL_COLLS (default "all_reduce sendrecv
# alltoall"), NG (default every GPU), SMALL_TAG (a suffix of the logs' names, for a second
# run with other RAILCC_* settings: RAILCC_GPU_P2P_STAGE_BYTES, RAILCC_GPU_MAX_BLOCKS and
# RAILCC_GPU_LL_MAX_BYTES are passed on under mpirun), SMALL_EXTRA (more nccl-tests flags:
# "-C 1" reports the host's time to issue a call instead of the GPU's). Logs:
# $OUT/small-*.log. Carry .device.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
source bench/compare/tables.sh
mkdir -p "$OUT"
NG=${NG:-$(nvidia-smi -L | wc -l)}
nccl_tests_build_both
FLAGS="${SMALL_SIZES:--b 8 -e 1M -f 8} -n 200 -w 20 -c 0 ${SMALL_EXTRA:-}"
MPIRUN="mpirun -np $NG --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS -x RAILCC_GPU_P2P_STAGE_BYTES -x RAILCC_GPU_MAX_BLOCKS -x RAILCC_GPU_LL_MAX_BYTES"
export RAILCC_GPU_P2P_STAGE_BYTES=${RAILCC_GPU_P2P_STAGE_BYTES:-2097152} RAILCC_GPU_MAX_BLOCKS=${RAILCC_GPU_MAX_BLOCKS:-0} RAILCC_GPU_LL_MAX_BYTES=${RAILCC_GPU_LL_MAX_BYTES:-65536}
for c in ${SMALL_COLLS:-all_reduce sendrecv alltoall}; do
  for way in mpi g; do
    for lib in nccl railcc; do
      d=$NCCL_HOME/lib
      [ $lib = railcc ] && d=$PWD/.device/lib
      log=$OUT/small-$c-$way-$lib${SMALL_TAG:-}.log
      if [ $way = g ]; then
        env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT LD_LIBRARY_PATH="$d:/usr/local/cuda/lib64" timeout 120 $NT/build/${c}_perf $FLAGS -g "$NG" > "$log" 2>&1
      else
        env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT LD_LIBRARY_PATH="$d:/usr/local/cuda/lib64" timeout 120 $MPIRUN $NTM/build/${c}_perf $FLAGS -g 1 > "$log" 2>&1
      fi
      rc=$?
      why=$(table_problem "$log")
      [ "$rc" = 0 ] && [ -z "$why" ] || echo "FAIL  $c $way $lib: exit $rc ${why}"
    done
    ch=$(grep -o "[0-9]* coll channels" "$OUT/small-$c-$way-nccl${SMALL_TAG:-}.log" | head -n 1 | awk '{print $1}')
    echo "== $c, $way (NCCL ${ch:-?} coll channels; railcc its default blocks)"
    python3 - "$OUT/small-$c-$way-nccl${SMALL_TAG:-}.log" "$OUT/small-$c-$way-railcc${SMALL_TAG:-}.log" <<'PY'
import re, sys
def times(path):
    t = {}
    for line in open(path, errors="replace"):
        f = line.split()
        # size count type redop root time algbw busbw #wrong ...
        if len(f) >= 9 and re.fullmatch(r"\d+", f[0]) and re.fullmatch(r"[\d.]+", f[5]):
            t[int(f[0])] = float(f[5])
    return t
n, r = times(sys.argv[1]), times(sys.argv[2])
print(f"{'size':<12}{'nccl us':>10}{'railcc us':>11}{'ratio':>8}")
for s in sorted(n):
    if s in r:
        print(f"{s:<12}{n[s]:>10.2f}{r[s]:>11.2f}{r[s] / n[s]:>8.2f}")
PY
  done
done
