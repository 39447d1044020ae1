#!/usr/bin/env bash
# all_reduce from 8 B to 64 KB at every power of two, railcc and NCCL in one device call
# (nvidia-h200-x2): eager and CUDA graph (-G 10), both ways of running. Issue 3's small-message
# targets: railcc eager <= NCCL eager, railcc graph <= NCCL -G. Log: $OUT/gpu-small.log.
# Prepare with gpu-prepare.sh (here), carry .device.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
T="timeout 120"
SIZES="-b 8 -e 64K -f 2"
{
  nvidia-smi -L
  for mode in "" "--per-process"; do
    echo "== railcc all_reduce eager ${mode:-one process}"
    $T $R bench all_reduce --device cuda $mode $SIZES -n 200 -w 50; echo "exit $?"
    echo "== railcc all_reduce graph ${mode:-one process}"
    $T $R bench all_reduce --device cuda $mode $SIZES -n 100 -w 20 -G 10; echo "exit $?"
  done
  echo "== NCCL all_reduce eager"
  NCCL_TESTS_FLAGS="$SIZES -g 2 -n 200 -w 50" $T bash .device/nccl_baseline.sh $NT all_reduce; echo "exit $?"
  echo "== NCCL all_reduce graph"
  NCCL_TESTS_FLAGS="$SIZES -g 2 -n 100 -w 20 -G 10" $T bash .device/nccl_baseline.sh $NT all_reduce; echo "exit $?"
} 2>&1 | tee "$OUT/gpu-small.log"
