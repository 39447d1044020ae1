#!/usr/bin/env bash
# On nvidia-h100-x4 / nvidia-h200-x4 (after bash bench/compare/gpu-prepare.sh here; carry
# .device): what the nineteenth session changed after its last device call, for the next one.
# Logs under $OUT/logs, tarred to $OUT/logs-<part>.tgz.
#   a  the push kernel's stopped blocks marking their tiles (recover's new abort:4:push case:
#      late peers must finish while the aborted rank lives; abort, 2 ranks, the same on the
#      bulk kernel) and the push part (every push all-reduce check).
#   a2 the stage and mismatch parts, the config part (now also a late peer and a deadline with
#      a 4 KiB call, which no longer waits on the host).
#   b  steps on one host of 4 GPUs, DDP and FSDP: railcc, railcc with the 64 MiB stage, NCCL;
#      three runs each, interleaved (the spread between calls exceeded the stage's effect).
# Usage: bash bench/compare/gpu-x4-s22.sh a|a2|b
set -u
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
session_begin
case ${1:-} in
  a)
    OUT=$L RECOVER_CASES="abort abort:4:push kill:host:shrink" TEST_GPU_PARTS="recover push" \
      timeout $(left 570) bash scripts/test-gpu.sh 2>&1 | grep -E "^(PASS|FAIL|SKIP|      )|test-gpu:" | cut -c1-200
    ;;
  a2)
    OUT=$L TEST_GPU_PARTS="stage mismatch config" \
      timeout $(left 570) bash scripts/test-gpu.sh 2>&1 | grep -E "^(PASS|FAIL|SKIP|      )|test-gpu:" | cut -c1-200
    ;;
  b)
    OUT=$L/host STEP_LAYOUTS=host STEP_MODES="ddp fsdp" STEP_RUNS=3 STEP_LIMIT=80 STEP_LIBS="railcc nccl" \
      STEP_EXTRA="stage:RAILCC_GPU_STAGE_BYTES=67108864" STEP_ARGS="--steps 30" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT \
      timeout $(left 575) bash bench/torch/step.sh 2>&1 | tee "$L/host.txt" | grep -v "^  "
    ;;
  *) echo "usage: $0 a|a2|b"; exit 2 ;;
esac
session_end "$1"
