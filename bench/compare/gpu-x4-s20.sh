#!/usr/bin/env bash
# On nvidia-h100-x4 / nvidia-h200-x4 (after bash bench/compare/gpu-prepare.sh here; carry
# .device): the device calls written in the eighteenth session for the next one, one part per
# call. Logs under $OUT/logs, tarred to $OUT/logs-<part>.tgz.
#   a  the fixed stage (RAILCC_GPU_STAGE_BYTES, opt-in) before it may become the default: the
#      GPU suite's new parts (mismatch: counts and dtypes that differ, with and without it;
#      stage: the bench's per-process checks through it), then what it costs per size:
#      nccl-tests all_reduce, all_gather, reduce_scatter under mpirun -np 4 through railcc's
#      libnccl with and without it, against NCCL (NCCL_DEBUG=INFO: its channels), 8 B-64 MB.
#   b  steps on one host of 4 GPUs with the stage against NCCL: DDP and FSDP (HSDP ran in s19), two runs
#      each, interleaved, NCCL's channel count logged.
#   c, d  the GPU suite's parts not run on recent code: c: shared shrink split config;
#      d: p2pbatch p2pll register alloc.
# Usage: bash bench/compare/gpu-x4-s20.sh a|b|c|d
set -u
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
session_begin
case ${1:-} in
  a)
    OUT=$L TEST_GPU_PARTS="mismatch stage" timeout 300 bash scripts/test-gpu.sh 2>&1 | grep -E "^(PASS|FAIL|SKIP|      )|test-gpu:" | cut -c1-200
    echo "== after $(( $(date +%s) - T0 )) s"
    nccl_tests_build $NTM 1 || { echo "FAIL  nccl-tests build (MPI)"; tail /tmp/nccl-build-1.log; }
    NCCL_HOME=$(python3 -c "import nvidia.nccl,os;print(nvidia.nccl.__path__[0])")
    MPI4="mpirun -np 4 --bind-to none --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x RAILCC_CACHE_DIR -x RAILCC_GPU_STAGE_BYTES -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS"
    P="-b 8 -e 64M -f 8 -n 20 -w 5 -c 1 -g 1"
    for b in all_reduce reduce_scatter all_gather; do
      for v in railcc stage nccl; do
        f="$L/np4-$b-$v.log"
        case $v in
          railcc) env RAILCC_GPU_STAGE_BYTES=0 NCCL_DEBUG=WARN NCCL_DEBUG_SUBSYS=INIT LD_LIBRARY_PATH="$PWD/.device/lib:/usr/local/cuda/lib64" timeout 90 $MPI4 $NTM/build/${b}_perf $P > "$f" 2>&1 ;;
          stage) env RAILCC_GPU_STAGE_BYTES=67108864 NCCL_DEBUG=WARN NCCL_DEBUG_SUBSYS=INIT LD_LIBRARY_PATH="$PWD/.device/lib:/usr/local/cuda/lib64" timeout 90 $MPI4 $NTM/build/${b}_perf $P > "$f" 2>&1 ;;
          nccl) env RAILCC_GPU_STAGE_BYTES=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT LD_LIBRARY_PATH="$NCCL_HOME/lib:/usr/local/cuda/lib64" timeout 90 $MPI4 $NTM/build/${b}_perf $P > "$f" 2>&1 ;;
        esac
        echo "== $b $v: exit $?, $(grep -c 'Out of bounds values : 0 OK' "$f") OK table(s)"
        grep -E "^ +[0-9]+ +[0-9]+ " "$f" | awk '{printf "  %10s %10s us %7s GB/s busbw #wrong %s\n", $1, $6, $8, $9}'
      done
      grep -m2 -oE "[0-9]+ coll channels|comm .* nRanks 4 .*" "$L/np4-$b-nccl.log" | head -2
    done
    ;;
  b)
    OUT=$L/host STEP_LAYOUTS=host STEP_MODES="ddp fsdp" STEP_RUNS=2 STEP_LIMIT=80 STEP_LIBS="railcc nccl" \
      STEP_EXTRA="stage:RAILCC_GPU_STAGE_BYTES=67108864" STEP_ARGS="--steps 30" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT \
      timeout $(left 575) bash bench/torch/step.sh 2>&1 | tee "$L/host.txt" | grep -v "^  "
    grep -h -m3 -oE "[0-9]+ coll channels.*" "$L"/host/step-nccl-* 2>/dev/null | sort | uniq -c | head -4
    ;;
  c)
    OUT=$L TEST_GPU_PARTS="shared shrink split config" timeout $(left 570) bash scripts/test-gpu.sh 2>&1 | grep -E "^(PASS|FAIL|SKIP)|test-gpu:" | cut -c1-160
    ;;
  d)
    OUT=$L TEST_GPU_PARTS="p2pbatch p2pll register alloc" timeout $(left 570) bash scripts/test-gpu.sh 2>&1 | grep -E "^(PASS|FAIL|SKIP)|test-gpu:" | cut -c1-160
    ;;
  *) echo "usage: $0 a|b|c|d"; exit 2 ;;
esac
session_end "$1"
