#!/usr/bin/env bash
# The short form of bench/compare/gpu-net.sh for one device call (nvidia-h200-x2): GPUs on
# two emulated hosts (NCCL_HOSTID/RAILCC_HOSTID per process, TCP over lo), railcc and NCCL in
# the same call. Every command is bounded; a failure prints FAIL. Logs: $OUT/gpu-net-smoke.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
source bench/compare/tables.sh
export RAILCC_TIMEOUT_MS=20000 NCCL_SOCKET_IFNAME=lo RAILCC_SOCKET_IFNAME=lo
LOG=$OUT/gpu-net-smoke.log; : > $LOG
FAILS=0
say() { echo "$*" | tee -a $LOG; }
RC=0
# run SECONDS CMD...: runs it bounded; its output in /tmp/last.log and the log.
run() { local t=$1; shift; timeout $t "$@" > /tmp/last.log 2>&1; RC=$?; { echo "== $*"; cat /tmp/last.log; echo "== exit $RC"; } >> $LOG; }
# verdict LABEL: the last run exited 0 and its tables pass (tables.sh).
verdict() {
  local why; why=$(table_problem /tmp/last.log)
  if [ "$RC" = 0 ] && [ -z "$why" ]; then say "PASS  $1"
  else say "FAIL  $1 (exit $RC${why:+, $why})"; tail -3 /tmp/last.log; FAILS=$((FAILS+1)); fi
}
AS_HOST=$PWD/bench/compare/as-host.sh
NCCL_HOME=$(python3 -c "import nvidia.nccl,os;print(nvidia.nccl.__path__[0])")
[ -e "$NCCL_HOME/lib/libnccl.so" ] || ln -sf "$NCCL_HOME/lib/libnccl.so.2" "$NCCL_HOME/lib/libnccl.so"
NTM=/tmp/nccl-tests-mpi
inc=$(mpicc --showme:incdirs 2>/dev/null | awk '{print $1}')
[ -d $NTM ] || cp -r .device/nccl-tests $NTM
( make -C $NTM -j32 MPI=1 MPI_HOME="$(dirname "${inc:-/usr/include}")" CUDA_HOME=/usr/local/cuda NCCL_HOME="$NCCL_HOME" \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" src.build > /tmp/nccl-build-mpi.log 2>&1 ) &
build=$!
run 45 $R bench all_reduce --device cuda --per-process --gpu-net --ranks 2 -b 8 -e 128M -f 8 -n 5 -w 1
verdict "bench all_reduce --gpu-net 8 B-128 MB"
grep -E "returned after" /tmp/last.log | grep -E "  (8|134217728) B"
run 45 $R bench all_reduce --device cuda --per-process --gpu-net --ranks 2 -b 8 -e 64M -f 32 -d float,bfloat16 -n 3 -w 1 -G 3
verdict "bench all_reduce --gpu-net -G 3, float and bfloat16, 8 B-64 MB"
run 45 $R bench alltoall --device cuda --per-process --gpu-net --ranks 2 -b 8 -e 16M -f 64 -n 2 -w 1 -d float,int8
verdict "bench alltoall --gpu-net 8 B-16 MB"
wait $build || say "FAIL  nccl-tests MPI build"
MPIRUN="mpirun -np 2 --bind-to none --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_SOCKET_IFNAME -x RAILCC_SOCKET_IFNAME -x RAILCC_TIMEOUT_MS -x NCCL_DEBUG -x NCCL_SOCKET_NTHREADS -x NCCL_NSOCKS_PERTHREAD"
OURS="$PWD/.device/lib:/usr/local/cuda/lib64"
THEIRS="$NCCL_HOME/lib:/usr/local/cuda/lib64"
for b in sendrecv alltoall all_gather; do
  run 45 env LD_LIBRARY_PATH=$OURS $MPIRUN $AS_HOST $NTM/build/${b}_perf -b 8 -e 8M -f 8 -d float -n 2 -w 1 -c 1 -g 1
  verdict "libnccl $b, 2 emulated hosts, mpirun --bind-to none, 8 B-8 MB"
done
run 45 env LD_LIBRARY_PATH=$OURS $MPIRUN $AS_HOST $NTM/build/all_reduce_perf -b 8 -e 8M -f 8 -d float -n 2 -w 1 -c 1 -g 1 -G 10
verdict "libnccl all_reduce -G 10, 2 emulated hosts, 8 B-8 MB"
P="-b 8 -e 128M -f 16 -n 10 -w 3 -c 1 -g 1"
for who in railcc nccl nccl44; do
  case $who in
    railcc) run 60 env LD_LIBRARY_PATH=$OURS $MPIRUN $AS_HOST $NTM/build/all_reduce_perf $P ;;
    nccl) run 60 env LD_LIBRARY_PATH=$THEIRS NCCL_DEBUG=INFO $MPIRUN $AS_HOST $NTM/build/all_reduce_perf $P ;;
    nccl44) run 60 env LD_LIBRARY_PATH=$THEIRS NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4 $MPIRUN $AS_HOST $NTM/build/all_reduce_perf $P ;;
  esac
  verdict "all_reduce perf: $who, 2 emulated hosts, 8 B-128 MB"
done
# A rank killed during 64 MB all_reduces through libnccl: how long the survivor takes to exit.
env LD_LIBRARY_PATH=$OURS timeout 60 $MPIRUN $AS_HOST $NTM/build/all_reduce_perf -b 64M -e 64M -n 100000 -w 1 -c 0 -g 1 > /tmp/kill.out 2>&1 &
sleep 6
victim=$(for p in $(pgrep -f all_reduce_perf); do tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1 && echo $p; done | head -1)
t0=$(date +%s%N); kill -9 $victim
# The survivor: rank 0's process.
surv=$(for p in $(pgrep -f all_reduce_perf); do tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=0 && echo $p; done | head -1)
while [ -n "$surv" ] && kill -0 $surv 2>/dev/null; do sleep 0.01; done
t1=$(date +%s%N)
wait
{ echo "== kill: rank 1 ($victim) killed; rank 0 ($surv) gone $(( (t1 - t0) / 1000000 )) ms later"; cat /tmp/kill.out; } >> $LOG
say "kill: rank 0 gone $(( (t1 - t0) / 1000000 )) ms after rank 1 was killed: $(grep -m1 -iE 'failure|error' /tmp/kill.out | cut -c1-200)"
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader | tr '\n' ' ' | tee -a $LOG; echo
grep -E "^== (env|\.device)|nNodes|^ +(8|131072|2097152|33554432|134217728) +[0-9]+ +float|returned to the caller after" $LOG | grep -v "INFO Channel" | cut -c1-150 | head -70
echo "gpu-net-smoke: $FAILS failed"
