#!/usr/bin/env bash
# Every GPU correctness test, on a machine with NVIDIA GPUs (2 x H200: device kind
# nvidia-h200-x2). Prepare where cargo is: `bash bench/compare/gpu-prepare.sh` (builds and
# stages .device/: railcc, libnccl.so.2, the unit-test binaries, nccl-tests' source); then,
# from the repository root on the GPU machine: `bash scripts/test-gpu.sh`.
#  unit   the railcc-cuda and transport-nvlink unit tests, with a driver (discovery, NVRTC,
#         dma-buf export, f32 accumulation of f16/bf16 in one kernel): a SKIP line there is a
#         failure;
#  bench  railcc bench --device cuda, one process driving every GPU and one process per GPU:
#         every collective, dtype and op (exact inputs checked on the GPU, and once on the
#         host; buffers offset 8 and 3 bytes), random inputs
#         (--fill random, error bound), CUDA graphs (-G: results checked after the last launch);
#  nccl   nccl-tests against railcc's libnccl.so.2: -g N, -t N and mpirun -np N, -d all, -o all,
#         and -G 10;
#  shared 2 and 4 ranks sharing GPU 0 on one host (mpirun -np N, NCCL_TESTS_DEVICE=0): the
#         per-process path on a one-GPU machine (send/recv by CUDA IPC for any rank count),
#         -d all (fp8), -o all (mulsum), -G 10;
#  shrink ncclCommShrink, 3 MPI ranks (nccl-compat/tests/mpi/shrink.sh);
#  split  torch new_group/split_group through ncclCommSplit (nccl-compat/tests/torch/split.sh);
#  config libnccl honours RAILCC_TIMEOUT_MS and RAILCC_CACHE_DIR=off, one process driving two
#         GPUs and one process per GPU, and waits without a deadline when it is unset
#         (nccl-compat/tests/config/config_env.sh);
#  alloc  libnccl with buffers from any allocator: cudaMalloc, VMM pieces with and without
#         shareable handles, cudaMallocAsync, ncclMemAlloc (nccl-compat/tests/alloc/alloc.sh,
#         railcc's library and NCCL's), and PyTorch's allocators through torchrun
#         (nccl-compat/tests/torch/alloc.sh);
#  p2pbatch the send/recv collectives of nccl-tests with RAILCC_GPU_P2P_BATCH=1 (batch kernels;
#         TEST_GPU_P2P_BATCH=2: in one launch),
#         -g N, -t N, mpirun -np N, eager and -G 10;
#  p2pll  the send/recv collectives of nccl-tests with RAILCC_GPU_P2P_LL_BYTES=1048576
#         (TEST_GPU_P2P_LL_BYTES; small messages by railcc_cuda::p2p_ll), mpirun -np N, eager
#         and -G 10, and 4 ranks sharing GPU 0; mixed groups (nccl-compat/tests/mpi/p2p_mixed.sh);
#         sizes that disagree (nccl-compat/tests/mpi/p2p_size.sh);
#  register nccl-tests with buffer registration (-R 1: ncclCommRegister) and symmetric windows
#         (-R 2: ncclMemAlloc + ncclCommWindowRegister), -d all, -g N and mpirun -np N;
#  recover after a killed rank the survivors fail within 1 s naming it, then shrink or re-init
#         in the same processes (one host and 2 emulated hosts x 2), and ncclCommAbort from
#         another thread stops waiting kernels within 1 s (nccl-compat/tests/recover/recover.sh).
#  push   (the default from 16 MiB on 4 GPUs or more; the other parts stay under it) the
#         bench's all_reduce checks with every all-reduce on the push kernel (the low-latency
#         one off), one process and --per-process, every dtype and op, --offset 8, --fill
#         random, -G 3, and at 3 blocks (many tiles a block: the slots' reuse);
#         TEST_GPU_PUSH_CHECKS picks some of "blocks3 offset random graphs".
#  mismatch mismatched counts and dtypes across 2 ranks fail on both, naming the difference,
#         the stream finishing, with and without the fixed stage, and at the low-latency
#         size with and without RAILCC_GPU_LL_NO_WAIT (nccl-compat/tests/mismatch/mismatch.sh);
#  stage  the bench's per-process all_reduce on every GPU at the low-latency sizes with the
#         default (no meeting), then its checks with RAILCC_GPU_STAGE_BYTES=67108864 (calls
#         through the fixed stage, proc/stage.rs): all_reduce, all_gather, reduce_scatter, 2
#         ranks and every GPU, every dtype and op, --offset 8, random inputs, -G 3.
#  late   the bench's per-process checks with RAILCC_GPU_LATE_ARGS=1 (kernels enqueued
#         before their peers arrive, behind a stream wait for their arguments, which the
#         launcher writes later, proc/late.rs): every
#         collective on every GPU and all_reduce on 2, every dtype and op, 8 B-32 MB,
#         --offset 8; random inputs with -G 3 (captured calls take the usual path between
#         late ones); =2 (the push kernel's late form too) on all_reduce, also at 3 blocks with
#         every all-reduce pushed, and all_reduce, reduce_scatter, all_gather on 2 emulated
#         hosts (all with RAILCC_GPU_LATE_WAIT_US=0: every call late);
#         all_reduce and all_gather at the default wait (either form, call by call); then
#         mismatch's late cases and recover's abort and kill cases with it; then latemix.
#  latespin late arguments without the stream wait (RAILCC_GPU_LATE_GATE=0: kernels wait on
#         their SMs; every call late):
#         all_reduce every dtype and op --offset 8, four collectives with random inputs and
#         -G 3, all_reduce at the default wait; mismatch's late cases; recover's abort and kill.
#  latemix (also in late) nccl-tests under mpirun with RAILCC_GPU_LATE_ARGS=2, half the ranks
#         always late and half never, each half's host trace showing its way.
# A check passes when its command exits 0, prints "Out of bounds values : 0 OK" for every table,
# and no row has a #wrong other than 0. One line per check, then "test-gpu: N passed, M failed";
# exit status 1 if any failed. Without a CUDA driver: a SKIP line, exit 0.
# TEST_GPU_PARTS="unit bench nccl p2pbatch p2pll register shared shrink split config alloc recover mismatch stage late latemix latespin" picks parts (one 10-minute device call may not hold them all),
# TEST_GPU_COLLS the bench's collectives, TEST_GPU_P2PBATCH_BINS and TEST_GPU_SHARED_BINS those
# parts' nccl-tests, RAILCC_BIN another railcc binary;
# logs under $OUT (default /tmp/out): test-gpu.log (every line of every check).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
LOG="$OUT/test-gpu.log"
if ! ldconfig -p 2>/dev/null | grep -q "libcuda.so.1" && ! nvidia-smi -L >/dev/null 2>&1 \
    && ! [ -e /dev/nvidia0 ] && ! [ -e /proc/driver/nvidia/version ]; then
  echo "SKIP scripts/test-gpu.sh: no CUDA driver on this machine (libcuda.so.1 not found); GPU tests run on a GPU machine"
  exit 0
