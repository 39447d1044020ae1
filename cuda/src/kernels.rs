//! The GPU kernels, as CUDA C++ compiled by NVRTC on first use for the device's architecture.
//!
//! Why NVRTC rather than shipped PTX: the build then needs no CUDA toolkit (CI has none), and
//! the code is compiled for the exact GPU it runs on (sm_90 on H200) instead of a lowest common
//! denominator. The cost is paid on a machine's first run (53 modules on parallel threads,
//! [`modules`]), then compile.rs's cache on disk serves every process.
//!
//! One kernel per (dtype, op): `ar_<dtype>_<op>` reduces elements `[begin, end)` of `n` inputs
//! and writes the result to `n_out` outputs (any of which may be on peer GPUs); with one input
//! it is a copy. Every collective is a choice of inputs, outputs and range per GPU. f16 and bf16 are
//! widened to f32; integers wrap like the host kernels; avg divides once, after wrapping, as the
//! host does, so GPU and host results are bit-identical for the reference's inputs.

use railcc_core::{DataType, ReduceOp};

pub const MAX_PEERS: usize = 8;
/// Most thread blocks a call may use per GPU (the size of the flag area).
pub const MAX_BLOCKS: usize = 1024;
/// Bytes of the per-GPU synchronization area: ready words, per-block done words, and the
/// call counter (see `source`).
pub const SYNC_BYTES: usize = (8 + MAX_PEERS * MAX_BLOCKS + 8) * 8;
/// Byte offset in the area of the word holding the device address of the abort word (in
/// mapped host memory): `SYNC_ABORT` in `source`.
pub const SYNC_ABORT_OFFSET: usize = (8 + MAX_PEERS * MAX_BLOCKS + 2) * 8;
const _: () = assert!(SYNC_ABORT_OFFSET + 8 <= SYNC_BYTES);
/// The abort word's value when a kernel, not the host, stopped the waits: one waited past its
/// deadline (`ABORT_TIMED_OUT` in `source`).
pub const ABORT_TIMED_OUT: u32 = 2;
/// Where the low-latency scratch starts in each GPU's area (see ll.rs).
pub const SCRATCH_OFFSET: usize = 128 * 1024;
const _: () = assert!(SYNC_BYTES <= SCRATCH_OFFSET);
/// Point-to-point counters between processes (railcc_transport_nvlink's proc p2p), u64
/// words from here, four per peer p: READY[p] (word p, written by p: its messages to us whose
/// data is ready), COPIED[p] (8 + p, written by p: our messages to p it has copied), SENT[p]
/// and RECVD[p] (16 + p, 24 + p: our own counts of messages to and from p). The p2p kernels
/// count on the GPU, so a captured CUDA graph replays correctly. Word 32: `p2p_fused`'s count
/// of finished blocks; words 33 and 34: its counts of staging units done and claimed; words
/// 40 + p: its count of staging units to peer p done (the `early` marks). From byte 8192 on:
/// the low-latency send/recv's step counts (p2p_ll.rs `WORDS_OFFSET`).
pub const P2P_OFFSET: usize = 96 * 1024;
const _: () =
    assert!(SYNC_BYTES <= P2P_OFFSET && P2P_OFFSET + (40 + MAX_PEERS) * 8 <= SCRATCH_OFFSET);

/// The p2p kernels: the four one-thread steps, in the order a message uses them, then the
/// batch kernels of a group's messages (p2p_many.rs): every send of the batch ready, every
/// receive copied by thread blocks pulling from all peers at once, every send copied; and all
/// of a batch in one launch.
pub const P2P_KERNELS: [&str; 10] = [
    "p2p_ready",
    "p2p_wait_ready",
    "p2p_copied",
    "p2p_wait_copied",
    "p2p_ready_many",
    "p2p_wait_copied_many",
    "p2p_recv_many",
    "p2p_recv_done",
    "p2p_fused",
    "p2p_ll",
];
/// The whole per-GPU area that peers reach: sync words, the low-latency scratch, the push
/// all-reduce's scratch (push.rs), then the low-latency send/recv inbox (p2p_ll.rs).
pub const AREA_BYTES: usize = crate::p2p_ll::INBOX_OFFSET + crate::p2p_ll::INBOX_BYTES;

