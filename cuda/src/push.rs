//! The push all-reduce: every byte crosses NVLink as a write, none as a read.
//!
//! Why: the bulk kernel (kernels.rs) reduces each GPU's segment by reading every peer's input
//! over NVLink, and on 4 GPUs it stays at 0.89-0.94x NCCL at 256 MB-1 GB, while railcc's
//! all_gather (writes only) reads 1.11x. A read waits a round trip for its data; a write does
//! not, so few blocks keep more bytes in flight. NCCL's ring pushes too.
//!
//! Each GPU's segment (as in the bulk kernel) is cut into tiles; block b takes tiles b, b + B,
//! ... For each of its tiles, every GPU writes its input's piece of every peer's segment into
//! that peer's scratch slot for (sender, block), then raises a "posted" counter in the peer's
//! area. The segment's owner reduces its own input and the slots in rank order (so every GPU
//! gets bit-identical results, the same as the bulk kernel's), writes the result into every
//! output, and raises a "freed" counter in each sender's area: the sender may refill that slot.
//! Sends run one tile ahead of the reduction (two slots per sender and block), so a block's
//! NVLink writes do not wait for its peers' flags.
//!
//! In place is safe: the owner writes a tile into a peer's output only after that peer posted
//! the same tile, that is after it read its input there. Counters carry the call number in
//! their high 32 bits (kernels.rs' call counter, in device memory), so CUDA graphs replay
//! correctly; the bulk kernel's ready barrier at the start keeps a GPU from writing a peer's
//! scratch before the peer's previous call ended, its done barrier at the end keeps a kernel
//! from ending before every peer has written its outputs.

use crate::gpu::GpuCtx;
use crate::kernels::{avg_step, ctype, op_expr, MAX_PEERS};
use crate::launch::{enqueue, ptrs, Ptrs, THREADS};
use cudarc::driver::sys;
use railcc_core::{DataType, ReduceOp, Result};
use std::ffi::c_void;

/// Most thread blocks per GPU (the size of the counter tables).
pub const MAX_BLOCKS: u32 = 128;
/// Where the counters start in each GPU's area: "posted" words `[sender][block]`, then
/// "freed" words `[receiver][block]`, u64 each. Between the sync words and the p2p words
/// (kernels.rs).
pub const FLAGS_OFFSET: usize = 72 * 1024;
const FLAG_WORDS: usize = MAX_PEERS * MAX_BLOCKS as usize;
const _: () = assert!(
    crate::kernels::SYNC_BYTES <= FLAGS_OFFSET
        && FLAGS_OFFSET + 2 * FLAG_WORDS * 8 <= crate::kernels::P2P_OFFSET
);
/// The scratch slots, after the low-latency scratch in each GPU's area:
/// `[sender][block][slot]`, each `slot_bytes` ([`shape`]).
pub const SCRATCH_OFFSET: usize = crate::kernels::SCRATCH_OFFSET + crate::ll::SCRATCH_BYTES;
/// 32 MiB: 32 KiB tiles at 128 blocks on 4 GPUs (16 KiB on 8), 168 KiB at most at 24. On 4 x
/// H100 (2026-11-27, one machine) 32 KiB tiles at 128 blocks read 0.99-1.04x NCCL from 64 MB
/// where 16 MiB's 16 KiB tiles read 0.95-0.97x; at 24 blocks 128 and 256 KiB tiles (a 64 MiB
/// scratch) read 0.69-0.78x, below the bulk kernel, so no more memory than this.
pub const SCRATCH_BYTES: usize = 32 << 20;
/// Slots per sender and block: one being reduced, one being filled.
const DEPTH: usize = 2;
/// Largest slot by default (`RAILCC_GPU_PUSH_SLOT_BYTES`): the 32 KiB measured at 128 blocks on
/// 4 GPUs.
pub const DEFAULT_SLOT: usize = 32 * 1024;

pub fn kernel_name(dt: DataType, op: ReduceOp) -> String {
    format!("push_{}_{}", dt.name(), op.name())
}

