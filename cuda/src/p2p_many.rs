//! A group's sends and receives in four launches per GPU stream instead of five per message:
//! every send of the batch marked ready (`p2p_ready_many`), every receive copied by thread
//! blocks that pull from all peers at once (`p2p_recv_many`), then counted and its sender told
//! (`p2p_recv_done`), every send waited for (`p2p_wait_copied_many`).
//!
//! Why: one copy-engine copy per message, each behind its own wait, runs a GPU's receives one
//! peer at a time (all-to-all on 4 GPUs read 0.43x NCCL's busbw). The kernels keep the same
//! counters as the one-message steps (kernels.rs `P2P_OFFSET`: READY, COPIED, SENT, RECVD per
//! peer), so batches and single steps mix, and graphs replay (the counts live on the GPU).

use crate::gpu::GpuCtx;
use crate::kernels::MAX_PEERS;
use crate::launch::{enqueue, ptrs, Ptrs};
use cudarc::driver::sys;
use railcc_core::{Error, Result};
use std::ffi::c_void;

/// Messages one `p2p_recv_many` launch takes (more go in further launches).
pub const MAX_MSGS: usize = 16;
/// Bytes of a message one thread block copies at a time (a message's chunks spread over the
/// blocks, every message's at once): a power of two in this range, about a quarter of a
/// launch's bytes per block ([`chunk_for`]). On 4 x H100, 256 KiB chunks took all-to-all at
/// 256 MB from 0.89x to 1.01x NCCL; 16-32 KiB ones (1 MB, 16 MB) were no faster than 64 KiB
/// and 1 MB sendrecv slower (each chunk costs a wait for its message and a fence).
pub const MIN_CHUNK_BYTES: u64 = 64 * 1024;
pub const MAX_CHUNK_BYTES: u64 = 256 * 1024;
/// Threads per block of `p2p_recv_many`.
pub const THREADS: u32 = 512;

/// Indices in `kernels::P2P_KERNELS`.
const READY_MANY: usize = 4;
const WAIT_COPIED_MANY: usize = 5;
const RECV_MANY: usize = 6;
const RECV_DONE: usize = 7;
const FUSED: usize = 8;