/// (CUDA storage type, accumulator type, load, store) for each dtype.
pub(crate) fn ctype(dt: DataType) -> (&'static str, &'static str, &'static str, &'static str) {
    match dt {
        DataType::I8 => ("signed char", "int", "(int)", "(signed char)"),
        DataType::U8 => (
            "unsigned char",
            "unsigned int",
            "(unsigned int)",
            "(unsigned char)",
        ),
        DataType::I32 => ("int", "int", "", ""),
        DataType::U32 => ("unsigned int", "unsigned int", "", ""),
        DataType::I64 => ("long long", "long long", "", ""),
        DataType::U64 => ("unsigned long long", "unsigned long long", "", ""),
        DataType::F16 => ("unsigned short", "float", "h2f", "f2h"),
        DataType::Bf16 => ("unsigned short", "float", "b2f", "f2b"),
        DataType::F32 => ("float", "float", "", ""),
        DataType::F64 => ("double", "double", "", ""),
        DataType::F8E4M3 => ("unsigned char", "float", "e4m3_f", "f_e4m3"),
        DataType::F8E5M2 => ("unsigned char", "float", "e5m2_f", "f_e5m2"),
    }
}

/// The CUDA statement that ends an average (`avg_n` ranks): the sum rounded to `dt`, as the
/// host does, then divided once in the wide type; empty for the other ops. Every reducing
/// kernel (bulk, low-latency, push) ends an element with it.
pub(crate) fn avg_step(dt: DataType, op: ReduceOp) -> String {
    if op != ReduceOp::Avg {
        return String::new();
    }
    let (t, acc, ld, st) = ctype(dt);
    format!("{{ {t} w = {st}(acc); acc = {ld}(w) / ({acc})avg_n; }}")
}

pub(crate) fn op_expr(op: ReduceOp, dt: DataType) -> &'static str {
    let float = dt.is_float();
    match op {
        ReduceOp::Sum | ReduceOp::Avg => "a + b",
        ReduceOp::Prod => "a * b",
        // Same tie-breaking as the host kernels: keep `a` unless `b` is strictly larger/smaller.
        ReduceOp::Max if float => "(b > a ? b : a)",
        ReduceOp::Min if float => "(b < a ? b : a)",
        ReduceOp::Max => "(b > a ? b : a)",
        ReduceOp::Min => "(b < a ? b : a)",
    }
}

/// The statements that reduce element `i` of the `n` inputs `ins` (of type `T`) in rank order
/// and store it into the `n_out` outputs `outs`: the bulk kernels' scalar ends (kernels.rs,
/// tma.rs).
pub(crate) fn element_source(dt: DataType, op: ReduceOp) -> String {
    let (_, acc, ld, st) = ctype(dt);
    let expr = op_expr(op, dt);
    let avg = avg_step(dt, op);
    format!(
        r#"{acc} acc = {ld}(((const T*)ins.p[0])[i]);
for (int r = 1; r < n; r++) {{ {acc} a = acc, b = {ld}(((const T*)ins.p[r])[i]); acc = {expr}; }}
{avg}
T v = {st}(acc);
for (int r = 0; r < n_out; r++) ((T*)outs.p[r])[i] = v;"#
    )
}

/// The device function that reduces one 16-byte vector of each of up to 8 sources (kernels
/// `vec_source`), shared by the bulk kernel's wide loop and the push kernel.
pub(crate) fn vec_name(dt: DataType, op: ReduceOp) -> String {
    format!("vred_{}_{}", dt.name(), op.name())
}

