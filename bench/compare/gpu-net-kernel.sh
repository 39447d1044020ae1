#!/usr/bin/env bash
# On nvidia-h200-x2 (after bench/compare/gpu-prepare.sh here; carry .device): the network
# engine's staging kernel (RAILCC_GPU_NET_KERNEL=1 and a 28 MiB staging budget, the defaults
# since issue 31) on 2 emulated hosts x 1 GPU (each process its own RAILCC_HOSTID/NCCL_HOSTID,
# TCP over loopback). Parts (NK_PARTS, default "check perf ret"):
#   check  railcc bench --gpu-net (K: extra settings, default none): every collective, dtype
#          and op, 8 B-16 MB, --offset 8; -G 3 (graphs); random data to 256 MB; then
#          nccl-tests through libnccl under mpirun with -c 1 (and -G 10). FAIL on a failure.
#   x2     nccl-tests through libnccl on 2 emulated hosts x 2 ranks (the hierarchical path;
#          4 ranks on 2 GPUs, or rank N on GPU N with 4), -c 1, every collective; then the same
#          all_reduce and broadcast with every size split (RAILCC_GPU_HIER_SMALL_BYTES=0), and
#          all_reduce with no size on the flat engine (RAILCC_GPU_FLAT_BELOW_BYTES=0: the
#          hierarchy's own small path, split and whole).
#   perf   nccl-tests all_reduce 8 B-1 GB and alltoall 1 MB and 128 MB under mpirun: railcc's
#          defaults, railcc as before issue 31's kernel (stream copies, no budget); NCCL with defaults and with 4 threads x 4 sockets. Same call.
#   ret    railcc bench all_reduce 8 B-1 GB: how long a call takes to return on an idle
#          stream, the defaults against the stream copies (checked results).
#   quick  a shorter check: bench all_reduce and alltoall 8 B-16 MB (--offset 8), all_reduce
#          -G 3, nccl-tests all_reduce 8 B-1 GB -c 1 under mpirun.
#   trace  where an idle call's return time goes (RAILCC_GPU_NET_TRACE=1: enqueue and its
#          kernel/stream part), 8 B and 128 MB, the defaults and with no staging budget.
#   big    nccl-tests all_reduce 128 MB-1 GB: railcc's defaults, NCCL with 4 x 4 sockets.
#   ring   all_reduce 1 MB-1 GB with other rings under a budget of at most 48 MiB (16 x 2
#          slots of 1 MiB, 12 x 2 of 2 MiB, 8 x 2 of 2 MiB: the default) and with 8 staging
#          blocks (one a ring slot: at 2-4 MB each block stages two 256-512 KiB pieces one
#          after the other), against NCCL 4 x 4 (issue 31's 1.2x at 1 GB was not met at the
#          default, 1.14-1.17x; 2-4 MB read 0.55-0.72x).
#   x2perf (4 GPUs: nvidia-h200-x4) 2 emulated hosts x 2 GPUs, rank N on GPU N: nccl-tests
#          all_reduce 8 B-1 GB and alltoall 1 MB and 128 MB, railcc's defaults (the
#          hierarchy; all_reduce also with every size split, RAILCC_GPU_HIER_SMALL_BYTES=0), NCCL defaults, NCCL 4 x 4 sockets; then railcc's pinned memory as
#          libnccl reports it at ncclCommDestroy (NCCL_DEBUG=INFO).
#   flat   (4 GPUs) 2 x 2 all_reduce 8 B-64 KB: railcc's hierarchy against small calls on the
#          flat engine (RAILCC_GPU_FLAT_BELOW_BYTES), NCCL defaults and 4 x 4 sockets.
#   numa   (4 GPUs) 2 x 2 all_reduce 16 MB-1 GB: railcc twice, and each rank bound to its
#          GPU's nearest CPUs (AS_HOST_BIND=1), against NCCL 4 x 4 (which binds its own
#          threads) free and bound: the run-to-run spread and what placement is worth.
#   spread (4 GPUs) send/recv groups across hosts with each message spread over the channels
#          from 32 or 16 KiB a channel (RAILCC_GPU_NET_P2P_SPREAD_BYTES; default 64 KiB, so a
#          message under 512 KiB goes whole to one channel): 2 x 2 alltoall and sendrecv
#          256 KB-16 MB, 2 x 1 sendrecv 64 KB-4 MB, against NCCL 4 x 4.
#   bigx2  (4 GPUs) 2 x 2 all_reduce 128 MB-1 GB: the default, a ring of 16 (slots of 0.875
#          MiB), 8 staging blocks, 4 channels (fewer host threads), NCCL 4 x 4, then railcc and NCCL again (railcc's large
#          sizes varied 0.6-1.5x NCCL's from run to run).
#   prof   (4 GPUs) 2 x 2 all_reduce 1 GB, 150 calls: per-thread CPU use (thread-cpu.py, 4 s
#          sampled mid-run) for railcc, railcc with RAILCC_SPIN_US=0, and NCCL 4 x 4; busbw
#          of each run beside it (is the host's CPU work what makes railcc's large sizes vary?).
#   blocks (4 GPUs) staging blocks: 2 x 2 all_reduce 128 MB-1 GB and 8 B-1 MB, then 2 x 1 128 MB-1 GB,
#          the default (4 blocks, ring of 8), 8 blocks (one a slot), a ring of 16 with 16
#          blocks, against NCCL 4 x 4, each twice, alternating (8 blocks read 1.2x the default
#          in one run).
#   diag   (4 GPUs) 2 x 2 all_reduce 1 MB in place with max, 200 calls (torch's step.py small
#          read 1 ms a call where nccl-tests read 0.28), railcc and NCCL 4 x 4. (The device
#          has no nsys: the staging kernel's stamps, part stamps, are its GPU timeline.)
#   stamps where a small call's time goes on the GPU: nccl-tests all_reduce 8 B and 64 KB (-c 1),
#          1000 calls, 2 x 1 (and 2 x 2 with 4 GPUs) with RAILCC_GPU_NET_TRACE=1 (the host's
#          trace and the staging kernel's stamps: copy in, wait for done, back and exit, the gap
#          between launches), then NCCL 4 x 4's time.
#   enq    the caller's time per call (RAILCC_GPU_NET_TRACE=1: enqueue, of which launches, rank
#          0's medians) at 8 B, 128 MB and 1 GB, 2 x 1, for railcc's defaults and each
#          "label|VAR=VALUE ..." of NK_ENQ (';' between; RAILCC_LIB=DIR runs another build).
#   lat    small all_reduce latency (nccl-tests, 8 B-64 KB, 1000 calls a size), 2 x 1 and 2 x 2
#          (4 GPUs): railcc's defaults, each "label|VAR=VALUE ..." of NK_LAT (';' between),
#          NCCL defaults, NCCL 4 x 4.
# NK_ROUNDS=N (default 1) runs every comparison's list N times, interleaved, and prints the
# medians per setting and size with the lowest and highest busbw (rounds.py).
# Logs under $OUT (nk-*.log).
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
source bench/compare/tables.sh
net_env gpu-net-kernel.sh
PARTS=${NK_PARTS:-check perf ret}
FAILS=0
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
LOG=$OUT/nk-check.log
check() {  # LABEL CMD...: runs CMD (at most 120 s), logs it, judges its tables.
  local label=$1; shift
  local f=/tmp/nk-check.log rc why
  timeout 120 "$@" > $f 2>&1; rc=$?
  { echo "== $label"; cat $f; echo "== exit $rc"; } >> "$LOG"
  why=$(table_problem $f)
  if [ $rc = 0 ] && [ -z "$why" ]; then echo "PASS  $label"; else fail "$label (exit $rc${why:+, $why})"; tail -5 $f; fi
}
AS_HOST=$PWD/bench/compare/as-host.sh
# RAILCC_GPU_PATH=net (no hierarchy) and RAILCC_GPU_FLAT_BELOW_BYTES (small all_reduces on the
# flat engine) travel to the ranks.
# (-x of a variable that is not set passes nothing: the library's default holds.)
export RAILCC_GPU_PATH=${RAILCC_GPU_PATH:-auto}
MPIRUN="mpirun -np 2 --bind-to none --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x NCCL_SOCKET_IFNAME -x RAILCC_SOCKET_IFNAME -x RAILCC_CACHE_DIR -x RAILCC_TIMEOUT_MS -x RAILCC_GPU_PATH -x RAILCC_GPU_FLAT_BELOW_BYTES -x RAILCC_GPU_NET_BIG_LAUNCH -x RAILCC_GPU_NET_TABLE -x AS_HOST_GPUS -x AS_HOST_BIND"
OURS="$PWD/.device/lib:/usr/local/cuda/lib64"
K=${K:-RAILCC_GPU_NET_KERNEL=1}

