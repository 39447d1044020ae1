//! Late kernel arguments: a bulk kernel enqueued before its peers' buffer addresses are known
//! (`RAILCC_GPU_LATE_ARGS`, railcc_transport_nvlink's `proc/late.rs`).
//!
//! Why: a call of one process per GPU needs its peers' buffers mapped before its kernel can
//! be launched, so without this the caller's thread waits on the host for the slowest peer
//! (0.9-1.4 ms a call in DDP and FSDP steps on 4 x H200, `step.py --profile`), while NCCL's
//! calls return at once and wait on the GPU.
//!
//! How: the caller enqueues the bulk kernel's late form (`kernels.rs`, `arl_<dtype>_<op>`;
//! the push kernel's, `push.rs`, with `RAILCC_GPU_LATE_ARGS=2`) on its stream and returns. Its
//! first statements ([`SOURCE`]'s `late_take`): thread 0 of block 0 polls a slot in mapped
//! pinned host memory until the launcher thread has met the peers and written the call's
//! arguments there ([`SLOT_WORDS`] u64 words, layout below); block 0 copies them into this
//! GPU's sync area ([`DEV_OFFSET`]), publishes the token there last, and acknowledges the
//! slot; the other blocks wait for that token in device memory. Only block 0 reads host
//! memory (its thread 0 polls): one such read per block at a kernel's start cost 2-3x at
//! 2-16 MB (measured, nineteenth session). Until the twenty-first session a separate
//! one-block fetch kernel ran first: one more launch a call, though taking it out left
//! nccl-tests' 1 MB late call as slow (26.5 against the usual form's 20.1 us on 4 x H200).
//! The stream's work after the call waits for it as for any kernel; the launcher makes no
//! stream call (a stream waiting on a host thread that itself enqueues work hung under
//! PyTorch, `return-time-design.md` §7). By default (`RAILCC_GPU_LATE_GATE`) the caller puts a
//! stream memory wait on the launcher's release word ahead of the kernel, so its blocks take
//! their SMs only once the arguments are written: a bare late kernel's whole grid spins on
//! its SMs meanwhile, and matrix products beside it on 2 x H200 took 6.9-7.0x their time
//! alone (1.00-1.01x behind the wait; `bench/torch/late_peer.py`, twenty-second session).
//!
//! A slot, u64 words: 0 the token (low half: the call number's low 32 bits, never 0; high
//! half: 1 if the launcher failed the call; one 8-byte store), 1 the GPU's acknowledgement (low
//! half: the token it copied), 2 the input and output counts (low, high half), 3 and 4 the
//! element range, 8-15 the inputs, 16-23 the outputs.

use crate::kernels::{MAX_PEERS, SYNC_BYTES};
use crate::launch::Spec;
use railcc_core::{Error, Result};

/// u64 words of a slot (host and device alike).
pub const SLOT_WORDS: usize = 32;
/// Device slots in each GPU's sync area: the communicator's kernels run one after another
/// (the kernel order), so a later call's block 0 never overwrites a slot a kernel still reads;
/// a few make that hold by a margin.
pub const DEV_SLOTS: usize = 8;
/// Where the device slots start in the sync area: after the sync words, before the push
/// kernel's flags.
pub const DEV_OFFSET: usize = SYNC_BYTES.div_ceil(256) * 256;
const _: () = assert!(DEV_OFFSET + DEV_SLOTS * SLOT_WORDS * 8 <= crate::push::FLAGS_OFFSET);
const _: () = assert!(16 + MAX_PEERS <= SLOT_WORDS && 8 + MAX_PEERS <= 16);
/// u32 words of a slot, as the host writes them (`hostsync::Flags` holds u32 words).
pub const SLOT_U32: usize = 2 * SLOT_WORDS;
/// Host-side u32 word indices within a slot.
pub const TOKEN: usize = 0;
pub const FAILED: usize = 1;
pub const ACK: usize = 2;
/// The first u32 word after the token and acknowledgement: what [`args_words`] fills.
pub const ARGS: usize = 4;

/// Where a late kernel finds its arguments: call `token`'s host slot `host` (its device
/// address) and the device slot `dev` its block 0 copies it into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LateSlot {
    pub host: u64,
    pub dev: u64,
    pub token: u32,
}

/// The late forms' first parameters (before each form's own), in this order.
pub const PARAMS: &str =
    "unsigned long long late_host, unsigned long long late, unsigned int token, ";

/// The first statements of the bulk kernel's late form (kernels.rs): its arguments from the
/// device slot at `late` once `late_take` has filled it; `bad` where the launcher failed the
/// call or a wait was stopped.
pub const BULK_PROLOGUE: &str = r#"  const bool bad = !late_take(late_host, late, token, syncs.p[me], timeout_ns);
  const volatile unsigned long long* s = (const volatile unsigned long long*)late;
  Ptrs ins, outs;
#pragma unroll
  for (int r = 0; r < 8; r++) { ins.p[r] = s[8 + r]; outs.p[r] = s[16 + r]; }
  const int n = (int)(s[2] & 0xffffffffull), n_out = (int)(s[2] >> 32);
  const unsigned long long begin = s[3], end = s[4];"#;

/// The same for the push kernel's late form (push.rs): its outputs alone.
pub const PUSH_PROLOGUE: &str = r#"  const bool bad = !late_take(late_host, late, token, areas.p[me], timeout_ns);
  const volatile unsigned long long* s = (const volatile unsigned long long*)late;
  Ptrs outs;
