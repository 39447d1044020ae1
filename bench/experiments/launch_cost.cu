// Issue 31 experiment: why a launch of the network staging kernel on an idle stream takes 20-23
// us of the caller's time against 6 us on a busy one (bench/results/README.md, fourteenth
// session), whatever its parameter's size (2.4-4.9 KB). Times cudaLaunchKernel on the caller's
// thread for kernels of parameters of 256 B to 32 KB:
//   idle-sleep  the stream synchronized, then the thread asleep 300 us (as after a barrier);
//   idle-spin   the stream synchronized, then the thread spinning 300 us (its caches warm);
//   busy        behind a 20 ms kernel on the same stream (the launch only queues).
// Then the no-op launch after the caller slept 0.3, 3 and 12 ms. Then whether the kernel
// launched slows its own launch and what the caller does next (an event record, a 256 KiB
// memset of the caller's own memory) on an idle stream: a no-op, a kernel writing host memory
// at once (4 blocks of 512 threads, as the staging kernel copies a piece into the pinned
// ring), the same after spinning 30 us, one writing device memory, and two that only spin
// 30 us. (A gated launch, the stream held behind a host word until the caller was done, was
// measured in the sixteenth session and dropped: bench/results/issue31/s17/e.) Last,
// railcc's own way to launch (cuLaunchKernel with the parameter as one buffer,
// CU_LAUNCH_PARAM_BUFFER_*, of fewer bytes than declared: only the entries a launch uses): a
// 4000-byte parameter passed whole, 2700 bytes of it (a 128 MB call's) and 336 (an 8 B
// call's), idle and busy. Prints medians of 50 (30 for the sleeps), us.
// Build: nvcc -O2 -arch=sm_90 -DWITH_DRIVER -o /tmp/launch_cost launch_cost.cu -lcuda (without
// -DWITH_DRIVER and -lcuda: the runtime API's parts alone).
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
#include "timing.h"

#define CK(x) do { cudaError_t r = (x); if (r != cudaSuccess) { \
  std::printf("FAIL  %s: %s\n", #x, cudaGetErrorString(r)); return 1; } } while (0)

static void spin_us(double us) {
  double t = now_us();
  while (now_us() - t < us) {
  }
}

template <int N> struct Param { unsigned int w[N / 4]; };

template <int N> __global__ void take(const Param<N> p, unsigned int* out) {
  if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = p.w[N / 4 - 1];
}

__device__ void spin_ns(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); while (t - t0 < ns);
}
__global__ void wait_ns(unsigned long long ns) { spin_ns(ns); }

// Writes `n` 16-byte words (of host memory, as the staging kernel copies a piece in, or of
// device memory) with 16-byte stores, the first after `delay_ns`.
__global__ void write_host(uint4* dst, size_t n, unsigned long long delay_ns) {
  if (delay_ns) spin_ns(delay_ns);
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    dst[i] = make_uint4(i, i, i, i);
}

template <int N> int row(cudaStream_t s, unsigned int* out) {
  Param<N> p;
  std::memset(&p, 1, sizeof p);
  std::vector<double> sleep, spin, busy;
  for (int i = 0; i < 50; i++) {
    CK(cudaStreamSynchronize(s));
    usleep(300);
    double t = now_us();
    take<N><<<1, 32, 0, s>>>(p, out);
    sleep.push_back(now_us() - t);
    CK(cudaStreamSynchronize(s));
    spin_us(300);
    t = now_us();
    take<N><<<1, 32, 0, s>>>(p, out);
    spin.push_back(now_us() - t);
  }
  CK(cudaStreamSynchronize(s));
  wait_ns<<<1, 1, 0, s>>>(20000000ull);
  for (int i = 0; i < 50; i++) {
    double t = now_us();
    take<N><<<1, 32, 0, s>>>(p, out);
    busy.push_back(now_us() - t);
  }
  CK(cudaStreamSynchronize(s));
  CK(cudaGetLastError());
  std::printf("%7d B  launch: idle-sleep %6.1f  idle-spin %6.1f  busy %6.1f\n", N, median(sleep),
              median(spin), median(busy));
  return 0;
}

#ifdef WITH_DRIVER
// One parameter, its pointer first, so a launch passing only its first bytes still names
// where to write (as railcc's staging kernel: a header, then entries).
template <int N> struct Param1 { unsigned int* out; unsigned int w[(N - 8) / 4]; };

template <int N> __global__ void take1(const Param1<N> p) {
  if (threadIdx.x == 0 && blockIdx.x == 0) p.out[0] = p.w[0];
}

