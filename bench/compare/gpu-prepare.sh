#!/usr/bin/env bash
# Run here, not on the device: builds railcc and stages what the device scripts need in the
# ignored folder .device/ (the binary, nccl-tests' source, NCCL's baseline script). Then run a
# bench/compare/gpu-*.sh script on the device (kind nvidia-h200-x2), carrying .device.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p railcc-bench -p railcc-nccl
mkdir -p .device/bin .device/lib
cp target/release/railcc .device/bin/
cp target/release/libnccl.so .device/lib/libnccl.so.2
rm -rf .device/nccl-tests
cp -r ../shared/third_party/nccl-tests .device/
cp ../shared/baselines/gpu/nccl_baseline.sh .device/
echo "staged .device/ ($(du -sh .device | cut -f1)); on the device: bash bench/compare/gpu-check.sh, gpu-bench.sh, gpu-bench-large.sh"