/// CUDA source of [`vec_name`]'s function: sources 0..n of `y` reduced element by element in
/// rank order (widened as `ctype` says), avg divided once, stored back as one vector.
fn vec_source(dt: DataType, op: ReduceOp) -> String {
    let (t, acc, ld, st) = ctype(dt);
    let expr = op_expr(op, dt);
    let avg = avg_step(dt, op);
    let name = vec_name(dt, op);
    format!(
        r#"
__device__ __forceinline__ uint4 {name}(const uint4 (&y)[8], int n, int avg_n) {{
  typedef {t} T;
  const int V = 16 / sizeof(T);
  const T* xv = (const T*)&y[0];
  {acc} accs[V];
#pragma unroll
  for (int k = 0; k < V; k++) accs[k] = {ld}(xv[k]);
#pragma unroll
  for (int r = 1; r < 8; r++) {{
    if (r < n) {{
      const T* yv = (const T*)&y[r];
#pragma unroll
      for (int k = 0; k < V; k++) {{ {acc} a = accs[k], b = {ld}(yv[k]); accs[k] = {expr}; }}
    }}
  }}
  uint4 x;
  T* ov = (T*)&x;
#pragma unroll
  for (int k = 0; k < V; k++) {{ {acc} acc = accs[k]; {avg} ov[k] = {st}(acc); }}
  return x;
}}
"#
    )
}

pub fn kernel_name(dt: DataType, op: ReduceOp) -> String {
    format!("ar_{}_{}", dt.name(), op.name())
}

/// The bulk kernel's late form (late.rs): its inputs, outputs and range from call `token`'s
/// late slot (no data phase where the launcher failed the call or a wait was stopped).
pub fn late_kernel_name(dt: DataType, op: ReduceOp) -> String {
    format!("arl_{}_{}", dt.name(), op.name())
}

/// The kernel families of one dtype, each its own module ([`modules`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// The bulk kernel for every op, and the scale kernel (premultiplied sums).
    Bulk,
    /// The low-latency kernel (ll.rs) for every op.
    Ll,
    /// The push kernel (push.rs) for every op.
    Push,
    /// The bulk kernel with TMA loads (tma.rs) for every op.
    Tma,
}

impl Family {
    pub const ALL: [Family; 4] = [Family::Bulk, Family::Ll, Family::Push, Family::Tma];
    fn name(self) -> &'static str {
        match self {
            Family::Bulk => "bulk",
            Family::Ll => "ll",
            Family::Push => "push",
            Family::Tma => "tma",
        }
    }
}

/// One separately compiled module of the kernels ([`modules`]).
pub struct Module {
    /// The cache's name for it: "kernels-common", "kernels-<dtype>-<family>" or, one op
    /// alone, "kernels-<dtype>-<family>-<op>".
    pub tag: String,
    /// `Some((dt, family))`: that family's kernels of dt for the ops in `ops` (the scale
    /// kernel with the bulk kernel's sum); `None`: the rest (send/recv, batch p2p, the bench's
    /// check and fill kernels).
    pub dtype: Option<(DataType, Family)>,
    pub ops: Vec<ReduceOp>,
    pub src: String,
}

/// The dtypes whose conversions are long code (fp8, written out in `helpers`): their bulk,
/// push and TMA families are one module per op. On a fresh 4 x H100 machine f8e4m3's bulk and
/// push modules took 18-20 s of NVRTC each, f8e5m2's 8-10 s, every other module at most 10.5.
fn one_module_per_op(dt: DataType, fam: Family) -> bool {
    matches!(dt, DataType::F8E4M3 | DataType::F8E5M2) && fam != Family::Ll
}

/// The kernels every GPU loads as 53 modules, each with the shared helpers: one per dtype and
/// kernel family but TMA (per op for fp8's, [`one_module_per_op`]), and one of the rest. Why
/// not one: NVRTC compiles the modules on parallel threads, each cached on its own. One module
/// of everything (790 KB of source) took 94 s to compile and load on a fresh 4 x H100 machine;
/// one per dtype 42 s, 40 of it f8e4m3's; one per dtype and family 22 s, 20 of it f8e4m3's
/// push.
pub fn modules() -> Vec<Module> {
    let helpers = helpers();
    let mut v = vec![Module {
        tag: "kernels-common".into(),
        dtype: None,
        ops: Vec::new(),
        src: format!(
            "{helpers}{}{}{}{}{}",
            p2p_source(),
            crate::p2p_many::SOURCE,
            crate::p2p_ll::source(),
            crate::check::source(),
            crate::copies::SOURCE
        ),
    }];
    v.extend(family_modules(
        &helpers,
        &[Family::Bulk, Family::Ll, Family::Push],
    ));
    v
}

