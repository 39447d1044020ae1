#!/usr/bin/env bash
# On the device (issue 31 experiment): builds launch_cost.cu and runs it on GPU 0 (what an idle
# stream's launch costs the caller by parameter size; whether a kernel writing host memory
# slows the caller's next steps). Log under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
mkdir -p "$OUT"
# The driver API's rows need libcuda at link time; without it, the rest alone.
nvcc -O2 -arch=sm_90 -DWITH_DRIVER -o /tmp/launch_cost bench/experiments/launch_cost.cu -lcuda \
  || nvcc -O2 -arch=sm_90 -o /tmp/launch_cost bench/experiments/launch_cost.cu \
  || { echo "FAIL  nvcc"; exit 1; }
timeout 120 /tmp/launch_cost 2>&1 | tee "$OUT/launch_cost.log"
