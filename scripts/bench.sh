#!/usr/bin/env bash
# The main job: build railcc and run a local multi-rank all-reduce sweep, no cluster needed.
# Extra arguments go to `railcc bench all_reduce` (defaults: 2 ranks, 8 B to 64 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo build --release -q -p railcc-bench
if [ "$#" -eq 0 ]; then set -- --ranks 2 -b 8 -e 64M -f 2 -n 20 -w 3; fi
exec target/release/railcc bench all_reduce "$@"
