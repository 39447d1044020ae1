/* Built against railcc's nccl.h and linked to its libnccl.so.2 (nccl-compat/tests/c_api.sh).
 * Without a CUDA driver, a GPU call must fail cleanly and say why; with one, it must work. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dlfcn.h>
#include "nccl.h"

/* cudaSetDevice without the CUDA headers: the driver's primary context of GPU `d` made
 * current, as the runtime does (libcuda is loaded by libnccl already). */
static int cudaSetDeviceForTest(int d) {
  typedef int (*get_t)(int*, int);
  typedef int (*retain_t)(void**, int);
  typedef int (*set_t)(void*);
  void* cu = dlopen("libcuda.so.1", RTLD_NOW);
  if (!cu) return -1;
  get_t get = (get_t)dlsym(cu, "cuDeviceGet");
  retain_t retain = (retain_t)dlsym(cu, "cuDevicePrimaryCtxRetain");
  set_t set = (set_t)dlsym(cu, "cuCtxSetCurrent");
  int dev = 0;
  void* ctx = NULL;
  if (!get || !retain || !set || get(&dev, d) || retain(&ctx, dev) || set(ctx)) return -1;
  return 0;
}

/* Host <-> device copies of the current context, without the CUDA headers (as above). */
static int cuCopy(void* dst, const void* src, size_t bytes, int to_device) {
  typedef int (*h2d_t)(unsigned long long, const void*, size_t);
  typedef int (*d2h_t)(void*, unsigned long long, size_t);
  typedef int (*sync_t)(void);
  void* cu = dlopen("libcuda.so.1", RTLD_NOW);
  if (!cu) return -1;
  sync_t sync = (sync_t)dlsym(cu, "cuCtxSynchronize");
  if (!sync || sync()) return -1;
  if (to_device) {
    h2d_t h2d = (h2d_t)dlsym(cu, "cuMemcpyHtoD_v2");
    return h2d ? h2d((unsigned long long)(size_t)dst, src, bytes) : -1;
  }
  d2h_t d2h = (d2h_t)dlsym(cu, "cuMemcpyDtoH_v2");
  return d2h ? d2h(dst, (unsigned long long)(size_t)src, bytes) : -1;
}

#define EXPECT(c) do { if (!(c)) { printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #c); return 1; } } while (0)

