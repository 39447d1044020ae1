#!/usr/bin/env bash
# On nvidia-h100-x4 / nvidia-h200-x4 (after bash bench/compare/gpu-prepare.sh here; carry
# .device): the device calls written in the sixteenth session for the next one, one part per
# call. Logs under $OUT/logs, tarred to $OUT/logs-<part>.tgz.
#   a  ncclAllReduce's return to its caller through NCCL's and railcc's libnccl in one
#      command (bench/experiments/return_time.sh: 8 B, 8 MB, 128 MB; the caller woken after
#      12 ms asleep, busy 12 ms, or queued behind its last call), 2 x 1 and 2 x 2. The
#      sixteenth session found a no-op launch alone costs 45 us after 12 ms asleep: is
#      NCCL's idle return any shorter than railcc's 50-85 us at 128 MB?
#      Then 2 x 1 bf16 all_reduce 4-64 MB (HSDP's replica calls are 12.6 MB) with the ring
#      deeper, smaller chunks, more channels or a larger ring, against the defaults.
#   b  where HSDP's step goes (2 x 2: 1.01x NCCL 4x4, target 0.9x): HSDP and FSDP on one host
#      of 4 GPUs (no network: the NVLink parts alone), railcc against NCCL, two runs each,
#      interleaved. If railcc is at parity or ahead there, the cross-host replica all_reduce
#      (12.6 MB bf16 a layer, 2 x 1 in each replica group) is what to shorten. Then one 2 x 2
#      HSDP run with RAILCC_GPU_HOST_TRACE and RAILCC_GPU_NET_TRACE (the host's waits).
#   c, d  the GPU suite's parts not run on the new close code (last session's waits before a
#      close frees; recover, config, unit and nccl passed in the sixteenth session):
#      c: bench push shared shrink; d: p2pbatch p2pll register split alloc.
#   e  (written in the seventeenth session) calls that return before their peers arrive
#      (RAILCC_GPU_DEFER=1, proc/defer.rs), first run: the bench's per-process checks of
#      every collective with the option on (several iterations, so the ranks arrive apart,
#      and -G 3: the capture path), then HSDP and FSDP on one host of 4 GPUs, railcc with and
#      without it against NCCL, two runs each, interleaved; then, if time is left, the
#      recover part with it on (a killed rank while calls are deferred).
#   f  (seventeenth session) part a found RAILCC_GPU_NET_RING=16 1.2-1.5x the default 8 at
#      16-64 MB on 2 x 1: the same at 4 MB-1 GB, bf16 and float, two rounds alternating,
#      before it may become the default (the pinned budget stays 28 MiB: pieces are cut
#      smaller). 2 x 2 (nccl-tests with NCCL_HOSTID) still to add.
# Usage: bash bench/compare/gpu-x4-s18.sh a|b|c|d|e|f
set -u
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
session_begin
case ${1:-} in
  a)
    OUT=$L RT_PER=1 timeout 200 bash bench/experiments/return_time.sh
    mv "$L/return_time.log" "$L/return_time-2x1.log"
    echo "== after $(( $(date +%s) - T0 )) s"
    OUT=$L RT_PER=2 timeout $(left 300) bash bench/experiments/return_time.sh
    mv "$L/return_time.log" "$L/return_time-2x2.log"
    echo "== after $(( $(date +%s) - T0 )) s"
    # HSDP's replica all_reduce is 12.6 MB of bf16 a layer on 2 x 1, where railcc reads 6-8
    # GB/s against 11.6 at 128 MB: do more, smaller pieces in flight (ring depth, chunk size),
    # more channels or a larger ring help there? Two rounds, settings alternating.
    export RAILCC_TIMEOUT_MS=30000 NCCL_SOCKET_IFNAME=lo RAILCC_SOCKET_IFNAME=lo
    for round in 1 2; do
      for v in "default" "RAILCC_GPU_NET_RING=16" "RAILCC_GPU_NET_CHUNK_BYTES=1048576" \
        "RAILCC_GPU_NET_CHANNELS=16" "RAILCC_GPU_NET_STAGING_BYTES=58720256"; do
        f="$L/mid-$round-${v%%=*}.log"
        timeout 60 env ${v/default/RAILCC_GPU_NET_TRACE=0} $PWD/.device/bin/railcc bench all_reduce --device cuda --per-process --gpu-net \
          --ranks 2 -d bfloat16 -b 4M -e 64M -f 2 -n 10 -w 3 -c 1 > "$f" 2>&1
        echo "== $v round $round: exit $?"; grep -E "^ +[0-9]|wrong|FAIL" "$f" | awk '{printf "  %10s %9s us %6s GB/s\n", $1, $6, $8}'
      done
    done
    ;;
  b)
    OUT=$L/host STEP_LAYOUTS=host STEP_MODES="hsdp fsdp" STEP_RUNS=2 STEP_LIMIT=90 STEP_LIBS="railcc nccl" STEP_ARGS="--steps 30" \
      timeout $(left 420) bash bench/torch/step.sh 2>&1 | tee "$L/host.txt" | grep -v "^  "
    echo "== after $(( $(date +%s) - T0 )) s"
    # One 2 x 2 HSDP run with the host traces: how long each NVLink call's host waited for its
    # peers to publish ("coll wait peers+map": railcc's calls meet on the host, NCCL's only on
    # the GPU, so a rank whose Python runs late holds the others' CPU threads), and the network
    # engine's enqueue.
    OUT=$L/trace STEP_LAYOUTS=2x2 STEP_MODES=hsdp STEP_RUNS=1 STEP_LIMIT=90 STEP_LIBS=none \
      STEP_EXTRA="trace:RAILCC_GPU_HOST_TRACE=1,RAILCC_GPU_NET_TRACE=1" STEP_ARGS="--steps 30" \
      timeout $(left 570) bash bench/torch/step.sh 2>&1 | grep -v "^  "
    grep -h "host trace\|gpu net trace" "$L"/trace/*.node* | cut -c1-400 | head -16
    ;;
  c)
    OUT=$L TEST_GPU_PARTS="bench push shared shrink" timeout $(left 570) bash scripts/test-gpu.sh 2>&1 | grep -E "^(PASS|FAIL|SKIP)|test-gpu:" | cut -c1-160
    ;;
  d)
    OUT=$L TEST_GPU_PARTS="p2pbatch p2pll register split alloc" timeout $(left 570) bash scripts/test-gpu.sh 2>&1 | grep -E "^(PASS|FAIL|SKIP)|test-gpu:" | cut -c1-160
    ;;
  e)
    source bench/compare/tables.sh
    okc=0 badc=0
    # A 10 s deadline and a 60 s limit a command: the first run hung every command until
    # its limit (10 x 120 s); after a failure the rest are not worth the device time.
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
      done
    done
    echo "== defer checks: $okc passed, $badc failed; after $(( $(date +%s) - T0 )) s"
    OUT=$L/host STEP_LAYOUTS=host STEP_MODES="hsdp fsdp" STEP_RUNS=2 STEP_LIMIT=90 STEP_LIBS="railcc nccl" \
      STEP_EXTRA="defer:RAILCC_GPU_DEFER=1,RAILCC_GPU_HOST_TRACE=1" STEP_ARGS="--steps 30" \
      timeout $(left 470) bash bench/torch/step.sh 2>&1 | tee "$L/host.txt" | grep -v "^  "
    grep -h "host trace" "$L"/host/*defer* 2>/dev/null | cut -c1-300 | head -4
    echo "== after $(( $(date +%s) - T0 )) s"
    if [ "$(left 570)" -gt 150 ]; then
      OUT=$L RAILCC_GPU_DEFER=1 TEST_GPU_PARTS=recover timeout $(left 570) bash scripts/test-gpu.sh 2>&1 | grep -E "^(PASS|FAIL|SKIP|      )|test-gpu:" | cut -c1-200
    fi
    ;;
  f)
    export RAILCC_TIMEOUT_MS=30000 NCCL_SOCKET_IFNAME=lo RAILCC_SOCKET_IFNAME=lo
    for round in 1 2; do
      for v in default RAILCC_GPU_NET_RING=16; do
        for d in bfloat16 float; do
          f="$L/ring-$round-${v%%=*}-$d.log"
          timeout $(left 560) env ${v/default/RAILCC_GPU_NET_TRACE=0} $PWD/.device/bin/railcc bench all_reduce --device cuda --per-process --gpu-net \
            --ranks 2 -d $d -b 4M -e 1G -f 4 -n 8 -w 2 -c 1 > "$f" 2>&1
          echo "== $v $d round $round: exit $?"; grep -E "^ +[0-9]|wrong|FAIL" "$f" | awk '{printf "  %10s %9s us %6s GB/s\n", $1, $6, $8}'
        done
      done
    done
    ;;
  *) echo "usage: $0 a|b|c|d|e|f"; exit 2 ;;
esac
session_end "$1"