/// The TMA family's 20 modules, loaded only where a communicator asks for it
/// (`GpuCtx::load_tma`): the rest never pay for their compile.
pub fn tma_modules() -> Vec<Module> {
    family_modules(&helpers(), &[Family::Tma])
}

/// The modules of `families` for every dtype.
fn family_modules(helpers: &str, families: &[Family]) -> Vec<Module> {
    let mut v = Vec::new();
    for dt in DataType::ALL {
        for &fam in families {
            let groups: Vec<Vec<ReduceOp>> = if one_module_per_op(dt, fam) {
                ReduceOp::ALL.iter().map(|&op| vec![op]).collect()
            } else {
                vec![ReduceOp::ALL.to_vec()]
            };
            for ops in groups {
                let tag = match ops.as_slice() {
                    [op] => format!("kernels-{}-{}-{}", dt.name(), fam.name(), op.name()),
                    _ => format!("kernels-{}-{}", dt.name(), fam.name()),
                };
                let src = format!("{helpers}{}", dtype_source(dt, fam, &ops));
                v.push(Module {
                    tag,
                    dtype: Some((dt, fam)),
                    ops,
                    src,
                });
            }
        }
    }
    v
}

/// Every module's source, one after another, for tests that look into it: not one unit to
/// compile (each repeats the helpers).
#[cfg(test)]
pub(crate) fn source() -> String {
    modules()
        .into_iter()
        .chain(tma_modules())
        .map(|m| m.src)
        .collect()
}

