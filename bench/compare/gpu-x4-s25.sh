#!/usr/bin/env bash
# On nvidia-h200-x4 (after bash bench/compare/gpu-prepare.sh here; carry .device): for the
# twenty-first session, which took the fetch kernel out of late arguments (the late forms'
# block 0 fetches the slot). Logs under $OUT/logs, tarred to $OUT/logs-<part>.tgz.
#   a  the GPU suite's late part (=1 and =2; S25_PARTS="late push" adds its push part).
#   n  nccl-tests under mpirun -np N: all_reduce, all_gather, reduce_scatter 1 MB-256 MB,
#      railcc default, late (=2), NCCL.
#   b  steps, DDP and FSDP: railcc default, late (=2; late2w0: every call late, no wait for
#      peers on the host), NCCL; STEP_RUNS runs each (2), interleaved.
# Usage: bash bench/compare/gpu-x4-s25.sh a|n|b
set -u
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
session_begin
case ${1:-} in
  a)
    OUT=$L TEST_GPU_PARTS="${S25_PARTS:-late}" TEST_GPU_CHECK_LIMIT=120 timeout $(left 570) bash scripts/test-gpu.sh 2>&1 \
      | grep -E "^(PASS|FAIL|SKIP|      )|test-gpu:" | cut -c1-200
    ;;
  n) nccl_variants a railcc late2:RAILCC_GPU_LATE_ARGS=2 nccl ;;
  b)
    OUT=$L/host STEP_LAYOUTS=host STEP_MODES="ddp fsdp" STEP_RUNS=${STEP_RUNS:-2} STEP_LIMIT=80 STEP_LIBS="railcc nccl" \
      STEP_EXTRA="${S25_EXTRA:-late2:RAILCC_GPU_LATE_ARGS=2 late2w0:RAILCC_GPU_LATE_ARGS=2,RAILCC_GPU_LATE_WAIT_US=0}" STEP_ARGS="--steps 30" \
      NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout $(left ${S25_LEFT:-575}) bash bench/torch/step.sh 2>&1 | tee "$L/host.txt" | grep -v "^  "
    ;;
  *) echo "usage: $0 a|n|b"; exit 2 ;;
esac
session_end "$1"
