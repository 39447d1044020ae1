#!/usr/bin/env bash
# On the device machine (nvidia-h200-x2): GPUs across emulated hosts (issue 17). Each process
# gets its own RAILCC_HOSTID/NCCL_HOSTID, so railcc and NCCL both treat the two GPUs as two
# machines and move data over TCP on loopback. Prepare with bench/compare/gpu-prepare.sh;
# carry .device. Parts (GPU_NET_PARTS, default all): bench (railcc bench --gpu-net: every
# collective, dtype and op, in and out of place, -G), nccl (nccl-tests on railcc's libnccl
# under mpirun -np 2 on two emulated hosts: every binary, -d all, -o all, -G 10), perf
# (all_reduce 8 B-128 MB: railcc's libnccl, NCCL defaults, NCCL with 4 threads x 4 sockets,
# same mpirun, same hosts), kill (a rank killed in a 256 MB all_reduce: the survivors' time; also
# 2 hosts x 2 ranks, hierarchical), hier (railcc bench --per-process --ranks 4 --hosts 2: the
# hierarchy, every collective checked).
# Logs under $OUT: gpu-net-*.log. A failed check prints FAIL and the script exits 1.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
source bench/compare/tables.sh
# On a machine of one GPU (nvidia-h200, nvidia-h100-x1) every rank shares GPU 0: the emulated
# hosts still move their data over TCP, NCCL's too (different NCCL_HOSTID, so no duplicate-GPU
# refusal). Figures from such a run are labelled "1 GPU" in the logs.
net_env gpu-net.sh
PARTS=${GPU_NET_PARTS:-bench nccl perf kill}
# nccl-tests binaries of the nccl and x2 parts (GPU_NET_BINS picks some).
BINS=${GPU_NET_BINS:-all_reduce all_gather reduce_scatter broadcast reduce sendrecv alltoall alltoallv scatter gather hypercube}
# trace: where a call's time goes (RAILCC_GPU_NET_TRACE); x2: the 4-rank 2 x 2 layout.
FAILS=0
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
# check LABEL CMD...: runs CMD, logs it, judges its tables.
check() {
  local label=$1; shift
  local f=/tmp/gpu-net-check.log rc
  timeout 300 "$@" > $f 2>&1; rc=$?
  { echo "== $label"; cat $f; echo "== exit $rc"; } >> "$LOG"
  local why; why=$(table_problem $f)
  if [ $rc = 0 ] && [ -z "$why" ]; then echo "PASS  $label"; else fail "$label (exit $rc${why:+, $why})"; tail -5 $f; fi
}
AS_HOST=$PWD/bench/compare/as-host.sh

case " $PARTS " in *" bench "*)
  LOG=$OUT/gpu-net-bench.log; : > $LOG
  for c in all_reduce all_gather reduce_scatter broadcast reduce sendrecv alltoall; do
    check "bench $c --gpu-net: every dtype/op, 8 B-16 MB, --offset 8" \
      $R bench $c --device cuda --per-process --gpu-net --ranks 2 -b 8 -e 16M -f 16 -d all -o all -n 1 -w 0 -r 1 --offset 8
    check "bench $c --gpu-net -G 3: 8 B-64 MB, float and bfloat16" \
      $R bench $c --device cuda --per-process --gpu-net --ranks 2 -b 8 -e 64M -f 32 -d float,bfloat16 -n 3 -w 1 -G 3
  done
  check "bench all_reduce --gpu-net --fill random: 8 B-256 MB, half and bfloat16" \
    $R bench all_reduce --device cuda --per-process --gpu-net --ranks 2 -b 8 -e 256M -f 8 -d half,bfloat16 -o sum,avg -n 3 -w 1 --fill random
  grep -E "^# railcc|returned after" $LOG | grep -E "railcc|134217728 B|268435456 B|  8 B" | head -12
;; esac

