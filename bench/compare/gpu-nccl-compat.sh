#!/usr/bin/env bash
# nccl-tests against railcc's libnccl.so.2 and against the image's NCCL, in one device call on
# nvidia-h200-x2 (issue 7). Prepare here: bash bench/compare/gpu-prepare.sh (stages
# .device/lib/libnccl.so.2 too); carry .device. Logs under $OUT:
#   nccl-compat-check.log  every binary, -d all (and -o all for reductions), -g 2 and -t 2,
#                          railcc then NCCL;
#   nccl-compat-bw.log     float sum busbw 8 B - 1 GB, -g 2, railcc then NCCL.
# NG=1 (a one-GPU machine) runs the same with one rank.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
NG=${NG:-$(nvidia-smi -L | wc -l)}   # 2 on nvidia-h200-x2; a 1-GPU machine runs 1 rank
export NCCL_TESTS_FLAGS="-b 8 -e 8 -g $NG -n 1 -w 0"
bash .device/nccl_baseline.sh $NT all_reduce > "$OUT/nccl-tests-build.log" 2>&1 || { cat "$OUT/nccl-tests-build.log"; exit 1; }
NCCL_HOME=$(python3 -c "import nvidia.nccl,os;print(nvidia.nccl.__path__[0])")
OURS="$PWD/.device/lib"
BINS=${BINS:-"all_reduce all_gather reduce_scatter broadcast reduce sendrecv alltoall"}
T="timeout ${STEP_TIMEOUT:-150}"
run() { # lib-dir label binary flags...
  local lib=$1 label=$2 bin=$3; shift 3
  echo "== $label ${bin}_perf $*"
  LD_LIBRARY_PATH="$lib:/usr/local/cuda/lib64" $T $NT/build/${bin}_perf "$@" 2>&1 | grep -v "^#  Rank"
  echo "exit ${PIPESTATUS[0]}"
}
{
  nvidia-smi -L
  for b in $BINS; do
    ops=""
    case $b in all_reduce|reduce_scatter|reduce) ops="-o all" ;; esac
    for mode in "-g $NG" "-t $NG -g 1"; do
      run "$OURS" railcc $b -b 8 -e 32M -f 64 -n 3 -w 1 -c 1 -d all $ops $mode
      run "$NCCL_HOME/lib" NCCL $b -b 8 -e 32M -f 64 -n 3 -w 1 -c 1 -d all $ops $mode
    done
  done
} > "$OUT/nccl-compat-check.log" 2>&1
{
  for b in $BINS; do
    run "$OURS" railcc $b -b 8 -e 1G -f 8 -n 20 -w 5 -c 1 -g $NG
    run "$NCCL_HOME/lib" NCCL $b -b 8 -e 1G -f 8 -n 20 -w 5 -c 1 -g $NG
  done
} > "$OUT/nccl-compat-bw.log" 2>&1
grep -c "^exit 0" "$OUT/nccl-compat-check.log" "$OUT/nccl-compat-bw.log"
grep -E "^exit [^0]|Out of bounds|wrong|FAIL|error" "$OUT/nccl-compat-check.log" | sort | uniq -c | head -30
