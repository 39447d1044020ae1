#!/usr/bin/env bash
# On nvidia-h100-x4 / nvidia-h200-x4 (after bash bench/compare/gpu-prepare.sh here; carry
# .device): the twentieth session's late kernel arguments (RAILCC_GPU_LATE_ARGS=1,
# transport-nvlink/src/proc/late.rs). Logs under $OUT/logs, tarred to $OUT/logs-<part>.tgz.
#   a  the GPU suite's late part: the bench's per-process checks of every collective with
#      it, mismatch and recover with it.
#   b  where a step's time goes, railcc (default), railcc-late and NCCL: DDP and FSDP, 10
#      timed steps then 5 under torch.profiler; then nccl-tests under mpirun -np N,
#      all_reduce, all_gather and reduce_scatter 1 MB-256 MB, railcc default, late, NCCL.
#   c  steps on one host of 4 GPUs, DDP and FSDP: railcc, railcc-late, railcc-late at NCCL's 24
#      blocks, NCCL; two runs each (STEP_RUNS), interleaved.
#   d  after the change that exports only the buffers peers reach: the suite's bench part
#      (--per-process), late, stage and mismatch parts.
#   e  steps, DDP and FSDP: railcc-late and NCCL, three runs each, interleaved.
# Usage: bash bench/compare/gpu-x4-s23.sh a|b|c|d|e
set -u
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
session_begin
case ${1:-} in
  a)
    OUT=$L TEST_GPU_PARTS="late" TEST_GPU_CHECK_LIMIT=120 timeout $(left 570) bash scripts/test-gpu.sh 2>&1 \
      | grep -E "^(PASS|FAIL|SKIP|      )|test-gpu:" | cut -c1-200
    ;;
  b)
    OUT=$L/prof STEP_LAYOUTS=host STEP_MODES="ddp fsdp" STEP_RUNS=1 STEP_LIMIT=60 STEP_LIBS="railcc nccl" \
      STEP_EXTRA="late:RAILCC_GPU_LATE_ARGS=1" STEP_ARGS="--steps 10 --profile 5" \
      timeout $(left 300) bash bench/torch/step.sh 2>&1 | tee "$L/prof.txt" | grep "^step:"
    grep -h "^profile:" "$L"/prof/step-*.log | cut -c1-170
    N=$(nvidia-smi -L | wc -l)
    nccl_tests_build_both >/dev/null 2>&1 || echo "FAIL  nccl-tests build"
    NCCL_HOME=$(python3 -c "import nvidia.nccl,os;print(nvidia.nccl.__path__[0])")
    MPIN="mpirun -np $N --bind-to none --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x RAILCC_CACHE_DIR -x RAILCC_GPU_LATE_ARGS -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS"
    nt() {   # $1 binary, $2 variant (railcc|late|nccl)
      local b=$1 v=$2 lib="$PWD/.device/lib" late=0 f="$L/b-$1-$2.log"
      [ "$v" = nccl ] && lib=$NCCL_HOME/lib
      [ "$v" = late ] && late=1
      env RAILCC_GPU_LATE_ARGS=$late NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT LD_LIBRARY_PATH="$lib:/usr/local/cuda/lib64" \
        timeout 90 $MPIN $NTM/build/${b}_perf -g 1 -b 1M -e 256M -f 4 -n 20 -w 5 -c 1 > "$f" 2>&1
      echo "== $b $v: exit $?, $(grep -c 'Out of bounds values : 0 OK' "$f") OK table(s)$( [ $v = nccl ] && grep -m1 -oE ' [0-9]+ coll channels' "$f")"
      grep -E "^ +[0-9]+ +[0-9]+ " "$f" | awk '{printf "  %10s %10s us %7s GB/s busbw #wrong %s\n", $1, $6, $8, $9}'
    }
    for b in all_reduce all_gather reduce_scatter; do
      for v in railcc late nccl; do nt $b $v; done
    done
    ;;
  c)
    OUT=$L/host STEP_LAYOUTS=host STEP_MODES="ddp fsdp" STEP_RUNS=${STEP_RUNS:-2} STEP_LIMIT=80 STEP_LIBS="railcc nccl" \
      STEP_EXTRA="late:RAILCC_GPU_LATE_ARGS=1 late24:RAILCC_GPU_LATE_ARGS=1,RAILCC_GPU_MAX_BLOCKS=24" \
      STEP_ARGS="--steps 30" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT \
      timeout $(left 575) bash bench/torch/step.sh 2>&1 | tee "$L/host.txt" | grep -v "^  "
    ;;
  d)
    OUT=$L TEST_GPU_PARTS="bench late stage mismatch" TEST_GPU_WAYS=per-process TEST_GPU_CHECK_LIMIT=120 \
      timeout $(left 570) bash scripts/test-gpu.sh 2>&1 | grep -E "^(PASS|FAIL|SKIP)|test-gpu:" | cut -c1-200
    ;;
  e)
    OUT=$L/host STEP_LAYOUTS=host STEP_MODES="ddp fsdp" STEP_RUNS=3 STEP_LIMIT=80 STEP_LIBS="nccl" \
      STEP_EXTRA="late:RAILCC_GPU_LATE_ARGS=1" STEP_ARGS="--steps 30" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT \
      timeout $(left 575) bash bench/torch/step.sh 2>&1 | tee "$L/host.txt" | grep -v "^  "
    ;;
  *) echo "usage: $0 a|b|c|d|e"; exit 2 ;;
esac
session_end "$1"
