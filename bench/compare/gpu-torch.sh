#!/usr/bin/env bash
# PyTorch DDP on railcc's libnccl.so.2 and on NCCL, 2 processes (issue 7). Prepare with
# bench/compare/gpu-prepare.sh; carry .device. Log: $OUT/torch.log, loss curves in $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
LIB="$PWD/.device/lib/libnccl.so.2"
TC=$(python3 -c "import torch,os;print(os.path.join(os.path.dirname(torch.__file__),'lib','libtorch_cuda.so'))")
{
  echo "== NCCL symbols libtorch_cuda.so imports that railcc's library lacks"
  nm -D --undefined-only "$TC" | awk '{print $NF}' | grep -E '^nccl' | sort -u > /tmp/torch-nccl-syms
  nm -D --defined-only "$LIB" | awk '{print $NF}' | sort -u > /tmp/ours
  comm -23 /tmp/torch-nccl-syms /tmp/ours
  echo "(of $(wc -l < /tmp/torch-nccl-syms) imported)"
  readelf -d "$TC" | grep -E "NEEDED.*nccl|RPATH|RUNPATH"
  echo "== torch on railcc (LD_PRELOAD)"
  LD_PRELOAD="$LIB" NCCL_DEBUG=INFO timeout 300 python3 -m torch.distributed.run --nproc_per_node 2 nccl-compat/tests/torch/check.py "$OUT/railcc"
  echo "exit $?"
  echo "== torch on NCCL"
  timeout 300 python3 -m torch.distributed.run --nproc_per_node 2 nccl-compat/tests/torch/check.py "$OUT/nccl"
  echo "exit $?"
  python3 - "$OUT/railcc.loss.txt" "$OUT/nccl.loss.txt" <<'PY'
import sys
a = [float(x) for x in open(sys.argv[1])]
b = [float(x) for x in open(sys.argv[2])]
d = max(abs(x - y) for x, y in zip(a, b))
rel = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))
print(f"loss curves: {len(a)} and {len(b)} steps; max abs difference {d:.3e}, max relative {rel:.3e}; first {a[0]:.5f}/{b[0]:.5f}, last {a[-1]:.5f}/{b[-1]:.5f}")
PY
} 2>&1 | tee "$OUT/torch.log"
