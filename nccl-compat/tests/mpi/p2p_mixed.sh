#!/usr/bin/env bash
# On a GPU machine: groups that mix small and large send/recv, through railcc's libnccl with small
# messages by p2p_ll (RAILCC_GPU_P2P_LL_BYTES=1048576), 2 MPI ranks (p2p_mixed.c). Passes when
# both ranks print "p2p_mixed: rank R ok" and mpirun exits 0. Prepare with
# bench/compare/gpu-prepare.sh; carry .device. P2P_LIB: another build's directory.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source bench/compare/gpu-env.sh
work=$(mktemp -d)
cp "${P2P_LIB:-.device/lib}/libnccl.so.2" "$work/" && ln -s libnccl.so.2 "$work/libnccl.so"
mpicc -I nccl-compat/include -I /usr/local/cuda/include nccl-compat/tests/mpi/p2p_mixed.c \
  -L "$work" -lnccl -L /usr/local/cuda/lib64 -lcudart -o "$work/p2p_mixed" || { echo "FAIL p2p_mixed: build"; exit 1; }
export RAILCC_GPU_P2P_LL_BYTES=${RAILCC_GPU_P2P_LL_BYTES:-1048576}
LD_LIBRARY_PATH="$work:/usr/local/cuda/lib64" timeout 60 mpirun -np 2 --allow-run-as-root --oversubscribe \
  -x LD_LIBRARY_PATH -x RAILCC_CACHE_DIR -x RAILCC_GPU_P2P_LL_BYTES "$work/p2p_mixed" > "$work/log" 2>&1
st=$?
cat "$work/log"
oks=$(grep -c "^p2p_mixed: rank [01] ok" "$work/log")
if [ $st = 0 ] && [ "$oks" = 2 ]; then echo "PASS  p2p_mixed: both ranks ok"; else echo "FAIL  p2p_mixed: exit $st, $oks of 2 ranks ok"; exit 1; fi
