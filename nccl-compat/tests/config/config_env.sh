#!/usr/bin/env bash
# On a GPU machine with 2 or more GPUs: libnccl honours RAILCC_TIMEOUT_MS and
# RAILCC_CACHE_DIR=off in both ways of running (one process driving the GPUs, one process per
# GPU under mpirun), issue 28. Prepare with bench/compare/gpu-prepare.sh; carry .device.
#   timeout  RAILCC_TIMEOUT_MS=2000 and a peer 8 s late: the call fails within 6 s (a build that
#            kept its own 30 s deadline completes after 8 s instead); the kernel that waited
#            stops and the communicator's asynchronous error says so (no __trap);
#   late     RAILCC_TIMEOUT_MS unset and a peer LATE_S (default 70) s late, both ways of
#            running at once: each call completes, checked (libnccl waits as NCCL: no deadline,
#            issue 29; an older build failed at its 60 s default);
#            timeout and late also under mpirun with a 4 KiB call (CONFIG_COUNT=1024: the
#            low-latency kernel, launched without waiting on the host; its timeout comes back
#            as the asynchronous error);
#   cache    RAILCC_CACHE_DIR=off: a checked all_reduce runs and no kernel cache appears (not
#            under $HOME/.cache/railcc, not as a folder named "off"); with the variable unset
#            the same run fills $HOME/.cache/railcc (so the check can see a cache at all);
#   config   ncclCommInitRankConfig with maxCTAs 8 and commName "ctas-test", both ways of
#            running: a checked 256 MB all_reduce, and NCCL_DEBUG=INFO (written where
#            NCCL_DEBUG_FILE says) names the communicator and "up to 8 blocks per GPU".
# One PASS/FAIL line per check; exit 1 if any failed. LIB=dir picks another libnccl.so.2.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source bench/compare/gpu-env.sh
work=$(mktemp -d)
cp "${LIB:-.device/lib}/libnccl.so.2" "$work/" && ln -s libnccl.so.2 "$work/libnccl.so"
mpicc -I nccl-compat/include -I /usr/local/cuda/include nccl-compat/tests/config/config_env.c \
  -L "$work" -lnccl -L /usr/local/cuda/lib64 -lcudart -o "$work/config_env" || { echo "FAIL config_env: build"; exit 1; }
export LD_LIBRARY_PATH="$work:/usr/local/cuda/lib64"
MPI="mpirun -np 2 --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x RAILCC_CACHE_DIR -x RAILCC_TIMEOUT_MS -x HOME -x CONFIG_COUNT"
export CONFIG_COUNT=1048576
FAILS=0
pass() { echo "PASS  $1"; }
fail() { echo "FAIL  $1"; FAILS=$((FAILS + 1)); }

# judge_timeout LABEL LOG: the call must have failed, within 6 s.
judge_timeout() {
  local line secs
  line=$(grep -m1 "^config_env: .* timeout: " "$2")
  echo "      $line"
  secs=$(sed -n 's/.*failed after \([0-9.]*\) s.*/\1/p' <<< "$line")
  if [ -n "$secs" ] && awk -v s="$secs" 'BEGIN { exit !(s < 6) }'; then
    pass "$1: failed after $secs s"
  else
    fail "$1: ${line:-no verdict line} (wanted a failure within 6 s)"
  fi
}

# Cached kernels from earlier runs would hide nothing here (the deadline is a launch
# argument), but use a fresh folder anyway.
export RAILCC_CACHE_DIR="$work/cache" RAILCC_TIMEOUT_MS=2000
( cd "$work" && timeout 60 ./config_env inproc timeout 8 ) > "$work/inproc-timeout.log" 2>&1
judge_timeout "timeout: one process driving 2 GPUs, RAILCC_TIMEOUT_MS=2000, a peer 8 s late" "$work/inproc-timeout.log"
( cd "$work" && timeout 60 $MPI ./config_env mpi timeout 8 ) > "$work/mpi-timeout.log" 2>&1
judge_timeout "timeout: one process per GPU (mpirun -np 2), RAILCC_TIMEOUT_MS=2000, a peer 8 s late" "$work/mpi-timeout.log"
( cd "$work" && CONFIG_COUNT=1024 timeout 60 $MPI ./config_env mpi timeout 8 ) > "$work/mpi-timeout-small.log" 2>&1
judge_timeout "timeout: one process per GPU (mpirun -np 2), a 4 KiB call (no wait on the host), RAILCC_TIMEOUT_MS=2000, a peer 8 s late" "$work/mpi-timeout-small.log"

