/* After a failure, the same processes go on (issue 29 item 2), checked by recover.sh on a GPU
 * machine. Ranks are separate processes the script starts (not mpirun, which would end the job
 * when one rank is killed); the unique id travels through files in DIR.
 *
 *   recover kill RANK N DIR shrink|reinit
 *     N ranks all-reduce 1 MiB floats in a loop, each result checked. The script kills rank
 *     N-1 (SIGKILL) once every rank printed "running". Each survivor prints when it saw the
 *     failure (CLOCK_REALTIME, for the script to compare with the kill) and the error; then it
 *     recovers in the same process: "shrink" by ncclCommShrink excluding rank N-1
 *     (NCCL_SHRINK_ABORT), "reinit" by ncclCommAbort and a new communicator of N-1 ranks
 *     (rank 0 writes the new id). 100 all_reduces on the new communicator, every element
 *     checked; then a cuBLAS matrix product on the same GPU, checked; then a buffer filled
 *     before the kill must be unchanged.
 *     Last line: "recover: rank R: recovered by MODE: 100 all_reduce ok, matmul ok, tensors
 *     unchanged" or "recover: rank R: FAIL ...".
 *   recover abort RANK N DIR
 *     N ranks; the streams of ranks 1..N-1 are held 10 s by a host function, so rank 0's
 *     all_reduce kernel waits for its peers on the GPU. After 1 s another thread of rank 0
 *     calls ncclCommAbort. Rank 0 prints how long ncclCommAbort took and how long its stream
 *     took to finish after it was called, then runs a cuBLAS matrix product (the context is
 *     still usable), and stays alive until every other rank's stream finished (30 s at most),
 *     so they cannot lean on its death being noticed. Ranks 1..N-1 then run their part of the
 *     call, which rank 0's aborted kernel never did (the result is garbage, as NCCL's): each
 *     prints how long its stream took after the hold ended; it must not wait for ever on
 *     flags the aborted kernel skipped (the push kernel's tiles: cuda/src/push.rs).
 *     Last line on rank 0: "recover: rank 0: abort returned after X s, stream done after Y s,
 *     matmul ok, peers done" or "recover: rank 0: FAIL ..."; on the others "recover: rank R:
 *     stream done X s after its hold". */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "nccl.h"

#define COUNT (1 << 18)
#define FAIL(...) do { printf("recover: rank %d: FAIL ", rank); printf(__VA_ARGS__); printf("\n"); fflush(stdout); exit(1); } while (0)
#define CHECK(c) do { if (!(c)) FAIL("%s:%d: %s (%s)", __FILE__, __LINE__, #c, ncclGetLastError(NULL)); } while (0)

static int rank, nranks;
static const char* dir;

