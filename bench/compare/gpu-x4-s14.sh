#!/usr/bin/env bash
# On nvidia-h100-x4 / nvidia-h200-x4 (after bench/compare/gpu-prepare.sh here; carry .device):
# the twelfth session's device calls, one part per call. Logs under $OUT/logs, tarred to
# $OUT/logs-<part>.tgz.
#   a  issue 30's small send/recv the low-latency way (railcc_cuda::p2p_ll, not yet run): the
#      GPU unit tests (its two-rank test among them), then alltoall and sendrecv under mpirun
#      -np 4 from 64 B to 16 MB, the default (w1) against RAILCC_GPU_P2P_LL_BYTES=1048576 (ll)
#      against NCCL, every row checked (-c 1).
#   b  the same path's correctness: test-gpu.sh's p2pll part (six send/recv collectives of
#      nccl-tests, mpirun, eager and -G 10, every dtype; 4 ranks sharing GPU 0).
#   c  a's unit tests, b, and a's all-to-all A/B again (after the in-place pairing).
#   d  the part size 32 KiB against 16 KiB (a second build), and the host's time per call.
#   e  p2p_ll on by default: unit tests, PyTorch's suite, issue 30's sizes, shared GPU.
#   f  after the review mends: unit, p2pll (mixed groups), the old build failing, issue 30's table.
#   g  alltoall at 1, 16, 256 MB, three cycles each, -g 4 and mpirun, NCCL and railcc twice.
#   h  issue 29's allocator checks again (alloc.sh) with p2p_ll on by default.
# Usage: bash bench/compare/gpu-x4-s14.sh a|b|c|d|e|f|g|h
set -u
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
L=$OUT/logs
mkdir -p "$L"
T0=$(date +%s)
case ${1:-} in
  a)
    OUT=$L TEST_GPU_PARTS=unit timeout 200 bash scripts/test-gpu.sh 2>&1 | tee "$L/unit.txt" | grep -E "^(FAIL|PASS|test-gpu)|p2p_ll"
    cp "$L/test-gpu.log" "$L/test-gpu-unit.log" 2>/dev/null
    grep -E "p2p_ll|panicked|FAILED" /tmp/test-gpu-unit.log | head -20
    cp /tmp/test-gpu-unit.log "$L/unit-tests.log" 2>/dev/null
    for c in alltoall sendrecv; do
      mkdir -p "$L/ab-$c"
      OUT=$L/ab-$c AB_MPI=1 AB_COLL=$c AB_BLOCKS=0 AB_VARIANTS="w1 ll" AB_ITERS=50 AB_SIZES="-b 64 -e 16M -f 4" timeout 150 \
        bash bench/compare/gpu-blocks-ab.sh 2>&1 | tee "$L/ab-$c.txt"
    done
    ;;
  b)
    OUT=$L TEST_GPU_PARTS=p2pll timeout 500 bash scripts/test-gpu.sh 2>&1 | tee "$L/p2pll.txt" | grep -E "^(FAIL|PASS|test-gpu)|after"
    ;;
  c)
    # a's unit tests (the in-place pairing now), b, then a's all-to-all A/B again.
    OUT=$L TEST_GPU_PARTS=unit timeout 120 bash scripts/test-gpu.sh 2>&1 | tee "$L/unit.txt" | grep -E "^(FAIL|test-gpu)|p2p_ll"
    cp /tmp/test-gpu-unit.log "$L/unit-tests.log" 2>/dev/null
    OUT=$L TEST_GPU_PARTS=p2pll TEST_GPU_CHECK_LIMIT=60 timeout 330 bash scripts/test-gpu.sh 2>&1 | tee "$L/p2pll.txt" | grep -E "^(FAIL|PASS|test-gpu)|after"
    cp "$L/test-gpu.log" "$L/test-gpu-p2pll.log" 2>/dev/null
    mkdir -p "$L/ab-alltoall"
    OUT=$L/ab-alltoall AB_MPI=1 AB_COLL=alltoall AB_BLOCKS=0 AB_VARIANTS="w1 ll" AB_ITERS=50 AB_SIZES="-b 64 -e 16M -f 4" timeout 100 \
      bash bench/compare/gpu-blocks-ab.sh 2>&1 | tee "$L/ab-alltoall.txt"
    ;;
  d)
    # The part size: 32 KiB (this build) against 16 KiB (.device/lib-p16, built with
    # p2p_ll's PART_BYTES = 16 KiB), both with RAILCC_GPU_P2P_LL_BYTES=1048576; then the host's
    # time per call of a 1 MB all-to-all the low-latency way (RAILCC_GPU_HOST_TRACE=1).
    for c in alltoall sendrecv; do
      mkdir -p "$L/ab-$c"
      OUT=$L/ab-$c AB_MPI=1 AB_COLL=$c AB_BLOCKS=0 AB_VARIANTS="w1 ll" AB_LIBS="p16=$PWD/.device/lib-p16" \
        AB_LIB_VARS="RAILCC_GPU_P2P_LL_BYTES=1048576" AB_ITERS=50 AB_SIZES="-b 64 -e 16M -f 4" timeout 150 \
        bash bench/compare/gpu-blocks-ab.sh 2>&1 | tee "$L/ab-$c.txt"
    done
    nccl_tests_build $NTM 1
    for v in 0 1048576; do
      RAILCC_GPU_P2P_LL_BYTES=$v RAILCC_GPU_HOST_TRACE=1 LD_LIBRARY_PATH="$PWD/.device/lib:/usr/local/cuda/lib64" timeout 60 \
        mpirun -np 4 --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x RAILCC_GPU_P2P_LL_BYTES -x RAILCC_GPU_HOST_TRACE \
        -x NCCL_NVLS_ENABLE $NTM/build/alltoall_perf -b 1M -e 1M -n 500 -w 20 -c 0 -g 1 > "$L/trace-ll$v.log" 2>&1
      echo "host trace, RAILCC_GPU_P2P_LL_BYTES=$v: exit $?"; grep -E "^ +1048576|trace|us" "$L/trace-ll$v.log" | head -30
    done
    ;;
  e)
    # p2p_ll on by default (1 MiB, 16 KiB parts): the GPU unit tests; PyTorch's suite (batched
    # p2p at 4 KB-256 MB, DDP and FSDP2) on one host of 4 and 2 emulated hosts x 2, railcc
    # and NCCL; then sendrecv and alltoall under mpirun at 1, 16 and 256 MB (issue 30's
    # sizes) and 64 B-256 KB: the default (w1) against l0 (RAILCC_GPU_P2P_LL_BYTES=0)
    # against NCCL; the shared-GPU send/recv collectives (2 ranks on GPU 0).
    OUT=$L TEST_GPU_PARTS=unit timeout 120 bash scripts/test-gpu.sh 2>&1 | tee "$L/unit.txt" | grep -E "^(FAIL|test-gpu)|p2p_ll: [0-9]"
    cp /tmp/test-gpu-unit.log "$L/unit-tests.log" 2>/dev/null
    mkdir -p "$L/suite"
    OUT=$L/suite SUITE_LIMIT=150 timeout 330 bash nccl-compat/tests/torch/suite.sh > "$L/suite.txt" 2>&1
    echo "suite: exit $?"; grep -E "^(PASS|FAIL)" "$L/suite.txt"
    for c in alltoall sendrecv; do
      for sz in "-b 1M -e 256M -f 16" "-b 64 -e 256K -f 16"; do
        d=$L/ab-$c-$(echo "$sz" | awk '{print $2}')
        mkdir -p "$d"
        OUT=$d AB_MPI=1 AB_COLL=$c AB_BLOCKS=0 AB_VARIANTS="w1 l0" AB_ITERS=50 AB_SIZES="$sz" timeout 100 \
          bash bench/compare/gpu-blocks-ab.sh 2>&1 | tee "$d.txt" | sed -n '1,12p'
      done
    done
    [ $(( $(date +%s) - T0 )) -lt 470 ] && OUT=$L TEST_GPU_PARTS=shared TEST_GPU_SHARED_NP=2 TEST_GPU_CHECK_LIMIT=40 \
      TEST_GPU_SHARED_BINS="sendrecv alltoall alltoallv scatter gather hypercube" timeout $(( 560 - $(date +%s) + T0 )) \
      bash scripts/test-gpu.sh 2>&1 | tee "$L/shared.txt" | grep -E "^(FAIL|PASS|test-gpu)"
    ;;
  f)
    # After the review mends: the GPU unit tests (two-step wrong sizes now), test-gpu's p2pll
    # part (with p2p_mixed.c), p2p_mixed.c against the build before the mends (must FAIL:
    # PREPARE_OLD=9e68893 gpu-prepare.sh), then issue 30's p2p table: sendrecv and alltoall at
    # 1, 16 and 256 MB, -g 4 and mpirun -np 4, railcc's defaults against NCCL.
    OUT=$L TEST_GPU_PARTS=unit timeout 120 bash scripts/test-gpu.sh 2>&1 | tee "$L/unit.txt" | grep -E "^(FAIL|test-gpu)|p2p_ll: [0-9]"
    cp /tmp/test-gpu-unit.log "$L/unit-tests.log" 2>/dev/null
    OUT=$L TEST_GPU_PARTS=p2pll TEST_GPU_CHECK_LIMIT=60 timeout 240 bash scripts/test-gpu.sh 2>&1 | tee "$L/p2pll.txt" | grep -E "^(FAIL|PASS|test-gpu)|after|wrong"
    cp "$L/test-gpu.log" "$L/test-gpu-p2pll.log" 2>/dev/null
    old=$(ls -d .device/lib-* 2>/dev/null | head -n 1)
    if [ -n "$old" ]; then
      P2P_LIB=$old timeout 70 bash nccl-compat/tests/mpi/p2p_mixed.sh > "$L/p2p-mixed-old.txt" 2>&1
      echo "p2p_mixed.sh against $old (the build before the mends; must fail): exit $?"; grep -E "^(PASS|FAIL)|FAIL|wrong" "$L/p2p-mixed-old.txt" | head -5
    fi
    for m in "" 1; do
      for c in sendrecv alltoall; do
        d=$L/ab-$c-mpi$m
        mkdir -p "$d"
        OUT=$d AB_MPI=$m AB_COLL=$c AB_BLOCKS=0 AB_VARIANTS="w1" AB_ITERS=50 AB_SIZES="-b 1M -e 256M -f 16" timeout 60 \
          bash bench/compare/gpu-blocks-ab.sh 2>&1 | tee "$d.txt" | sed -n '1,6p'
      done
    done
    ;;
  g)
    # alltoall at issue 30's sizes, three cycles each (nccl-tests -N 3: every row printed per
    # cycle, so a dip shows as one row): -g 4 and mpirun -np 4, NCCL and railcc alternating.
    nccl_tests_build_both
    for lay in g mpi; do
      for lib in nccl railcc nccl railcc; do
        case $lib in nccl) d="$NCCL_HOME/lib" ;; railcc) d="$PWD/.device/lib" ;; esac
        F="-b 1M -e 256M -f 16 -n 50 -w 5 -c 0 -N 3"
        if [ $lay = g ]; then
          LD_LIBRARY_PATH="$d:/usr/local/cuda/lib64" timeout 60 $NT/build/alltoall_perf $F -g 4 > "$L/a2a-$lay-$lib.log" 2>&1
        else
          LD_LIBRARY_PATH="$d:/usr/local/cuda/lib64" timeout 60 mpirun -np 4 --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH \
            -x NCCL_NVLS_ENABLE $NTM/build/alltoall_perf $F -g 1 > "$L/a2a-$lay-$lib.log" 2>&1
        fi
        echo "alltoall $lay $lib: exit $?"; grep -E "^ +[0-9]" "$L/a2a-$lay-$lib.log" | awk '{print $1, $6, $8}' | tr '\n' ';'; echo
        cat "$L/a2a-$lay-$lib.log" >> "$L/a2a-all.log"
      done
    done
    ;;
  h)
    # Issue 29's allocator checks again with p2p_ll on by default (4 KB batched p2p goes that
    # way now): alloc.sh, one host of 4, railcc and NCCL, four allocators; then 2 x 2 (railcc)
    # while time is left.
    mkdir -p "$L/alloc"
    OUT=$L/alloc timeout 200 bash nccl-compat/tests/torch/alloc.sh 2>&1 | tee "$L/alloc.txt" | grep -E "^(PASS|FAIL)"
    [ $(( $(date +%s) - T0 )) -lt 200 ] && OUT=$L/alloc ALLOC_LAYOUT=2x2 ALLOC_LIBS=railcc timeout $(( 280 - $(date +%s) + T0 )) \
      bash nccl-compat/tests/torch/alloc.sh 2>&1 | tee "$L/alloc-2x2.txt" | grep -E "^(PASS|FAIL)"
    ;;
  *) echo "usage: $0 a|b|c|d|e|f|g|h"; exit 2 ;;
esac
echo "== part ${1} ended after $(($(date +%s) - T0)) s"
cd "$OUT" && tar czf "logs-$1.tgz" logs && rm -rf logs
