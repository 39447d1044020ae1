#!/usr/bin/env bash
# On a GPU machine with 2 GPUs: libnccl with buffers from any allocator (issue 29 item 1),
# one process per GPU under mpirun (alloc.c says what runs and what is checked). Kinds:
# malloc, vmm (as PyTorch's expandable segments), nofd, async (cudaMallocAsync), ncclmem, and
# "async vmm" (rank 0 async, rank 1 vmm). Each kind passes when both ranks check every result;
# with railcc's library, NCCL_DEBUG=INFO must also name the way the buffers reached the peer
# (legacy CUDA IPC, VMM file-descriptor handles, or staged through the communicator's buffer).
# LIB=dir picks the libnccl.so.2 (default .device/lib, railcc's; NCCL's for the baseline, then
# the path lines are not asked for). Prepare with bench/compare/gpu-prepare.sh; carry .device.
# One PASS/FAIL line per kind; exit 1 if any failed. Logs: $OUT/alloc-<label>-<kind>.log.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source bench/compare/gpu-env.sh
mkdir -p "$OUT"
LABEL=${LABEL:-railcc}
work=$(mktemp -d)
cp "${LIB:-.device/lib}/libnccl.so.2" "$work/" && ln -s libnccl.so.2 "$work/libnccl.so"
mpicc -I nccl-compat/include -I /usr/local/cuda/include nccl-compat/tests/alloc/alloc.c \
  -L "$work" -lnccl -L /usr/local/cuda/lib64 -lcudart -L /usr/local/cuda/lib64/stubs -lcuda \
  -o "$work/alloc" || { echo "FAIL alloc: build"; exit 1; }
export LD_LIBRARY_PATH="$work:$LD_LIBRARY_PATH" NCCL_DEBUG=INFO
MPI="mpirun -np 2 --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_DEBUG -x RAILCC_CACHE_DIR -x NCCL_NVLS_ENABLE"
FAILS=0

# path KIND: the words railcc's INFO line uses for KIND's buffers.
path() {
  case $1 in
    malloc) echo "legacy CUDA IPC" ;;
    vmm|ncclmem) echo "VMM file-descriptor handles" ;;
    nofd|async) echo "no handle (staged" ;;
  esac
}

for kinds in malloc vmm nofd async ncclmem "async vmm"; do
  log="$OUT/alloc-$LABEL-${kinds// /-}.log"
  # shellcheck disable=SC2086
  ( cd "$work" && timeout 240 $MPI ./alloc $kinds ) > "$log" 2>&1
  rc=$?
  oks=$(grep -c "^alloc: rank [01]: [0-9]* checks ok, 0 failed" "$log")
  why=""
  [ "$rc" = 0 ] && [ "$oks" = 2 ] || why="exit status $rc, $oks of 2 ranks with every check ok"
  if [ -z "$why" ] && [ "$LABEL" = railcc ]; then
    for k in $kinds; do
      grep -q "reaches peers by $(path "$k")" "$log" || why="no INFO line says the $k buffers reach peers by $(path "$k")"
    done
  fi
  if [ -z "$why" ]; then
    echo "PASS  alloc $LABEL $kinds: $(grep -m1 -o '[0-9]* checks ok' "$log") per rank"
  else
    echo "FAIL  alloc $LABEL $kinds: $why"
    grep -E "wrong|error|WARN|failed at" "$log" | head -n 6 | sed 's/^/      /'
    FAILS=$((FAILS + 1))
  fi
done
[ "$FAILS" = 0 ]
