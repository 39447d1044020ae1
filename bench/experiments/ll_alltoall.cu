// Experiment (issue 30, not yet run): can a small all-to-all on NVLink cost one launch, one
// one-way NVLink latency and its data time, as NCCL's LL protocol does
// (bench/results/issue30/p2p-small-design.md), where railcc's one-launch send/recv costs about
// 16 us a call at any small size (issue30/x4-s13/call9-alltoall-small.txt)?
// One process, every GPU, peer access; one launch per GPU per call, calls back to back (as
// nccl-tests times). A message to peer p is cut in P parts (P = clamp(ceil(bytes/32 KiB), 1, 8)),
// each part in steps of up to 32 KiB of data. Block (q, j) sends part j to peer me+q with its
// first 8 warps and receives part j from peer me-q with its last 8; extra blocks copy the
// GPU's own block. Lines of 16 bytes {d0, f, d1, f}: the sender stores them straight into the
// receiver's inbox (no fence: the receiver checks both flags of every line); the receiver polls
// its lines, stores the data, and after its warps' barrier writes the step into the sender's
// CREDIT word, which frees the slot (2 per part) two steps later. Step counts live in device
// memory per (peer, part, direction), so calls follow one another with no host in the loop.
// Prints, per size, the time a call (host clock, one thread launching to every GPU, as
// nccl-tests -g) and busbw as nccl-tests' alltoall ((n-1)/n x size / time);
// before timing, three calls with new data each are checked on the host.
// Build: nvcc -O3 -arch=sm_90 -o ll_a2a ll_alltoall.cu
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("FAIL  CUDA %s at line %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)

constexpr int MAXP = 8;                 // parts per message
constexpr int MAXN = 8;                 // GPUs
constexpr int STEP_LINES = 4096;        // 32 KiB of data a step
constexpr int SLOTS = 2;

struct Peers {
  unsigned* inbox[MAXN];                // GPU g's inbox: [src][part][slot][line][4]
  unsigned* credit[MAXN];               // GPU g's CREDIT words: [receiver][part]
};

__device__ __forceinline__ void st_line(unsigned* p, unsigned a, unsigned b, unsigned c, unsigned d) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(p), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
__device__ __forceinline__ uint4 ld_line(const unsigned* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ size_t dmin(size_t a, size_t b) { return a < b ? a : b; }
__device__ __forceinline__ void bar(int id) { asm volatile("bar.sync %0, 256;" :: "r"(id) : "memory"); }

// steps: [dir 0 send / 1 recv][peer][part] step counts of this GPU, in its memory.
__global__ void __launch_bounds__(512) ll_a2a(const unsigned* send, unsigned* recv, int me, int n, size_t per_peer,
                                              int P, Peers peers, unsigned* steps) {
  const int nq = n - 1;
  const size_t part_bytes = ((per_peer + P - 1) / P + 7) / 8 * 8;
  if ((int)blockIdx.x >= nq * P) {
    // The GPU's own block, part j by block nq * P + j: a plain copy.
    int j = blockIdx.x - nq * P;
    size_t b = j * part_bytes, e = dmin(per_peer, b + part_bytes);
    const unsigned* s = send + (me * per_peer + b) / 4;
    unsigned* d = recv + (me * per_peer + b) / 4;
    for (size_t i = threadIdx.x; i < (e > b ? (e - b) / 4 : 0); i += blockDim.x) d[i] = s[i];
    return;
  }
  const int q = 1 + blockIdx.x / P, j = blockIdx.x % P;
  const size_t b = j * part_bytes, e = dmin(per_peer, b + part_bytes);
  const size_t lines = e > b ? (e - b) / 8 : 0;
  const int nsteps = (int)((lines + STEP_LINES - 1) / STEP_LINES);
  const int tid = threadIdx.x & 255;
  if (threadIdx.x < 256) {
    // Send warps: part j of the message to peer p.
    const int p = (me + q) % n;
    unsigned* st_word = steps + (0 * MAXN + p) * MAXP + j;
    const unsigned s0 = *st_word;
    volatile unsigned* credit = peers.credit[me] + p * MAXP + j;  // written by p
    unsigned* box = peers.inbox[p] + (size_t)(me * MAXP + j) * SLOTS * STEP_LINES * 4;
    const unsigned* src = send + (p * per_peer + b) / 4;
    for (int k = 0; k < nsteps; k++) {
      const unsigned s = s0 + 1 + k;
      if (tid == 0) while ((int)(*credit - (s - SLOTS)) < 0) {}
      bar(1);
      unsigned* slot = box + (size_t)(s % SLOTS) * STEP_LINES * 4;
      const size_t l0 = (size_t)k * STEP_LINES, l1 = dmin(lines, l0 + STEP_LINES);
      for (size_t l = l0 + tid; l < l1; l += 256) {
        uint2 v = *(const uint2*)(src + 2 * l);
        st_line(slot + 4 * (l - l0), v.x, s, v.y, s);
      }
    }
    bar(1);
    if (tid == 0) *st_word = s0 + nsteps;
  } else {
    // Receive warps: part j of the message from peer r.
    const int r = (me - q + n) % n;
    unsigned* st_word = steps + (1 * MAXN + r) * MAXP + j;
    const unsigned s0 = *st_word;
    const unsigned* box = peers.inbox[me] + (size_t)(r * MAXP + j) * SLOTS * STEP_LINES * 4;
    unsigned* dst = recv + (r * per_peer + b) / 4;
    volatile unsigned* credit = peers.credit[r] + me * MAXP + j;  // in r's memory
    for (int k = 0; k < nsteps; k++) {
      const unsigned s = s0 + 1 + k;
      const unsigned* slot = box + (size_t)(s % SLOTS) * STEP_LINES * 4;
      const size_t l0 = (size_t)k * STEP_LINES, l1 = dmin(lines, l0 + STEP_LINES);
      for (size_t l = l0 + tid; l < l1; l += 256) {
        uint4 v;
        do { v = ld_line(slot + 4 * (l - l0)); } while (v.y != s || v.w != s);
        *(uint2*)(dst + 2 * l) = make_uint2(v.x, v.z);
      }
      bar(2);
      if (tid == 0) *credit = s;
    }
    if (tid == 0) *st_word = s0 + nsteps;
  }
}

__global__ void fill(unsigned* p, size_t words, int g, size_t per_peer_words, unsigned salt) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words; i += (size_t)gridDim.x * blockDim.x)
    p[i] = (unsigned)(g * 1000003u) ^ (unsigned)(i / per_peer_words * 7919u) ^ (unsigned)(i % per_peer_words) ^ salt;
}
__global__ void empty() {}

