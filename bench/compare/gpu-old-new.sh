#!/usr/bin/env bash
# Old build against new build through nccl-tests, in one device call (issue 28's acceptance:
# behaviour unchanged, the new build's nccl-tests table within 3% of the old at every size,
# one process and one per GPU).
#
# What it measures: for each collective in COLLS (default all_reduce all_gather reduce_scatter
# sendrecv alltoall), nccl-tests float (sum where it reduces) 8 B - 1 GB, -f 2 (28 sizes),
# -n 20 -w 5 -c 0, against .device-old/lib/libnccl.so.2 and .device/lib/libnccl.so.2, run
# old, new, old, new (interleaved, so drift of the shared machine hits both). Per size, each
# build's best of two (out of place): below 64 KB the least time, ratio = old time / new time;
# from 64 KB the highest busbw, ratio = new busbw / old busbw; > 1 means the new build is
# faster. Rows below 0.97 say SLOWER, above 1.03 faster (bench/compare/old_new.py).
#   MODE=g    one process driving NG GPUs (nccl-tests -g NG);
#   MODE=mpi  one process per GPU (mpirun -np NG, nccl-tests -g 1, built with MPI=1).
# NG defaults to the GPUs nvidia-smi lists. Each run under `timeout 150`, and none starts past
# DEADLINE_S (default 540) seconds after the script's start: a run cut short that way counts
# as failed, so the tables still come back inside one 10-minute call. Time: nccl-tests' build
# (about 1-2 min, once per machine, reused while warm) plus 20 runs of 5-15 s (start-up,
# kernel compiles, 1 GB buffers; the timed loops are under 1 s), about 4-7 min on
# nvidia-h200-x4 for either mode, so -n 20 -w 5 is kept (N=, W= change them).
# Each build has its own kernel cache (/tmp/railcc-cache-old, -new): a first run may compile
# kernels; best of two hides that.
#
# Output: $OUT/old-new-$MODE.log (every run's raw output, framed "== run BUILD COLL K: cmd" /
# "== exit BUILD COLL K: STATUS"), $OUT/old-new-$MODE.txt (the tables and summaries, also
# printed). Summary lines: "old-new MODE COLL: N sizes, worst ratio X at SIZE, M below 0.97",
# then "old-new MODE: K of T sizes below 0.97". Exit status 0 even when sizes are slower (a
# measurement: judge the noise), 1 when a run failed (exit not 0, timeout, missing rows,
# "Out of bounds values" not "0 OK", #wrong not 0), listed after "FAILED runs".
#
# Prepare here, not on the device:
#   1. the old build: check out the old commit in a worktree (git worktree add /tmp/old <commit>),
#      run bash bench/compare/gpu-prepare.sh there, then here:
#      mkdir -p .device-old && cp -r /tmp/old/.device/bin /tmp/old/.device/lib .device-old/
#      (only bin/railcc and lib/libnccl.so.2 are needed; .device-old/ is ignored);
#   2. the new build: bash bench/compare/gpu-prepare.sh (stages .device/: lib/libnccl.so.2,
#      nccl-tests' source, nccl_baseline.sh).
# Device calls (4 x H200, NVLink between every pair), one per mode:
#   run(kind="nvidia-h200-x4", carry=[".device", ".device-old"], command="MODE=g bash bench/compare/gpu-old-new.sh")
#   run(kind="nvidia-h200-x4", carry=[".device", ".device-old"], command="MODE=mpi bash bench/compare/gpu-old-new.sh")
# Re-read a log without a GPU: OLD_NEW_NG=4 python3 bench/compare/old_new.py LOG MODE 28 COLL...
set -uo pipefail
cd "$(dirname "$0")/../.."
MODE=${MODE:-g}
case $MODE in g|mpi) ;; *) echo "gpu-old-new: MODE must be g or mpi, not '$MODE'"; exit 2 ;; esac
source bench/compare/gpu-env.sh
NT=${OLD_NEW_NT:-$NT}   # another nccl-tests build (a test of this script with stand-ins)
mkdir -p "$OUT"
export RAILCC_TIMEOUT_MS=30000
NG=${NG:-$(nvidia-smi -L | wc -l)}
COLLS=${COLLS:-"all_reduce all_gather reduce_scatter sendrecv alltoall"}
N=${N:-20} W=${W:-5}
MAXB=1073741824
FLAGS="-b 8 -e $MAXB -f 2 -n $N -w $W -c 0 -d float"
ROWS=0; for ((s = 8; s <= MAXB; s *= 2)); do ROWS=$((ROWS + 1)); done
DEADLINE_S=${DEADLINE_S:-540}
LOG="$OUT/old-new-$MODE.log"
TXT="$OUT/old-new-$MODE.txt"
START=$SECONDS
OLDLIB="$PWD/.device-old/lib" NEWLIB="$PWD/.device/lib"
for f in "$OLDLIB/libnccl.so.2" "$NEWLIB/libnccl.so.2"; do
  [ -e "$f" ] || { echo "gpu-old-new: $f missing: stage both builds (see this script's header) and carry .device and .device-old"; exit 1; }
