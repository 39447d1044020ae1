#!/usr/bin/env bash
# On a GPU machine: after a failure the same processes go on (issue 29 item 2; recover.c says
# what each rank does). Ranks are processes started here, GPU = rank mod the GPU count (ranks
# share GPUs where there are fewer), RAILCC_TIMEOUT_MS unset (libnccl's default: no deadline).
#   kill LAYOUT MODE  4 ranks all-reduce; rank 3 is killed (SIGKILL) once all run. Every
#                     survivor must fail within 1 s of the kill, naming rank 3, then recover by
#                     MODE (shrink: ncclCommShrink; reinit: abort and a new communicator) and
#                     run 100 checked all_reduces, a matrix product, and find a buffer made
#                     before the kill unchanged. LAYOUT: host (one host) or 2x2 (two emulated
#                     hosts of 2 ranks, RAILCC_HOSTID/NCCL_HOSTID).
#   abort[:N[:push]]  N ranks (2); rank 0's kernel waits for the others (held 10 s);
#                     ncclCommAbort from another thread must return, and the stream finish,
#                     within 1 s; then a matrix product runs, and the others' streams must
#                     finish within 5 s of their hold with rank 0 alive (its aborted kernel
#                     must not leave them waiting). push: on the push kernel (4 GPUs or more).
# Prepare with bench/compare/gpu-prepare.sh; carry .device. RECOVER_CASES picks cases (default
# "kill:host:shrink kill:host:reinit kill:2x2:shrink kill:2x2:reinit abort abort:4:push"). One PASS/FAIL
# line per case; exit 1 if any failed. Logs: $OUT/recover-<case>.log.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source bench/compare/gpu-env.sh
mkdir -p "$OUT"
unset RAILCC_TIMEOUT_MS
work=$(mktemp -d)
cp "${LIB:-.device/lib}/libnccl.so.2" "$work/" && ln -s libnccl.so.2 "$work/libnccl.so"
gcc -O1 -I nccl-compat/include -I /usr/local/cuda/include nccl-compat/tests/recover/recover.c \
  -L "$work" -lnccl -L /usr/local/cuda/lib64 -lcudart -lcublas -lpthread -o "$work/recover" \
  || { echo "FAIL recover: build"; exit 1; }
export LD_LIBRARY_PATH="$work:$LD_LIBRARY_PATH" NCCL_SOCKET_IFNAME=lo RAILCC_SOCKET_IFNAME=lo
FAILS=0
pass() { echo "PASS  $1"; }
fail() { echo "FAIL  $1"; FAILS=$((FAILS + 1)); }

# kill_case LAYOUT MODE
kill_case() {
  local layout=$1 mode=$2 name="kill-$1-$2" d pids=() r
  d=$(mktemp -d)
  for r in 0 1 2 3; do
    local host=host0
    [ "$layout" = 2x2 ] && host=host$((r / 2))
    env RAILCC_HOSTID=$host NCCL_HOSTID=$host timeout -k 5 180 "$work/recover" kill $r 4 "$d" "$mode" \
      > "$d/rank$r.log" 2>&1 &
    pids[$r]=$!
  done
  # Every rank running (3 checked all_reduces each), 90 s at most.
  local i
  for i in $(seq 900); do
    [ "$(cat "$d"/rank?.log | grep -c ": running$")" = 4 ] && break
    sleep 0.1
  done
  local killed_at
  killed_at=$(date +%s.%N)
  # pids[3] is timeout's; the rank is its child (SIGKILL to timeout would leave it running).
  pkill -9 -P "${pids[3]}"
  kill -9 "${pids[3]}" 2>/dev/null
  for r in 0 1 2; do wait "${pids[$r]}"; done
  wait "${pids[3]}" 2>/dev/null
  cat "$d"/rank?.log > "$OUT/recover-$name.log"
  local why="" late r_log t
  for r in 0 1 2; do
    r_log="$d/rank$r.log"
    t=$(sed -n "s/^recover: rank $r: failed at \([0-9.]*\) .*/\1/p" "$r_log" | head -n 1)
    if [ -z "$t" ]; then why="$why; rank $r never saw the failure"; continue; fi
    late=$(python3 -c "print(f'{$t - $killed_at:.3f}')")
    grep -q "^recover: rank $r: failed at .*rank 3" "$r_log" || why="$why; rank $r's error does not name rank 3"
    python3 -c "import sys; sys.exit(0 if $late < 1.0 else 1)" || why="$why; rank $r saw it after $late s"
    grep -q "^recover: rank $r: recovered by $mode: 100 all_reduce ok, matmul ok, tensors unchanged" "$r_log" \
      || why="$why; rank $r: $(grep -m1 "FAIL" "$r_log" || echo "no recovery line")"
    echo "      rank $r: failure seen $late s after the kill; $(grep -m1 -o 'recovered by .*' "$r_log")"
  done
  if [ -z "$why" ]; then pass "recover $name: 3 survivors failed within 1 s naming rank 3 and recovered"
  else fail "recover $name:${why#;}"; fi
  rm -rf "$d"
}

