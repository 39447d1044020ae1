//! The push all-reduce (and reduce-scatter): every byte crosses NVLink as a write, none as a
//! read.
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
use crate::kernels::{ctype, op_expr, vec_name, MAX_PEERS};
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
// The most slots (8 GPUs, 128 blocks, four deep) of the least size fill the scratch at most.
const _: () = assert!(MAX_PEERS * MAX_BLOCKS as usize * depth(true) * 4096 <= SCRATCH_BYTES);
const _: () = assert!(
    crate::kernels::SYNC_BYTES <= FLAGS_OFFSET
        && FLAGS_OFFSET + 2 * FLAG_WORDS * 8 <= crate::kernels::P2P_OFFSET
);
/// The scratch slots, after the low-latency scratch in each GPU's area:
/// `[sender][block][slot]`, each `slot_bytes` ([`shape`]).
pub const SCRATCH_OFFSET: usize = crate::kernels::SCRATCH_OFFSET + crate::ll::SCRATCH_BYTES;
pub const SCRATCH_BYTES: usize = 16 << 20;
/// Slots per sender and block: one being reduced, one being filled; four where the block's
/// halves send and reduce at their own pace (`split`). The kernel takes it as an argument.
const fn depth(split: bool) -> usize {
    if split {
        4
    } else {
        2
    }
}
/// Largest slot: bigger tiles gain nothing once a block's writes fill NVLink.
const MAX_SLOT: usize = 64 * 1024;

pub fn kernel_name(dt: DataType, op: ReduceOp) -> String {
    format!("push_{}_{}", dt.name(), op.name())
}

/// One push call, the same on every GPU of it ([`shape`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub blocks: u32,
    /// Bytes of one scratch slot (one tile).
    pub slot: usize,
    /// The block's halves send and reduce at their own pace (`RAILCC_GPU_PUSH_SPLIT`).
    pub split: bool,
    /// A reduce-scatter (else an all-reduce).
    pub rs: bool,
}

/// The push kernel's shape for an all-reduce of `count` elements, or (`rs`) a reduce-scatter
/// of `count` elements per rank, on `n` GPUs with at most `max_blocks` blocks: slots as large
/// as the scratch allows (at most 64 KiB, a multiple of 4 KiB), then no more blocks than a
/// segment has tiles. Depends only on the call's shape, so every GPU computes the same.
pub fn shape(
    rs: bool,
    n: usize,
    count: usize,
    dt: DataType,
    max_blocks: u32,
    split: bool,
) -> Shape {
    let b0 = max_blocks.clamp(1, MAX_BLOCKS) as usize;
    let n = n.max(1);
    let slot = (SCRATCH_BYTES / (n * b0 * depth(split)) / 4096 * 4096).clamp(4096, MAX_SLOT);
    let per_bytes = layout(rs, n, count, dt).1 * dt.size();
    let tiles = per_bytes.div_ceil(slot).max(1);
    Shape {
        blocks: b0.min(tiles) as u32,
        slot,
        split,
        rs,
    }
}

/// (elements of each input, elements of a segment): an all-reduce's inputs split as the bulk
/// kernel splits them (plan.rs `segment`: multiples of 16 bytes, the last segment shorter), a
/// reduce-scatter's inputs in the ranks' blocks.
fn layout(rs: bool, n: usize, count: usize, dt: DataType) -> (usize, usize) {
    if rs {
        (n * count, count)
    } else {
        let v = 16 / dt.size();
        (count, count.div_ceil(v).div_ceil(n) * v)
    }
}

