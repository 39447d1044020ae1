#!/usr/bin/env bash
# On nvidia-h100-x4 / nvidia-h200-x4 (after bash bench/compare/gpu-prepare.sh here; carry
# .device): the device calls written in the fifteenth session (which had no device time),
# one part per call. Logs under $OUT/logs,
# tarred to $OUT/logs-<part>.tgz.
#   a  what an idle launch pays for (bench/experiments/launch_cost.sh: launch time by
#      parameter size, idle or busy stream; a host-writing kernel's effect on the caller),
#      then the opt-in table launches (RAILCC_GPU_NET_TABLE=1, never run on a GPU yet):
#      gpu-net-kernel.sh quick and x2 with it, and the idle-stream return times of 64 KB-
#      128 MB with and without it (bench/results/issue31/return-time-design.md), one size a
#      process, and 128 MB with the caller's thread busy before each idle call
#      (--idle-spin-us 300).
#   b  issue 31's large-message and all-to-all figures with this build: gpu-net-kernel.sh
#      perf (2 x 1) and x2perf (2 x 2): all_reduce 8 B-1 GB and alltoall 1 MB and 128 MB,
#      railcc against NCCL's defaults and 4 x 4 sockets, with railcc's pinned memory.
#   c  the 2 x 2 training steps, runs interleaved so the machine's drift hits both (DDP read
#      1.35x and 0.71x NCCL 4 x 4 in two calls last session): DDP three runs, HSDP two.
#   d and e ran at commits 97fedb9 and 1e771f6 (sixteenth session; the start delay and the
#      gate they try were removed after: neither helped, bench/results/issue31/s17/):
#   d  (written in the sixteenth session after part a) launch_cost's host-writing kernel
#      started at once, after 30 us, and a device-writing one; railcc's 8 MB and 128 MB
#      idle return with the staging kernel's first store 0, 10 and 30 us after it starts.
#   e  launch_cost with spinning kernels and a launch held behind a host word; railcc's 16 MB
#      and 128 MB idle return with RAILCC_GPU_NET_GATE_PIECES 0 and 8, each idle call's steps.
# Usage: bash bench/compare/gpu-x4-s17.sh a|b|c|d|e
set -u
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
session_begin
case ${1:-} in
  a)
    OUT=$L timeout 120 bash bench/experiments/launch_cost.sh 2>&1 | tail -n 20
    echo "== after $(( $(date +%s) - T0 )) s"
    OUT=$L NK_PARTS="quick x2" RAILCC_GPU_NET_TABLE=1 timeout 240 bash bench/compare/gpu-net-kernel.sh 2>&1 | tee "$L/check-table.txt" | grep -E "^(PASS|FAIL)|failed"
    echo "== after $(( $(date +%s) - T0 )) s"
    # One process a size, so each trace (printed at close) holds that size's calls alone: the
    # idle return jumps from 12.9 us at 8 MB to 27.8 at 16 MB (last session), and the steps
    # (cut, ring, take, kernel ops, hand) say where.
    for v in 0 1; do
      for b in 64K 8M 16M 128M; do
        f="$L/ret-table$v-$b.log"
        RAILCC_GPU_NET_TABLE=$v RAILCC_GPU_NET_TRACE=1 timeout 60 $PWD/.device/bin/railcc bench all_reduce --device cuda --per-process --gpu-net \
          --ranks 2 -b $b -e $b -n 1 -w 0 -c 1 > "$f" 2>&1
        echo "== RAILCC_GPU_NET_TABLE=$v $b: exit $?"; grep -E "returned after|rank 0 gpu net trace|wrong|FAIL" "$f" | grep -v "in place"
      done
      # The same 128 MB call with the caller's thread busy before it, not woken from the
      # barrier's wait (launch_cost's idle-spin against idle-sleep, in railcc).
      f="$L/ret-table$v-128M-warm.log"
      RAILCC_GPU_NET_TABLE=$v RAILCC_GPU_NET_TRACE=1 timeout 60 $PWD/.device/bin/railcc bench all_reduce --device cuda --per-process --gpu-net \
        --ranks 2 -b 128M -e 128M -n 1 -w 0 -c 1 --idle-spin-us 300 > "$f" 2>&1
      echo "== RAILCC_GPU_NET_TABLE=$v 128M, caller busy before: exit $?"; grep -E "returned after|rank 0 gpu net trace|wrong|FAIL" "$f" | grep -v "in place"
    done
    ;;
  b)
    OUT=$L NK_PARTS="perf x2perf" timeout $(left 570) bash bench/compare/gpu-net-kernel.sh 2>&1 | tee "$L/perf.txt" | grep -vE "^  "
    ;;
  c)
    # 30 steps a run, not 10: the median of more steps moves less with the machine.
    OUT=$L/ddp STEP_LAYOUTS=2x2 STEP_MODES=ddp STEP_RUNS=3 STEP_LIMIT=90 STEP_LIBS="railcc nccl-4x4" STEP_ARGS="--steps 30" \
      timeout 240 bash bench/torch/step.sh 2>&1 | tee "$L/ddp.txt" | grep -v "^  "
    echo "== after $(( $(date +%s) - T0 )) s"
    OUT=$L/hsdp STEP_LAYOUTS=2x2 STEP_MODES=hsdp STEP_RUNS=2 STEP_LIMIT=90 STEP_LIBS="railcc nccl-4x4" STEP_ARGS="--steps 30" \
      timeout $(left 330) bash bench/torch/step.sh 2>&1 | tee "$L/hsdp.txt" | grep -v "^  "
    ;;
  d)
    # Part a (sixteenth session): a kernel that writes host memory as it starts made its own
    # launch 18.6 us against a no-op's 4.2, and railcc's 128 MB launch took 20 us where 8 MB's
    # took 4. Does a start delay (RAILCC_GPU_NET_START_DELAY_NS) give the caller its time back?
    OUT=$L timeout 100 bash bench/experiments/launch_cost.sh 2>&1 | grep -E "kernel, idle|FAIL"
    for round in 1 2; do
      for d in 0 10000 30000; do
        for b in 8M 128M; do
          f="$L/ret-delay$d-$b-$round.log"
          RAILCC_GPU_NET_START_DELAY_NS=$d RAILCC_GPU_NET_TRACE=1 timeout 60 $PWD/.device/bin/railcc bench all_reduce --device cuda --per-process --gpu-net \
            --ranks 2 -b $b -e $b -n 3 -w 0 -c 1 > "$f" 2>&1
          echo "== delay $d ns $b round $round: exit $?"; grep -E "returned after|rank 0 gpu net trace|wrong|FAIL|^ +[0-9]" "$f" | grep -v "in place" | cut -c1-330
        done
      done
    done
    ;;
  e)
    # Part d: the start delay changed nothing and launch_cost's host writer was as slow to
    # launch when it first spun 30 us. Which kernels make their launch slow (spinning ones?),
    # and does holding the stream until the caller returns (RAILCC_GPU_NET_GATE_PIECES)
    # give the time back? TRACE=2: each idle call's own steps (after > 100 us).
    OUT=$L timeout 100 bash bench/experiments/launch_cost.sh 2>&1 | grep -E "kernel, idle|FAIL"
    for round in 1 2 3; do
      for g in 0 8; do
        for b in 16M 128M; do
          f="$L/ret-gate$g-$b-$round.log"
          RAILCC_GPU_NET_GATE_PIECES=$g RAILCC_GPU_NET_TRACE=2 timeout 60 $PWD/.device/bin/railcc bench all_reduce --device cuda --per-process --gpu-net \
            --ranks 2 -b $b -e $b -n 3 -w 0 -c 1 > "$f" 2>&1
          echo "== gate $g $b round $round: exit $?"; grep -E "returned after|wrong|FAIL|^ +[0-9]" "$f" | grep -v "in place" | cut -c1-200
          grep -E "rank 0 gpu net call" "$f" | awk '{ if ($9+0 > 100) print }' | head -5 | cut -c1-300
        done
      done
    done
    ;;
  *) echo "usage: $0 a|b|c|d|e"; exit 2 ;;
esac
session_end "$1"
