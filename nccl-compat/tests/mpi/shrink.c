/* ncclCommShrink on railcc's libnccl, 3 MPI ranks (nccl-compat/tests/mpi/shrink.sh): a
 * communicator of 3, then ranks 0 and 1 shrink it excluding rank 2 (which does not call) and
 * all-reduce on the result; bad exclude lists fail on every caller with a named reason.
 * Prints "shrink: rank R ok" per survivor; exit status 1 on any failure. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime.h>
#include "nccl.h"

#define CHECK(c) do { if (!(c)) { printf("shrink: rank %d FAIL %s:%d: %s (%s)\n", rank, __FILE__, __LINE__, #c, ncclGetLastError(NULL)); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

int main(int argc, char** argv) {
  int rank = 0, n = 0, ngpu = 0;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  CHECK(n == 3);
  CHECK(cudaGetDeviceCount(&ngpu) == cudaSuccess && ngpu > 0);
  CHECK(cudaSetDevice(rank % ngpu) == cudaSuccess);
  ncclUniqueId id;
  if (rank == 0) CHECK(ncclGetUniqueId(&id) == ncclSuccess);
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, n, id, rank) == ncclSuccess);
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess);
  float* buf;
  const int count = 1 << 20;
  CHECK(cudaMalloc((void**)&buf, count * sizeof(float)) == cudaSuccess);
  float* host = (float*)malloc(count * sizeof(float));
  for (int i = 0; i < count; i++) host[i] = (float)(rank + 1);
  CHECK(cudaMemcpy(buf, host, count * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  CHECK(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, (railccStream_t)s) == ncclSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  if (rank < 2) {
    ncclComm_t small = NULL;
    int bad[2] = {2, 2};
    CHECK(ncclCommShrink(comm, bad, 2, &small, NULL, NCCL_SHRINK_DEFAULT) == ncclInvalidArgument);
    printf("shrink: rank %d: excluding 2 twice: %s\n", rank, ncclGetLastError(NULL));
    int self[1] = {rank};
    CHECK(ncclCommShrink(comm, self, 1, &small, NULL, NCCL_SHRINK_DEFAULT) == ncclInvalidArgument);
    CHECK(small == NULL);
    int ex[1] = {2};
    CHECK(ncclCommShrink(comm, ex, 1, &small, NULL, NCCL_SHRINK_DEFAULT) == ncclSuccess);
    int sn = 0, sr = -1;
    CHECK(ncclCommCount(small, &sn) == ncclSuccess && sn == 2);
    CHECK(ncclCommUserRank(small, &sr) == ncclSuccess && sr == rank);
    for (int i = 0; i < count; i++) host[i] = (float)(10 * (rank + 1));
    CHECK(cudaMemcpy(buf, host, count * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, small, (railccStream_t)s) == ncclSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(cudaMemcpy(host, buf, count * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    int wrong = 0;
    for (int i = 0; i < count; i++) wrong += host[i] != 30.0f;
    CHECK(wrong == 0);
    CHECK(ncclCommDestroy(small) == ncclSuccess);
    printf("shrink: rank %d ok: rank %d of %d after excluding rank 2, all_reduce 30 in all %d elements\n", rank, sr, sn, count);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  MPI_Finalize();
  return 0;
}
