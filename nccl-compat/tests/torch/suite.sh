#!/usr/bin/env bash
# On a GPU machine (device kinds nvidia-h200, nvidia-h200-x2): issue 18's PyTorch suite
# (suite.py) with 4 ranks, three runs:
#   railcc-host   railcc's libnccl (LD_PRELOAD), one host: torchrun --nproc_per_node 4 (ranks
#                 share the GPUs where fewer than 4: the per-process path, CUDA IPC);
#   railcc-hosts  railcc's libnccl, 4 emulated hosts (NCCL_HOSTID/RAILCC_HOSTID per process,
#                 one torchrun node each, GPU i mod the GPU count): the network path;
#   nccl-hosts    NCCL itself, the same 4 emulated hosts (NCCL refuses two ranks of one host
#                 on one GPU, so its baseline is this layout).
# A run passes when every rank exits 0 and prints "suite: rank R: N checks ok". Then the DDP
# loss curves of the railcc runs must equal NCCL's within 1e-5, and the FSDP2 (bf16 reduce)
# curves within 2e-2 (bf16 sums in another order round differently). Figures and SKIP lines
# (what torch itself refuses) are printed. Prepare with bench/compare/gpu-prepare.sh and carry
# .device. Logs: $OUT/suite-*.log. Exit 1 if anything failed. SUITE_RUNS picks runs (the
# loss comparison needs nccl-hosts); SUITE_VERBOSE=1 names each check as it starts.
# SUITE_ALLOC picks PyTorch's allocator for every run (issue 29): default, expandable
# (expandable_segments:True), async (backend:cudaMallocAsync) or reghook
# (TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1).
set -uo pipefail
cd "$(dirname "$0")/../../.."
source bench/compare/gpu-env.sh
mkdir -p "$OUT"
LIB=$PWD/.device/lib/libnccl.so.2
PY=$PWD/nccl-compat/tests/torch/suite.py
NGPU=$(nvidia-smi -L | wc -l)
LIMIT=${SUITE_LIMIT:-240}
case ${SUITE_ALLOC:-default} in
  default) ;;
  expandable) export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ;;
  async) export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync ;;
  reghook) export TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1 ;;
  *) echo "FAIL  suite: SUITE_ALLOC=${SUITE_ALLOC} is none of default, expandable, async, reghook"; exit 1 ;;
esac
[ "${SUITE_ALLOC:-default}" = default ] || echo "suite.sh: allocator ${SUITE_ALLOC}"
export NCCL_SOCKET_IFNAME=lo RAILCC_SOCKET_IFNAME=lo RAILCC_TIMEOUT_MS=60000 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
fails=0

# verdict NAME LOGS...: the checks of one run (every log's ranks), in this shell.
verdict() {
  local name=$1; shift
  local oks skips
  oks=$(cat "$@" | grep -c "^suite: rank [0-9]: [0-9]* checks ok")
  skips=$(cat "$@" | grep "^SKIP" | sort -u)
  if [ "${RCS:-0}" = 0 ] && [ "$oks" = 4 ]; then
    echo "PASS  suite $name: 4 ranks, $(cat "$@" | grep -m1 -o '[0-9]* checks ok, [0-9]* skipped')"
  else
    echo "FAIL  suite $name: exit status $RCS, $oks of 4 ranks finished"
    cat "$@" | grep -E "FAILED|Error|error" | grep -v "NCCL INFO" | head -n 8 | sed 's/^/  /'
    fails=$((fails + 1))
  fi
  [ -z "$skips" ] || echo "$skips" | sed 's/^/  /'
}

RUNS=${SUITE_RUNS:-railcc-host railcc-hosts nccl-hosts}
case " $RUNS " in *" railcc-host "*)
log=$OUT/suite-railcc-host.log
LD_PRELOAD=$LIB timeout -k 10 "$LIMIT" python3 -m torch.distributed.run --nproc_per_node 4 \
  --master_addr 127.0.0.1 --master_port 29541 "$PY" "$OUT/suite-railcc-host" > "$log" 2>&1
RCS=$?
verdict railcc-host "$log"
pkill -9 -f "$PY" 2>/dev/null
;; esac

# hosts NAME PORT [VAR=VALUE...]: 4 one-rank nodes, each its own emulated host.
hosts() {
  local name=$1 port=$2 i pids=()
  shift 2
  RCS=0
  for i in 0 1 2 3; do
    env "$@" CUDA_VISIBLE_DEVICES=$((i % NGPU)) NCCL_HOSTID=host$i RAILCC_HOSTID=host$i \
      timeout -k 10 "$LIMIT" python3 -m torch.distributed.run --nnodes 4 --node_rank $i \
        --nproc_per_node 1 --master_addr 127.0.0.1 --master_port "$port" \
        "$PY" "$OUT/suite-$name" < /dev/null > "$OUT/suite-$name.node$i.log" 2>&1 &
    pids[$i]=$!
  done
  for i in 0 1 2 3; do
    wait "${pids[$i]}" || RCS=$?
  done
  pkill -9 -f "$PY" 2>/dev/null
  verdict "$name" "$OUT"/suite-$name.node?.log
}
case " $RUNS " in *" railcc-hosts "*) hosts railcc-hosts 29542 LD_PRELOAD="$LIB" ;; esac
case " $RUNS " in *" nccl-hosts "*) hosts nccl-hosts 29543 ;; esac

# Value printing apart from the verdict: max |difference| of two loss files, or "missing".
loss_diff() {
  python3 - "$1" "$2" <<'PY'
import os, sys
if not all(os.path.exists(p) for p in sys.argv[1:3]):
    print("missing"); sys.exit(0)
a = [float(x) for x in open(sys.argv[1]) if x.strip()]
b = [float(x) for x in open(sys.argv[2]) if x.strip()]
print(f"{max(abs(x - y) for x, y in zip(a, b)):.3e}" if a and len(a) == len(b) else "unequal")
PY
}
for kind in ddp fsdp; do
  tol=1e-5; [ $kind = fsdp ] && tol=2e-2
  for run in railcc-host railcc-hosts; do
    d=$(loss_diff "$OUT/suite-$run.$kind.loss.txt" "$OUT/suite-nccl-hosts.$kind.loss.txt")
    if python3 -c "import sys; sys.exit(0 if '$d'[0].isdigit() and float('$d') <= $tol else 1)"; then
      echo "PASS  $kind loss, $run against NCCL: max difference $d (tolerance $tol)"
    else
      echo "FAIL  $kind loss, $run against NCCL: max difference $d (tolerance $tol)"
      fails=$((fails + 1))
    fi
  done
done
echo "suite.sh: $fails failed"
[ "$fails" = 0 ]
