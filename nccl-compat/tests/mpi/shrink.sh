#!/usr/bin/env bash
# On a GPU machine: ncclCommShrink through railcc's libnccl (shrink.c), 3 MPI ranks on the
# machine's GPUs (shared where fewer). Prepare with bench/compare/gpu-prepare.sh; carry .device.
# Passes when both survivors print "shrink: rank R ok" and mpirun exits 0.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source bench/compare/gpu-env.sh
work=$(mktemp -d)
cp .device/lib/libnccl.so.2 "$work/" && ln -s libnccl.so.2 "$work/libnccl.so"
mpicc -I nccl-compat/include -I /usr/local/cuda/include nccl-compat/tests/mpi/shrink.c \
  -L "$work" -lnccl -L /usr/local/cuda/lib64 -lcudart -o "$work/shrink" || { echo "FAIL shrink: build"; exit 1; }
LD_LIBRARY_PATH="$work:/usr/local/cuda/lib64" timeout 120 mpirun -np 3 --allow-run-as-root --oversubscribe \
  -x LD_LIBRARY_PATH -x RAILCC_CACHE_DIR -x RAILCC_TIMEOUT_MS -x NCCL_DEBUG "$work/shrink" > "$work/log" 2>&1
st=$?
cat "$work/log"
oks=$(grep -c "^shrink: rank [01] ok" "$work/log")
if [ $st = 0 ] && [ "$oks" = 2 ]; then echo "PASS  shrink: 2 survivors ok"; else echo "FAIL  shrink: exit $st, $oks of 2 survivors ok"; exit 1; fi