/// The device functions every module shares.
fn helpers() -> String {
    let mut s = String::from(
        r#"
struct Ptrs { unsigned long long p[8]; };
// Synchronization area in each GPU's memory, written by peers:
//   words [0, 8): ready[h]  = last epoch at which GPU h's inputs were ready
//   words [8, 8 + 8*1024): done[h][b] = last epoch at which block b of GPU h finished
//   word SYNC_EPOCH: calls this GPU has completed. It lives in device memory, not in a kernel
//   argument, so a captured CUDA graph replays correctly: every call reads it at the start and
//   block 0 advances it at the end, once every block of this GPU has reported done.
#define SYNC_DONE 8
#define MAX_BLOCKS 1024
#define SYNC_EPOCH (8 + 8 * MAX_BLOCKS)
__device__ __forceinline__ unsigned long long call_epoch(unsigned long long sync) { return ((volatile unsigned long long*)sync)[SYNC_EPOCH] + 1; }
__device__ __forceinline__ unsigned long long now_ns() { unsigned long long t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }
// Word SYNC_ABORT of this GPU's area holds the address of a word in mapped host memory that
// the host sets when a peer died or the communicator was aborted: waits stop (the result is
// garbage, the host reports the error) and the kernel ends, so the stream and the GPU stay
// usable. A wait past its deadline (only with RAILCC_TIMEOUT_MS; libnccl waits as NCCL does)
// sets that word to ABORT_TIMED_OUT itself: every wait of the context stops the same way, and
// the host reports a timeout. Never __trap(): it would leave the process's CUDA context unusable.
// (Word SYNC_EPOCH + 1 is the low-latency kernel's block counter.)
#define SYNC_ABORT (SYNC_EPOCH + 2)
#define ABORT_TIMED_OUT 2u
__device__ __forceinline__ bool aborted(unsigned long long sync) {
  unsigned long long a = ((volatile unsigned long long*)sync)[SYNC_ABORT];
  return a != 0 && *(volatile unsigned int*)a != 0;
}
// Stops every wait of the context with `code` (the host reads why), unless already stopped.
__device__ __forceinline__ void stop_waits(unsigned long long sync, unsigned int code) {
  unsigned long long a = ((volatile unsigned long long*)sync)[SYNC_ABORT];
  // A plain store (atomics on mapped host memory need PCIe atomics); racing the host's own
  // abort is harmless: either value stops every wait.
  if (a != 0 && *(volatile unsigned int*)a == 0) *(volatile unsigned int*)a = code;
}
__device__ __forceinline__ void timed_out(unsigned long long sync) { stop_waits(sync, ABORT_TIMED_OUT); }
// True when the wait was stopped (a timeout, an abort), false when the word arrived.
__device__ __forceinline__ bool wait_at_least(volatile unsigned long long* p, unsigned long long epoch, unsigned long long t0, unsigned long long timeout_ns, unsigned long long sync) {
  unsigned int spins = 0;
  while (*p < epoch) {
    if (now_ns() - t0 > timeout_ns) { timed_out(sync); return true; } // a peer never arrived
    if ((++spins & 1023u) == 0 && aborted(sync)) return true;
  }
  return false;
}
// Every block waits until every peer's inputs are ready (its kernel has started). True (in
// every thread of the block) when a wait was stopped (an abort, a dead peer, a timeout)
// before its peer arrived: the caller then skips its data phase, so a kernel waiting on a
// stream at an abort writes no peer's memory (a peer may have freed it), and goes straight
// to arrive_done (a kernel whose peers wait on its own flags sets them first: push.rs). Only
// a stopped wait reads the abort word: that read crosses PCIe (mapped host memory), and one
// per block at every kernel's start cost 2-3x at 2-16 MB (measured). The copy-engine paths
// (copies.rs) are enqueued by the host before their barrier kernel runs: they still copy.
__device__ bool arrive_ready(Ptrs syncs, int n, int me, unsigned long long epoch, unsigned long long timeout_ns) {
  if (n == 1) return false;
  unsigned long long t0 = now_ns();
  if (blockIdx.x == 0 && threadIdx.x < n && threadIdx.x != me)
    ((volatile unsigned long long*)syncs.p[threadIdx.x])[me] = epoch;
  bool stopped = false;
  if (threadIdx.x < n && threadIdx.x != me)
    stopped = wait_at_least((volatile unsigned long long*)syncs.p[me] + threadIdx.x, epoch, t0, timeout_ns, syncs.p[me]);
  return __syncthreads_or(stopped);
}
// Each block tells every peer it is done with their memory; block 0 waits for every block of
// every peer, so this kernel ends only when nobody reads our inputs or writes our outputs.
__device__ void arrive_done(Ptrs syncs, int n, int me, unsigned long long epoch, unsigned long long timeout_ns) {
  __threadfence_system(); // every thread's peer writes, before the block reports done
  __syncthreads();
  // Done goes to every GPU including this one: block 0 advances the call counter only once
  // every block here has read it.
  if (threadIdx.x < n) {
    ((volatile unsigned long long*)syncs.p[threadIdx.x])[SYNC_DONE + me * MAX_BLOCKS + blockIdx.x] = epoch;
  }
  if (blockIdx.x == 0) {
    unsigned long long t0 = now_ns();
    for (int h = 0; h < n; h++) {
      for (unsigned int b = threadIdx.x; b < gridDim.x; b += blockDim.x)
        wait_at_least((volatile unsigned long long*)syncs.p[me] + SYNC_DONE + h * MAX_BLOCKS + b, epoch, t0, timeout_ns, syncs.p[me]);
    }
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) ((volatile unsigned long long*)syncs.p[me])[SYNC_EPOCH] = epoch;
  }
}
__device__ __forceinline__ float h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float b2f(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }
__device__ __forceinline__ unsigned short f2b(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}
// fp8, written out rather than taken from cuda_fp8.h so every architecture compiles the same
// source: e4m3 (bias 7, no infinities, S.1111.111 is NaN) and e5m2 (f16's top byte). Stores
// round to nearest even and saturate at the largest finite value, as CUDA's __NV_SATFINITE
// does (and the host's float8 crate).
__device__ __forceinline__ float e4m3_f(unsigned char x) {
  unsigned int s = ((unsigned int)x & 0x80u) << 24, e = (x >> 3) & 15u, m = x & 7u;
  if (e == 15u && m == 7u) return __uint_as_float(s | 0x7fc00000u);
  float v = e == 0u ? (float)m * 0.001953125f : __uint_as_float(((e + 120u) << 23) | (m << 20));
  return __uint_as_float(__float_as_uint(v) | s);
}
__device__ __forceinline__ unsigned char f_e4m3(float f) {
  unsigned int s = (__float_as_uint(f) >> 24) & 0x80u;
  float a = fabsf(f);
  if (a != a) return (unsigned char)(s | 0x7fu);
  // Below 2^-6: a multiple of 2^-9 (subnormal; 8 of them is the smallest normal, bits 0x08).
  if (a < 0.015625f) return (unsigned char)(s | (unsigned int)rintf(a * 512.0f));
  unsigned int v = __float_as_uint(a);
  v += 0x7ffffu + ((v >> 20) & 1u);
  unsigned int e = (v >> 23) - 120u, m = (v >> 20) & 7u;
  if (e > 15u || (e == 15u && m == 7u)) return (unsigned char)(s | 0x7eu);
  return (unsigned char)(s | (e << 3) | m);
}
__device__ __forceinline__ float e5m2_f(unsigned char x) { return h2f((unsigned short)((unsigned int)x << 8)); }
__device__ __forceinline__ unsigned char f_e5m2(float f) {
  unsigned int s = (__float_as_uint(f) >> 24) & 0x80u;
  float a = fabsf(f);
  if (a != a) return (unsigned char)(s | 0x7fu);
  // Below 2^-14: a multiple of 2^-16.
  if (a < 6.103515625e-05f) return (unsigned char)(s | (unsigned int)rintf(a * 65536.0f));
  unsigned int v = __float_as_uint(a);
  v += 0xfffffu + ((v >> 21) & 1u);
  unsigned int e = (v >> 23) - 112u, m = (v >> 21) & 3u;
  if (e > 30u) return (unsigned char)(s | 0x7bu);
  return (unsigned char)(s | (e << 2) | m);
}
"#,
    );
    s.push_str(crate::push::COMMON_SOURCE);
    s.push_str(crate::late::SOURCE);
    s
}

