// Experiment (issue 30): can an all-reduce at few SMs reach NCCL's 24-channel figure if the
// reduce-scatter runs on SMs and the all-gather on the copy engines, pipelined in chunks?
// One process, every GPU, peer access. Modes per size and block count:
//   bulk   one kernel per GPU: reduce the GPU's segment reading every input, write every
//          output (railcc's bulk kernel's pattern);
//   rs     reduce-scatter only (the kernel writes the local output);
//   ag     all-gather only, copy engines (each GPU's segment to every peer);
//   ce     the all-reduce: rs by chunks on one stream, each chunk copied to every peer by the
//          copy engines on CS streams as soon as it is reduced.
// Every timed run is checked on the GPU (each output element must be the sum 1+2+...+n).
// Build: nvcc -O3 -arch=sm_90 -o ce ce_allreduce.cu
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <vector>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at line %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)

struct Ptrs { float4* p[8]; };

__global__ void __launch_bounds__(512) reduce_kernel(Ptrs ins, Ptrs outs, int n, int nout, int me, size_t b, size_t e) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = b + (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + stride < e; i += 2 * stride) {
    float4 a[8], c[8];
#pragma unroll
    for (int r = 0; r < 8; r++) if (r < n) { a[r] = ins.p[r][i]; c[r] = ins.p[r][i + stride]; }
    float4 s = a[0], t = c[0];
#pragma unroll
    for (int r = 1; r < 8; r++) if (r < n) {
      s.x += a[r].x; s.y += a[r].y; s.z += a[r].z; s.w += a[r].w;
      t.x += c[r].x; t.y += c[r].y; t.z += c[r].z; t.w += c[r].w;
    }
    for (int q = 0; q < nout; q++) { float4* o = outs.p[(me + q) % n]; o[i] = s; o[i + stride] = t; }
  }
  for (; i < e; i += stride) {
    float4 s = ins.p[0][i];
    for (int r = 1; r < n; r++) { float4 a = ins.p[r][i]; s.x += a.x; s.y += a.y; s.z += a.z; s.w += a.w; }
    for (int q = 0; q < nout; q++) outs.p[(me + q) % n][i] = s;
  }
}

__global__ void fill(float4* p, size_t nv, float v) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nv; i += (size_t)gridDim.x * blockDim.x) p[i] = make_float4(v, v, v, v);
}
__global__ void count_wrong(const float4* p, size_t b, size_t e, float v, unsigned long long* bad) {
  unsigned long long k = 0;
  for (size_t i = b + blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < e; i += (size_t)gridDim.x * blockDim.x) {
    float4 x = p[i]; k += (x.x != v) + (x.y != v) + (x.z != v) + (x.w != v);
  }
  if (k) atomicAdd(bad, k);
}

int n;
std::vector<float4*> in, out;
std::vector<cudaStream_t> ks;                 // kernel stream per GPU
std::vector<std::vector<cudaStream_t>> cs;    // copy streams per GPU
std::vector<cudaEvent_t> kdone;               // per GPU: its last work of an iteration
std::vector<std::vector<cudaEvent_t>> cdone;  // per GPU and copy stream
std::vector<std::vector<cudaEvent_t>> chunk_ev;

// One all-reduce-like iteration of `mode` on every GPU; `nv` float4 per buffer.
void iteration(const char* mode, size_t nv, int blocks, int chunks, int ncs, bool is_first) {
  size_t per = (nv + n - 1) / n;
  for (int g = 0; g < n; g++) {
    CK(cudaSetDevice(g));
    // Start after every GPU's previous iteration (an event barrier).
    if (!is_first) for (int h = 0; h < n; h++) {
      CK(cudaStreamWaitEvent(ks[g], kdone[h], 0));
      for (int c = 0; c < ncs; c++) CK(cudaStreamWaitEvent(ks[g], cdone[h][c], 0));
    }
  }
  for (int g = 0; g < n; g++) {
    CK(cudaSetDevice(g));
    Ptrs ip{}, op{};
    for (int r = 0; r < n; r++) { ip.p[r] = in[r]; op.p[r] = out[r]; }
    size_t sb = std::min(per * g, nv), se = std::min(sb + per, nv);
    if (!strcmp(mode, "bulk")) {
      reduce_kernel<<<blocks, 512, 0, ks[g]>>>(ip, op, n, n, g, sb, se);
    } else if (!strcmp(mode, "rs")) {
      reduce_kernel<<<blocks, 512, 0, ks[g]>>>(ip, op, n, 1, g, sb, se);
    } else if (!strcmp(mode, "ag")) {
      CK(cudaEventRecord(chunk_ev[g][0], ks[g]));
      for (int q = 1; q < n; q++) {
        int p = (g + q) % n; cudaStream_t s = cs[g][(q - 1) % ncs];
        CK(cudaStreamWaitEvent(s, chunk_ev[g][0], 0));
        CK(cudaMemcpyAsync(out[p] + sb, out[g] + sb, (se - sb) * 16, cudaMemcpyDeviceToDevice, s));
      }
    } else {  // ce
      size_t cl = ((se - sb) + chunks - 1) / chunks;
      for (int k = 0; k < chunks; k++) {
        size_t cb = std::min(sb + k * cl, se), ce_ = std::min(cb + cl, se);
        if (cb >= ce_) break;
        reduce_kernel<<<blocks, 512, 0, ks[g]>>>(ip, op, n, 1, g, cb, ce_);
        CK(cudaEventRecord(chunk_ev[g][k], ks[g]));
        for (int q = 1; q < n; q++) {
          int p = (g + q) % n; cudaStream_t s = cs[g][(q - 1) % ncs];
          if (q - 1 < ncs) CK(cudaStreamWaitEvent(s, chunk_ev[g][k], 0));
          CK(cudaMemcpyAsync(out[p] + cb, out[g] + cb, (ce_ - cb) * 16, cudaMemcpyDeviceToDevice, s));
        }
      }
    }
    CK(cudaEventRecord(kdone[g], ks[g]));
    for (int c = 0; c < ncs; c++) CK(cudaEventRecord(cdone[g][c], cs[g][c]));
  }
}

