#!/usr/bin/env bash
# On the device machine (nvidia-h200-x2), one call: railcc's GPU correctness sweep for every
# GPU collective, then railcc and NCCL timings side by side. Logs to $OUT/gpu-all.log.
# Prepare as for gpu-device.sh (build here; .device/bin/railcc, .device/nccl-tests, carry .device).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # never NVLink multicast
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
OUT=${OUT:-/tmp/out}
R=.device/bin/railcc
COLLS="all_reduce all_gather reduce_scatter broadcast reduce sendrecv"
{
  for c in ${CHECK_COLLS:-$COLLS}; do
    echo "== railcc correctness $c: every dtype (and op), 8 B to 16 MB, plus odd sizes to 16 MB"
    $R bench $c --device cuda -b 8 -e 16M -f 8 -d all -o all -n 1 -w 0 -r 1 | grep -vE '^ +[0-9]' ; echo "exit ${PIPESTATUS[0]}"
    $R bench $c --device cuda -b 4100 -e 16M -f 16 -n 1 -w 0 | grep -vE '^ +[0-9]'; echo "exit ${PIPESTATUS[0]}"
  done
  for c in $COLLS; do
    echo "== railcc timing $c"
    $R bench $c --device cuda -b 8 -e 512M -f 8 -n 50 -w 10 -c 1; echo "exit $?"
  done
  echo "== NCCL"
  NCCL_TESTS_FLAGS="-b 8 -e 512M -f 8 -g 2 -n 50 -w 10" bash .device/nccl_baseline.sh .device/nccl-tests $COLLS
  echo "exit $?"
} 2>&1 | tee "$OUT/gpu-all.log"
