/* libnccl honours railcc's configuration in both ways of running (issue 28), checked by
 * config_env.sh on a GPU machine:
 *   config_env inproc timeout HOLD   one process drives GPUs 0 and 1 (ncclCommInitAll); GPU 1's
 *                                    stream is held HOLD s by a host function, so GPU 0's
 *                                    kernel waits for a peer that comes late: with
 *                                    RAILCC_TIMEOUT_MS below HOLD s the call must fail first;
 *   config_env inproc late HOLD      the same without RAILCC_TIMEOUT_MS: libnccl waits as NCCL
 *                                    does (no deadline), so the call completes, checked;
 *   config_env inproc run            one all_reduce on GPUs 0 and 1, result checked;
 *   mpirun -np 2 config_env mpi timeout HOLD   one process per GPU; rank 1 calls HOLD s late;
 *   mpirun -np 2 config_env mpi late HOLD      likewise, to complete (no deadline);
 *   mpirun -np 2 config_env mpi run  one all_reduce, result checked;
 *   config_env inproc ctas / mpirun -np 2 config_env mpi ctas: communicators made by
 *                                    ncclCommInitRankConfig with maxCTAs 8 and commName
 *                                    "ctas-test" (one process: in a group), a 256 MB
 *                                    all_reduce checked; the script reads NCCL_DEBUG=INFO.
 * CONFIG_COUNT sets the floats of the timeout, late and run calls (default 1 Mi; 1024 is
 * small enough for the low-latency kernel, whose calls launch without waiting on the host).
 * A call that returned and whose stream finished can still have failed: the communicator's
 * asynchronous error (ncclCommGetAsyncError, as PyTorch's watchdog asks) counts too.
 * Prints "config_env: <mode> <what>: ok|failed after X.X s: reason|completed after X.X s";
 * the script judges. Exit status 1 only on a setup failure. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cuda_runtime.h>
#include "nccl.h"

static int COUNT = 1 << 20;
#define CHECK(c) do { if (!(c)) { printf("config_env: SETUP FAIL %s:%d: %s (%s)\n", __FILE__, __LINE__, #c, ncclGetLastError(NULL)); fflush(stdout); exit(1); } } while (0)

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int hold_s = 0;
/* The ways of running in which one rank comes late. */
static int holds(const char* what) { return strcmp(what, "timeout") == 0 || strcmp(what, "late") == 0; }
/* The communicator's asynchronous error (ncclSuccess when none). */
static ncclResult_t async_error(ncclComm_t c) {
  ncclResult_t a = ncclSuccess;
  if (ncclCommGetAsyncError(c, &a) != ncclSuccess) return ncclInternalError;
  return a;
}
static void CUDART_CB hold(void* arg) { (void)arg; sleep(hold_s); }