/// Thread blocks and slot bytes of a push all-reduce of `count` elements on `n` GPUs with at
/// most `max_blocks` blocks: slots as large as the scratch allows (at most `max_slot`, a
/// multiple of 4 KiB), then no more blocks than the largest segment has tiles. Depends only on
/// the call's shape and the communicator's agreed `max_slot`, so every GPU computes the same.
pub fn shape(
    n: usize,
    count: usize,
    dt: DataType,
    max_blocks: u32,
    max_slot: usize,
) -> (u32, usize) {
    let b0 = max_blocks.clamp(1, MAX_BLOCKS) as usize;
    let n = n.max(1);
    let most = (max_slot / 4096 * 4096).max(4096);
    let slot = (SCRATCH_BYTES / (n * b0 * DEPTH) / 4096 * 4096).clamp(4096, most);
    let per_bytes = segment_len(count, dt, n) * dt.size();
    let tiles = per_bytes.div_ceil(slot).max(1);
    (b0.min(tiles) as u32, slot)
}

/// Elements of GPU 0's segment, the largest: the bulk kernel's split (plan.rs `segment`).
fn segment_len(count: usize, dt: DataType, n: usize) -> usize {
    let v = 16 / dt.size();
    count.div_ceil(v).div_ceil(n) * v
}

/// The byte copy every kernel shares: a send of one tile into a peer's slot.
pub const COMMON_SOURCE: &str = r#"
// Copies nbytes from src to dst with the block's threads: 16-byte vectors, four loads in flight
// a thread before their stores, when both are 16-byte aligned; else byte by byte.
__device__ __forceinline__ void push_copy(unsigned char* dst, const unsigned char* src, unsigned long long nbytes, bool aligned) {
  if (aligned) {
    const unsigned long long nv = nbytes / 16;
    const uint4* s = (const uint4*)src;
    uint4* d = (uint4*)dst;
    unsigned long long j = threadIdx.x;
    for (; j + 3 * blockDim.x < nv; j += 4 * blockDim.x) {
      uint4 a = s[j], b = s[j + blockDim.x], c = s[j + 2 * blockDim.x], e = s[j + 3 * blockDim.x];
      d[j] = a; d[j + blockDim.x] = b; d[j + 2 * blockDim.x] = c; d[j + 3 * blockDim.x] = e;
    }
    for (; j < nv; j += blockDim.x) d[j] = s[j];
    for (unsigned long long i = nv * 16 + threadIdx.x; i < nbytes; i += blockDim.x) dst[i] = src[i];
  } else {
    for (unsigned long long i = threadIdx.x; i < nbytes; i += blockDim.x) dst[i] = src[i];
  }
}
"#;

/// CUDA source of the push all-reduce for one dtype and op (uses kernels.rs's helpers and
/// [`COMMON_SOURCE`]).
pub fn kernel_source(dt: DataType, op: ReduceOp) -> String {
    // The kernel with the outputs as a parameter, and its late form (late.rs), which reads
    // them from a device slot (`RAILCC_GPU_LATE_ARGS=2`): the same body.
    let name = kernel_name(dt, op);
    let late = late_kernel_name(dt, op);
    let (t, ..) = ctype(dt);
    [
        (format!("{name}(const {t}* in, Ptrs outs, "), "", ""),
        (
            format!("{late}(const {t}* in, {}", crate::late::PARAMS),
            crate::late::PUSH_PROLOGUE,
            " || bad",
        ),
    ]
    .iter()
    .map(|(head, prologue, skip)| kernel_body(dt, op, head, prologue, skip))
    .collect()
}

/// The push kernel's late form (`RAILCC_GPU_LATE_ARGS=2`): its outputs from a device slot.
pub fn late_kernel_name(dt: DataType, op: ReduceOp) -> String {
    format!("pushl_{}_{}", dt.name(), op.name())
}

