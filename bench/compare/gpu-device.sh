#!/usr/bin/env bash
# Runs on the device machine (nvidia-h200-x2), from the repository root, in one call:
# topology, railcc's GPU correctness sweep, railcc's all-reduce timings, then NCCL's
# (nccl-tests against the image's NCCL) with the same sizes. Logs go to $OUT.
# Prepare here first (see bench/results/README.md): build railcc, copy it and nccl-tests into
# the ignored folder .device/, and carry .device.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # never NVLink multicast
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
OUT=${OUT:-/tmp/out}
R=.device/bin/railcc
{
  nvidia-smi -L; nvidia-smi topo -m
  echo "== railcc correctness: every dtype and op, 8 B to 16 MB, out of place and in place"
  $R bench all_reduce --device cuda -b 8 -e 16M -f 8 -d all -o all -n 1 -w 0
  echo "exit $?"
  echo "== railcc correctness: float sum up to 256 MB, odd sizes"
  $R bench all_reduce --device cuda -b 4100 -e 256M -f 16 -n 1 -w 0
  echo "exit $?"
  echo "== railcc all_reduce timings, float sum (checked once per size)"
  $R bench all_reduce --device cuda -b 8 -e 1G -f 4 -n 50 -w 10 -c 1
  echo "exit $?"
  $R bench all_reduce --device cuda -b 1G -e 1G -n 20 -w 5 -c 1
  echo "exit $?"
  echo "== NCCL"
  NCCL_TESTS_FLAGS="-b 8 -e 1G -f 4 -g 2 -n 50 -w 10" bash .device/nccl_baseline.sh .device/nccl-tests all_reduce
  echo "exit $?"
  NCCL_TESTS_FLAGS="-b 1G -e 1G -g 2 -n 20 -w 5" bash .device/nccl_baseline.sh .device/nccl-tests all_reduce
  echo "exit $?"
} 2>&1 | tee "$OUT/gpu-device.log"