NCCL_HOME=$(python3 -c "import nvidia.nccl,os;print(nvidia.nccl.__path__[0])")
[ -e "$NCCL_HOME/lib/libnccl.so" ] || ln -sf "$NCCL_HOME/lib/libnccl.so.2" "$NCCL_HOME/lib/libnccl.so"
NTM=/tmp/nccl-tests-mpi
MPIRUN="mpirun -np 2 --bind-to none --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x NCCL_SOCKET_IFNAME -x RAILCC_SOCKET_IFNAME -x RAILCC_CACHE_DIR -x RAILCC_TIMEOUT_MS -x NCCL_DEBUG -x NCCL_SOCKET_NTHREADS -x NCCL_NSOCKS_PERTHREAD -x AS_HOST_GPUS"
OURS="$PWD/.device/lib:/usr/local/cuda/lib64"
case " $PARTS " in *" nccl "*|*" perf "*|*" x2 "*)
  if [ ! -x $NTM/build/all_reduce_perf ]; then
    inc=$(mpicc --showme:incdirs 2>/dev/null | awk '{print $1}')
    cp -r .device/nccl-tests $NTM
    make -C $NTM -j16 MPI=1 MPI_HOME="$(dirname "${inc:-/usr/include}")" CUDA_HOME=/usr/local/cuda NCCL_HOME="$NCCL_HOME" \
      NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" src.build > /tmp/nccl-build-mpi.log 2>&1 || { fail "nccl-tests MPI build"; tail /tmp/nccl-build-mpi.log; }
  fi
;; esac

case " $PARTS " in *" nccl "*)
  LOG=$OUT/gpu-net-nccl.log; : > $LOG
  for b in $BINS; do
    ops=""; case $b in all_reduce|reduce_scatter|reduce) ops="-o all" ;; esac
    F="-b 8 -e 8M -f 8 -n 2 -w 1 -c 1 -d all $ops"
    check "libnccl $b mpirun -np 2, 2 emulated hosts, $F" env LD_LIBRARY_PATH="$OURS" $MPIRUN $AS_HOST $NTM/build/${b}_perf $F -g 1
    F="-b 8 -e 32M -f 64 -n 2 -w 1 -c 1 -d all $ops"
    check "libnccl $b mpirun -np 2, 2 emulated hosts, -G 10 $F" env LD_LIBRARY_PATH="$OURS" $MPIRUN $AS_HOST $NTM/build/${b}_perf $F -g 1 -G 10
  done
  env LD_LIBRARY_PATH="$OURS" NCCL_DEBUG=INFO $MPIRUN $AS_HOST $NTM/build/all_reduce_perf -b 8 -e 8 -n 1 -w 0 -g 1 2>&1 | grep -m2 "railcc libnccl"
;; esac

case " $PARTS " in *" perf "*)
  LOG=$OUT/gpu-net-perf.log; : > $LOG
  P="-b 8 -e 128M -f 4 -n 20 -w 5 -c 0 -g 1"
  for rep in 1 2; do
    echo "== rep $rep: railcc libnccl" >> $LOG
    timeout 120 env LD_LIBRARY_PATH="$OURS" $MPIRUN $AS_HOST $NTM/build/all_reduce_perf $P >> $LOG 2>&1
    echo "== rep $rep: NCCL defaults" >> $LOG
    timeout 120 env LD_LIBRARY_PATH="$NCCL_HOME/lib:/usr/local/cuda/lib64" NCCL_DEBUG=INFO $MPIRUN $AS_HOST $NTM/build/all_reduce_perf $P >> $LOG 2>&1
    echo "== rep $rep: NCCL NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4" >> $LOG
    timeout 120 env LD_LIBRARY_PATH="$NCCL_HOME/lib:/usr/local/cuda/lib64" NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4 $MPIRUN $AS_HOST $NTM/build/all_reduce_perf $P >> $LOG 2>&1
  done
  grep -E "^== |nNodes|via NET|^ +(8|2048|131072|8388608|33554432|134217728) " $LOG | grep -v "INFO Channel" | head -80
;; esac