/// One form of the push kernel: its name and first parameters `head`, its first statements
/// `prologue`, and `skip`, what else sends it straight to its end after the ready barrier.
fn kernel_body(dt: DataType, op: ReduceOp, head: &str, prologue: &str, skip: &str) -> String {
    let (t, acc, ld, st) = ctype(dt);
    let expr = op_expr(op, dt);
    let avg = avg_step(dt, op);
    let (flags, fw, scratch, maxb) = (FLAGS_OFFSET, FLAG_WORDS, SCRATCH_OFFSET, MAX_BLOCKS);
    format!(
        r#"
extern "C" __global__ void __launch_bounds__({THREADS}) {head}unsigned long long count, unsigned long long per, Ptrs areas, int n, int me, int avg_n, unsigned long long tile, unsigned long long timeout_ns) {{
  typedef {t} T;
{prologue}
  const int V = 16 / sizeof(T);
  const unsigned long long area = areas.p[me];
  const unsigned long long epoch = call_epoch(area);
  if (arrive_ready(areas, n, me, epoch, timeout_ns){skip}) {{
    // Stopped (an abort, or a late fetch that failed): this block sends nothing, so it marks every tile of this call posted
    // and freed for the peers' same block; a peer that passed its ready wait would otherwise
    // wait on them for ever (an abort is not told to the peers). Below the next call's values.
    if (threadIdx.x < n && threadIdx.x != me) {{
      volatile unsigned long long* f = (volatile unsigned long long*)(areas.p[threadIdx.x] + {flags}ull);
      f[me * {maxb} + blockIdx.x] = (epoch << 32) | 0xffffffffull;
      f[{fw} + me * {maxb} + blockIdx.x] = (epoch << 32) | 0xffffffffull;
    }}
    arrive_done(areas, n, me, epoch, timeout_ns);
    return;
  }}
  const unsigned long long base = epoch << 32;
  const unsigned long long tiles = (per + tile - 1) / tile;
  const unsigned int blk = blockIdx.x, nb = gridDim.x;
  bool aligned = ((unsigned long long)in % 16) == 0;
  for (int r = 0; r < n; r++) aligned = aligned && (outs.p[r] % 16 == 0);
  volatile unsigned long long* posted = (volatile unsigned long long*)(area + {flags}ull);
  volatile unsigned long long* freed = posted + {fw};
  // Slot S of sender R for this block in GPU G's scratch.
  #define SLOT(G, R, S) ((T*)(areas.p[G] + {scratch}ull + ((((unsigned long long)(R) * nb + blk) * 2ull + (S)) * tile * sizeof(T))))
  // Send tile number k (tile index t) of every peer's segment, starting after me so the GPUs
  // spread their writes over the links.
  #define SEND(k, t) do {{ \
    if ((k) >= 2ull) {{ \
      if (threadIdx.x < n && threadIdx.x != me) \
        wait_at_least(freed + threadIdx.x * {maxb} + blk, base | ((k) - 1ull), now_ns(), timeout_ns, area); \
      __syncthreads(); \
    }} \
    for (int q = 1; q < n; q++) {{ \
      const int p = (me + q) % n; \
      const unsigned long long sb = min((unsigned long long)p * per, count), se = min(sb + per, count); \
      const unsigned long long tb = sb + (t) * tile, te = min(tb + tile, se); \
      if (tb < te) push_copy((unsigned char*)SLOT(p, me, (k) & 1ull), (const unsigned char*)(in + tb), (te - tb) * sizeof(T), aligned); \
    }} \
    __threadfence_system(); \
    __syncthreads(); \
    if (threadIdx.x < n && threadIdx.x != me) \
      ((volatile unsigned long long*)(areas.p[threadIdx.x] + {flags}ull))[me * {maxb} + blk] = base | ((k) + 1ull); \
  }} while (0)
  if (blk < tiles) SEND(0ull, (unsigned long long)blk);
  unsigned long long k = 0;
  for (unsigned long long t = blk; t < tiles; t += nb, k++) {{
    if (t + nb < tiles) SEND(k + 1ull, t + nb);
    if (threadIdx.x < n && threadIdx.x != me)
      wait_at_least(posted + threadIdx.x * {maxb} + blk, base | (k + 1ull), now_ns(), timeout_ns, area);
    __syncthreads();
    const unsigned long long sb = min((unsigned long long)me * per, count), se = min(sb + per, count);
    const unsigned long long tb = sb + t * tile, te = min(tb + tile, se);
    // The slots are read past L1 (ld.global.cg, volatile): this SM may hold lines of the
    // same slot from two tiles ago, and L1 does not see the peers' NVLink writes.
    const T* src[8];
#pragma unroll
    for (int r = 0; r < 8; r++) src[r] = r < n ? (r == me ? in + tb : (const T*)SLOT(me, r, k & 1ull)) : (const T*)0;
    const unsigned long long len = te > tb ? te - tb : 0;
    const unsigned long long vl = aligned ? len / V * V : 0;
    // Two vectors of every source loaded a thread before any arithmetic: more loads in flight.
    const unsigned long long nv = vl / V;
    for (unsigned long long j = threadIdx.x; j < nv; j += 2 * blockDim.x) {{
      const bool two = j + blockDim.x < nv;
      uint4 y[2][8];
#pragma unroll
      for (int r = 0; r < 8; r++) {{
        if (r < n) {{
          const uint4* s = (const uint4*)src[r];
          if (r == me) {{ y[0][r] = s[j]; if (two) y[1][r] = s[j + blockDim.x]; }}
          else {{ y[0][r] = __ldcg(s + j); if (two) y[1][r] = __ldcg(s + j + blockDim.x); }}
        }}
      }}
#pragma unroll
      for (int u = 0; u < 2; u++) {{
        if (u == 1 && !two) break;
        T* xv = (T*)&y[u][0];
        {acc} accs[V];
#pragma unroll
        for (int e = 0; e < V; e++) accs[e] = {ld}(xv[e]);
#pragma unroll
        for (int r = 1; r < 8; r++) {{
          if (r < n) {{
            T* yv = (T*)&y[u][r];
#pragma unroll
            for (int e = 0; e < V; e++) {{ {acc} a = accs[e], b = {ld}(yv[e]); accs[e] = {expr}; }}
          }}
        }}
        uint4 x;
        T* ov = (T*)&x;
#pragma unroll
        for (int e = 0; e < V; e++) {{ {acc} acc = accs[e]; {avg} ov[e] = {st}(acc); }}
        for (int q = 0; q < n; q++) ((uint4*)(outs.p[(me + q) % n] + tb * sizeof(T)))[j + u * blockDim.x] = x;
      }}
    }}
    for (unsigned long long i = vl + threadIdx.x; i < len; i += blockDim.x) {{
      {acc} acc = {ld}(((volatile const T*)src[0])[i]);
      for (int r = 1; r < n; r++) {{ {acc} a = acc, b = {ld}(((volatile const T*)src[r])[i]); acc = {expr}; }}
      {avg}
      T v = {st}(acc);
      for (int q = 0; q < n; q++) ((T*)outs.p[(me + q) % n])[tb + i] = v;
    }}
    // Every thread's reads of the slots are done (their values are stored): the senders may
    // refill them.
    __syncthreads();
    if (threadIdx.x < n && threadIdx.x != me)
      ((volatile unsigned long long*)(areas.p[threadIdx.x] + {flags}ull))[{fw} + me * {maxb} + blk] = base | (k + 1ull);
  }}
  #undef SEND
  #undef SLOT
  arrive_done(areas, n, me, epoch, timeout_ns);
}}
"#
    )
}