case " $PARTS " in *" check "*)
  : > $LOG
  for c in all_reduce all_gather reduce_scatter broadcast reduce sendrecv alltoall; do
    check "kernel: bench $c --gpu-net, every dtype/op, 8 B-16 MB, --offset 8" \
      env $K $R bench $c --device cuda --per-process --gpu-net --ranks 2 -b 8 -e 16M -f 16 -d all -o all -n 1 -w 0 -r 1 --offset 8
  done
  for c in all_reduce sendrecv alltoall; do
    check "kernel: bench $c --gpu-net -G 3, 8 B-64 MB" \
      env $K $R bench $c --device cuda --per-process --gpu-net --ranks 2 -b 8 -e 64M -f 32 -d float,bfloat16 -n 3 -w 1 -G 3
  done
  check "kernel: bench all_reduce --gpu-net --fill random, 8 B-256 MB" \
    env $K $R bench all_reduce --device cuda --per-process --gpu-net --ranks 2 -b 8 -e 256M -f 8 -d half,bfloat16 -o sum,avg -n 3 -w 1 --fill random
  nccl_tests_build $NTM 1 || fail "nccl-tests MPI build"
  for b in all_reduce all_gather reduce_scatter sendrecv alltoall; do
    check "kernel: libnccl $b mpirun, 2 emulated hosts, 8 B-8 MB -c 1" \
      env $K LD_LIBRARY_PATH="$OURS" $MPIRUN -x RAILCC_GPU_NET_KERNEL $AS_HOST $NTM/build/${b}_perf -b 8 -e 8M -f 8 -n 2 -w 1 -c 1 -d float,bfloat16 -g 1
  done
  check "kernel: libnccl all_reduce mpirun, 2 emulated hosts, -G 10" \
    env $K LD_LIBRARY_PATH="$OURS" $MPIRUN -x RAILCC_GPU_NET_KERNEL $AS_HOST $NTM/build/all_reduce_perf -b 8 -e 32M -f 64 -n 2 -w 1 -c 1 -g 1 -G 10
  env $K LD_LIBRARY_PATH="$OURS" NCCL_DEBUG=INFO $MPIRUN -x RAILCC_GPU_NET_KERNEL -x NCCL_DEBUG $AS_HOST $NTM/build/all_reduce_perf -b 8 -e 8 -n 1 -w 0 -g 1 2>&1 | grep -m2 "railcc libnccl"
