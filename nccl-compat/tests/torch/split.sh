#!/usr/bin/env bash
# On a GPU machine (device kinds nvidia-h200, nvidia-h200-x2): torch's new_group/split_group on
# railcc's libnccl.so.2 (LD_PRELOAD), 4 ranks, two ways: one host (torchrun --nproc_per_node 4;
# ranks share GPUs where fewer than 4) and two emulated hosts (two torchrun --nnodes 2 with
# their own NCCL_HOSTID, 2 ranks each). Each run must exit 0 with "split: ok" from all 4 ranks
# and railcc's "ncclCommSplit" lines (NCCL_DEBUG=INFO) showing torch really split.
# Prepare with bench/compare/gpu-prepare.sh and carry .device. Logs: $OUT/split-*.log.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source bench/compare/gpu-env.sh
mkdir -p "$OUT"
LIB=$PWD/.device/lib/libnccl.so.2
PY=$PWD/nccl-compat/tests/torch/split.py
export NCCL_SOCKET_IFNAME=lo RAILCC_SOCKET_IFNAME=lo RAILCC_TIMEOUT_MS=60000 NCCL_DEBUG=INFO PYTHONUNBUFFERED=1
fails=0
# verdict NAME LOG STATUS: the checks of one run, in this shell.
verdict() {
  local name=$1 log=$2 st=$3 oks splits
  oks=$(grep -c "split: ok" "$log")
  splits=$(grep -c "railcc libnccl ncclCommSplit" "$log")
  if [ "$st" = 0 ] && [ "$oks" = 4 ] && [ "$splits" -ge 4 ]; then
    echo "PASS  split $name: exit 0, 4 ranks ok, $splits ncclCommSplit lines"
  else
    echo "FAIL  split $name: exit $st, $oks of 4 ranks ok, $splits ncclCommSplit lines"
    grep -vE "NCCL INFO" "$log" | tail -n 15
    fails=$((fails + 1))
  fi
  grep -m 3 "ncclCommSplit" "$log" | sed 's/^/  /'
}

log=$OUT/split-one-host.log
LD_PRELOAD=$LIB timeout -k 10 300 python3 -m torch.distributed.run --nproc_per_node 4 \
  --master_addr 127.0.0.1 --master_port 29531 "$PY" > "$log" 2>&1
verdict "one host, 4 ranks" "$log" $?

log=$OUT/split-two-hosts.log
: > "$log"
pids=()
for i in 0 1; do
  LD_PRELOAD=$LIB NCCL_HOSTID=host$i RAILCC_HOSTID=host$i timeout -k 10 300 \
    python3 -m torch.distributed.run --nnodes 2 --node_rank $i --nproc_per_node 2 \
    --master_addr 127.0.0.1 --master_port 29532 "$PY" > "$log.$i" 2>&1 &
  pids+=($!)
done
st=0
for p in "${pids[@]}"; do wait "$p" || st=$?; done
cat "$log.0" "$log.1" > "$log"; rm -f "$log.0" "$log.1"
verdict "two emulated hosts x 2 ranks" "$log" $st
echo "split.sh: $fails failed"
[ "$fails" = 0 ]
