#!/usr/bin/env bash
# On a GPU machine: mismatched calls across 2 ranks (mismatch.c says what each does) give an
# error naming the difference on every rank within 10 s, the stream finishing; with the usual
# path and with the fixed stage (RAILCC_GPU_STAGE_BYTES, where the error is asynchronous).
# Prepare with bench/compare/gpu-prepare.sh; carry .device. One PASS/FAIL line per case; exit 1
# if any failed. Logs: $OUT/mismatch-<case>.log.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source bench/compare/gpu-env.sh
mkdir -p "$OUT"
export RAILCC_TIMEOUT_MS=${RAILCC_TIMEOUT_MS:-30000}
work=$(mktemp -d)
cp "${LIB:-.device/lib}/libnccl.so.2" "$work/" && ln -s libnccl.so.2 "$work/libnccl.so"
gcc -O1 -I nccl-compat/include -I /usr/local/cuda/include nccl-compat/tests/mismatch/mismatch.c \
  -L "$work" -lnccl -L /usr/local/cuda/lib64 -lcudart -o "$work/mismatch" \
  || { echo "FAIL mismatch: build"; exit 1; }
export LD_LIBRARY_PATH="$work:$LD_LIBRARY_PATH"
FAILS=0
for stage in 0 67108864; do
  for what in count dtype; do
    name="$what-stage$stage" d=$(mktemp -d)
    RAILCC_GPU_STAGE_BYTES=$stage timeout -k 5 60 "$work/mismatch" 1 "$d" "$what" > "$d/rank1.log" 2>&1 &
    p1=$!
    RAILCC_GPU_STAGE_BYTES=$stage timeout -k 5 60 "$work/mismatch" 0 "$d" "$what" > "$d/rank0.log" 2>&1
    rc0=$?
    wait $p1; rc1=$?
    cat "$d"/rank?.log > "$OUT/mismatch-$name.log"
    why=""
    for r in 0 1; do
      line=$(grep -m1 "^mismatch: rank $r: " "$d/rank$r.log")
      case $line in
        *FAIL*|"") why="$why; rank $r: ${line:-no verdict line}" ;;
        # The text must say what differs: both calls described, or the peer's different size.
        *called*|*bytes*|*size*) echo "      $line" | cut -c1-240 ;;
        *) why="$why; rank $r's error does not say what differs: $line" ;;
      esac
    done
    [ $rc0 = 0 ] && [ $rc1 = 0 ] || why="$why; exit $rc0/$rc1"
    if [ -z "$why" ]; then echo "PASS  mismatch $name: both ranks failed naming the difference"
    else echo "FAIL  mismatch $name:${why#;}"; FAILS=$((FAILS + 1)); fi
    rm -rf "$d"
  done
done
rm -rf "$work"
[ "$FAILS" = 0 ]
