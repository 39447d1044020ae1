#!/usr/bin/env bash
# Issue 8's soak, not part of the test command: 4 ranks over loopback TCP run every
# collective, dtype and op, every result checked, for SOAK_SECS (default 1800 s); each rank
# reports its passes and its RSS after the first pass and at the end.
# Usage: bash scripts/soak.sh [seconds]   (log: target/soak.log)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-1800}
cargo build -q --release -p railcc-tests
export RAILCC_NRANKS=4 RAILCC_SOAK_SECS=$secs RAILCC_TIMEOUT_MS=60000
port=$((20000 + RANDOM % 20000))
export RAILCC_ROOT=127.0.0.1:$port
pids=()
for r in 0 1 2 3; do
  RAILCC_RANK=$r timeout $((secs + 600)) target/release/railcc-test-rank soak > target/soak-$r.log 2>&1 &
  pids+=($!)
done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
cat target/soak-[0-3].log | tee target/soak.log
[ $fail = 0 ] && grep -c "^ok: soak" target/soak.log | grep -qx 4
