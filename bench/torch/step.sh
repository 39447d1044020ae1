#!/usr/bin/env bash
# On a GPU machine: bench/torch/step.py (a training step, DDP / FSDP2 / HSDP, and the overlap
# benchmark) with railcc's libnccl and with NCCL in the same call, so every ratio compares
# runs of one machine. Layouts (STEP_LAYOUTS): host (one torchrun of 4 ranks, this host),
# 2x2 (two torchrun nodes of 2 ranks, each its own emulated host: NCCL_HOSTID/RAILCC_HOSTID,
# traffic between them over loopback TCP) and 2x1 (the same with one rank each, 2 GPUs). Modes (STEP_MODES, default "ddp fsdp hsdp
# overlap"; "small": all_reduce of 8 B, 64 KB and 1 MB, us per call). Libraries: railcc (LD_PRELOAD .device/lib/libnccl.so.2), nccl (defaults), and
# across hosts also nccl-4x4 (NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4, NCCL's better
# socket setting), and railcc-bN (railcc at most N thread blocks a kernel); STEP_LIBS picks some;
# STEP_NPROC: the host layout's ranks (4; 2 on a 2-GPU machine). STEP_EXTRA="name:VAR=VALUE,VAR=VALUE ..." adds railcc-name runs with those settings;
# STEP_SMALL_SIZES="8,4096,..." the sizes of mode small (default 8, 64 KB, 1 MB). STEP_RUNS repeats each (default 2). Prints one line per run
# ("step: ...") and a table of medians with railcc's ratio to the better NCCL; writes
# $OUT/step.json (every measurement) and $OUT/step-*.log. STEP_ARGS: more arguments for
# step.py on the host layout (e.g. "--width 2048": FSDP shards of 25 MB a rank).
# Prepare with bench/compare/gpu-prepare.sh; carry .device.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
mkdir -p "$OUT"
LIB=$PWD/.device/lib/libnccl.so.2
PY=$PWD/bench/torch/step.py
NGPU=$(nvidia-smi -L | wc -l)
case " ${STEP_LAYOUTS:-host 2x2} " in
  *" host "*|*" 2x2 "*) [ "$NGPU" -ge "${STEP_NPROC:-4}" ] || { echo "step.sh: layouts host and 2x2 need ${STEP_NPROC:-4} GPUs, found $NGPU"; exit 1; } ;;
  *) [ "$NGPU" -ge 2 ] || { echo "step.sh: layout 2x1 needs 2 GPUs, found $NGPU"; exit 1; } ;;
esac
export NCCL_SOCKET_IFNAME=lo RAILCC_SOCKET_IFNAME=lo PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
# STEP_PIN=1: each rank on the CPUs nearest its GPU (else its even share; step.py pin_cpus), every library.
[ "${STEP_PIN:-0}" = 1 ] && export STEP_PIN_SLOTS=$NGPU
LIMIT=${STEP_LIMIT:-300}
fails=0
port=29600

# one LABEL LAYOUT MODE [VAR=VALUE...]: one run; its "step:" lines printed.
one() {
  local label=$1 layout=$2 mode=$3 rc=0 i pids=()
  shift 3
  port=$((port + 1))
  local log="$OUT/step-$label-$layout-$mode.log"
  if [ "$layout" = host ]; then
    env "$@" timeout -k 10 "$LIMIT" python3 -m torch.distributed.run --nproc_per_node "${STEP_NPROC:-4}" \
      --master_addr 127.0.0.1 --master_port $port "$PY" --mode "$mode" --out "$OUT/step" \
      --label "$label-$layout" ${STEP_ARGS:-} ${STEP_SMALL_SIZES:+--small-sizes $STEP_SMALL_SIZES} > "$log" 2>&1 || rc=$?
  else
    local per=2 gpus
    [ "$layout" = 2x1 ] && per=1
    for i in 0 1; do
      gpus=$((per * i)); [ $per = 2 ] && gpus=$((2 * i)),$((2 * i + 1))
      env "$@" CUDA_VISIBLE_DEVICES=$gpus NCCL_HOSTID=host$i RAILCC_HOSTID=host$i \
        timeout -k 10 "$LIMIT" python3 -m torch.distributed.run --nnodes 2 --node_rank $i \
          --nproc_per_node $per --master_addr 127.0.0.1 --master_port $port "$PY" --mode "$mode" \
          --out "$OUT/step" --label "$label-$layout" ${STEP_ARGS:-} ${STEP_SMALL_SIZES:+--small-sizes $STEP_SMALL_SIZES} < /dev/null > "$log.node$i" 2>&1 &
      pids[$i]=$!
    done
    for i in 0 1; do wait "${pids[$i]}" || rc=$?; done
    cat "$log.node0" "$log.node1" > "$log"
  fi
  pkill -9 -f "$PY" 2>/dev/null
  if [ "$rc" != 0 ] || ! grep -q "^step: " "$log"; then
    echo "FAIL  step $label $layout $mode: exit $rc"
    grep -E "Error|error" "$log" | grep -v "NCCL INFO" | head -n 5 | sed 's/^/  /'
    fails=$((fails + 1))
  fi
  grep "^step: " "$log"
}

