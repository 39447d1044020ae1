#!/usr/bin/env bash
# On nvidia-h200-x4 (after bash bench/compare/gpu-prepare.sh here; carry .device): for the
# twenty-second session: a late kernel behind a stream wait (RAILCC_GPU_LATE_GATE, now on
# with late arguments), so its blocks take their SMs only once the peers are there; late2s
# is the kernel without it, spinning on its SMs. Logs under $OUT/logs, tarred to
# $OUT/logs-<part>.tgz.
#   g  the GPU suite's late and latespin parts (S27_PARTS).
#   n  nccl-tests under mpirun -np N: all_reduce, all_gather, reduce_scatter 1 MB-256 MB,
#      railcc default, late (=2), late2s, NCCL.
#   p  bench/torch/late_peer.py on every GPU: rank 0's matrix products while its peers are
#      100 ms late, beside each variant's waiting collective: railcc, late2, late2s, late2b24, NCCL.
#      (S27_VARIANTS picks some; CUDA_DEVICE_MAX_CONNECTIONS passes through, as Megatron sets 1).
#   b  steps on one host, DDP and FSDP: late2, late2s, NCCL (S27_LIBS adds railcc's default:
#      "railcc nccl"); STEP_RUNS (2), STEP_PIN (1).
#   b2 the same on 2 GPUs (while 4-GPU kinds are not lent).
#   h  steps on 2 emulated hosts x 2 GPUs, HSDP and DDP: railcc, late2, NCCL 4 x 4 sockets;
#      STEP_RUNS (2).
#   o  the overlap benchmark on one host: railcc, late2, late2s, NCCL.
# Usage: bash bench/compare/gpu-x4-s27.sh g|n|p|b|b2|h|o
set -u
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
session_begin
L2="late2:RAILCC_GPU_LATE_ARGS=2" L2S="late2s:RAILCC_GPU_LATE_ARGS=2,RAILCC_GPU_LATE_GATE=0"

case ${1:-} in
  g)
    OUT=$L TEST_GPU_PARTS="${S27_PARTS:-late latespin}" TEST_GPU_CHECK_LIMIT=120 timeout $(left 570) bash scripts/test-gpu.sh 2>&1 \
      | grep -E "^(PASS|FAIL|SKIP|      )|test-gpu:" | cut -c1-220
    ;;
  n) nccl_variants n railcc "late2:RAILCC_GPU_LATE_ARGS=2,RAILCC_GPU_LATE_GATE=1" \
       "late2s:RAILCC_GPU_LATE_ARGS=2,RAILCC_GPU_LATE_GATE=0" nccl ;;
  p)
    # bench/torch/late_peer.py on every GPU: rank 0's products while its peers are 100 ms late.
    N=$(nvidia-smi -L | wc -l) port=29700
    for v in ${S27_VARIANTS:-railcc late2 late2s late2b24 nccl}; do
      port=$((port + 1)) envs=(LD_PRELOAD=$PWD/.device/lib/libnccl.so.2)
      case $v in
        late2) envs+=(RAILCC_GPU_LATE_ARGS=2) ;;
        late2s) envs+=(RAILCC_GPU_LATE_ARGS=2 RAILCC_GPU_LATE_GATE=0) ;;
        late2b24) envs+=(RAILCC_GPU_LATE_ARGS=2 RAILCC_GPU_MAX_BLOCKS=24) ;;
        nccl) envs=() ;;
      esac
      env "${envs[@]}" NCCL_NVLS_ENABLE=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout -k 5 120 \
        python3 -m torch.distributed.run --nproc_per_node $N --master_addr 127.0.0.1 --master_port $port \
        bench/torch/late_peer.py --out $L/late_peer --label $v > $L/late_peer-$v.log 2>&1
      echo "== $v: exit $?$( [ $v = nccl ] && grep -m1 -oE ' [0-9]+ coll channels' $L/late_peer-$v.log)"
      grep "^late_peer:" $L/late_peer-$v.log
    done
    ;;
  b) session_steps host host "ddp fsdp" "${S27_LIBS:-nccl}" 80 "${S27_EXTRA:-$L2 $L2S}" "--steps 30" ;;
  b2) STEP_NPROC=2 session_steps host2 host "ddp fsdp" "${S27_LIBS:-nccl}" 80 "${S27_EXTRA:-$L2 $L2S}" "--steps 30" ;;
  h) session_steps 2x2 2x2 "hsdp ddp" "railcc nccl-4x4" 100 "$L2" "--steps 30" ;;
  o) session_steps overlap host overlap "railcc nccl" 100 "$L2 $L2S" ;;
  *) echo "usage: $0 g|n|p|b|b2|h|o"; exit 2 ;;
esac
session_end "$1"