fi
[ -x .device/bin/railcc ] || { echo "test-gpu: .device/bin/railcc missing: run bench/compare/gpu-prepare.sh where cargo is, and carry .device"; exit 1; }
# Binaries staged from other sources would test code that is not this tree's.
if [ -z "${RAILCC_BIN:-}" ] && [ "$(cat .device/STAMP 2>/dev/null)" != "$(bash scripts/source-stamp.sh)" ]; then
  echo "test-gpu: FAILED: .device/ was built from other sources than this tree (stamp $(cat .device/STAMP 2>/dev/null || echo none), tree $(bash scripts/source-stamp.sh)): run bench/compare/gpu-prepare.sh again"
  exit 1
fi
source bench/compare/gpu-env.sh
source bench/compare/tables.sh
R=${RAILCC_BIN:-$R}   # another railcc binary (to see a broken build fail these checks)
export RAILCC_TIMEOUT_MS=30000
NG=${NG:-$(nvidia-smi -L | wc -l)}
PARTS=${TEST_GPU_PARTS:-unit bench push nccl p2pbatch p2pll register shared shrink split config alloc recover mismatch stage late}
# TEST_GPU_WAYS: the bench and push parts run one process driving every GPU (one) and one
# process per GPU (per-process); default both.
MODES=$(echo "${TEST_GPU_WAYS:-one per-process}" | sed 's/per-process/--per-process/')
PASSED=0 FAILED=0 FAILS=""
: > "$LOG"

# verdict LABEL STATUS FILE: counts one check. FILE holds its output.
verdict() {
  local label=$1 rc=$2 f=$3 why=""
  local tables oks rows wrong
  tables=$(grep -c "Out of bounds values" "$f")
  oks=$(grep -c "Out of bounds values : 0 OK" "$f")
  rows=$(table_rows "$f")
  wrong=$(wrong_rows "$f")
  if [ "$rc" != 0 ]; then why="exit $rc"
  elif [ "${4:-table}" = table ] && { [ "$tables" = 0 ] || [ "$oks" != "$tables" ]; }; then why="out of bounds: $oks of $tables tables OK"
  elif [ "${4:-table}" = table ] && [ "$rows" = 0 ]; then why="no result rows"
  elif [ "$wrong" != 0 ]; then why="$wrong rows with #wrong != 0"
  fi
  { echo "== $label"; cat "$f"; echo "== $label: exit $rc, ${why:-pass}"; } >> "$LOG"
  if [ -z "$why" ]; then
    PASSED=$((PASSED + 1)); printf 'PASS  %-100s %s rows\n' "$label" "$rows"
  else
    FAILED=$((FAILED + 1)); FAILS="$FAILS; $label ($why)"; printf 'FAIL  %-100s %s\n' "$label" "$why"
  fi
}

# check LABEL CMD...: runs CMD (TEST_GPU_CHECK_LIMIT seconds, default 600, at most) and counts
# its verdict. A TERM to this script (an outer timeout) stops the check's command too: left
# running, it wrote into the next check's log.
CHILD=
trap '[ -n "$CHILD" ] && kill -TERM "$CHILD" 2>/dev/null; echo "test-gpu: stopped from outside ($PASSED passed, $FAILED failed so far)"; exit 143' TERM INT
check() {
  local label=$1 rc; shift
  timeout -k 5 "${TEST_GPU_CHECK_LIMIT:-600}" "$@" > /tmp/test-gpu-one.log 2>&1 &
  CHILD=$!
  wait "$CHILD"; rc=$?
  CHILD=
  verdict "$label" $rc /tmp/test-gpu-one.log
}

