#!/usr/bin/env bash
# On nvidia-h100-x4 / nvidia-h200-x4 (after PREPARE_OLD=69dcaa1 bash bench/compare/gpu-prepare.sh
# here: the build before the packed parameter, in .device/lib-69dcaa1; carry .device): the
# fourteenth session's device calls, one part per call. Logs under $OUT/logs, tarred to
# $OUT/logs-<part>.tgz.
#   a  the staging kernel's packed parameter (9838224) and the opt-in 512-piece launches
#      (8ba8c42), neither run on a GPU yet: gpu-net-kernel.sh quick and x2 (every collective
#      checked, 2 x 1 and 2 x 2), quick again with RAILCC_GPU_NET_BIG_LAUNCH=1; the caller's
#      time per call at 8 B, 128 MB, 1 GB (part enq: the old build, the default, big); a
#      call's return time on an idle stream (railcc bench --gpu-net), the default and big.
#   b  issue 31's 8 B and 4 KB all_reduce through PyTorch, three runs each, 2 x 1 and 2 x 2,
#      railcc's defaults and with parking progress threads (RAILCC_GPU_NET_SPIN_US=0: on 2 x 2
#      the spin read 72-78 us in 3 of 10 runs, never without it), against NCCL and NCCL 4 x 4;
#      nccl-tests' latency twice (gpu-net-kernel.sh lat).
#   c  where an idle-stream 128 MB call's return time goes (89-96 us in part a against 34 in
#      the timed loop): RAILCC_GPU_NET_TRACE=1 with -n 1 -w 0, so most samples are idle
#      calls, the default, parking threads and big launches; then the 2 x 2 training steps
#      (DDP, HSDP, overlap) with the new small-call defaults, railcc against NCCL 4 x 4.
#   d  one launch per 232 entries (a 128 MB call's 74 pieces in one launch) and one lock for
#      a call's flag slots: gpu-net-kernel.sh quick and x2, then the return times with the
#      trace's steps (cut, ring, take), idle (-n 1 -w 0) and in a loop (-n 20 -w 5).
#   e  pair pieces (2 entries instead of 3) and a piece's one segment inline: quick and x2,
#      the return times as in d, the caller's time per call (enq) against the session's
#      first build.
#   f  the idle-stream return time against the call's size (64 KB-128 MB: does the launch's
#      parameter size set it?); PyTorch 8 B and 4 KB, 2 x 1 and 2 x 2, twice, against NCCL;
#      nccl-tests' latency.
#   g  the 2 x 2 DDP step (1.35x NCCL 4 x 4 in part c's one run, parity in earlier sessions)
#      three times, railcc's default, with parking threads, and NCCL 4 x 4; HSDP twice.
# Usage: bash bench/compare/gpu-x4-s16.sh a|b|c|d|e|f|g
set -u
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
session_begin
case ${1:-} in
  a)
    OUT=$L NK_PARTS="quick x2" timeout 240 bash bench/compare/gpu-net-kernel.sh 2>&1 | tee "$L/check.txt" | grep -E "^(PASS|FAIL)|failed"
    cp $L/nk-check.log $L/nk-check-default.log 2>/dev/null
    echo "== after $(( $(date +%s) - T0 )) s"
    OUT=$L NK_PARTS=quick RAILCC_GPU_NET_BIG_LAUNCH=1 timeout 120 bash bench/compare/gpu-net-kernel.sh 2>&1 | tee "$L/check-big.txt" | grep -E "^(PASS|FAIL)|failed"
    echo "== after $(( $(date +%s) - T0 )) s"
    old=$(ls -d .device/lib-* 2>/dev/null | head -n 1)
    OUT=$L NK_PARTS=enq NK_ENQ="${old:+railcc before|RAILCC_LIB=$PWD/$old;}railcc big|RAILCC_GPU_NET_BIG_LAUNCH=1" timeout $(left 480) \
      bash bench/compare/gpu-net-kernel.sh 2>&1 | tee "$L/enq.txt"
    echo "== after $(( $(date +%s) - T0 )) s"
    for v in 0 1; do
      RAILCC_GPU_NET_BIG_LAUNCH=$v timeout $(left 570) $PWD/.device/bin/railcc bench all_reduce --device cuda --per-process --gpu-net --ranks 2 \
        -b 128M -e 1G -f 8 -n 5 -w 1 -c 1 > "$L/ret-big$v.log" 2>&1
      echo "return time, RAILCC_GPU_NET_BIG_LAUNCH=$v: exit $?"; grep -E "returned after" "$L/ret-big$v.log"
    done
    ;;
  b)
    # Spinning threads against the machine's CPU quota (a guess at the 2 x 2 runs at 72 us).
    echo "nproc $(nproc); cpu.max $(cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo none); $(grep -c ^processor /proc/cpuinfo) processors" | tee "$L/cpus.txt"
    OUT=$L/step STEP_LAYOUTS="2x1 2x2" STEP_MODES=small STEP_RUNS=3 STEP_LIMIT=50 STEP_SMALL_SIZES=8,4096 \
      STEP_EXTRA="nospin:RAILCC_GPU_NET_SPIN_US=0" timeout 420 bash bench/torch/step.sh 2>&1 | tee "$L/step.txt" | grep -E "^step|^2x|ratio"
    echo "== after $(( $(date +%s) - T0 )) s"
    OUT=$L NK_PARTS=lat NK_ROUNDS=2 timeout $(left 570) bash bench/compare/gpu-net-kernel.sh 2>&1 | tee "$L/lat.txt"
    ;;
  c)
    echo "tools: $(command -v perf nsys strace ltrace | tr '\n' ' ')"
    for v in default:X=0 nospin:RAILCC_GPU_NET_SPIN_US=0 big:RAILCC_GPU_NET_BIG_LAUNCH=1; do
      env "${v#*:}" RAILCC_GPU_NET_TRACE=1 timeout 120 $PWD/.device/bin/railcc bench all_reduce --device cuda --per-process --gpu-net \
        --ranks 2 -b 128M -e 128M -n 1 -w 0 -c 0 > "$L/ret-${v%%:*}.log" 2>&1
      echo "== ${v%%:*}: exit $?"; grep -E "returned after|rank 0 gpu net trace" "$L/ret-${v%%:*}.log"
    done
    echo "== after $(( $(date +%s) - T0 )) s"
    OUT=$L/step STEP_LAYOUTS=2x2 STEP_MODES="ddp hsdp overlap" STEP_RUNS=1 STEP_LIMIT=150 STEP_LIBS="railcc nccl-4x4" \
      timeout $(left 585) bash bench/torch/step.sh 2>&1 | tee "$L/step.txt" | grep -v "^  "
    ;;
  d|e)
    OUT=$L NK_PARTS="quick x2" timeout 240 bash bench/compare/gpu-net-kernel.sh 2>&1 | tee "$L/check.txt" | grep -E "^(PASS|FAIL)|failed"
    echo "== after $(( $(date +%s) - T0 )) s"
    for n in "1 -w 0" "20 -w 5"; do
      for v in default:X=0 nospin:RAILCC_GPU_NET_SPIN_US=0; do
        f="$L/ret-${v%%:*}-n${n%% *}.log"
        env "${v#*:}" RAILCC_GPU_NET_TRACE=1 timeout 120 $PWD/.device/bin/railcc bench all_reduce --device cuda --per-process --gpu-net \
          --ranks 2 -b 128M -e 128M -n $n -c 0 > "$f" 2>&1
        echo "== ${v%%:*} -n $n: exit $?"; grep -E "returned after|rank 0 gpu net trace" "$f"
      done
    done
    if [ "$1" = e ]; then
      old=$(ls -d .device/lib-* 2>/dev/null | head -n 1)
      OUT=$L NK_PARTS=enq NK_ENQ="${old:+railcc $old|RAILCC_LIB=$PWD/$old}" timeout $(left 330) \
        bash bench/compare/gpu-net-kernel.sh 2>&1 | tee "$L/enq.txt"
    fi
    ;;
  f)
    timeout 120 $PWD/.device/bin/railcc bench all_reduce --device cuda --per-process --gpu-net \
      --ranks 2 -b 64K -e 128M -f 2 -n 1 -w 0 -c 0 > "$L/ret-sizes.log" 2>&1
    echo "== sizes: exit $?"; grep -E "returned after" "$L/ret-sizes.log" | grep "out of place"
    OUT=$L/step STEP_LAYOUTS="2x1 2x2" STEP_MODES=small STEP_RUNS=2 STEP_LIMIT=50 STEP_SMALL_SIZES=8,4096 \
      timeout 300 bash bench/torch/step.sh 2>&1 | tee "$L/step.txt" | grep -E "^step|^2x|ratio"
    echo "== after $(( $(date +%s) - T0 )) s"
    OUT=$L NK_PARTS=lat NK_ROUNDS=1 timeout $(left 500) bash bench/compare/gpu-net-kernel.sh 2>&1 | tee "$L/lat.txt" | grep -E "^(railcc|nccl)|^==|failed"
    ;;
  g)
    OUT=$L/ddp STEP_LAYOUTS=2x2 STEP_MODES=ddp STEP_RUNS=3 STEP_LIMIT=90 STEP_LIBS="railcc nccl-4x4" \
      STEP_EXTRA="nospin:RAILCC_GPU_NET_SPIN_US=0" timeout 200 bash bench/torch/step.sh 2>&1 | tee "$L/ddp.txt" | grep -v "^  "
    echo "== after $(( $(date +%s) - T0 )) s"
    OUT=$L/hsdp STEP_LAYOUTS=2x2 STEP_MODES=hsdp STEP_RUNS=2 STEP_LIMIT=90 STEP_LIBS="railcc nccl-4x4" \
      timeout $(left 330) bash bench/torch/step.sh 2>&1 | tee "$L/hsdp.txt" | grep -v "^  "
    ;;
  *) echo "usage: $0 a|b|c|d|e|f|g"; exit 2 ;;
esac
session_end "$1"
