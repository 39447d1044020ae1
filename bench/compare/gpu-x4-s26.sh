#!/usr/bin/env bash
# On nvidia-h200-x4 (after bash bench/compare/gpu-prepare.sh here; carry .device): for the
# session after the twenty-first, which wrote without device time: the wait for peers also
# waiting for the launcher's earlier call (proc.rs peers_within), and the GPU suite's
# late_mix (half the ranks always late, half never). Logs under $OUT/logs, tarred to
# $OUT/logs-<part>.tgz.
#   a  the GPU suite's late part (with late_mix: break it once, e.g. by swapping the two
#      halves' RAILCC_GPU_LATE_WAIT_US, and see it fail).
#   n  nccl-tests under mpirun -np N: all_reduce, all_gather, reduce_scatter 1 MB-256 MB,
#      railcc default, late (=2, default wait), NCCL; does 1 MB all_reduce now stay at the
#      default's time on 4 GPUs?
#   b  steps on one host, DDP and FSDP: railcc default, late (=2), late at NCCL's 24 blocks
#      (a late kernel's blocks sit on their SMs until the peers come: with up to 132 of them
#      the backward pass's matrix products may lose SMs), NCCL; STEP_RUNS (2). STEP_PIN (1):
#      each rank on its GPU's share of the CPUs, both libraries (new, bench/torch/step.py
#      pin_cpus: NCCL's own DDP medians ran 23.9-36.0 ms across the twenty-first session's runs).
#   h  steps on 2 emulated hosts x 2 GPUs (issue 31, not run since the eighteenth session):
#      HSDP and DDP, railcc, late (=2: the shard group inside each host), NCCL 4 x 4 sockets;
#      STEP_RUNS (2).
#   o  the overlap benchmark on one host (issue 30: matrix products on one stream, a step's
#      collectives on another): railcc, late (=2), late at 24 blocks, NCCL; STEP_RUNS (2).
# Usage: bash bench/compare/gpu-x4-s26.sh a|n|b|h|o
set -u
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
session_begin
case ${1:-} in
  a)
    OUT=$L TEST_GPU_PARTS=late TEST_GPU_CHECK_LIMIT=120 timeout $(left 570) bash scripts/test-gpu.sh 2>&1 \
      | grep -E "^(PASS|FAIL|SKIP|      )|test-gpu:|late_mix:" | cut -c1-220
    ;;
  n)
    N=$(nvidia-smi -L | wc -l)
    nccl_tests_build_both >/dev/null 2>&1 || echo "FAIL  nccl-tests build"
    NCCL_HOME=$(python3 -c "import nvidia.nccl,os;print(nvidia.nccl.__path__[0])")
    MPIN="mpirun -np $N --bind-to none --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x RAILCC_CACHE_DIR -x RAILCC_GPU_LATE_ARGS -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS"
    for c in all_reduce all_gather reduce_scatter; do
      for v in railcc late2 nccl; do
        lib="$PWD/.device/lib" late=0 f="$L/a-$c-$v.log"
        [ "$v" = nccl ] && lib=$NCCL_HOME/lib
        case $v in late*) late=${v#late} ;; esac
        env RAILCC_GPU_LATE_ARGS=$late NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT LD_LIBRARY_PATH="$lib:/usr/local/cuda/lib64" \
          timeout 90 $MPIN $NTM/build/${c}_perf -g 1 -b 1M -e 256M -f 4 -n 20 -w 5 -c 1 > "$f" 2>&1
        echo "== $c $v: exit $?, $(grep -c 'Out of bounds values : 0 OK' "$f") OK table(s)$( [ $v = nccl ] && grep -m1 -oE ' [0-9]+ coll channels' "$f")"
        grep -E "^ +[0-9]+ +[0-9]+ " "$f" | awk '{printf "  %10s %10s us %7s GB/s busbw #wrong %s\n", $1, $6, $8, $9}'
      done
    done
    ;;
  b)
    OUT=$L/host STEP_PIN=${STEP_PIN:-1} STEP_LAYOUTS=host STEP_MODES="ddp fsdp" STEP_RUNS=${STEP_RUNS:-2} STEP_LIMIT=80 STEP_LIBS="railcc nccl" \
      STEP_EXTRA="late2:RAILCC_GPU_LATE_ARGS=2 late2b24:RAILCC_GPU_LATE_ARGS=2,RAILCC_GPU_MAX_BLOCKS=24" STEP_ARGS="--steps 30" \
      NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout $(left 575) bash bench/torch/step.sh 2>&1 | tee "$L/host.txt" | grep -v "^  "
    ;;
  h)
    OUT=$L/2x2 STEP_PIN=${STEP_PIN:-1} STEP_LAYOUTS=2x2 STEP_MODES="hsdp ddp" STEP_RUNS=${STEP_RUNS:-2} STEP_LIMIT=100 STEP_LIBS="railcc nccl-4x4" \
      STEP_EXTRA="late2:RAILCC_GPU_LATE_ARGS=2" STEP_ARGS="--steps 30" \
      NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout $(left 575) bash bench/torch/step.sh 2>&1 | tee "$L/2x2.txt" | grep -v "^  "
    ;;
  o)
    OUT=$L/overlap STEP_PIN=${STEP_PIN:-1} STEP_LAYOUTS=host STEP_MODES=overlap STEP_RUNS=${STEP_RUNS:-2} STEP_LIMIT=100 STEP_LIBS="railcc nccl" \
      STEP_EXTRA="late2:RAILCC_GPU_LATE_ARGS=2 late2b24:RAILCC_GPU_LATE_ARGS=2,RAILCC_GPU_MAX_BLOCKS=24" \
      NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout $(left 575) bash bench/torch/step.sh 2>&1 | tee "$L/overlap.txt" | grep -v "^  "
    ;;
  *) echo "usage: $0 a|n|b|h|o"; exit 2 ;;
esac
session_end "$1"