case " $PARTS " in *" unit "*)
  # Every GPU test must run here, not skip: a skipped test would count as a pass. One binary
  # per crate (the CUDA layer's, the peer-to-peer transport's); the first failure counts.
  : > /tmp/test-gpu-unit.log
  rc=0
  for t in railcc-cuda-tests railcc-nvlink-tests; do
    if [ -x .device/bin/$t ]; then
      timeout 300 .device/bin/$t --test-threads 1 --nocapture >> /tmp/test-gpu-unit.log 2>&1
      r=$?
    else
      echo ".device/bin/$t missing: run bench/compare/gpu-prepare.sh again" >> /tmp/test-gpu-unit.log; r=96
    fi
    [ $rc != 0 ] || rc=$r
  done
  # The bench's GPU check of results against the host's (collectives' test, run alone).
  if [ -x .device/bin/railcc-collectives-tests ]; then
    timeout 300 .device/bin/railcc-collectives-tests the_gpu_counts_what_the_host_counts --test-threads 1 --nocapture >> /tmp/test-gpu-unit.log 2>&1
    r=$?
  else
    echo ".device/bin/railcc-collectives-tests missing: run bench/compare/gpu-prepare.sh again" >> /tmp/test-gpu-unit.log; r=96
  fi
  [ $rc != 0 ] || rc=$r
  if [ $rc = 0 ] && grep -q "SKIP" /tmp/test-gpu-unit.log; then rc=99; echo "a GPU test skipped on a GPU machine" >> /tmp/test-gpu-unit.log; fi
  for line in "wide accumulation bfloat16" "fp8 f8e5m2 max: 0 of 65536" "scale kernel: f32 host" \
      "p2p batch kernels: 18 messages one way and 2 the other, 2 rounds, then 16 and 2 (staged) in one launch each with a copy to itself, 2 rounds, then 2 more with early marks, 0 bytes wrong" \
      "p2p_ll: 19 messages of 0 B to 1 MiB both ways at once, and a copy to itself each round, then one in place each way: 0 bytes wrong" \
      "p2p_ll: 100 bytes sent, 200 expected: Some((0, 100))" \
      "p2p_ll: 500000 bytes sent, 1048576 expected: Some((0, 500000))" \
      "p2p_ll: 1048576 bytes sent, 300000 expected: Some((0, 1048576))" \
      "disagree with the host" " 0 differ from the bulk kernel"; do
    grep -q "$line" /tmp/test-gpu-unit.log || rc=98
  done
  verdict "unit: cuda and transport-nvlink tests with a driver (wide accumulation, NVRTC, dma-buf)" $rc /tmp/test-gpu-unit.log notable
  grep -E "wide accumulation|fp8 f8|scale kernel|p2p batch|p2p_ll|GPU check of results|TMA bulk kernel|test result" /tmp/test-gpu-unit.log | sed 's/^/      /'
  # libnccl from C with a driver: ncclCommInitAll over the GPUs must work (CI checks the
  # clean error without one).
  timeout 120 bash nccl-compat/tests/c_api.sh .device/lib driver "$NG" > /tmp/test-gpu-capi.log 2>&1
  rc=$?
  grep -q "c_api: ok" /tmp/test-gpu-capi.log || rc=${rc/#0/97}
  grep -q "non-blocking init of" /tmp/test-gpu-capi.log || rc=${rc/#0/97}
  verdict "unit: libnccl's C API with a driver (nccl-compat/tests/c_api.sh driver)" $rc /tmp/test-gpu-capi.log notable
;; esac

case " $PARTS " in *" bench "*)
  for mode in $MODES; do
    mode=${mode#one}; way=${mode:-"one process"}
    for c in ${TEST_GPU_COLLS:-all_reduce all_gather reduce_scatter broadcast reduce sendrecv}; do
      check "bench $c $way: every dtype and op, 8 B-2 MB, --offset 8" \
        $R bench $c --device cuda $mode -b 8 -e 2M -f 8 -d all -o all -n 1 -w 0 -r 1 --offset 8
      check "bench $c $way: --fill random, every dtype and op, 4100 B-1 MB" \
        $R bench $c --device cuda $mode -b 4100 -e 1M -f 16 -d all -o all -n 1 -w 0 -r 1 --fill random
      check "bench $c $way: -G 3, every dtype and op, 8 B-2 MB" \
        $R bench $c --device cuda $mode -b 8 -e 2M -f 32 -d all -o all -n 4 -w 1 -G 3 -r 1
    done
    # The default checks on the GPU: the host's way once, and an offset off the element size
    # (3 bytes: only the one-byte types may start there, as in CUDA; the host makes their
    # inputs, the GPU checks).
    check "bench all_reduce $way: --check-on host, every dtype and op, 8 B-2 MB" \
      $R bench all_reduce --device cuda $mode -b 8 -e 2M -f 8 -d all -o all -n 1 -w 0 -r 1 --check-on host
    check "bench reduce_scatter $way: --offset 3, int8 and uint8, every op, 8 B-2 MB" \
      $R bench reduce_scatter --device cuda $mode -b 8 -e 2M -f 8 -d int8,uint8 -o all -n 1 -w 0 -r 1 --offset 3
    check "bench all_reduce $way: -G 10 --fill random, half and bfloat16, 8 B-64 MB" \
      $R bench all_reduce --device cuda $mode -b 8 -e 64M -f 16 -d half,bfloat16 -o sum,avg -n 5 -w 1 -G 10 --fill random
  done
;; esac

case " $PARTS " in *" push "*)
 if [ "$NG" -lt 4 ]; then
  # plan::PUSH_MIN_GPUS: on fewer GPUs every call would take the bulk kernel.
  echo "SKIP  push part: $NG GPUs, the push kernel runs on 4 or more (nothing counted)"
 else
  # TEST_GPU_PUSH_CHECKS picks some of: blocks3 offset random graphs.
  PUSH="env RAILCC_GPU_AR_PUSH_BYTES=1 RAILCC_GPU_LL_MAX_BYTES=0"
  for mode in $MODES; do
    mode=${mode#one}; way=${mode:-"one process"}
    # Every GPU: the push kernel runs on 4 or more (--per-process alone takes 2 ranks).
    [ -n "$mode" ] && mode="$mode --ranks $NG"
    for c in ${TEST_GPU_PUSH_CHECKS:-blocks3 offset random graphs}; do
      case $c in
        blocks3) check "push bench all_reduce $way: 3 blocks, float and bfloat16, sum and avg, 1 KB-64 MB" \
          $PUSH RAILCC_GPU_PUSH_MIN_BLOCKS=1 RAILCC_GPU_MAX_BLOCKS=3 $R bench all_reduce --device cuda $mode -b 1K -e 64M -f 8 -d float,bfloat16 -o sum,avg -n 3 -w 1 -r 1 --fill random ;;
        offset) check "push bench all_reduce $way: every dtype and op, 8 B-8 MB, --offset 8" \
          $PUSH $R bench all_reduce --device cuda $mode -b 8 -e 8M -f 8 -d all -o all -n 1 -w 0 -r 1 --offset 8 ;;
        random) check "push bench all_reduce $way: --fill random, every dtype and op, 4100 B-4 MB" \
          $PUSH $R bench all_reduce --device cuda $mode -b 4100 -e 4M -f 16 -d all -o all -n 1 -w 0 -r 1 --fill random ;;
        graphs) check "push bench all_reduce $way: -G 3, every dtype and op, 8 B-8 MB" \
          $PUSH $R bench all_reduce --device cuda $mode -b 8 -e 8M -f 32 -d all -o all -n 4 -w 1 -G 3 -r 1 ;;
        *) echo "test-gpu: TEST_GPU_PUSH_CHECKS: unknown $c"; exit 2 ;;
      esac
    done
  done
 fi