int main(int argc, char** argv) {
  CK(cudaGetDeviceCount(&n));
  if (n > 8) n = 8;
  const size_t maxbytes = (size_t)1 << 30;
  in.resize(n); out.resize(n); ks.resize(n); cs.resize(n); kdone.resize(n); cdone.resize(n); chunk_ev.resize(n);
  for (int g = 0; g < n; g++) {
    CK(cudaSetDevice(g));
    for (int h = 0; h < n; h++) if (h != g) CK(cudaDeviceEnablePeerAccess(h, 0));
    CK(cudaMalloc(&in[g], maxbytes)); CK(cudaMalloc(&out[g], maxbytes));
    fill<<<264, 512>>>(in[g], maxbytes / 16, (float)(g + 1));
    CK(cudaStreamCreateWithFlags(&ks[g], cudaStreamNonBlocking));
    cs[g].resize(3); cdone[g].resize(3); chunk_ev[g].resize(64);
    for (int c = 0; c < 3; c++) { CK(cudaStreamCreateWithFlags(&cs[g][c], cudaStreamNonBlocking)); CK(cudaEventCreateWithFlags(&cdone[g][c], cudaEventDisableTiming)); }
    CK(cudaEventCreateWithFlags(&kdone[g], cudaEventDisableTiming));
    for (auto& e : chunk_ev[g]) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  for (int g = 0; g < n; g++) { CK(cudaSetDevice(g)); CK(cudaDeviceSynchronize()); }
  float want = n * (n + 1) / 2.0f;
  unsigned long long* bad;
  CK(cudaSetDevice(0)); CK(cudaMallocManaged(&bad, 8));
  printf("# %d GPUs; busbw GB/s as nccl-tests reports all_reduce (2(n-1)/n S/t); rs and ag as theirs ((n-1)/n S/t)\n", n);
  printf("%-6s %11s %6s %6s %3s %10s %8s %s\n", "mode", "bytes", "blocks", "chunks", "cs", "time_us", "busbw", "wrong");
  const char* modes[] = {"bulk", "rs", "ag", "ce"};
  std::vector<size_t> sizes = {(size_t)16 << 20, (size_t)64 << 20, (size_t)256 << 20, (size_t)1 << 30};
  std::vector<int> blockss = {8, 16, 24};
  std::vector<int> chunkss = {2, 4, 8, 16};
  for (size_t bytes : sizes) for (const char* mode : modes) for (int blocks : blockss) for (int chunks : chunkss) for (int ncs : {1, 3}) {
    bool ce = !strcmp(mode, "ce"), ag = !strcmp(mode, "ag");
    if (!ce && chunks != 2) continue;
    if (!ce && !ag && ncs != 1) continue;
    if (ag && blocks != 8) continue;
    size_t nv = bytes / 16;
    for (int g = 0; g < n; g++) { CK(cudaSetDevice(g)); CK(cudaMemsetAsync(out[g], 0, bytes, ks[g])); CK(cudaStreamSynchronize(ks[g])); }
    // ag copies whatever each GPU's segment holds: fill it first with the sum.
    if (ag) for (int g = 0; g < n; g++) { CK(cudaSetDevice(g)); size_t per = (nv + n - 1) / n, sb = std::min(per * g, nv), se = std::min(sb + per, nv); fill<<<264, 512, 0, ks[g]>>>(out[g] + sb, se - sb, want); CK(cudaStreamSynchronize(ks[g])); }
    const int warm = 3, iters = bytes >= ((size_t)256 << 20) ? 10 : 30;
    for (int i = 0; i < warm; i++) iteration(mode, nv, blocks, chunks, ncs, i == 0);
    for (int g = 0; g < n; g++) { CK(cudaSetDevice(g)); CK(cudaDeviceSynchronize()); }
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; i++) iteration(mode, nv, blocks, chunks, ncs, false);
    for (int g = 0; g < n; g++) { CK(cudaSetDevice(g)); CK(cudaDeviceSynchronize()); }
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
    double f = !strcmp(mode, "rs") || ag ? (double)(n - 1) / n : 2.0 * (n - 1) / n;
    // Check: rs, every GPU's own segment; the others, every element of every output.
    *bad = 0;
    for (int g = 0; g < n; g++) {
      CK(cudaSetDevice(g));
      size_t per = (nv + n - 1) / n, sb = std::min(per * g, nv), se = std::min(sb + per, nv);
      if (!strcmp(mode, "rs")) count_wrong<<<264, 512>>>(out[g], sb, se, want, bad);
      else count_wrong<<<264, 512>>>(out[g], 0, nv, want, bad);
      CK(cudaDeviceSynchronize());
    }
    printf("%-6s %11zu %6d %6d %3d %10.1f %8.1f %llu\n", mode, bytes, ag ? 0 : blocks, ce ? chunks : 1, ce || ag ? ncs : 0, us, f * bytes / us / 1e3, *bad);
    fflush(stdout);
  }
  return 0;
}