int main(int argc, char** argv) {
  int has_driver = argc > 1 && strcmp(argv[1], "driver") == 0;
  /* "driver N": the machine has N GPUs; the test uses up to two of them. */
  int ngpu = argc > 2 ? atoi(argv[2]) : 2;
  if (ngpu < 1 || ngpu > 2) ngpu = 2;
  int v = 0;
  EXPECT(ncclGetVersion(&v) == ncclSuccess);
  EXPECT(v == NCCL_VERSION_CODE && v == 22809);
  EXPECT(ncclGetVersion(NULL) == ncclInvalidArgument);
  EXPECT(strlen(ncclGetErrorString(ncclInvalidArgument)) > 0);
  EXPECT(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0);
  ncclUniqueId id;
  EXPECT(ncclGetUniqueId(&id) == ncclSuccess);

  /* ncclConfig_t values NCCL refuses are refused before anything starts, naming the field. */
  {
    ncclComm_t c = NULL;
    ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
    bad.maxCTAs = 0;
    EXPECT(ncclCommInitRankConfig(&c, 1, id, 0, &bad) == ncclInvalidArgument);
    EXPECT(strstr(ncclGetLastError(NULL), "maxCTAs") != NULL);
    ncclConfig_t tc = NCCL_CONFIG_INITIALIZER;
    tc.trafficClass = 300;
    EXPECT(ncclCommInitRankConfig(&c, 1, id, 0, &tc) == ncclInvalidArgument);
    printf("config refused: %s\n", ncclGetLastError(NULL));
    EXPECT(strstr(ncclGetLastError(NULL), "trafficClass") != NULL);
    EXPECT(c == NULL);
  }

  ncclComm_t comms[2] = {NULL, NULL};
  ncclResult_t r = ncclCommInitAll(comms, has_driver ? ngpu : 2, NULL);
  if (!has_driver) {
    EXPECT(r == ncclUnhandledCudaError);
    const char* why = ncclGetLastError(NULL);
    printf("ncclCommInitAll without a driver: %s: %s\n", ncclGetErrorString(r), why);
    EXPECT(strstr(why, "CUDA driver") != NULL);
    EXPECT(comms[0] == NULL);
  } else {
    EXPECT(r == ncclSuccess);
    int n = 0, rank = -1;
    EXPECT(ncclCommCount(comms[ngpu - 1], &n) == ncclSuccess && n == ngpu);
    EXPECT(ncclCommUserRank(comms[ngpu - 1], &rank) == ncclSuccess && rank == ngpu - 1);
    /* Premultiplied-sum handles: made, used up, reused; a stale or foreign one is refused. */
    float two = 2.0f;
    ncclRedOp_t op1, op2;
    EXPECT(ncclRedOpCreatePreMulSum(&op1, &two, ncclFloat, ncclScalarHostImmediate, comms[0]) == ncclSuccess);
    EXPECT((int)op1 >= (int)ncclNumOps);
    EXPECT(ncclRedOpDestroy(op1, comms[0]) == ncclSuccess);
    EXPECT(ncclRedOpDestroy(op1, comms[0]) == ncclInvalidArgument);
    printf("destroyed twice: %s\n", ncclGetLastError(NULL));
    EXPECT(ncclRedOpCreatePreMulSum(&op2, &two, ncclFloat, ncclScalarHostImmediate, comms[0]) == ncclSuccess);
    EXPECT(op2 == op1);
    EXPECT(ncclRedOpDestroy(ncclSum, comms[0]) == ncclInvalidArgument);
    EXPECT(ncclRedOpDestroy(op2, comms[0]) == ncclSuccess);
    if (ngpu == 2) {
      /* Send/recv between the two ranks of this process (the clique pairs the sides and
       * copies between the GPUs), both ways in one group, on the legacy default streams. */
      enum { N = 1 << 16 };
      static float host[2][N], back[N];
      void* sbuf[2];
      void* rbuf[2];
      for (int g = 0; g < 2; g++) {
        for (int i = 0; i < N; i++) host[g][i] = (float)(g * 1000000 + i);
        EXPECT(cudaSetDeviceForTest(g) == 0);
        EXPECT(ncclMemAlloc(&sbuf[g], sizeof host[g]) == ncclSuccess);
        EXPECT(ncclMemAlloc(&rbuf[g], sizeof host[g]) == ncclSuccess);
        EXPECT(cuCopy(sbuf[g], host[g], sizeof host[g], 1) == 0);
      }
      EXPECT(ncclGroupStart() == ncclSuccess);
      for (int g = 0; g < 2; g++) {
        EXPECT(ncclSend(sbuf[g], N, ncclFloat, 1 - g, comms[g], NULL) == ncclSuccess);
        EXPECT(ncclRecv(rbuf[g], N, ncclFloat, 1 - g, comms[g], NULL) == ncclSuccess);
      }
      EXPECT(ncclGroupEnd() == ncclSuccess);
      int wrong = 0;
      for (int g = 0; g < 2; g++) {
        EXPECT(cudaSetDeviceForTest(g) == 0);
        EXPECT(cuCopy(back, rbuf[g], sizeof back, 0) == 0);
        /* C_API_BREAK=1 expects each rank's own data back: the check must then fail. */
        const float* want = getenv("C_API_BREAK") ? host[g] : host[1 - g];
        for (int i = 0; i < N; i++) wrong += back[i] != want[i];
        EXPECT(ncclMemFree(sbuf[g]) == ncclSuccess && ncclMemFree(rbuf[g]) == ncclSuccess);
      }
      printf("send/recv between the 2 ranks of this process, both ways: %d of %d elements wrong\n", wrong, 2 * N);
      EXPECT(wrong == 0);
    }
    for (int i = 0; i < ngpu; i++) EXPECT(ncclCommDestroy(comms[i]) == ncclSuccess);

    /* Non-blocking init (config.blocking = 0), ngpu ranks from this one thread: each call
     * returns at once (ncclInProgress) although the others have not joined yet (a blocking
     * init would wait for them here until the deadline); ncclCommGetAsyncError then turns to
     * ncclSuccess, bounded in time. */
    ncclUniqueId nid;
    EXPECT(ncclGetUniqueId(&nid) == ncclSuccess);
    ncclComm_t nb[2] = {NULL, NULL};
    int in_progress = 0;
    for (int i = 0; i < ngpu; i++) {
      ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
      cfg.blocking = 0;
      EXPECT(cudaSetDeviceForTest(i) == 0);
      ncclResult_t ir = ncclCommInitRankConfig(&nb[i], ngpu, nid, i, &cfg);
      EXPECT(ir == ncclInProgress || ir == ncclSuccess);
      in_progress += ir == ncclInProgress;
      EXPECT(nb[i] != NULL);
    }
    if (ngpu == 2) EXPECT(in_progress >= 1);
    for (int i = 0; i < ngpu; i++) {
      ncclResult_t st = ncclInProgress;
      for (int t = 0; t < 6000 && st == ncclInProgress; t++) {
        EXPECT(ncclCommGetAsyncError(nb[i], &st) == ncclSuccess);
        if (st == ncclInProgress) usleep(10000);
      }
      EXPECT(st == ncclSuccess);
      int n = 0;
      EXPECT(ncclCommCount(nb[i], &n) == ncclSuccess && n == ngpu);
    }
    printf("non-blocking init of %d rank(s): %d returned ncclInProgress, then ncclSuccess\n", ngpu, in_progress);
    for (int i = 0; i < ngpu; i++) EXPECT(ncclCommDestroy(nb[i]) == ncclSuccess);
  }

  /* Arguments are checked before anything touches a GPU. */
  ncclComm_t c = NULL;
  EXPECT(ncclCommInitRank(&c, 2, id, 5) == ncclInvalidArgument);
  printf("rank 5 of 2: %s\n", ncclGetLastError(NULL));
  ncclUniqueId zero;
  memset(&zero, 0, sizeof zero);
  EXPECT(ncclCommInitRank(&c, 2, zero, 0) == ncclInvalidArgument);
  EXPECT(ncclAllReduce(NULL, NULL, 1, ncclFloat, ncclSum, NULL, NULL) == ncclInvalidArgument);
  EXPECT(ncclGather(NULL, NULL, 1, ncclFloat, 0, NULL, NULL) == ncclInvalidArgument);
  EXPECT(ncclScatter(NULL, NULL, 1, ncclFloat, 0, NULL, NULL) == ncclInvalidArgument);
  EXPECT(ncclAllReduce(NULL, NULL, 1, (ncclDataType_t)ncclNumTypes, ncclSum, NULL, NULL) == ncclInvalidArgument);
  printf("datatype %d: %s\n", (int)ncclNumTypes, ncclGetLastError(NULL));
  EXPECT(strstr(ncclGetLastError(NULL), "datatype 12") != NULL);
  EXPECT(ncclAllReduce(NULL, NULL, 0, ncclFloat8e5m2, ncclSum, NULL, NULL) == ncclInvalidArgument);
  EXPECT(strstr(ncclGetLastError(NULL), "comm is NULL") != NULL);
  float one = 1.0f;
  ncclRedOp_t op;
  EXPECT(ncclRedOpCreatePreMulSum(NULL, &one, ncclFloat, ncclScalarHostImmediate, NULL) == ncclInvalidArgument);
  printf("premulsum: %s\n", ncclGetLastError(NULL));
  EXPECT(ncclRedOpCreatePreMulSum(&op, &one, ncclFloat, (ncclScalarResidence_t)7, NULL) == ncclInvalidArgument);
  EXPECT(strstr(ncclGetLastError(NULL), "residence 7") != NULL);
  EXPECT(ncclRedOpCreatePreMulSum(&op, &one, ncclFloat, ncclScalarHostImmediate, NULL) == ncclInvalidArgument);
  EXPECT(strstr(ncclGetLastError(NULL), "comm is NULL") != NULL);
  int ex[1] = {1};
  EXPECT(ncclCommShrink(NULL, ex, 1, &c, NULL, NCCL_SHRINK_DEFAULT) == ncclInvalidArgument);
  EXPECT(ncclGroupEnd() == ncclInvalidUsage);
  EXPECT(ncclGroupStart() == ncclSuccess && ncclGroupEnd() == ncclSuccess);
  printf("c_api: ok\n");
  return 0;
}