# abort_case N [push]: rank 0 aborts while its kernel waits for ranks 1..N-1, whose kernels
# start 10 s later and must then finish (within 5 s of their hold) with rank 0 still alive;
# "push": every all_reduce on the push kernel (its per-tile flags; 4 GPUs or more).
abort_case() {
  local n=$1 how=${2:-} d r name=abort pids=()
  [ -n "$how" ] && name="abort-$how-$n"
  d=$(mktemp -d)
  local env=()
  [ "$how" = push ] && env=(RAILCC_GPU_AR_PUSH_BYTES=1)
  for r in $(seq 1 $((n - 1))); do
    env "${env[@]}" timeout -k 5 60 "$work/recover" abort $r $n "$d" > "$d/rank$r.log" 2>&1 &
    pids+=($!)
  done
  env "${env[@]}" timeout -k 5 60 "$work/recover" abort 0 $n "$d" > "$d/rank0.log" 2>&1
  for r in "${pids[@]}"; do wait "$r"; done
  cat "$d"/rank?.log > "$OUT/recover-$name.log"
  local line a s why="" t
  line=$(grep -m1 "^recover: rank 0: abort returned" "$d/rank0.log")
  a=$(sed -n 's/.*abort returned after \([0-9.]*\) s.*/\1/p' <<< "$line")
  s=$(sed -n 's/.*stream done after \([0-9.]*\) s.*/\1/p' <<< "$line")
  if [ -z "$a" ] || [ -z "$s" ] || ! python3 -c "import sys; sys.exit(0 if $a < 1.0 and $s < 1.0 else 1)"; then
    why="; ${line:-$(grep -m1 FAIL "$d/rank0.log" || echo 'no verdict line on rank 0')}"
  fi
  for r in $(seq 1 $((n - 1))); do
    t=$(sed -n "s/^recover: rank $r: stream done \([0-9.]*\) s after its hold.*/\1/p" "$d/rank$r.log")
    if [ -z "$t" ]; then why="$why; rank $r: $(grep -m1 FAIL "$d/rank$r.log" || echo 'its stream never finished (60 s)')"
    elif ! python3 -c "import sys; sys.exit(0 if $t < 5.0 else 1)"; then why="$why; rank $r's stream finished $t s after its hold"
    fi
  done
  if [ -z "$why" ]; then
    pass "recover $name: ncclCommAbort from another thread returned after $a s, the waiting stream finished after $s s, a matrix product ran; $((n - 1)) late peers finished their part"
  else
    fail "recover $name:${why#;}"
  fi
  rm -rf "$d"
}

NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
for c in ${RECOVER_CASES:-kill:host:shrink kill:host:reinit kill:2x2:shrink kill:2x2:reinit abort abort:4:push}; do
  IFS=: read -r what a b <<< "$c"
  case $what in
    kill) kill_case "$a" "$b" ;;
    abort)
      if [ "$b" = push ] && [ "$NGPU" -lt 4 ]; then
        echo "SKIP  recover abort-push: $NGPU GPUs, the push kernel runs on 4 or more (nothing counted)"
      else
        abort_case "${a:-2}" "$b"
      fi ;;
  esac
done
rm -rf "$work"
[ "$FAILS" = 0 ]
