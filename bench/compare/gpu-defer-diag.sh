#!/usr/bin/env bash
# On a GPU machine (after bench/compare/gpu-prepare.sh here; carry .device): where the first
# run of RAILCC_GPU_DEFER=1 (seventeenth session, gpu-x4-s18.sh e) hung. Every per-process
# bench command with it on stopped at its first size: a kernel waited past the timeout for
# its peer, and the process then hung in its close. One 8 B all_reduce of 2 ranks, with the
# launcher's debug lines (took / read every peer's entry / met / enqueued: which step it
# stopped in), every thread's kernel wait channel, and gdb's stacks where gdb exists. Reading:
#  - "took" without "read every peer's entry": the table read (a peer's entry not seen);
#  - "read" without "met": the mapping (cuIpcOpenMemHandle, while the caller's stream waits
#    for the launcher: a driver call that waits for the device would never return);
#  - "met" without "enqueued": a launch or stream call that waited for the device (a launch
#    that grows the per-thread stack waits for earlier work; `GpuCtx::reserve_stack` now
#    raises the limit at init in this mode: its debug line gives the kernels' local bytes
#    and the limit before);
#  - "enqueued" and still a timeout: the launcher's stream never ran its kernel while the
#    caller's stream waited on the word (a wait that blocks a hardware queue both streams
#    share); then the kernel must go on the caller's stream, reading its peers' addresses
#    from mapped memory (see return-time-design.md §6).
# Logs under $OUT: diag.log, threads.log, gdb.log.
set -u
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
mkdir -p "$OUT"
export RAILCC_GPU_DEFER=1 RAILCC_TIMEOUT_MS=6000 RAILCC_LOG=railcc_transport_nvlink=debug
timeout 25 $R bench all_reduce --device cuda --per-process -b 8 -e 8 -n 2 -w 1 -c 1 > "$OUT/diag.log" 2>&1 &
sleep 4
for p in $(pgrep -f "railcc bench" | head -4); do
  echo "== pid $p"
  for t in /proc/$p/task/*; do echo "$(cat $t/comm) $(cat $t/wchan) $(awk '{print $3}' $t/stat)"; done
done > "$OUT/threads.log" 2>&1
if command -v gdb > /dev/null; then
  for p in $(pgrep -f "railcc bench" | tail -2); do
    timeout 10 gdb -p "$p" -batch -ex "thread apply all bt 10" 2>/dev/null | grep -E "^Thread|^#"
  done > "$OUT/gdb.log" 2>&1
else
  echo "no gdb here" > "$OUT/gdb.log"
fi
wait
grep -v "^\s*$" "$OUT/diag.log" | cut -c1-220 | tail -40
head -60 "$OUT/threads.log"
head -c 8000 "$OUT/gdb.log"
