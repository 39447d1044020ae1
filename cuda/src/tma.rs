//! The bulk kernel with its inputs fetched by the Tensor Memory Accelerator (Hopper's bulk
//! async copies into shared memory), `RAILCC_GPU_WIDE_LOADS=2`, and with its outputs sent by
//! it too, `=3`. Both off by default.
//!
//! Why: at NCCL's 24 blocks the bulk kernel's wide loop reads 0.89-0.92x NCCL's busbw at
//! 256 MB-1 GB on 4 x H100 (one block per SM: 0.95-0.99x). Each thread there keeps at most 16
//! vectors (256 B) of peer reads in flight. One thread of a block here keeps three stages of
//! every input's tile in flight (192 KiB of shared memory a block). Measured (2026-11-27):
//! correct, and no faster (0.89x at 1 GB), so reads are not the bound; the same 24 blocks'
//! all_gather, writes only, stops near the same 304-316 GB/s. Hence `=3`: each reduced tile
//! goes into shared memory and leaves as one contiguous bulk copy per output (where the
//! threads store every vector into every output in turn), not yet run on a GPU.
//!
//! The threads reduce out of shared memory as the bulk kernel does: the same part of the
//! same call per GPU, the same ready and done barriers, the same sums in the same order, so
//! GPUs may even mix the kernels in one call.
//!
//! The host takes this kernel only on compute capability 9.0 or later, where every input and
//! output is 16-byte aligned and the range starts on 16 bytes (`usable`); the bytes past the
//! range's last 16-byte boundary go through threads.

use crate::kernels::{ctype, element_source, vec_name};
use crate::launch::{Spec, THREADS};
use railcc_core::{DataType, ReduceOp};

/// Input tiles in flight per block: one being reduced, two arriving.
const STAGES: usize = 3;
/// Dynamic shared memory per block: `STAGES` tiles of every input (and with bulk stores, of
/// the result).
pub const SMEM_BYTES: usize = 192 * 1024;

pub fn kernel_name(dt: DataType, op: ReduceOp) -> String {
    format!("art_{}_{}", dt.name(), op.name())
}

/// Bytes of one input's tile with `n` inputs (and with `stores`, a result tile per stage
/// too): what the shared memory holds, on 1 KiB.
pub fn tile_bytes(n: usize, stores: bool) -> u64 {
    let tiles = STAGES * (n.max(1) + usize::from(stores));
    (SMEM_BYTES / tiles / 1024 * 1024) as u64
}

/// Dynamic shared memory of one block: `STAGES` tiles of every input (with `stores`, and of
/// the result).
pub fn smem_bytes(n: usize, stores: bool) -> u32 {
    (STAGES as u64 * (n as u64 + u64::from(stores)) * tile_bytes(n, stores)) as u32
}

/// Whether GPU part `s` of a call of `dt` can take this kernel, with bulk stores or not: a
/// reduction (two inputs or more), or with bulk stores also a copy (one input: all_gather,
/// broadcast, whose writes are what the stores are for), whose every address and range start
/// sit on 16 bytes.
pub fn usable(s: &Spec, dt: DataType, stores: bool) -> bool {
    (s.ins.len() >= 2 || (stores && s.ins.len() == 1))
        && s.ins.iter().chain(&s.outs).all(|p| p.is_multiple_of(16))
        && (s.range.0 * dt.size() as u64).is_multiple_of(16)
}

/// The device functions every TMA kernel uses (sm_90's PTX; empty below).
pub const COMMON_SOURCE: &str = r#"
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned int tma_saddr(const void* p) { return (unsigned int)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void tma_bar_init(unsigned long long* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(tma_saddr(bar)) : "memory");
}
// Arrives on `bar` (its one arrival) and tells it how many bytes the copies will bring.
__device__ __forceinline__ void tma_expect(unsigned long long* bar, unsigned int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(tma_saddr(bar)), "r"(bytes) : "memory");
}
// Copies `bytes` (a multiple of 16, both addresses on 16) from global `src` into shared `dst`;
// `bar` counts them in.
// (tma_store below: the other way, shared `src` into global `dst`, in the thread's current
// bulk group.)
__device__ __forceinline__ void tma_load(void* dst, const void* src, unsigned int bytes, unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(tma_saddr(dst)), "l"(src), "r"(bytes), "r"(tma_saddr(bar)) : "memory");
}
__device__ __forceinline__ void tma_store(void* dst, const void* src, unsigned int bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
               :: "l"(dst), "r"(tma_saddr(src)), "r"(bytes) : "memory");
}
__device__ __forceinline__ bool tma_done(unsigned long long* bar, unsigned int parity) {
  unsigned int ok;
  asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
               : "=r"(ok) : "r"(tma_saddr(bar)), "r"(parity) : "memory");
  return ok != 0;
}
#endif
"#;