#define CU(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { const char* m = "?"; \
  cuGetErrorString(r, &m); std::printf("FAIL  %s: %s\n", #x, m); return 1; } } while (0)

template <int N> int row_buffer(cudaStream_t s, unsigned int* out, size_t pass) {
  cudaFunction_t f;
  CK(cudaGetFuncBySymbol(&f, (const void*)take1<N>));
  Param1<N> p;
  std::memset(&p, 1, sizeof p);
  p.out = out;
  size_t size = pass;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &p, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  CUfunction fn = (CUfunction)f;
  CUstream cs = (CUstream)s;
  std::vector<double> sleep, spin, busy;
  for (int i = 0; i < 50; i++) {
    CK(cudaStreamSynchronize(s));
    usleep(300);
    double t = now_us();
    CU(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, cs, nullptr, extra));
    sleep.push_back(now_us() - t);
    CK(cudaStreamSynchronize(s));
    spin_us(300);
    t = now_us();
    CU(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, cs, nullptr, extra));
    spin.push_back(now_us() - t);
  }
  CK(cudaStreamSynchronize(s));
  wait_ns<<<1, 1, 0, s>>>(20000000ull);
  for (int i = 0; i < 50; i++) {
    double t = now_us();
    CU(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, cs, nullptr, extra));
    busy.push_back(now_us() - t);
  }
  CK(cudaStreamSynchronize(s));
  CK(cudaGetLastError());
  std::printf("%7d B declared, %5zu passed as one buffer: idle-sleep %6.1f  idle-spin %6.1f  busy %6.1f\n",
              N, pass, median(sleep), median(spin), median(busy));
  return 0;
}
#endif

int main() {
  cudaStream_t s;
  CK(cudaSetDevice(0));
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned int* out;
  CK(cudaMalloc(&out, 64));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int drv = 0;
  CK(cudaDriverGetVersion(&drv));
  std::printf("# %s, driver %d; us on the caller's thread, medians of 50\n", prop.name, drv);
  if (row<256>(s, out) || row<1024>(s, out) || row<2048>(s, out) || row<3072>(s, out) ||
      row<4000>(s, out) || row<16384>(s, out) || row<32000>(s, out))
    return 1;

  // How long the caller slept (a bench's idle call follows a 10 ms call and a barrier):
  // the no-op launch after 0.3, 3 and 12 ms asleep.
  for (int sleep_us : {300, 3000, 12000}) {
    std::vector<double> launch;
    for (int i = 0; i < 30; i++) {
      CK(cudaStreamSynchronize(s));
      usleep(sleep_us);
      double t0 = now_us();
      take<256><<<1, 32, 0, s>>>(Param<256>{}, out);
      launch.push_back(now_us() - t0);
    }
    CK(cudaStreamSynchronize(s));
    std::printf("no-op kernel after %5d us asleep: launch %6.1f\n", sleep_us, median(launch));
  }

  const size_t bytes = 128u << 20;
  uint4* host;
  CK(cudaHostAlloc(&host, bytes, cudaHostAllocMapped));
  uint4* dev_view;
  CK(cudaHostGetDevicePointer(&dev_view, host, 0));
  std::vector<char> mine(256 << 10);
  cudaEvent_t ev;
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  uint4* dev_buf;
  CK(cudaMalloc(&dev_buf, bytes));
  // 0 a no-op; 1 writes host memory at once; 2 the same after 30 us; 3 writes device memory;
  // 4 and 5 spin 30 us, one thread and 4 blocks of 512 (is it the kernel's length?).
  const char* kinds[] = {"no-op                        ", "host-writing                 ",
                         "host-writing after 30 us     ", "device-writing               ",
                         "spinning 30 us, 1 thread     ", "spinning 30 us, 4 x 512      "};
  for (int writer = 0; writer < 6; writer++) {
    std::vector<double> launch, record, memset_us;
    for (int i = 0; i < 50; i++) {
      CK(cudaStreamSynchronize(s));
      usleep(300);
      double t0 = now_us();
      if (writer == 0) take<256><<<1, 32, 0, s>>>(Param<256>{}, out);
      else if (writer == 4) wait_ns<<<1, 1, 0, s>>>(30000ull);
      else if (writer == 5) wait_ns<<<4, 512, 0, s>>>(30000ull);
      else write_host<<<4, 512, 0, s>>>(writer == 3 ? dev_buf : dev_view, bytes / 16,
                                         writer == 2 ? 30000ull : 0ull);
      double t1 = now_us();
      CK(cudaEventRecord(ev, s));
      double t2 = now_us();
      std::memset(mine.data(), i, mine.size());
      double t3 = now_us();
      launch.push_back(t1 - t0);
      record.push_back(t2 - t1);
      memset_us.push_back(t3 - t2);
    }
    CK(cudaStreamSynchronize(s));
    CK(cudaGetLastError());
    std::printf("%s kernel, idle-sleep: launch %6.1f  then event record %6.1f  then 256 KiB memset %6.1f (%d)\n",
                kinds[writer], median(launch), median(record),
                median(memset_us), mine[7]);
  }
#ifdef WITH_DRIVER
  if (row_buffer<4000>(s, out, 4000) || row_buffer<4000>(s, out, 2700) ||
      row_buffer<4000>(s, out, 336) || row_buffer<32000>(s, out, 2700))
    return 1;
#endif
  return 0;
}