/// What every push kernel shares: the copy of a tile into a peer's slot, and the barrier of
/// a block's thread group.
pub const COMMON_SOURCE: &str = r#"
// Copies nbytes from src to dst with threads tid of nth: 16-byte vectors, four loads in flight
// a thread before their stores, when both are 16-byte aligned; else 8- or 4-byte words where
// both allow, else byte by byte.
__device__ __forceinline__ void push_copy(unsigned char* dst, const unsigned char* src, unsigned long long nbytes, bool aligned, unsigned int tid, unsigned int nth) {
  if (aligned) {
    const unsigned long long nv = nbytes / 16;
    const uint4* s = (const uint4*)src;
    uint4* d = (uint4*)dst;
    unsigned long long j = tid;
    for (; j + 3 * nth < nv; j += 4 * nth) {
      uint4 a = s[j], b = s[j + nth], c = s[j + 2 * nth], e = s[j + 3 * nth];
      d[j] = a; d[j + nth] = b; d[j + 2 * nth] = c; d[j + 3 * nth] = e;
    }
    for (; j < nv; j += nth) d[j] = s[j];
    for (unsigned long long i = nv * 16 + tid; i < nbytes; i += nth) dst[i] = src[i];
  } else if ((((unsigned long long)dst | (unsigned long long)src) & 7) == 0) {
    // A reduce-scatter's blocks off 16 bytes: the widest words both ends allow.
    const unsigned long long nw = nbytes / 8;
    for (unsigned long long j = tid; j < nw; j += nth) ((unsigned long long*)dst)[j] = ((const unsigned long long*)src)[j];
    for (unsigned long long i = nw * 8 + tid; i < nbytes; i += nth) dst[i] = src[i];
  } else if ((((unsigned long long)dst | (unsigned long long)src) & 3) == 0) {
    const unsigned long long nw = nbytes / 4;
    for (unsigned long long j = tid; j < nw; j += nth) ((unsigned int*)dst)[j] = ((const unsigned int*)src)[j];
    for (unsigned long long i = nw * 4 + tid; i < nbytes; i += nth) dst[i] = src[i];
  } else {
    for (unsigned long long i = tid; i < nbytes; i += nth) dst[i] = src[i];
  }
}
// Waits until *p >= target, each load an acquire at system scope (the peers' writes before
// their flag are seen after it, by the group too once it passes the barrier), without the
// fence that would also wait for this thread's own NVLink writes in flight. Ends early as
// kernels.rs' waits do: at the deadline (timed_out) or on the abort word.
__device__ __forceinline__ void push_wait(volatile unsigned long long* p, unsigned long long target, unsigned long long timeout_ns, unsigned long long area) {
  const unsigned long long t0 = now_ns();
  unsigned int spins = 0;
  for (;;) {
    unsigned long long v;
    asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    if (v >= target) return;
    if (now_ns() - t0 > timeout_ns) { timed_out(area); return; }
    if ((++spins & 1023u) == 0 && aborted(area)) return;
  }
}
// Slot s of sender r for block blk (of nb, depth slots a sender) in the scratch at `scratch`
// (one GPU's): where the sender writes and the owner reads.
__device__ __forceinline__ unsigned long long push_slot(unsigned long long scratch, int r, unsigned int nb, unsigned int blk, unsigned long long depth, unsigned long long s, unsigned long long slot_bytes) {
  return scratch + (((unsigned long long)r * nb + blk) * depth + s) * slot_bytes;
}
// The barrier of this thread's group: the whole block, or (split) named barrier `id` of the
// group's nth threads (1: senders, 2: reducers; 0 is __syncthreads').
__device__ __forceinline__ void push_group_sync(bool split, unsigned int id, unsigned int nth) {
  // barrier.sync, not bar.sync: the group's threads may come from divergent waits.
  if (split) asm volatile("barrier.sync %0, %1;" :: "r"(id), "r"(nth) : "memory");
  else __syncthreads();
}
"#;