/// CUDA source of the TMA bulk kernel for one dtype and op (uses kernels.rs' helpers, the
/// vector reduction [`vec_name`] and [`COMMON_SOURCE`]).
pub fn kernel_source(dt: DataType, op: ReduceOp) -> String {
    let t = ctype(dt).0;
    let elem = element_source(dt, op);
    let vec = vec_name(dt, op);
    let name = kernel_name(dt, op);
    format!(
        r#"
extern "C" __global__ void __launch_bounds__({THREADS}) {name}(Ptrs ins, int n, Ptrs outs, int n_out, unsigned long long begin, unsigned long long end, int avg_n, Ptrs syncs, int n_gpus, int me, unsigned long long timeout_ns, unsigned long long tile, int bulk_out) {{
  typedef {t} T;
  const unsigned long long epoch = call_epoch(syncs.p[me]);
  if (arrive_ready(syncs, n_gpus, me, epoch, timeout_ns)) {{ arrive_done(syncs, n_gpus, me, epoch, timeout_ns); return; }}
  unsigned long long tail = begin;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char tma_buf[];
  __shared__ __align__(8) unsigned long long bars[{STAGES}];
  // Bytes [b0, bm) of every input in tiles; tile b + k * gridDim.x is this block's k-th, in
  // stage k % STAGES. The host put b0 on 16 bytes; bm is the range's last 16-byte boundary.
  const unsigned long long b0 = begin * sizeof(T), b1 = end * sizeof(T);
  const unsigned long long bm = b1 / 16 * 16 > b0 ? b1 / 16 * 16 : b0;
  tail = bm / sizeof(T);
  const unsigned long long tiles = (bm - b0 + tile - 1) / tile;
  const unsigned long long mine = tiles > blockIdx.x ? (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  if (threadIdx.x == 0) {{
    for (int s = 0; s < {STAGES}; s++) tma_bar_init(&bars[s]);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    // What the ready barrier saw (the peers' inputs, written through the generic proxy) is
    // what the copies (the async proxy) read.
    asm volatile("fence.proxy.async.global;" ::: "memory");
  }}
  __syncthreads();
  #define TMA_ISSUE(k) do {{ \
    const unsigned long long off_ = b0 + (blockIdx.x + (unsigned long long)(k) * gridDim.x) * tile; \
    const unsigned int len_ = (unsigned int)min(tile, bm - off_); \
    unsigned long long* bar_ = &bars[(k) % {STAGES}]; \
    tma_expect(bar_, len_ * (unsigned int)n); \
    for (int r = 0; r < n; r++) \
      tma_load(tma_buf + ((unsigned long long)((k) % {STAGES}) * n + r) * tile, (const unsigned char*)ins.p[r] + off_, len_, bar_); \
  }} while (0)
  if (threadIdx.x == 0)
    for (unsigned long long k = 0; k < {STAGES} && k < mine; k++) TMA_ISSUE(k);
  for (unsigned long long k = 0; k < mine; k++) {{
    const int s = (int)(k % {STAGES});
    while (!tma_done(&bars[s], (unsigned int)((k / {STAGES}) & 1ull))) {{}}
    const unsigned long long off = b0 + (blockIdx.x + k * gridDim.x) * tile;
    const unsigned long long nv = min(tile, bm - off) / 16;
    const unsigned char* base = tma_buf + (unsigned long long)s * n * tile;
    // With bulk stores stage s's result tile, after every stage's input tiles.
    uint4* res = (uint4*)(tma_buf + ((unsigned long long){STAGES} * n + s) * tile);
    if (bulk_out && threadIdx.x == 0 && k >= {STAGES}) {{
      // The result tile's last bulk stores (STAGES tiles ago) have read it.
      asm volatile("cp.async.bulk.wait_group.read %0;" :: "n"({STAGES} - 1) : "memory");
    }}
    if (bulk_out) __syncthreads();
    for (unsigned long long j = threadIdx.x; j < nv; j += blockDim.x) {{
      uint4 y[8];
#pragma unroll
      for (int r = 0; r < 8; r++) if (r < n) y[r] = ((const uint4*)(base + (unsigned long long)r * tile))[j];
      const uint4 x = {vec}(y, n, avg_n);
      if (bulk_out) res[j] = x;
      else for (int q = 0; q < n_out; q++) ((uint4*)(outs.p[q] + off))[j] = x;
    }}
    // Each thread's result writes (generic proxy) before the bulk stores read them (async).
    if (bulk_out) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    // Every thread is done with stage s (and has written its result) before the copy engine
    // refills it (and sends the result).
    __syncthreads();
    if (threadIdx.x == 0) {{
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      if (bulk_out) {{
        // Each output's tile as one transfer, starting after this GPU so the GPUs spread
        // their writes over the links; one bulk group per tile.
        for (int q = 0; q < n_out; q++) tma_store((unsigned char*)outs.p[(me + 1 + q) % n_out] + off, res, (unsigned int)(nv * 16));
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      }}
      if (k + {STAGES} < mine) TMA_ISSUE(k + {STAGES});
    }}
  }}
  if (bulk_out && threadIdx.x == 0) {{
    // Every bulk store complete (not just read out of shared memory), and ordered before the
    // done barrier's flags, which the generic proxy writes.
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    asm volatile("fence.proxy.async.global;" ::: "memory");
  }}
  #undef TMA_ISSUE
#endif
  // The elements past the last 16-byte boundary (all of them below sm_90, where the host
  // never launches this kernel), by threads as the bulk kernel does.
  const unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = tail + tid; i < end; i += stride) {{
{elem}
  }}
  arrive_done(syncs, n_gpus, me, epoch, timeout_ns);
}}
"#,
        STAGES = STAGES,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_fit_the_shared_memory_and_only_aligned_reductions_take_it() {
        for n in 1..=crate::kernels::MAX_PEERS {
            for stores in [false, true] {
                let t = tile_bytes(n, stores);
                assert!(t >= 1024 && t.is_multiple_of(1024), "{n}");
                let tiles = STAGES as u64 * (n as u64 + u64::from(stores));
                assert!(tiles * t <= SMEM_BYTES as u64, "{n}");
            }
        }
        assert_eq!(tile_bytes(4, false), 16 * 1024);
        assert_eq!(tile_bytes(4, true), 12 * 1024);
        let s = |ins: Vec<u64>, outs: Vec<u64>, b: u64| Spec {
            ins,
            outs,
            range: (b, b + 100),
        };
        let f32 = DataType::F32;
        for stores in [false, true] {
            assert!(usable(
                &s(vec![0x1000, 0x2000], vec![0x3000], 4),
                f32,
                stores
            ));
            // An odd address, a range start off 16 bytes: the bulk kernel.
            assert!(!usable(
                &s(vec![0x1000, 0x2008], vec![0x3000], 0),
                f32,
                stores
            ));
            assert!(!usable(
                &s(vec![0x1000, 0x2000], vec![0x3004], 0),
                f32,
                stores
            ));
            assert!(!usable(
                &s(vec![0x1000, 0x2000], vec![0x3000], 2),
                f32,
                stores
            ));
            assert!(usable(
                &s(vec![0x1000, 0x2000], vec![0x3000], 2),
                DataType::F64,
                stores
            ));
        }
        // A copy (one input) only with bulk stores.
        assert!(!usable(&s(vec![0x1000], vec![0x3000], 0), f32, false));
        assert!(usable(&s(vec![0x1000], vec![0x3000, 0x5000], 0), f32, true));
    }
}

