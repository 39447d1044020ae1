#!/usr/bin/env bash
# GPU correctness sweep on the device machine (nvidia-h200-x2), both ways of running (one
# process driving both GPUs; one process per GPU through CUDA IPC), every GPU collective:
#  - every dtype and op, 8 B to 8 MB, in and out of place, buffers 8 bytes past their
#    allocation (not 256-byte aligned);
#  - odd sizes (4100 B x16 up to 16 MB), every dtype;
#  - float sum 64 MB, 256 MB and 1 GB; all_reduce of every dtype at 1 GB.
# Full rows in $OUT/gpu-check.log; a summary (each command and its exit status) on stdout.
# Prepare as for gpu-device.sh (build here; .device/bin/railcc; carry .device).
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
LOG="$OUT/gpu-check.log"
: > "$LOG"
step() {
  echo "\$ railcc $*" >> "$LOG"
  timeout 300 $R "$@" >> "$LOG" 2>&1
  local rc=$?
  echo "exit $rc" >> "$LOG"
  printf '%-110s exit %s\n' "$*" "$rc"
}
# The whole sweep takes more than one 10-minute device call on 2 x H200: CHECK_MODES=one and
# CHECK_MODES=per-process split it in two calls.
for way in ${CHECK_MODES:-one per-process}; do
  mode=$([ "$way" = per-process ] && echo --per-process)
  for c in ${CHECK_COLLS:-all_reduce all_gather reduce_scatter broadcast reduce sendrecv}; do
    step bench $c --device cuda $mode -b 8 -e 8M -f 8 -d all -o all -n 1 -w 0 -r 1 --offset 8
    step bench $c --device cuda $mode -b 4100 -e 16M -f 16 -d all -o sum -n 1 -w 0 -r 1
    step bench $c --device cuda $mode -b 64M -e 1G -f 4 -n 1 -w 0 -r 1
  done
done
case " ${CHECK_MODES:-one} " in *" one "*)
  step bench all_reduce --device cuda -b 1G -e 1G -d all -o sum -n 1 -w 0 ;;
esac
echo "rows with #wrong != 0:"
awk '/^ +[0-9]/ && ($9 != 0 || ($13 != 0 && $13 != "N/A"))' "$LOG" | head
grep -h "Out of bounds" "$LOG" | sort | uniq -c
