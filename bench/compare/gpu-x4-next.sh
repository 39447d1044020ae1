#!/usr/bin/env bash
# On nvidia-h200-x4 (after bench/compare/gpu-prepare.sh here; carry .device): what the session
# of 2026-11-26 left to run, one part per 10-minute device call. Logs under $OUT (tarred to
# $OUT/logs-<part>.tgz: only a few files come back from a call).
#   a  the unit tests (the fused p2p GPU test), nccl-tests' send/recv collectives with
#      RAILCC_GPU_P2P_BATCH=2, and the default path's in-place alltoallv and hypercube
#      under mpirun;
#   b  the p2p A/B with the fused column; the 1 GB bench with the default (GPU) check, timed;
#   c  bench/torch/step.sh on one host of 4 GPUs (railcc and NCCL);
#   d  the same on 2 emulated hosts x 2 GPUs (railcc, NCCL, NCCL 4 x 4 sockets);
#   e  (after the fused launch became the default and took over the staging copies) the
#      unit tests, the send/recv collectives of nccl-tests on the default path, and if they
#      pass the p2p A/B of the one-launch batch at NCCL's channels, at one block per SM, and
#      with no staged sends.
#   f  the unit tests, every nccl-tests binary on the default path (test-gpu's nccl part),
#      the one-launch p2p A/B at one block per SM with and without staging, and the
#      small-message times under mpirun and -g (gpu-small-ab.sh).
#   g  the bench's all_reduce checks (every dtype and op, 8 B-2 MB, both ways of running)
#      with the low-latency kernel up to 512 KB; small all_reduce times with it up to 64 KB
#      and up to 512 KB; the host's time to issue small calls (nccl-tests -C 1).
#   h  (first, next session: the staging kernel after two reviews has not run) the unit
#      tests, the six send/recv collectives of nccl-tests on the default path (one launch)
#      every way, then every nccl-tests binary (test-gpu's nccl part), then the p2p A/B of
#      the default against NCCL.
#   i  where the host's time goes in small calls under mpirun (RAILCC_GPU_HOST_TRACE=1):
#      all_reduce, sendrecv and alltoall, 8 B-32 KB, the trace lines of every rank.
#   j  the default p2p path against NCCL with the smallest chunk at 16, 32 and 64 KiB
#      (RAILCC_GPU_P2P_MIN_CHUNK): 1 MB all-to-all under mpirun is GPU-bound on 12 blocks.
#   k  the FSDP2 and DDP steps on one host, 3 runs each, railcc at its default blocks and at
#      NCCL's 24 (the kernels share the SMs with FSDP's overlapped compute).
#   m  the push all-reduce (RAILCC_GPU_AR_PUSH_BYTES): test-gpu's push part (its checks
#      PUSH_CHECKS, default blocks3: the others passed one process on 2026-11-27); if it passes, all_reduce -g 4 at
#      NCCL's channels and at one block per SM, the bulk kernel (w1) against push (pu) against
#      NCCL, out of place and in place; then PyTorch's all_reduce under the default allocator
#      and expandable segments with push from 16 MiB, 3 repeats, against NCCL (issue 29).
#   q  test-gpu's default parts that the push default (16 MiB) touches: bench, nccl.
#   p  issue 31's small 2 x 2 all_reduce on the flat engine (RAILCC_GPU_FLAT_BELOW_BYTES,
#      bench/results/issue31/small-call-design.md D3): the x2 checks with it at 32 KiB, then
#      gpu-net-kernel's flat part (8 B-64 KB, the hierarchy against it, NCCL) with NK_ROUNDS=3.
#   s  (first, next session) the kernels' first-run compile (37 modules, cubins), timed; the GPU
#      unit tests; all_reduce of this build against the build of 353abf3 on one machine
#      (prepare with PREPARE_OLD=353abf3 bash bench/compare/gpu-prepare.sh).
#   t  test-gpu's bench, push and nccl parts (the default path on the cubin build).
#   u  issue 29's PyTorch allocator figure, each run the median of 100 calls, 3 runs.
#   v  the push kernel at 24 blocks by tile size (32, 64, 84 KiB) against the bulk kernel.
#   w  the TMA bulk kernel: the GPU unit tests, then all_reduce, reduce_scatter, all_gather at 24 blocks,
#      TMA loads and TMA loads and stores against the wide loop.
#   x  s's first-run compile (no A/B), then w, in one call.
#   y  the all-gather on the copy engines: its bench checks, then all_gather against NCCL
#      (Y_VARIANTS, default "w1 ce"; "ak" the kernel), -g 4 and mpirun.
#   z  the all-reduce copy path (RAILCC_GPU_AR_COPY_BYTES): its bench checks, then the A/B.
#   fin  after the review of the copy paths: their checks, all_gather at 24 blocks, PyTorch
#      with cudaMallocAsync and on 2 x 2 emulated hosts.
# Usage: bash bench/compare/gpu-x4-next.sh a|...|z|fin (parts e-l on NG GPUs, default 4)
set -u
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
L=$OUT/logs
mkdir -p "$L"
T0=$(date +%s)
# first_runs: the kernels' first-run compile and load with an empty cache, timed, then a
# second run from the cache (parts s and x).
first_runs() {
  local run s0
  for run in 1 2; do
    s0=$(date +%s%N)
    RAILCC_LOG=railcc_cuda=info timeout 250 $R bench all_reduce --device cuda -b 8 -e 8 -n 1 -w 0 > "$L/warm$run.txt" 2>&1
    echo "run $run (compile and load; cache $([ $run = 1 ] && echo empty || echo full)): exit $? after $((($(date +%s%N) - s0) / 1000000)) ms"
    grep -a -E "NVRTC|kernel modules as" "$L/warm$run.txt" | sed 's/^/    /' | tail -16
  done
}
case ${1:-} in
  a)
    OUT=$L TEST_GPU_PARTS=unit NG=4 timeout 200 bash scripts/test-gpu.sh 2>&1 | tee "$L/unit.txt" | grep -E "^(PASS|FAIL|test-gpu)|p2p batch"
    cp "$L/test-gpu.log" "$L/test-gpu-unit.log" 2>/dev/null
    OUT=$L TEST_GPU_P2P_BATCH=2 TEST_GPU_PARTS=p2pbatch NG=4 timeout 220 bash scripts/test-gpu.sh 2>&1 | tee "$L/p2pbatch-fused.txt" | grep -E "^(FAIL|test-gpu)"
    cp "$L/test-gpu.log" "$L/test-gpu-p2pbatch-fused.log" 2>/dev/null
    OUT=$L TEST_GPU_P2PBATCH_BINS="alltoallv hypercube" TEST_GPU_PARTS=p2pbatch NG=4 timeout 120 bash scripts/test-gpu.sh 2>&1 | tee "$L/p2pbatch-default.txt" | grep -E "^(FAIL|test-gpu)"
    ;;
  b)
    OUT=$L P2P_SIZES="-b 1M -e 256M -f 16" timeout 330 bash bench/compare/gpu-p2p-ab.sh 2>&1 | tee "$L/p2p-ab.txt"
    ( time timeout 100 .device/bin/railcc bench all_reduce --device cuda --gpus 4 -b 1G -e 1G -n 5 ) > "$L/bench-1g-default.txt" 2>&1
    grep -E "^ +[0-9]|real" "$L/bench-1g-default.txt"
    ;;
  c)
    OUT=$L STEP_LAYOUTS=host STEP_RUNS=1 STEP_LIMIT=150 timeout 570 bash bench/torch/step.sh 2>&1 | tee "$L/step-host.txt" | grep -v "^  "
    ;;
  d)
    OUT=$L STEP_LAYOUTS=2x2 STEP_MODES="ddp hsdp overlap" STEP_RUNS=1 STEP_LIMIT=150 timeout 570 bash bench/torch/step.sh 2>&1 | tee "$L/step-2x2.txt" | grep -v "^  "
    ;;
  e)
    OUT=$L TEST_GPU_PARTS=unit NG=${NG:-4} timeout 150 bash scripts/test-gpu.sh 2>&1 | tee "$L/unit.txt" | grep -E "^(PASS|FAIL|test-gpu)|p2p batch"
    cp "$L/test-gpu.log" "$L/test-gpu-unit.log" 2>/dev/null
    OUT=$L TEST_GPU_P2PBATCH_BINS="sendrecv alltoall alltoallv hypercube gather" TEST_GPU_P2P_BATCH=2 TEST_GPU_PARTS=p2pbatch NG=${NG:-4} timeout 260 bash scripts/test-gpu.sh 2>&1 | tee "$L/p2pbatch.txt" | grep -E "^(FAIL|test-gpu)"
    cp "$L/test-gpu.log" "$L/test-gpu-p2pbatch.log" 2>/dev/null
    if grep -q "test-gpu: [0-9]* passed, 0 failed" "$L/p2pbatch.txt"; then
      OUT=$L P2P_RUNS="fused fused-all fused-nostage" P2P_SIZES="-b 1M -e 256M -f 16" timeout 150 bash bench/compare/gpu-p2p-ab.sh 2>&1 | tee "$L/p2p-ab.txt"
    fi
    ;;
  f)
    OUT=$L TEST_GPU_PARTS=unit NG=${NG:-4} timeout 150 bash scripts/test-gpu.sh 2>&1 | tee "$L/unit.txt" | grep -E "^(FAIL|test-gpu)|p2p batch"
    cp "$L/test-gpu.log" "$L/test-gpu-unit.log" 2>/dev/null
    OUT=$L TEST_GPU_PARTS=nccl NG=${NG:-4} timeout 250 bash scripts/test-gpu.sh 2>&1 | tee "$L/nccl.txt" | grep -E "^(FAIL|test-gpu)"
    cp "$L/test-gpu.log" "$L/test-gpu-nccl.log" 2>/dev/null
    OUT=$L NG=${NG:-4} timeout 70 bash bench/compare/gpu-small-ab.sh 2>&1 | tee "$L/small-ab.txt"
    OUT=$L P2P_RUNS="fused-all fused-nostage" P2P_SIZES="-b 1M -e 256M -f 16" timeout 90 bash bench/compare/gpu-p2p-ab.sh 2>&1 | tee "$L/p2p-ab.txt"
    ;;
  g)
    RAILCC_GPU_LL_MAX_BYTES=524288 OUT=$L TEST_GPU_PARTS=bench TEST_GPU_COLLS=all_reduce NG=${NG:-4} timeout 110 bash scripts/test-gpu.sh 2>&1 | tee "$L/bench-ll512.txt" | grep -E "^(PASS|FAIL|test-gpu)"
    cp "$L/test-gpu.log" "$L/test-gpu-bench-ll512.log" 2>/dev/null
    for ll in 65536 524288; do
      RAILCC_GPU_LL_MAX_BYTES=$ll OUT=$L NG=${NG:-4} SMALL_COLLS=all_reduce SMALL_SIZES="-b 8 -e 1M -f 2" SMALL_TAG=-ll$ll timeout 55 bash bench/compare/gpu-small-ab.sh 2>&1 | tee "$L/small-ll$ll.txt"
    done
    OUT=$L NG=${NG:-4} SMALL_EXTRA="-C 1" SMALL_SIZES="-b 8 -e 64K -f 8" SMALL_TAG=-cpu timeout 60 bash bench/compare/gpu-small-ab.sh 2>&1 | tee "$L/small-cpu.txt"
    ;;
  h)
    OUT=$L TEST_GPU_PARTS=unit NG=${NG:-4} timeout 120 bash scripts/test-gpu.sh 2>&1 | tee "$L/unit.txt" | grep -E "^(FAIL|test-gpu)|p2p batch"
    cp "$L/test-gpu.log" "$L/test-gpu-unit.log" 2>/dev/null
    OUT=$L TEST_GPU_P2P_BATCH=2 TEST_GPU_PARTS=p2pbatch NG=${NG:-4} timeout 200 bash scripts/test-gpu.sh 2>&1 | tee "$L/p2pbatch.txt" | grep -E "^(FAIL|test-gpu)"
    cp "$L/test-gpu.log" "$L/test-gpu-p2pbatch.log" 2>/dev/null
    OUT=$L TEST_GPU_PARTS=nccl NG=${NG:-4} timeout 200 bash scripts/test-gpu.sh 2>&1 | tee "$L/nccl.txt" | grep -E "^(FAIL|test-gpu)"
    cp "$L/test-gpu.log" "$L/test-gpu-nccl.log" 2>/dev/null
    OUT=$L P2P_RUNS="fused-all" P2P_SIZES="-b 1M -e 256M -f 16" timeout 60 bash bench/compare/gpu-p2p-ab.sh 2>&1 | tee "$L/p2p-ab.txt"
    ;;
  i)
    nccl_tests_build $NTM 1 || { echo "FAIL  nccl-tests build (MPI)"; exit 1; }
    for c in all_reduce sendrecv alltoall; do
      RAILCC_GPU_HOST_TRACE=1 LD_LIBRARY_PATH="$PWD/.device/lib:/usr/local/cuda/lib64" timeout 60 \
        mpirun -np ${NG:-4} --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x RAILCC_GPU_HOST_TRACE \
        $NTM/build/${c}_perf -b 8 -e 32K -f 8 -n 200 -w 20 -c 0 -g 1 > "$L/host-trace-$c.txt" 2>&1
      echo "== $c (exit $?)"; grep -E "^ +[0-9]|host trace" "$L/host-trace-$c.txt"
    done
    ;;
  j)
    for mc in 16384 32768 65536; do
      mkdir -p "$L/chunk$mc"
      echo "== RAILCC_GPU_P2P_MIN_CHUNK=$mc"
      OUT=$L/chunk$mc P2P_MIN_CHUNK=$mc P2P_RUNS="fused-all" P2P_SIZES="-b 1M -e 16M -f 4" timeout 100 bash bench/compare/gpu-p2p-ab.sh 2>&1 | tee "$L/chunk$mc/p2p-ab.txt"
    done
    ;;
  k)
    for b in 0 24; do
      mkdir -p "$L/blocks$b"
      echo "== RAILCC_GPU_MAX_BLOCKS=$b"
      RAILCC_GPU_MAX_BLOCKS=$b OUT=$L/blocks$b STEP_LAYOUTS=host STEP_MODES="fsdp ddp" STEP_RUNS=3 STEP_LIMIT=120 timeout 280 bash bench/torch/step.sh 2>&1 | tee "$L/blocks$b/step.txt" | grep -v "^  "
    done
    ;;
  m)
    OUT=$L TEST_GPU_PARTS=push TEST_GPU_PUSH_CHECKS="${PUSH_CHECKS:-blocks3}" NG=${NG:-4} timeout 200 bash scripts/test-gpu.sh 2>&1 | tee "$L/push.txt" | grep -E "^(PASS|FAIL|test-gpu)"
    cp "$L/test-gpu.log" "$L/test-gpu-push.log" 2>/dev/null
    if grep -q "test-gpu: [0-9]* passed, 0 failed" "$L/push.txt"; then
      OUT=$L AB_VARIANTS="w1 pu" AB_SIZES="-b 1M -e 1G -f 4" timeout 230 bash bench/compare/gpu-blocks-ab.sh 2>&1 | tee "$L/push-ab.txt"
      RAILCC_GPU_AR_PUSH_BYTES=16777216 OUT=$L ALLOC_WAYS="default expandable" ALLOC_REPEATS=3 timeout $((580 - $(date +%s) + T0)) \
        bash nccl-compat/tests/torch/alloc.sh 2>&1 | tee "$L/alloc-push.txt" | grep -E "^(PASS  rail|FAIL)|failed"
    fi
    ;;
  q)
    OUT=$L TEST_GPU_PARTS="bench nccl" NG=${NG:-4} timeout 560 bash scripts/test-gpu.sh 2>&1 | tee "$L/default.txt" | grep -E "^(FAIL|test-gpu)"
    cp "$L/test-gpu.log" "$L/test-gpu-default.log" 2>/dev/null
    ;;
  p)
    RAILCC_GPU_FLAT_BELOW_BYTES=32768 OUT=$L NK_PARTS=x2 timeout 200 bash bench/compare/gpu-net-kernel.sh 2>&1 | tee "$L/x2-flat.txt" | grep -E "^(PASS|FAIL)"
    if ! grep -q "^FAIL" "$L/x2-flat.txt"; then
      OUT=$L NK_PARTS=flat NK_ROUNDS=3 timeout 200 bash bench/compare/gpu-net-kernel.sh 2>&1 | tee "$L/flat.txt" | tail -25
    fi
    ;;
  s)
    # (first, next session) The kernels as 37 modules compiled to cubins on parallel threads
    # (not yet run on a GPU): the first run's compile timed, and a second run's (the cache);
    # the GPU unit tests (they load every kernel); then all_reduce of this build against the
    # build measured on 2026-11-27 (353abf3, .device/lib-353abf3, the push kernel at
    # 0.99-1.04x NCCL then, the same source read 0.94-0.97x in this session's call 4).
    first_runs
    OUT=$L TEST_GPU_PARTS=unit NG=${NG:-4} timeout 150 bash scripts/test-gpu.sh 2>&1 | tee "$L/unit.txt" | grep -E "^(PASS|FAIL|test-gpu)"
    cp "$L/test-gpu.log" "$L/test-gpu-unit.log" 2>/dev/null
    [ -n "${S_NO_AB:-}" ] || OUT=$L AB_VARIANTS="w1" AB_LIBS="old353=$PWD/.device/lib-353abf3" AB_SIZES="-b 4M -e 1G -f 4" timeout $((570 - $(date +%s) + T0)) bash bench/compare/gpu-blocks-ab.sh 2>&1 | tee "$L/old-new-ab.txt"
    ;;
  t)
    # The default path's correctness on the cubin build: test-gpu's bench, push and nccl parts.
    OUT=$L TEST_GPU_CHECK_LIMIT=120 TEST_GPU_PARTS="bench push nccl" NG=${NG:-4} timeout 570 bash scripts/test-gpu.sh 2>&1 | tee "$L/default.txt" | grep -E "^(FAIL|test-gpu)"
    cp "$L/test-gpu.log" "$L/test-gpu-default.log" 2>/dev/null
    ;;
  u)
    # Issue 29's last figure with more samples: each run's figure the median of 100 timed
    # calls (20 before), 3 runs of each library and allocator interleaved.
    ALLOC_ITERS=100 OUT=$L ALLOC_WAYS="default expandable" ALLOC_REPEATS=3 timeout 560 \
      bash nccl-compat/tests/torch/alloc.sh 2>&1 | tee "$L/alloc.txt" | grep -E "^(PASS  rail|FAIL)|failed|ratio|median"
    ;;
  v)
    # The push kernel at NCCL's 24 blocks by tile size (RAILCC_GPU_PUSH_SLOT_BYTES; the 32 MiB
    # scratch holds 168 KiB there): 32 KiB (the default tile), 64 and 84 KiB, against the bulk
    # kernel (w1) and NCCL. Run on 2026-11-27 with a 64 MiB scratch: 32, 128 and 256 KiB all
    # read below the bulk kernel (bench/results/README.md, ninth session).
    for slot in ${V_SLOTS:-32768 65536 86016}; do
      mkdir -p "$L/slot$slot"
      OUT=$L/slot$slot AB_BLOCKS=24 AB_VARIANTS="$([ $slot = 32768 ] && echo "w1 pt" || echo pt)" AB_PUSH_SLOT=$slot \
        AB_SIZES="-b 16M -e 1G -f 4" timeout 170 bash bench/compare/gpu-blocks-ab.sh 2>&1 | tee "$L/slot$slot/ab.txt"
    done
    ;;
  w)
    # The TMA bulk kernel (RAILCC_GPU_WIDE_LOADS=2, =3): the GPU unit tests (its byte-for-byte
    # test against the bulk kernel among them, loads and loads+stores), then, if they pass,
    # all_reduce at NCCL's 24 blocks, the bulk kernel's wide loop (w1) against TMA loads (tm)
    # and TMA loads and stores (ts), -c 1; then reduce_scatter (one output per GPU) and
    # all_gather (copies: writes only, what 24 blocks stopped at on 2026-11-27) the same way.
    OUT=$L TEST_GPU_PARTS=unit NG=${NG:-4} timeout 100 bash scripts/test-gpu.sh 2>&1 | tee "$L/unit.txt" | grep -E "^(PASS|FAIL|test-gpu)|TMA"
    cp "$L/test-gpu.log" "$L/test-gpu-unit.log" 2>/dev/null
    if grep -q "test-gpu: [0-9]* passed, 0 failed" "$L/unit.txt"; then
      OUT=$L AB_BLOCKS=${W_BLOCKS:-24} AB_VARIANTS="${W_VARIANTS:-w1 tm ts}" AB_SIZES="${W_SIZES:--b 16M -e 1G -f 4}" timeout ${W_LIMIT:-150} \
        bash bench/compare/gpu-blocks-ab.sh 2>&1 | tee "$L/tma-ab.txt"
      for c in reduce_scatter all_gather; do
        mkdir -p "$L/$c"
        OUT=$L/$c AB_COLL=$c AB_BLOCKS=${W_BLOCKS:-24} AB_VARIANTS="w1 ts" AB_SIZES="${W_SIZES:--b 16M -e 1G -f 4}" timeout 100 \
          bash bench/compare/gpu-blocks-ab.sh 2>&1 | tee "$L/tma-$c-ab.txt"
      done
    fi
    ;;
  x)
    # (first, 2026-11-27 second day) s's timed first-run compile of the 53 default modules,
    # then w (the unit tests load every module, the TMA family through load_tma, then the TMA
    # A/B at 24 blocks), in one call.
    first_runs
    W_LIMIT=${W_LIMIT:-140} bash "$0" w
    exit 0
    ;;
  y)
    # The all-gather on the copy engines (RAILCC_GPU_AG_COPY_BYTES; railcc_cuda::copies, not
    # yet run): the bench's all_gather checks both ways of running with it at every size, then
    # if they pass nccl-tests all_gather -c 1 at NCCL's channels and one block per SM, the
    # kernel (w1) against the copy engines (ce), -g 4 and under mpirun.
    RAILCC_GPU_AG_COPY_BYTES=1 OUT=$L TEST_GPU_PARTS=bench TEST_GPU_COLLS=all_gather NG=${NG:-4} timeout 200 bash scripts/test-gpu.sh 2>&1 | tee "$L/bench-ce.txt" | grep -E "^(PASS|FAIL|test-gpu)"
    cp "$L/test-gpu.log" "$L/test-gpu-bench-ce.log" 2>/dev/null
    if grep -q "test-gpu: [0-9]* passed, 0 failed" "$L/bench-ce.txt"; then
      mkdir -p "$L/g" "$L/mpi"
      OUT=$L/g AB_COLL=all_gather AB_BLOCKS="${Y_BLOCKS:-24 0}" AB_VARIANTS="${Y_VARIANTS:-w1 ce}" AB_SIZES="-b 1M -e 1G -f 4" timeout 150 \
        bash bench/compare/gpu-blocks-ab.sh 2>&1 | tee "$L/ag-ab-g.txt"
      OUT=$L/mpi AB_MPI=1 AB_COLL=all_gather AB_BLOCKS="${Y_BLOCKS:-24 0}" AB_VARIANTS="${Y_VARIANTS:-w1 ce}" AB_SIZES="-b 1M -e 1G -f 4" timeout 200 \
        bash bench/compare/gpu-blocks-ab.sh 2>&1 | tee "$L/ag-ab-mpi.txt"
    fi
    ;;
  z)
    # The all-reduce as the bulk kernel into each GPU's own output, then the copy engines
    # (RAILCC_GPU_AR_COPY_BYTES, not yet run): the bench's all_reduce checks both ways with it
    # at every size (no low-latency kernel), then all_reduce -c 1 at NCCL's channels and one
    # block per SM, the default (w1) against it (ac), -g 4 and under mpirun.
    RAILCC_GPU_AR_COPY_BYTES=1 RAILCC_GPU_LL_MAX_BYTES=0 OUT=$L TEST_GPU_PARTS=bench TEST_GPU_COLLS=all_reduce NG=${NG:-4} timeout 200 \
      bash scripts/test-gpu.sh 2>&1 | tee "$L/bench-ac.txt" | grep -E "^(PASS|FAIL|test-gpu)"
    cp "$L/test-gpu.log" "$L/test-gpu-bench-ac.log" 2>/dev/null
    if grep -q "test-gpu: [0-9]* passed, 0 failed" "$L/bench-ac.txt"; then
      mkdir -p "$L/g" "$L/mpi"
      OUT=$L/g AB_BLOCKS="${Z_BLOCKS:-24 0}" AB_VARIANTS="w1 ac" AB_SIZES="-b 4M -e 1G -f 4" timeout 150 \
        bash bench/compare/gpu-blocks-ab.sh 2>&1 | tee "$L/ar-ab-g.txt"
      OUT=$L/mpi AB_MPI=1 AB_BLOCKS="${Z_BLOCKS:-24 0}" AB_VARIANTS="w1 ac" AB_SIZES="-b 4M -e 1G -f 4" timeout 180 \
        bash bench/compare/gpu-blocks-ab.sh 2>&1 | tee "$L/ar-ab-mpi.txt"
    fi
    ;;
  fin)
    # After the review's fixes (the own block forked before the ready barrier, not under
    # capture; the all-reduce copy path only below the push kernel's blocks): the bench's
    # all_gather checks on the copy engines at every size and all_reduce's at 24 blocks, both
    # ways; all_gather -g 4 256 MB-1 GB against NCCL; PyTorch's collectives through railcc
    # with cudaMallocAsync (the bounce path) and on 2 emulated hosts x 2 GPUs (the
    # hierarchy's host part), each checked.
    RAILCC_GPU_AG_COPY_BYTES=1 OUT=$L TEST_GPU_PARTS=bench TEST_GPU_COLLS=all_gather NG=${NG:-4} timeout 120 bash scripts/test-gpu.sh 2>&1 | tee "$L/bench-ce.txt" | grep -E "^(FAIL|test-gpu)"
    for mode in "" --per-process; do
      RAILCC_GPU_MAX_BLOCKS=24 RAILCC_GPU_AR_COPY_BYTES=1 RAILCC_GPU_LL_MAX_BYTES=0 timeout 60 $R bench all_reduce --device cuda $mode \
        -b 8 -e 2M -f 8 -d all -o all -n 1 -w 0 -r 1 --offset 8 > "$L/bench-ac$mode.txt" 2>&1
      echo "bench all_reduce ac ${mode:-one process}: exit $?"; grep -E "^ +[0-9]" "$L/bench-ac$mode.txt" | tail -n 2; tail -n 2 "$L/bench-ac$mode.txt"
    done
    mkdir -p "$L/g"
    OUT=$L/g AB_COLL=all_gather AB_BLOCKS=24 AB_VARIANTS="w1" AB_SIZES="-b 256M -e 1G -f 4" timeout 60 bash bench/compare/gpu-blocks-ab.sh 2>&1 | tee "$L/ag-ab.txt"
    OUT=$L ALLOC_ITERS=20 ALLOC_WAYS=async ALLOC_LIBS=railcc timeout 60 bash nccl-compat/tests/torch/alloc.sh 2>&1 | grep -E "^(PASS|FAIL)" | grep -v "median"
    OUT=$L ALLOC_ITERS=20 ALLOC_LAYOUT=2x2 ALLOC_WAYS=default ALLOC_LIBS=railcc timeout 70 bash nccl-compat/tests/torch/alloc.sh 2>&1 | grep -E "^(PASS|FAIL)" | grep -v "median"
    ;;
  *) echo "usage: $0 a|...|z|fin"; exit 2 ;;
esac
echo "== part ${1} ended after $(($(date +%s) - T0)) s"
cd "$OUT" && tar czf "logs-$1.tgz" logs && rm -rf logs
