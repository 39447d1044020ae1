#!/usr/bin/env bash
# On nvidia-h200-x4 (after bench/compare/gpu-prepare.sh here; carry .device): the eleventh
# session's device calls, one part per call. Logs under $OUT/logs, tarred to $OUT/logs-<part>.tgz.
#   a  the copy paths' code as refactored last session (not yet run): the GPU unit tests, the
#      bench's all_gather checks on the copy engines; then issue 29's expandable-segment cost:
#      the driver queries railcc makes per VMM piece (bench/experiments/vmm_attr_cost.cu), and
#      PyTorch's 256 MB all_reduce through railcc, default allocator and expandable segments,
#      with the host trace (RAILCC_GPU_HOST_TRACE=1: where each rank's host time goes).
#   b  issue 29 on this build: PyTorch's allocators (alloc.sh), default and expandable
#      segments 3 runs each and cudaMallocAsync and the register hook once, railcc and NCCL
#      (the judged figure back to back); sendrecv and alltoall -g 4 -G 10 (item 4).
#   c  issue 29 on this build: a rank 120 s late and the config (test-gpu's config part, in the
#      background), nccl-tests -R 1 and -R 2 (register part), a killed rank then shrink or
#      re-init, and ncclCommAbort from another thread (recover part); if time is left,
#      PyTorch's four allocators on 2 emulated hosts x 2 GPUs through railcc.
#   d  issue 29's PyTorch suite (DDP and FSDP2 losses against NCCL's): the default allocator
#      (railcc and NCCL, one host of 4 and 2 emulated hosts x 2), then railcc under expandable
#      segments, cudaMallocAsync and the register hook while time is left.
#   e  issue 30's write-only reduce-scatter experiment (bench/experiments/ce_reducescatter.sh,
#      NCCL's reduce_scatter beside it); issue 29 on 2 GPUs (GPUs 0 and 1): PyTorch's four
#      allocators through railcc and NCCL.
#   f  early marks in the one-launch send/recv (RAILCC_GPU_P2P_BATCH=3, not yet run): the GPU
#      unit tests (two rounds with them), the six send/recv collectives of nccl-tests with them
#      under mpirun (every dtype, -c 1), then alltoall and sendrecv under mpirun at 1, 16 and
#      256 MB, the default (w1) against them (p3) against NCCL; then issue 29's PyTorch suite
#      with 4 ranks on 2 GPUs (GPUs 0 and 1 shared) through railcc, NCCL's losses from 4 GPUs.
#   g  (issue 29's last check, not yet run) the PyTorch suite with 4 ranks on 2 GPUs (GPUs 0
#      and 1 shared) through railcc under expandable segments, cudaMallocAsync and the register
#      hook, NCCL's losses from 4 GPUs (part f ran the default allocator).
#   h  (the next session's first call) g, then issue 30's LL all-to-all experiment
#      (bench/experiments/ll_alltoall.sh: NCCL's and railcc's alltoall -g beside it).
# Usage: bash bench/compare/gpu-x4-s13.sh a|b|c|d|e|f|g|h
set -u
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
L=$OUT/logs
mkdir -p "$L"
T0=$(date +%s)
case ${1:-} in
  a)
    OUT=$L TEST_GPU_PARTS=unit NG=4 timeout 150 bash scripts/test-gpu.sh 2>&1 | tee "$L/unit.txt" | grep -E "^(FAIL|test-gpu)"
    cp "$L/test-gpu.log" "$L/test-gpu-unit.log" 2>/dev/null
    RAILCC_GPU_AG_COPY_BYTES=1 OUT=$L TEST_GPU_PARTS=bench TEST_GPU_COLLS=all_gather NG=4 timeout 120 bash scripts/test-gpu.sh 2>&1 | tee "$L/bench-ce.txt" | grep -E "^(FAIL|test-gpu)"
    nvcc -O2 -o /tmp/vmm bench/experiments/vmm_attr_cost.cu -lcuda && timeout 60 /tmp/vmm 2>&1 | tee "$L/vmm.txt"
    OUT=$L ALLOC_ITERS=100 ALLOC_SIZES=268435456 ALLOC_WAYS="default expandable" ALLOC_LIBS=railcc RAILCC_GPU_HOST_TRACE=1 \
      timeout 150 bash nccl-compat/tests/torch/alloc.sh > "$L/alloc-trace.txt" 2>&1
    grep -E "^(PASS|FAIL)" "$L/alloc-trace.txt"
    for f in "$L"/torch-alloc-railcc-*.log; do
      echo "== $(basename "$f")"; grep -aE "alloc.py: all_reduce|host trace|coll " "$f" | head -n 24
    done
    ;;
  b)
    nccl_tests_build $NT 0 > "$L/nt-build.txt" 2>&1 &
    ALLOC_ITERS=50 OUT=$L ALLOC_WAYS="default expandable" ALLOC_REPEATS=3 timeout 330 \
      bash nccl-compat/tests/torch/alloc.sh > "$L/alloc.txt" 2>&1
    grep -E "^(PASS|FAIL|info)|failed" "$L/alloc.txt"
    mkdir -p "$L/ways"
    ALLOC_ITERS=20 OUT=$L/ways ALLOC_WAYS="async reghook" timeout 130 \
      bash nccl-compat/tests/torch/alloc.sh > "$L/alloc-ways.txt" 2>&1
    grep -E "^(PASS|FAIL)" "$L/alloc-ways.txt" | grep -v "busbw\|B back"
    wait
    for b in sendrecv alltoall; do
      LD_LIBRARY_PATH="$PWD/.device/lib:/usr/local/cuda/lib64" timeout 40 $NT/build/${b}_perf \
        -b 8 -e 16M -f 8 -n 2 -w 1 -c 1 -g 4 -G 10 -d all > "$L/g10-$b.log" 2>&1
      echo "$b -g 4 -G 10 -d all: exit $?, $(grep -cE "^ +[0-9]" "$L/g10-$b.log") rows, $(grep -E "^ +[0-9]" "$L/g10-$b.log" | awk '$9 != "0" || ($13 != "0" && $13 != "N/A")' | wc -l) with #wrong, $(grep -c "Out of bounds values : 0 OK" "$L/g10-$b.log") OK"
    done
    ;;
  c)
    mkdir -p "$L/config"
    OUT=$L/config LATE_S=120 TEST_GPU_PARTS=config NG=4 timeout 400 bash scripts/test-gpu.sh > "$L/config.txt" 2>&1 &
    cfg=$!
    OUT=$L TEST_GPU_PARTS=register NG=4 timeout 200 bash scripts/test-gpu.sh 2>&1 | tee "$L/register.txt" | grep -E "^(FAIL|test-gpu)"
    cp "$L/test-gpu.log" "$L/test-gpu-register.log" 2>/dev/null
    OUT=$L TEST_GPU_PARTS=recover NG=4 timeout 200 bash scripts/test-gpu.sh 2>&1 | tee "$L/recover.txt" | grep -E "^(PASS|FAIL|test-gpu)"
    cp /tmp/test-gpu-recover.log "$L/" 2>/dev/null
    wait $cfg
    echo "config part: exit $?"; grep -E "^(PASS|FAIL|test-gpu)" "$L/config.txt"
    cp /tmp/test-gpu-config.log "$L/" 2>/dev/null
    left=$((560 - ($(date +%s) - T0)))
    if [ $left -gt 60 ]; then
      OUT=$L ALLOC_LAYOUT=2x2 ALLOC_LIBS=railcc ALLOC_ITERS=10 timeout $left bash nccl-compat/tests/torch/alloc.sh 2>&1 | grep -E "^(PASS|FAIL)" | grep -v "busbw\|B back"
    fi
    ;;
  d)
    OUT=$L SUITE_LIMIT=150 timeout 330 bash nccl-compat/tests/torch/suite.sh > "$L/suite-default.txt" 2>&1
    echo "suite default: exit $?"; grep -E "^(PASS|FAIL)|loss|differ" "$L/suite-default.txt" | head -n 20
    for a in expandable async reghook; do
      left=$((560 - ($(date +%s) - T0)))
      [ $left -gt 150 ] || { echo "not run: suite $a ($left s left)"; continue; }
      OUT=$L SUITE_ALLOC=$a SUITE_LIMIT=120 SUITE_RUNS="railcc-host railcc-2x2" timeout $left \
        bash nccl-compat/tests/torch/suite.sh > "$L/suite-$a.txt" 2>&1
      echo "suite $a: exit $?"; grep -E "^(PASS|FAIL)|loss|differ" "$L/suite-$a.txt" | head -n 12
    done
    ;;
  e)
    OUT=$L timeout 330 bash bench/experiments/ce_reducescatter.sh 2>&1 | tee "$L/ce_rs.txt" | grep -vE "^size .* rs .*blocks  8"
    left=$((570 - ($(date +%s) - T0)))
    CUDA_VISIBLE_DEVICES=0,1 ALLOC_NGPU=2 OUT=$L ALLOC_ITERS=20 timeout $left \
      bash nccl-compat/tests/torch/alloc.sh > "$L/alloc-2gpu.txt" 2>&1
    grep -E "^(PASS|FAIL)|failed" "$L/alloc-2gpu.txt"
    ;;
  f)
    OUT=$L TEST_GPU_PARTS=unit NG=4 timeout 100 bash scripts/test-gpu.sh 2>&1 | tee "$L/unit.txt" | grep -E "^(FAIL|test-gpu)|early marks"
    cp "$L/test-gpu.log" "$L/test-gpu-unit.log" 2>/dev/null
    nccl_tests_build_both
    source bench/compare/tables.sh
    for b in sendrecv alltoall alltoallv scatter gather hypercube; do
      env RAILCC_GPU_P2P_BATCH=3 LD_LIBRARY_PATH="$PWD/.device/lib:/usr/local/cuda/lib64" timeout 60 mpirun -np 4 --allow-run-as-root \
        --oversubscribe -x LD_LIBRARY_PATH -x RAILCC_GPU_P2P_BATCH -x NCCL_NVLS_ENABLE $NTM/build/${b}_perf \
        -b 8 -e 64M -f 32 -n 2 -w 1 -c 1 -d all -g 1 > "$L/p3-$b.log" 2>&1
      rc=$?; why=$(table_problem "$L/p3-$b.log")
      if [ $rc = 0 ] && [ -z "$why" ]; then echo "PASS  p3 $b mpirun -np 4 -d all 8 B-64 MB"; else echo "FAIL  p3 $b: exit $rc $why"; fi
    done
    for c in alltoall sendrecv; do
      mkdir -p "$L/ab-$c"
      OUT=$L/ab-$c AB_MPI=1 AB_COLL=$c AB_BLOCKS=0 AB_VARIANTS="w1 p3" AB_SIZES="-b 1M -e 256M -f 16" timeout 100 \
        bash bench/compare/gpu-blocks-ab.sh 2>&1 | tee "$L/ab-$c.txt"
    done
    mkdir -p "$L/suite2"
    OUT=$L/suite2 SUITE_LIMIT=120 SUITE_RUNS=nccl-host timeout 140 bash nccl-compat/tests/torch/suite.sh > "$L/suite2-nccl.txt" 2>&1
    CUDA_VISIBLE_DEVICES=0,1 OUT=$L/suite2 SUITE_LIMIT=120 SUITE_RUNS=railcc-host timeout 140 \
      bash nccl-compat/tests/torch/suite.sh > "$L/suite2-railcc.txt" 2>&1
    echo "suite, 4 ranks on GPUs 0 and 1: exit $?"; grep -E "^(PASS|FAIL)" "$L/suite2-nccl.txt" "$L/suite2-railcc.txt"
    ;;
  g)
    mkdir -p "$L/suite2"
    OUT=$L/suite2 SUITE_LIMIT=120 SUITE_RUNS=nccl-host timeout 140 bash nccl-compat/tests/torch/suite.sh > "$L/suite2-nccl.txt" 2>&1
    grep -E "^(PASS|FAIL)" "$L/suite2-nccl.txt"
    for a in expandable async reghook; do
      CUDA_VISIBLE_DEVICES=0,1 OUT=$L/suite2 SUITE_ALLOC=$a SUITE_LIMIT=120 SUITE_RUNS=railcc-host timeout 140 \
        bash nccl-compat/tests/torch/suite.sh > "$L/suite2-railcc-$a.txt" 2>&1
      echo "suite $a, 4 ranks on GPUs 0 and 1: exit $?"; grep -E "^(PASS|FAIL)" "$L/suite2-railcc-$a.txt"
    done
    ;;
  h)
    OUT=$OUT bash "$0" g
    mkdir -p "$L/ll"
    OUT=$L/ll timeout 300 bash bench/experiments/ll_alltoall.sh 2>&1 | tee "$L/ll.txt"
    ;;
  *) echo "usage: $0 a|b|c|d|e|f|g|h"; exit 2 ;;
esac
echo "== part ${1} ended after $(($(date +%s) - T0)) s"
cd "$OUT" && tar czf "logs-$1.tgz" logs && rm -rf logs