done
{
  echo "gpu-old-new MODE=$MODE NG=$NG COLLS=$COLLS FLAGS=$FLAGS ($ROWS rows a run)"
  nvidia-smi -L 2>&1
  md5sum "$OLDLIB/libnccl.so.2" "$NEWLIB/libnccl.so.2"
} > "$LOG"
if [ "$(md5sum < "$OLDLIB/libnccl.so.2")" = "$(md5sum < "$NEWLIB/libnccl.so.2")" ]; then
  echo "gpu-old-new: note: the old and the new libnccl.so.2 are the same file" | tee -a "$LOG"
fi

# nccl-tests, built once per machine.
if [ $MODE = g ]; then
  BIN=$NT/build
  if [ ! -x "$BIN/all_reduce_perf" ]; then
    NCCL_TESTS_FLAGS="-b 8 -e 8 -g $NG -n 1 -w 0" bash .device/nccl_baseline.sh $NT all_reduce \
      > "$OUT/nccl-tests-build.log" 2>&1 || { cat "$OUT/nccl-tests-build.log"; exit 1; }
  fi
  cmd() { CMD=("$BIN/${1}_perf" $FLAGS -g "$NG"); }
else
  NTM=${OLD_NEW_NTM:-/tmp/nccl-tests-mpi}
  BIN=$NTM/build
  if [ ! -x "$BIN/all_reduce_perf" ]; then
    [ -d $NTM ] || cp -r .device/nccl-tests $NTM
    NCCL_HOME=$(python3 -c "import nvidia.nccl,os;print(nvidia.nccl.__path__[0])")
    [ -e "$NCCL_HOME/lib/libnccl.so" ] || ln -sf "$NCCL_HOME/lib/libnccl.so.2" "$NCCL_HOME/lib/libnccl.so"
    inc=$(mpicc --showme:incdirs 2>/dev/null | awk '{print $1}')
    MPI_HOME=${MPI_HOME:-$(dirname "${inc:-/usr/include}")}
    make -C $NTM -j"$(nproc)" MPI=1 MPI_HOME="$MPI_HOME" CUDA_HOME=/usr/local/cuda NCCL_HOME="$NCCL_HOME" \
        NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" src.build > "$OUT/nccl-tests-build.log" 2>&1 \
      || { tail -30 "$OUT/nccl-tests-build.log"; exit 1; }
  fi
  # The flags scripts/test-gpu.sh uses for one process per GPU.
  MPIRUN="mpirun -np $NG --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x RAILCC_CACHE_DIR -x RAILCC_TIMEOUT_MS"
  cmd() { CMD=($MPIRUN "$BIN/${1}_perf" $FLAGS -g 1); }
fi
echo "gpu-old-new MODE=$MODE: nccl-tests ready after $((SECONDS - START)) s"

# one BUILD COLL K: one run, framed in the log.
one() {
  local build=$1 coll=$2 k=$3 lib=$OLDLIB left t0 rc CMD
  [ "$build" = new ] && lib=$NEWLIB
  left=$((DEADLINE_S - (SECONDS - START)))
  cmd "$coll"
  echo "== run $build $coll $k: LD_LIBRARY_PATH=$lib:/usr/local/cuda/lib64 ${CMD[*]}" >> "$LOG"
  if [ $left -lt 20 ]; then
    echo "== exit $build $coll $k: skipped (past DEADLINE_S=$DEADLINE_S)" >> "$LOG"
    echo "$build $coll #$k: skipped, past DEADLINE_S=$DEADLINE_S"
    return
  fi
  [ $left -gt 150 ] && left=150
  t0=$SECONDS
  LD_LIBRARY_PATH="$lib:/usr/local/cuda/lib64" RAILCC_CACHE_DIR=/tmp/railcc-cache-$build \
    timeout -k 10 $left "${CMD[@]}" >> "$LOG" 2>&1
  rc=$?
  echo "== exit $build $coll $k: $rc ($((SECONDS - t0)) s)" >> "$LOG"
  echo "$build $coll #$k: exit $rc, $((SECONDS - t0)) s"
}

for c in $COLLS; do
  for k in 1 2; do
    one old $c $k
    one new $c $k
  done
done
echo "gpu-old-new MODE=$MODE: runs done after $((SECONDS - START)) s"
OLD_NEW_NG=$NG python3 bench/compare/old_new.py "$LOG" "$MODE" "$ROWS" $COLLS > "$TXT"
rc=$?
cat "$TXT"
exit $rc
