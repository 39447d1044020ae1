#!/usr/bin/env bash
# On a GPU machine: mismatched calls across 2 ranks (mismatch.c says what each does) give an
# error naming the difference on every rank within 10 s, the stream finishing; with the usual
# path and with the fixed stage (RAILCC_GPU_STAGE_BYTES, where the error is asynchronous), and
# for calls small enough for the low-latency kernel, with and without RAILCC_GPU_LL_NO_WAIT
# (its calls launch without a meeting: the error is asynchronous), and with late kernel
# arguments (RAILCC_GPU_LATE_ARGS).
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
# way: "stage<bytes>" (a 1 MiB call), "ll<0|1>" (a 4 KiB call, RAILCC_GPU_LL_NO_WAIT) or
# "late" (a 1 MiB call with RAILCC_GPU_LATE_ARGS=1: the error is asynchronous). MISMATCH_WAYS
# picks some.
for way in ${MISMATCH_WAYS:-stage0 stage67108864 ll0 ll1 late}; do
  case $way in
    stage*) env=(RAILCC_GPU_STAGE_BYTES=${way#stage}) base=262144 ;;
    ll*) env=(RAILCC_GPU_LL_NO_WAIT=${way#ll}) base=1024 ;;
    late) env=(RAILCC_GPU_LATE_ARGS=1 RAILCC_GPU_LATE_WAIT_US=0) base=262144 ;;
  esac
  for what in count dtype; do
    name="$what-$way" d=$(mktemp -d)
    env "${env[@]}" timeout -k 5 60 "$work/mismatch" 1 "$d" "$what" $base > "$d/rank1.log" 2>&1 &
    p1=$!
    env "${env[@]}" timeout -k 5 60 "$work/mismatch" 0 "$d" "$what" $base > "$d/rank0.log" 2>&1
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
