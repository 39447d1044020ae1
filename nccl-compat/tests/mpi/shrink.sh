#!/usr/bin/env bash
# On a GPU machine: ncclCommShrink through railcc's libnccl (shrink.c), 3 MPI ranks on the
# machine's GPUs (shared where fewer). Prepare with bench/compare/gpu-prepare.sh; carry .device.
# Passes when both survivors print "shrink: rank R ok" and mpirun exits 0.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source bench/compare/gpu-env.sh
source nccl-compat/tests/mpi/common.sh
mpi_c_test shrink 3 2 -x RAILCC_TIMEOUT_MS -x NCCL_DEBUG || exit 1
echo "PASS  shrink: 2 survivors ok"
