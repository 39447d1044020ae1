#!/bin/bash
# Runs a command as its own emulated host: under mpirun, rank N gets NCCL_HOSTID and
# RAILCC_HOSTID "host<N / AS_HOST_PER>", so railcc and NCCL treat ranks on one machine as
# separate machines. AS_HOST_PER (default 1) ranks share each host; above 1, rank N also
# drives GPU N mod AS_HOST_PER (NCCL_TESTS_DEVICE), so with 4 ranks on 2 GPUs each GPU holds
# one rank of each host (the 2 x 2 layout on a 2-GPU machine); with a GPU for every rank
# (AS_HOST_GPUS at least the ranks), rank N drives GPU N. AS_HOST_GPUS=1 (a machine of
# one GPU) puts every rank on GPU 0: each emulated host's rank shares it with the others.
r=${OMPI_COMM_WORLD_RANK:?as-host.sh runs under mpirun}
per=${AS_HOST_PER:-1}
h=host$((r / per))
export NCCL_HOSTID=$h RAILCC_HOSTID=$h
if [ "${AS_HOST_GPUS:-0}" -ge "${OMPI_COMM_WORLD_SIZE:-99999}" ]; then
  # A GPU for every rank (2 x 2 on 4 GPUs): rank N on GPU N, host h on GPUs h*per...
  export NCCL_TESTS_DEVICE=$r
elif [ "$per" -gt 1 ] || [ "${AS_HOST_GPUS:-0}" = 1 ]; then
  export NCCL_TESTS_DEVICE=$(( (r % per) % ${AS_HOST_GPUS:-$per} ))
fi
# AS_HOST_BIND=1: the rank runs on the CPUs nearest its GPU (the PCI device's local_cpulist),
# as NCCL binds its own threads; to tell NUMA placement from the libraries' own costs.
if [ "${AS_HOST_BIND:-0}" = 1 ] && command -v taskset > /dev/null; then
  bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i "${NCCL_TESTS_DEVICE:-0}" | tr 'A-F' 'a-f' | sed 's/^0000//')
  cpus=$(cat "/sys/bus/pci/devices/$bus/local_cpulist" 2>/dev/null)
  [ -n "$cpus" ] && exec taskset -c "$cpus" "$@"
fi
exec "$@"