static float* filled(int value) {
  float* host = (float*)malloc(COUNT * sizeof(float));
  for (int i = 0; i < COUNT; i++) host[i] = (float)value;
  float* d;
  CHECK(cudaMalloc((void**)&d, COUNT * sizeof(float)) == cudaSuccess);
  CHECK(cudaMemcpy(d, host, COUNT * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  free(host);
  return d;
}

static int wrong(const float* d, float want) {
  float* host = (float*)malloc(COUNT * sizeof(float));
  if (cudaMemcpy(host, d, COUNT * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) { free(host); return COUNT; }
  int w = 0;
  for (int i = 0; i < COUNT; i++) w += host[i] != want;
  free(host);
  return w;
}

/* The verdict of one call: "ok" (and the result checked), or how it ended and when. */
static void report(const char* mode, const char* what, double t0, ncclResult_t r, cudaError_t e, int bad) {
  double dt = now() - t0;
  if (r != ncclSuccess)
    printf("config_env: %s %s: failed after %.1f s: %s: %s\n", mode, what, dt, ncclGetErrorString(r), ncclGetLastError(NULL));
  else if (e != cudaSuccess)
    printf("config_env: %s %s: failed after %.1f s: %s\n", mode, what, dt, cudaGetErrorString(e));
  else if (bad)
    printf("config_env: %s %s: completed after %.1f s with %d wrong elements\n", mode, what, dt, bad);
  else
    printf("config_env: %s %s: completed after %.1f s ok\n", mode, what, dt);
  fflush(stdout);
}

/* maxCTAs 8 and a name, as torch's ProcessGroupNCCL.Options or Megatron set them. */
static ncclConfig_t ctas_config(void) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  c.maxCTAs = 8;
  c.commName = "ctas-test";
  return c;
}

static void inproc(const char* what) {
  int ngpu = 0;
  CHECK(cudaGetDeviceCount(&ngpu) == cudaSuccess && ngpu >= 2);
  int devs[2] = {0, 1};
  ncclComm_t comms[2];
  if (strcmp(what, "ctas") == 0) {
    COUNT = 64 << 20;
    ncclUniqueId id;
    CHECK(ncclGetUniqueId(&id) == ncclSuccess);
    ncclConfig_t cfg = ctas_config();
    CHECK(ncclGroupStart() == ncclSuccess);
    for (int g = 0; g < 2; g++) {
      CHECK(cudaSetDevice(g) == cudaSuccess);
      CHECK(ncclCommInitRankConfig(&comms[g], 2, id, g, &cfg) == ncclSuccess);
    }
    CHECK(ncclGroupEnd() == ncclSuccess);
  } else {
    CHECK(ncclCommInitAll(comms, 2, devs) == ncclSuccess);
  }
  cudaStream_t s[2];
  float* buf[2];
  for (int g = 0; g < 2; g++) {
    CHECK(cudaSetDevice(g) == cudaSuccess);
    CHECK(cudaStreamCreate(&s[g]) == cudaSuccess);
    buf[g] = filled(g + 1);
  }
  if (holds(what)) {
    CHECK(cudaSetDevice(1) == cudaSuccess);
    CHECK(cudaLaunchHostFunc(s[1], hold, NULL) == cudaSuccess);
  }
  double t0 = now();
  ncclResult_t r = ncclGroupStart();
  for (int g = 0; g < 2 && r == ncclSuccess; g++)
    r = ncclAllReduce(buf[g], buf[g], COUNT, ncclFloat, ncclSum, comms[g], (railccStream_t)s[g]);
  if (r == ncclSuccess) r = ncclGroupEnd();
  cudaError_t e = cudaSuccess;
  if (r == ncclSuccess) {
    CHECK(cudaSetDevice(0) == cudaSuccess);
    e = cudaStreamSynchronize(s[0]);
  }
  if (r == ncclSuccess && e == cudaSuccess) r = async_error(comms[0]);
  int bad = (r == ncclSuccess && e == cudaSuccess) ? wrong(buf[0], 3.0f) : 0;
  report("inproc", what, t0, r, e, bad);
}

static void per_process(const char* what) {
  int rank = 0, n = 0, ngpu = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  CHECK(n == 2);
  CHECK(cudaGetDeviceCount(&ngpu) == cudaSuccess && ngpu > 0);
  CHECK(cudaSetDevice(rank % ngpu) == cudaSuccess);
  ncclUniqueId id;
  if (rank == 0) CHECK(ncclGetUniqueId(&id) == ncclSuccess);
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  if (strcmp(what, "ctas") == 0) {
    COUNT = 64 << 20;
    ncclConfig_t cfg = ctas_config();
    CHECK(ncclCommInitRankConfig(&comm, n, id, rank, &cfg) == ncclSuccess);
  } else {
    CHECK(ncclCommInitRank(&comm, n, id, rank) == ncclSuccess);
  }
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess);
  float* buf = filled(rank + 1);
  MPI_Barrier(MPI_COMM_WORLD);
  int late = holds(what) && rank == 1;
  if (late) sleep(hold_s);
  double t0 = now();
  ncclResult_t r = ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, (railccStream_t)s);
  cudaError_t e = r == ncclSuccess ? cudaStreamSynchronize(s) : cudaSuccess;
  if (r == ncclSuccess && e == cudaSuccess) r = async_error(comm);
  int bad = (r == ncclSuccess && e == cudaSuccess) ? wrong(buf, 3.0f) : 0;
  /* Rank 1 is the late one: its own outcome is not what is judged. */
  if (!late) report("mpi", what, t0, r, e, bad);
}

int main(int argc, char** argv) {
  if (argc < 3) { fprintf(stderr, "usage: config_env inproc|mpi timeout|late|run|ctas [HOLD_S]\n"); return 2; }
  hold_s = argc > 3 ? atoi(argv[3]) : 8;
  const char* count = getenv("CONFIG_COUNT");
  if (count && atoi(count) > 0 && atoi(count) <= (1 << 20)) COUNT = atoi(count);
  if (strcmp(argv[1], "mpi") == 0) {
    MPI_Init(&argc, &argv);
    per_process(argv[2]);
    fflush(stdout);
    /* After a timeout the peer's GPU work may never end: no MPI_Finalize barrier then (the
     * verdict is printed; mpirun may report the early exit). */
    if (strcmp(argv[2], "timeout") == 0) _exit(0);
    MPI_Finalize();
    return 0;
  }
  inproc(argv[2]);
  fflush(stdout);
  _exit(0);
}
