#!/usr/bin/env bash
# On the device machine (nvidia-h200-x2): railcc topo beside nvidia-smi topo -m, and a
# transport comparison (GPUs over NVLink, host ranks over TCP loopback) with its SVG.
# Prepare with bench/compare/gpu-prepare.sh; carry .device. Logs to $OUT/gpu-topo.log.
set -uo pipefail
source bench/compare/gpu-env.sh
{
  echo "== nvidia-smi topo -m"; nvidia-smi topo -m
  echo "== railcc topo"; timeout 60 $R topo; echo "exit $?"
  echo "== railcc topo --json"; timeout 60 $R topo --json > $OUT/topo.json; echo "exit $?"
  echo "== RAILCC_TOPO_FILE from that JSON (same matrix expected)"
  RAILCC_TOPO_FILE=$OUT/topo.json timeout 60 $R topo | head -12
  echo "== compare nvlink,tcp all_reduce"
  timeout 300 $R bench all_reduce -b 8 -e 256M -f 8 -n 5 -w 2 --compare nvlink,tcp --plot $OUT/compare-all_reduce.svg
  echo "exit $?"
} > $OUT/gpu-topo.log 2>&1
tail -40 $OUT/gpu-topo.log