/// CUDA source of the push kernel for one dtype and op (uses kernels.rs's helpers and
/// [`COMMON_SOURCE`]). `rs` (reduce-scatter): the segments are the inputs' blocks of `per`
/// elements and each owner writes only its own output, from its start; else (all-reduce) every
/// output, at the segment's place. `split`: the block's first half sends and its second half
/// reduces, each at its own pace (four slots a sender), instead of every thread doing both in
/// turn (two slots, sends a tile ahead).
pub fn kernel_source(dt: DataType, op: ReduceOp) -> String {
    let (t, acc, ld, st) = ctype(dt);
    let expr = op_expr(op, dt);
    let avg = if op == ReduceOp::Avg {
        format!("{{ {t} w = {st}(acc); acc = {ld}(w) / ({acc})avg_n; }}")
    } else {
        String::new()
    };
    let name = kernel_name(dt, op);
    let (flags, fw, scratch, maxb) = (FLAGS_OFFSET, FLAG_WORDS, SCRATCH_OFFSET, MAX_BLOCKS);
    let tile = tile_source(&name, &vec_name(dt, op), t, acc, ld, st, expr, &avg);
    format!(
        r#"{tile}
extern "C" __global__ void __launch_bounds__({THREADS}) {name}(const {t}* in, Ptrs outs, unsigned long long count, unsigned long long per, Ptrs areas, int n, int me, int avg_n, unsigned long long tile, int rs, int split, unsigned long long depth, unsigned long long timeout_ns) {{
  typedef {t} T;
  const unsigned long long area = areas.p[me];
  const unsigned long long epoch = call_epoch(area);
  arrive_ready(areas, n, me, epoch, timeout_ns);
  const unsigned long long base = epoch << 32;
  const unsigned long long tiles = (per + tile - 1) / tile;
  const unsigned int blk = blockIdx.x, nb = gridDim.x;
  // Split: threads [0, nth) send, [nth, 2 nth) reduce; else every thread does both.
  const unsigned int nth = split ? blockDim.x / 2 : blockDim.x;
  const bool sender = !split || threadIdx.x < nth;
  const unsigned int tid = sender ? threadIdx.x : threadIdx.x - nth;
  // Tiles start at multiples of 16 bytes only where the segments do (a reduce-scatter's
  // blocks may not).
  bool aligned = ((unsigned long long)in % 16) == 0 && (per * sizeof(T)) % 16 == 0;
  for (int r = 0; r < n; r++) aligned = aligned && (outs.p[r] % 16 == 0);
  volatile unsigned long long* posted = (volatile unsigned long long*)(area + {flags}ull);
  volatile unsigned long long* freed = posted + {fw};
  // Send tile number k (tile index t) of every peer's segment into the peer's slot k % depth,
  // once the peer has freed what that slot held (tile k - depth), starting after me so the
  // GPUs spread their writes over the links; then raise "posted" in each peer's area.
  #define SEND(k, t) do {{ \
    if ((k) >= depth) {{ \
      if (tid < n && tid != me) \
        push_wait(freed + tid * {maxb} + blk, base | ((k) - depth + 1ull), timeout_ns, area); \
      push_group_sync(split, 1, nth); \
    }} \
    for (int q = 1; q < n; q++) {{ \
      const int p = (me + q) % n; \
      const unsigned long long sb = min((unsigned long long)p * per, count), se = min(sb + per, count); \
      const unsigned long long tb = sb + (t) * tile, te = min(tb + tile, se); \
      if (tb < te) push_copy((unsigned char*)push_slot(areas.p[p] + {scratch}ull, me, nb, blk, depth, (k) % depth, tile * sizeof(T)), (const unsigned char*)(in + tb), (te - tb) * sizeof(T), aligned, tid, nth); \
    }} \
    __threadfence_system(); \
    push_group_sync(split, 1, nth); \
    if (tid < n && tid != me) \
      ((volatile unsigned long long*)(areas.p[tid] + {flags}ull))[me * {maxb} + blk] = base | ((k) + 1ull); \
  }} while (0)
  // Reduce tile number k (index t) of my segment once every peer posted it, in rank order,
  // into the outputs; then raise "freed" in each sender's area. (The waits' acquire loads
  // order the group's reads after the flag. No fence before "freed":
  // the group's slot reads have returned by the barrier, their values stored.)
  #define REDUCE(k, t) do {{ \
    if (tid < n && tid != me) \
      push_wait(posted + tid * {maxb} + blk, base | ((k) + 1ull), timeout_ns, area); \
    push_group_sync(split, 2, nth); \
    {name}_tile(in, outs, count, per, n, me, avg_n, tile, rs, (t), aligned, tid, nth, area + {scratch}ull, nb, blk, depth, (k) % depth); \
    push_group_sync(split, 2, nth); \
    if (tid < n && tid != me) \
      ((volatile unsigned long long*)(areas.p[tid] + {flags}ull))[{fw} + me * {maxb} + blk] = base | ((k) + 1ull); \
  }} while (0)
  if (split) {{
    unsigned long long k = 0;
    for (unsigned long long t = blk; t < tiles; t += nb, k++) {{
      if (sender) SEND(k, t);
      else REDUCE(k, t);
    }}
  }} else {{
    if (blk < tiles) SEND(0ull, (unsigned long long)blk);
    unsigned long long k = 0;
    for (unsigned long long t = blk; t < tiles; t += nb, k++) {{
      if (t + nb < tiles) SEND(k + 1ull, t + nb);
      REDUCE(k, t);
    }}
  }}
  #undef REDUCE
  #undef SEND
  __syncthreads();
  arrive_done(areas, n, me, epoch, timeout_ns);
}}
"#
    )
}