for r in $(seq 1 "${STEP_RUNS:-2}"); do
  for layout in ${STEP_LAYOUTS:-host 2x2}; do
    for mode in ${STEP_MODES:-ddp fsdp hsdp overlap}; do
      libs=" ${STEP_LIBS:-railcc nccl nccl-4x4} "
      [[ $libs == *" railcc "* ]] && one railcc "$layout" "$mode" LD_PRELOAD="$LIB"
      # railcc-bN: railcc with at most N thread blocks a kernel (RAILCC_GPU_MAX_BLOCKS).
      for v in $libs; do
        [[ $v == railcc-b* ]] && one "$v" "$layout" "$mode" LD_PRELOAD="$LIB" RAILCC_GPU_MAX_BLOCKS="${v#railcc-b}"
      done
      # STEP_EXTRA="name:VAR=VALUE,VAR=VALUE ...": railcc again with those settings, as railcc-name.
      for x in ${STEP_EXTRA:-}; do
        IFS=',' read -r -a xv <<< "${x#*:}"
        one "railcc-${x%%:*}" "$layout" "$mode" LD_PRELOAD="$LIB" "${xv[@]}"
      done
      [[ $libs == *" nccl "* ]] && one nccl "$layout" "$mode"
      [ "$layout" = host ] || [[ $libs != *" nccl-4x4 "* ]] || one nccl-4x4 "$layout" "$mode" NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4
    done
  done
done

# The table: per layout and mode, the median over runs of each library's figure, and
# railcc's ratio to the better (lower) NCCL figure.
python3 - "$OUT/step.json" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    d = json.loads(line)
    lib, layout = d["label"].rsplit("-", 1)
    if d["mode"] == "overlap":
        for k, v in d.items():
            if isinstance(v, dict):
                rows.setdefault((layout, "overlap-" + k), {}).setdefault(lib, []).append(v["step_ms"])
                rows.setdefault((layout, "first-overlap-" + k), {}).setdefault(lib, []).append(v["first_over_longer_alone"])
    elif d["mode"] == "small":
        for k, v in d["us_per_call"].items():
            rows.setdefault((layout, f"small-{k}B-us"), {}).setdefault(lib, []).append(v)
    else:
        rows.setdefault((layout, d["mode"]), {}).setdefault(lib, []).append(d["median_ms"])
        # Issue 31's figure is the median of 10 steps: shown apart when a run took more.
        if len(d.get("times_ms", [])) > 10:
            rows.setdefault((layout, d["mode"] + "-first10"), {}).setdefault(lib, []).append(d["median10_ms"])
extra = sorted({k for libs in rows.values() for k in libs} - {"railcc", "nccl", "nccl-4x4"})
print(f"{'layout':8} {'what':22} {'railcc':>10} {'nccl':>10} {'nccl-4x4':>10} {'ratio':>7}" + "".join(f" {k:>12}" for k in extra))
for (layout, what), libs in sorted(rows.items()):
    med = {k: statistics.median(v) for k, v in libs.items()}
    nccl = [med[k] for k in ("nccl", "nccl-4x4") if k in med]
    ratio = med["railcc"] / min(nccl) if "railcc" in med and nccl and not what.startswith("first") else float("nan")
    cells = "".join(f" {med.get(k, float('nan')):10.2f}" for k in ("railcc", "nccl", "nccl-4x4"))
    print(f"{layout:8} {what:22}{cells} {ratio:7.3f}" + "".join(f" {med.get(k, float('nan')):12.2f}" for k in extra))
print("(ms: median step over each run's steps, then the median over runs; small-*: us per all_reduce; first-overlap: the")
print(" first overlapped step of a fresh process over the longer of its two parts alone)")
PY
[ "$fails" = 0 ] || { echo "step.sh: $fails run(s) failed"; exit 1; }
