# Sourced by the MPI tests here (shrink.sh, p2p_size.sh, p2p_mixed.sh), from the repository
# root after bench/compare/gpu-env.sh.
# mpi_c_test NAME NP WANT [-x VAR ...]: builds nccl-compat/tests/mpi/NAME.c against railcc's
# libnccl (the directory MPI_LIB, default .device/lib), runs it on NP MPI ranks (MPI_TIMEOUT
# seconds, default 120) with the -x options given, prints its log, and returns 0 when mpirun
# exits 0 and WANT ranks print "NAME: rank R ok" (else a FAIL line and 1).
mpi_c_test() {
  local name=$1 np=$2 want=$3 work st oks
  shift 3
  work=$(mktemp -d)
  cp "${MPI_LIB:-.device/lib}/libnccl.so.2" "$work/" && ln -s libnccl.so.2 "$work/libnccl.so"
  mpicc -I nccl-compat/include -I /usr/local/cuda/include "nccl-compat/tests/mpi/$name.c" \
    -L "$work" -lnccl -L /usr/local/cuda/lib64 -lcudart -o "$work/$name" || { echo "FAIL  $name: build"; return 1; }
  LD_LIBRARY_PATH="$work:/usr/local/cuda/lib64" timeout "${MPI_TIMEOUT:-120}" mpirun -np "$np" --allow-run-as-root \
    --oversubscribe -x LD_LIBRARY_PATH -x RAILCC_CACHE_DIR "$@" "$work/$name" > "$work/log" 2>&1
  st=$?
  cat "$work/log"
  oks=$(grep -c "^$name: rank [0-9]* ok" "$work/log")
  if [ $st = 0 ] && [ "$oks" = "$want" ]; then return 0; fi
  echo "FAIL  $name: exit $st, $oks of $want ranks ok"
  return 1
}
