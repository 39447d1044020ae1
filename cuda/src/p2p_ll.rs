//! Small sends and receives between GPUs in one launch, NCCL's low-latency way: the sender
//! stores its data straight into an inbox in the receiver's area, each 16-byte line carrying
//! 8 data bytes and the step's flag twice, and the receiver polls its inbox until every line
//! shows the flag (`RAILCC_GPU_P2P_LL_BYTES`, up to 1 MiB by default).
//!
//! Why: a small send/recv through `p2p_many` costs a post, a take and a map on the host and a
//! staging copy, a grid-wide wait and a separate mark on the GPU: an all-to-all of 128 bytes
//! took 16.4 us under `mpirun -np 4` on 4 x H100, and 1 MB 0.70x NCCL's busbw
//! (bench/results/issue30/p2p-small-design.md). Here a call is one launch, no host exchange,
//! one NVLink one-way latency and its data: the inboxes are in the areas every peer maps at
//! init, and every count lives on the GPU (so a captured graph replays).
//!
//! A message of `bytes` is cut in `parts(bytes)` parts (16 KiB each, at most PARTS); part j
//! moves in steps of at most STEP_LINES lines through two slots of the receiver's inbox for
//! (sender, j), so a message of up to MAX_BYTES takes at most two steps a part and a send never
//! waits for this launch's receiver, only for the one before (its credit): launches on two GPUs
//! cannot wait on each other once their blocks run. A block's receive half waits while its send
//! half works, so a launch wants its blocks resident at once, as NCCL's kernels do: at most
//! 7 x 16 + 16 = 128 blocks of 512 threads on 8 GPUs, one per SM of an H100 (132); other
//! kernels holding SMs only delay it. Each (peer, part, direction) counts its steps in the area
//! (`WORDS_OFFSET`); the flag of step s is s | 1 (never the zero of a fresh inbox, and not the
//! flag of step s - 2, which used the slot before; every 2^30 steps the receiver zeroes the
//! slot, so a line skipped since cannot meet its flag again). The receiver writes its step into the
//! sender's CREDIT word once it has read a slot. The first step of part 0 carries a header
//! line with the sender's byte count: a receiver expecting another count stops every wait of
//! its context and records the peer and the count in the abort word (`ABORT_P2P_SIZE`), which
//! the host reports. At most one message per peer and direction a launch (the k-th between two
//! ranks is the k-th on both ends); more go in further launches.

use crate::gpu::GpuCtx;
use crate::kernels::{MAX_PEERS, P2P_OFFSET, SCRATCH_OFFSET};
use crate::launch::{enqueue, ptrs, Ptrs};
use cudarc::driver::sys;
use railcc_core::{Error, Result};
use std::ffi::c_void;

/// The largest message this path takes: every part fits two steps.
pub const MAX_BYTES: usize = 1 << 20;
/// Most parts a message is cut in (a thread block each, per direction).
pub const PARTS: usize = 16;
/// Bytes of a part below PARTS parts: a message of `bytes` has ceil(bytes / PART_BYTES).
/// On 4 x H100 under `mpirun -np 4` (2026-11-27), 16 KiB against 32 KiB: all-to-all 1 MB
/// 1.17x against 1.11x NCCL's busbw, 1-256 KB 1.23-1.29x against 0.88-1.20x.
const PART_BYTES: u64 = 16 * 1024;
/// Data lines of one step (8 bytes each: 32 KiB).
const STEP_LINES: usize = 4096;
/// Bytes from one slot to the next: STEP_LINES lines and the header line, on 256 bytes.
const SLOT_BYTES: usize = ((STEP_LINES + 1) * 16).next_multiple_of(256);
/// Where each GPU's inbox starts in its area: after the push kernel's scratch.
pub const INBOX_OFFSET: usize = crate::push::SCRATCH_OFFSET + crate::push::SCRATCH_BYTES;
/// The inbox: [source][part][slot].
pub const INBOX_BYTES: usize = MAX_PEERS * PARTS * 2 * SLOT_BYTES;
/// The step counts, u32 words from here: SSTEP[peer][part] (sent), RSTEP (received) and
/// CREDIT[peer][part] (written by the peer: the last step of ours it has read).
pub const WORDS_OFFSET: usize = P2P_OFFSET + 8192;
const _: () = assert!(WORDS_OFFSET + 3 * MAX_PEERS * PARTS * 4 <= SCRATCH_OFFSET);
/// Messages one launch takes per direction (one per peer).
pub const MAX_MSGS: usize = MAX_PEERS;
/// Threads per block: 8 warps send, 8 receive.
const THREADS: u32 = 512;
/// The abort word's low four bits when a receiver found another byte count than its own
/// (then bits 4-7: the sender, bits 8-31: the sender's count).
pub const ABORT_P2P_SIZE: u32 = 3;
/// Index in `kernels::P2P_KERNELS`.
const KERNEL: usize = 9;

/// Parts of a message of `bytes` (both ends compute the same).
pub fn parts(bytes: u64) -> u64 {
    bytes.div_ceil(PART_BYTES).clamp(1, PARTS as u64)
}

