// Experiment (issue 30): a reduce-scatter that only writes over NVLink. Reads of peers' memory
// stop at about 325 GB/s on these machines (copy-engine-ceiling.md) while copy-engine writes
// reach 384-387 when every GPU sends to one peer at a time, all GPUs to distinct peers (a
// permutation, as railcc's all-gather on the copy engines). So the reduce-scatter runs in n-1
// phases: in phase q GPU g copies block g+q of its input to GPU g+q by the copy engines, chunk
// by chunk into K slots of scratch there, and a kernel on the receiver adds each chunk into its
// output as soon as it lands (phase 1: own block + chunk; later phases: output + chunk).
// A first try (call 5 of 2026-11-27's eleventh session, issue30/x4-s13/call5-*) sent each
// chunk to all n-1 peers in turn: the GPUs drift apart, receivers get two senders at once, and
// even the copies alone moved only 217-224 GB/s.
// Flags, no host in the loop (in g's memory, per receiver r):
//   sent[r]    g's copy stream writes G+1 (cuStreamWriteValue32) after copying the pair's
//              chunk G to r; r's kernel polls it over NVLink;
//   freed[r]   r's kernel writes G+1 once every block has read chunk G (the last block to
//              finish it, counted per sender and slot); g's copy stream waits for it
//              (cuStreamWaitValue32) before reusing the slot, K chunks later.
// Chunk numbers G grow across calls (a graph would bake them in: the real path needs a
// device-side counter there, as railcc's call counter). One host thread per GPU enqueues.
// Modes per size: "copy" (the same copies with no flags or kernel: the ceiling) and "rs" by
// chunk size, slots K and reduce blocks B. Every rs run is checked on the GPU: each output
// element must equal the sum of the n inputs, which differ by position (index mod 1021) so a
// chunk or slot mixed up shows.
// Build: nvcc -O3 -arch=sm_90 -o ce_rs ce_reducescatter.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("FAIL  CUDA %s at line %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)
#define CKD(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char* s_; cuGetErrorString(r_, &s_); printf("FAIL  %s at line %d\n", s_, __LINE__); exit(1); } } while (0)

struct P8 { const float4* p[8]; };
struct F8 { unsigned* p[8]; };

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// GPU p's reduction of one call: phases q = 1..n-1 (sender p-q), chunks k of its block; the
// pair's chunk number is base + k. Every phase gives a thread the same elements, so a thread
// reads in phase q + 1 only what it wrote itself in phase q.
__global__ void __launch_bounds__(512) rs_reduce(const float4* mine, P8 slots, float4* out, int n,
    size_t chunk_v, int nchunks, int K, unsigned base, F8 sent, F8 freed, unsigned* done) {
  for (int q = 1; q < n; q++) {
    for (int k = 0; k < nchunks; k++) {
      unsigned g = base + k;
      int slot = g % K;
      if (threadIdx.x == 0)
        while (load_acquire(sent.p[q - 1]) < g + 1) {}
      __syncthreads();
      const float4* a = (q == 1 ? mine : out) + (size_t)k * chunk_v;
      const float4* x = slots.p[q - 1] + (size_t)slot * chunk_v;
      float4* o = out + (size_t)k * chunk_v;
      size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, st = (size_t)gridDim.x * blockDim.x;
      for (; i + st < chunk_v; i += 2 * st) {
        float4 a0 = a[i], a1 = a[i + st], x0 = x[i], x1 = x[i + st];
        a0.x += x0.x; a0.y += x0.y; a0.z += x0.z; a0.w += x0.w;
        a1.x += x1.x; a1.y += x1.y; a1.z += x1.z; a1.w += x1.w;
        o[i] = a0; o[i + st] = a1;
      }
      for (; i < chunk_v; i += st) {
        float4 a0 = a[i], x0 = x[i];
        a0.x += x0.x; a0.y += x0.y; a0.z += x0.z; a0.w += x0.w;
        o[i] = a0;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        __threadfence();
        // Per sender and slot: a block at chunk g + K (same slot) cannot count before every
        // block counted g, since that chunk lands only after g is freed.
        unsigned old = atomicAdd(&done[(q - 1) * K + slot], 1u);
        if (old == (g / K + 1) * gridDim.x - 1) {
          __threadfence_system();
          *(volatile unsigned*)freed.p[q - 1] = g + 1;
        }
      }
    }
  }
}

__global__ void fill(float* p, size_t n, size_t first, float add) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = add + (float)((first + i) % 1021);
}
// out[j] must be sum over g of (g+1) + ((first + j) % 1021).
__global__ void count_wrong(const float* p, size_t n, size_t first, int ranks, unsigned long long* bad) {
  unsigned long long k = 0;
  float tri = ranks * (ranks + 1) / 2.0f;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    k += p[i] != tri + ranks * (float)((first + i) % 1021);
  if (k) atomicAdd(bad, k);
}

int n;
std::vector<float*> in, out;
std::vector<char*> scratch;            // per GPU: (n-1) senders x K slots x chunk
std::vector<unsigned*> flags;          // per GPU: sent[r] at [r], freed[r] at [8 + r], done[q - 1][slot] at [16 + (q - 1) * K + slot]
std::vector<cudaStream_t> ks, cs;

void sync_all() { for (int g = 0; g < n; g++) { CK(cudaSetDevice(g)); CK(cudaDeviceSynchronize()); } }

