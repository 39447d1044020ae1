#!/usr/bin/env bash
# On the device (issue 31 experiment): builds return_time.cu against NCCL's headers and runs it
# under mpirun as 2 emulated hosts x RT_PER GPUs (default 1), through NCCL's libnccl (defaults)
# and railcc's (.device/lib, after bench/compare/gpu-prepare.sh here), RT_ROUNDS times
# alternately (default 2). Log $OUT/return_time.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/compare/gpu-env.sh
net_env return_time
mkdir -p "$OUT"
NCCL_HOME=$(python3 -c "import nvidia.nccl,os;print(nvidia.nccl.__path__[0])")
[ -e "$NCCL_HOME/lib/libnccl.so" ] || ln -sf "$NCCL_HOME/lib/libnccl.so.2" "$NCCL_HOME/lib/libnccl.so"
# nvcc compiles (MPI's include folder given), mpicxx links.
nvcc -O2 -arch=sm_90 -c -o /tmp/return_time.o bench/experiments/return_time.cu -I"$NCCL_HOME/include" \
  $(mpicxx --showme:compile) && mpicxx -o /tmp/return_time /tmp/return_time.o -L"$NCCL_HOME/lib" -lnccl \
  -L/usr/local/cuda/lib64 -lcudart || { echo "FAIL  return_time build"; exit 1; }
per=${RT_PER:-1}
MPI="mpirun -np $((2 * per)) --bind-to none --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x NCCL_SOCKET_IFNAME -x RAILCC_SOCKET_IFNAME -x RAILCC_CACHE_DIR -x RAILCC_TIMEOUT_MS -x AS_HOST_GPUS -x AS_HOST_PER"
export AS_HOST_PER=$per
L="$OUT/return_time.log"
: > "$L"
for round in $(seq "${RT_ROUNDS:-2}"); do
  for lib in nccl railcc; do
    case $lib in nccl) p="$NCCL_HOME/lib" ;; railcc) p="$PWD/.device/lib" ;; esac
    echo "== $lib, 2 x $per, round $round" | tee -a "$L"
    LD_LIBRARY_PATH="$p:/usr/local/cuda/lib64" timeout 120 $MPI bench/compare/as-host.sh /tmp/return_time 2>&1 \
      | tee -a "$L" | grep -E "^ +[0-9]+ B|FAIL"
    echo "== exit ${PIPESTATUS[0]}" | tee -a "$L"
  done
done