/// The send/recv kernels between processes.
fn p2p_source() -> String {
    format!(
        r#"
// Send/recv between processes (P2P_OFFSET in kernels.rs). The sender's stream runs
// p2p_ready (its data is written: tell the receiver) and p2p_wait_copied (until the receiver
// has copied every message but the last `lag`: after p2p_ready with lag 0, the buffer may
// change; before a staging slot is refilled, with lag = slots - 1); the receiver's runs
// p2p_wait_ready, its copy, then p2p_copied. Each side numbers the messages on the GPU, so
// graphs replay correctly.
#define P2P_W ({p2p}ull / 8)
__device__ __forceinline__ volatile unsigned long long* p2p_words(unsigned long long area) {{ return (volatile unsigned long long*)area + P2P_W; }}
__device__ void p2p_wait(unsigned long long area, int word, unsigned long long e, unsigned long long timeout_ns) {{
  volatile unsigned long long* w = p2p_words(area);
  unsigned long long t0 = now_ns();
  unsigned int spins = 0;
  while ((long long)(w[word] - e) < 0) {{
    if (now_ns() - t0 > timeout_ns) {{ timed_out(area); return; }} // the peer never came
    if ((++spins & 255u) == 0 && aborted(area)) return;
  }}
}}
extern "C" __global__ void p2p_ready(unsigned long long mine, unsigned long long theirs, int me, int peer, unsigned long long timeout_ns, unsigned long long lag) {{
  volatile unsigned long long* w = p2p_words(mine);
  unsigned long long e = w[16 + peer] + 1;
  w[16 + peer] = e;
  __threadfence_system();
  p2p_words(theirs)[me] = e;
}}
extern "C" __global__ void p2p_wait_ready(unsigned long long mine, unsigned long long theirs, int me, int peer, unsigned long long timeout_ns, unsigned long long lag) {{
  volatile unsigned long long* w = p2p_words(mine);
  unsigned long long e = w[24 + peer] + 1;
  w[24 + peer] = e;
  p2p_wait(mine, peer, e, timeout_ns);
  __threadfence_system();
}}
extern "C" __global__ void p2p_copied(unsigned long long mine, unsigned long long theirs, int me, int peer, unsigned long long timeout_ns, unsigned long long lag) {{
  __threadfence_system();
  p2p_words(theirs)[8 + me] = p2p_words(mine)[24 + peer];
}}
extern "C" __global__ void p2p_wait_copied(unsigned long long mine, unsigned long long theirs, int me, int peer, unsigned long long timeout_ns, unsigned long long lag) {{
  p2p_wait(mine, 8 + peer, p2p_words(mine)[16 + peer] - lag, timeout_ns);
}}
"#,
        p2p = P2P_OFFSET
    )
}

