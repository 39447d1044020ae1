/* Groups that mix small (p2p_ll) and large (posted) send/recv, and sends of bytes a receive of
 * the same group writes, on railcc's libnccl (nccl-compat/tests/mpi/p2p_mixed.sh), 2 MPI ranks:
 *  1. rank 0: { recv X (2 MiB) from 1; send X's first 4 KiB to 1 } (the send forwards what the
 *     receive wrote: a second round); rank 1: { send Y (2 MiB) to 0; recv Z (4 KiB) from 0 }
 *     (one round: its small receive's launch must not hold back its large send's mark);
 *  2. rank 0: { send A to 1; send B to 1; recv into B from 1 } (4 KiB each: the receive into B
 *     is in the first wave, the send of B in the second; B must go out before it is
 *     overwritten); rank 1: { recv A' from 0; recv B' from 0; send C to 0 }.
 * Every byte is checked; each group must end within 20 s. Prints "p2p_mixed: rank R ok";
 * exit status 1 on any failure. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda_runtime.h>
#include "nccl.h"

#define CHECK(c) do { if (!(c)) { printf("p2p_mixed: rank %d FAIL %s:%d: %s (%s)\n", rank, __FILE__, __LINE__, #c, ncclGetLastError(NULL)); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

static int rank = 0;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Waits for the stream at most 20 s (a hang is a failure, not a stuck test). */
static void finish(cudaStream_t s, const char* what) {
  double t0 = now();
  cudaError_t e;
  while ((e = cudaStreamQuery(s)) == cudaErrorNotReady) {
    if (now() - t0 > 20.0) {
      printf("p2p_mixed: rank %d FAIL %s: not done after 20 s\n", rank, what);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, NULL);
  }
  CHECK(e == cudaSuccess);
}

static unsigned char* filled(size_t n, int salt) {
  unsigned char* h = (unsigned char*)malloc(n);
  for (size_t i = 0; i < n; i++) h[i] = (unsigned char)(i * 13 + salt * 7 + (i >> 12));
  unsigned char* d;
  CHECK(cudaMalloc((void**)&d, n) == cudaSuccess);
  CHECK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) == cudaSuccess);
  free(h);
  return d;
}

static size_t wrong(const unsigned char* d, size_t n, int salt) {
  unsigned char* h = (unsigned char*)malloc(n);
  CHECK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) == cudaSuccess);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += h[i] != (unsigned char)(i * 13 + salt * 7 + (i >> 12));
  free(h);
  return bad;
}

int main(int argc, char** argv) {
  int n = 0, ngpu = 0;
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
  const size_t big = 2 << 20, small = 4096;
  /* 1. Forwarding across rounds, small and large mixed. */
  for (int rep = 0; rep < 3; rep++) {
    if (rank == 0) {
      unsigned char* x;
      CHECK(cudaMalloc((void**)&x, big) == cudaSuccess);
      CHECK(ncclGroupStart() == ncclSuccess);
      CHECK(ncclRecv(x, big, ncclUint8, 1, comm, (railccStream_t)s) == ncclSuccess);
      CHECK(ncclSend(x, small, ncclUint8, 1, comm, (railccStream_t)s) == ncclSuccess);
      CHECK(ncclGroupEnd() == ncclSuccess);
      finish(s, "forwarding group");
      CHECK(wrong(x, big, 100 + rep) == 0);
      cudaFree(x);
    } else {
      unsigned char* y = filled(big, 100 + rep);
      unsigned char* z;
      CHECK(cudaMalloc((void**)&z, small) == cudaSuccess);
      CHECK(ncclGroupStart() == ncclSuccess);
      CHECK(ncclSend(y, big, ncclUint8, 0, comm, (railccStream_t)s) == ncclSuccess);
      CHECK(ncclRecv(z, small, ncclUint8, 0, comm, (railccStream_t)s) == ncclSuccess);
      CHECK(ncclGroupEnd() == ncclSuccess);
      finish(s, "forwarding group");
      CHECK(wrong(z, small, 100 + rep) == 0);
      cudaFree(y);
      cudaFree(z);
    }
  }
  printf("p2p_mixed: rank %d: 2 MiB forwarded 4 KiB back in the same group, 3 times, 0 wrong\n", rank);
  /* 2. A send of bytes a later receive of the group overwrites, in another wave. */
  for (int rep = 0; rep < 3; rep++) {
    if (rank == 0) {
      unsigned char* a = filled(small, 200 + rep);
      unsigned char* b = filled(small, 300 + rep);
      CHECK(ncclGroupStart() == ncclSuccess);
      CHECK(ncclSend(a, small, ncclUint8, 1, comm, (railccStream_t)s) == ncclSuccess);
      CHECK(ncclSend(b, small, ncclUint8, 1, comm, (railccStream_t)s) == ncclSuccess);
      CHECK(ncclRecv(b, small, ncclUint8, 1, comm, (railccStream_t)s) == ncclSuccess);
      CHECK(ncclGroupEnd() == ncclSuccess);
      finish(s, "send then receive into B");
      CHECK(wrong(b, small, 400 + rep) == 0);
      cudaFree(a);
      cudaFree(b);
    } else {
      unsigned char* c = filled(small, 400 + rep);
      unsigned char *a, *b;
      CHECK(cudaMalloc((void**)&a, small) == cudaSuccess);
      CHECK(cudaMalloc((void**)&b, small) == cudaSuccess);
      CHECK(ncclGroupStart() == ncclSuccess);
      CHECK(ncclRecv(a, small, ncclUint8, 0, comm, (railccStream_t)s) == ncclSuccess);
      CHECK(ncclRecv(b, small, ncclUint8, 0, comm, (railccStream_t)s) == ncclSuccess);
      CHECK(ncclSend(c, small, ncclUint8, 0, comm, (railccStream_t)s) == ncclSuccess);
      CHECK(ncclGroupEnd() == ncclSuccess);
      finish(s, "send then receive into B");
      CHECK(wrong(a, small, 200 + rep) == 0);
      CHECK(wrong(b, small, 300 + rep) == 0);
      cudaFree(a);
      cudaFree(b);
      cudaFree(c);
    }
  }
  printf("p2p_mixed: rank %d: B sent before a receive of the same group overwrote it, 3 times, 0 wrong\n", rank);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  printf("p2p_mixed: rank %d ok\n", rank);
  MPI_Finalize();
  return 0;
}