int n;
std::vector<unsigned*> sendb, recvb, inbox, credit, steps;
std::vector<cudaStream_t> st;
Peers peers;

int parts(size_t per_peer) { return (int)std::max<size_t>(1, std::min<size_t>(MAXP, (per_peer + 32767) / 32768)); }

void launch(int g, size_t per_peer, bool is_empty) {
  CK(cudaSetDevice(g));
  int P = parts(per_peer);
  if (is_empty) empty<<<1, 32, 0, st[g]>>>();
  else ll_a2a<<<(n - 1) * P + P, 512, 0, st[g]>>>(sendb[g], recvb[g], g, n, per_peer, P, peers, steps[g]);
}

// As nccl-tests -g (common.cu's timer around the loop): one host thread issues each call's
// launches to every GPU in turn, and the time is the host's until the last GPU is done, so the
// serial launch cost of n GPUs counts as it does there. Per-GPU threads would hide it. The
// busiest GPU's span between its own events comes back in *gpu_us (GPU side only).
double timed(size_t per_peer, int iters, bool is_empty, double* gpu_us = nullptr) {
  std::vector<cudaEvent_t> a(n), z(n);
  for (int g = 0; g < n; g++) {
    CK(cudaSetDevice(g)); CK(cudaEventCreate(&a[g])); CK(cudaEventCreate(&z[g]));
    CK(cudaEventRecord(a[g], st[g]));
  }
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; i++)
    for (int g = 0; g < n; g++) launch(g, per_peer, is_empty);
  for (int g = 0; g < n; g++) { CK(cudaSetDevice(g)); CK(cudaEventRecord(z[g], st[g])); CK(cudaGetLastError()); }
  for (int g = 0; g < n; g++) { CK(cudaSetDevice(g)); CK(cudaEventSynchronize(z[g])); }
  double host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  float most = 0;
  for (int g = 0; g < n; g++) {
    CK(cudaSetDevice(g));
    float ms;
    CK(cudaEventElapsedTime(&ms, a[g], z[g]));
    most = std::max(most, ms);
    CK(cudaEventDestroy(a[g])); CK(cudaEventDestroy(z[g]));
  }
  if (gpu_us) *gpu_us = most * 1e3 / iters;
  return host_us / iters;
}

