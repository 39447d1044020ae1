#!/usr/bin/env bash
# On a GPU machine: issue 18's PyTorch suite (suite.py) with 4 ranks. Runs (SUITE_RUNS):
#   railcc-host   railcc's libnccl (LD_PRELOAD), one host: torchrun --nproc_per_node 4 (ranks
#                 share the GPUs where fewer than 4: the per-process path, CUDA IPC);
#   nccl-host     NCCL itself, the same layout (only where the machine has 4 GPUs: NCCL
#                 refuses two ranks of one host on one GPU);
#   railcc-2x2    railcc, 2 emulated hosts x 2 ranks (two torchrun nodes of 2 processes,
#                 NCCL_HOSTID/RAILCC_HOSTID per node): the hierarchy, GPU-local inside a host;
#   nccl-2x2      NCCL, the same layout;
#   railcc-hosts  railcc's libnccl, 4 emulated hosts (one torchrun node each, GPU i mod the
#                 GPU count): the network path;
#   nccl-hosts    NCCL itself, the same 4 emulated hosts.
# Default runs: railcc-host railcc-hosts nccl-hosts (fewer than 4 GPUs), railcc-host nccl-host
# railcc-2x2 nccl-2x2 (4 or more).
# A run passes when every rank exits 0 and prints "suite: rank R: N checks ok". Then the DDP
# loss curves of each railcc run must equal NCCL's of the same layout (else of the nearest
# NCCL run made: host, 2x2, hosts) within 1e-5, and the FSDP2 (bf16 reduce) curves within
# 2e-2 (bf16 sums in another order round differently). NCCL's curves may come from an earlier
# call with another allocator (the allocator does not change NCCL's sums): files
# $OUT/suite-nccl-<layout>[-<alloc>].{ddp,fsdp}.loss.txt. Figures and SKIP lines (what torch
# itself refuses) are printed. Prepare with bench/compare/gpu-prepare.sh and carry .device.
# Logs: $OUT/suite-<run>[-<alloc>]*.log. Exit 1 if anything failed. SUITE_VERBOSE=1 names
# each check as it starts.
# SUITE_ALLOC picks PyTorch's allocator for every run (issue 29): default, expandable
# (expandable_segments:True), async (backend:cudaMallocAsync) or reghook
# (TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1); run names other than default's carry it.
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
ALLOC=${SUITE_ALLOC:-default}
SFX=""
[ "$ALLOC" = default ] || { SFX="-$ALLOC"; echo "suite.sh: allocator $ALLOC"; }
export NCCL_SOCKET_IFNAME=lo RAILCC_SOCKET_IFNAME=lo RAILCC_TIMEOUT_MS=60000 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
fails=0

# verdict NAME LOGS...: the checks of one run (every log's ranks), in this shell.
verdict() {
  local name=$1; shift
  local oks skips
  # Ranks share a log: a line may hold two ranks' lines (each prints text and newline apart).
  oks=$(cat "$@" | grep -o "suite: rank [0-9]: [0-9]* checks ok" | sort -u | wc -l)
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

if [ "$NGPU" -ge 4 ]; then RUNS=${SUITE_RUNS:-railcc-host nccl-host railcc-2x2 nccl-2x2}
else RUNS=${SUITE_RUNS:-railcc-host railcc-hosts nccl-hosts}; fi

# host NAME PORT [VAR=VALUE...]: one torchrun of 4 processes on this host.
host() {
  local name=$1$SFX port=$2 log
  shift 2
  log=$OUT/suite-$name.log
  env "$@" timeout -k 10 "$LIMIT" python3 -m torch.distributed.run --nproc_per_node 4 \
    --master_addr 127.0.0.1 --master_port "$port" "$PY" "$OUT/suite-$name" > "$log" 2>&1
  RCS=$?
  verdict "$name" "$log"
  pkill -9 -f "$PY" 2>/dev/null
}
case " $RUNS " in *" railcc-host "*) host railcc-host 29541 LD_PRELOAD="$LIB" ;; esac
case " $RUNS " in *" nccl-host "*) host nccl-host 29544 ;; esac

# hosts NAME PORT NODES [VAR=VALUE...]: NODES torchrun nodes of 4/NODES processes, each node
# its own emulated host; node i's processes use GPUs from i * 4/NODES on (mod the GPU count).
hosts() {
  local name=$1$SFX port=$2 nodes=$3 i pids=() per gpus g
  shift 3
  per=$((4 / nodes))
  RCS=0
  for i in $(seq 0 $((nodes - 1))); do
    gpus=""
    for g in $(seq $((i * per)) $((i * per + per - 1))); do gpus="$gpus${gpus:+,}$((g % NGPU))"; done
    env "$@" CUDA_VISIBLE_DEVICES=$gpus NCCL_HOSTID=host$i RAILCC_HOSTID=host$i \
      timeout -k 10 "$LIMIT" python3 -m torch.distributed.run --nnodes "$nodes" --node_rank $i \
        --nproc_per_node $per --master_addr 127.0.0.1 --master_port "$port" \
        "$PY" "$OUT/suite-$name" < /dev/null > "$OUT/suite-$name.node$i.log" 2>&1 &
    pids[$i]=$!
  done
  for i in $(seq 0 $((nodes - 1))); do
    wait "${pids[$i]}" || RCS=$?
  done
  pkill -9 -f "$PY" 2>/dev/null
  verdict "$name" "$OUT"/suite-$name.node?.log
}
case " $RUNS " in *" railcc-2x2 "*) hosts railcc-2x2 29545 2 LD_PRELOAD="$LIB" ;; esac
case " $RUNS " in *" nccl-2x2 "*) hosts nccl-2x2 29546 2 ;; esac
case " $RUNS " in *" railcc-hosts "*) hosts railcc-hosts 29542 4 LD_PRELOAD="$LIB" ;; esac
case " $RUNS " in *" nccl-hosts "*) hosts nccl-hosts 29543 4 ;; esac

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
# nccl_curve LAYOUT KIND: NCCL's loss file for a railcc run of LAYOUT (same layout first, this
# allocator first), or nothing.
nccl_curve() {
  local l f
  for l in "$1" host 2x2 hosts; do
    for f in "$OUT/suite-nccl-$l$SFX.$2.loss.txt" "$OUT/suite-nccl-$l.$2.loss.txt"; do
      [ -e "$f" ] && { echo "$f"; return; }
    done
  done
}
for kind in ddp fsdp; do
  tol=1e-5; [ $kind = fsdp ] && tol=2e-2
  for run in $RUNS; do
    case $run in railcc-*) ;; *) continue ;; esac
    ref=$(nccl_curve "${run#railcc-}" $kind)
    d=$(loss_diff "$OUT/suite-$run$SFX.$kind.loss.txt" "${ref:-/nonexistent}")
    if python3 -c "import sys; sys.exit(0 if '$d'[0].isdigit() and float('$d') <= $tol else 1)"; then
      echo "PASS  $kind loss, $run$SFX against NCCL ($(basename "$ref" .$kind.loss.txt)): max difference $d (tolerance $tol)"
    else
      echo "FAIL  $kind loss, $run$SFX against NCCL (${ref:-no NCCL run}): max difference $d (tolerance $tol)"
      fails=$((fails + 1))
    fi
  done
done
echo "suite.sh: $fails failed"
[ "$fails" = 0 ]