;; esac

case " $PARTS " in *" x2 "*)
  nccl_tests_build $NTM 1 || fail "nccl-tests MPI build"
  MPI4="${MPIRUN/-np 2/-np 4} -x AS_HOST_PER"
  for b in all_reduce all_gather reduce_scatter broadcast reduce sendrecv alltoall; do
    check "$K: libnccl $b 2 hosts x 2 ranks, 8 B-8 MB -c 1" \
      env $K AS_HOST_PER=2 LD_LIBRARY_PATH="$OURS" $MPI4 -x RAILCC_GPU_NET_KERNEL $AS_HOST $NTM/build/${b}_perf -b 8 -e 8M -f 8 -n 2 -w 1 -c 1 -d float,bfloat16 -g 1
  done
  for b in all_reduce broadcast; do
    check "$K: libnccl $b 2 hosts x 2 ranks, split at every size, 8 B-1 MB -c 1" \
      env $K AS_HOST_PER=2 RAILCC_GPU_HIER_SMALL_BYTES=0 RAILCC_GPU_FLAT_BELOW_BYTES=0 LD_LIBRARY_PATH="$OURS" $MPI4 -x RAILCC_GPU_NET_KERNEL -x RAILCC_GPU_HIER_SMALL_BYTES $AS_HOST $NTM/build/${b}_perf -b 8 -e 1M -f 4 -n 2 -w 1 -c 1 -d float,bfloat16 -g 1
  done
  check "$K: libnccl all_reduce 2 hosts x 2 ranks, the hierarchy at every size (no flat engine), 8 B-1 MB -c 1" \
    env $K AS_HOST_PER=2 RAILCC_GPU_FLAT_BELOW_BYTES=0 LD_LIBRARY_PATH="$OURS" $MPI4 -x RAILCC_GPU_NET_KERNEL $AS_HOST $NTM/build/all_reduce_perf -b 8 -e 1M -f 4 -n 2 -w 1 -c 1 -d float,bfloat16 -g 1