;; esac

# nccl-tests, built once per machine: plain (-g, -t) and with MPI (mpirun), both at once.
build_nccl_tests() {   # both builds at once (gpu-env.sh's nccl_tests_build)
  nccl_tests_build $NT 0 & b0=$!
  nccl_tests_build $NTM 1 & b1=$!
  wait $b0; s0=$?; wait $b1; s1=$?
  verdict "nccl-tests build (plain and MPI)" $((s0 + s1)) /tmp/nccl-build-1.log notable
}

# late_mix COLL FLAGS: nccl-tests COLL under mpirun -np NG with RAILCC_GPU_LATE_ARGS=2, ranks
# 0..NG/2-1 always late, the others waiting up to 1 s for their peers (the usual form); its
# verdict also needs "coll late launch" in the first half's host traces, never "coll peers
# here", and "coll peers here" in the second half's.
late_mix() {
  local b=$1 F=$2 h=$((NG / 2)) f=/tmp/test-gpu-mix.log rc r line
  local -a waits
  read -ra waits <<< "${TEST_GPU_LATE_MIX_WAITS:-0 1000000}"
  local label="libnccl $b mpirun -np $NG, ranks 0-$((h - 1)) late, the others not (RAILCC_GPU_LATE_ARGS=2): $F"
  env LD_LIBRARY_PATH="$PWD/.device/lib:/usr/local/cuda/lib64" RAILCC_GPU_LATE_ARGS=2 RAILCC_GPU_HOST_TRACE=1 \
    timeout -k 5 "${TEST_GPU_CHECK_LIMIT:-600}" mpirun --allow-run-as-root --oversubscribe \
    -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x RAILCC_CACHE_DIR -x RAILCC_GPU_LATE_ARGS -x RAILCC_GPU_HOST_TRACE \
    -np $h env RAILCC_GPU_LATE_WAIT_US=${waits[0]} $NTM/build/${b}_perf $F -g 1 : \
    -np $((NG - h)) env RAILCC_GPU_LATE_WAIT_US=${waits[1]} $NTM/build/${b}_perf $F -g 1 > $f 2>&1
  rc=$?
  for ((r = 0; r < NG; r++)); do
    line=$(grep "railcc: rank $r gpu host trace" $f | head -1)
    if [ "$r" -lt "$h" ]; then
      [[ $line == *"coll late launch "* && $line != *"coll peers here"* ]] \
        || { echo "late_mix: rank $r's host trace shows no late call, or a call not late: $line"; rc=97; }
    else
      [[ $line == *"coll peers here, not late "* ]] \
        || { echo "late_mix: rank $r's host trace shows no call of the usual form: $line"; rc=97; }
    fi
  done >> $f
  verdict "$label" $rc $f
}

case " $PARTS " in *" nccl "*)
  build_nccl_tests
  OURS="$PWD/.device/lib"
  MPIRUN="mpirun -np $NG --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x RAILCC_CACHE_DIR -x RAILCC_TIMEOUT_MS"
  for b in all_reduce all_gather reduce_scatter broadcast reduce sendrecv alltoall alltoallv scatter gather hypercube; do
    ops=""
    case $b in all_reduce|reduce_scatter|reduce) ops="-o all" ;; esac
    F="-b 8 -e 4M -f 32 -n 2 -w 1 -c 1 -d all $ops"
    check "libnccl $b -g $NG $F" env LD_LIBRARY_PATH="$OURS:/usr/local/cuda/lib64" $NT/build/${b}_perf $F -g $NG
    check "libnccl $b -t $NG $F" env LD_LIBRARY_PATH="$OURS:/usr/local/cuda/lib64" $NT/build/${b}_perf $F -t $NG -g 1
    check "libnccl $b mpirun -np $NG $F" env LD_LIBRARY_PATH="$OURS:/usr/local/cuda/lib64" $MPIRUN $NTM/build/${b}_perf $F -g 1
    check "libnccl $b -g $NG -G 10 $F" env LD_LIBRARY_PATH="$OURS:/usr/local/cuda/lib64" $NT/build/${b}_perf $F -g $NG -G 10
  done
