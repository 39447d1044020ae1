#!/usr/bin/env bash
# On a GPU machine: send/recv sizes that do not match, through railcc's libnccl with small
# messages by p2p_ll (RAILCC_GPU_P2P_LL_BYTES=1048576), 2 MPI ranks (p2p_size.c). Passes when
# both ranks print "p2p_size: rank R ok" and mpirun exits 0. Prepare with
# bench/compare/gpu-prepare.sh; carry .device.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source bench/compare/gpu-env.sh
source nccl-compat/tests/mpi/common.sh
export RAILCC_GPU_P2P_LL_BYTES=${RAILCC_GPU_P2P_LL_BYTES:-1048576}
MPI_TIMEOUT=60 mpi_c_test p2p_size 2 2 -x RAILCC_GPU_P2P_LL_BYTES || exit 1
echo "PASS  p2p_size: both ranks failed naming rank 0's 100 bytes"
