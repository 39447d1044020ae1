#!/usr/bin/env bash
# On the device (issue 30 experiment): builds ce_reducescatter.cu and runs it on every GPU,
# with NCCL's reduce_scatter -g on every GPU before and after it in the same call (its channel
# count from NCCL_DEBUG=INFO). Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
mkdir -p "$OUT"
nvcc -O3 -arch=sm_90 -o /tmp/ce_rs bench/experiments/ce_reducescatter.cu -lcuda || { echo "FAIL  nvcc"; exit 1; }
nccl_tests_build $NT 0 || { echo "FAIL  nccl-tests build"; exit 1; }
NG=$(nvidia-smi -L | wc -l)
nccl_rs() {
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT LD_LIBRARY_PATH="$NCCL_HOME/lib:/usr/local/cuda/lib64" timeout 120 \
    $NT/build/reduce_scatter_perf -b 64M -e 1G -f 4 -g $NG -n 20 -w 5 -c 1 > "$OUT/nccl-rs-$1.log" 2>&1
  echo "NCCL reduce_scatter ($1): $(grep -o "[0-9]* coll channels" "$OUT/nccl-rs-$1.log" | head -n 1)"
  grep -E "^ +[0-9]" "$OUT/nccl-rs-$1.log"
}
nccl_rs before
timeout 240 /tmp/ce_rs 2>&1 | tee "$OUT/ce_rs.log"
nccl_rs after