# No deadline by default: both ways of running at once, to spend the wait once.
unset RAILCC_TIMEOUT_MS
LATE_S=${LATE_S:-70}
( cd "$work" && timeout $((LATE_S + 90)) ./config_env inproc late "$LATE_S" ) > "$work/inproc-late.log" 2>&1 &
( cd "$work" && CONFIG_COUNT=1024 timeout $((LATE_S + 90)) ${MPI/-x RAILCC_TIMEOUT_MS/} ./config_env mpi late "$LATE_S" ) > "$work/mpi-small-late.log" 2>&1 &
( cd "$work" && timeout $((LATE_S + 90)) ${MPI/-x RAILCC_TIMEOUT_MS/} ./config_env mpi late "$LATE_S" ) > "$work/mpi-late.log" 2>&1
wait
for m in inproc mpi mpi-small; do
  line=$(grep -m1 "^config_env: ${m%-small} late: " "$work/$m-late.log")
  echo "      ${line:-no verdict line}"
  case $line in
    *"completed after "*" s ok") pass "late: $m, no RAILCC_TIMEOUT_MS, a peer $LATE_S s late: ${line#*: late: }" ;;
    *) fail "late: $m, no RAILCC_TIMEOUT_MS, a peer $LATE_S s late: ${line:-no verdict line}" ;;
  esac
done

# cache_run LABEL HOME_DIR: a checked all_reduce both ways, from inside $work/cwd.
cache_run() {
  mkdir -p "$2" "$work/cwd"
  ( cd "$work/cwd" && HOME="$2" timeout 120 "$work/config_env" inproc run ) > "$work/cache-inproc.log" 2>&1
  ( cd "$work/cwd" && HOME="$2" timeout 120 $MPI "$work/config_env" mpi run ) > "$work/cache-mpi.log" 2>&1
  local oks
  oks=$(cat "$work/cache-inproc.log" "$work/cache-mpi.log" | grep -c "completed after .* s ok$")
  [ "$oks" = 3 ] || { cat "$work/cache-inproc.log" "$work/cache-mpi.log"; fail "$1: $oks of 3 ranks' all_reduce ok"; return 1; }
}
unset XDG_CACHE_HOME
export RAILCC_TIMEOUT_MS=30000 RAILCC_CACHE_DIR=off
if cache_run "cache off" "$work/home-off"; then
  found=$(ls -d "$work/home-off/.cache/railcc" "$work/cwd/off" "$work/home-off/off" 2>/dev/null)
  if [ -z "$found" ]; then pass "cache: RAILCC_CACHE_DIR=off, both ways of running: all_reduce ok, no kernel cache written"
  else fail "cache: RAILCC_CACHE_DIR=off wrote a cache: $found"; fi
fi
unset RAILCC_CACHE_DIR
if cache_run "cache default" "$work/home-on"; then
  n=$(find "$work/home-on/.cache/railcc" -type f 2>/dev/null | wc -l)
  if [ "$n" -gt 0 ]; then pass "cache: unset, the default folder \$HOME/.cache/railcc holds $n files"
  else fail "cache: unset, nothing in \$HOME/.cache/railcc (the off check above could not have seen a cache)"; fi
fi
# ncclConfig_t: maxCTAs bounds the communicator's blocks, commName names it in the log lines,
# which NCCL_DEBUG_FILE sends to a file per process (%p).
export RAILCC_CACHE_DIR="$work/cache" NCCL_DEBUG=INFO NCCL_DEBUG_FILE="$work/debug.%h.%p"
( cd "$work" && timeout 120 ./config_env inproc ctas ) > "$work/ctas-inproc.log" 2>&1
( cd "$work" && timeout 120 $MPI -x NCCL_DEBUG -x NCCL_DEBUG_FILE ./config_env mpi ctas ) > "$work/ctas-mpi.log" 2>&1
unset NCCL_DEBUG NCCL_DEBUG_FILE
oks=$(cat "$work/ctas-inproc.log" "$work/ctas-mpi.log" | grep -c "completed after .* s ok$")
infos=$(cat "$work"/debug.* 2>/dev/null | grep -c "NCCL INFO \[ctas-test\] .*up to 8 blocks per GPU")
cat "$work"/debug.* 2>/dev/null | grep "NCCL INFO" | sed 's/^/      /' | head -6
if [ "$oks" = 3 ] && [ "$infos" = 4 ]; then
  pass "config: maxCTAs 8 and commName, both ways of running: 3 of 3 all_reduce ok, 4 of 4 ranks' INFO lines (in NCCL_DEBUG_FILE) name ctas-test and up to 8 blocks per GPU"
else
  cat "$work/ctas-inproc.log" "$work/ctas-mpi.log"
  fail "config: maxCTAs 8 and commName: $oks of 3 all_reduce ok, $infos of 4 INFO lines in NCCL_DEBUG_FILE name ctas-test with up to 8 blocks per GPU"
fi
rm -rf "$work"
[ $FAILS = 0 ]