;; esac

case " $PARTS " in *" quick "*)
  : > $LOG
  for c in all_reduce alltoall; do
    check "bench $c --gpu-net, every dtype/op, 8 B-16 MB, --offset 8" \
      $R bench $c --device cuda --per-process --gpu-net --ranks 2 -b 8 -e 16M -f 16 -d all -o all -n 1 -w 0 -r 1 --offset 8
  done
  check "bench all_reduce --gpu-net -G 3, 8 B-256 MB" \
    $R bench all_reduce --device cuda --per-process --gpu-net --ranks 2 -b 8 -e 256M -f 32 -d float,bfloat16 -n 3 -w 1 -G 3
  nccl_tests_build $NTM 1 || fail "nccl-tests MPI build"
  check "libnccl all_reduce mpirun, 2 emulated hosts, 8 B-1 GB -c 1" \
    env LD_LIBRARY_PATH="$OURS" $MPIRUN $AS_HOST $NTM/build/all_reduce_perf -b 8 -e 1G -f 8 -n 2 -w 1 -c 1 -g 1
;; esac

case " $PARTS " in *" trace "*)
  L=$OUT/nk-trace.log; : > $L
  for run in "8|" "134217728|" "134217728|RAILCC_GPU_NET_STAGING_BYTES=0"; do
    IFS='|' read -r sz vars <<< "$run"
    echo "== $sz $vars" >> $L
    timeout 60 env $vars RAILCC_GPU_NET_TRACE=1 $R bench all_reduce --device cuda --per-process --gpu-net --ranks 2 -b $sz -e $sz -n 1 -w 0 -c 0 >> $L 2>&1
  done
  grep -E "^== |gpu net trace|returned after" $L
;; esac

