// Issue 29 experiment: what the driver queries behind railcc_cuda::vmm::info cost per call
// for a 256 MB buffer made as PyTorch's expandable segments make it (a reservation mapped in
// 20 MiB pieces of cuMemCreate memory with POSIX-descriptor handles), against one cudaMalloc
// buffer. railcc asks these for every VMM buffer of every call (vmm::pieces walks every
// piece), so their cost per piece is the host time an expandable-segment call pays beyond a
// cudaMalloc one. Prints the median microseconds of each query over all pieces, 200 rounds.
// Build: nvcc -O2 -o /tmp/vmm vmm_attr_cost.cu -lcuda
#include <cuda.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
#include "timing.h"

#define CK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { const char *s; cuGetErrorString(r, &s); \
  std::printf("FAIL  %s: %s\n", #x, s); return 1; } } while (0)

int main() {
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  const size_t piece = 20ull << 20, total = 13 * piece;
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUdeviceptr va;
  CK(cuMemAddressReserve(&va, total, 2 << 20, 0, 0));
  for (size_t off = 0; off < total; off += piece) {
    CUmemGenericAllocationHandle h;
    CK(cuMemCreate(&h, piece, &prop, 0));
    CK(cuMemMap(va + off, piece, 0, h, 0));
    CK(cuMemRelease(h));
  }
  CUmemAccessDesc acc = {};
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CK(cuMemSetAccess(va, total, &acc, 1));
  CUdeviceptr legacy;
  CK(cuMemAlloc(&legacy, total));

  // q: 0 = the three attributes of vmm::info, 1 = cuMemGetAddressRange, 2 = BUFFER_ID alone,
  // 3 = 0 and 1 together (vmm::info as railcc calls it).
  const char *names[] = {"cuPointerGetAttributes(legacy, handle types, buffer id)",
                         "cuMemGetAddressRange", "cuPointerGetAttribute(BUFFER_ID)",
                         "vmm::info (both)"};
  for (int q = 0; q < 4; q++) {
    for (int which = 0; which < 2; which++) {
      std::vector<double> per;
      for (int round = 0; round < 200; round++) {
        for (size_t off = 0; off < total; off += piece) {
          CUdeviceptr p = (which ? legacy : va) + off;
          double t0 = now_us();
          if (q == 0 || q == 3) {
            CUpointer_attribute a[3] = {CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                        CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
                                        CU_POINTER_ATTRIBUTE_BUFFER_ID};
            unsigned long long v[3] = {0, 0, 0};
            void *d[3] = {&v[0], &v[1], &v[2]};
            CK(cuPointerGetAttributes(3, a, d, p));
          }
          if (q == 1 || q == 3) {
            CUdeviceptr b;
            size_t s;
            CK(cuMemGetAddressRange(&b, &s, p));
          }
          if (q == 2) {
            unsigned long long id;
            CK(cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p));
          }
          per.push_back(now_us() - t0);
        }
      }
      std::printf("%-58s %-10s median %.2f us a piece (13 pieces: %.1f us)\n", names[q],
                  which ? "cudaMalloc" : "VMM", median(per), 13 * median(per));
    }
  }
  std::printf("vmm_attr_cost: done\n");
  return 0;
}