/// dt's bulk, low-latency and push kernels for every op, and its scale kernel.
fn dtype_source(dt: DataType, fam: Family, ops: &[ReduceOp]) -> String {
    match fam {
        Family::Bulk => {}
        Family::Ll => {
            return ops
                .iter()
                .map(|&op| crate::ll::kernel_source(dt, op))
                .collect()
        }
        Family::Push => {
            return ops
                .iter()
                .map(|&op| crate::push::kernel_source(dt, op))
                .collect()
        }
        Family::Tma => {
            let mut s = String::from(crate::tma::COMMON_SOURCE);
            for &op in ops {
                s.push_str(&vec_source(dt, op));
                s.push_str(&crate::tma::kernel_source(dt, op));
            }
            return s;
        }
    }
    let mut s = String::new();
    let (t, acc, ld, st) = ctype(dt);
    for &op in ops {
        let name = kernel_name(dt, op);
        let expr = op_expr(op, dt);
        let avg = avg_step(dt, op);
        let vec = vec_name(dt, op);
        let elem = element_source(dt, op);
        s.push_str(&vec_source(dt, op));
        // The kernel with its arguments as parameters, and its late form (late.rs), which
        // reads them from a device slot: the same body.
        let late = late_kernel_name(dt, op);
        for (head, prologue, skip) in [
            (
                format!("{name}(Ptrs ins, int n, Ptrs outs, int n_out, unsigned long long begin, unsigned long long end, "),
                "",
                "",
            ),
            (
                format!("{late}({}", crate::late::PARAMS),
                crate::late::BULK_PROLOGUE,
                " || bad",
            ),
        ] {
            // 16-byte vector loop over the aligned middle, scalar loop for the ends.
            s.push_str(&format!(
            r#"
extern "C" __global__ void __launch_bounds__(512) {head}int avg_n, Ptrs syncs, int n_gpus, int me, unsigned long long timeout_ns, int wide) {{
  typedef {t} T;
{prologue}
  const unsigned long long epoch = call_epoch(syncs.p[me]);
  if (arrive_ready(syncs, n_gpus, me, epoch, timeout_ns){skip}) {{ arrive_done(syncs, n_gpus, me, epoch, timeout_ns); return; }}
  const int V = 16 / sizeof(T);
  unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  bool aligned = true;
  for (int r = 0; r < n; r++) aligned = aligned && (ins.p[r] % 16 == 0);
  for (int r = 0; r < n_out; r++) aligned = aligned && (outs.p[r] % 16 == 0);
  unsigned long long vb = aligned ? (begin + V - 1) / V * V : end;
  if (vb > end) vb = end;
  unsigned long long ve = aligned ? end / V * V : end;
  if (ve < vb) ve = vb;
  for (unsigned long long i = begin + tid; i < vb; i += stride) {{
{elem}
  }}
  // Wide: every input's 16 bytes of two vectors loaded at once before any arithmetic (up to
  // 16 loads in flight a thread, where the narrow loop below has one), so few blocks keep
  // NVLink's read latency covered. The same sums in the same order.
  if (wide) {{
const unsigned long long vn = ve / V;
for (unsigned long long j = vb / V + tid; j < vn; j += 2 * stride) {{
  const bool two = j + stride < vn;
  uint4 y[2][8];
#pragma unroll
  for (int r = 0; r < 8; r++) {{
    if (r < n) {{
      y[0][r] = ((const uint4*)ins.p[r])[j];
      if (two) y[1][r] = ((const uint4*)ins.p[r])[j + stride];
    }}
  }}
#pragma unroll
  for (int u = 0; u < 2; u++) {{
    if (u == 1 && !two) break;
    const uint4 x = {vec}(y[u], n, avg_n);
    for (int r = 0; r < n_out; r++) ((uint4*)outs.p[r])[j + u * stride] = x;
  }}
}}
  }} else
  for (unsigned long long j = vb / V + tid; j < ve / V; j += stride) {{
uint4 x = ((const uint4*)ins.p[0])[j];
T* xv = (T*)&x;
{acc} accs[V];
for (int k = 0; k < V; k++) accs[k] = {ld}(xv[k]);
for (int r = 1; r < n; r++) {{
  uint4 y = ((const uint4*)ins.p[r])[j];
  T* yv = (T*)&y;
  for (int k = 0; k < V; k++) {{ {acc} a = accs[k], b = {ld}(yv[k]); accs[k] = {expr}; }}
}}
for (int k = 0; k < V; k++) {{ {acc} acc = accs[k]; {avg} xv[k] = {st}(acc); }}
for (int r = 0; r < n_out; r++) ((uint4*)outs.p[r])[j] = x;
  }}
  for (unsigned long long i = ve + tid; i < end; i += stride) {{
{elem}
  }}
  arrive_done(syncs, n_gpus, me, epoch, timeout_ns);
}}
"#
            ));
        }
    }
    if ops.contains(&ReduceOp::Sum) {
        s.push_str(&scale_source(dt));
    }
    s
}