NCCL_4X4="nccl 4x4|NCCL=1 NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4"
# compare LOG "MPIRUN" "BINARY ARGS" RUN...: each RUN ("label|VAR=VALUE ...", NCCL=1 for the
# image's NCCL instead of railcc's libnccl) runs nccl-tests' BINARY under MPIRUN, logged in LOG
# under "== label"; then the table: label, size, time (us), busbw (GB/s), out of place.
compare() {
  local log=$1 mpi=$2 what=$3 run label vars lib
  shift 3
  : > "$log"
  local round
  for round in $(seq "${NK_ROUNDS:-1}"); do
  for run in "$@"; do
    IFS='|' read -r label vars <<< "$run"
    echo "== $label" >> "$log"
    # NCCL's INFO lines say its channels (a speed claim states them beside railcc's blocks).
    lib=$OURS; case $vars in NCCL=1*) lib="$NCCL_HOME/lib:/usr/local/cuda/lib64"; vars="$vars NCCL_DEBUG=INFO" ;; esac
    # RAILCC_LIB=DIR: another build's libnccl (bench/compare/gpu-prepare.sh PREPARE_OLD).
    case " $vars " in *" RAILCC_LIB="*) lib="$(echo " $vars " | sed 's/.* RAILCC_LIB=\([^ ]*\) .*/\1/'):/usr/local/cuda/lib64" ;; esac
    timeout 150 env $vars LD_LIBRARY_PATH="$lib" $mpi -x RAILCC_GPU_NET_KERNEL -x RAILCC_GPU_NET_STAGING_BYTES \
      -x RAILCC_GPU_NET_RING -x RAILCC_GPU_NET_BLOCKS -x RAILCC_GPU_HIER_SMALL_BYTES -x RAILCC_GPU_NET_P2P_SPREAD_BYTES -x RAILCC_GPU_NET_CHANNELS -x RAILCC_GPU_NET_SPIN_US -x RAILCC_GPU_NET_TRACE -x RAILCC_GPU_NET_LL_BYTES -x RAILCC_GPU_HIER_LOCAL_SUM -x NCCL_SOCKET_NTHREADS -x NCCL_NSOCKS_PERTHREAD -x NCCL_DEBUG \
      $AS_HOST $NTM/build/$what >> "$log" 2>&1
    echo "== exit $?" >> "$log"
  done
  done
  if [ "${NK_ROUNDS:-1}" -gt 1 ]; then
    python3 bench/compare/rounds.py "$log"
    grep -h " coll channels" "$log" | head -1 | sed 's/.*NCCL INFO /# nccl: /'
    return
  fi
  awk '/^== exit/ {next} /^== / {lab=substr($0,4); next} /^ +[0-9]+ +[0-9]+ / {printf "%-20s %12s %10s %8s\n", lab, $1, $6, $8}
       / coll channels/ && !seen[lab]++ {sub(/.*NCCL INFO /, ""); print "# " lab ": " $0}' "$log"
}
# four_gpus PART: the 2 x 2 parts' start: 4 GPUs or the script ends; nccl-tests built; MPI4,
# mpirun of 4 ranks (AS_HOST_PER ranks a host).
four_gpus() {
  [ "$AS_HOST_GPUS" -ge 4 ] || { echo "$1: needs 4 GPUs"; exit 1; }
  nccl_tests_build $NTM 1 || fail "nccl-tests MPI build"
  MPI4="${MPIRUN/-np 2/-np 4} -x AS_HOST_PER"
}
# The sizes of the perf and x2perf parts, per binary.
sizes_of() { [ "$1" = alltoall ] && echo "-b 1M -e 128M -f 128 -n 20 -w 3 -c 0 -g 1" || echo "-b 8 -e 1G -f 2 -n 10 -w 3 -c 0 -g 1"; }

case " $PARTS " in *" big "*)
  nccl_tests_build $NTM 1 || fail "nccl-tests MPI build"
  compare $OUT/nk-big.log "$MPIRUN" "all_reduce_perf -b 128M -e 1G -f 2 -n 10 -w 3 -c 0 -g 1" "railcc default|" "$NCCL_4X4"
;; esac

case " $PARTS " in *" ring "*)
  nccl_tests_build $NTM 1 || fail "nccl-tests MPI build"
  compare $OUT/nk-ring.log "$MPIRUN" "all_reduce_perf -b 1M -e 1G -f 4 -n 10 -w 3 -c 0 -g 1" \
    "railcc 8x2MiB|" "railcc 8 blocks|RAILCC_GPU_NET_BLOCKS=8" \
    "railcc 12x2MiB|RAILCC_GPU_NET_RING=12 RAILCC_GPU_NET_STAGING_BYTES=50331648" \
    "railcc 16x1MiB|RAILCC_GPU_NET_RING=16" "$NCCL_4X4"
;; esac