/// The CUDA C source, appended to the program after the one-message p2p kernels (it uses
/// their `p2p_words`, `p2p_wait`, and the sync helpers).
pub const SOURCE: &str = r#"
#define P2P_MAX_MSGS 16
struct P2pMsgs { unsigned long long src[P2P_MAX_MSGS]; unsigned long long dst[P2P_MAX_MSGS]; unsigned long long bytes[P2P_MAX_MSGS]; int peer[P2P_MAX_MSGS]; };
struct P2pCounts { unsigned int n[8]; };
// Sends p2p_fused copies into staging slots before marking: src[k] (the caller's) into dst[k]
// (a slot), once peer[k] has copied every message to it but the last `lag` before this one,
// the before[k]-th of the batch to that peer.
struct P2pStage { unsigned long long src[P2P_MAX_MSGS]; unsigned long long dst[P2P_MAX_MSGS]; unsigned long long bytes[P2P_MAX_MSGS]; int peer[P2P_MAX_MSGS]; int before[P2P_MAX_MSGS]; };
// Thread p < 8 adds c.n[p] to our own count at word `own + p` and writes the sum into peer p's
// word `their + me`: SENT into the peer's READY (16, 0), RECVD into its COPIED (24, 8).
__device__ __forceinline__ void p2p_count_and_tell(unsigned long long mine, const Ptrs& theirs, int me, const P2pCounts& c, int own, int their) {
  int p = threadIdx.x;
  if (p < 8 && c.n[p] != 0) {
    volatile unsigned long long* w = p2p_words(mine);
    unsigned long long e = w[own + p] + c.n[p];
    w[own + p] = e;
    __threadfence_system();
    p2p_words(theirs.p[p])[their + me] = e;
  }
}
// Sender: this batch's n[p] messages to each peer p are ready (their data is written: the
// stream has passed it).
extern "C" __global__ void p2p_ready_many(unsigned long long mine, Ptrs theirs, int me, P2pCounts c) {
  p2p_count_and_tell(mine, theirs, me, c, 16, 0);
}
// Sender: until every peer p with n[p] != 0 has copied all our messages to it but `lag`.
extern "C" __global__ void p2p_wait_copied_many(unsigned long long mine, P2pCounts c, unsigned long long timeout_ns, unsigned long long lag) {
  int p = threadIdx.x;
  if (p < 8 && c.n[p] != 0) p2p_wait(mine, 8 + p, p2p_words(mine)[16 + p] - lag, timeout_ns);
}
// Receiver: message k comes from peer[k]'s memory src[k] (mapped here) into dst[k]. The
// messages are cut in chunks of `chunk` bytes spread over the blocks; a block waits for its
// chunk's message to be ready (the k-th message from a peer in the batch is that peer's
// RECVD + k), copies it with 16-byte loads, four in flight a thread. After p2p_recv_many,
// p2p_recv_done, next on the stream, counts them received and tells each sender (COPIED): no
// count shared between blocks, so no two launches can mix theirs (p2p_fused counts its
// blocks instead, under its own conditions).
// The block copies `len` bytes from s to d: 16-byte loads, four in flight a thread, where s
// and d sit alike on 16 bytes (a byte loop otherwise, and for the ends).
__device__ __forceinline__ void p2p_copy_block(const unsigned char* s, unsigned char* d, unsigned long long len) {
  unsigned long long head = len;
  if ((((unsigned long long)s ^ (unsigned long long)d) & 15ull) == 0) {
    head = (16ull - ((unsigned long long)s & 15ull)) & 15ull;
    if (head > len) head = len;
  }
  for (unsigned long long i = threadIdx.x; i < head; i += blockDim.x) d[i] = s[i];
  if (head < len) {
    const uint4* sv = (const uint4*)(s + head);
    uint4* dv = (uint4*)(d + head);
    const unsigned long long nv = (len - head) / 16;
    for (unsigned long long i = threadIdx.x; i < nv; i += 4ull * blockDim.x) {
      uint4 x[4];
#pragma unroll
      for (int j = 0; j < 4; j++) if (i + j * blockDim.x < nv) x[j] = sv[i + j * blockDim.x];
#pragma unroll
      for (int j = 0; j < 4; j++) if (i + j * blockDim.x < nv) dv[i + j * blockDim.x] = x[j];
    }
    for (unsigned long long i = head + nv * 16 + threadIdx.x; i < len; i += blockDim.x) d[i] = s[i];
  }
}
// The staged sends of p2p_fused, in units of `chunk` bytes that blocks claim one at a time
// (word 34), so the staging ends whichever blocks run (a block that has no SM yet, because
// other kernels hold them, claims nothing). Each unit waits until its slot's earlier message
// has been copied by the receiver, is copied into the slot, and is counted done (word 33);
// the block that finishes the last unit (block 0 if there is none) marks the batch's sends
// ready (`ready`). Every block then waits until all units are done before it pulls: a
// receive may overwrite a staged send's source (in place). With `early` (the host found no
// receive overlapping a staged source) each peer is marked as soon as its own units are done
// (counted per peer, words 40 + p; peers with no unit by block 0 at once) and a block goes on
// to pull once no unit is left to claim: one peer's data moves while another's is staged.
// Returns 0 when a wait ended on the deadline or an abort.
__device__ __forceinline__ void p2p_mark_one(unsigned long long mine, const Ptrs& theirs, int me, int p, unsigned int n) {
  volatile unsigned long long* w = p2p_words(mine);
  unsigned long long e = w[16 + p] + n;
  w[16 + p] = e;
  __threadfence_system();
  p2p_words(theirs.p[p])[me] = e;
}
__device__ __forceinline__ int p2p_stage_all(const P2pStage& st, int n_stage, unsigned long long mine, const Ptrs& theirs, int me, const P2pCounts& ready, unsigned long long timeout_ns, unsigned long long chunk, unsigned long long lag, int early) {
  volatile unsigned long long* w = p2p_words(mine);
  __shared__ unsigned long long start[P2P_MAX_MSGS + 1];
  __shared__ unsigned long long punits[8];
  __shared__ unsigned long long unit;
  __shared__ int stop, marker;
  if (threadIdx.x == 0) {
    for (int p = 0; p < 8; p++) punits[p] = 0;
    unsigned long long u = 0;
    for (int k = 0; k < n_stage; k++) {
      const unsigned long long nu = (st.bytes[k] + chunk - 1) / chunk;
      start[k] = u;
      u += nu;
      punits[st.peer[k]] += nu;
    }
    start[n_stage] = u;
    stop = 0;
    marker = 0;
  }
  __syncthreads();
  // Early: a peer with marks but no unit to wait for is marked at once.
  if (early && blockIdx.x == 0 && threadIdx.x < 8 && ready.n[threadIdx.x] != 0 && punits[threadIdx.x] == 0)
    p2p_mark_one(mine, theirs, me, threadIdx.x, ready.n[threadIdx.x]);
  const unsigned long long units = start[n_stage];
  for (;;) {
    if (threadIdx.x == 0) unit = atomicAdd((unsigned long long*)(w + 34), 1ull);
    __syncthreads();
    const unsigned long long u = unit;
    if (u >= units) break;
    int k = 0;
    while (start[k + 1] <= u) k++;
    if (threadIdx.x == 0) {
      // SENT (word 16 + p) is still this batch's start: the marks come after every unit.
      const int p = st.peer[k];
      const unsigned long long need = w[16 + p] + (unsigned long long)st.before[k] - lag;
      const unsigned long long t0 = now_ns();
      unsigned int spins = 0;
      // A copy to this rank itself (p == me, selfcopy.rs) waits for nobody.
      while (p != me && (long long)(w[8 + p] - need) < 0) {
        if (now_ns() - t0 > timeout_ns) { timed_out(mine); stop = 1; break; } // the receiver never came
        if ((++spins & 255u) == 0 && aborted(mine)) { stop = 1; break; }
      }
      __threadfence(); // the receiver's copy of the slot's last message before we overwrite it
    }
    __syncthreads();
    if (stop) return 0;
    const unsigned long long off = (u - start[k]) * chunk;
    unsigned long long len = st.bytes[k] - off;
    if (len > chunk) len = chunk;
    p2p_copy_block((const unsigned char*)st.src[k] + off, (unsigned char*)st.dst[k] + off, len);
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence(); // this unit's bytes before its count
      marker = atomicAdd((unsigned long long*)(w + 33), 1ull) == units - 1ull;
      // Early: the last unit of its peer marks that peer (every unit of it past its wait).
      const int p = st.peer[k];
      if (early && atomicAdd((unsigned long long*)(w + 40 + p), 1ull) == punits[p] - 1ull && ready.n[p] != 0) {
        __threadfence();
        p2p_mark_one(mine, theirs, me, p, ready.n[p]);
      }
    }
    __syncthreads();
  }
  if (early) return 1;
  if (threadIdx.x == 0) {
    const unsigned long long t0 = now_ns();
    unsigned int spins = 0;
    while (w[33] < units) {
      if (now_ns() - t0 > timeout_ns) { timed_out(mine); stop = 1; break; }
      if ((++spins & 255u) == 0 && aborted(mine)) { stop = 1; break; }
    }
    __threadfence(); // every unit's bytes (and its reads of the sources) before what follows
  }
  __syncthreads();
  // The marks, after that fence. No unit at all (every staged send empty): block 0 marks.
  if (!stop && (marker || (units == 0 && blockIdx.x == 0))) p2p_count_and_tell(mine, theirs, me, ready, 16, 0);
  return stop ? 0 : 1;
}
__device__ __forceinline__ void p2p_pull_chunks(const P2pMsgs& m, int n_msgs, unsigned long long mine, unsigned long long timeout_ns, unsigned long long chunk) {
  volatile unsigned long long* w = p2p_words(mine);
  __shared__ unsigned long long want[P2P_MAX_MSGS];
  __shared__ unsigned long long start[P2P_MAX_MSGS + 1];
  __shared__ int stop;
  if (threadIdx.x == 0) {
    unsigned int seen[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    unsigned long long u = 0;
    for (int k = 0; k < n_msgs; k++) {
      int p = m.peer[k];
      seen[p]++;
      want[k] = w[24 + p] + seen[p];
      start[k] = u;
      u += (m.bytes[k] + chunk - 1) / chunk;
    }
    start[n_msgs] = u;
    stop = 0;
  }
  __syncthreads();
  const unsigned long long units = start[n_msgs];
  for (unsigned long long u = blockIdx.x; u < units; u += gridDim.x) {
    int k = 0;
    while (start[k + 1] <= u) k++;
    if (threadIdx.x == 0) {
      unsigned long long t0 = now_ns();
      unsigned int spins = 0;
      while ((long long)(w[m.peer[k]] - want[k]) < 0) {
        if (now_ns() - t0 > timeout_ns) { timed_out(mine); stop = 1; break; } // the sender never came
        if ((++spins & 255u) == 0 && aborted(mine)) { stop = 1; break; }
      }
      __threadfence_system();
    }
    __syncthreads();
    if (stop) break;
    const unsigned long long off = (u - start[k]) * chunk;
    unsigned long long len = m.bytes[k] - off;
    if (len > chunk) len = chunk;
    p2p_copy_block((const unsigned char*)m.src[k] + off, (unsigned char*)m.dst[k] + off, len);
    __syncthreads(); // before thread 0 waits for the next chunk's message
  }
}
extern "C" __global__ void __launch_bounds__(512) p2p_recv_many(P2pMsgs m, int n_msgs, unsigned long long mine, Ptrs theirs, int me, unsigned long long timeout_ns, unsigned long long chunk) {
  p2p_pull_chunks(m, n_msgs, mine, timeout_ns, chunk);
}
// A whole batch in one launch (at most P2P_MAX_MSGS receives, one stream): the batch's
// sends marked ready (as p2p_ready_many), every block pulls chunks (as p2p_recv_many), the
// last block to finish counts the receives and tells their senders (as p2p_recv_done), then
// waits until every peer p with copied.n[p] != 0 has copied all our messages (as
// p2p_wait_copied_many with lag 0). Without staged sends block 0 marks before it waits on
// anything, so a receive from this rank itself meets its mark once block 0 runs (blocks are
// at most the SMs). With staged sends (one process per GPU; no self-receives there) the
// staging goes first (p2p_stage_all) and the block that ends it marks. The counts of P2P
// words 32-34 are this area's alone: a communicator's kernels on a GPU run one at a time
// (KernelOrder) and never under capture, and the last block puts them back to 0 (every
// block is done with them by then), as the per-peer unit counts (words 40-47) of `early`.
extern "C" __global__ void __launch_bounds__(512) p2p_fused(P2pMsgs m, int n_msgs, unsigned long long mine, Ptrs theirs, int me, unsigned long long timeout_ns, unsigned long long chunk, P2pCounts ready, P2pCounts recvd, P2pCounts copied, P2pStage st, int n_stage, unsigned long long lag, int early) {
  volatile unsigned long long* w = p2p_words(mine);
  int ok = 1;
  if (n_stage > 0) {
    // A deadline or abort breaks the communicator; a block that stopped pulls nothing (the
    // staging may not be over, and a pull could overwrite a source in place).
    ok = p2p_stage_all(st, n_stage, mine, theirs, me, ready, timeout_ns, chunk, lag, early);
  } else if (blockIdx.x == 0) {
    p2p_count_and_tell(mine, theirs, me, ready, 16, 0);
  }
  p2p_pull_chunks(m, ok ? n_msgs : 0, mine, timeout_ns, chunk);
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence(); // this block's reads and marks before its count
    unsigned long long done = atomicAdd((unsigned long long*)(w + 32), 1ull);
    last = done == (unsigned long long)gridDim.x - 1ull;
    if (last) { for (int i = 32; i < 48; i++) w[i] = 0; }
  }
  __syncthreads();
  if (!last) return;
  p2p_count_and_tell(mine, theirs, me, recvd, 24, 8);
  int p = threadIdx.x;
  if (p < 8 && copied.n[p] != 0) p2p_wait(mine, 8 + p, w[16 + p], timeout_ns);
}
// Receiver, after p2p_recv_many on the same stream: its n[p] messages from each peer p are
// copied (the kernel before has ended, so every read of the peers' buffers is done).
extern "C" __global__ void p2p_recv_done(unsigned long long mine, Ptrs theirs, int me, P2pCounts c) {
  p2p_count_and_tell(mine, theirs, me, c, 24, 8);
}
"#;