;; esac

case " $PARTS " in *" p2pbatch "*)
  # Sends and receives as batch kernels (RAILCC_GPU_P2P_BATCH=1): one process (-g, -t) and
  # one per GPU (mpirun), eager and -G 10, every dtype.
  build_nccl_tests
  OURS="$PWD/.device/lib"
  MPIRUN="mpirun -np $NG --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x RAILCC_CACHE_DIR -x RAILCC_TIMEOUT_MS -x RAILCC_GPU_P2P_BATCH"
  export RAILCC_GPU_P2P_BATCH=${TEST_GPU_P2P_BATCH:-1}   # 2: one launch per batch
  for b in ${TEST_GPU_P2PBATCH_BINS:-sendrecv alltoall alltoallv scatter gather hypercube}; do
    F="-b 8 -e 64M -f 32 -n 2 -w 1 -c 1 -d all"
    check "libnccl batch $b -g $NG $F" env LD_LIBRARY_PATH="$OURS:/usr/local/cuda/lib64" $NT/build/${b}_perf $F -g $NG
    check "libnccl batch $b -t $NG $F" env LD_LIBRARY_PATH="$OURS:/usr/local/cuda/lib64" $NT/build/${b}_perf $F -t $NG -g 1
    check "libnccl batch $b mpirun -np $NG $F" env LD_LIBRARY_PATH="$OURS:/usr/local/cuda/lib64" $MPIRUN $NTM/build/${b}_perf $F -g 1
    check "libnccl batch $b -g $NG -G 10 $F" env LD_LIBRARY_PATH="$OURS:/usr/local/cuda/lib64" $NT/build/${b}_perf $F -g $NG -G 10
    check "libnccl batch $b mpirun -np $NG -G 10 $F" env LD_LIBRARY_PATH="$OURS:/usr/local/cuda/lib64" $MPIRUN $NTM/build/${b}_perf $F -g 1 -G 10
  done
  unset RAILCC_GPU_P2P_BATCH
;; esac

case " $PARTS " in *" p2pll "*)
  # Small sends and receives the low-latency way (RAILCC_GPU_P2P_LL_BYTES=1048576: every
  # message up to 1 MiB, the larger ones posted beside them in the same groups): one process
  # per GPU (mpirun), eager and -G 10, every dtype; and 4 ranks sharing GPU 0.
  build_nccl_tests
  OURS="$PWD/.device/lib"
  export RAILCC_GPU_P2P_LL_BYTES=${TEST_GPU_P2P_LL_BYTES:-1048576}
  MPIRUN="mpirun -np $NG --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x RAILCC_CACHE_DIR -x RAILCC_TIMEOUT_MS -x RAILCC_GPU_P2P_LL_BYTES"
  for b in ${TEST_GPU_P2PLL_BINS:-sendrecv alltoall alltoallv scatter gather hypercube}; do
    F="-b 8 -e 64M -f 32 -n 2 -w 1 -c 1 -d all"
    check "libnccl p2p_ll $b mpirun -np $NG $F" env LD_LIBRARY_PATH="$OURS:/usr/local/cuda/lib64" $MPIRUN $NTM/build/${b}_perf $F -g 1
    check "libnccl p2p_ll $b mpirun -np $NG -G 10 $F" env LD_LIBRARY_PATH="$OURS:/usr/local/cuda/lib64" $MPIRUN $NTM/build/${b}_perf $F -g 1 -G 10
  done
  for b in sendrecv alltoall; do
    F="-b 8 -e 4M -f 8 -n 2 -w 1 -c 1 -d all"
    check "libnccl p2p_ll $b mpirun -np 4 on GPU 0 $F" env LD_LIBRARY_PATH="$OURS:/usr/local/cuda/lib64" $MPIRUN -x NCCL_TESTS_DEVICE=0 $NTM/build/${b}_perf $F -g 1
  done
  # Groups mixing small and large messages across rounds, and a send of bytes a later wave's
  # receive overwrites (nccl-compat/tests/mpi/p2p_mixed.sh).
  timeout 100 bash nccl-compat/tests/mpi/p2p_mixed.sh > /tmp/test-gpu-p2p-mixed.log 2>&1
  verdict "p2p_ll: groups of small and large messages, 2 MPI ranks (nccl-compat/tests/mpi/p2p_mixed.sh)" $? /tmp/test-gpu-p2p-mixed.log notable
  grep -E "^(PASS|FAIL)|0 wrong|FAIL" /tmp/test-gpu-p2p-mixed.log | sed 's/^/      /'
  # Sizes that disagree: both ranks fail within 5 s naming the sender and its count.
  timeout 100 bash nccl-compat/tests/mpi/p2p_size.sh > /tmp/test-gpu-p2p-size.log 2>&1
  verdict "p2p_ll: send/recv sizes that disagree, 2 MPI ranks (nccl-compat/tests/mpi/p2p_size.sh)" $? /tmp/test-gpu-p2p-size.log notable
  grep -E "^(PASS|FAIL)|after" /tmp/test-gpu-p2p-size.log | sed 's/^/      /'
  unset RAILCC_GPU_P2P_LL_BYTES
;; esac

