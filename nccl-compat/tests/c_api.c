/* Built against railcc's nccl.h and linked to its libnccl.so.2 (nccl-compat/tests/c_api.sh).
 * Without a CUDA driver, a GPU call must fail cleanly and say why; with one, it must work. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "nccl.h"

#define EXPECT(c) do { if (!(c)) { printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #c); return 1; } } while (0)

int main(int argc, char** argv) {
  int has_driver = argc > 1 && strcmp(argv[1], "driver") == 0;
  /* "driver N": the machine has N GPUs; the test uses up to two of them. */
  int ngpu = argc > 2 ? atoi(argv[2]) : 2;
  if (ngpu < 1 || ngpu > 2) ngpu = 2;
  int v = 0;
  EXPECT(ncclGetVersion(&v) == ncclSuccess);
  EXPECT(v == NCCL_VERSION_CODE && v == 21003);
  EXPECT(ncclGetVersion(NULL) == ncclInvalidArgument);
  EXPECT(strlen(ncclGetErrorString(ncclInvalidArgument)) > 0);
  EXPECT(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0);
  ncclUniqueId id;
  EXPECT(ncclGetUniqueId(&id) == ncclSuccess);

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
    for (int i = 0; i < ngpu; i++) EXPECT(ncclCommDestroy(comms[i]) == ncclSuccess);
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
  EXPECT(ncclAllReduce(NULL, NULL, 1, (ncclDataType_t)10, ncclSum, NULL, NULL) == ncclInvalidArgument);
  EXPECT(ncclRedOpCreatePreMulSum(NULL, NULL, ncclFloat, ncclScalarHostImmediate, NULL) == ncclInvalidUsage);
  printf("premulsum: %s\n", ncclGetLastError(NULL));
  EXPECT(ncclGroupEnd() == ncclInvalidUsage);
  EXPECT(ncclGroupStart() == ncclSuccess && ncclGroupEnd() == ncclSuccess);
  printf("c_api: ok\n");
  return 0;
}