#pragma unroll
  for (int r = 0; r < 8; r++) outs.p[r] = s[16 + r];"#;

/// CUDA source of `late_take` (in kernels.rs' helpers, which every bulk and push module has).
pub const SOURCE: &str = r#"
// Late arguments (late.rs). Thread 0 of block 0 polls the host slot for this call's token (the
// kernel's one read of host memory); thread 0 of every other block polls the device slot,
// which block 0 fills and then marks with the token (failed: its high half set). Block 0 stops
// at an abort or the deadline, as every wait does, and then marks the call failed; the others
// stop at an abort only, so every block of the kernel agrees whether it has its arguments.
// Block 0 acknowledges the host slot once it has copied it: the launcher may refill it. True (in every thread of the block) when the call's
// arguments are in the device slot.
__device__ bool late_take(unsigned long long host, unsigned long long dev, unsigned int token, unsigned long long sync, unsigned long long timeout_ns) {
  volatile unsigned long long* h = (volatile unsigned long long*)host;
  volatile unsigned long long* d = (volatile unsigned long long*)dev;
  __shared__ int ok;
  if (threadIdx.x == 0) {
    volatile unsigned long long* w = blockIdx.x == 0 ? h : d;
    unsigned long long t0 = now_ns();
    unsigned int spins = 0;
    int got = 0;
    for (;;) {
      unsigned long long v = w[0];
      if ((unsigned int)v == token) { got = (v >> 32) == 0 ? 1 : 0; break; }
      if (blockIdx.x == 0 && now_ns() - t0 > timeout_ns) { timed_out(sync); break; }
      if ((++spins & 1023u) == 0 && aborted(sync)) break;
    }
    // The slot's other words are read after its token.
    __threadfence_system();
    ok = got;
  }
  __syncthreads();
  if (blockIdx.x == 0) {
    if (ok && threadIdx.x > 0 && threadIdx.x < 32) d[threadIdx.x] = h[threadIdx.x];
    // The copied words are seen before the token that publishes them.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      // A failed word never equals a token (its high half is set).
      d[0] = ok ? (unsigned long long)token : ((unsigned long long)token | (1ull << 32));
      __threadfence_system();
      ((volatile unsigned int*)host)[2] = token;
    }
  }
  return ok != 0;
}
"#;

/// The slot's words from u32 word [`ARGS`] on for `s`: counts, range, inputs, outputs.
pub fn args_words(s: &Spec) -> Result<Vec<u32>> {
    if s.ins.len() > MAX_PEERS || s.outs.len() > MAX_PEERS {
        return Err(Error::invalid(format!(
            "late arguments: {} inputs and {} outputs (at most {MAX_PEERS})",
            s.ins.len(),
            s.outs.len()
        )));
    }
    let mut w = [0u64; SLOT_WORDS];
    w[2] = s.ins.len() as u64 | (s.outs.len() as u64) << 32;
    (w[3], w[4]) = s.range;
    w[8..8 + s.ins.len()].copy_from_slice(&s.ins);
    w[16..16 + s.outs.len()].copy_from_slice(&s.outs);
    Ok(w[ARGS / 2..]
        .iter()
        .flat_map(|v| [*v as u32, (*v >> 32) as u32])
        .collect())
}

/// The device slot of call `call` in the sync area at `sync`.
pub fn dev_slot(sync: u64, call: u64) -> u64 {
    sync + (DEV_OFFSET + (call as usize % DEV_SLOTS) * SLOT_WORDS * 8) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_holds_the_spec_where_the_kernels_read_it() {
        let s = Spec {
            ins: vec![0x1_0000_0010, 0x2_0000_0020],
            outs: vec![0x3_0000_0030],
            range: (5, 0x1_0000_0007),
        };
        let w = args_words(&s).expect("fits");
        assert_eq!(w.len(), SLOT_U32 - ARGS);
        let u64_at = |i: usize| w[2 * i - ARGS] as u64 | (w[2 * i + 1 - ARGS] as u64) << 32;
        assert_eq!(u64_at(2), 2 | 1 << 32);
        assert_eq!((u64_at(3), u64_at(4)), s.range);
        assert_eq!((u64_at(8), u64_at(9), u64_at(10)), (s.ins[0], s.ins[1], 0));
        assert_eq!((u64_at(16), u64_at(17)), (s.outs[0], 0));
        let src = BULK_PROLOGUE;
        for read in ["s[2]", "s[3]", "s[4]", "s[8 + r]", "s[16 + r]"] {
            assert!(src.contains(read), "the late bulk kernel reads {read}");
        }
        assert!(SOURCE.contains("((volatile unsigned int*)host)[2] = token"));
        for p in [BULK_PROLOGUE, PUSH_PROLOGUE] {
            assert!(p.contains("late_take(late_host, late, token, "), "{p}");
        }
        assert!(PARAMS.contains("late_host") && PARAMS.ends_with(", "));
        assert_eq!(ACK, 2);
        let too_many = Spec {
            ins: vec![0; MAX_PEERS + 1],
            outs: vec![],
            range: (0, 0),
        };
        assert!(args_words(&too_many).is_err());
        assert_ne!(dev_slot(0, 1), dev_slot(0, 2));
        assert_eq!(dev_slot(0, 0), dev_slot(0, DEV_SLOTS as u64));
    }
}
