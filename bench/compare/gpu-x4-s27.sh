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

# steps NAME LAYOUT MODES LIBS LIMIT EXTRA [STEP_ARGS]: bench/torch/step.sh pinned (STEP_PIN, 1),
# STEP_RUNS runs (2), its log in $L/NAME.txt and its files under $L/NAME.
steps() {
  OUT=$L/$1 STEP_PIN=${STEP_PIN:-1} STEP_LAYOUTS=$2 STEP_MODES=$3 STEP_RUNS=${STEP_RUNS:-2} STEP_LIBS=$4 \
    STEP_LIMIT=$5 STEP_EXTRA=$6 STEP_ARGS=${7:-} NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT \
    timeout $(left 575) bash bench/torch/step.sh 2>&1 | tee "$L/$1.txt" | grep -v "^  "
}
case ${1:-} in
  g)
    OUT=$L TEST_GPU_PARTS="${S27_PARTS:-late latespin}" TEST_GPU_CHECK_LIMIT=120 timeout $(left 570) bash scripts/test-gpu.sh 2>&1 \
      | grep -E "^(PASS|FAIL|SKIP|      )|test-gpu:" | cut -c1-220
    ;;
  n)
    N=$(nvidia-smi -L | wc -l)
    nccl_tests_build_both >/dev/null 2>&1 || echo "FAIL  nccl-tests build"
    NCCL_HOME=$(python3 -c "import nvidia.nccl,os;print(nvidia.nccl.__path__[0])")
    MPIN="mpirun -np $N --bind-to none --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x RAILCC_CACHE_DIR -x RAILCC_GPU_LATE_ARGS -x RAILCC_GPU_LATE_GATE -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS"
    for c in all_reduce all_gather reduce_scatter; do
    for v in railcc late2 late2s nccl; do
      lib="$PWD/.device/lib" late=0 gate=0 f="$L/n-$c-$v.log"
      [ "$v" = nccl ] && lib=$NCCL_HOME/lib
      case $v in late2) late=2 gate=1 ;; late2s) late=2 gate=0 ;; esac
      env RAILCC_GPU_LATE_ARGS=$late RAILCC_GPU_LATE_GATE=$gate NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT \
        LD_LIBRARY_PATH="$lib:/usr/local/cuda/lib64" \
        timeout 90 $MPIN $NTM/build/${c}_perf -g 1 -b 1M -e 256M -f 4 -n 20 -w 5 -c 1 > "$f" 2>&1
      echo "== $c $v: exit $?, $(grep -c 'Out of bounds values : 0 OK' "$f") OK table(s)$( [ $v = nccl ] && grep -m1 -oE ' [0-9]+ coll channels' "$f")"
      grep -E "^ +[0-9]+ +[0-9]+ " "$f" | awk '{printf "  %10s %10s us %7s GB/s busbw #wrong %s\n", $1, $6, $8, $9}'
    done
    done
    ;;
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
  b) steps host host "ddp fsdp" "${S27_LIBS:-nccl}" 80 "${S27_EXTRA:-$L2 $L2S}" "--steps 30" ;;
  b2) STEP_NPROC=2 steps host2 host "ddp fsdp" "${S27_LIBS:-nccl}" 80 "${S27_EXTRA:-$L2 $L2S}" "--steps 30" ;;
  h) steps 2x2 2x2 "hsdp ddp" "railcc nccl-4x4" 100 "$L2" "--steps 30" ;;
  o) steps overlap host overlap "railcc nccl" 100 "$L2 $L2S" ;;
  *) echo "usage: $0 g|n|p|b|b2|h|o"; exit 2 ;;
esac
session_end "$1"
