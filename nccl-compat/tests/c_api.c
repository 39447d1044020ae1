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
  EXPECT(v == NCCL_VERSION_CODE && v == 22809);
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
  EXPECT(ncclGroupEnd() == ncclInvalidUsage);
  EXPECT(ncclGroupStart() == ncclSuccess && ncclGroupEnd() == ncclSuccess);
  printf("c_api: ok\n");
  return 0;
}