pub fn scale_name(dt: DataType) -> String {
    format!("scale_{}", dt.name())
}

/// `dst[i] = src[i] * scalar` for `n` elements: the first step of a premultiplied sum
/// (ncclRedOpCreatePreMulSum). The scalar is read from device memory at `sp` when the kernel
/// runs (NCCL's ncclScalarDevice), or taken from `bits` (ncclScalarHostImmediate). Integers
/// wrap; narrow floats multiply in f32 and round once.
fn scale_source(dt: DataType) -> String {
    let (t, acc, ld, st) = ctype(dt);
    let name = scale_name(dt);
    format!(
        r#"
extern "C" __global__ void __launch_bounds__(512) {name}(const {t}* src, {t}* dst, unsigned long long n, const {t}* sp, unsigned long long bits) {{
  typedef {t} T;
  T sv;
  if (sp) sv = *sp; else sv = *(const T*)&bits;
  const {acc} s = {ld}(sv);
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = {st}(({acc})({ld}(src[i]) * s));
}}
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_abort_word_is_where_the_kernels_look() {
        let s = source();
        // SYNC_EPOCH is word 8 + MAX_PEERS * MAX_BLOCKS, SYNC_ABORT two words later.
        assert!(s.contains("#define SYNC_EPOCH (8 + 8 * MAX_BLOCKS)") && MAX_PEERS == 8);
        assert!(s.contains("#define SYNC_ABORT (SYNC_EPOCH + 2)"));
        assert!(s.contains(&format!("#define ABORT_TIMED_OUT {ABORT_TIMED_OUT}u")));
        assert!(!s.contains("__trap();"), "a kernel never traps");
        assert_eq!(SYNC_ABORT_OFFSET, (8 + 8 * MAX_BLOCKS + 2) * 8);
    }

    #[test]
    fn one_kernel_per_dtype_and_op() {
        let s = source();
        for dt in DataType::ALL {
            for op in ReduceOp::ALL {
                assert!(s.contains(&format!(
                    "void __launch_bounds__(512) {}(",
                    kernel_name(dt, op)
                )));
            }
            assert!(s.contains(&format!("void __launch_bounds__(512) {}(", scale_name(dt))));
        }
    }
}