case " $PARTS " in *" x2perf "*)
  four_gpus x2perf
  for b in all_reduce alltoall; do
    echo "== 2 x 2 $b (time us / busbw GB/s, out of place)"
    ( export AS_HOST_PER=2
      split=; [ $b = all_reduce ] && split="railcc split|RAILCC_GPU_HIER_SMALL_BYTES=0"
      compare $OUT/nk-x2perf-$b.log "$MPI4" "${b}_perf $(sizes_of $b)" "railcc default|" ${split:+"$split"} "nccl defaults|NCCL=1" "$NCCL_4X4" )
  done
  env AS_HOST_PER=2 LD_LIBRARY_PATH="$OURS" NCCL_DEBUG=INFO $MPI4 -x NCCL_DEBUG $AS_HOST $NTM/build/all_reduce_perf -b 1G -e 1G -n 2 -w 1 -c 1 -g 1 2>&1 | grep -E "pinned host memory|railcc libnccl|^ +[0-9]" | cut -c1-200
;; esac

case " $PARTS " in *" flat "*)
  four_gpus flat
  echo "== 2 x 2 all_reduce 8 B-64 KB: the hierarchy against the flat engine for small calls (time us)"
  ( export AS_HOST_PER=2
    compare $OUT/nk-flat.log "$MPI4" "all_reduce_perf -b 8 -e 64K -f 8 -n 1000 -w 50 -c 0 -g 1" \
      "railcc hierarchy|RAILCC_GPU_FLAT_BELOW_BYTES=0" "railcc flat|RAILCC_GPU_FLAT_BELOW_BYTES=131072" \
      "nccl defaults|NCCL=1" "$NCCL_4X4" )
;; esac

case " $PARTS " in *" numa "*)
  four_gpus numa
  ( export AS_HOST_PER=2
    compare $OUT/nk-numa.log "$MPI4" "all_reduce_perf -b 16M -e 1G -f 4 -n 10 -w 3 -c 0 -g 1" "railcc|" \
      "railcc bound|AS_HOST_BIND=1" "railcc again|" "$NCCL_4X4" "nccl 4x4 bound|NCCL=1 NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4 AS_HOST_BIND=1" )
;; esac

case " $PARTS " in *" spread "*)
  four_gpus spread
  ( export AS_HOST_PER=2
    for b in alltoall sendrecv; do
      echo "== 2 x 2 $b (time us / busbw GB/s, out of place)"
      compare $OUT/nk-spread-$b.log "$MPI4" "${b}_perf -b 256K -e 16M -f 4 -n 20 -w 3 -c 0 -g 1" "railcc|" \
        "railcc spread 32K|RAILCC_GPU_NET_P2P_SPREAD_BYTES=32768" "railcc spread 16K|RAILCC_GPU_NET_P2P_SPREAD_BYTES=16384" "$NCCL_4X4"
    done )
  echo "== 2 x 1 sendrecv"
  compare $OUT/nk-spread-sendrecv-2x1.log "$MPIRUN" "sendrecv_perf -b 64K -e 4M -f 4 -n 20 -w 3 -c 0 -g 1" "railcc|" \
    "railcc spread 16K|RAILCC_GPU_NET_P2P_SPREAD_BYTES=16384" "$NCCL_4X4"
;; esac

case " $PARTS " in *" bigx2 "*)
  four_gpus bigx2
  ( export AS_HOST_PER=2
    compare $OUT/nk-bigx2.log "$MPI4" "all_reduce_perf -b 128M -e 1G -f 2 -n 10 -w 3 -c 0 -g 1" "railcc|" \
      "railcc ring 16|RAILCC_GPU_NET_RING=16" "railcc 8 blocks|RAILCC_GPU_NET_BLOCKS=8" "railcc 4 channels|RAILCC_GPU_NET_CHANNELS=4" "$NCCL_4X4" "railcc again|" "nccl 4x4 again|NCCL=1 NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4" )
;; esac

