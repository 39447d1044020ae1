#!/usr/bin/env bash
# On a GPU machine (issue 30): all_reduce through railcc's libnccl against NCCL in one call,
# nccl-tests `-g NG` (one process), at NCCL's own channel count and at railcc's default, with
# the bulk kernel's narrow and wide loops (RAILCC_GPU_WIDE_LOADS=0/1). NCCL's channel count is
# read from its NCCL_DEBUG=INFO lines ("N coll channels") and given to railcc as
# RAILCC_GPU_MAX_BLOCKS, so the comparison is at NCCL's SM budget. Prints, per size, the busbw
# of each run and its ratio to NCCL's (out of place). Logs: $OUT/blocks-ab-*.log.
# AB_SIZES (default "-b 2M -e 1G -f 4"), AB_ITERS (-n, default 20), NG (default every GPU),
# AB_BLOCKS (default: NCCL's channel count and 0 = one per SM), AB_VARIANTS (default "w0 w1";
# also "pu": every all-reduce above the low-latency kernel on the push kernel,
# RAILCC_GPU_AR_PUSH_BYTES=1, at any block count, RAILCC_GPU_PUSH_MIN_BLOCKS=1; "pt": the same
# with tiles of at most AB_PUSH_SLOT bytes, RAILCC_GPU_PUSH_SLOT_BYTES, default 86016 (what
# the scratch holds on 4 GPUs at 24 blocks; 65536 is the default); "bk": no push kernel,
# RAILCC_GPU_AR_PUSH_BYTES=0; "tm": the bulk kernel with TMA loads, RAILCC_GPU_WIDE_LOADS=2, no
# push kernel; "ts": TMA loads and stores, =3; "p3": send/recv with early marks,
# RAILCC_GPU_P2P_BATCH=3; "ll": small send/recv the low-latency way, RAILCC_GPU_P2P_LL_BYTES=
# AB_LL_BYTES, default 1048576, the default; "l0": without it, RAILCC_GPU_P2P_LL_BYTES=0).
# w0 and w1 keep the defaults otherwise: from 16 MiB at 128 blocks that is the push kernel.
# AB_LIBS: other builds of railcc's libnccl, "NAME=DIR ...", each run like w1 at every block
# count (one machine, one call: a build against a build), with AB_LIB_VARS (VAR=VALUE ...) too. AB_COLL: the nccl-tests collective
# (default all_reduce). A
# second table has the in-place busbw (PyTorch's all_reduce is in place).
# Prepare with bench/compare/gpu-prepare.sh; carry .device.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
source bench/compare/tables.sh
mkdir -p "$OUT"
NG=${NG:-$(nvidia-smi -L | wc -l)}
# AB_MPI=1: one process per GPU (mpirun -np NG, nccl-tests built with MPI) instead of -g NG.
if [ -n "${AB_MPI:-}" ]; then
  nccl_tests_build $NTM 1 || { tail -20 /tmp/nccl-build-1.log; echo "FAIL  nccl-tests build (MPI)"; exit 1; }
  FLAGS="${AB_SIZES:--b 2M -e 1G -f 4} -g 1 -n ${AB_ITERS:-20} -w 5 -c 1"
else
  nccl_tests_build $NT 0 || { tail -20 /tmp/nccl-build-0.log; echo "FAIL  nccl-tests build"; exit 1; }
  FLAGS="${AB_SIZES:--b 2M -e 1G -f 4} -g $NG -n ${AB_ITERS:-20} -w 5 -c 1"