int main() {
  CK(cudaGetDeviceCount(&n));
  if (n < 2 || n > MAXN) { printf("FAIL  %d GPUs\n", n); return 1; }
  const size_t max_per_peer = 1 << 20;
  const size_t box_words = (size_t)MAXN * MAXP * SLOTS * STEP_LINES * 4;
  sendb.resize(n); recvb.resize(n); inbox.resize(n); credit.resize(n); steps.resize(n); st.resize(n);
  for (int g = 0; g < n; g++) {
    CK(cudaSetDevice(g));
    for (int p = 0; p < n; p++) if (p != g) CK(cudaDeviceEnablePeerAccess(p, 0));
    CK(cudaMalloc(&sendb[g], max_per_peer * n));
    CK(cudaMalloc(&recvb[g], max_per_peer * n));
    CK(cudaMalloc(&inbox[g], box_words * 4));
    CK(cudaMemset(inbox[g], 0, box_words * 4));
    CK(cudaMalloc(&credit[g], MAXN * MAXP * 4));
    CK(cudaMemset(credit[g], 0, MAXN * MAXP * 4));
    CK(cudaMalloc(&steps[g], 2 * MAXN * MAXP * 4));
    CK(cudaMemset(steps[g], 0, 2 * MAXN * MAXP * 4));
    CK(cudaStreamCreateWithFlags(&st[g], cudaStreamNonBlocking));
    peers.inbox[g] = inbox[g];
    peers.credit[g] = credit[g];
  }
  for (int g = 0; g < n; g++) { CK(cudaSetDevice(g)); CK(cudaDeviceSynchronize()); }
  printf("ll_a2a: %d GPUs; size = one GPU's whole send buffer (nccl-tests' alltoall), busbw = (n-1)/n x size / time\n", n);
  double gpu;
  double empty_us = timed(0, 200, true, &gpu);
  printf("ll_a2a: empty kernel on every GPU back to back: %.2f us a call (host), %.2f us (GPU)\n", empty_us, gpu);
  int fails = 0;
  for (size_t size = 64; size <= max_per_peer * n; size *= 4) {
    size_t per_peer = size / n / 8 * 8;
    if (per_peer == 0) continue;
    // Three checked calls, new data each.
    unsigned long long wrong = 0;
    for (unsigned salt = 1; salt <= 3; salt++) {
      for (int g = 0; g < n; g++) {
        CK(cudaSetDevice(g));
        fill<<<132, 256, 0, st[g]>>>(sendb[g], per_peer * n / 4, g, per_peer / 4, salt);
        CK(cudaMemsetAsync(recvb[g], 0, per_peer * n, st[g]));
        CK(cudaStreamSynchronize(st[g]));
      }
      timed(per_peer, 1, false);
      for (int g = 0; g < n; g++) {
        CK(cudaSetDevice(g));
        std::vector<unsigned> got(per_peer * n / 4);
        CK(cudaMemcpy(got.data(), recvb[g], per_peer * n, cudaMemcpyDeviceToHost));
        size_t w = per_peer / 4;
        for (int r = 0; r < n; r++)
          for (size_t i = 0; i < w; i++) {
            // Rank r's words for g: its send buffer's block g.
            size_t at = g * w + i;
            unsigned want = (unsigned)(r * 1000003u) ^ (unsigned)(at / w * 7919u) ^ (unsigned)(at % w) ^ salt;
            wrong += got[r * w + i] != want;
          }
      }
    }
    double us = timed(per_peer, 20, false);  // warm
    us = timed(per_peer, 200, false, &gpu);
    fails += wrong != 0;
    printf("size %9zu B  parts %d  blocks %3d  %8.2f us  busbw %7.2f GB/s  (GPU %8.2f us)  wrong %llu\n", per_peer * n,
           parts(per_peer), (n - 1) * parts(per_peer) + parts(per_peer), us, per_peer * n / us / 1e3 * (n - 1) / n, gpu, wrong);
    fflush(stdout);
  }
  printf("ll_a2a: %s\n", fails ? "FAIL (wrong results above)" : "every size checked three times, 0 wrong");
  return fails != 0;
}
