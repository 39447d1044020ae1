#!/usr/bin/env bash
# Every test: formatting, lints, the Soft-RoCE VM, multi-rail network namespaces, unit,
# property and multi-process tests, libnccl's C API. Stops at the first failure, non-zero.
# RAILCC_TEST_PARTS picks parts for a quicker look at one of them (default: all, as CI runs):
#   lint  vm  netns  cargo  capi  gpu
set -euo pipefail
cd "$(dirname "$0")/.."
PARTS=" ${RAILCC_TEST_PARTS:-lint vm netns cargo capi gpu} "
part() { [[ "$PARTS" == *" $1 "* ]]; }
RAILCC_SETUP_LINT=1 RAILCC_SETUP_NVRTC=1 bash scripts/setup.sh
# A full run writes about 6 GiB under target/ (debug, release, the VM's disk). Say so up
# front when the disk is short, so a compiler's "No space left on device" has its cause named.
read -r free_kib mount < <(df -Pk . | awk 'NR == 2 { print $4, $6 }')
if [ "${free_kib:-0}" -lt $((8 * 1024 * 1024)) ]; then
  echo "test.sh: warning: only $((free_kib / 1024)) MiB free on $mount; a full run needs about 6 GiB"
fi
SKIPPED=""
if part lint; then
  # Under CI a missing tool is a failure; elsewhere (Debian's cargo has no clippy) a skip,
  # named in the last line.
  for tool in fmt clippy; do
    if ! cargo $tool --version >/dev/null 2>&1; then
      [ -z "${CI:-}" ] || { echo "test.sh: cargo $tool is not installed (CI): FAILED"; exit 1; }
      echo "test.sh: cargo $tool not installed, skipped"; SKIPPED="$SKIPPED $tool"
    fi
  done
  [[ "$SKIPPED" == *fmt* ]] || cargo fmt --all -- --check
  [[ "$SKIPPED" == *clippy* ]] || cargo clippy --all-targets -q -- -D warnings
fi
if part vm; then
  # Soft-RoCE VM smoke test: real verbs on rdma_rxe inside qemu (see tests/rdma-vm/README.md).
  bash tests/rdma-vm/setup.sh
  cargo build -q -p railcc-bench
  bash tests/rdma-vm/vm.sh tests/rdma-vm/smoke.sh target/debug/railcc > target/rdma-vm-smoke.log 2>&1 \
      || { cat target/rdma-vm-smoke.log; echo "rdma-vm smoke: FAILED"; exit 1; }
  grep -aE "ib_write_bw 1 MB|rcvd_pkts|SMOKE" target/rdma-vm-smoke.log
  # The RDMA transport over real verbs: every collective, mismatches, a killed rank, bandwidth.
  # Release binaries: under emulation the ranks share two CPUs with the soft devices.
  cargo build -q --release -p railcc-bench -p railcc-tests --bins
  RAILCC_VM_TIMEOUT=1500 bash tests/rdma-vm/vm.sh tests/rdma-vm/rdma.sh target/release/railcc target/release/railcc-test-rank \
      > target/rdma-vm-test.log 2>&1 || { cat target/rdma-vm-test.log; echo "rdma-vm test: FAILED"; exit 1; }
  grep -aE "ranks|mismatched|kill test|railcc:|rcvd_pkts|dma-buf|RC queue|1 MB|RATIO|RDMA PASS" target/rdma-vm-test.log
  # RDMA rails: two Soft-RoCE ports per rank on two shaped veth rails, one taken down mid-run.
  RAILCC_VM_TIMEOUT=1200 bash tests/rdma-vm/vm.sh tests/rdma-vm/rails.sh target/release/railcc target/release/railcc-test-rank \
      > target/rdma-vm-rails.log 2>&1 || { cat target/rdma-vm-rails.log; echo "rdma-vm rails test: FAILED"; exit 1; }
  grep -aE "over two rails|bytes out|ib_write_bw|RATIO|shares|rail 1 down|^ok|^error|^affinity|RAILS PASS" target/rdma-vm-rails.log
fi
if part netns; then
  # Multi-rail TCP between two network namespaces over tbf-shaped veth rails (as root).
  cargo build -q --release -p railcc-bench -p railcc-tests --bins
  bash tests/netns/rails.sh target/release/railcc target/release/railcc-test-rank > target/netns-rails.log 2>&1 \
      || { cat target/netns-rails.log; echo "netns rails test: FAILED"; exit 1; }
  cat target/netns-rails.log
fi
if part cargo; then
  cargo test --workspace --all-targets
fi
if part capi; then
  # railcc's libnccl from C: exported symbols, the header, clean errors without a driver.
  cargo build -q -p railcc-nccl
  bash nccl-compat/tests/c_api.sh target/debug
fi
if part gpu; then
  # GPU tests report themselves ("SKIP ... no CUDA driver" on machines without one): show it.
  # NVRTC from setup.sh compiles the kernels' source without a GPU; under CI it must.
  nvrtc=$PWD/target/nvrtc/nvidia/cuda_nvrtc/lib
  LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    cargo test -q -p railcc-cuda -p railcc-transport-nvlink --lib -- --nocapture --test-threads 1 > target/gpu-unit.log 2>&1 \
    || { cat target/gpu-unit.log; echo "cuda and transport-nvlink unit tests: FAILED"; exit 1; }
  grep -E "SKIP|CUDA driver present|test result" target/gpu-unit.log
  if [ -n "${CI:-}" ] && grep -q "SKIP NVRTC compile" target/gpu-unit.log; then
    echo "test.sh: the kernels were not compiled (no NVRTC from setup.sh) under CI: FAILED"; exit 1
  fi
  # The GPU correctness command (scripts/test-gpu.sh) says SKIP here, and runs on a GPU machine.
  bash scripts/test-gpu.sh
fi
echo "test.sh: every part passed:${PARTS% }${SKIPPED:+ (skipped:$SKIPPED)}"
