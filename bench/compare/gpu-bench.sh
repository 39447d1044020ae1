#!/usr/bin/env bash
# railcc GPU timings next to NCCL's (nccl-tests against the image's NCCL), in one device call
# on nvidia-h200-x2: all_reduce eager 8 B - 1 GB and CUDA-graph (-G) 8 B - 64 KB, both ways of
# running; the other collectives 8 B - 512 MB. Log: $OUT/gpu-bench.log.
# Prepare as for gpu-device.sh (build here; .device/bin/railcc, .device/nccl-tests, carry .device).
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
T="timeout 200"
OTHERS=${OTHERS:-"all_gather reduce_scatter sendrecv broadcast reduce"}
{
  nvidia-smi -L
  echo "== railcc all_reduce, one process, eager"
  $T $R bench all_reduce --device cuda -b 8 -e 1G -f 4 -n 50 -w 10; echo "exit $?"
  echo "== railcc all_reduce, one process, CUDA graph"
  $T $R bench all_reduce --device cuda -b 8 -e 64K -f 4 -n 100 -w 20 -G 10; echo "exit $?"
  echo "== railcc all_reduce, one process per GPU, eager"
  $T $R bench all_reduce --device cuda --per-process -b 8 -e 1G -f 4 -n 50 -w 10; echo "exit $?"
  echo "== railcc all_reduce, one process per GPU, CUDA graph"
  $T $R bench all_reduce --device cuda --per-process -b 8 -e 64K -f 4 -n 100 -w 20 -G 10; echo "exit $?"
  for c in $OTHERS; do
    echo "== railcc $c, one process"
    $T $R bench $c --device cuda -b 8 -e 512M -f 8 -n 20 -w 5; echo "exit $?"
    echo "== railcc $c, one process per GPU"
    $T $R bench $c --device cuda --per-process -b 512M -e 512M -n 20 -w 5; echo "exit $?"
  done
  echo "== NCCL"
  NCCL_TESTS_FLAGS="-b 8 -e 1G -f 4 -g 2 -n 50 -w 10" $T bash .device/nccl_baseline.sh $NT all_reduce; echo "exit $?"
  NCCL_TESTS_FLAGS="-b 8 -e 64K -f 4 -g 2 -n 100 -w 20 -G 10" $T bash .device/nccl_baseline.sh $NT all_reduce; echo "exit $?"
  NCCL_TESTS_FLAGS="-b 8 -e 512M -f 8 -g 2 -n 20 -w 5" $T bash .device/nccl_baseline.sh $NT $OTHERS; echo "exit $?"
} 2>&1 | tee "$OUT/gpu-bench.log"