#[cfg(test)]
mod gpu_tests {
    use super::*;
    use crate::check::{fill, op_code, CheckArgs, COLL_ALL_REDUCE};
    use crate::gpu::{DevBuf, GpuCtx};
    use crate::launch::{launch, CallShape};

    /// Runs `ins` into the two buffers of `outs` over `range` with `shape` (its `tma` picks
    /// the kernel) and returns both outputs, cleared before.
    fn run(
        gpu: &GpuCtx,
        ins: &[u64],
        outs: &[DevBuf],
        range: (u64, u64),
        shape: &CallShape<'_>,
    ) -> Vec<Vec<u8>> {
        let bytes = outs[0].bytes;
        for out in outs {
            gpu.upload(out, 0, &vec![0u8; bytes]).expect("clear");
        }
        let spec = Spec {
            ins: ins.to_vec(),
            outs: outs.iter().map(|b| b.ptr).collect(),
            range,
        };
        // The TMA form must be the one that runs where asked (launch falls back otherwise).
        let stores = shape.tma >= 2;
        assert!(
            shape.tma == 0 || usable(&spec, shape.dt, stores),
            "{} {range:?}",
            shape.dt
        );
        // SAFETY: every pointer is a live allocation of the range's elements on this GPU, kept
        // until the synchronize below.
        unsafe { launch(gpu, gpu.stream, 0, &spec, shape) }.expect("launch");
        gpu.synchronize().expect("kernel ran");
        outs.iter()
            .map(|out| {
                let mut host = vec![0u8; bytes];
                gpu.download(out, 0, &mut host).expect("download");
                host
            })
            .collect()
    }

