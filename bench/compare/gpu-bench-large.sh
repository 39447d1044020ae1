#!/usr/bin/env bash
# The largest sizes, railcc and NCCL in one device call (nvidia-h200-x2): all_reduce at 1 GB,
# all_gather, reduce_scatter and sendrecv at 512 MB, both ways of running; then the
# one-process-per-GPU correctness checks at 1 GB. Log: $OUT/gpu-large.log.
# Prepare as for gpu-device.sh (build here; .device/bin/railcc, .device/nccl-tests, carry .device).
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
T="timeout 120"
{
  for mode in "" "--per-process"; do
    echo "== railcc all_reduce 1 GB $mode"
    $T $R bench all_reduce --device cuda $mode -b 1G -e 1G -n 20 -w 5; echo "exit $?"
    for c in all_gather reduce_scatter sendrecv; do
      echo "== railcc $c 512 MB $mode"
      $T $R bench $c --device cuda $mode -b 512M -e 512M -n 20 -w 5; echo "exit $?"
    done
  done
  echo "== NCCL"
  NCCL_TESTS_FLAGS="-b 1G -e 1G -g 2 -n 20 -w 5" $T bash .device/nccl_baseline.sh $NT all_reduce; echo "exit $?"
  NCCL_TESTS_FLAGS="-b 512M -e 512M -g 2 -n 20 -w 5" $T bash .device/nccl_baseline.sh $NT all_gather reduce_scatter sendrecv; echo "exit $?"
  for c in reduce_scatter broadcast reduce sendrecv; do
    echo "== railcc correctness $c 1 GB --per-process"
    $T $R bench $c --device cuda --per-process -b 1G -e 1G -n 1 -w 0 -r 1; echo "exit $?"
  done
} 2>&1 | tee "$OUT/gpu-large.log"
