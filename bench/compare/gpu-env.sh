# Sourced by the GPU scripts on the device machine: the environment every run shares.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # never NVLink multicast
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export RAILCC_CACHE_DIR=${RAILCC_CACHE_DIR:-/tmp/railcc-cache}
OUT=${OUT:-/tmp/out}
R=.device/bin/railcc
NT=/tmp/nccl-tests   # nccl-tests builds here, outside the carried tree
NTM=/tmp/nccl-tests-mpi   # and with MPI here
[ -d $NT ] || cp -r .device/nccl-tests $NT
# nccl_tests_build DIR MPI(0|1): builds nccl-tests in DIR (a copy of .device/nccl-tests made
# if absent) against the image's NCCL, unless built already; log /tmp/nccl-build-MPI.log.
# Sets NCCL_HOME (with the libnccl.so link the build needs).
nccl_tests_build() {
  NCCL_HOME=$(python3 -c "import nvidia.nccl,os;print(nvidia.nccl.__path__[0])")
  [ -e "$NCCL_HOME/lib/libnccl.so" ] || ln -sf "$NCCL_HOME/lib/libnccl.so.2" "$NCCL_HOME/lib/libnccl.so"
  local inc mpi_home
  inc=$(mpicc --showme:incdirs 2>/dev/null | awk '{print $1}')
  mpi_home=${MPI_HOME:-$(dirname "${inc:-/usr/include}")}
  [ -d "$1" ] || cp -r .device/nccl-tests "$1"
  [ -x "$1/build/all_reduce_perf" ] || make -C "$1" -j8 MPI="$2" MPI_HOME="$mpi_home" CUDA_HOME=/usr/local/cuda \
    NCCL_HOME="$NCCL_HOME" NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" src.build > "/tmp/nccl-build-$2.log" 2>&1
}
# nccl_tests_build_both: both builds at once (plain and MPI); exits the script on a failed
# one. Sets NCCL_HOME here (the builds run in subshells).
nccl_tests_build_both() {
  nccl_tests_build $NT 0 & local b0=$!
  nccl_tests_build $NTM 1 & local b1=$!
  wait $b0 || { kill $b1 2>/dev/null; echo "FAIL  nccl-tests build"; exit 1; }
  wait $b1 || { echo "FAIL  nccl-tests build (MPI)"; exit 1; }
  NCCL_HOME=$(python3 -c "import nvidia.nccl,os;print(nvidia.nccl.__path__[0])")
}
# net_env NAME: the settings of the emulated-hosts scripts (gpu-net.sh, gpu-net-kernel.sh):
# loopback sockets, a 30 s deadline unless set, AS_HOST_GPUS (the GPUs here); prints NAME's
# header line with the GPUs.
net_env() {
  export RAILCC_TIMEOUT_MS=${RAILCC_TIMEOUT_MS:-30000} NCCL_SOCKET_IFNAME=lo RAILCC_SOCKET_IFNAME=lo
  export AS_HOST_GPUS=$(nvidia-smi -L | wc -l)
  echo "# $1: $AS_HOST_GPUS GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs)"
}
# The per-session scripts (gpu-x4-sN.sh): session_begin makes $L ($OUT/logs) and starts the
# clock; left N: seconds until N s after the start; session_end PART prints the time taken
# and tars $L to $OUT/logs-PART.tgz.
session_begin() {
  L=$OUT/logs
  mkdir -p "$L"
  T0=$(date +%s)
}
left() { echo $(( $1 - $(date +%s) + T0 )); }
session_end() {
  echo "== part $1 ended after $(($(date +%s) - T0)) s"
  cd "$OUT" && tar czf "logs-$1.tgz" logs && rm -rf logs
}
# session_steps NAME LAYOUT MODES LIBS LIMIT EXTRA [STEP_ARGS]: bench/torch/step.sh pinned
# (STEP_PIN, 1), STEP_RUNS runs (2), within the session's 575 s; its log in $L/NAME.txt and its
# files under $L/NAME.
session_steps() {
  OUT=$L/$1 STEP_PIN=${STEP_PIN:-1} STEP_LAYOUTS=$2 STEP_MODES=$3 STEP_RUNS=${STEP_RUNS:-2} STEP_LIBS=$4 \
    STEP_LIMIT=$5 STEP_EXTRA=$6 STEP_ARGS=${7:-} NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT \
    timeout $(left 575) bash bench/torch/step.sh 2>&1 | tee "$L/$1.txt" | grep -v "^  "
}
# nccl_variants PREFIX VARIANT...: nccl-tests all_reduce, all_gather and reduce_scatter,
# 1 MB-256 MB, -c 1, under mpirun -np (every GPU), for each VARIANT: "nccl" (NCCL), or
# "name[:VAR=VALUE,...]" (railcc's libnccl with those settings); logs $L/PREFIX-COLL-name.log;
# prints a line per run (NCCL's with its channel count) and its rows.
nccl_variants() {
  local prefix=$1 n c v name f lib
  shift
  n=$(nvidia-smi -L | wc -l)
  nccl_tests_build_both >/dev/null 2>&1 || echo "FAIL  nccl-tests build"
  for c in all_reduce all_gather reduce_scatter; do
    for v in "$@"; do
      local -a set=() pass=()
      name=${v%%:*} f="$L/$prefix-$c-${v%%:*}.log" lib="$PWD/.device/lib"
      [[ $v == *:* ]] && IFS=',' read -r -a set <<< "${v#*:}"
      for x in "${set[@]}"; do pass+=(-x "${x%%=*}"); done
      [ "$name" = nccl ] && lib=$NCCL_HOME/lib
      env "${set[@]}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT LD_LIBRARY_PATH="$lib:/usr/local/cuda/lib64" \
        timeout 90 mpirun -np "$n" --bind-to none --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH \
        -x NCCL_NVLS_ENABLE -x RAILCC_CACHE_DIR -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS "${pass[@]}" \
        $NTM/build/${c}_perf -g 1 -b 1M -e 256M -f 4 -n 20 -w 5 -c 1 > "$f" 2>&1
      echo "== $c $name: exit $?, $(grep -c 'Out of bounds values : 0 OK' "$f") OK table(s)$( [ "$name" = nccl ] && grep -m1 -oE ' [0-9]+ coll channels' "$f")"
      grep -E "^ +[0-9]+ +[0-9]+ " "$f" | awk '{printf "  %10s %10s us %7s GB/s busbw #wrong %s\n", $1, $6, $8, $9}'
    done
  done
}
