#!/usr/bin/env bash
# On a GPU machine: groups that mix small and large send/recv, through railcc's libnccl with small
# messages by p2p_ll (RAILCC_GPU_P2P_LL_BYTES=1048576), 2 MPI ranks (p2p_mixed.c). Passes when
# both ranks print "p2p_mixed: rank R ok" and mpirun exits 0. Prepare with
# bench/compare/gpu-prepare.sh; carry .device. P2P_LIB: another build's directory.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source bench/compare/gpu-env.sh
source nccl-compat/tests/mpi/common.sh
export RAILCC_GPU_P2P_LL_BYTES=${RAILCC_GPU_P2P_LL_BYTES:-1048576}
MPI_LIB=${P2P_LIB:-.device/lib} MPI_TIMEOUT=60 mpi_c_test p2p_mixed 2 2 -x RAILCC_GPU_P2P_LL_BYTES || exit 1
echo "PASS  p2p_mixed: both ranks ok"
