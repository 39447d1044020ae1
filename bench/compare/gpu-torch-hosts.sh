#!/usr/bin/env bash
# PyTorch (DDP, FSDP2, all_reduce/matmul overlap) across 2 emulated hosts on one machine with
# 2 GPUs: two torchrun invocations (--nnodes 2, one process each, CUDA_VISIBLE_DEVICES=i,
# NCCL_HOSTID/RAILCC_HOSTID host$i, sockets over lo), once on railcc's libnccl.so.2
# (LD_PRELOAD) and once on NCCL; compares their loss curves. Prepare with
# bench/compare/gpu-prepare.sh; carry .device; run on nvidia-h200-x2. Logs: one per node,
# $OUT/hosts-{railcc,nccl}.node{0,1}.log, all of them in $OUT/torch-hosts.log; loss curves
# $OUT/hosts-{railcc,nccl}{.loss,.fsdp.loss}.txt.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
mkdir -p "$OUT"
LIB="$PWD/.device/lib/libnccl.so.2"
CHECK="$PWD/nccl-compat/tests/torch/check.py"
LOG="$OUT/torch-hosts.log"
TOL=1e-5
LIMIT=${TORCH_HOSTS_TIMEOUT:-300}   # seconds per torchrun; two runs of it must fit a device call
: > "$LOG"
fails=0
declare -A RC   # RC[name.node] = torchrun's exit status

say() { printf '%s\n' "$*" | tee -a "$LOG"; }

# Kills what a run left behind: its workers run in their own sessions, so torchrun's
# timeout does not reach them.
kill_leftovers() {
  pkill -9 -f "$CHECK" 2>/dev/null
  sleep 1
}

# run_hosts NAME PORT [VAR=VALUE...]: both nodes of one job, in the background, each bounded.
run_hosts() {
  local name=$1 port=$2 i
  shift 2
  local pids=()
  local NGPU; NGPU=$(nvidia-smi -L | wc -l)   # one GPU: both hosts share it
  rm -f "$OUT/hosts-$name.loss.txt" "$OUT/hosts-$name.fsdp.loss.txt"
  say "== torch 2 hosts on $name (master port $port): $*"
  for i in 0 1; do
    env "$@" CUDA_VISIBLE_DEVICES=$((i % NGPU)) NCCL_HOSTID=host$i RAILCC_HOSTID=host$i \
        NCCL_SOCKET_IFNAME=lo RAILCC_SOCKET_IFNAME=lo OVERLAP=1 \
      timeout -k 10 "$LIMIT" python3 -m torch.distributed.run --nnodes 2 --node_rank $i \
        --nproc_per_node 1 --master_addr 127.0.0.1 --master_port "$port" \
        "$CHECK" "$OUT/hosts-$name" < /dev/null > "$OUT/hosts-$name.node$i.log" 2>&1 &
    pids[$i]=$!
  done
  for i in 0 1; do
    wait "${pids[$i]}"
    RC[$name.$i]=$?
  done
  kill_leftovers
  for i in 0 1; do
    {
      echo "---- $name node $i (exit ${RC[$name.$i]}): $OUT/hosts-$name.node$i.log"
      cat "$OUT/hosts-$name.node$i.log"
    } >> "$LOG"
    say "$name node $i: exit ${RC[$name.$i]}"
    if [ "${RC[$name.$i]}" != 0 ]; then
      # The end of the failing node's log, less NCCL's INFO lines.
      grep -v "NCCL INFO" "$OUT/hosts-$name.node$i.log" | tail -n 12 | sed "s/^/  $name node $i| /" | tee -a "$LOG"
    fi
  done
}

# Value printing (no verdict): figures for two loss files; exit 0 within TOL, 1 beyond it or
# different lengths, 2 missing or unreadable.
loss_figures() {
  python3 - "$1" "$2" "$TOL" <<'PY'
import os, sys
a_path, b_path, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
for p in (a_path, b_path):
    if not os.path.exists(p):
        print(f"missing {p}")
        sys.exit(2)
try:
    a = [float(x) for x in open(a_path) if x.strip()]
    b = [float(x) for x in open(b_path) if x.strip()]
except Exception as e:
    print(f"unreadable: {e}")
    sys.exit(2)
if not a or not b:
    print(f"empty: {len(a)} and {len(b)} steps")
    sys.exit(2)
d = max(abs(x - y) for x, y in zip(a, b))
rel = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))
print(f"{len(a)} and {len(b)} steps; max abs difference {d:.3e} (tolerance {tol:g}), max relative {rel:.3e}; "
      f"first {a[0]:.5f}/{b[0]:.5f}, last {a[-1]:.5f}/{b[-1]:.5f} (railcc/NCCL)")
sys.exit(0 if len(a) == len(b) and d <= tol else 1)
PY
}

# The check: one verdict line, counted in this shell (not in a subshell).
compare() {  # LABEL SUFFIX
  local label=$1 suffix=$2 figs st codes skip
  figs=$(loss_figures "$OUT/hosts-railcc$suffix" "$OUT/hosts-nccl$suffix")
  st=$?
  codes="exit codes railcc ${RC[railcc.0]}/${RC[railcc.1]}, NCCL ${RC[nccl.0]}/${RC[nccl.1]}"
  skip=$(grep -h "SKIP fsdp2" "$OUT"/hosts-*.node*.log 2>/dev/null | head -n 1)
  if [ "$suffix" = .fsdp.loss.txt ] && [ -n "$skip" ]; then
    figs="$figs; $skip"
  fi
  if [ "$st" = 0 ] && [ "${RC[railcc.0]}" = 0 ] && [ "${RC[railcc.1]}" = 0 ] \
      && [ "${RC[nccl.0]}" = 0 ] && [ "${RC[nccl.1]}" = 0 ]; then
    say "PASS  torch 2 hosts $label: $figs; $codes"
  else
    say "FAIL  torch 2 hosts $label: $figs; $codes"
    fails=$((fails + 1))
  fi
}

say "torch-hosts: $(python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "GPUs", torch.cuda.device_count())' 2>&1)"
kill_leftovers
run_hosts railcc 29511 LD_PRELOAD="$LIB" NCCL_DEBUG=INFO
run_hosts nccl 29512 NCCL_DEBUG=INFO

say "== what NCCL saw (node 0)"
grep -m 2 -E "nNodes" "$OUT/hosts-nccl.node0.log" | sed 's/^/  /' | tee -a "$LOG"
grep -m 2 -E "via NET/Socket" "$OUT/hosts-nccl.node0.log" | sed 's/^/  /' | tee -a "$LOG"
grep -q "via NET/Socket" "$OUT/hosts-nccl.node0.log" || say "  (no \"via NET/Socket\" line in NCCL's log)"
say "== torch versions and NCCL versions seen"
grep -h "NCCL version seen by torch" "$OUT"/hosts-railcc.node*.log "$OUT"/hosts-nccl.node*.log | sed 's/^/  /' | tee -a "$LOG"

say "== overlap (128 MB all_reduce with 8192^3 bf16 matmuls on another stream)"
for name in railcc nccl; do
  lines=$(grep -h "overlap:" "$OUT/hosts-$name.node0.log" "$OUT/hosts-$name.node1.log" 2>/dev/null)
  if [ -n "$lines" ]; then
    printf '%s\n' "$lines" | sed "s/^/  $name: /" | tee -a "$LOG"
  else
    say "  $name: no overlap lines"
  fi
done

say "== verdicts"
compare DDP .loss.txt
compare FSDP2 .fsdp.loss.txt
say "torch-hosts: $fails failed"
[ "$fails" -gt 0 ] && exit 1
exit 0