case " $PARTS " in *" prof "*)
  four_gpus prof
  L=$OUT/nk-prof.log; : > $L
  command -v perf >/dev/null && echo "perf: $(command -v perf)" >> $L
  for run in "railcc|" "railcc no spin|RAILCC_SPIN_US=0" "$NCCL_4X4"; do
    IFS='|' read -r label vars <<< "$run"
    lib=$OURS; case $vars in NCCL=1*) lib="$NCCL_HOME/lib:/usr/local/cuda/lib64" ;; esac
    echo "== $label" | tee -a $L
    ( timeout 150 env $vars AS_HOST_PER=2 LD_LIBRARY_PATH="$lib" $MPI4 -x RAILCC_SPIN_US -x NCCL_SOCKET_NTHREADS -x NCCL_NSOCKS_PERTHREAD \
        $AS_HOST $NTM/build/all_reduce_perf -b 1G -e 1G -n 150 -w 3 -c 0 -g 1 > /tmp/nk-prof-run.log 2>&1 ) &
    sleep 8
    python3 bench/compare/thread-cpu.py all_reduce_perf 4 2>&1 | tee -a $L
    wait
    grep -E "^ +[0-9]+ +[0-9]+ " /tmp/nk-prof-run.log | tee -a $L
  done
;; esac

case " $PARTS " in *" blocks "*)
  four_gpus blocks
  B8="railcc 8 blocks|RAILCC_GPU_NET_BLOCKS=8"; B16="railcc ring 16 b16|RAILCC_GPU_NET_RING=16 RAILCC_GPU_NET_BLOCKS=16"
  ( export AS_HOST_PER=2
    compare $OUT/nk-blocks-2x2.log "$MPI4" "all_reduce_perf -b 128M -e 1G -f 2 -n 10 -w 3 -c 0 -g 1" \
      "railcc|" "$B8" "$B16" "$NCCL_4X4" "railcc|" "$B8" "$B16" "$NCCL_4X4"
    compare $OUT/nk-blocks-2x2-small.log "$MPI4" "all_reduce_perf -b 8 -e 1M -f 8 -n 50 -w 5 -c 0 -g 1" "railcc|" "$B8" "$B16" )
  compare $OUT/nk-blocks-2x1.log "$MPIRUN" "all_reduce_perf -b 128M -e 1G -f 2 -n 10 -w 3 -c 0 -g 1" \
    "railcc|" "$B8" "$B16" "$NCCL_4X4"
;; esac

case " $PARTS " in *" diag "*)
  four_gpus diag
  ( export AS_HOST_PER=2
    compare $OUT/nk-diag-1m.log "$MPI4" "all_reduce_perf -b 1M -e 1M -o max -n 200 -w 20 -c 1 -g 1" "railcc|" "$NCCL_4X4" )
  awk '/^ +1048576 /{print FILENAME": in place "$10" us"}' $OUT/nk-diag-1m.log
;; esac

case " $PARTS " in *" enq "*)
  nccl_tests_build $NTM 1 || fail "nccl-tests MPI build"
  IFS=';' read -r -a enq_extra <<< "${NK_ENQ:-}"
  for sz in 8 134217728 1073741824; do
    n=1000; [ $sz -gt 8 ] && n=20
    echo "== 2x1 all_reduce $sz B: the caller's time per call (rank 0, us median/p90/max)"
    ( export RAILCC_GPU_NET_TRACE=1
      compare $OUT/nk-enq-$sz.log "$MPIRUN" "all_reduce_perf -b $sz -e $sz -n $n -w 5 -c 0 -g 1" "railcc default|" "${enq_extra[@]}" > /dev/null
      awk '/^== exit/ {next} /^== / {lab=substr($0,4); next}
           /rank 0 gpu net trace/ {split($0, a, ";"); print "  " lab ": " a[1] ";" a[2] ";" a[3]}' $OUT/nk-enq-$sz.log | sed 's/railcc: rank 0 gpu net trace (us, median\/p90\/max)://' )
  done
;; esac

case " $PARTS " in *" lat "*)
  nccl_tests_build $NTM 1 || fail "nccl-tests MPI build"
  IFS=';' read -r -a lat_extra <<< "${NK_LAT:-}"
  for layout in 2x1 2x2; do
    mpi=$MPIRUN; per=1
    if [ $layout = 2x2 ]; then [ "$AS_HOST_GPUS" -ge 4 ] || continue; mpi="${MPIRUN/-np 2/-np 4} -x AS_HOST_PER"; per=2; fi
    echo "== $layout all_reduce (time us / busbw GB/s, out of place)"
    ( export AS_HOST_PER=$per
      compare $OUT/nk-lat-$layout.log "$mpi" "all_reduce_perf -b 8 -e 64K -f 8 -n 1000 -w 50 -c 0 -g 1" \
        "railcc default|" "${lat_extra[@]}" "nccl defaults|NCCL=1" "$NCCL_4X4" )
  done
