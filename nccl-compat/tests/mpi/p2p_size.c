/* Send/recv sizes that do not match, on railcc's libnccl (nccl-compat/tests/mpi/p2p_size.sh),
 * 2 MPI ranks: first a group of matching ncclSend/ncclRecv of 1000 bytes each way (checked),
 * then rank 0 sends 100 bytes where rank 1 receives 200. Both ranks must then fail within 5 s
 * through ncclCommGetAsyncError, ncclGetLastError naming rank 0 and its 100 bytes; the
 * streams end (no hang), and the communicator is aborted. Prints "p2p_size: rank R ok: ...";
 * exit status 1 on any failure. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda_runtime.h>
#include "nccl.h"

#define CHECK(c) do { if (!(c)) { printf("p2p_size: rank %d FAIL %s:%d: %s (%s)\n", rank, __FILE__, __LINE__, #c, ncclGetLastError(NULL)); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  int rank = 0, n = 0, ngpu = 0;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  CHECK(n == 2);
  CHECK(cudaGetDeviceCount(&ngpu) == cudaSuccess && ngpu > 0);
  CHECK(cudaSetDevice(rank % ngpu) == cudaSuccess);
  ncclUniqueId id;
  if (rank == 0) CHECK(ncclGetUniqueId(&id) == ncclSuccess);
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, n, id, rank) == ncclSuccess);
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess);
  unsigned char *out, *in;
  CHECK(cudaMalloc((void**)&out, 1000) == cudaSuccess);
  CHECK(cudaMalloc((void**)&in, 1000) == cudaSuccess);
  unsigned char host[1000];
  for (int i = 0; i < 1000; i++) host[i] = (unsigned char)(i * 7 + rank);
  CHECK(cudaMemcpy(out, host, 1000, cudaMemcpyHostToDevice) == cudaSuccess);
  int peer = 1 - rank;
  CHECK(ncclGroupStart() == ncclSuccess);
  CHECK(ncclSend(out, 1000, ncclUint8, peer, comm, (railccStream_t)s) == ncclSuccess);
  CHECK(ncclRecv(in, 1000, ncclUint8, peer, comm, (railccStream_t)s) == ncclSuccess);
  CHECK(ncclGroupEnd() == ncclSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(cudaMemcpy(host, in, 1000, cudaMemcpyDeviceToHost) == cudaSuccess);
  int wrong = 0;
  for (int i = 0; i < 1000; i++) wrong += host[i] != (unsigned char)(i * 7 + peer);
  CHECK(wrong == 0);
  printf("p2p_size: rank %d: 1000 bytes each way, 0 wrong\n", rank);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now();
  if (rank == 0) CHECK(ncclSend(out, 100, ncclUint8, 1, comm, (railccStream_t)s) == ncclSuccess);
  else CHECK(ncclRecv(in, 200, ncclUint8, 0, comm, (railccStream_t)s) == ncclSuccess);
  /* The stream ends: a receive whose sizes disagree stops every wait of the rank. */
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  ncclResult_t st = ncclSuccess;
  while (now() - t0 < 5.0) {
    CHECK(ncclCommGetAsyncError(comm, &st) == ncclSuccess);
    if (st != ncclSuccess && st != ncclInProgress) break;
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
  const char* why = ncclGetLastError(comm);
  printf("p2p_size: rank %d: after %.3f s: %s: %s\n", rank, now() - t0, ncclGetErrorString(st), why);
  CHECK(st != ncclSuccess && st != ncclInProgress);
  CHECK(strstr(why, "rank 0 sends 100 bytes") != NULL);
  CHECK(ncclCommAbort(comm) == ncclSuccess);
  printf("p2p_size: rank %d ok: failed after %.3f s naming rank 0 and its 100 bytes\n", rank, now() - t0);
  MPI_Finalize();
  return 0;
}
