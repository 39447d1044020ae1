#!/usr/bin/env bash
# On nvidia-h100-x4 / nvidia-h200-x4 (after bench/compare/gpu-prepare.sh here; carry .device):
# the thirteenth session's device calls, one part per call. Logs under $OUT/logs, tarred to
# $OUT/logs-<part>.tgz.
#   a  the GPU checks of last session's last two commits (p2p_ll::plan, review mends: test-gpu
#      parts unit, p2pll, shrink); issue 31's small all_reduce across emulated hosts (2 x 1,
#      2 x 2), the progress thread that polls before it parks (RAILCC_GPU_NET_SPIN_US=200)
#      against the default and NCCL, in nccl-tests and through PyTorch (step.sh small).
#   b  where railcc's 2 x 2 small all_reduce loses through PyTorch (75 us against NCCL's 40; 25
#      against 34 in nccl-tests): step.sh small on 2 x 2, twice, railcc's default, spin, the
#      flat engine for small calls (RAILCC_GPU_FLAT_BELOW_BYTES=65537), both, and a run with
#      the host and net traces; NCCL, NCCL 4 x 4; then nccl-tests' latency with the same settings.
#   c  b's PyTorch runs again, three each, at 8 B, 4, 16 and 64 KB: 2 x 2 railcc's default, flat
#      and flat with spin; 2 x 1 the default and spin; NCCL and NCCL 4 x 4.
#   d  the new defaults (spin 200 us, the flat engine below 8 KiB, no marker wait on the same
#      stream): every collective 2 x 2 checked (gpu-net-kernel.sh x2), nccl-tests' latency
#      against the old settings and NCCL, PyTorch small 2 x 1 and 2 x 2 three times each.
#   e  the new defaults through PyTorch's suite on 2 x 2 (railcc and NCCL: losses, DeviceMesh,
#      HSDP), then PyTorch small 2 x 1 and 2 x 2 at 8 B and 4 KB, twice each, against NCCL.
# Usage: bash bench/compare/gpu-x4-s15.sh a|b|c|d|e
set -u
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
session_begin
case ${1:-} in
  a)
    OUT=$L TEST_GPU_PARTS="unit p2pll shrink" TEST_GPU_CHECK_LIMIT=60 timeout 330 bash scripts/test-gpu.sh 2>&1 \
      | tee "$L/check.txt" | grep -E "^(FAIL|PASS|test-gpu)|p2p_ll: [0-9]|wrong"
    cp /tmp/test-gpu-unit.log "$L/unit-tests.log" 2>/dev/null
    echo "== after $(( $(date +%s) - T0 )) s"
    OUT=$L NK_PARTS=lat NK_LAT="railcc spin|RAILCC_GPU_NET_SPIN_US=200" timeout $(left 480) \
      bash bench/compare/gpu-net-kernel.sh 2>&1 | tee "$L/lat.txt"
    echo "== after $(( $(date +%s) - T0 )) s"
    [ "$(left 540)" -gt 40 ] && OUT=$L/step STEP_LAYOUTS="2x2 2x1" STEP_MODES=small STEP_RUNS=1 STEP_LIMIT=60 \
      STEP_EXTRA="spin:RAILCC_GPU_NET_SPIN_US=200" timeout $(left 560) bash bench/torch/step.sh 2>&1 | tee "$L/step.txt" | tail -12
    ;;
  b)
    SPIN=RAILCC_GPU_NET_SPIN_US=200 FLAT=RAILCC_GPU_FLAT_BELOW_BYTES=65537
    OUT=$L/step STEP_LAYOUTS="2x2" STEP_MODES=small STEP_RUNS=2 STEP_LIMIT=60 \
      STEP_EXTRA="spin:$SPIN flat:$FLAT flatspin:$FLAT,$SPIN trace:RAILCC_GPU_HOST_TRACE=1,RAILCC_GPU_NET_TRACE=1" \
      timeout 330 bash bench/torch/step.sh 2>&1 | tee "$L/step.txt" | tail -12
    grep -h -A12 "host trace\|gpu net trace" $L/step/step-railcc-trace-2x2-small.log.node0 2>/dev/null | head -60
    echo "== after $(( $(date +%s) - T0 )) s"
    OUT=$L NK_PARTS=lat NK_LAT="railcc spin|$SPIN;railcc flat|$FLAT;railcc flatspin|$FLAT $SPIN" timeout $(left 570) \
      bash bench/compare/gpu-net-kernel.sh 2>&1 | tee "$L/lat.txt" | grep -v "  64 \|  512 "
    ;;
  c)
    SPIN=RAILCC_GPU_NET_SPIN_US=200 FLAT=RAILCC_GPU_FLAT_BELOW_BYTES=65537
    OUT=$L/step2 STEP_LAYOUTS="2x2" STEP_MODES=small STEP_RUNS=3 STEP_LIMIT=60 STEP_SMALL_SIZES=8,4096,16384,65536 \
      STEP_EXTRA="flat:$FLAT flatspin:$FLAT,$SPIN" timeout 300 bash bench/torch/step.sh 2>&1 | tee "$L/step2.txt" | tail -8
    echo "== after $(( $(date +%s) - T0 )) s"
    OUT=$L/step1 STEP_LAYOUTS="2x1" STEP_MODES=small STEP_RUNS=3 STEP_LIMIT=60 STEP_SMALL_SIZES=8,4096,16384,65536 \
      STEP_EXTRA="spin:$SPIN" timeout $(left 570) bash bench/torch/step.sh 2>&1 | tee "$L/step1.txt" | tail -8
    ;;
  d)
    OUT=$L NK_PARTS=x2 timeout 150 bash bench/compare/gpu-net-kernel.sh 2>&1 | tee "$L/x2.txt" | grep -E "^(PASS|FAIL)|failed"
    cp $L/nk-check.log $L/nk-check-x2.log 2>/dev/null
    echo "== after $(( $(date +%s) - T0 )) s"
    OUT=$L NK_PARTS=lat NK_LAT="railcc before|RAILCC_GPU_NET_SPIN_US=0 RAILCC_GPU_FLAT_BELOW_BYTES=0" timeout 120 \
      bash bench/compare/gpu-net-kernel.sh 2>&1 | tee "$L/lat.txt" | grep -v "  64 \|  512 "
    echo "== after $(( $(date +%s) - T0 )) s"
    OUT=$L/step STEP_LAYOUTS="2x1 2x2" STEP_MODES=small STEP_RUNS=3 STEP_LIMIT=60 STEP_SMALL_SIZES=8,4096,65536 \
      timeout $(left 575) bash bench/torch/step.sh 2>&1 | tee "$L/step.txt" | tail -11
    ;;
  e)
    mkdir -p "$L/suite"
    OUT=$L/suite SUITE_RUNS="railcc-2x2 nccl-2x2" SUITE_LIMIT=150 timeout 220 bash nccl-compat/tests/torch/suite.sh > "$L/suite.txt" 2>&1
    echo "suite: exit $?"; grep -E "^(PASS|FAIL)|loss" "$L/suite.txt" | head -12
    echo "== after $(( $(date +%s) - T0 )) s"
    OUT=$L/step STEP_LAYOUTS="2x1 2x2" STEP_MODES=small STEP_RUNS=2 STEP_LIMIT=50 STEP_SMALL_SIZES=8,4096 \
      timeout $(left 370) bash bench/torch/step.sh 2>&1 | tee "$L/step.txt" | grep -E "^step|^2x|ratio"
    ;;
  *) echo "usage: $0 a|b|c|d|e"; exit 2 ;;
esac
session_end "$1"