/// Where a push kernel finds every GPU's output.
#[derive(Clone, Copy)]
pub enum Outs<'a> {
    /// `outs[h]`: GPU h's, as the launching GPU addresses it.
    Now(&'a [u64]),
    /// From a late slot (late.rs), once the launcher has filled it.
    Late(crate::late::LateSlot),
}

/// Enqueues GPU `me`'s push all-reduce of `count` elements from `input` into every GPU's
/// output (`outs`) with `blocks` blocks and `slot_bytes` slots, both from [`shape`] (the same
/// on every GPU of the call).
///
/// # Safety
/// `input` and every output must be device memory `gpu` can address holding `count`
/// elements; `areas[h]` must be GPU h's area (kernels.rs `AREA_BYTES`) as `gpu` addresses it;
/// all live until the stream passes this kernel; every GPU of the call launches its part.
#[allow(clippy::too_many_arguments)]
pub unsafe fn launch(
    gpu: &GpuCtx,
    stream: sys::CUstream,
    me: usize,
    input: u64,
    outs: Outs<'_>,
    count: usize,
    dt: DataType,
    op: ReduceOp,
    areas: &[u64],
    (blocks, slot_bytes): (u32, usize),
    timeout_ns: u64,
) -> Result<()> {
    debug_assert!(areas.len() <= MAX_PEERS);
    debug_assert!(
        blocks <= MAX_BLOCKS && areas.len() * blocks as usize * DEPTH * slot_bytes <= SCRATCH_BYTES
    );
    gpu.bind()?;
    let (mut i, mut pa) = (input, ptrs(areas));
    let mut cnt = count as u64;
    let mut per = segment_len(count, dt, areas.len()) as u64;
    let (mut n, mut me_i, mut avg_n) = (areas.len() as i32, me as i32, areas.len() as i32);
    let mut tile = (slot_bytes / dt.size()) as u64;
    let mut timeout = timeout_ns;
    let (mut po, mut host, mut dev, mut token): (Ptrs, u64, u64, u32);
    // The function, then its parameters before the count: the outputs (one), or the slots
    // and the token (three, late.rs' PARAMS); the rest alike.
    let (f, head): (_, &[*mut c_void]) = match outs {
        Outs::Now(o) => {
            debug_assert!(o.len() == areas.len());
            po = ptrs(o);
            (
                gpu.push_func(dt, op)?,
                &[&mut po as *mut Ptrs as *mut c_void],
            )
        }
        Outs::Late(l) => {
            (host, dev, token) = (l.host, l.dev, l.token);
            (
                gpu.push_late_func(dt, op)?,
                &[
                    &mut host as *mut u64 as *mut c_void,
                    &mut dev as *mut u64 as *mut c_void,
                    &mut token as *mut u32 as *mut c_void,
                ],
            )
        }
    };
    let tail: [*mut c_void; 8] = [
        &mut cnt as *mut u64 as *mut c_void,
        &mut per as *mut u64 as *mut c_void,
        &mut pa as *mut Ptrs as *mut c_void,
        &mut n as *mut i32 as *mut c_void,
        &mut me_i as *mut i32 as *mut c_void,
        &mut avg_n as *mut i32 as *mut c_void,
        &mut tile as *mut u64 as *mut c_void,
        &mut timeout as *mut u64 as *mut c_void,
    ];
    let mut params = [std::ptr::null_mut::<c_void>(); 12];
    let used = 1 + head.len() + tail.len();
    params[0] = &mut i as *mut u64 as *mut c_void;
    params[1..1 + head.len()].copy_from_slice(head);
    params[1 + head.len()..used].copy_from_slice(&tail);
    let params = &mut params[..used];
    // SAFETY: the parameters match the kernel's signature (the form chosen above) and live
    // across the call; the caller vouches for the pointers.
    unsafe {
        enqueue(
            f,
            blocks,
            THREADS,
            stream,
            params,
            "cuLaunchKernel (push all-reduce)",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_fit_the_scratch_and_blocks_the_tiles() {
        for n in 2..=MAX_PEERS {
            for max_blocks in [1u32, 8, 24, 32, 132, 1024] {
                let (b, slot) = shape(n, 1 << 28, DataType::F32, max_blocks, DEFAULT_SLOT);
                assert!((1..=MAX_BLOCKS.min(max_blocks)).contains(&b));
                assert!(slot % 4096 == 0 && slot <= DEFAULT_SLOT);
                assert!(
                    n * b as usize * DEPTH * slot <= SCRATCH_BYTES,
                    "{n} {max_blocks}"
                );
            }
        }
        // 8 B on 4 GPUs: one tile, one block.
        assert_eq!(shape(4, 2, DataType::F32, 24, DEFAULT_SLOT).0, 1);
        // 256 MB on 4 GPUs at NCCL's 24 channels: 32 KiB slots, every block busy; at 128
        // blocks the same 32 KiB as measured.
        assert_eq!(
            shape(4, 1 << 26, DataType::F32, 24, DEFAULT_SLOT),
            (24, 32 * 1024)
        );
        assert_eq!(
            shape(4, 1 << 26, DataType::F32, 128, DEFAULT_SLOT),
            (128, 32 * 1024)
        );
        // Larger tiles where asked, as far as the scratch holds them (168 KiB there), and
        // never under 4 KiB or off 4 KiB.
        assert_eq!(
            shape(4, 1 << 26, DataType::F32, 24, 1 << 20),
            (24, 168 * 1024)
        );
        assert_eq!(shape(4, 1 << 26, DataType::F32, 24, 50_000).1, 12 * 4096);
        assert_eq!(shape(4, 1 << 26, DataType::F32, 24, 0).1, 4096);
        for max_slot in [0, 4096, 100_000, 1 << 20, usize::MAX] {
            for n in 2..=MAX_PEERS {
                for mb in [1u32, 24, 128] {
                    let (b, slot) = shape(n, 1 << 28, DataType::F32, mb, max_slot);
                    assert!(n * b as usize * DEPTH * slot <= SCRATCH_BYTES);
                }
            }
        }
        let s = crate::kernels::source();
        for dt in DataType::ALL {
            for op in ReduceOp::ALL {
                assert!(s.contains(&format!("{}(", kernel_name(dt, op))));
            }
        }
    }
}
