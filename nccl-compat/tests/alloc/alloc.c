/* libnccl with buffers from any allocator (issue 29 item 1), one process per GPU under
 * `mpirun -np 2`, checked by alloc.sh:
 *   alloc KIND [KIND1]   rank 0's buffers of KIND, rank 1's of KIND1 (default KIND):
 *     malloc   cudaMalloc (legacy CUDA IPC);
 *     vmm      cuMemCreate pieces of the granularity (2 MiB) side by side, POSIX descriptor
 *              handles allowed (what PyTorch's expandable segments make);
 *     nofd     the same without shareable handles (nothing a peer can map: bounced);
 *     async    cudaMallocAsync from the device's default pool (likewise);
 *     ncclmem  ncclMemAlloc.
 * For 4 KB, 4 MB and 64 MB (at an odd offset in the allocation): all_reduce out of place and
 * in place, all_gather out of place and in place, reduce_scatter, broadcast from rank 1, and
 * a send/recv exchange in a group, every element checked. For vmm, a piece of each buffer is
 * then unmapped, freed and replaced by a new allocation at the same address (as PyTorch does
 * when it releases and grows a segment), and all_reduce runs again: a peer that kept the old
 * mapping reads stale memory.
 * Prints "alloc: rank R: <kind> <size> <what>: ok|N wrong|error ..." and a last line
 * "alloc: rank R: N checks ok, M failed". Exit status 1 if any failed. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "nccl.h"

#define CHECK(x) do { if (!(x)) { fprintf(stderr, "alloc: setup failed at %s:%d: %s\n", __FILE__, __LINE__, #x); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)
#define PIECES_MAX 160

typedef struct {
  const char* kind;
  char* base;       /* the allocation */
  size_t bytes;     /* its size */
  size_t gran;      /* vmm: piece size */
  int npieces;
  CUmemGenericAllocationHandle h[PIECES_MAX];
  int fd;           /* vmm: pieces allow POSIX descriptors */
} Buf;

static int rank, dev;
static cudaStream_t stream;
static ncclComm_t comm;
static int oks, fails;
static int replace_too; /* both ranks' buffers are vmm: the piece replacement runs on both */

static CUmemAllocationProp prop_of(int fd) {
  CUmemAllocationProp p;
  memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = dev;
  p.requestedHandleTypes = fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  return p;
}

static void map_piece(Buf* b, int i) {
  CUmemAllocationProp p = prop_of(b->fd);
  CHECK(cuMemCreate(&b->h[i], b->gran, &p, 0) == CUDA_SUCCESS);
  CHECK(cuMemMap((CUdeviceptr)b->base + i * b->gran, b->gran, 0, b->h[i], 0) == CUDA_SUCCESS);
  CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CHECK(cuMemSetAccess((CUdeviceptr)b->base + i * b->gran, b->gran, &a, 1) == CUDA_SUCCESS);
}

static Buf make(const char* kind, size_t bytes) {
  Buf b;
  memset(&b, 0, sizeof b);
  b.kind = kind;
  b.bytes = bytes;
  if (!strcmp(kind, "malloc")) {
    CHECK(cudaMalloc((void**)&b.base, bytes) == cudaSuccess);
  } else if (!strcmp(kind, "async")) {
    CHECK(cudaMallocAsync((void**)&b.base, bytes, stream) == cudaSuccess);
    CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
  } else if (!strcmp(kind, "ncclmem")) {
    CHECK(ncclMemAlloc((void**)&b.base, bytes) == ncclSuccess);
  } else {
    b.fd = !strcmp(kind, "vmm");
    CHECK(b.fd || !strcmp(kind, "nofd"));
    CUmemAllocationProp p = prop_of(b.fd);
    CHECK(cuMemGetAllocationGranularity(&b.gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS);
    b.npieces = (int)((bytes + b.gran - 1) / b.gran);
    CHECK(b.npieces <= PIECES_MAX);
    b.bytes = b.npieces * b.gran;
    CUdeviceptr va;
    CHECK(cuMemAddressReserve(&va, b.bytes, b.gran, 0, 0) == CUDA_SUCCESS);
    b.base = (char*)va;
    for (int i = 0; i < b.npieces; i++) map_piece(&b, i);
  }
  return b;
}

static void release(Buf* b) {
  if (!strcmp(b->kind, "malloc")) CHECK(cudaFree(b->base) == cudaSuccess);
  else if (!strcmp(b->kind, "async")) CHECK(cudaFreeAsync(b->base, stream) == cudaSuccess);
  else if (!strcmp(b->kind, "ncclmem")) CHECK(ncclMemFree(b->base) == ncclSuccess);
  else {
    for (int i = 0; i < b->npieces; i++) {
      CHECK(cuMemUnmap((CUdeviceptr)b->base + i * b->gran, b->gran) == CUDA_SUCCESS);
      CHECK(cuMemRelease(b->h[i]) == CUDA_SUCCESS);
    }
    CHECK(cuMemAddressFree((CUdeviceptr)b->base, b->bytes) == CUDA_SUCCESS);
  }
  CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
}

/* Piece 1 (or 0) replaced by a new allocation at the same address; contents are lost. */
static void replace_piece(Buf* b) {
  int i = b->npieces > 1 ? 1 : 0;
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(cuMemUnmap((CUdeviceptr)b->base + i * b->gran, b->gran) == CUDA_SUCCESS);
  CHECK(cuMemRelease(b->h[i]) == CUDA_SUCCESS);
  map_piece(b, i);
}

static float value(int r, size_t i, int salt) { return (float)((i + salt) % 7 + r + 1); }

static void fill(float* d, size_t n, int r, int salt) {
  float* h = malloc(n * sizeof(float));
  CHECK(h);
  for (size_t i = 0; i < n; i++) h[i] = value(r, i, salt);
  CHECK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  free(h);
}

/* Compares n floats at d with want(i); prints and counts the verdict. */
typedef float (*Want)(size_t i, size_t n, int salt);
static void verdict(const char* kind, size_t bytes, const char* what, ncclResult_t r, const float* d, size_t n, Want want, int salt) {
  if (r == ncclSuccess && cudaStreamSynchronize(stream) != cudaSuccess) r = ncclUnhandledCudaError;
  if (r != ncclSuccess) {
    printf("alloc: rank %d: %s %zu %s: error %s: %s\n", rank, kind, bytes, what, ncclGetErrorString(r), ncclGetLastError(comm));
    fails++;
    return;
  }
  float* h = malloc(n * sizeof(float));
  CHECK(h);
  CHECK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; i++)
    if (h[i] != want(i, n, salt) && bad++ == 0) first = i;
  free(h);
  if (bad) {
    printf("alloc: rank %d: %s %zu %s: %zu wrong (first at %zu)\n", rank, kind, bytes, what, bad, first);
    fails++;
  } else {
    printf("alloc: rank %d: %s %zu %s: ok\n", rank, kind, bytes, what);
    oks++;
  }
  fflush(stdout);
}

