#!/usr/bin/env bash
# Quick check on the device machine (nvidia-h200-x2) after a change to the GPU path: a small
# correctness sweep of every collective in both ways of running (with unaligned buffers),
# CUDA-graph latency next to NCCL's -G, and the PTX cache. Logs to $OUT/gpu-smoke.log.
# Prepare as for gpu-device.sh (build here; .device/bin/railcc, .device/nccl-tests, carry .device).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # never NVLink multicast
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export RAILCC_CACHE_DIR=/tmp/railcc-cache RAILCC_TIMEOUT_MS=20000
OUT=${OUT:-/tmp/out}
R=.device/bin/railcc
T="timeout 120"
COLLS="all_reduce all_gather reduce_scatter broadcast reduce sendrecv"
{
  echo "== PTX cache: first run compiles, second loads"
  rm -rf /tmp/railcc-cache
  for i in 1 2; do echo "run $i"; time (RAILCC_LOG=info $T $R bench all_reduce --device cuda -b 8 -e 8 -n 1 -w 0 2>&1 | grep -E "NVRTC|^ +8 "); done
  ls -la /tmp/railcc-cache
  for mode in "" "--per-process"; do
    for c in ${CHECK_COLLS:-$COLLS}; do
      echo "== correctness $c $mode --offset 8: every dtype/op, 8 B to 4 MB"
      $T $R bench $c --device cuda $mode -b 8 -e 4M -f 16 -d all -o all -n 1 -w 0 -r 1 --offset 8 | grep -vE '^ +[0-9]'; echo "exit ${PIPESTATUS[0]}"
    done
  done
  for mode in "" "--per-process"; do
    echo "== all_reduce $mode, small types at offsets 2 and 4 (the low-latency kernel's byte path)"
    $T $R bench all_reduce --device cuda $mode -b 1 -e 256K -f 3 -d int8,uint8,half,bfloat16 -o all -n 1 -w 0 --offset 2 | grep -vE '^ +[0-9]'; echo "exit ${PIPESTATUS[0]}"
    $T $R bench all_reduce --device cuda $mode -b 4 -e 256K -f 3 -d float,int32 -o all -n 1 -w 0 --offset 4 | grep -vE '^ +[0-9]'; echo "exit ${PIPESTATUS[0]}"
  done
  echo "== per-process all_reduce timing"
  $T $R bench all_reduce --device cuda --per-process -b 8 -e 512M -f 8 -n 20 -w 5; echo "exit $?"
  echo "== one-process all_reduce timing"
  $T $R bench all_reduce --device cuda -b 8 -e 512M -f 8 -n 20 -w 5; echo "exit $?"
  echo "== graph mode (-G 10), one process, then per process"
  $T $R bench all_reduce --device cuda -b 8 -e 64K -f 4 -n 100 -w 20 -G 10; echo "exit $?"
  $T $R bench all_reduce --device cuda --per-process -b 8 -e 64K -f 4 -n 100 -w 20 -G 10; echo "exit $?"
  echo "== NCCL eager and -G 10"
  [ -d /tmp/nccl-tests ] || cp -r .device/nccl-tests /tmp/nccl-tests
  NCCL_TESTS_FLAGS="-b 8 -e 64K -f 4 -g 2 -n 100 -w 20" $T bash .device/nccl_baseline.sh /tmp/nccl-tests all_reduce; echo "exit $?"
  NCCL_TESTS_FLAGS="-b 8 -e 64K -f 4 -g 2 -n 100 -w 20 -G 10" $T bash .device/nccl_baseline.sh /tmp/nccl-tests all_reduce; echo "exit $?"
} 2>&1 | tee "$OUT/gpu-smoke.log"