;; esac

case " $PARTS " in *" stamps "*)
  nccl_tests_build $NTM 1 || fail "nccl-tests MPI build"
  L=$OUT/nk-stamps.log; : > $L
  MPI4="${MPIRUN/-np 2/-np 4} -x AS_HOST_PER"
  for layout in 2x1 2x2; do
    mpi=$MPIRUN; per=1
    if [ $layout = 2x2 ]; then [ "$AS_HOST_GPUS" -ge 4 ] || continue; mpi=$MPI4; per=2; fi
    for sz in 8 65536; do
      for lib in railcc nccl; do
        echo "== $layout $sz $lib" | tee -a $L
        if [ $lib = railcc ]; then
          timeout 120 env AS_HOST_PER=$per RAILCC_GPU_NET_TRACE=1 LD_LIBRARY_PATH="$OURS" $mpi -x RAILCC_GPU_NET_TRACE $AS_HOST \
            $NTM/build/all_reduce_perf -b $sz -e $sz -n 1000 -w 50 -c 1 -g 1 > /tmp/nk-stamps.log 2>&1
          why=$(table_problem /tmp/nk-stamps.log)
          [ -z "$why" ] || fail "stamps $layout $sz: $why"
        else
          timeout 120 env AS_HOST_PER=$per NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4 LD_LIBRARY_PATH="$NCCL_HOME/lib:/usr/local/cuda/lib64" \
            $mpi -x NCCL_SOCKET_NTHREADS -x NCCL_NSOCKS_PERTHREAD $AS_HOST $NTM/build/all_reduce_perf -b $sz -e $sz -n 1000 -w 50 -c 0 -g 1 > /tmp/nk-stamps.log 2>&1
        fi
        cat /tmp/nk-stamps.log >> $L
        grep -E "^ +$sz |rank 0 gpu net" /tmp/nk-stamps.log | cut -c1-330
      done
    done
  done
;; esac

case " $PARTS " in *" perf "*)
  nccl_tests_build $NTM 1 || fail "nccl-tests MPI build"
  for b in all_reduce alltoall; do
    echo "== $b (time us / busbw GB/s, out of place)"
    compare $OUT/nk-perf-$b.log "$MPIRUN" "${b}_perf $(sizes_of $b)" "railcc default|RAILCC_GPU_NET_KERNEL=1" \
      "railcc stream|RAILCC_GPU_NET_KERNEL=0 RAILCC_GPU_NET_STAGING_BYTES=0" "nccl defaults|NCCL=1" "$NCCL_4X4"
  done
;; esac

case " $PARTS " in *" ret "*)
  L=$OUT/nk-ret.log; : > $L
  for k in "RAILCC_GPU_NET_KERNEL=1" "RAILCC_GPU_NET_KERNEL=0 RAILCC_GPU_NET_STAGING_BYTES=0"; do
    echo "== $k" >> $L
    timeout 150 env $k $R bench all_reduce --device cuda --per-process --gpu-net --ranks 2 -b 8 -e 1G -f 8 -n 10 -w 2 -c 1 >> $L 2>&1
    echo "== exit $?" >> $L
  done
  grep -E "^== |^# railcc|returned after|^ +[0-9]" $L | head -80
;; esac
echo "gpu-net-kernel: $FAILS failed"
[ $FAILS = 0 ]
