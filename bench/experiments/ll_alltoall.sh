#!/usr/bin/env bash
# On the device (issue 30 experiment): builds ll_alltoall.cu and runs it on every GPU, with
# NCCL's alltoall -g on every GPU (one process, as the experiment) before and after it in the
# same call, and railcc's libnccl the same way. Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
mkdir -p "$OUT"
nvcc -O3 -arch=sm_90 -o /tmp/ll_a2a bench/experiments/ll_alltoall.cu || { echo "FAIL  nvcc"; exit 1; }
nccl_tests_build $NT 0 || { echo "FAIL  nccl-tests build"; exit 1; }
NG=$(nvidia-smi -L | wc -l)
a2a() {  # NAME LIBDIR
  LD_LIBRARY_PATH="$2:/usr/local/cuda/lib64" timeout 120 $NT/build/alltoall_perf -b 64 -e 4M -f 4 -g $NG -n 200 -w 20 -c 1 \
    > "$OUT/a2a-$1.log" 2>&1
  echo "$1 alltoall -g $NG: exit $?"; grep -E "^ +[0-9]" "$OUT/a2a-$1.log"
}
a2a nccl-before "$NCCL_HOME/lib"
timeout 120 /tmp/ll_a2a 2>&1 | tee "$OUT/ll_a2a.log"
a2a railcc "$PWD/.device/lib"
a2a nccl-after "$NCCL_HOME/lib"
