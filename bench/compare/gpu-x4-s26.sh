#!/usr/bin/env bash
# On nvidia-h200-x4 (after bash bench/compare/gpu-prepare.sh here; carry .device): for the
# session after the twenty-first, which wrote without device time: the wait for peers also
# waiting for the launcher's earlier call (proc.rs peers_within), and the GPU suite's
# late_mix (half the ranks always late, half never). Logs under $OUT/logs, tarred to
# $OUT/logs-<part>.tgz.
#   a  the GPU suite's late part (with late_mix: break it once, e.g. by swapping the two
#      halves' RAILCC_GPU_LATE_WAIT_US, and see it fail).
#   x  a's late_mix broken on purpose (the halves' waits swapped): must print FAIL.
#   n  gpu-x4-s25.sh n (nccl-tests under mpirun -np N: all_reduce, all_gather, reduce_scatter
#      1 MB-256 MB, railcc default, late (=2, default wait), NCCL): does 1 MB all_reduce now
#      stay at the default's time on 4 GPUs?
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
# Usage: bash bench/compare/gpu-x4-s26.sh a|x|n|b|h|o
set -u
cd "$(dirname "$0")/../.."
[ "${1:-}" = n ] && exec bash bench/compare/gpu-x4-s25.sh n
source bench/compare/gpu-env.sh
session_begin
LATE="late2:RAILCC_GPU_LATE_ARGS=2" LATE24="late2b24:RAILCC_GPU_LATE_ARGS=2,RAILCC_GPU_MAX_BLOCKS=24"
case ${1:-} in
  a)
    OUT=$L TEST_GPU_PARTS=late TEST_GPU_CHECK_LIMIT=120 timeout $(left 570) bash scripts/test-gpu.sh 2>&1 \
      | grep -E "^(PASS|FAIL|SKIP|      )|test-gpu:|late_mix:" | cut -c1-220
    ;;
  x)
    # a's late_mix broken on purpose: the halves' waits swapped, so every trace test must fail.
    OUT=$L TEST_GPU_PARTS=latemix TEST_GPU_LATE_MIX_WAITS="1000000 0" TEST_GPU_CHECK_LIMIT=120 \
      timeout $(left 570) bash scripts/test-gpu.sh 2>&1 | grep -E "^(PASS|FAIL|SKIP)|test-gpu:|late_mix:" | cut -c1-220
    ;;
  b) session_steps host host "ddp fsdp" "railcc nccl" 80 "$LATE $LATE24" "--steps 30" ;;
  h) session_steps 2x2 2x2 "hsdp ddp" "railcc nccl-4x4" 100 "$LATE" "--steps 30" ;;
  o) session_steps overlap host overlap "railcc nccl" 100 "$LATE $LATE24" ;;
  *) echo "usage: $0 a|x|n|b|h|o"; exit 2 ;;
esac
session_end "$1"
