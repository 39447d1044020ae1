/* Mismatched calls across ranks give an error on every rank, never a hang (the developers'
 * guide: "mismatched counts or dtypes across ranks ... a clear error"), checked by
 * mismatch.sh on a GPU machine with and without RAILCC_GPU_STAGE_BYTES. Ranks are processes
 * the script starts; the unique id travels through a file in DIR (../share_id.h).
 *
 *   mismatch RANK DIR count|dtype [BASE]
 *     2 ranks. One checked all_reduce of 1 MiB of floats (every rank's sum), then the
 *     mismatched call: "count" rank 1 passes twice rank 0's count; "dtype" rank 1 passes
 *     bfloat16 (ncclBfloat16) for the same bytes; rank 0 passes BASE floats (default 256 Ki; 1024
 *     is small enough for the low-latency kernel, whose calls launch without a meeting). Where the call itself fails (the usual
 *     path) that is the error; where it returns (a call through the fixed stage, whose peers'
 *     entries are checked behind it), ncclCommGetAsyncError must turn non-success within
 *     10 s while the stream is polled, and the next all_reduce must fail. Either way the
 *     stream must finish within 10 s of the call (its kernels stopped), and the error text
 *     must name what differs.
 *     Last line: "mismatch: rank R: <how> after X s: <error text>" or "mismatch: rank R:
 *     FAIL ...". */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "nccl.h"

#define COUNT (1 << 18)
#define FAIL(...) do { printf("mismatch: rank %d: FAIL ", rank); printf(__VA_ARGS__); printf("\n"); fflush(stdout); exit(1); } while (0)
#define CHECK(c) do { if (!(c)) FAIL("%s:%d: %s (%s)", __FILE__, __LINE__, #c, ncclGetLastError(NULL)); } while (0)

static int rank;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static const char* dir;
#include "../share_id.h"

/* Polls the stream and the communicator's asynchronous error for up to `limit` seconds.
 * Returns 1 once the stream is done, and sets *err to the first non-success error seen. */
static int poll_done(ncclComm_t comm, cudaStream_t s, double limit, ncclResult_t* err) {
  double t0 = now();
  int done = 0;
  while (now() - t0 < limit) {
    ncclResult_t a = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &a) == ncclSuccess && a != ncclSuccess && *err == ncclSuccess) *err = a;
    cudaError_t q = cudaStreamQuery(s);
    done = q != cudaErrorNotReady;
    if (done && *err != ncclSuccess) return 1;
    usleep(1000);
  }
  return done;
}

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    fprintf(stderr, "usage: mismatch RANK DIR count|dtype [BASE]\n");
    return 2;
  }
  size_t base = argc == 5 ? (size_t)atol(argv[4]) : COUNT;
  if (base == 0 || base > COUNT) {
    fprintf(stderr, "mismatch: BASE must be 1 to %d floats\n", COUNT);
    return 2;
  }
  rank = atoi(argv[1]);
  dir = argv[2];
  const char* what = argv[3];
  int ngpu = 0;
  CHECK(cudaGetDeviceCount(&ngpu) == cudaSuccess && ngpu > 0);
  CHECK(cudaSetDevice(rank % ngpu) == cudaSuccess);
  ncclUniqueId id = share_id(0, rank == 0);
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, 2, id, rank) == ncclSuccess);
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  float *buf, *h = malloc(2 * COUNT * sizeof(float));
  CHECK(h && cudaMalloc((void**)&buf, 2 * COUNT * sizeof(float)) == cudaSuccess);
  for (int i = 0; i < COUNT; i++) h[i] = (float)(rank + 1) + (float)(i % 7);
  CHECK(cudaMemcpy(buf, h, COUNT * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  /* A good call first: both ways of running are up. */
  CHECK(ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, s) == ncclSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(cudaMemcpy(h, buf, COUNT * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  for (int i = 0; i < COUNT; i++)
    if (h[i] != 3.0f + 2.0f * (float)(i % 7)) FAIL("the good all_reduce: element %d is %g", i, h[i]);
  /* The mismatched call. */
  size_t count = base;
  ncclDataType_t dt = ncclFloat;
  if (strcmp(what, "count") == 0) {
    if (rank == 1) count = 2 * base;
  } else if (strcmp(what, "dtype") == 0) {
    if (rank == 1) { dt = ncclBfloat16; count = 2 * base; }
  } else {
    FAIL("unknown case %s", what);
  }
  double t0 = now();
  ncclResult_t r = ncclAllReduce(buf, buf, count, dt, ncclSum, comm, s);
  ncclResult_t err = r;
  const char* how = "the call failed";
  if (r == ncclSuccess) {
    how = "the asynchronous error";
  }
  int done = poll_done(comm, s, 10.0, &err);
  double took = now() - t0;
  if (err == ncclSuccess) FAIL("no error within 10 s of a %s mismatch (the call returned %d)", what, (int)r);
  if (!done) FAIL("the stream did not finish within 10 s of the mismatched call");
  if (r == ncclSuccess) {
    /* The next call must fail too. */
    ncclResult_t next = ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, s);
    if (next == ncclSuccess) FAIL("the call after an asynchronous mismatch error succeeded");
  }
  char text[400];
  snprintf(text, sizeof text, "%s", ncclGetLastError(comm));
  for (char* c = text; *c; c++) if (*c == '\n') *c = ' ';
  printf("mismatch: rank %d: %s after %.3f s: %s\n", rank, how, took, text);
  fflush(stdout);
  ncclCommAbort(comm);
  return 0;
}
