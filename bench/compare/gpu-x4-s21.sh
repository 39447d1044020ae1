#!/usr/bin/env bash
# On nvidia-h100-x4 / nvidia-h200-x4 (after bash bench/compare/gpu-prepare.sh here; carry
# .device): the nineteenth session's device calls, one part per call. Logs under $OUT/logs,
# tarred to $OUT/logs-<part>.tgz.
#   a  low-latency all-reduces without a meeting (RAILCC_GPU_LL_NO_WAIT, now on by default),
#      the fixed stage copying only what peers reach, the kernels' skip after an abort:
#      the GPU suite's mismatch, stage (now with a per-process check of the default) and
#      recover parts; then nccl-tests under mpirun -np 4 through railcc's libnccl against
#      NCCL (NCCL_DEBUG=INFO: its channels): all_reduce with LL_NO_WAIT 0 / 1 / 1 and the
#      low-latency kernel to 256 KiB; all_gather and reduce_scatter with and without the stage.
#   c  a's nccl-tests alone (and -g 4 all_reduce, one process).
#   d  issue 30's nccl-tests rows on this host's GPUs (2 or 4): all_reduce 8 B-1 GB,
#      all_gather and reduce_scatter 16 MB-1 GB, railcc default and at 24 blocks against NCCL;
#      sendrecv and alltoall 1-256 MB; -g N and mpirun -np N.
#   p  DDP and FSDP steps under torch.profiler, railcc and NCCL (where the step's time goes).
#   b  steps on one host of 4 GPUs, DDP and FSDP: railcc (its default), railcc at NCCL's 24
#      blocks, railcc with the 64 MiB stage (now room only for the parts peers reach), NCCL;
#      two runs each, interleaved.
# Usage: bash bench/compare/gpu-x4-s21.sh a|b|c|d|p
set -u
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
session_begin
case ${1:-} in
  a)
    OUT=$L TEST_GPU_PARTS="mismatch stage recover" timeout 360 bash scripts/test-gpu.sh 2>&1 | grep -E "^(PASS|FAIL|SKIP|      )|test-gpu:" | cut -c1-200
    echo "== after $(( $(date +%s) - T0 )) s"
    ;;&
  a|c)
    N=$(nvidia-smi -L | wc -l)   # 4 on the x4 kinds; 2 where only those are lent
    nccl_tests_build_both >/dev/null 2>&1 || echo "FAIL  nccl-tests build"
    NCCL_HOME=$(python3 -c "import nvidia.nccl,os;print(nvidia.nccl.__path__[0])")
    MPI4="mpirun -np $N --bind-to none --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x RAILCC_CACHE_DIR -x RAILCC_GPU_STAGE_BYTES -x RAILCC_GPU_LL_NO_WAIT -x RAILCC_GPU_LL_MAX_BYTES -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS"
    P="-b 8 -e 64M -f 8 -n 20 -w 5 -c 1 -g 1"
    run_nt() {   # $1 binary, $2 label, rest: env
      local b=$1 v=$2; shift 2
      local f="$L/np$N-$b-$v.log" lib="$PWD/.device/lib" how="$MPI4 $NTM/build/${b}_perf $P"
      [ "${v%-g4}" = nccl ] && lib=$NCCL_HOME/lib
      case $v in *-g4) f="$L/g4-$b-$v.log" how="$NT/build/${b}_perf ${P% -g 1} -g $N" ;; esac
      env RAILCC_GPU_STAGE_BYTES=0 RAILCC_GPU_LL_NO_WAIT=1 RAILCC_GPU_LL_MAX_BYTES=65536 NCCL_DEBUG=WARN NCCL_DEBUG_SUBSYS=INIT "$@" LD_LIBRARY_PATH="$lib:/usr/local/cuda/lib64" timeout 90 $how > "$f" 2>&1
      echo "== $b $v: exit $?, $(grep -c 'Out of bounds values : 0 OK' "$f") OK table(s)"
      grep -E "^ +[0-9]+ +[0-9]+ " "$f" | awk '{printf "  %10s %10s us %7s GB/s busbw #wrong %s\n", $1, $6, $8, $9}'
    }
    for round in 1 2; do
      run_nt all_reduce wait RAILCC_GPU_LL_NO_WAIT=0
      run_nt all_reduce default
      run_nt all_reduce ll256k RAILCC_GPU_LL_MAX_BYTES=262144
      run_nt all_reduce nccl NCCL_DEBUG=INFO
    done
    grep -m1 -oE "[0-9]+ coll channels.*" "$L/np$N-all_reduce-nccl.log"
    for v in default ll256k nccl; do
      case $v in ll256k) run_nt all_reduce $v-g4 RAILCC_GPU_LL_MAX_BYTES=262144 ;; *) run_nt all_reduce $v-g4 ;; esac
    done
    for b in reduce_scatter all_gather; do
      run_nt $b default
      run_nt $b stage RAILCC_GPU_STAGE_BYTES=67108864
      run_nt $b nccl
    done
    ;;
  d)
    # Issue 30's nccl-tests acceptance rows on this host's GPUs, railcc at its default blocks
    # and at NCCL's channel count (24, read below from NCCL_DEBUG=INFO), -g N and mpirun.
    N=$(nvidia-smi -L | wc -l)
    nccl_tests_build_both >/dev/null 2>&1 || echo "FAIL  nccl-tests build"
    MPIN="mpirun -np $N --bind-to none --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x RAILCC_CACHE_DIR -x RAILCC_GPU_MAX_BLOCKS -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS"
    nt() {   # $1 binary, $2 way (g|mpi), $3 lib (railcc|b24|nccl), $4 sizes
      local b=$1 w=$2 v=$3 lib="$PWD/.device/lib" blocks=0 f="$L/d-$1-$2-$3.log" how
      [ "$v" = nccl ] && lib=$NCCL_HOME/lib
      [ "$v" = b24 ] && blocks=24
      case $w in g) how="$NT/build/${b}_perf -g $N" ;; mpi) how="$MPIN $NTM/build/${b}_perf -g 1" ;; esac
      env RAILCC_GPU_MAX_BLOCKS=$blocks NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT LD_LIBRARY_PATH="$lib:/usr/local/cuda/lib64" \
        timeout 120 $how $4 -n 20 -w 5 -c 1 > "$f" 2>&1
      echo "== $b $w $v: exit $?, $(grep -c 'Out of bounds values : 0 OK' "$f") OK table(s)$( [ $v = nccl ] && grep -m1 -oE ' [0-9]+ coll channels' "$f")"
      grep -E "^ +[0-9]+ +[0-9]+ " "$f" | awk '{printf "  %10s %10s us %7s GB/s busbw #wrong %s\n", $1, $6, $8, $9}'
    }
    for w in g mpi; do
      for v in railcc b24 nccl; do nt all_reduce $w $v "-b 8 -e 1G -f 8"; done
      for b in all_gather reduce_scatter; do
        for v in railcc b24 nccl; do nt $b $w $v "-b 16M -e 1G -f 4"; done
      done
      for b in sendrecv alltoall; do
        for v in railcc nccl; do nt $b $w $v "-b 1M -e 256M -f 16"; done
      done
    done
    ;;
  p)
    # Where a step's time goes: DDP and FSDP, railcc (default) and NCCL, 10 timed steps then 5
    # under torch.profiler (kernels by device time, the collectives' host calls), one run each.
    OUT=$L/prof STEP_LAYOUTS=host STEP_MODES="ddp fsdp" STEP_RUNS=1 STEP_LIMIT=60 STEP_LIBS="railcc nccl" \
      STEP_ARGS="--steps 10 --profile 5" timeout $(left 160) bash bench/torch/step.sh 2>&1 | tee "$L/prof.txt" | grep "^step:"
    grep -h "^profile:" "$L"/prof/step-*.log | cut -c1-170
    ;;
  b)
    OUT=$L/host STEP_LAYOUTS=host STEP_MODES="ddp fsdp" STEP_RUNS=2 STEP_LIMIT=80 STEP_LIBS="railcc railcc-b24 nccl" \
      STEP_EXTRA="stage:RAILCC_GPU_STAGE_BYTES=67108864" STEP_ARGS="--steps 30" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT \
      timeout $(left 575) bash bench/torch/step.sh 2>&1 | tee "$L/host.txt" | grep -v "^  "
    grep -h -m3 -oE "[0-9]+ coll channels.*" "$L"/host/step-nccl-* 2>/dev/null | sort | uniq -c | head -4
    ;;
  *) echo "usage: $0 a|b|c|d|p"; exit 2 ;;
esac
session_end "$1"