fi
run() {  # NAME LIBDIR [VAR=VALUE...]: one all_reduce_perf run; its log is $OUT/blocks-ab-NAME.log
  local name=$1 lib=$2
  shift 2
  if [ -n "${AB_MPI:-}" ]; then
    local xs=() v
    for v in "$@" LD_LIBRARY_PATH=x NCCL_NVLS_ENABLE=x RAILCC_CACHE_DIR=x; do xs+=(-x "${v%%=*}"); done
    env "$@" LD_LIBRARY_PATH="$lib:/usr/local/cuda/lib64" timeout 300 mpirun -np "$NG" --allow-run-as-root --oversubscribe \
      "${xs[@]}" $NTM/build/${AB_COLL:-all_reduce}_perf $FLAGS > "$OUT/blocks-ab-$name.log" 2>&1
  else
    env "$@" LD_LIBRARY_PATH="$lib:/usr/local/cuda/lib64" timeout 300 $NT/build/${AB_COLL:-all_reduce}_perf $FLAGS \
      > "$OUT/blocks-ab-$name.log" 2>&1
  fi
  local rc=$? why
  why=$(table_problem "$OUT/blocks-ab-$name.log")
  [ "$rc" = 0 ] && [ -z "$why" ] || echo "FAIL  $name: exit $rc ${why}"
}
run nccl "$NCCL_HOME/lib" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT
ch=$(grep -o "[0-9]* coll channels" "$OUT/blocks-ab-nccl.log" | head -n 1 | awk '{print $1}')
echo "NCCL: ${ch:-?} coll channels ($(grep -m1 -o 'NCCL version [0-9.]*' "$OUT/blocks-ab-nccl.log"))"
names=(nccl)
for b in ${AB_BLOCKS:-${ch:-24} 0}; do
  for v in ${AB_VARIANTS:-w0 w1}; do
    case $v in
      w0) vars="RAILCC_GPU_WIDE_LOADS=0" ;;
      w1) vars="RAILCC_GPU_WIDE_LOADS=1" ;;
      pu) vars="RAILCC_GPU_WIDE_LOADS=1 RAILCC_GPU_AR_PUSH_BYTES=1 RAILCC_GPU_PUSH_MIN_BLOCKS=1" ;;
      pt) vars="RAILCC_GPU_WIDE_LOADS=1 RAILCC_GPU_AR_PUSH_BYTES=1 RAILCC_GPU_PUSH_MIN_BLOCKS=1 RAILCC_GPU_PUSH_SLOT_BYTES=${AB_PUSH_SLOT:-86016}" ;;
      bk) vars="RAILCC_GPU_WIDE_LOADS=1 RAILCC_GPU_AR_PUSH_BYTES=0" ;;
      tm) vars="RAILCC_GPU_WIDE_LOADS=2 RAILCC_GPU_AR_PUSH_BYTES=0" ;;
      ts) vars="RAILCC_GPU_WIDE_LOADS=3 RAILCC_GPU_AR_PUSH_BYTES=0" ;;
      ce) vars="RAILCC_GPU_WIDE_LOADS=1 RAILCC_GPU_AG_COPY_BYTES=1" ;;
      ak) vars="RAILCC_GPU_WIDE_LOADS=1 RAILCC_GPU_AG_COPY_BYTES=0" ;;
      ac) vars="RAILCC_GPU_WIDE_LOADS=1 RAILCC_GPU_AR_COPY_BYTES=1" ;;
      p3) vars="RAILCC_GPU_WIDE_LOADS=1 RAILCC_GPU_P2P_BATCH=3" ;;
      ll) vars="RAILCC_GPU_WIDE_LOADS=1 RAILCC_GPU_P2P_LL_BYTES=${AB_LL_BYTES:-1048576}" ;;
      l0) vars="RAILCC_GPU_WIDE_LOADS=1 RAILCC_GPU_P2P_LL_BYTES=0" ;;
      *) echo "FAIL  AB_VARIANTS: unknown $v"; exit 1 ;;
    esac
    run "railcc-b$b-$v" "$PWD/.device/lib" RAILCC_GPU_MAX_BLOCKS=$b $vars
    names+=("railcc-b$b-$v")
  done
  for nl in ${AB_LIBS:-}; do
    run "${nl%%=*}-b$b" "${nl#*=}" RAILCC_GPU_MAX_BLOCKS=$b RAILCC_GPU_WIDE_LOADS=1 ${AB_LIB_VARS:-}
    names+=("${nl%%=*}-b$b")
  done
done
# The table: size, then each run's out-of-place busbw and its ratio to NCCL's.
python3 - "$OUT" "${names[@]}" <<'PY'
import re, sys
out, names = sys.argv[1], sys.argv[2:]
for col, title in ((7, "out of place"), (11, "in place")):
  rows = {}
  for n in names:
    for line in open(f"{out}/blocks-ab-{n}.log", errors="replace"):
        f = line.split()
        if len(f) >= 12 and re.fullmatch(r"\d+", f[0]) and re.fullmatch(r"[\d.]+", f[col]):
            rows.setdefault(int(f[0]), {})[n] = float(f[col])
  print(f"busbw GB/s, {title}")
  print("size        " + "".join(f"{n:>22}" for n in names))
  for size in sorted(rows):
    r = rows[size]
    base = r.get("nccl")
    cells = []
    for n in names:
        v = r.get(n)
        cells.append(f"{'-':>22}" if v is None else f"{v:>10.1f} ({v / base:5.2f}x)" if base else f"{v:>22.1f}")
    print(f"{size:<12}" + "".join(f"{c:>22}" for c in cells))
PY
