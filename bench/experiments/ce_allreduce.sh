#!/usr/bin/env bash
# On the device (issue 30 experiment): builds ce_allreduce.cu, runs it, and NCCL's all_reduce
# -g on every GPU in the same call (its channel count from NCCL_DEBUG=INFO). Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
mkdir -p "$OUT"
nvcc -O3 -arch=sm_90 -o /tmp/ce bench/experiments/ce_allreduce.cu || { echo "FAIL  nvcc"; exit 1; }
nccl_tests_build $NT 0 || { tail -20 /tmp/nccl-build-0.log; echo "FAIL  nccl-tests build"; exit 1; }
NG=$(nvidia-smi -L | wc -l)
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT LD_LIBRARY_PATH="$NCCL_HOME/lib:/usr/local/cuda/lib64" timeout 120 \
  $NT/build/all_reduce_perf -b 16M -e 1G -f 4 -g $NG -n 20 -w 5 -c 1 > "$OUT/nccl-ar.log" 2>&1
echo "NCCL: $(grep -o "[0-9]* coll channels" "$OUT/nccl-ar.log" | head -n 1)"
grep -E "^ +[0-9]" "$OUT/nccl-ar.log"
timeout 300 /tmp/ce 2>&1 | tee "$OUT/ce.log"
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT LD_LIBRARY_PATH="$NCCL_HOME/lib:/usr/local/cuda/lib64" timeout 120 \
  $NT/build/all_reduce_perf -b 16M -e 1G -f 4 -g $NG -n 20 -w 5 -c 1 > "$OUT/nccl-ar2.log" 2>&1
echo "NCCL again:"; grep -E "^ +[0-9]" "$OUT/nccl-ar2.log"