case " $PARTS " in *" x2 "*)
  # 4 ranks, 2 emulated hosts of 2 GPUs each, each GPU holding one rank of each host.
  LOG=$OUT/gpu-net-x2.log; : > $LOG
  MPI4="${MPIRUN/-np 2/-np 4} -x AS_HOST_PER"
  for b in $BINS; do
    ops=""; case $b in all_reduce|reduce_scatter|reduce) ops="-o all" ;; esac
    F="-b 8 -e 8M -f 64 -n 2 -w 1 -c 1 -d float,bfloat16,int8,double $ops"
    check "libnccl $b 2 hosts x 2 GPUs (4 ranks), $F" env AS_HOST_PER=2 LD_LIBRARY_PATH="$OURS" $MPI4 $AS_HOST $NTM/build/${b}_perf $F -g 1
  done
  check "libnccl all_reduce 2 hosts x 2 GPUs, -G 10, 8 B-32 MB" env AS_HOST_PER=2 LD_LIBRARY_PATH="$OURS" $MPI4 $AS_HOST $NTM/build/all_reduce_perf -b 8 -e 32M -f 8 -n 2 -w 1 -c 1 -g 1 -G 10
  # Every rank must have taken the hierarchical path (NVLink inside a host, the network between).
  env AS_HOST_PER=2 LD_LIBRARY_PATH="$OURS" NCCL_DEBUG=INFO $MPI4 $AS_HOST $NTM/build/all_reduce_perf -b 8 -e 8 -n 1 -w 0 -g 1 > /tmp/x2-path.log 2>&1
  grep "railcc libnccl" /tmp/x2-path.log | tee -a $LOG
  hier=$(grep "railcc libnccl" /tmp/x2-path.log | grep -c "hierarchical: 2 hosts x 2 GPUs")
  if [ "$hier" = 4 ]; then echo "PASS  x2 path: 4 of 4 ranks hierarchical"; else fail "x2 path: $hier of 4 ranks say hierarchical"; fi
  # The same layout, hierarchical against every call on the network (RAILCC_GPU_PATH=net) and
  # NCCL (4 ranks, 2 NCCL_HOSTIDs). On one GPU the four processes time-slice it: no speed claim.
  P="-b 8 -e 128M -f 8 -n 10 -w 3 -c 0 -g 1"
  for path in auto net; do
    echo "== railcc libnccl 2 x 2, RAILCC_GPU_PATH=$path" >> $LOG
    timeout 200 env AS_HOST_PER=2 RAILCC_GPU_PATH=$path LD_LIBRARY_PATH="$OURS" ${MPI4} -x RAILCC_GPU_PATH $AS_HOST $NTM/build/all_reduce_perf $P >> $LOG 2>&1
  done
  echo "== NCCL 2 x 2 defaults" >> $LOG
  timeout 200 env AS_HOST_PER=2 LD_LIBRARY_PATH="$NCCL_HOME/lib:/usr/local/cuda/lib64" NCCL_DEBUG=INFO $MPI4 $AS_HOST $NTM/build/all_reduce_perf $P >> $LOG 2>&1
  grep -E "^== |nNodes [0-9]|^ +(8|131072|8388608|134217728) " $LOG | grep -v "INFO Channel" | head -40
;; esac

case " $PARTS " in *" trace "*)
  LOG=$OUT/gpu-net-trace.log; : > $LOG
  for sz in 8 128M; do
    echo "== $sz" >> $LOG
    RAILCC_GPU_NET_TRACE=1 timeout 120 $R bench all_reduce --device cuda --per-process --gpu-net --ranks 2 -b $sz -e $sz -n 200 -w 20 -c 1 >> $LOG 2>&1
  done
  grep -E "^== |gpu net trace|returned after|^ +(8|134217728) " $LOG
;; esac