static double realtime(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

#include "../share_id.h"

static float* device_filled(float v) {
  float* h = malloc(COUNT * sizeof(float));
  for (int i = 0; i < COUNT; i++) h[i] = v + (float)(i % 5);
  float* d;
  CHECK(cudaMalloc((void**)&d, COUNT * sizeof(float)) == cudaSuccess);
  CHECK(cudaMemcpy(d, h, COUNT * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  free(h);
  return d;
}

/* Elements of d that differ from sum over ranks r < n of (r + 1 + i % 5). */
static int wrong_sum(const float* d, int n) {
  float* h = malloc(COUNT * sizeof(float));
  CHECK(cudaMemcpy(h, d, COUNT * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  int bad = 0;
  for (int i = 0; i < COUNT; i++) {
    float want = (float)(n * (n + 1) / 2) + (float)n * (float)(i % 5);
    bad += h[i] != want;
  }
  free(h);
  return bad;
}

/* One all_reduce of `n` ranks' inputs (rank + 1 + i % 5) into out, waited for; the error
 * (call or asynchronous) or ncclSuccess; *bad gets the wrong elements. */
static ncclResult_t checked_all_reduce(ncclComm_t c, int r, int n, cudaStream_t s, float* in, float* out, int* bad) {
  float* h = malloc(COUNT * sizeof(float));
  for (int i = 0; i < COUNT; i++) h[i] = (float)(r + 1) + (float)(i % 5);
  CHECK(cudaMemcpy(in, h, COUNT * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  free(h);
  ncclResult_t e = ncclAllReduce(in, out, COUNT, ncclFloat, ncclSum, c, s);
  if (e != ncclSuccess) return e;
  /* Poll, as PyTorch's watchdog does: a wait that never ends would hide a dead peer. */
  for (;;) {
    cudaError_t q = cudaStreamQuery(s);
    ncclResult_t a = ncclSuccess;
    CHECK(ncclCommGetAsyncError(c, &a) == ncclSuccess);
    if (a != ncclSuccess) return a;
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) return ncclUnhandledCudaError;
    usleep(100);
  }
  *bad = wrong_sum(out, n);
  return ncclSuccess;
}

/* C = A B for 512 x 512 matrices of ones: every element 512. */
static int matmul_ok(void) {
  const int m = 512;
  float *a, *c;
  CHECK(cudaMalloc((void**)&a, m * m * sizeof(float)) == cudaSuccess);
  CHECK(cudaMalloc((void**)&c, m * m * sizeof(float)) == cudaSuccess);
  float* h = malloc(m * m * sizeof(float));
  for (int i = 0; i < m * m; i++) h[i] = 1.0f;
  CHECK(cudaMemcpy(a, h, m * m * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  cublasHandle_t b;
  if (cublasCreate(&b) != CUBLAS_STATUS_SUCCESS) return 0;
  float one = 1.0f, zero = 0.0f;
  int ok = cublasSgemm(b, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &one, a, m, a, m, &zero, c, m) == CUBLAS_STATUS_SUCCESS
      && cudaDeviceSynchronize() == cudaSuccess
      && cudaMemcpy(h, c, m * m * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess;
  for (int i = 0; ok && i < m * m; i++) ok = h[i] == (float)m;
  cublasDestroy(b);
  free(h);
  cudaFree(a);
  cudaFree(c);
  return ok;
}

static void kill_mode(const char* how) {
  ncclUniqueId id = share_id(0, rank == 0);
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, nranks, id, rank) == ncclSuccess);
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess);
  float* keep = device_filled(100.0f + rank); /* must survive everything below */
  float *in = device_filled(0), *out = device_filled(0);
  int calls = 0, bad = 0;
  ncclResult_t e = ncclSuccess;
  double t0 = realtime();
  while (e == ncclSuccess && realtime() - t0 < 120) {
    e = checked_all_reduce(comm, rank, nranks, s, in, out, &bad);
    if (e == ncclSuccess && bad) FAIL("all_reduce %d before the kill: %d wrong", calls, bad);
    if (e == ncclSuccess && ++calls == 3) { printf("recover: rank %d: running\n", rank); fflush(stdout); }
  }
  if (e == ncclSuccess) FAIL("no failure within 120 s of all_reduces (%d calls)", calls);
  printf("recover: rank %d: failed at %.6f after %d calls: %s: %s\n", rank, realtime(), calls,
         ncclGetErrorString(e), ncclGetLastError(comm));
  fflush(stdout);
  /* The failed call's stream work ends (the kernels stopped at the abort flag). */
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  int victim = nranks - 1, n = nranks - 1;
  ncclComm_t next;
  if (strcmp(how, "shrink") == 0) {
    CHECK(ncclCommShrink(comm, &victim, 1, &next, NULL, NCCL_SHRINK_ABORT) == ncclSuccess);
  } else {
    CHECK(ncclCommAbort(comm) == ncclSuccess);
    ncclUniqueId id2 = share_id(1, rank == 0);
    CHECK(ncclCommInitRank(&next, n, id2, rank) == ncclSuccess);
  }
  int r2 = -1;
  CHECK(ncclCommUserRank(next, &r2) == ncclSuccess && r2 == rank);
  for (int k = 0; k < 100; k++) {
    e = checked_all_reduce(next, rank, n, s, in, out, &bad);
    if (e != ncclSuccess) FAIL("all_reduce %d after %s: %s: %s", k, how, ncclGetErrorString(e), ncclGetLastError(next));
    if (bad) FAIL("all_reduce %d after %s: %d wrong", k, how, bad);
  }
  if (!matmul_ok()) FAIL("matmul after %s", how);
  float* h = malloc(COUNT * sizeof(float));
  CHECK(cudaMemcpy(h, keep, COUNT * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  for (int i = 0; i < COUNT; i++)
    if (h[i] != 100.0f + rank + (float)(i % 5)) FAIL("a buffer made before the kill changed at %d", i);
  free(h);
  printf("recover: rank %d: recovered by %s: 100 all_reduce ok, matmul ok, tensors unchanged\n", rank, how);
  fflush(stdout);
  CHECK(ncclCommDestroy(next) == ncclSuccess);
  if (strcmp(how, "shrink") == 0) ncclCommAbort(comm);
}

static ncclComm_t abort_comm;
static double abort_called, abort_returned;
static void* aborter(void* arg) {
  (void)arg;
  sleep(1);
  abort_called = realtime();
  ncclCommAbort(abort_comm);
  abort_returned = realtime();
  return NULL;
}
static double held_until;
static void CUDART_CB hold(void* arg) { (void)arg; sleep(10); held_until = realtime(); }

static void abort_mode(void) {
  ncclUniqueId id = share_id(0, rank == 0);
  CHECK(ncclCommInitRank(&abort_comm, nranks, id, rank) == ncclSuccess);
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess);
  float* buf = device_filled(rank + 1);
  char path[512];
  if (rank > 0) {
    /* The kernels of ranks 1..N-1 start 10 s late: rank 0's waits on the GPU meanwhile. */
    CHECK(cudaLaunchHostFunc(s, hold, NULL) == cudaSuccess);
    ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, abort_comm, s);
    cudaError_t q = cudaStreamSynchronize(s);
    double done = realtime();
    if (q != cudaSuccess) FAIL("the stream failed: %s", cudaGetErrorString(q));
    printf("recover: rank %d: stream done %.3f s after its hold\n", rank, done - held_until);
    fflush(stdout);
    snprintf(path, sizeof path, "%s/done-%d", dir, rank);
    FILE* f = fopen(path, "w");
    if (f) fclose(f);
    return;
  }
  pthread_t t;
  CHECK(ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, abort_comm, s) == ncclSuccess);
  CHECK(pthread_create(&t, NULL, aborter, NULL) == 0);
  cudaError_t q = cudaStreamSynchronize(s);
  double done = realtime();
  pthread_join(t, NULL);
  if (q != cudaSuccess) FAIL("the stream failed after the abort: %s", cudaGetErrorString(q));
  if (!matmul_ok()) FAIL("matmul after the abort");
  /* Alive until every peer's stream finished: a dead rank 0 would release them anyway. */
  int peers_done = 0;
  for (int i = 0; i < 300 && peers_done < nranks - 1; i++) {
    peers_done = 0;
    for (int r = 1; r < nranks; r++) {
      snprintf(path, sizeof path, "%s/done-%d", dir, r);
      peers_done += access(path, F_OK) == 0;
    }
    if (peers_done < nranks - 1) usleep(100000);
  }
  printf("recover: rank 0: abort returned after %.3f s, stream done after %.3f s, matmul ok, %s\n",
         abort_returned - abort_called, done - abort_called,
         peers_done == nranks - 1 ? "peers done" : "peers not done after 30 s");
  fflush(stdout);
}

int main(int argc, char** argv) {
  if (argc < 5) { fprintf(stderr, "usage: recover kill RANK N DIR shrink|reinit, or recover abort RANK N DIR\n"); return 2; }
  rank = atoi(argv[2]);
  nranks = atoi(argv[3]);
  dir = argv[4];
  int ngpu = 0;
  CHECK(cudaGetDeviceCount(&ngpu) == cudaSuccess && ngpu > 0);
  CHECK(cudaSetDevice(rank % ngpu) == cudaSuccess);
  if (strcmp(argv[1], "kill") == 0 && argc > 5) kill_mode(argv[5]);
  else if (strcmp(argv[1], "abort") == 0) abort_mode();
  else { fprintf(stderr, "usage: recover kill RANK N DIR shrink|reinit, or recover abort RANK N DIR\n"); return 2; }
  return 0;
}
