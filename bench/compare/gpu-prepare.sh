#!/usr/bin/env bash
# Run here, not on the device: builds railcc and stages what the device scripts need in the
# ignored folder .device/ (the binary, nccl-tests' source, NCCL's baseline script). Then run a
# bench/compare/gpu-*.sh script on the device (kind nvidia-h200-x2), carrying .device.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p railcc-bench -p railcc-nccl
mkdir -p .device/bin .device/lib
cp target/release/railcc .device/bin/
# The unit tests of railcc-cuda and railcc-transport-nvlink, one binary per crate
# (scripts/test-gpu.sh runs both with a driver).
test_binary() {  # PACKAGE LIB: the path of PACKAGE's unit-test binary
  cargo test --release -p "$1" --lib --no-run --message-format=json 2>/dev/null \
    | LIB=$2 python3 -c 'import sys, json, os
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == os.environ["LIB"]:
        print(m["executable"])'
}
tests=$(test_binary railcc-cuda railcc_cuda)
[ -x "$tests" ] || { echo "gpu-prepare: no railcc-cuda test binary"; exit 1; }
cp "$tests" .device/bin/railcc-cuda-tests
tests=$(test_binary railcc-transport-nvlink railcc_transport_nvlink)
[ -x "$tests" ] || { echo "gpu-prepare: no transport-nvlink test binary"; exit 1; }
cp "$tests" .device/bin/railcc-nvlink-tests
# The collectives crate's: scripts/test-gpu.sh runs its GPU check test alone.
tests=$(test_binary railcc-collectives railcc_collectives)
[ -x "$tests" ] || { echo "gpu-prepare: no railcc-collectives test binary"; exit 1; }
cp "$tests" .device/bin/railcc-collectives-tests
cp target/release/libnccl.so .device/lib/libnccl.so.2
# Without debug info: the carried tree must stay under the device's 64 MiB.
strip --strip-debug .device/bin/* .device/lib/*
# The sources these binaries came from: scripts/test-gpu.sh refuses a stale .device.
bash scripts/source-stamp.sh > .device/STAMP
rm -rf .device/nccl-tests
cp -r ../shared/third_party/nccl-tests .device/
cp ../shared/baselines/gpu/nccl_baseline.sh .device/
# PREPARE_OLD=<commit>: that commit's libnccl too, in .device/lib-<commit> (gpu-blocks-ab.sh's
# AB_LIBS runs a build against a build on one machine).
if [ -n "${PREPARE_OLD:-}" ]; then
  wt=/tmp/railcc-old-$PREPARE_OLD
  rm -rf "$wt"; git worktree prune
  git worktree add -f "$wt" "$PREPARE_OLD" -q
  ( cd "$wt" && CARGO_TARGET_DIR="$PWD/../railcc-old-target" cargo build --release -p railcc-nccl )
  mkdir -p ".device/lib-$PREPARE_OLD"
  cp "/tmp/railcc-old-target/release/libnccl.so" ".device/lib-$PREPARE_OLD/libnccl.so.2"
  strip --strip-debug ".device/lib-$PREPARE_OLD/libnccl.so.2"
  git worktree remove --force "$wt"
fi
echo "staged .device/ ($(du -sh .device | cut -f1)); on the device: bash scripts/test-gpu.sh (every GPU correctness test), bench/compare/gpu-bench.sh, gpu-bench-large.sh"