/// One receive of a batch: `bytes` from peer `peer`'s memory at `src` (as this GPU addresses
/// it) into this GPU's `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvMsg {
    pub src: u64,
    pub dst: u64,
    pub bytes: u64,
    pub peer: usize,
}

/// One send `p2p_fused` copies into a staging slot before marking the batch's sends: `bytes`
/// from this GPU's `src` into the slot at `dst`, once `peer` has copied every message to it
/// but the last `lag` before this one, the `before`-th of the batch to that peer (counting
/// every send to it, staged or not). With `peer` this rank itself, a copy of a message to
/// itself, which waits for nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageMsg {
    pub src: u64,
    pub dst: u64,
    pub bytes: u64,
    pub peer: usize,
    pub before: u32,
}

/// A whole batch on `stream` in one launch (`p2p_fused`): the sends of `stage` copied into
/// their slots (each once its slot is free: `lag`, see [`StageMsg`]), then the sends counted
/// in `ready` marked ready (with `early`, which the caller may set only where no receive of
/// `msgs` overlaps a source of `stage`: each peer once its own staged sends are in, and pulls
/// start without waiting for the rest), every message of `msgs` copied into this GPU (each once its sender
/// marked it), its senders told, then a wait until every peer p with `copied[p] != 0` has
/// copied all of this rank's messages. At most `MAX_MSGS` messages and as many staged sends;
/// up to `max_blocks` blocks, at most the SMs.
/// Returns the blocks used. The caller runs it in the communicator's kernel order and not
/// under capture: the kernel counts its finished blocks in the area, which two launches at
/// once would share.
///
/// # Safety
/// As for [`recv_many`] and [`ready_many`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn fused(
    gpu: &GpuCtx,
    stream: sys::CUstream,
    (mine, theirs): (u64, &[u64]),
    me: usize,
    msgs: &[RecvMsg],
    (ready, copied): (&[u32], &[u32]),
    (stage, lag, early): (&[StageMsg], u64, bool),
    (max_blocks, min_chunk): (u32, u64),
    timeout_ns: u64,
) -> Result<u32> {
    if msgs.len() > MAX_MSGS
        || stage.len() > MAX_MSGS
        || msgs.iter().any(|m| m.peer >= MAX_PEERS)
        || stage.iter().any(|m| m.peer >= MAX_PEERS)
    {
        return Err(Error::invalid(format!(
            "p2p batch in one launch: {} receives and {} staged sends (at most {MAX_MSGS} each, peers below {MAX_PEERS})",
            msgs.len(),
            stage.len()
        )));
    }
    let order = rotated(msgs, theirs.len(), me);
    // At most the SMs: block 0, whose marks a receive from this rank itself waits for, runs
    // beside the others.
    let bound = max_blocks.min(gpu.sms.max(1) as u32);
    let counts3 = [counts(ready)?, counts(&per_peer(&order))?, counts(copied)?];
    // SAFETY: the caller's contract.
    unsafe {
        launch_receives(
            gpu,
            stream,
            (mine, theirs),
            me,
            &order,
            (bound, min_chunk, timeout_ns),
            Some((counts3, stage_list(stage), lag, i32::from(early))),
        )
    }
}