/// The reduction of one tile: a device function, ahead of the kernel in the source.
#[allow(clippy::too_many_arguments)]
fn tile_source(
    name: &str,
    vec: &str,
    t: &str,
    acc: &str,
    ld: &str,
    st: &str,
    expr: &str,
    avg: &str,
) -> String {
    format!(
        r#"
// Tile t of my segment: my input and the peers' slots (slot s of this block in my scratch)
// reduced in rank order. The slots are read past L1 (ld.global.cg, volatile): this SM may hold lines of the same slot from
// an earlier tile, and L1 does not see the peers' NVLink writes.
__device__ __forceinline__ void {name}_tile(const {t}* in, Ptrs outs, unsigned long long count, unsigned long long per, int n, int me, int avg_n, unsigned long long tile, int rs, unsigned long long t, bool aligned, unsigned int tid, unsigned int nth, unsigned long long scratch, unsigned int nb, unsigned int blk, unsigned long long depth, unsigned long long s) {{
  typedef {t} T;
  const int V = 16 / sizeof(T);
  const unsigned long long sb = min((unsigned long long)me * per, count), se = min(sb + per, count);
  const unsigned long long tb = sb + t * tile, te = min(tb + tile, se);
  const T* src[8];
#pragma unroll
  for (int r = 0; r < 8; r++)
    src[r] = r < n ? (r == me ? in + tb : (const T*)push_slot(scratch, r, nb, blk, depth, s, tile * sizeof(T))) : (const T*)0;
  // All-reduce: every output, at the segment's place; reduce-scatter: my own, from its start.
  const int n_out = rs ? 1 : n;
  unsigned long long dst[8];
#pragma unroll
  for (int q = 0; q < 8; q++)
    dst[q] = q < n_out ? (rs ? outs.p[me] + (tb - sb) * sizeof(T) : outs.p[(me + q) % n] + tb * sizeof(T)) : 0ull;
  const unsigned long long len = te > tb ? te - tb : 0;
  const unsigned long long vl = aligned ? len / V * V : 0;
  // Two vectors of every source loaded a thread before any arithmetic: more loads in flight.
  const unsigned long long nv = vl / V;
  for (unsigned long long j = tid; j < nv; j += 2 * nth) {{
    const bool two = j + nth < nv;
    uint4 y[2][8];
#pragma unroll
    for (int r = 0; r < 8; r++) {{
      if (r < n) {{
        const uint4* s = (const uint4*)src[r];
        if (r == me) {{ y[0][r] = s[j]; if (two) y[1][r] = s[j + nth]; }}
        else {{ y[0][r] = __ldcg(s + j); if (two) y[1][r] = __ldcg(s + j + nth); }}
      }}
    }}
#pragma unroll
    for (int u = 0; u < 2; u++) {{
      if (u == 1 && !two) break;
      const uint4 x = {vec}(y[u], n, avg_n);
      for (int q = 0; q < n_out; q++) ((uint4*)dst[q])[j + u * nth] = x;
    }}
  }}
  for (unsigned long long i = vl + tid; i < len; i += nth) {{
    {acc} acc = {ld}(((volatile const T*)src[0])[i]);
    for (int r = 1; r < n; r++) {{ {acc} a = acc, b = {ld}(((volatile const T*)src[r])[i]); acc = {expr}; }}
    {avg}
    T v = {st}(acc);
    for (int q = 0; q < n_out; q++) ((T*)dst[q])[i] = v;
  }}
}}
"#
    )
}