case " $PARTS " in *" kill "*)
  LOG=$OUT/gpu-net-kill.log; : > $LOG
  # CASE: label | bench flags | ranks | the rank killed. The 2 x 2 case kills rank 3 (host 1,
  # local index 1): its host mate sees its process go, its network peer (rank 1) the
  # connections close, and rank 0 hears of it through both.
  for kcase in "network|--gpu-net|2|1" "CUDA IPC||2|1" "2 x 2 hierarchical|--hosts 2|4|3"; do
    IFS='|' read -r label path nr victim_rank <<< "$kcase"
    RAILCC_TIMEOUT_MS=10000 timeout 120 $R bench all_reduce --device cuda --per-process $path --ranks $nr -b 256M -e 256M -n 100000 -w 1 -c 0 > /tmp/kill.out 2>&1 &
    bpid=$!
    # Kill only once the calls run: the table's header is out (a cold machine spends seconds
    # compiling kernels first), then 3 s into the 256 MB all_reduces. At most 90 s.
    for _ in $(seq 180); do grep -q "^#  GPU" /tmp/kill.out 2>/dev/null && break; sleep 0.5; done
    sleep 3
    victim=$(pgrep -f "railcc bench" | while read p; do tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx RAILCC_RANK=$victim_rank && echo $p; done | head -1)
    [ -n "$victim" ] || { fail "kill $label: no rank $victim_rank process"; kill $bpid; wait $bpid; continue; }
    t0=$(date +%s%N); kill -9 $victim
    wait $bpid; rc=$?; t1=$(date +%s%N)
    ms=$(( (t1 - t0) / 1000000 ))
    { echo "== kill $label: rank $victim_rank killed at $t0 ns, job exit $rc after $ms ms"; cat /tmp/kill.out; } >> $LOG
    # Each survivor logs when it stops ("rank N stops: <its error>", timestamped): how many
    # named the dead rank, and the latest of their times after the kill (ms).
    stops=$(sed 's/\x1b\[[0-9;]*m//g' /tmp/kill.out | T0=$t0 V=$victim_rank python3 -c '
import sys, os, re, datetime
t0, v, named, worst = int(os.environ["T0"]) / 1e9, os.environ["V"], 0, 0.0
for l in sys.stdin:
    m = re.match(r"(\S+Z) +ERROR .*rank (\d+) stops: (.*)", l)
    if not m or m.group(2) == v:
        continue
    t = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
    worst = max(worst, (t - t0) * 1e3)
    named += bool(re.search(r"\b(rank|peer) %s\b" % v, m.group(3)))
print(named, int(worst))')
    read -r named worst <<< "$stops"
    survivors=$((nr - 1))
    echo "kill $label: exit $rc, job gone ${ms} ms after the kill; $named of $survivors survivors named rank $victim_rank, the last stopped ${worst} ms after the kill"
    # Every survivor must fail on its own, naming the dead rank, within a second.
    if [ $rc != 0 ] && [ "$named" = "$survivors" ] && [ "$worst" -lt 1000 ]; then
      echo "PASS  kill $label: $named survivors failed naming rank $victim_rank, the last after $worst ms"
    else
      fail "kill $label: exit $rc; $named of $survivors survivors named rank $victim_rank, the last after $worst ms (want all within 1000 ms)"
    fi
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader | tr '\n' ' '; echo
  done
  check "GPUs usable after the kills: bench all_reduce both paths" \
    bash -c "$R bench all_reduce --device cuda --per-process --ranks 2 -b 8 -e 16M -f 16 -n 2 -w 1 && $R bench all_reduce --device cuda --per-process --gpu-net --ranks 2 -b 8 -e 16M -f 16 -n 2 -w 1"
;; esac

case " $PARTS " in *" hier "*)
  # railcc bench's per-process path on 2 emulated hosts x 2 ranks: every collective through
  # GpuComm's hierarchy, each result checked, in and out of place, -G.
  LOG=$OUT/gpu-net-hier.log; : > $LOG
  for c in all_reduce all_gather reduce_scatter broadcast reduce alltoall; do
    check "bench $c --per-process --ranks 4 --hosts 2: every dtype/op, 8 B-16 MB, --offset 8" \
      $R bench $c --device cuda --per-process --ranks 4 --hosts 2 -b 8 -e 16M -f 64 -d all -o all -n 1 -w 0 -r 1 --offset 8
  done
  check "bench all_reduce --hosts 2 -G 3" $R bench all_reduce --device cuda --per-process --ranks 4 --hosts 2 -b 8 -e 64M -f 32 -d float,bfloat16 -n 3 -w 1 -G 3
  grep -m2 "^# railcc" $LOG
;; esac

echo "gpu-net.sh: $FAILS failed"
[ $FAILS = 0 ]
