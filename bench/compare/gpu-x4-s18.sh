#!/usr/bin/env bash
# On nvidia-h100-x4 / nvidia-h200-x4 (after bash bench/compare/gpu-prepare.sh here; carry
# .device): the device calls written in the sixteenth session for the next one, one part per
# call. Logs under $OUT/logs, tarred to $OUT/logs-<part>.tgz.
#   a  ncclAllReduce's return to its caller through NCCL's and railcc's libnccl in one
#      command (bench/experiments/return_time.sh: 8 B, 8 MB, 128 MB; the caller woken after
#      12 ms asleep, busy 12 ms, or queued behind its last call), 2 x 1 and 2 x 2. The
#      sixteenth session found a no-op launch alone costs 45 us after 12 ms asleep: is
#      NCCL's idle return any shorter than railcc's 50-85 us at 128 MB?
#   b  where HSDP's step goes (2 x 2: 1.01x NCCL 4x4, target 0.9x): HSDP and FSDP on one host
#      of 4 GPUs (no network: the NVLink parts alone), railcc against NCCL, two runs each,
#      interleaved. If railcc is at parity or ahead there, the cross-host replica all_reduce
#      (12.6 MB bf16 a layer, 2 x 1 in each replica group) is what to shorten. Then one 2 x 2
#      HSDP run with RAILCC_GPU_HOST_TRACE and RAILCC_GPU_NET_TRACE (the host's waits).
#   c, d  the GPU suite's parts not run on the new close code (last session's waits before a
#      close frees; recover, config, unit and nccl passed in the sixteenth session):
#      c: bench push shared shrink; d: p2pbatch p2pll register split alloc.
# Usage: bash bench/compare/gpu-x4-s18.sh a|b|c|d
set -u
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
session_begin
case ${1:-} in
  a)
    OUT=$L RT_PER=1 timeout 200 bash bench/experiments/return_time.sh
    mv "$L/return_time.log" "$L/return_time-2x1.log"
    echo "== after $(( $(date +%s) - T0 )) s"
    OUT=$L RT_PER=2 timeout $(left 500) bash bench/experiments/return_time.sh
    mv "$L/return_time.log" "$L/return_time-2x2.log"
    ;;
  b)
    OUT=$L/host STEP_LAYOUTS=host STEP_MODES="hsdp fsdp" STEP_RUNS=2 STEP_LIMIT=90 STEP_LIBS="railcc nccl" STEP_ARGS="--steps 30" \
      timeout $(left 420) bash bench/torch/step.sh 2>&1 | tee "$L/host.txt" | grep -v "^  "
    echo "== after $(( $(date +%s) - T0 )) s"
    # One 2 x 2 HSDP run with the host traces: how long each NVLink call's host waited for its
    # peers to publish ("coll wait peers+map": railcc's calls meet on the host, NCCL's only on
    # the GPU, so a rank whose Python runs late holds the others' CPU threads), and the network
    # engine's enqueue.
    OUT=$L/trace STEP_LAYOUTS=2x2 STEP_MODES=hsdp STEP_RUNS=1 STEP_LIMIT=90 STEP_LIBS=none \
      STEP_EXTRA="trace:RAILCC_GPU_HOST_TRACE=1,RAILCC_GPU_NET_TRACE=1" STEP_ARGS="--steps 30" \
      timeout $(left 570) bash bench/torch/step.sh 2>&1 | grep -v "^  "
    grep -h "host trace\|gpu net trace" "$L"/trace/*.node* | cut -c1-400 | head -16
    ;;
  c)
    OUT=$L TEST_GPU_PARTS="bench push shared shrink" timeout $(left 570) bash scripts/test-gpu.sh 2>&1 | grep -E "^(PASS|FAIL|SKIP)|test-gpu:" | cut -c1-160
    ;;
  d)
    OUT=$L TEST_GPU_PARTS="p2pbatch p2pll register split alloc" timeout $(left 570) bash scripts/test-gpu.sh 2>&1 | grep -E "^(PASS|FAIL|SKIP)|test-gpu:" | cut -c1-160
    ;;
  *) echo "usage: $0 a|b|c|d"; exit 2 ;;
esac
session_end "$1"