/// The CUDA C source, appended after `p2p_many::SOURCE` (it uses `p2p_copy_block`, `Ptrs` and
/// the sync helpers).
pub fn source() -> String {
    format!(
        r#"
#define LL_PARTS {PARTS}
#define LL_STEP_LINES {STEP_LINES}
#define LL_SLOT_U32 ({SLOT_BYTES} / 4)
#define LL_INBOX {INBOX_OFFSET}ull
#define LL_WORDS {WORDS_OFFSET}ull
#define ABORT_P2P_SIZE {ABORT_P2P_SIZE}u
#define LL_UNROLL 8
#define LL_PART_BYTES {PART_BYTES}ull
struct LlList {{ unsigned long long ptr[8]; unsigned long long bytes[8]; int peer[8]; int n; }};
struct LlCopies {{ unsigned long long src[8]; unsigned long long dst[8]; unsigned long long bytes[8]; int n; }};
__device__ __forceinline__ int ll_parts(unsigned long long bytes) {{
  unsigned long long p = (bytes + LL_PART_BYTES - 1ull) / LL_PART_BYTES;
  return p < 1ull ? 1 : (p > (unsigned long long)LL_PARTS ? LL_PARTS : (int)p);
}}
__device__ __forceinline__ volatile unsigned* ll_words(unsigned long long area) {{ return (volatile unsigned*)(area + LL_WORDS); }}
__device__ __forceinline__ unsigned* ll_slot(unsigned long long area, int src, int j, unsigned s) {{
  return (unsigned*)(area + LL_INBOX) + (unsigned long long)((src * LL_PARTS + j) * 2 + (int)(s & 1u)) * LL_SLOT_U32;
}}
__device__ __forceinline__ void ll_st(unsigned* p, unsigned a, unsigned b, unsigned c, unsigned d) {{
  asm volatile("st.volatile.global.v4.u32 [%0], {{%1, %2, %3, %4}};" :: "l"(p), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}}
__device__ __forceinline__ uint4 ll_ld(const unsigned* p) {{
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {{%0, %1, %2, %3}}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}}
// The n (1-8) bytes at p as a line's two data words; whole aligned lines in one load.
__device__ __forceinline__ uint2 ll_get(const unsigned char* p, unsigned n) {{
  if (n == 8u && ((unsigned long long)p & 7ull) == 0) return *(const uint2*)p;
  unsigned w[2] = {{0u, 0u}};
  for (unsigned i = 0; i < n; i++) w[i >> 2] |= (unsigned)p[i] << (8u * (i & 3u));
  return make_uint2(w[0], w[1]);
}}
__device__ __forceinline__ void ll_put(unsigned char* p, unsigned n, uint2 v) {{
  if (n == 8u && ((unsigned long long)p & 7ull) == 0) {{ *(uint2*)p = v; return; }}
  unsigned w[2] = {{v.x, v.y}};
  for (unsigned i = 0; i < n; i++) p[i] = (unsigned char)(w[i >> 2] >> (8u * (i & 3u)));
}}
// Block b's part among the messages of `l` (each cut in ll_parts): false when b is past them.
__device__ __forceinline__ bool ll_find(const LlList& l, int b, int* m, int* j, int* parts) {{
  for (int k = 0; k < l.n; k++) {{
    int p = ll_parts(l.bytes[k]);
    if (b < p) {{ *m = k; *j = b; *parts = p; return true; }}
    b -= p;
  }}
  return false;
}}
// Lines [*l0, *l1) of part j of a message of `bytes` cut in `parts`, and the part's steps
// (part 0 takes one with no data: its header goes anyway).
__device__ __forceinline__ int ll_range(unsigned long long bytes, int parts, int j, unsigned long long* l0, unsigned long long* l1) {{
  unsigned long long lines = (bytes + 7ull) / 8ull, per = (lines + parts - 1) / parts;
  *l0 = per * j < lines ? per * j : lines;
  *l1 = per * (j + 1) < lines ? per * (j + 1) : lines;
  int steps = (int)((*l1 - *l0 + LL_STEP_LINES - 1) / LL_STEP_LINES);
  return j == 0 && steps == 0 ? 1 : steps;
}}
// Waits until the line at p carries flag f twice; false when the context's waits stopped.
__device__ __forceinline__ bool ll_poll(const unsigned* p, unsigned f, uint4* v, unsigned long long mine, unsigned long long t0, unsigned long long timeout_ns) {{
  unsigned spins = 0;
  while (v->y != f || v->w != f) {{
    if ((++spins & 1023u) == 0) {{
      if (aborted(mine)) return false;
      if (now_ns() - t0 > timeout_ns) {{ timed_out(mine); return false; }}
    }}
    *v = ll_ld(p);
  }}
  return true;
}}
__device__ __forceinline__ void ll_send(unsigned long long mine, const Ptrs& theirs, int me, const LlList& l, int m, int j, int parts, unsigned long long timeout_ns) {{
  const int tid = threadIdx.x;  // 0-255
  const int peer = l.peer[m];
  volatile unsigned* w = ll_words(mine);
  const unsigned s0 = w[peer * LL_PARTS + j];
  volatile unsigned* credit = w + 2 * 8 * LL_PARTS + peer * LL_PARTS + j;
  unsigned long long l0, l1;
  const int steps = ll_range(l.bytes[m], parts, j, &l0, &l1);
  const unsigned char* src = (const unsigned char*)l.ptr[m];
  const unsigned long long bytes = l.bytes[m];
  const unsigned long long t0 = now_ns();
  for (int k = 0; k < steps; k++) {{
    const unsigned s = s0 + 1u + (unsigned)k, f = s | 1u;
    if (tid == 0) {{
      // The slot is free once the receiver has read step s - 2 (a launch before this one).
      unsigned spins = 0;
      while ((int)(*credit - (s - 2u)) < 0) {{
        if ((++spins & 1023u) == 0) {{
          if (aborted(mine)) break;
          if (now_ns() - t0 > timeout_ns) {{ timed_out(mine); break; }}
        }}
      }}
    }}
    asm volatile("bar.sync 1, 256;" ::: "memory");
    unsigned* slot = ll_slot(theirs.p[peer], me, j, s);
    if (j == 0 && k == 0 && tid == 0)
      ll_st(slot + 4 * LL_STEP_LINES, (unsigned)bytes, f, (unsigned)(bytes >> 32), f);
    const unsigned long long a = l0 + (unsigned long long)k * LL_STEP_LINES;
    const unsigned long long e = a + LL_STEP_LINES < l1 ? a + LL_STEP_LINES : l1;
    for (unsigned long long base = a + tid; base < e; base += 256ull * LL_UNROLL) {{
      uint2 d[LL_UNROLL];
#pragma unroll
      for (int u = 0; u < LL_UNROLL; u++) {{
        unsigned long long x = base + 256ull * u;
        if (x < e) {{
          unsigned long long at = 8ull * x;
          d[u] = ll_get(src + at, bytes - at < 8ull ? (unsigned)(bytes - at) : 8u);
        }}
      }}
#pragma unroll
      for (int u = 0; u < LL_UNROLL; u++) {{
        unsigned long long x = base + 256ull * u;
        if (x < e) ll_st(slot + 4 * (x - a), d[u].x, f, d[u].y, f);
      }}
    }}
  }}
  asm volatile("bar.sync 1, 256;" ::: "memory");
  if (tid == 0) w[peer * LL_PARTS + j] = s0 + (unsigned)steps;
}}
__device__ __forceinline__ void ll_recv(unsigned long long mine, const Ptrs& theirs, int me, const LlList& l, int m, int j, int parts, unsigned long long timeout_ns) {{
  const int tid = threadIdx.x - 256;
  const int peer = l.peer[m];
  volatile unsigned* w = ll_words(mine) + 8 * LL_PARTS;
  const unsigned s0 = w[peer * LL_PARTS + j];
  volatile unsigned* credit = ll_words(theirs.p[peer]) + 2 * 8 * LL_PARTS + me * LL_PARTS + j;
  unsigned long long l0, l1;
  const int steps = ll_range(l.bytes[m], parts, j, &l0, &l1);
  unsigned char* dst = (unsigned char*)l.ptr[m];
  const unsigned long long bytes = l.bytes[m];
  const unsigned long long t0 = now_ns();
  // Every thread runs every step's barriers, also after a wait stopped (an abort, a
  // deadline): a thread that left early would leave the others at a counted barrier.
  bool ok = true;
  for (int k = 0; k < steps; k++) {{
    const unsigned s = s0 + 1u + (unsigned)k, f = s | 1u;
    const unsigned* slot = ll_slot(mine, peer, j, s);
    if (j == 0 && k == 0 && tid == 0) {{
      const unsigned* h = slot + 4 * LL_STEP_LINES;
      uint4 v = ll_ld(h);
      if (ll_poll(h, f, &v, mine, t0, timeout_ns)) {{
        unsigned long long sent = (unsigned long long)v.x | ((unsigned long long)v.z << 32);
        // Another size than ours: every wait of the context stops; the host names the peer.
        if (sent != bytes)
          stop_waits(mine, ABORT_P2P_SIZE | ((unsigned)peer << 4) | ((unsigned)(sent < 0xffffffull ? sent : 0xffffffull) << 8));
      }}
    }}
    const unsigned long long a = l0 + (unsigned long long)k * LL_STEP_LINES;
    const unsigned long long e = a + LL_STEP_LINES < l1 ? a + LL_STEP_LINES : l1;
    for (unsigned long long base = a + tid; base < e && ok; base += 256ull * LL_UNROLL) {{
      uint4 v[LL_UNROLL];
#pragma unroll
      for (int u = 0; u < LL_UNROLL; u++) {{
        unsigned long long x = base + 256ull * u;
        if (x < e) v[u] = ll_ld(slot + 4 * (x - a));
      }}
#pragma unroll
      for (int u = 0; u < LL_UNROLL; u++) {{
        unsigned long long x = base + 256ull * u;
        if (x < e && ok) {{
          ok = ll_poll(slot + 4 * (x - a), f, &v[u], mine, t0, timeout_ns);
          unsigned long long at = 8ull * x;
          if (ok) ll_put(dst + at, bytes - at < 8ull ? (unsigned)(bytes - at) : 8u, make_uint2(v[u].x, v[u].z));
        }}
      }}
    }}
    // Every line of the slot read: the sender may refill it (step s + 2).
    asm volatile("bar.sync 2, 256;" ::: "memory");
    if ((s & 0x3fffffffu) < 2u) {{
      // Once in 2^30 steps each slot is zeroed, so no line stays unwritten long enough for
      // its flag to come round again (2^32 steps): a line the sender skipped since (shorter
      // messages) could otherwise pass for a new one.
      for (int i = tid; i <= LL_STEP_LINES; i += 256) ll_st((unsigned*)slot + 4 * i, 0u, 0u, 0u, 0u);
      __threadfence_system();
      asm volatile("bar.sync 2, 256;" ::: "memory");
    }}
    if (tid == 0) *credit = s;
  }}
  if (tid == 0) w[peer * LL_PARTS + j] = s0 + (unsigned)steps;
}}
// One launch: block b sends part b of `sends` (their parts in order) with its first 8 warps
// and receives part b of `recvs` with its last 8; blocks past both copy parts of `copies`
// (messages of this rank to itself). In blocks below `paired` the send and the receive cover
// the same bytes (in place): the receive writes once the send has read them.
extern "C" __global__ void __launch_bounds__(512) p2p_ll(unsigned long long mine, Ptrs theirs, int me, LlList sends, LlList recvs, LlCopies copies, int duo, int paired, unsigned long long timeout_ns) {{
  int m, j, parts;
  const int b = blockIdx.x;
  if (b >= duo) {{
    int c = b - duo;
    for (int k = 0; k < copies.n; k++) {{
      int p = ll_parts(copies.bytes[k]);
      if (c < p) {{
        unsigned long long per = ((copies.bytes[k] + p - 1) / p + 15ull) / 16ull * 16ull;
        unsigned long long x = per * c < copies.bytes[k] ? per * c : copies.bytes[k];
        unsigned long long y = per * (c + 1) < copies.bytes[k] ? per * (c + 1) : copies.bytes[k];
        p2p_copy_block((const unsigned char*)copies.src[k] + x, (unsigned char*)copies.dst[k] + x, y - x);
        return;
      }}
      c -= p;
    }}
    return;
  }}
  if (threadIdx.x < 256) {{
    if (ll_find(sends, b, &m, &j, &parts)) ll_send(mine, theirs, me, sends, m, j, parts, timeout_ns);
    if (b < paired) asm volatile("bar.arrive 3, 512;" ::: "memory");
  }} else {{
    if (b < paired) asm volatile("bar.sync 3, 512;" ::: "memory");
    if (ll_find(recvs, b, &m, &j, &parts)) ll_recv(mine, theirs, me, recvs, m, j, parts, timeout_ns);
  }}
}}
"#
    )
}

/// One message of a launch: to or from `peer`, at `ptr` (this GPU's memory), `bytes` long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlMsg {
    pub peer: usize,
    pub ptr: u64,
    pub bytes: u64,
}

