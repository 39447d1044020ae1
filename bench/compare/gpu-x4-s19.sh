#!/usr/bin/env bash
# On nvidia-h100-x4 / nvidia-h200-x4 (after bash bench/compare/gpu-prepare.sh here; carry
# .device): the eighteenth session's device calls, one part per call. Logs under $OUT/logs,
# tarred to $OUT/logs-<part>.tgz.
#   a  calls that return before their peers arrive (RAILCC_GPU_DEFER=1): the diagnosis found
#      the first run's hang (a deferred launcher closing a stale mapping: cuIpcCloseMemHandle
#      waits for the device, which waits for the launcher); now no rank shows its peers an
#      allocation over one they mapped. The 8 B diagnosis again, the bench's per-process
#      checks with the option on (stopping at the first failure), then HSDP and FSDP on one
#      host of 4 GPUs: railcc with and without it against NCCL, two runs each, interleaved.
#   b  RAILCC_GPU_NET_RING now 16 (was 8; 1.1-1.6x at 16 MB-1 GB on 2 x 1, s19/f): nccl-tests
#      all_reduce on 2 emulated hosts x 2 GPUs under mpirun, railcc at 16 and at 8 against
#      NCCL with 4 threads x 4 sockets, 1 MB-1 GB, two rounds; then the idle return time on
#      2 x 2 with the new default (bench/experiments/return_time.sh).
#   c  part a's HSDP and FSDP runs with RAILCC_GPU_DEFER=1 hung (no step in 90 s, no error):
#      one FSDP run of 10 steps with it on, a 20 s deadline and the launcher's debug lines
#      (RAILCC_LOG), each thread's wait channel 35 s in; each rank's last lines.
#   d  part c found the deferred launcher's enqueue blocked on the host while the caller's
#      stream waited for it (PyTorch's many streams). RAILCC_GPU_STAGE_BYTES (proc/stage.rs)
#      takes the other way: a fixed stage every peer maps at init, so a call that fits goes
#      on the caller's stream at once with no meeting on the host. The bench's per-process
#      checks with it (2 and 4 ranks, -G 3), then HSDP and FSDP on one host: railcc with and
#      without it against NCCL, two runs each, interleaved.
#   e  the stage on 2 emulated hosts x 2 GPUs: HSDP with RAILCC_GPU_STAGE_BYTES against
#      NCCL with 4 threads x 4 sockets (its better setting), two runs each, interleaved.
# Usage: bash bench/compare/gpu-x4-s19.sh a|b|c|d|e
set -u
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
session_begin
case ${1:-} in
  a)
    OUT=$L/diag timeout 40 bash bench/compare/gpu-defer-diag.sh > "$L/diag.txt" 2>&1
    grep -E "launcher failed|deferred|stops|timeout|Out of bounds" "$L/diag.txt" | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-200 | tail -6
    source bench/compare/tables.sh
    okc=0 badc=0
    for c in all_reduce all_gather reduce_scatter broadcast reduce; do
      for g in 0 3; do
        [ "$badc" = 0 ] || continue
        f="$L/defer-$c-G$g.log"
        timeout -k 5 60 env RAILCC_GPU_DEFER=1 RAILCC_TIMEOUT_MS=10000 $R bench $c --device cuda --per-process -b 8 -e 64M -f 8 \
          -d float,bfloat16,int8 -o sum,max -n 6 -w 2 -G $g --offset 8 > "$f" 2>&1
        rc=$? tables=$(grep -c "Out of bounds values" "$f") oks=$(grep -c "Out of bounds values : 0 OK" "$f")
        wrong=$(wrong_rows "$f") rows=$(table_rows "$f")
        if [ $rc = 0 ] && [ "$tables" -gt 0 ] && [ "$oks" = "$tables" ] && [ "$wrong" = 0 ] && [ "$rows" -gt 0 ]; then okc=$((okc+1)); v=PASS; else badc=$((badc+1)); v=FAIL; fi
        echo "$v  defer bench $c --per-process -G $g: exit $rc, $oks of $tables tables OK $rows rows, $wrong wrong"
        [ $v = PASS ] || sed 's/\x1b\[[0-9;]*m//g' "$f" | grep -vE "^\s*$" | cut -c1-220 | tail -8
      done
    done
    echo "== defer checks: $okc passed, $badc failed; after $(( $(date +%s) - T0 )) s"
    # 4 ranks too: every peer of a deferred call may be late.
    if [ "$badc" = 0 ]; then
      f="$L/defer-4-all_reduce.log"
      timeout -k 5 60 env RAILCC_GPU_DEFER=1 RAILCC_TIMEOUT_MS=10000 $R bench all_reduce --device cuda --per-process --ranks 4 -b 8 -e 64M -f 8 \
        -d float,bfloat16 -n 6 -w 2 > "$f" 2>&1
      rc=$? tables=$(grep -c "Out of bounds values" "$f") oks=$(grep -c "Out of bounds values : 0 OK" "$f")
      echo "defer bench all_reduce --ranks 4: exit $rc, $oks of $tables tables OK, $(wrong_rows "$f") wrong rows"
    fi
    OUT=$L/host STEP_LAYOUTS=host STEP_MODES="hsdp fsdp" STEP_RUNS=2 STEP_LIMIT=90 STEP_LIBS="railcc nccl" \
      STEP_EXTRA="defer:RAILCC_GPU_DEFER=1,RAILCC_GPU_HOST_TRACE=1" STEP_ARGS="--steps 30" \
      timeout $(left 575) bash bench/torch/step.sh 2>&1 | tee "$L/host.txt" | grep -v "^  "
    grep -h "host trace" "$L"/host/*defer* 2>/dev/null | cut -c1-300 | head -4
    ;;
  b)
    nccl_tests_build $NTM 1 || { echo "FAIL  nccl-tests build (MPI)"; tail /tmp/nccl-build-1.log; }
    NCCL_HOME=$(python3 -c "import nvidia.nccl,os;print(nvidia.nccl.__path__[0])")
    net_env gpu-x4-s19.sh
    AS_HOST=$PWD/bench/compare/as-host.sh
    MPI4="mpirun -np 4 --bind-to none --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x NCCL_SOCKET_IFNAME -x RAILCC_SOCKET_IFNAME -x RAILCC_CACHE_DIR -x RAILCC_TIMEOUT_MS -x AS_HOST_GPUS -x AS_HOST_PER -x RAILCC_GPU_NET_RING -x NCCL_SOCKET_NTHREADS -x NCCL_NSOCKS_PERTHREAD"
    export AS_HOST_PER=2
    P="-b 1M -e 1G -f 4 -n 10 -w 3 -c 0 -g 1"
    for round in 1 2; do
      for v in ring16 ring8 nccl; do
        f="$L/x2-$round-$v.log"
        case $v in
          ring16) timeout $(left ${B_NCCL:-330}) env RAILCC_GPU_NET_RING=16 LD_LIBRARY_PATH="$PWD/.device/lib:/usr/local/cuda/lib64" $MPI4 $AS_HOST $NTM/build/all_reduce_perf $P > "$f" 2>&1 ;;
          ring8) timeout $(left ${B_NCCL:-330}) env RAILCC_GPU_NET_RING=8 LD_LIBRARY_PATH="$PWD/.device/lib:/usr/local/cuda/lib64" $MPI4 $AS_HOST $NTM/build/all_reduce_perf $P > "$f" 2>&1 ;;
          nccl) timeout $(left ${B_NCCL:-330}) env NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4 LD_LIBRARY_PATH="$NCCL_HOME/lib:/usr/local/cuda/lib64" $MPI4 $AS_HOST $NTM/build/all_reduce_perf $P > "$f" 2>&1 ;;
        esac
        echo "== $v round $round: exit $?"
        grep -E "^ +[0-9]+ +[0-9]+ " "$f" | awk '{printf "  %10s %10s us %7s GB/s busbw\n", $1, $6, $8}'
      done
    done
    echo "== after $(( $(date +%s) - T0 )) s"
    OUT=$L RT_PER=2 timeout $(left ${B_END:-570}) bash bench/experiments/return_time.sh
    ;;
  c)
    export NCCL_SOCKET_IFNAME=lo PYTHONUNBUFFERED=1
    RAILCC_GPU_DEFER=1 RAILCC_TIMEOUT_MS=20000 RAILCC_LOG=railcc_transport_nvlink=debug,railcc_nccl=debug LD_PRELOAD=$PWD/.device/lib/libnccl.so.2 \
      timeout -k 5 60 python3 -m torch.distributed.run --nproc_per_node 4 --master_addr 127.0.0.1 --master_port 29711 \
      bench/torch/step.py --mode fsdp --out "$L/step" --label defer-diag --steps 10 > "$L/fsdp-defer.log" 2>&1 &
    sleep 35
    for p in $(pgrep -f "bench/torch/step.py" | head -6); do
      echo "== pid $p $(tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -m1 '^RANK=')"
      for t in /proc/$p/task/*; do echo "$(cat $t/comm) $(cat $t/wchan) $(awk '{print $3}' $t/stat)"; done | sort | uniq -c | sort -rn | head -12
    done > "$L/threads.txt" 2>&1
    wait
    sed 's/\x1b\[[0-9;]*m//g' "$L/fsdp-defer.log" > "$L/fsdp-defer.clean"
    grep -c "deferred" "$L/fsdp-defer.clean"
    grep -E "ERROR|WARN|error|stops" "$L/fsdp-defer.clean" | grep -v "experiment whose" | cut -c1-260 | head -12
    for r in 0 1 2 3; do echo "== rank $r"; grep -E "rank $r[:,) ]" "$L/fsdp-defer.clean" | cut -c1-200 | tail -8; done
    cat "$L/threads.txt" | head -70
    ;;
  d)
    source bench/compare/tables.sh
    okc=0 badc=0
    for run in "all_reduce 2 0" "all_gather 2 0" "reduce_scatter 2 0" "all_reduce 2 3" "reduce_scatter 2 3" \
      "all_reduce 4 0" "all_gather 4 0" "reduce_scatter 4 0" "broadcast 4 0"; do
      read -r c nr g <<< "$run"
      [ "$badc" = 0 ] || continue
      f="$L/stage-$c-$nr-G$g.log"
      timeout -k 5 60 env RAILCC_GPU_STAGE_BYTES=67108864 RAILCC_TIMEOUT_MS=10000 $R bench $c --device cuda --per-process --ranks $nr -b 8 -e 64M -f 8 \
        -d float,bfloat16,int8 -o sum,max -n 6 -w 2 -G $g --offset 8 > "$f" 2>&1
      rc=$? tables=$(grep -c "Out of bounds values" "$f") oks=$(grep -c "Out of bounds values : 0 OK" "$f")
      wrong=$(wrong_rows "$f") rows=$(table_rows "$f")
      if [ $rc = 0 ] && [ "$tables" -gt 0 ] && [ "$oks" = "$tables" ] && [ "$wrong" = 0 ] && [ "$rows" -gt 0 ]; then okc=$((okc+1)); v=PASS; else badc=$((badc+1)); v=FAIL; fi
      echo "$v  stage bench $c --per-process --ranks $nr -G $g: exit $rc, $oks of $tables tables OK $rows rows, $wrong wrong"
      [ $v = PASS ] || sed 's/\x1b\[[0-9;]*m//g' "$f" | grep -vE "^\s*$" | cut -c1-220 | tail -8
    done
    echo "== stage checks: $okc passed, $badc failed; after $(( $(date +%s) - T0 )) s"
    [ "$badc" = 0 ] || { session_end "$1"; exit 1; }
    grep -h "^ *1048576 \|^ *16777216 " "$L/stage-all_reduce-2-G0.log" | head -4
    OUT=$L/host STEP_LAYOUTS=host STEP_MODES="hsdp fsdp" STEP_RUNS=2 STEP_LIMIT=90 STEP_LIBS="railcc nccl" \
      STEP_EXTRA="stage:RAILCC_GPU_STAGE_BYTES=67108864" STEP_ARGS="--steps 30" \
      timeout $(left 575) bash bench/torch/step.sh 2>&1 | tee "$L/host.txt" | grep -v "^  "
    ;;
  e)
    OUT=$L/x2 STEP_LAYOUTS=2x2 STEP_MODES=hsdp STEP_RUNS=2 STEP_LIMIT=80 STEP_LIBS="nccl-4x4" \
      STEP_EXTRA="stage:RAILCC_GPU_STAGE_BYTES=67108864" STEP_ARGS="--steps 30" \
      timeout $(left 270) bash bench/torch/step.sh 2>&1 | tee "$L/x2.txt" | grep -v "^  "
    ;;
  *) echo "usage: $0 a|b|c|d|e"; exit 2 ;;
esac
session_end "$1"
