#!/bin/bash
# Runs a command as its own emulated host: under mpirun, rank N gets NCCL_HOSTID and
# RAILCC_HOSTID "hostN", so railcc and NCCL treat ranks on one machine as separate machines.
h=host${OMPI_COMM_WORLD_RANK:?as-host.sh runs under mpirun}
export NCCL_HOSTID=$h RAILCC_HOSTID=$h
exec "$@"