static float w_sum(size_t i, size_t n, int s) { (void)n; return value(0, i, s) + value(1, i, s); }
/* all_gather: rank r's part is its own values of the first n/2 elements. */
static float w_gather(size_t i, size_t n, int s) { size_t h = n / 2; return value(i < h ? 0 : 1, i % h, s); }
static float w_scatter(size_t i, size_t n, int s) { (void)n; return value(0, i + rank * n, s) + value(1, i + rank * n, s); }
static float w_root1(size_t i, size_t n, int s) { (void)n; return value(1, i, s); }
static float w_peer(size_t i, size_t n, int s) { (void)n; return value(1 - rank, i, s); }

static void run(const char* kind, size_t bytes) {
  /* An odd offset in the allocation, as a caching allocator's piece of a segment. */
  const size_t off = 512;
  size_t n = bytes / sizeof(float);
  Buf a = make(kind, bytes + off), b = make(kind, 2 * bytes + off);
  float *x = (float*)(a.base + off), *y = (float*)(b.base + off);
  ncclResult_t r;

  fill(x, n, rank, 0);
  r = ncclAllReduce(x, y, n, ncclFloat, ncclSum, comm, stream);
  verdict(kind, bytes, "all_reduce", r, y, n, w_sum, 0);
  fill(y, n, rank, 1);
  r = ncclAllReduce(y, y, n, ncclFloat, ncclSum, comm, stream);
  verdict(kind, bytes, "all_reduce in place", r, y, n, w_sum, 1);

  fill(x, n / 2, rank, 2);
  r = ncclAllGather(x, y, n / 2, ncclFloat, comm, stream);
  verdict(kind, bytes, "all_gather", r, y, n, w_gather, 2);
  fill(y + rank * (n / 2), n / 2, rank, 3);
  r = ncclAllGather(y + rank * (n / 2), y, n / 2, ncclFloat, comm, stream);
  verdict(kind, bytes, "all_gather in place", r, y, n, w_gather, 3);

  fill(y, 2 * n, rank, 4);
  r = ncclReduceScatter(y, x, n, ncclFloat, ncclSum, comm, stream);
  verdict(kind, bytes, "reduce_scatter", r, x, n, w_scatter, 4);

  fill(x, n, rank, 5);
  r = ncclBroadcast(x, x, n, ncclFloat, 1, comm, stream);
  verdict(kind, bytes, "broadcast", r, x, n, w_root1, 5);

  fill(x, n, rank, 6);
  r = ncclGroupStart();
  if (r == ncclSuccess) r = ncclSend(x, n, ncclFloat, 1 - rank, comm, stream);
  if (r == ncclSuccess) r = ncclRecv(y, n, ncclFloat, 1 - rank, comm, stream);
  ncclResult_t e = ncclGroupEnd();
  verdict(kind, bytes, "send/recv", r == ncclSuccess ? e : r, y, n, w_peer, 6);

  if (replace_too) {
    replace_piece(&a);
    replace_piece(&b);
    fill(x, n, rank, 7);
    r = ncclAllReduce(x, y, n, ncclFloat, ncclSum, comm, stream);
    verdict(kind, bytes, "all_reduce after a piece was replaced", r, y, n, w_sum, 7);
  }
  release(&a);
  release(&b);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int n = 0, ngpu = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  CHECK(n == 2 && argc >= 2);
  const char* kind = argc > 2 && rank == 1 ? argv[2] : argv[1];
  replace_too = !strcmp(argv[1], "vmm") && (argc < 3 || !strcmp(argv[2], "vmm"));
  CHECK(cudaGetDeviceCount(&ngpu) == cudaSuccess && ngpu > 0);
  dev = rank % ngpu;
  CHECK(cudaSetDevice(dev) == cudaSuccess);
  CHECK(cudaFree(0) == cudaSuccess);
  CHECK(cudaStreamCreate(&stream) == cudaSuccess);
  ncclUniqueId id;
  if (rank == 0) CHECK(ncclGetUniqueId(&id) == ncclSuccess);
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  CHECK(ncclCommInitRank(&comm, 2, id, rank) == ncclSuccess);
  size_t sizes[] = {4096, 4 << 20, 64 << 20};
  for (int i = 0; i < 3; i++) run(kind, sizes[i]);
  printf("alloc: rank %d: %d checks ok, %d failed\n", rank, oks, fails);
  fflush(stdout);
  ncclCommDestroy(comm);
  MPI_Finalize();
  return fails ? 1 : 0;
}