case " $PARTS " in *" register "*)
  # Registered buffers and symmetric windows, as torch's register_mem_pool and vLLM use them.
  build_nccl_tests
  OURS="$PWD/.device/lib"
  MPIRUN="mpirun -np $NG --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x RAILCC_CACHE_DIR -x RAILCC_TIMEOUT_MS"
  for R in 1 2; do
    for b in all_reduce all_gather reduce_scatter sendrecv alltoall; do
      F="-b 8 -e 64M -f 64 -n 2 -w 1 -c 1 -d all -R $R"
      check "libnccl $b -g $NG $F" env LD_LIBRARY_PATH="$OURS:/usr/local/cuda/lib64" $NT/build/${b}_perf $F -g $NG
      check "libnccl $b mpirun -np $NG $F" env LD_LIBRARY_PATH="$OURS:/usr/local/cuda/lib64" $MPIRUN $NTM/build/${b}_perf $F -g 1
    done
  done
;; esac

case " $PARTS " in *" shared "*)
  # 2 and 4 ranks on one host sharing GPU 0 (NCCL_TESTS_DEVICE=0; the test-only layout of a
  # one-GPU machine): railcc's per-process path (CUDA IPC) with every dtype (fp8 included)
  # and op (premultiplied sums included), eager and -G 10.
  build_nccl_tests
  OURS="$PWD/.device/lib"
  for np in ${TEST_GPU_SHARED_NP:-2 4}; do
    MPIRUN="mpirun -np $np --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x RAILCC_CACHE_DIR -x RAILCC_TIMEOUT_MS -x NCCL_TESTS_DEVICE=0"
    for b in ${TEST_GPU_SHARED_BINS:-all_reduce reduce_scatter reduce all_gather sendrecv alltoall alltoallv scatter gather hypercube}; do
      ops=""
      case $b in all_reduce|reduce_scatter|reduce) ops="-o all" ;; esac
      F="-b 8 -e 4M -f 32 -n 2 -w 1 -c 1 -d all $ops"
      check "libnccl $b mpirun -np $np on GPU 0 $F" env LD_LIBRARY_PATH="$OURS:/usr/local/cuda/lib64" $MPIRUN $NTM/build/${b}_perf $F -g 1
      check "libnccl $b mpirun -np $np on GPU 0 -G 10 $F" env LD_LIBRARY_PATH="$OURS:/usr/local/cuda/lib64" $MPIRUN $NTM/build/${b}_perf $F -g 1 -G 10
    done
  done
;; esac

case " $PARTS " in *" shrink "*)
  # ncclCommShrink: 3 MPI ranks, ranks 0 and 1 shrink away rank 2 and all-reduce.
  timeout 200 bash nccl-compat/tests/mpi/shrink.sh > /tmp/test-gpu-shrink.log 2>&1
  verdict "shrink: ncclCommShrink with 3 MPI ranks (nccl-compat/tests/mpi/shrink.sh)" $? /tmp/test-gpu-shrink.log notable
  grep -E "^(PASS|FAIL)|excluding" /tmp/test-gpu-shrink.log | sed 's/^/      /'
;; esac

case " $PARTS " in *" split "*)
  # torch's new_group/split_group through ncclCommSplit, one host and two emulated hosts.
  timeout 600 bash nccl-compat/tests/torch/split.sh > /tmp/test-gpu-split.log 2>&1
  verdict "split: torch new_group/split_group on railcc's libnccl (nccl-compat/tests/torch/split.sh)" $? /tmp/test-gpu-split.log notable
  grep -E "^(PASS|FAIL)" /tmp/test-gpu-split.log | sed 's/^/      /'
;; esac

case " $PARTS " in *" config "*)
  # libnccl honours RAILCC_TIMEOUT_MS and RAILCC_CACHE_DIR=off both ways of running.
  timeout 420 bash nccl-compat/tests/config/config_env.sh > /tmp/test-gpu-config.log 2>&1
  verdict "config: RAILCC_TIMEOUT_MS and RAILCC_CACHE_DIR=off in libnccl, one process and mpirun (nccl-compat/tests/config/config_env.sh)" $? /tmp/test-gpu-config.log notable
  grep -E "^(PASS|FAIL)" /tmp/test-gpu-config.log | sed 's/^/      /'
;; esac

case " $PARTS " in *" alloc "*)
  # Any device buffer: the C test with railcc's library, then NCCL's (the test's own check).
  timeout 400 bash nccl-compat/tests/alloc/alloc.sh > /tmp/test-gpu-alloc.log 2>&1
  verdict "alloc: libnccl with buffers from every allocator, mpirun -np 2 (nccl-compat/tests/alloc/alloc.sh)" $? /tmp/test-gpu-alloc.log notable
  grep -E "^(PASS|FAIL)" /tmp/test-gpu-alloc.log | sed 's/^/      /'
  NCCL_LIB=$(python3 -c "import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], 'lib'))" 2>/dev/null)
  LIB="$NCCL_LIB" LABEL=nccl timeout 400 bash nccl-compat/tests/alloc/alloc.sh > /tmp/test-gpu-alloc-nccl.log 2>&1
  verdict "alloc: the same test with NCCL $NCCL_LIB (the test itself is right)" $? /tmp/test-gpu-alloc-nccl.log notable
  grep -E "^(PASS|FAIL)" /tmp/test-gpu-alloc-nccl.log | sed 's/^/      /'
  timeout 900 bash nccl-compat/tests/torch/alloc.sh > /tmp/test-gpu-torch-alloc.log 2>&1
  verdict "alloc: PyTorch's allocators through torchrun, railcc and NCCL (nccl-compat/tests/torch/alloc.sh)" $? /tmp/test-gpu-torch-alloc.log notable
  grep -E "^(PASS|FAIL|      )" /tmp/test-gpu-torch-alloc.log
