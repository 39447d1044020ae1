#!/usr/bin/env bash
# nccl-tests built with MPI, 2 processes (mpirun -np 2, one GPU each), against railcc's
# libnccl.so.2 (its one-rank-per-process path) and against NCCL, in one device call on
# nvidia-h200-x2. Prepare with bench/compare/gpu-prepare.sh; carry .device. Log:
# $OUT/nccl-mpi.log.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
NCCL_HOME=$(python3 -c "import nvidia.nccl,os;print(nvidia.nccl.__path__[0])")
[ -e "$NCCL_HOME/lib/libnccl.so" ] || ln -sf "$NCCL_HOME/lib/libnccl.so.2" "$NCCL_HOME/lib/libnccl.so"
MPICC=$(command -v mpicc || true)
inc=$(mpicc --showme:incdirs 2>/dev/null | awk '{print $1}')
# nccl-tests wants MPI_HOME/include/mpi.h and MPI_HOME/lib/libmpi.so.
MPI_HOME=${MPI_HOME:-$(dirname "${inc:-/usr/include}")}
NTM=/tmp/nccl-tests-mpi
[ -d $NTM ] || cp -r .device/nccl-tests $NTM
BINS=${BINS:-"all_reduce all_gather reduce_scatter broadcast reduce sendrecv alltoall"}
{
  echo "mpicc: $MPICC; MPI_HOME $MPI_HOME; include $inc"
  make -C $NTM -j16 MPI=1 MPI_HOME="$MPI_HOME" CUDA_HOME=/usr/local/cuda NCCL_HOME="$NCCL_HOME" \
      NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" src.build > /tmp/mpi-build.log 2>&1 \
    || { tail -20 /tmp/mpi-build.log; exit 1; }
  MPIRUN="mpirun -np 2 --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x RAILCC_CACHE_DIR"
  for b in $BINS; do
    ops=""
    case $b in all_reduce|reduce_scatter|reduce) ops="-o all" ;; esac
    for lib in railcc NCCL; do
      dir=$PWD/.device/lib; [ $lib = NCCL ] && dir=$NCCL_HOME/lib
      echo "== $lib ${b}_perf (mpirun -np 2) -b 8 -e 32M -f 64 -g 1 -d all $ops"
      LD_LIBRARY_PATH="$dir:/usr/local/cuda/lib64" timeout 120 $MPIRUN $NTM/build/${b}_perf -b 8 -e 32M -f 64 -n 3 -w 1 -c 1 -g 1 -d all $ops 2>&1 | grep -v "^#  Rank"
      echo "exit ${PIPESTATUS[0]}"
    done
  done
  echo "== railcc all_reduce_perf (mpirun -np 2) float sum 8 B - 1 GB"
  LD_LIBRARY_PATH="$PWD/.device/lib:/usr/local/cuda/lib64" timeout 120 $MPIRUN $NTM/build/all_reduce_perf -b 8 -e 1G -f 8 -n 20 -w 5 -c 1 -g 1 2>&1 | grep -v "^#  Rank"
  echo "exit ${PIPESTATUS[0]}"
  echo "== NCCL all_reduce_perf (mpirun -np 2) float sum 8 B - 1 GB"
  LD_LIBRARY_PATH="$NCCL_HOME/lib:/usr/local/cuda/lib64" timeout 120 $MPIRUN $NTM/build/all_reduce_perf -b 8 -e 1G -f 8 -n 20 -w 5 -c 1 -g 1 2>&1 | grep -v "^#  Rank"
  echo "exit ${PIPESTATUS[0]}"
} > "$OUT/nccl-mpi.log" 2>&1
grep -E "^== |^exit|Out of bounds|mpicc" "$OUT/nccl-mpi.log" | paste - - - | head -40