/// Whether [`fused`] may mark early (its `early`): no receive of `msgs` writes a byte that a
/// send of `stage` reads (in place, a receive must wait until every send is staged).
pub fn early_marks_safe(msgs: &[RecvMsg], stage: &[StageMsg]) -> bool {
    !msgs.iter().any(|m| {
        stage
            .iter()
            .any(|s| railcc_core::call::overlaps(m.dst, m.bytes, s.src, s.bytes))
    })
}

/// Launches one batch of receives (`batch`: at most MAX_MSGS, in the blocks' order) with up to
/// `bound` blocks: `p2p_recv_many`, or with `fused` counts (ready, received, copied), staged
/// sends and their lag `p2p_fused` (blocks enough for the staged bytes too). Returns the
/// blocks.
///
/// # Safety
/// As for [`recv_many`].
unsafe fn launch_receives(
    gpu: &GpuCtx,
    stream: sys::CUstream,
    (mine, theirs): (u64, &[u64]),
    me: usize,
    batch: &[RecvMsg],
    (bound, min_chunk, timeout_ns): (u32, u64, u64),
    fused: Option<([Counts; 3], Stage, u64, i32)>,
) -> Result<u32> {
    let (f, what) = match fused {
        Some(_) => (gpu.p2p_func(FUSED)?, "cuLaunchKernel(p2p_fused)"),
        None => (gpu.p2p_func(RECV_MANY)?, "cuLaunchKernel(p2p_recv_many)"),
    };
    let mut list = msg_list(batch);
    let (mut c3, mut st, mut lag, mut early) = fused.unwrap_or_default();
    // The staged sends' bytes share the blocks with the receives'.
    let staged = &st.list.bytes[..st.n.clamp(0, MAX_MSGS as i32) as usize];
    let mut chunk =
        chunk_for(batch, bound, min_chunk).max(chunk_of(staged.iter().copied(), bound, min_chunk));
    let blocks =
        blocks_for(batch, bound, chunk).max(blocks_of(staged.iter().copied(), bound, chunk));
    let (mut n, mut a, mut t, mut me_i, mut to) = (
        batch.len() as i32,
        mine,
        ptrs(theirs),
        me as i32,
        timeout_ns,
    );
    let [c0, c1, c2] = &mut c3;
    let mut n_stage = st.n;
    let mut params: [*mut c_void; 14] = [
        &mut list as *mut Msgs as *mut c_void,
        &mut n as *mut i32 as *mut c_void,
        &mut a as *mut u64 as *mut c_void,
        &mut t as *mut Ptrs as *mut c_void,
        &mut me_i as *mut i32 as *mut c_void,
        &mut to as *mut u64 as *mut c_void,
        &mut chunk as *mut u64 as *mut c_void,
        c0 as *mut Counts as *mut c_void,
        c1 as *mut Counts as *mut c_void,
        c2 as *mut Counts as *mut c_void,
        &mut st.list as *mut StageList as *mut c_void,
        &mut n_stage as *mut i32 as *mut c_void,
        &mut lag as *mut u64 as *mut c_void,
        &mut early as *mut i32 as *mut c_void,
    ];
    let used = if fused.is_some() { 14 } else { 7 };
    gpu.bind()?;
    // SAFETY: the first `used` parameters match the kernel's signature (p2p_recv_many takes
    // the first seven, p2p_fused all fourteen); the caller vouches for the buffers, areas and stream.
    unsafe { enqueue(f, blocks, THREADS, stream, &mut params[..used], what) }?;
    Ok(blocks)
}

