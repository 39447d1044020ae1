#!/usr/bin/env bash
# On the device machine (nvidia-h200-x2): GPU buffers over the network transport (TCP over
# loopback here), staged through pinned host memory, as ranks on different machines run.
# Every collective, dtype and op checked; all_reduce timed next to the CUDA IPC path.
# Prepare with bench/compare/gpu-prepare.sh; carry .device. Logs to $OUT/gpu-net.log.
set -uo pipefail
source bench/compare/gpu-env.sh
T="timeout 300"
{
  echo "== railcc topo (the path GPU data takes to the network)"; $R topo | grep -E "^GPU|data to the network"
  for c in all_reduce all_gather reduce_scatter broadcast reduce sendrecv; do
    echo "== $c --gpu-net over tcp: every dtype/op, 8 B to 16 MB, --offset 8"
    $T $R bench $c --device cuda --per-process --gpu-net --transport tcp --ranks 2 \
      -b 8 -e 16M -f 16 -d all -o all -n 1 -w 0 -r 1 --offset 8 | grep -vE '^ +[0-9]'
    echo "exit ${PIPESTATUS[0]}"
  done
  echo "== all_reduce timing: --gpu-net over tcp, then CUDA IPC (--per-process)"
  $T $R bench all_reduce --device cuda --per-process --gpu-net --transport tcp --ranks 2 -b 8 -e 256M -f 8 -n 10 -w 2
  $T $R bench all_reduce --device cuda --per-process --ranks 2 -b 8 -e 256M -f 8 -n 10 -w 2
} > $OUT/gpu-net.log 2>&1
grep -E "^==|^exit|Out of bounds|wrong|^# railcc|data to the network" $OUT/gpu-net.log | head -60
tail -25 $OUT/gpu-net.log