/// A message of this rank to itself, copied by the launch's last blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SelfCopy {
    pub src: u64,
    pub dst: u64,
    pub bytes: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct List {
    ptr: [u64; MAX_MSGS],
    bytes: [u64; MAX_MSGS],
    peer: [i32; MAX_MSGS],
    n: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Copies {
    src: [u64; MAX_MSGS],
    dst: [u64; MAX_MSGS],
    bytes: [u64; MAX_MSGS],
    n: i32,
}

/// Thread blocks of a launch: the larger direction's parts, then the copies' parts.
pub fn blocks(sends: &[LlMsg], recvs: &[LlMsg], copies: &[SelfCopy]) -> (u32, u32) {
    let sum = |v: &[LlMsg]| v.iter().map(|m| parts(m.bytes)).sum::<u64>();
    let duo = sum(sends).max(sum(recvs));
    let own = copies.iter().map(|c| parts(c.bytes)).sum::<u64>();
    (duo as u32, (duo + own) as u32)
}

/// Why a launch's messages cannot go in one launch, if they cannot.
fn check(me: usize, npeers: usize, msgs: &[LlMsg], what: &str) -> Result<List> {
    let mut l = List::default();
    if msgs.len() > MAX_MSGS {
        return Err(Error::invalid(format!(
            "p2p_ll: {} {what} in one launch (at most {MAX_MSGS})",
            msgs.len()
        )));
    }
    for (k, m) in msgs.iter().enumerate() {
        if m.peer >= npeers.min(MAX_PEERS) || m.peer == me {
            return Err(Error::invalid(format!(
                "p2p_ll: {what} with peer {} (rank {me} of {npeers})",
                m.peer
            )));
        }
        if msgs[..k].iter().any(|o| o.peer == m.peer) {
            return Err(Error::invalid(format!(
                "p2p_ll: two {what} with peer {} in one launch",
                m.peer
            )));
        }
        if m.bytes > MAX_BYTES as u64 {
            return Err(Error::invalid(format!(
                "p2p_ll: a message of {} bytes (at most {MAX_BYTES})",
                m.bytes
            )));
        }
        l.ptr[k] = m.ptr;
        l.bytes[k] = m.bytes;
        l.peer[k] = m.peer as i32;
    }
    l.n = msgs.len() as i32;
    Ok(l)
}

/// Launches `sends`, `recvs` (at most one per peer each) and `copies` in one kernel on
/// `stream`. `mine` is this GPU's area, `theirs[p]` peer p's as this GPU addresses it. The
/// first `paired` sends and receives are pairs of the same bytes ([`pair_in_place`]): each
/// receive writes once its send has read them. Returns the blocks (0: nothing to launch).
///
/// # Safety
/// The areas live for the communicator's life; each message's buffer is this GPU's memory
/// holding `bytes`, live until the stream passes the launch; `stream` a live stream of `gpu`;
/// no other launch of these areas' LL words runs at the same time.
pub unsafe fn launch(
    gpu: &GpuCtx,
    stream: sys::CUstream,
    (mine, theirs): (u64, &[u64]),
    me: usize,
    (sends, recvs, copies): (&[LlMsg], &[LlMsg], &[SelfCopy]),
    paired: usize,
    timeout_ns: u64,
) -> Result<u32> {
    let same = |k: usize| matches!((sends.get(k), recvs.get(k)), (Some(s), Some(r)) if s.ptr == r.ptr && s.bytes == r.bytes);
    if !(0..paired).all(same) {
        return Err(Error::invalid(format!(
            "p2p_ll: the first {paired} sends and receives are not pairs of the same bytes"
        )));
    }
    let paired_blocks = sends[..paired].iter().map(|m| parts(m.bytes)).sum::<u64>() as i32;
    let mut s = check(me, theirs.len(), sends, "sends")?;
    let mut r = check(me, theirs.len(), recvs, "receives")?;
    if copies.len() > MAX_MSGS {
        return Err(Error::invalid(format!(
            "p2p_ll: {} copies in one launch (at most {MAX_MSGS})",
            copies.len()
        )));
    }
    let mut c = Copies::default();
    for (k, x) in copies.iter().enumerate() {
        c.src[k] = x.src;
        c.dst[k] = x.dst;
        c.bytes[k] = x.bytes;
    }
    c.n = copies.len() as i32;
    let (duo, total) = blocks(sends, recvs, copies);
    if total == 0 {
        return Ok(0);
    }
    let f = gpu.p2p_func(KERNEL)?;
    let (mut a, mut t, mut m, mut d, mut pb, mut to) = (
        mine,
        ptrs(theirs),
        me as i32,
        duo as i32,
        paired_blocks,
        timeout_ns,
    );
    let mut params: [*mut c_void; 9] = [
        &mut a as *mut u64 as *mut c_void,
        &mut t as *mut Ptrs as *mut c_void,
        &mut m as *mut i32 as *mut c_void,
        &mut s as *mut List as *mut c_void,
        &mut r as *mut List as *mut c_void,
        &mut c as *mut Copies as *mut c_void,
        &mut d as *mut i32 as *mut c_void,
        &mut pb as *mut i32 as *mut c_void,
        &mut to as *mut u64 as *mut c_void,
    ];
    gpu.bind()?;
    // SAFETY: the parameters match p2p_ll's signature; the caller vouches for the buffers,
    // areas and stream.
    unsafe {
        enqueue(
            f,
            total,
            THREADS,
            stream,
            &mut params,
            "cuLaunchKernel(p2p_ll)",
        )
    }?;
    Ok(total)
}

/// Orders one wave's `sends` and `recvs` for one launch where some receive writes bytes a send
/// reads (in place): each such receive paired with a send of exactly its bytes (an all-to-all
/// or a send/recv in place), the pairs first. Returns the lists and the pair count, or None
/// where an overlap is not such a pair (then the sends go in a launch before the receives).
#[allow(clippy::type_complexity)]
pub fn pair_in_place(sends: &[LlMsg], recvs: &[LlMsg]) -> Option<(Vec<LlMsg>, Vec<LlMsg>, usize)> {
    let over = |a: &LlMsg, b: &LlMsg| railcc_core::call::overlaps(a.ptr, a.bytes, b.ptr, b.bytes);
    let mut used = vec![false; sends.len()];
    let (mut ps, mut pr) = (Vec::new(), Vec::new());
    let mut rest_r = Vec::new();
    for r in recvs {
        let hits: Vec<usize> = (0..sends.len()).filter(|&k| over(r, &sends[k])).collect();
        match hits[..] {
            [] => rest_r.push(*r),
            [k] if !used[k] && sends[k].ptr == r.ptr && sends[k].bytes == r.bytes => {
                used[k] = true;
                ps.push(sends[k]);
                pr.push(*r);
            }
            _ => return None,
        }
    }
    let n = ps.len();
    ps.extend((0..sends.len()).filter(|&k| !used[k]).map(|k| sends[k]));
    pr.extend(rest_r);
    Some((ps, pr, n))
}

/// One launch's lists: its sends, its receives, and how many leading pairs of the same bytes
/// they start with ([`launch`]'s `paired`).
pub type Launch = (Vec<LlMsg>, Vec<LlMsg>, usize);

/// The launches of one round's messages (`msgs`: (send, message) in group order), in order:
/// one per wave ([`waves`]). Where a receive writes bytes a send of the round reads: in one
/// wave, each such receive paired with the send of exactly its bytes (all-to-all or send/recv
/// in place, [`pair_in_place`]); else every wave's sends in launches before every wave's
/// receives (a send never waits for this call's receives, so that cannot deadlock). At least
/// one launch (where the own copies go when there is no message).
pub fn plan(msgs: &[(bool, LlMsg)]) -> Vec<Launch> {
    let lists: Vec<(Vec<LlMsg>, Vec<LlMsg>)> = waves(
        &msgs
            .iter()
            .map(|(send, m)| (*send, m.peer))
            .collect::<Vec<_>>(),
    )
    .iter()
    .map(|(s, r)| {
        (
            s.iter().map(|&i| msgs[i].1).collect(),
            r.iter().map(|&i| msgs[i].1).collect(),
        )
    })
    .collect();
    let (sends, recvs): (Vec<_>, Vec<_>) = msgs.iter().partition(|(send, _)| *send);
    let in_place = recvs.iter().any(|(_, r)| {
        sends
            .iter()
            .any(|(_, s)| railcc_core::call::overlaps(r.ptr, r.bytes, s.ptr, s.bytes))
    });
    let mut launches: Vec<Launch> = Vec::new();
    if !in_place {
        launches.extend(lists.into_iter().map(|(s, r)| (s, r, 0)));
    } else if let (1, Some(paired)) = (
        lists.len(),
        lists.first().and_then(|(s, r)| pair_in_place(s, r)),
    ) {
        launches.push(paired);
    } else {
        launches.extend(lists.iter().map(|(s, _)| (s.clone(), Vec::new(), 0)));
        launches.extend(lists.into_iter().map(|(_, r)| (Vec::new(), r, 0)));
    }
    // A wave with no receive (or no send) adds no receive-only (send-only) launch.
    launches.retain(|(s, r, _)| !s.is_empty() || !r.is_empty());
    if launches.is_empty() {
        launches.push((Vec::new(), Vec::new(), 0));
    }
    launches
}

/// The waves of one round's messages: wave w holds the w-th message per peer and direction
/// (group order), so the k-th message between two ranks is in the same wave on both ends.
/// Each entry: (sends, receives), as indices into `msgs` ((send, peer) each).
pub fn waves(msgs: &[(bool, usize)]) -> Vec<(Vec<usize>, Vec<usize>)> {
    let mut out: Vec<(Vec<usize>, Vec<usize>)> = Vec::new();
    let mut seen = std::collections::HashMap::<(bool, usize), usize>::new();
    for (i, &(send, peer)) in msgs.iter().enumerate() {
        let w = seen.entry((send, peer)).or_insert(0);
        if out.len() <= *w {
            out.push((Vec::new(), Vec::new()));
        }
        if send {
            out[*w].0.push(i);
        } else {
            out[*w].1.push(i);
        }
        *w += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_and_blocks() {
        assert_eq!(parts(0), 1);
        assert_eq!(parts(1), 1);
        assert_eq!(parts(16 * 1024), 1);
        assert_eq!(parts(16 * 1024 + 1), 2);
        assert_eq!(parts(128 * 1024), 8);
        assert_eq!(parts(256 * 1024), 16);
        assert_eq!(parts(MAX_BYTES as u64), 16);
        // Every part of the largest message fits two steps.
        let lines = (MAX_BYTES as u64).div_ceil(8);
        assert!(lines.div_ceil(parts(MAX_BYTES as u64)) <= 2 * STEP_LINES as u64);
        let m = |peer, bytes| LlMsg {
            peer,
            ptr: 0,
            bytes,
        };
        // An all-to-all of 1 MB on 4 ranks: 256 KiB to each of 3 peers, and the own block.
        let s = [m(1, 1 << 18), m(2, 1 << 18), m(3, 1 << 18)];
        let own = [SelfCopy {
            src: 0,
            dst: 0,
            bytes: 1 << 18,
        }];
        assert_eq!(blocks(&s, &s, &own), (48, 64));
        assert_eq!(blocks(&s[..1], &[], &[]), (16, 16));
        assert_eq!(blocks(&[], &[], &[]), (0, 0));
    }

    #[test]
    fn waves_keep_each_pairs_order() {
        // Two sends to 1, one receive from 1, a send to 2.
        let w = waves(&[(true, 1), (true, 1), (false, 1), (true, 2)]);
        assert_eq!(w, vec![(vec![0, 3], vec![2]), (vec![1], vec![])]);
        assert!(waves(&[]).is_empty());
    }

    #[test]
    fn the_kernels_argument_layouts_match_the_source() {
        assert_eq!(crate::kernels::P2P_KERNELS[KERNEL], "p2p_ll");
        // LlList: 2 x 8 u64, 8 int, int n (padded to 8); LlCopies: 3 x 8 u64, int n.
        assert_eq!(std::mem::size_of::<List>(), 2 * 64 + 32 + 8);
        assert_eq!(std::mem::size_of::<Copies>(), 3 * 64 + 8);
        let src = source();
        assert!(src.contains("struct LlList { unsigned long long ptr[8]; unsigned long long bytes[8]; int peer[8]; int n; };"));
        assert!(src.contains("p2p_ll(unsigned long long mine, Ptrs theirs, int me, LlList sends, LlList recvs, LlCopies copies, int duo, int paired, unsigned long long timeout_ns)"));
        const { assert!(crate::kernels::AREA_BYTES >= INBOX_OFFSET + INBOX_BYTES) };
    }

    /// On a GPU: two ranks on one GPU (the context's area and a second one, a stream each)
    /// swap messages both ways at once, round after round (the step counts carry on): sizes
    /// from 0 bytes to MAX_BYTES, 8-byte aligned and not, with rank 0 copying a message to
    /// itself in the same launch and, in one round, two messages one way (two launches). Every
    /// byte is checked. Without a driver: a skip line.
    #[test]
    fn two_ranks_swap_small_messages() {
        let Some(gpus) = crate::driver::gpus_or_skip("p2p_ll on the GPU") else {
            return;
        };
        let t = TwoRanks::new(gpus[0].ordinal);
        let gpu = &t.gpu;
        let sizes: [(usize, usize); 9] = [
            (0, 8),
            (1, 7),
            (100, 4096),
            (65_536 + 3, 5),
            (262_144, 262_144),
            (MAX_BYTES, 1000),
            (MAX_BYTES - 1, MAX_BYTES),
            (300_000, 0),
            (8, 33_000),
        ];
        let mut bad = 0usize;
        let mut msgs = 0usize;
        let fill = |n: usize, salt: usize| -> Vec<u8> {
            (0..n)
                .map(|j| (j.wrapping_mul(131) ^ salt.wrapping_mul(7)) as u8)
                .collect()
        };
        for (round, &(a, b)) in sizes.iter().enumerate() {
            // Message k of the round from rank r: k == 1 only in round 3 (two one way).
            let extra = round == 3;
            let off = |r: usize| (round + r) % 3 * 5; // not 8-byte aligned in some rounds
            let mut bufs = Vec::new(); // (from, k, bytes, src buf, data, dst buf)
            for (r, n) in [(0usize, a), (1, b)] {
                for k in 0..if extra && r == 0 { 2 } else { 1 } {
                    let data = fill(n, round * 10 + r * 3 + k);
                    let src = gpu.alloc(n + 16).expect("alloc");
                    if n > 0 {
                        gpu.upload(&src, off(r), &data).expect("upload");
                    }
                    let dst = gpu.alloc(n + 16).expect("alloc");
                    gpu.upload(&dst, 0, &vec![0u8; n + 16]).expect("clear");
                    bufs.push((r, k, n, src, data, dst));
                }
            }
            let own = fill(5000 + round, 99);
            let own_src = gpu.alloc(own.len()).expect("alloc");
            gpu.upload(&own_src, 0, &own).expect("upload");
            let own_dst = gpu.alloc(own.len()).expect("alloc");
            for k in 0..if extra { 2 } else { 1 } {
                for r in 0..2 {
                    let at = |x: &crate::gpu::DevBuf, rr: usize| x.ptr + off(rr) as u64;
                    let sends: Vec<LlMsg> = bufs
                        .iter()
                        .filter(|x| x.0 == r && x.1 == k)
                        .map(|x| LlMsg {
                            peer: 1 - r,
                            ptr: at(&x.3, r),
                            bytes: x.2 as u64,
                        })
                        .collect();
                    let recvs: Vec<LlMsg> = bufs
                        .iter()
                        .filter(|x| x.0 == 1 - r && x.1 == k)
                        .map(|x| LlMsg {
                            peer: 1 - r,
                            ptr: at(&x.5, 1 - r),
                            bytes: x.2 as u64,
                        })
                        .collect();
                    let copies = if r == 0 && k == 0 {
                        vec![SelfCopy {
                            src: own_src.ptr,
                            dst: own_dst.ptr,
                            bytes: own.len() as u64,
                        }]
                    } else {
                        Vec::new()
                    };
                    t.launch(r, (&sends, &recvs, &copies), 0);
                }
            }
            t.sync();
            assert!(!gpu.kernels_stopped(), "a p2p_ll wait stopped");
            for (r, _, n, _, data, dst) in &bufs {
                let mut got = vec![0u8; n + 16];
                gpu.download(dst, 0, &mut got).expect("download");
                let o = off(*r); // the receive lands as far in as the send was read
                bad += (0..*n).filter(|&j| got[o + j] != data[j]).count();
                // Nothing written past the message.
                bad += got[o + n..].iter().filter(|&&x| x != 0).count();
                bad += got[..o].iter().filter(|&&x| x != 0).count();
                msgs += 1;
            }
            let mut got = vec![0u8; own.len()];
            gpu.download(&own_dst, 0, &mut got).expect("download");
            bad += (0..own.len()).filter(|&j| got[j] != own[j]).count();
        }
        // In place, both ways at once: each rank sends its buffer and receives into it.
        const IN_PLACE: usize = 70_001;
        let mut mine = Vec::new();
        for r in 0..2 {
            let data = fill(IN_PLACE, 500 + r);
            let b = gpu.alloc(IN_PLACE).expect("alloc");
            gpu.upload(&b, 0, &data).expect("upload");
            mine.push((b, data));
        }
        for (r, (b, _)) in mine.iter().enumerate() {
            let m = LlMsg {
                peer: 1 - r,
                ptr: b.ptr,
                bytes: IN_PLACE as u64,
            };
            let (s, v, n) = pair_in_place(&[m], &[m]).expect("a pair");
            t.launch(r, (&s, &v, &[]), n);
        }
        t.sync();
        for r in 0..2 {
            let mut got = vec![0u8; IN_PLACE];
            gpu.download(&mine[r].0, 0, &mut got).expect("download");
            bad += (0..IN_PLACE)
                .filter(|&j| got[j] != mine[1 - r].1[j])
                .count();
        }
        println!("p2p_ll: {msgs} messages of 0 B to 1 MiB both ways at once, and a copy to itself each round, then one in place each way: {bad} bytes wrong");
        assert_eq!(bad, 0);
    }

    /// Two ranks on one GPU: a context with a second area beside its own (rank 1's, sharing
    /// the context's abort word, so a mismatch either rank finds shows there), a stream each.
    struct TwoRanks {
        gpu: GpuCtx,
        _other: crate::gpu::DevBuf,
        areas: [u64; 2],
        streams: [sys::CUstream; 2],
    }

    impl TwoRanks {
        fn new(ordinal: usize) -> TwoRanks {
            let gpu = GpuCtx::new(ordinal, None).expect("context");
            let other = gpu.alloc(crate::kernels::AREA_BYTES).expect("area");
            gpu.upload(&other, 0, &vec![0u8; crate::kernels::AREA_BYTES])
                .expect("zero area");
            let mut addr = [0u8; 8];
            gpu.download(&gpu.sync, crate::kernels::SYNC_ABORT_OFFSET, &mut addr)
                .expect("abort word");
            gpu.upload(&other, crate::kernels::SYNC_ABORT_OFFSET, &addr)
                .expect("abort word");
            let areas = [gpu.sync.ptr, other.ptr];
            let streams = [gpu.stream, crate::gpu::create_stream(&gpu).expect("stream")];
            TwoRanks {
                gpu,
                _other: other,
                areas,
                streams,
            }
        }

        /// Rank r's launch on its stream (the other rank's may run at the same time).
        fn launch(&self, r: usize, msgs: (&[LlMsg], &[LlMsg], &[SelfCopy]), paired: usize) {
            // SAFETY: every buffer the tests pass, both areas and both streams are this GPU's,
            // live until the tests synchronize.
            unsafe {
                launch(
                    &self.gpu,
                    self.streams[r],
                    (self.areas[r], &self.areas),
                    r,
                    msgs,
                    paired,
                    10_000_000_000,
                )
            }
            .expect("launch");
        }

        /// Until both ranks' launches are done.
        fn sync(&self) {
            // SAFETY: the context is live (bound by the launches).
            let r = unsafe { sys::cuCtxSynchronize() };
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuCtxSynchronize");
        }
    }

    impl Drop for TwoRanks {
        fn drop(&mut self) {
            // SAFETY: made in `new`; the tests synchronize before they end.
            unsafe { crate::gpu::destroy_stream(&self.gpu, self.streams[1]) }
                .expect("destroy stream");
        }
    }

    /// On a GPU: sizes that disagree (rank 0 sends `sent` bytes, rank 1 receives
    /// `expected`), in one step and where a part takes two: every thread of both launches
    /// ends (some of the receiver's lines never come), and the abort word names rank 0 and
    /// its count. A fresh context each.
    #[test]
    fn a_wrong_size_ends_every_wait_and_is_named() {
        let Some(gpus) = crate::driver::gpus_or_skip("p2p_ll wrong sizes on the GPU") else {
            return;
        };
        for (sent, expected) in [(100u64, 200u64), (500_000, 1 << 20), (1 << 20, 300_000)] {
            let t = TwoRanks::new(gpus[0].ordinal);
            let gpu = &t.gpu;
            let src = gpu.alloc(sent as usize).expect("alloc");
            let dst = gpu.alloc(expected as usize).expect("alloc");
            for r in 0..2 {
                let m = |bytes, ptr| LlMsg {
                    peer: 1 - r,
                    ptr,
                    bytes,
                };
                let (s, v) = if r == 0 {
                    (vec![m(sent, src.ptr)], Vec::new())
                } else {
                    (Vec::new(), vec![m(expected, dst.ptr)])
                };
                t.launch(r, (&s, &v, &[]), 0);
            }
            t.sync();
            println!(
                "p2p_ll: {sent} bytes sent, {expected} expected: {:?}",
                gpu.kernels_size_mismatch()
            );
            assert_eq!(gpu.kernels_size_mismatch(), Some((0, sent)));
        }
    }

    #[test]
    fn in_place_receives_pair_with_the_send_of_their_bytes() {
        let m = |peer, ptr, bytes| LlMsg { peer, ptr, bytes };
        // All-to-all in place on 3 ranks (rank 0): block p goes to p and comes from p.
        let s = [m(1, 100, 100), m(2, 200, 100)];
        let r = [m(2, 200, 100), m(1, 100, 100)];
        let (ps, pr, n) = pair_in_place(&s, &r).expect("pairs");
        assert_eq!(n, 2);
        assert_eq!(
            (ps[0].peer, pr[0].peer, ps[1].peer, pr[1].peer),
            (2, 2, 1, 1)
        );
        // Send/recv in place: to 1, from 3, one buffer.
        let (ps, pr, n) = pair_in_place(&[m(1, 0, 64)], &[m(3, 0, 64)]).expect("pair");
        assert_eq!((n, ps[0].peer, pr[0].peer), (1, 1, 3));
        // Unrelated messages follow the pairs.
        let (ps, pr, n) =
            pair_in_place(&[m(1, 1000, 8), m(2, 0, 64)], &[m(3, 5000, 8), m(2, 0, 64)])
                .expect("pairs");
        assert_eq!(
            (n, ps[0].peer, ps[1].peer, pr[0].peer, pr[1].peer),
            (1, 2, 1, 2, 3)
        );
        // A receive over part of a send, or over two sends: no pairing.
        assert!(pair_in_place(&[m(1, 0, 64)], &[m(3, 8, 64)]).is_none());
        assert!(pair_in_place(&[m(1, 0, 64), m(2, 64, 64)], &[m(3, 0, 128)]).is_none());
        assert!(pair_in_place(&[m(1, 0, 64)], &[m(3, 0, 64), m(2, 0, 64)]).is_none());
    }

    #[test]
    fn plans_pair_in_place_and_send_first_across_waves() {
        let m = |peer, ptr, bytes| LlMsg { peer, ptr, bytes };
        let shape = |p: &[Launch]| -> Vec<(Vec<usize>, Vec<usize>, usize)> {
            p.iter()
                .map(|(s, r, n)| {
                    (
                        s.iter().map(|x| x.peer).collect(),
                        r.iter().map(|x| x.peer).collect(),
                        *n,
                    )
                })
                .collect()
        };
        // All-to-all out of place on 4 ranks (rank 0): one launch.
        let out: Vec<(bool, LlMsg)> = (1..4)
            .flat_map(|p| {
                [
                    (true, m(p, 100 * p as u64, 64)),
                    (false, m(p, 1000 + 100 * p as u64, 64)),
                ]
            })
            .collect();
        assert_eq!(shape(&plan(&out)), vec![(vec![1, 2, 3], vec![1, 2, 3], 0)]);
        // In place: each receive over its send's bytes, paired in one launch.
        let inp: Vec<(bool, LlMsg)> = (1..4)
            .flat_map(|p| {
                [
                    (true, m(p, 100 * p as u64, 64)),
                    (false, m(p, 100 * p as u64, 64)),
                ]
            })
            .collect();
        assert_eq!(shape(&plan(&inp)), vec![(vec![1, 2, 3], vec![1, 2, 3], 3)]);
        // Two sends to one peer: two waves.
        let two = [
            (true, m(1, 0, 8)),
            (true, m(1, 64, 8)),
            (false, m(2, 128, 8)),
        ];
        assert_eq!(
            shape(&plan(&two)),
            vec![(vec![1], vec![2], 0), (vec![1], vec![], 0)]
        );
        // A receive of wave 0 over a send of wave 1: every send first.
        let later = [
            (true, m(2, 0, 64)),
            (true, m(2, 64, 64)),
            (false, m(3, 64, 64)),
        ];
        assert_eq!(
            shape(&plan(&later)),
            vec![
                (vec![2], vec![], 0),
                (vec![2], vec![], 0),
                (vec![], vec![3], 0)
            ]
        );
        // A receive over part of a send: sends first, in one wave.
        let part = [(true, m(1, 0, 64)), (false, m(3, 8, 64))];
        assert_eq!(
            shape(&plan(&part)),
            vec![(vec![1], vec![], 0), (vec![], vec![3], 0)]
        );
        // Nothing: one launch (for the own copies).
        assert_eq!(shape(&plan(&[])), vec![(vec![], vec![], 0)]);
    }

    #[test]
    fn bad_launch_lists_are_errors() {
        let m = |peer, bytes| LlMsg {
            peer,
            ptr: 0,
            bytes,
        };
        assert!(check(0, 4, &[m(1, 8), m(1, 8)], "sends").is_err());
        assert!(check(0, 4, &[m(0, 8)], "sends").is_err());
        assert!(check(0, 4, &[m(4, 8)], "sends").is_err());
        assert!(check(0, 4, &[m(1, MAX_BYTES as u64 + 1)], "sends").is_err());
        assert_eq!(
            check(0, 4, &[m(1, 8), m(3, 0)], "sends").map(|l| l.n).ok(),
            Some(2)
        );
    }
}