/// How many of `msgs` come from each peer.
fn per_peer(msgs: &[RecvMsg]) -> [u32; MAX_PEERS] {
    let mut c = [0u32; MAX_PEERS];
    for m in msgs {
        c[m.peer] += 1;
    }
    c
}

/// `msgs` in the order the blocks take them: from the peer after `me` on (in group order every
/// GPU would read the same peer at once and share its links). Stable: a peer's messages keep
/// their order, which the counts pair.
fn rotated(msgs: &[RecvMsg], ranks: usize, me: usize) -> Vec<RecvMsg> {
    let ranks = ranks.max(1);
    let mut order: Vec<RecvMsg> = msgs.to_vec();
    order.sort_by_key(|m| (m.peer + ranks - 1 - me % ranks) % ranks);
    order
}

/// The kernels' message list of `batch` (at most MAX_MSGS).
fn msg_list(batch: &[RecvMsg]) -> Msgs {
    let mut list = Msgs {
        src: [0; MAX_MSGS],
        dst: [0; MAX_MSGS],
        bytes: [0; MAX_MSGS],
        peer: [0; MAX_MSGS],
    };
    for (i, m) in batch.iter().take(MAX_MSGS).enumerate() {
        list.src[i] = m.src;
        list.dst[i] = m.dst;
        list.bytes[i] = m.bytes;
        list.peer[i] = m.peer as i32;
    }
    list
}

/// The kernels' list of staged sends (`P2pStage`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct StageList {
    src: [u64; MAX_MSGS],
    dst: [u64; MAX_MSGS],
    bytes: [u64; MAX_MSGS],
    peer: [i32; MAX_MSGS],
    before: [i32; MAX_MSGS],
}

/// Staged sends as p2p_fused takes them: the list and its length.
#[derive(Clone, Copy, Default)]
struct Stage {
    list: StageList,
    n: i32,
}

/// `stage` (at most MAX_MSGS, checked by the caller) as the kernel's list.
fn stage_list(stage: &[StageMsg]) -> Stage {
    let mut st = Stage::default();
    for (i, m) in stage.iter().take(MAX_MSGS).enumerate() {
        st.list.src[i] = m.src;
        st.list.dst[i] = m.dst;
        st.list.bytes[i] = m.bytes;
        st.list.peer[i] = m.peer as i32;
        st.list.before[i] = m.before.min(i32::MAX as u32) as i32;
        st.n = i as i32 + 1;
    }
    st
}

/// Messages per peer, as the kernels take them.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Counts {
    n: [u32; MAX_PEERS],
}

fn counts(per_peer: &[u32]) -> Result<Counts> {
    if per_peer.len() > MAX_PEERS {
        return Err(Error::invalid(format!(
            "p2p batch: {} peers, at most {MAX_PEERS}",
            per_peer.len()
        )));
    }
    let mut c = Counts::default();
    c.n[..per_peer.len()].copy_from_slice(per_peer);
    Ok(c)
}

/// Marks `per_peer[p]` messages to each peer p ready, on `stream` (after the data is written).
/// `mine` is this GPU's sync area, `theirs[p]` peer p's as this GPU addresses it (this rank's
/// own entry unused).
///
/// # Safety
/// The areas live for the communicator's life; `stream` a live stream of `gpu`.
pub unsafe fn ready_many(
    gpu: &GpuCtx,
    stream: sys::CUstream,
    (mine, theirs): (u64, &[u64]),
    me: usize,
    per_peer: &[u32],
) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { per_peer_step(gpu, stream, READY_MANY, (mine, theirs), me, per_peer) }
}

/// Launches `P2P_KERNELS[kernel]`, a one-block kernel of the signature `(mine, theirs, me,
/// counts)` (p2p_ready_many, p2p_recv_done), on `stream`.
///
/// # Safety
/// As for [`ready_many`].
unsafe fn per_peer_step(
    gpu: &GpuCtx,
    stream: sys::CUstream,
    kernel: usize,
    (mine, theirs): (u64, &[u64]),
    me: usize,
    per_peer: &[u32],
) -> Result<()> {
    let f = gpu.p2p_func(kernel)?;
    let (mut a, mut t, mut m, mut c) = (mine, ptrs(theirs), me as i32, counts(per_peer)?);
    let mut params: [*mut c_void; 4] = [
        &mut a as *mut u64 as *mut c_void,
        &mut t as *mut Ptrs as *mut c_void,
        &mut m as *mut i32 as *mut c_void,
        &mut c as *mut Counts as *mut c_void,
    ];
    gpu.bind()?;
    // SAFETY: the parameters match the signature of both kernels; the caller vouches for the
    // areas and stream.
    unsafe {
        enqueue(
            f,
            1,
            32,
            stream,
            &mut params,
            "cuLaunchKernel(p2p batch step)",
        )
    }
}

/// Waits on `stream` until each peer p with `per_peer[p] != 0` has copied every message this
/// rank sent it but the last `lag`.
///
/// # Safety
/// As for [`ready_many`].
pub unsafe fn wait_copied_many(
    gpu: &GpuCtx,
    stream: sys::CUstream,
    mine: u64,
    per_peer: &[u32],
    timeout_ns: u64,
    lag: u64,
) -> Result<()> {
    let f = gpu.p2p_func(WAIT_COPIED_MANY)?;
    let (mut a, mut c, mut t, mut l) = (mine, counts(per_peer)?, timeout_ns, lag);
    let mut params: [*mut c_void; 4] = [
        &mut a as *mut u64 as *mut c_void,
        &mut c as *mut Counts as *mut c_void,
        &mut t as *mut u64 as *mut c_void,
        &mut l as *mut u64 as *mut c_void,
    ];
    gpu.bind()?;
    // SAFETY: as in ready_many.
    unsafe {
        enqueue(
            f,
            1,
            32,
            stream,
            &mut params,
            "cuLaunchKernel(p2p_wait_copied_many)",
        )
    }
}