;; esac

case " $PARTS " in *" mismatch "*)
  timeout 400 bash nccl-compat/tests/mismatch/mismatch.sh > /tmp/test-gpu-mismatch.log 2>&1
  verdict "mismatch: counts and dtypes that differ across ranks, with and without the fixed stage (nccl-compat/tests/mismatch/mismatch.sh)" $? /tmp/test-gpu-mismatch.log notable
  grep -E "^(PASS|FAIL|      )" /tmp/test-gpu-mismatch.log
;; esac

case " $PARTS " in *" stage "*)
  # Without the stage: all-reduces small enough for the low-latency kernel launch without a
  # meeting (RAILCC_GPU_LL_NO_WAIT, on by default), the rest meet their peers as before.
  check "bench all_reduce --per-process --ranks $NG, no stage (low-latency calls without a meeting): every dtype and op, 8 B-1 MB, --offset 8" \
    $R bench all_reduce --device cuda --per-process --ranks $NG -b 8 -e 1M -f 8 -d all -o all -n 2 -w 0 -r 1 --offset 8
  for c in all_reduce all_gather reduce_scatter; do
    for nr in 2 $NG; do
      check "bench $c --per-process --ranks $nr with the fixed stage: every dtype and op, 8 B-32 MB, --offset 8" \
        env RAILCC_GPU_STAGE_BYTES=67108864 $R bench $c --device cuda --per-process --ranks $nr -b 8 -e 32M -f 8 -d all -o all -n 1 -w 0 -r 1 --offset 8
      [ "$nr" = "$NG" ] && break
    done
    check "bench $c --per-process with the fixed stage: --fill random, -G 3, 4100 B-8 MB" \
      env RAILCC_GPU_STAGE_BYTES=67108864 $R bench $c --device cuda --per-process -b 4100 -e 8M -f 16 -d float,bfloat16 -o sum,avg -n 4 -w 1 -G 3 -r 1 --fill random
  done
;; esac

case " $PARTS " in *" late "*)
  # RAILCC_GPU_LATE_WAIT_US=0: every call the late way (by default a call whose peers are
  # all there within 10 us takes the kernel's usual form, as the bench's ranks often are).
  late=(env RAILCC_GPU_LATE_ARGS=1 RAILCC_GPU_LATE_WAIT_US=0)
  for c in all_reduce all_gather reduce_scatter broadcast reduce; do
    check "bench $c --per-process --ranks $NG with late kernel arguments: every dtype and op, 8 B-32 MB, --offset 8" \
      "${late[@]}" $R bench $c --device cuda --per-process --ranks $NG -b 8 -e 32M -f 8 -d all -o all -n 1 -w 0 -r 1 --offset 8
    check "bench $c --per-process with late kernel arguments: --fill random, -G 3, 4100 B-8 MB" \
      "${late[@]}" $R bench $c --device cuda --per-process -b 4100 -e 8M -f 16 -d float,bfloat16 -o sum,avg -n 4 -w 1 -G 3 -r 1 --fill random
  done
  check "bench all_reduce --per-process --ranks 2 with late kernel arguments: every dtype and op, 8 B-32 MB, --offset 8" \
    "${late[@]}" $R bench all_reduce --device cuda --per-process --ranks 2 -b 8 -e 32M -f 8 -d all -o all -n 1 -w 0 -r 1 --offset 8
  # =2: the push kernel's late form too (all-reduces from 16 MiB on 4 GPUs or more).
  if [ "$NG" -lt 4 ]; then
    echo "SKIP  late =2 checks: $NG GPUs, the push kernel runs on 4 or more (nothing counted)"
  else
    check "bench all_reduce --per-process --ranks $NG with late arguments on the push kernel too (=2): every dtype and op, 1 KB-64 MB, --offset 8" \
      env RAILCC_GPU_LATE_ARGS=2 RAILCC_GPU_LATE_WAIT_US=0 $R bench all_reduce --device cuda --per-process --ranks $NG -b 1K -e 64M -f 4 -d all -o all -n 1 -w 0 -r 1 --offset 8
    check "bench all_reduce --per-process --ranks $NG with late arguments on the push kernel too (=2): --fill random, every all-reduce pushed at 3 blocks, float and bfloat16, 1 KB-64 MB" \
      env RAILCC_GPU_LATE_ARGS=2 RAILCC_GPU_LATE_WAIT_US=0 RAILCC_GPU_AR_PUSH_BYTES=1 RAILCC_GPU_PUSH_MIN_BLOCKS=1 RAILCC_GPU_LL_MAX_BYTES=0 RAILCC_GPU_MAX_BLOCKS=3 $R bench all_reduce --device cuda --per-process --ranks $NG -b 1K -e 64M -f 8 -d float,bfloat16 -o sum,avg -n 2 -w 1 -r 1 --fill random
    # 2 emulated hosts: each host's part of the hierarchy (its GPUs' steps) late too.
    for c in all_reduce reduce_scatter all_gather; do
      check "bench $c --per-process --ranks $NG --hosts 2 with late kernel arguments: --fill random, float and bfloat16, 4100 B-16 MB" \
        env RAILCC_GPU_LATE_ARGS=2 RAILCC_GPU_LATE_WAIT_US=0 $R bench $c --device cuda --per-process --ranks $NG --hosts 2 -b 4100 -e 16M -f 8 -d float,bfloat16 -o sum,avg -n 2 -w 1 -r 1 --fill random
    done
  fi
  # The default wait: each rank takes the late way or the usual form call by call, alone.
  for c in all_reduce all_gather; do
    check "bench $c --per-process --ranks $NG with late arguments at the default wait (either form per call and rank): --fill random, -G 3, 4100 B-64 MB" \
      env RAILCC_GPU_LATE_ARGS=2 $R bench $c --device cuda --per-process --ranks $NG -b 4100 -e 64M -f 4 -d float,bfloat16 -o sum,avg -n 8 -w 1 -G 3 -r 1 --fill random
  done
  MISMATCH_WAYS=late timeout 200 bash nccl-compat/tests/mismatch/mismatch.sh > /tmp/test-gpu-mismatch.log 2>&1
  verdict "mismatch with late kernel arguments: counts and dtypes that differ across ranks (nccl-compat/tests/mismatch/mismatch.sh)" $? /tmp/test-gpu-mismatch.log notable
  grep -E "^(PASS|FAIL|      )" /tmp/test-gpu-mismatch.log
  RAILCC_GPU_LATE_ARGS=1 RAILCC_GPU_LATE_WAIT_US=0 RECOVER_CASES="${LATE_RECOVER_CASES:-abort:4 kill:host:shrink}" timeout 400 bash nccl-compat/tests/recover/recover.sh > /tmp/test-gpu-recover.log 2>&1
  verdict "recover with late kernel arguments: a killed rank, ncclCommAbort while kernels wait (nccl-compat/tests/recover/recover.sh)" $? /tmp/test-gpu-recover.log notable
  grep -E "^(PASS|FAIL|      )" /tmp/test-gpu-recover.log