/// Enqueues GPU `me`'s part of a push all-reduce of `count` elements from `input` into every
/// GPU's output (`outs[h]`: GPU h's, as `gpu` addresses it), or of a reduce-scatter of
/// `count` elements per rank from `input` (`n * count`) into `outs[me]`, in `s` from [`shape`]
/// (the same on every GPU of the call).
///
/// # Safety
/// `input` and the outputs must be device memory `gpu` can address, of the sizes above; `areas[h]` must be GPU h's area (kernels.rs `AREA_BYTES`) as `gpu` addresses it;
/// all live until the stream passes this kernel; every GPU of the call launches its part.
#[allow(clippy::too_many_arguments)]
pub unsafe fn launch(
    gpu: &GpuCtx,
    stream: sys::CUstream,
    me: usize,
    input: u64,
    outs: &[u64],
    count: usize,
    dt: DataType,
    op: ReduceOp,
    areas: &[u64],
    s: Shape,
    timeout_ns: u64,
) -> Result<()> {
    debug_assert!(areas.len() <= MAX_PEERS && outs.len() == areas.len());
    debug_assert!(
        s.blocks <= MAX_BLOCKS
            && areas.len() * s.blocks as usize * depth(s.split) * s.slot <= SCRATCH_BYTES
    );
    gpu.bind()?;
    let f = gpu.push_func(dt, op)?;
    let (mut i, mut po, mut pa) = (input, ptrs(outs), ptrs(areas));
    let (total, per) = layout(s.rs, areas.len(), count, dt);
    let (mut cnt, mut per) = (total as u64, per as u64);
    let (mut n, mut me_i, mut avg_n) = (areas.len() as i32, me as i32, areas.len() as i32);
    let mut tile = (s.slot / dt.size()) as u64;
    let (mut rs, mut split) = (i32::from(s.rs), i32::from(s.split));
    let mut slots = depth(s.split) as u64;
    let mut timeout = timeout_ns;
    let mut params: [*mut c_void; 13] = [
        &mut i as *mut u64 as *mut c_void,
        &mut po as *mut Ptrs as *mut c_void,
        &mut cnt as *mut u64 as *mut c_void,
        &mut per as *mut u64 as *mut c_void,
        &mut pa as *mut Ptrs as *mut c_void,
        &mut n as *mut i32 as *mut c_void,
        &mut me_i as *mut i32 as *mut c_void,
        &mut avg_n as *mut i32 as *mut c_void,
        &mut tile as *mut u64 as *mut c_void,
        &mut rs as *mut i32 as *mut c_void,
        &mut split as *mut i32 as *mut c_void,
        &mut slots as *mut u64 as *mut c_void,
        &mut timeout as *mut u64 as *mut c_void,
    ];
    // SAFETY: the parameters match the kernel's signature and live across the call; the caller
    // vouches for the pointers.
    unsafe {
        enqueue(
            f,
            s.blocks,
            THREADS,
            stream,
            &mut params,
            "cuLaunchKernel (push kernel)",
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
                for (rs, split) in [(false, false), (false, true), (true, false), (true, true)] {
                    let s = shape(rs, n, 1 << 28, DataType::F32, max_blocks, split);
                    assert!((1..=MAX_BLOCKS.min(max_blocks)).contains(&s.blocks));
                    assert!(s.slot.is_multiple_of(4096) && s.slot <= MAX_SLOT);
                    let scratch = n * s.blocks as usize * depth(split) * s.slot;
                    assert!(scratch <= SCRATCH_BYTES, "{n} {max_blocks} {split}");
                    assert_eq!((s.rs, s.split), (rs, split));
                }
            }
        }
        // 8 B on 4 GPUs: one tile, one block.
        assert_eq!(shape(false, 4, 2, DataType::F32, 24, false).blocks, 1);
        // 256 MB on 4 GPUs at NCCL's 24 channels: 64 KiB slots (40 KiB split), every block
        // busy.
        let s = shape(false, 4, 1 << 26, DataType::F32, 24, false);
        assert_eq!((s.blocks, s.slot), (24, 64 * 1024));
        let s = shape(false, 4, 1 << 26, DataType::F32, 24, true);
        assert_eq!((s.blocks, s.slot), (24, 40 * 1024));
        // A reduce-scatter's segments are the ranks' blocks: 1 MiB a rank is 16 tiles.
        assert_eq!(layout(true, 4, 1000, DataType::F32), (4000, 1000));
        assert_eq!(layout(false, 4, 1000, DataType::F32), (1000, 252));
        assert_eq!(shape(true, 4, 1 << 18, DataType::F32, 24, false).blocks, 16);
        let s = crate::kernels::source();
        for dt in DataType::ALL {
            for op in ReduceOp::ALL {
                assert!(s.contains(&format!("{}(", kernel_name(dt, op))));
            }
        }
    }
}