    /// On a GPU of compute capability 9.0 or later: the TMA kernel's two outputs, with TMA
    /// loads and with TMA loads and stores, are byte for byte the bulk kernel's, for every
    /// dtype and op, 4 inputs, ranges from the start and from an aligned offset, with and
    /// without a tail past 16 bytes, one tile and many, 24 blocks and 2 (each reusing its
    /// stages many times); copies (one input) with bulk stores are the input. Without a
    /// driver, or below 9.0: a skip line.
    #[test]
    fn tma_kernel_matches_the_bulk_kernel() {
        let Some(gpus) = crate::driver::gpus_or_skip("TMA bulk kernel on the GPU") else {
            return;
        };
        let mut gpu = GpuCtx::new(gpus[0].ordinal, None).expect("context");
        gpu.load_tma(None).expect("TMA kernels");
        if !gpu.has_tma() {
            println!("SKIP TMA bulk kernel: GPU 0 has no TMA kernel (compute capability below 9.0 or too little shared memory)");
            return;
        }
        let shape = |dt, op, blocks, tma| CallShape {
            dt,
            op,
            syncs: std::slice::from_ref(&gpu.sync.ptr),
            avg_n: 4,
            blocks,
            timeout_ns: 10_000_000_000,
            wide: true,
            tma,
        };
        let (mut cases, mut differ) = (0, Vec::new());
        for dt in DataType::ALL {
            for op in ReduceOp::ALL {
                for count in [1usize, 37, 4099, 200_003] {
                    let bytes = count * dt.size();
                    let ins: Vec<_> = (0..4)
                        .map(|r| {
                            let b = gpu.alloc(bytes).expect("alloc");
                            let args = CheckArgs {
                                coll: COLL_ALL_REDUCE,
                                op: op_code(op),
                                nranks: 4,
                                rank: r,
                                signed: 1,
                                fp8: i32::from(matches!(dt, DataType::F8E4M3 | DataType::F8E5M2)),
                                count: count as u64,
                                seed: 11,
                                ..Default::default()
                            };
                            // SAFETY: `b` holds `count` elements of dt.
                            unsafe { fill(&gpu, dt, b.ptr, count as u64, 0, &args) }.expect("fill");
                            b
                        })
                        .collect();
                    let ptrs: Vec<u64> = ins.iter().map(|b| b.ptr).collect();
                    // Two outputs: the bulk stores send a tile to each.
                    let outs: Vec<_> = (0..2).map(|_| gpu.alloc(bytes).expect("alloc")).collect();
                    let v = (16 / dt.size()) as u64;
                    // 2 blocks: every block reuses its stages (and result tiles) many times.
                    for (begin, blocks) in [(0u64, 24u32), (5 * v, 24), (0, 2)] {
                        if begin >= count as u64 {
                            continue;
                        }
                        let range = (begin, count as u64);
                        // Bulk, TMA loads, TMA loads and stores.
                        let got: Vec<_> = (0..3u8)
                            .map(|k| run(&gpu, &ptrs, &outs, range, &shape(dt, op, blocks, k)))
                            .collect();
                        cases += 1;
                        for (k, g) in got.iter().enumerate() {
                            for (o, bytes) in g.iter().enumerate() {
                                if *bytes != got[0][0] {
                                    let first =
                                        got[0][0].iter().zip(bytes).position(|(a, b)| a != b);
                                    let way = ["bulk", "TMA loads", "TMA loads and stores"][k];
                                    differ.push(format!("{dt} {op:?} count {count} from {begin}, {blocks} blocks, {way}, output {o}: first differing byte {first:?}"));
                                }
                            }
                        }
                    }
                }
            }
        }
        // Copies (one input, two outputs: all_gather's and broadcast's parts) with bulk stores.
        for dt in [DataType::F32, DataType::Bf16, DataType::U8] {
            let count = 200_003usize;
            let bytes = count * dt.size();
            let src = gpu.alloc(bytes).expect("alloc");
            let host: Vec<u8> = (0..bytes).map(|i| (i * 7 + 3) as u8).collect();
            gpu.upload(&src, 0, &host).expect("upload");
            let outs: Vec<_> = (0..2).map(|_| gpu.alloc(bytes).expect("alloc")).collect();
            for blocks in [2u32, 24] {
                cases += 1;
                // The copy is the input itself (avg does not divide a copy), in every output.
                for (k, tma) in [0u8, 2].into_iter().enumerate() {
                    let sh = shape(dt, ReduceOp::Avg, blocks, tma);
                    let got = run(&gpu, &[src.ptr], &outs, (0, count as u64), &sh);
                    for (o, g) in got.iter().enumerate() {
                        if *g != host {
                            let first = host.iter().zip(g).position(|(a, b)| a != b);
                            let way = ["bulk", "TMA loads and stores"][k];
                            differ.push(format!("copy {dt}, {blocks} blocks, {way}, output {o}: first differing byte {first:?}"));
                        }
                    }
                }
            }
        }
        println!(
            "TMA bulk kernel: {cases} cases, {} differ from the bulk kernel",
            differ.len()
        );
        assert!(differ.is_empty(), "{}", differ.join("\n"));
    }
}