/// The kernel's message list (kernels' `P2pMsgs`).
#[repr(C)]
#[derive(Clone, Copy)]
struct Msgs {
    src: [u64; MAX_MSGS],
    dst: [u64; MAX_MSGS],
    bytes: [u64; MAX_MSGS],
    peer: [i32; MAX_MSGS],
}

/// The chunk size of a launch of `msgs` on up to `max_blocks` blocks: about four chunks a
/// block, a power of two from `min_chunk` (`RAILCC_GPU_P2P_MIN_CHUNK`, default
/// MIN_CHUNK_BYTES; 4 KiB at least) to MAX_CHUNK_BYTES.
pub fn chunk_for(msgs: &[RecvMsg], max_blocks: u32, min_chunk: u64) -> u64 {
    chunk_of(msgs.iter().map(|m| m.bytes), max_blocks, min_chunk)
}

/// [`chunk_for`] of messages of these sizes.
fn chunk_of(sizes: impl Iterator<Item = u64>, max_blocks: u32, min_chunk: u64) -> u64 {
    (sizes.sum::<u64>() / (u64::from(max_blocks.max(1)) * 4))
        .next_power_of_two()
        .clamp(
            min_chunk.clamp(4096, MAX_CHUNK_BYTES).next_power_of_two(),
            MAX_CHUNK_BYTES,
        )
}

/// Thread blocks a batch of `msgs` cut in `chunk`-byte pieces takes: one per chunk, at least
/// 1, at most `max_blocks`.
pub fn blocks_for(msgs: &[RecvMsg], max_blocks: u32, chunk: u64) -> u32 {
    blocks_of(msgs.iter().map(|m| m.bytes), max_blocks, chunk)
}

/// [`blocks_for`] of messages of these sizes.
fn blocks_of(sizes: impl Iterator<Item = u64>, max_blocks: u32, chunk: u64) -> u32 {
    let units: u64 = sizes.map(|b| b.div_ceil(chunk.max(1))).sum();
    units.clamp(1, u64::from(max_blocks.max(1))) as u32
}