// Enqueues GPU g's part of iterations [it0, it0 + iters): its copies and, for rs, its kernel.
void enqueue(int g, bool rs, size_t S, size_t C, int K, int B, int it0, int iters) {
  CK(cudaSetDevice(g));
  size_t block = S / n, nchunks = block / C;
  for (int it = it0; it < it0 + iters; it++) {
    unsigned base = (unsigned)(it * nchunks);
    if (rs) {
      P8 slots{}; F8 sent{}, freed{};
      for (int q = 1; q < n; q++) {
        int from = (g - q + n) % n;  // phase q's sender
        slots.p[q - 1] = (const float4*)(scratch[g] + (size_t)(q - 1) * K * C);
        sent.p[q - 1] = flags[from] + g;
        freed.p[q - 1] = flags[from] + 8 + g;
      }
      rs_reduce<<<B, 512, 0, ks[g]>>>((const float4*)((char*)in[g] + g * block), slots, (float4*)out[g], n,
                                      C / 16, (int)nchunks, K, base, sent, freed, flags[g] + 16);
      CK(cudaGetLastError());
    }
    for (int q = 1; q < n; q++) {
      int r = (g + q) % n;
      for (size_t k = 0; k < nchunks; k++) {
        unsigned gc = base + (unsigned)k;
        int slot = gc % K;
        if (rs && gc >= (unsigned)K)
          CKD(cuStreamWaitValue32((CUstream)cs[g], (CUdeviceptr)(flags[g] + 8 + r), gc - K + 1, CU_STREAM_WAIT_VALUE_GEQ));
        char* dst = scratch[r] + ((size_t)(q - 1) * K + slot) * C;
        CK(cudaMemcpyAsync(dst, (char*)in[g] + r * block + k * C, C, cudaMemcpyDeviceToDevice, cs[g]));
        if (rs) CKD(cuStreamWriteValue32((CUstream)cs[g], (CUdeviceptr)(flags[g] + r), gc + 1, CU_STREAM_WRITE_VALUE_DEFAULT));
      }
    }
  }
}

double run(bool rs, size_t S, size_t C, int K, int B, int iters) {
  for (int g = 0; g < n; g++) {
    CK(cudaSetDevice(g));
    CK(cudaMemset(flags[g], 0, 64 * sizeof(unsigned)));
    CK(cudaMemset(out[g], 0xff, S / n));
  }
  sync_all();
  auto go = [&](int it0, int k) {
    std::vector<std::thread> t;
    for (int g = 0; g < n; g++) t.emplace_back(enqueue, g, rs, S, C, K, B, it0, k);
    for (auto& x : t) x.join();
    sync_all();
  };
  go(0, 2);  // warm-up
  auto t0 = std::chrono::steady_clock::now();
  go(2, iters);
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
  return us;
}

int main(int argc, char** argv) {
  CK(cudaGetDeviceCount(&n));
  CKD(cuInit(0));
  int memops = 0;
  CKD(cuDeviceGetAttribute(&memops, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, 0));
  printf("ce_rs: stream memory operations supported: %d\n", memops);
  if (n < 2 || n > 8) { printf("FAIL  %d GPUs\n", n); return 1; }
  const size_t maxS = 1ull << 30, maxC = 16ull << 20;
  const int maxK = 3;
  in.resize(n); out.resize(n); scratch.resize(n); flags.resize(n); ks.resize(n); cs.resize(n);
  for (int g = 0; g < n; g++) {
    CK(cudaSetDevice(g));
    for (int p = 0; p < n; p++) if (p != g) CK(cudaDeviceEnablePeerAccess(p, 0));
    CK(cudaMalloc(&in[g], maxS));
    CK(cudaMalloc(&out[g], maxS / n));
    CK(cudaMalloc(&scratch[g], (size_t)(n - 1) * maxK * maxC));
    CK(cudaMalloc(&flags[g], 64 * sizeof(unsigned)));
    CK(cudaStreamCreateWithFlags(&ks[g], cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&cs[g], cudaStreamNonBlocking));
    fill<<<264, 512>>>(in[g], maxS / 4, 0, (float)(g + 1));
  }
  sync_all();
  unsigned long long* bad;
  CK(cudaSetDevice(0));
  CK(cudaMallocManaged(&bad, sizeof(*bad)));
  int fails = 0;
  size_t sizes[] = {64ull << 20, 256ull << 20, 1ull << 30};
  size_t chunks[] = {4ull << 20, 8ull << 20, 16ull << 20};
  int blocks[] = {16, 24, 32};
  printf("ce_rs: %d GPUs; busbw = size / time x (n-1)/n, as nccl-tests' reduce_scatter (size = one GPU's input)\n", n);
  for (size_t S : sizes) {
    int iters = S >= (1u << 30) ? 10 : 20;
    for (size_t C : chunks) {
      if (C > S / n || (S / n) % C) continue;
      // The ceiling: the same copies with no flags or kernel.
      double us = run(false, S, C, 1, 0, iters);
      printf("size %5zu MB copy  chunk %2zu MiB                  %8.1f us  busbw %6.1f GB/s\n", S >> 20, C >> 20, us,
             S / us / 1e3 * (n - 1) / n);
      for (int K : {2, 3}) for (int B : blocks) {
        double t = run(true, S, C, K, B, iters);
        unsigned long long wrong = 0;
        for (int g = 0; g < n; g++) {
          CK(cudaSetDevice(g));
          *bad = 0;
          count_wrong<<<132, 512>>>(out[g], S / n / 4, g * (S / n / 4), n, bad);
          CK(cudaDeviceSynchronize());
          wrong += *bad;
        }
        fails += wrong != 0;
        printf("size %5zu MB rs    chunk %2zu MiB K %d blocks %2d  %8.1f us  busbw %6.1f GB/s  wrong %llu\n", S >> 20,
               C >> 20, K, B, t, S / t / 1e3 * (n - 1) / n, wrong);
        fflush(stdout);
      }
    }
  }
  printf("ce_rs: %s\n", fails ? "FAIL (wrong results above)" : "every rs run checked, 0 wrong");
  return fails != 0;
}