;; esac

case " $PARTS " in *" latespin "*)
  # RAILCC_GPU_LATE_GATE=0: no stream wait ahead of a late kernel, whose blocks wait for its
  # arguments on their SMs (the late part runs with the wait, the default); every call late
  # (but one check at the default wait), both late forms.
  gate=(env RAILCC_GPU_LATE_ARGS=2 RAILCC_GPU_LATE_GATE=0 RAILCC_GPU_LATE_WAIT_US=0) what="kernels waiting on their SMs"
  check "bench all_reduce --per-process --ranks $NG, late arguments, $what: every dtype and op, 1 KB-64 MB, --offset 8" \
    "${gate[@]}" $R bench all_reduce --device cuda --per-process --ranks $NG -b 1K -e 64M -f 4 -d all -o all -n 1 -w 0 -r 1 --offset 8
  for c in all_reduce all_gather reduce_scatter broadcast; do
    check "bench $c --per-process --ranks $NG, late arguments, $what: --fill random, -G 3, 4100 B-64 MB" \
      "${gate[@]}" $R bench $c --device cuda --per-process --ranks $NG -b 4100 -e 64M -f 4 -d float,bfloat16 -o sum,avg -n 4 -w 1 -G 3 -r 1 --fill random
  done
  check "bench all_reduce --per-process --ranks $NG, late arguments, $what, at the default wait (either form per call and rank): --fill random, 4100 B-64 MB" \
    env RAILCC_GPU_LATE_ARGS=2 RAILCC_GPU_LATE_GATE=0 $R bench all_reduce --device cuda --per-process --ranks $NG -b 4100 -e 64M -f 4 -d float,bfloat16 -o sum,avg -n 8 -w 1 -G 3 -r 1 --fill random
  RAILCC_GPU_LATE_GATE=0 MISMATCH_WAYS=late timeout 200 bash nccl-compat/tests/mismatch/mismatch.sh > /tmp/test-gpu-mismatch.log 2>&1
  verdict "mismatch with late arguments, $what (nccl-compat/tests/mismatch/mismatch.sh)" $? /tmp/test-gpu-mismatch.log notable
  grep -E "^(PASS|FAIL|      )" /tmp/test-gpu-mismatch.log
  RAILCC_GPU_LATE_ARGS=2 RAILCC_GPU_LATE_GATE=0 RAILCC_GPU_LATE_WAIT_US=0 RECOVER_CASES="${LATE_RECOVER_CASES:-abort:4 kill:host:shrink}" timeout 400 bash nccl-compat/tests/recover/recover.sh > /tmp/test-gpu-recover.log 2>&1
  verdict "recover with late arguments, $what: a killed rank, ncclCommAbort while calls wait (nccl-compat/tests/recover/recover.sh)" $? /tmp/test-gpu-recover.log notable
  grep -E "^(PASS|FAIL|      )" /tmp/test-gpu-recover.log
;; esac

case " $PARTS " in *" late "*|*" latemix "*)
  # Each rank alone: under mpirun the first half of the ranks take the late way always
  # (RAILCC_GPU_LATE_WAIT_US=0), the rest the usual form whenever their peers come within 1 s;
  # nccl-tests checks the results, and each half's host trace must show its way.
  # TEST_GPU_LATE_MIX_WAITS="1000000 0" swaps the halves (to see the trace test fail).
  build_nccl_tests
  for b in all_reduce all_gather; do
    late_mix "$b" "-b 1M -e 64M -f 8 -n 2 -w 1 -c 1 -d all"
  done
;; esac

case " $PARTS " in *" recover "*)
  timeout 900 bash nccl-compat/tests/recover/recover.sh > /tmp/test-gpu-recover.log 2>&1
  verdict "recover: a killed rank, then shrink or re-init in the same processes; ncclCommAbort within 1 s (nccl-compat/tests/recover/recover.sh)" $? /tmp/test-gpu-recover.log notable
  grep -E "^(PASS|FAIL|      )" /tmp/test-gpu-recover.log
;; esac

echo "test-gpu: $PASSED passed, $FAILED failed${FAILS:+ (${FAILS#; })}"
[ "$FAILED" = 0 ]