/// Copies every message of `msgs` into this GPU on `stream` (each once its sender marked it
/// ready), then tells the senders: `MAX_MSGS` messages a launch, up to `max_blocks` blocks
/// each. Returns the blocks of the largest launch.
///
/// # Safety
/// Every `src` is peer memory this GPU addresses and every `dst` this GPU's memory, `bytes`
/// long, live until the stream passes the copy; the areas as for [`ready_many`].
pub unsafe fn recv_many(
    gpu: &GpuCtx,
    stream: sys::CUstream,
    (mine, theirs): (u64, &[u64]),
    me: usize,
    msgs: &[RecvMsg],
    (max_blocks, min_chunk): (u32, u64),
    timeout_ns: u64,
) -> Result<u32> {
    // A rank's messages to itself count in its own area (`theirs[me]` is `mine`).
    if let Some(m) = msgs.iter().find(|m| m.peer >= MAX_PEERS) {
        return Err(Error::invalid(format!(
            "p2p batch: a receive from peer {} (rank {me}, at most {MAX_PEERS} peers)",
            m.peer
        )));
    }
    let order = rotated(msgs, theirs.len(), me);
    let mut most = 0;
    for batch in order.chunks(MAX_MSGS) {
        // SAFETY: the caller's contract.
        let blocks = unsafe {
            launch_receives(
                gpu,
                stream,
                (mine, theirs),
                me,
                batch,
                (max_blocks, min_chunk, timeout_ns),
                None,
            )
        }?;
        most = most.max(blocks);
        // SAFETY: the areas live for the communicator's life; the caller's stream.
        unsafe { per_peer_step(gpu, stream, RECV_DONE, (mine, theirs), me, &per_peer(batch)) }?;
    }
    Ok(most)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::check;

    #[test]
    fn a_batch_takes_a_block_per_chunk_within_the_bounds() {
        let m = |bytes| RecvMsg {
            src: 0,
            dst: 0,
            bytes,
            peer: 1,
        };
        let c = MIN_CHUNK_BYTES;
        assert_eq!(blocks_for(&[], 32, c), 1);
        assert_eq!(blocks_for(&[m(0)], 32, c), 1);
        assert_eq!(blocks_for(&[m(1), m(c + 1)], 32, c), 3);
        assert_eq!(blocks_for(&[m(1 << 30)], 32, c), 32);
        assert_eq!(blocks_for(&[m(1 << 30)], 0, c), 1);
        // About four chunks a block, within the bounds.
        assert_eq!(
            chunk_for(&[m(1 << 20)], 132, MIN_CHUNK_BYTES),
            MIN_CHUNK_BYTES
        );
        assert_eq!(
            chunk_for(&[m(4 << 20); 3], 132, MIN_CHUNK_BYTES),
            MIN_CHUNK_BYTES
        );
        assert_eq!(
            chunk_for(&[m(16 << 20); 3], 132, MIN_CHUNK_BYTES),
            128 * 1024
        );
        assert_eq!(
            chunk_for(&[m(64 << 20); 3], 132, MIN_CHUNK_BYTES),
            MAX_CHUNK_BYTES
        );
        assert_eq!(
            chunk_for(&[m(1 << 30)], 0, MIN_CHUNK_BYTES),
            MAX_CHUNK_BYTES
        );
        // A smaller floor (RAILCC_GPU_P2P_MIN_CHUNK) spreads 1 MB over more blocks; a floor
        // below 4 KiB or not a power of two is raised to one.
        assert_eq!(chunk_for(&[m(1 << 20)], 132, 16 * 1024), 16 * 1024);
        assert_eq!(chunk_for(&[m(1 << 20)], 132, 100), 4096);
        assert_eq!(chunk_for(&[m(1 << 20)], 132, 20_000), 32 * 1024);
    }

    /// On a GPU: two ranks on one GPU (the context's sync area and a second one, a stream
    /// each) swap batches both ways, twice (the counters carry over): sizes from 1 byte to 1
    /// MB + 5, 16-byte aligned and not, more than MAX_MSGS messages one way; then twice more
    /// with `fused`, both launches waiting on each other at once, rank 1's two sends staged
    /// into two slots by the launch (as one process per GPU stages its sends), then twice
    /// with `fused`'s early marks. Every byte is checked.
    /// Without a driver: a skip line.
    #[test]
    fn batches_swap_messages_both_ways_and_count_on() {
        let Some(gpus) = crate::driver::gpus_or_skip("p2p batch kernels on the GPU") else {
            return;
        };
        let gpu = GpuCtx::new(gpus[0].ordinal, None).expect("context");
        let other = gpu.alloc(crate::kernels::AREA_BYTES).expect("area");
        gpu.upload(&other, 0, &vec![0u8; crate::kernels::AREA_BYTES])
            .expect("zero area");
        let areas = [gpu.sync.ptr, other.ptr];
        let streams = [gpu.stream, crate::gpu::create_stream(&gpu).expect("stream")];
        // Rank 0 sends 18 messages to rank 1, rank 1 sends 2 to rank 0.
        let sizes: [Vec<usize>; 2] = [
            (0..18)
                .map(|i| [1, 100, 65536, (1 << 20) + 5][i % 4] + i)
                .collect(),
            vec![3, 200_000],
        ];
        let offset = |i: usize| (i % 3) * 7; // some not 16-byte aligned
                                             // Where message i lands: as far from 16 bytes as its source (the 16-byte loop after a
                                             // head) for even i, one byte further (bytes only) for odd i.
        let landing = |i: usize| (offset(i) + i % 2) % 16;
        // Rank 1's staging slots (two, as STAGE_SLOTS in the per-process path).
        const SLOT: usize = 256 * 1024;
        let slots = gpu.alloc(2 * SLOT).expect("slots");
        // Rank 0's copy to itself in the fused rounds.
        const OWN: usize = 100_003;
        let own: Vec<u8> = (0..OWN + 3).map(|j| (j % 251) as u8).collect();
        let own_src = gpu.alloc(OWN + 3).expect("alloc");
        gpu.upload(&own_src, 0, &own).expect("upload");
        let own_dst = gpu.alloc(OWN + 3).expect("alloc");
        gpu.upload(&own_dst, 0, &vec![0u8; OWN + 3]).expect("clear");
        let mut bad = 0usize;
        // Rounds 0 and 1 in the four kernels; rounds 2 to 5 in one launch each (p2p_fused,
        // which takes MAX_MSGS receives: rank 0 sends its first 16; each round finds the
        // counts the last block of the round before put back), 4 and 5 with early marks (no
        // receive overlaps a staged source here).
        let n_of = |r: usize, round: u8| {
            if round >= 2 && r == 0 {
                MAX_MSGS
            } else {
                sizes[r].len()
            }
        };
        for round in 0..6u8 {
            let mut sends = Vec::new();
            let mut recvs = Vec::new();
            for (r, list) in sizes.iter().enumerate() {
                let (mut s, mut d) = (Vec::new(), Vec::new());
                for (i, &n) in list.iter().take(n_of(r, round)).enumerate() {
                    let data: Vec<u8> = (0..n + offset(i))
                        .map(|j| {
                            (j as u8)
                                .wrapping_mul(31)
                                .wrapping_add(round + r as u8 + i as u8)
                        })
                        .collect();
                    let b = gpu.alloc(data.len()).expect("alloc");
                    gpu.upload(&b, 0, &data).expect("upload");
                    let out = gpu.alloc(n + offset(i) + 16).expect("alloc");
                    gpu.upload(&out, 0, &vec![0u8; n + offset(i) + 16])
                        .expect("clear");
                    s.push((b, data));
                    d.push(out);
                }
                sends.push(s);
                recvs.push(d);
            }
            let per_peer = |r: usize| {
                let mut c = [0u32; 2];
                c[1 - r] = n_of(r, round) as u32;
                c
            };
            // Where rank 1's message i is read from when staged.
            let slot = |i: usize| slots.ptr + (i * SLOT + offset(i)) as u64;
            let staging = |r: usize| round >= 2 && r == 1;
            let msgs_to = |r: usize| -> Vec<RecvMsg> {
                let from = 1 - r;
                sizes[from]
                    .iter()
                    .take(n_of(from, round))
                    .enumerate()
                    .map(|(i, &n)| RecvMsg {
                        src: if staging(from) {
                            slot(i)
                        } else {
                            sends[from][i].0.ptr + offset(i) as u64
                        },
                        dst: recvs[from][i].ptr + landing(i) as u64,
                        bytes: n as u64,
                        peer: from,
                    })
                    .collect()
            };
            if round >= 2 {
                for r in 0..2 {
                    let c = per_peer(r);
                    // A staged send is not waited for.
                    let copied = if staging(r) { [0; 2] } else { c };
                    let stage: Vec<StageMsg> = if staging(r) {
                        sizes[r]
                            .iter()
                            .enumerate()
                            .map(|(i, &n)| StageMsg {
                                src: sends[r][i].0.ptr + offset(i) as u64,
                                dst: slot(i),
                                bytes: n as u64,
                                peer: 1 - r,
                                before: i as u32,
                            })
                            .collect()
                    } else {
                        // Rank 0 copies a message to itself in the launch (selfcopy.rs).
                        vec![StageMsg {
                            src: own_src.ptr + 3,
                            dst: own_dst.ptr + 3,
                            bytes: OWN as u64,
                            peer: r,
                            before: 0,
                        }]
                    };
                    // SAFETY: every buffer, area and stream is this GPU's, live until the
                    // synchronize below; the two launches run at once on their streams.
                    unsafe {
                        fused(
                            &gpu,
                            streams[r],
                            (areas[r], &areas),
                            r,
                            &msgs_to(r),
                            (&c, &copied),
                            (&stage, 1, round >= 4),
                            (8, 16 * 1024),
                            10_000_000_000,
                        )
                    }
                    .expect("fused");
                }
            } else {
                for r in 0..2 {
                    // SAFETY: both areas and streams are this GPU's, live to the end of the test.
                    unsafe { ready_many(&gpu, streams[r], (areas[r], &areas), r, &per_peer(r)) }
                        .expect("ready_many");
                }
                for r in 0..2 {
                    // SAFETY: every buffer is this GPU's, live until the synchronize below.
                    unsafe {
                        recv_many(
                            &gpu,
                            streams[r],
                            (areas[r], &areas),
                            r,
                            &msgs_to(r),
                            (8, MIN_CHUNK_BYTES),
                            10_000_000_000,
                        )
                    }
                    .expect("recv_many");
                }
                for r in 0..2 {
                    // SAFETY: as above.
                    unsafe {
                        wait_copied_many(
                            &gpu,
                            streams[r],
                            areas[r],
                            &per_peer(r),
                            10_000_000_000,
                            0,
                        )
                    }
                    .expect("wait_copied_many");
                }
            }
            // SAFETY: the bound context is live.
            check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize").expect("kernels ran");
            assert!(!gpu.kernels_stopped(), "a p2p batch kernel timed out");
            if round >= 2 {
                let mut got = vec![0u8; OWN + 3];
                gpu.download(&own_dst, 0, &mut got).expect("download");
                bad += (3..OWN + 3).filter(|&j| got[j] != own[j]).count();
                gpu.upload(&own_dst, 0, &vec![0u8; OWN + 3]).expect("clear");
            }
            for (from, list) in sizes.iter().enumerate() {
                for (i, &n) in list.iter().take(n_of(from, round)).enumerate() {
                    let mut got = vec![0u8; n + offset(i) + 16];
                    gpu.download(&recvs[from][i], 0, &mut got)
                        .expect("download");
                    let at = landing(i);
                    let want = &sends[from][i].1[offset(i)..];
                    bad += (0..n).filter(|&j| got[at + j] != want[j]).count();
                }
            }
        }
        println!(
            "p2p batch kernels: 18 messages one way and 2 the other, 2 rounds, then 16 and 2 (staged) in one launch each with a copy to itself, 2 rounds, then 2 more with early marks, {bad} bytes wrong"
        );
        // SAFETY: made above; every kernel on it is done.
        unsafe { crate::gpu::destroy_stream(&gpu, streams[1]) }.expect("destroy stream");
        assert_eq!(bad, 0);
    }

    #[test]
    fn early_marks_only_where_no_receive_writes_a_staged_source() {
        let r = |dst: u64, bytes: u64| RecvMsg {
            src: 1 << 40,
            dst,
            bytes,
            peer: 1,
        };
        let s = |src: u64, bytes: u64| StageMsg {
            src,
            dst: 1 << 41,
            bytes,
            peer: 1,
            before: 0,
        };
        // Out of place: apart.
        assert!(early_marks_safe(&[r(0, 100), r(100, 100)], &[s(1000, 200)]));
        // Touching ends share no byte.
        assert!(early_marks_safe(&[r(0, 100)], &[s(100, 100)]));
        assert!(early_marks_safe(&[r(100, 100)], &[s(0, 100)]));
        // In place (all-to-all on one buffer): the receive from a peer lands where the send
        // to it is read.
        assert!(!early_marks_safe(&[r(0, 100), r(100, 100)], &[s(100, 100)]));
        assert!(!early_marks_safe(&[r(50, 100)], &[s(0, 51)]));
        // Empty ranges overlap nothing.
        assert!(early_marks_safe(&[r(0, 0)], &[s(0, 100)]));
        assert!(early_marks_safe(&[], &[s(0, 100)]));
    }

    #[test]
    fn the_kernels_argument_layouts_match_the_source() {
        // P2pMsgs: 3 x 16 u64 then 16 int; P2pCounts: 8 unsigned int.
        assert_eq!(std::mem::size_of::<Msgs>(), 3 * 16 * 8 + 16 * 4);
        assert_eq!(std::mem::size_of::<Counts>(), 32);
        assert!(SOURCE.contains(&format!("#define P2P_MAX_MSGS {MAX_MSGS}")));
        // recv_many's seven parameters, the chunk size last; p2p_fused's three counts after.
        assert!(SOURCE.contains("int me, unsigned long long timeout_ns, unsigned long long chunk)"));
        assert!(SOURCE.contains(
            "unsigned long long chunk, P2pCounts ready, P2pCounts recvd, P2pCounts copied, P2pStage st, int n_stage, unsigned long long lag, int early)"
        ));
        // P2pStage: 3 x 16 u64 then 2 x 16 int.
        assert_eq!(std::mem::size_of::<StageList>(), 3 * 16 * 8 + 2 * 16 * 4);
        assert_eq!(crate::kernels::P2P_KERNELS[FUSED], "p2p_fused");
        assert_eq!(
            crate::kernels::P2P_KERNELS[READY_MANY..=RECV_DONE],
            [
                "p2p_ready_many",
                "p2p_wait_copied_many",
                "p2p_recv_many",
                "p2p_recv_done"
            ]
        );
    }
}
