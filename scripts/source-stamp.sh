#!/usr/bin/env bash
# Prints one hash of the sources the binaries are built from (every .rs, Cargo.toml, Cargo.lock
# and the C header), so scripts/test-gpu.sh can refuse binaries staged from other sources.
# Needs no git (the device machine's copy of the tree has none).
set -euo pipefail
cd "$(dirname "$0")/.."
find core cuda collectives transport-tcp transport-rdma transport-nvlink nccl-compat bench tests \
    \( -name '*.rs' -o -name Cargo.toml -o -name '*.h' \) -type f -not -path '*/target/*' \
  | LC_ALL=C sort | xargs sha1sum | cat - Cargo.toml Cargo.lock | sha1sum | cut -c1-16
