// Issue 31 experiment: how long ncclAllReduce takes to return to its caller, through whichever
// libnccl.so.2 LD_LIBRARY_PATH gives (NCCL's or railcc's), so railcc's idle return (target:
// 128 MB under 50 us) has NCCL's beside it in one command. The sixteenth session found a
// no-op kernel's launch alone costs 11 us after the caller slept 0.3 ms and 45 us after 12 ms
// (launch_cost.cu): NCCL's launch pays that too.
// Per size (8 B, 8 MB, 128 MB float sum), after 3 warm-up calls, 15 rounds of: the stream
// synchronized, MPI_Barrier, then
//   woken  the thread asleep 12 ms (as after a long call and a barrier's wait), then the call;
//   busy   the thread spinning 12 ms (a training loop's thread is busy before its call);
//   queued the call right behind the previous one, the stream still busy (no sync; 5 calls).
// Rank 0 prints the medians and 90th percentiles (of 15, or 5), us, of the time in
// ncclAllReduce.
// Run under mpirun with one GPU a rank (NCCL_TESTS_DEVICE, else rank modulo the GPUs); build:
// bench/experiments/return_time.sh.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "timing.h"

#define CK(x) do { cudaError_t r = (x); if (r != cudaSuccess) { \
  std::printf("FAIL  %s: %s\n", #x, cudaGetErrorString(r)); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)
#define NC(x) do { ncclResult_t r = (x); if (r != ncclSuccess) { \
  std::printf("FAIL  %s: %s\n", #x, ncclGetErrorString(r)); MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

static void spin_us(double us) {
  double t = now_us();
  while (now_us() - t < us) {
  }
}

static double pct(std::vector<double> v, double f) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, (size_t)(v.size() * f))];
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int gpus = 0;
  CK(cudaGetDeviceCount(&gpus));
  const char* dev = std::getenv("NCCL_TESTS_DEVICE");
  CK(cudaSetDevice(dev ? std::atoi(dev) : rank % gpus));
  ncclUniqueId id;
  if (rank == 0) NC(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  NC(ncclCommInitRank(&comm, n, id, rank));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t sizes[] = {8, 8u << 20, 128u << 20};
  float* buf;
  CK(cudaMalloc(&buf, sizes[2]));
  CK(cudaMemset(buf, 0, sizes[2]));
  if (rank == 0) std::printf("# %d ranks; us in ncclAllReduce, median / p90\n", n);
  for (size_t bytes : sizes) {
    const size_t count = bytes / sizeof(float);
    for (int i = 0; i < 3; i++) NC(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, s));
    CK(cudaStreamSynchronize(s));
    std::vector<double> woken, busy, queued;
    for (int mode = 0; mode < 3; mode++) {
      for (int i = 0; i < (mode == 2 ? 5 : 15); i++) {
        if (mode < 2) {
          CK(cudaStreamSynchronize(s));
          MPI_Barrier(MPI_COMM_WORLD);
          if (mode == 0) usleep(12000);
          else spin_us(12000);
        }
        double t0 = now_us();
        NC(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, s));
        double t = now_us() - t0;
        (mode == 0 ? woken : mode == 1 ? busy : queued).push_back(t);
      }
      CK(cudaStreamSynchronize(s));
    }
    if (rank == 0)
      std::printf("%10zu B  woken %7.1f / %7.1f  busy %7.1f / %7.1f  queued %7.1f / %7.1f\n", bytes,
                  pct(woken, 0.5), pct(woken, 0.9), pct(busy, 0.5), pct(busy, 0.9),
                  pct(queued, 0.5), pct(queued, 0.9));
  }
  CK(cudaStreamSynchronize(s));
  NC(ncclCommDestroy(comm));
  CK(cudaFree(buf));
  MPI_Finalize();
  return 0;
}
