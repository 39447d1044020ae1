//! The fixed stage (`RAILCC_GPU_STAGE_BYTES`): a buffer of device memory each rank sets
//! aside at init and every peer maps then, so a call whose data fits needs no meeting on the
//! host: its peers' addresses are known before they arrive.
//!
//! Why: a collective of one process per GPU otherwise waits on the host until every peer has
//! published its buffers (their addresses differ call by call), so a late rank holds every
//! other rank's CPU thread. NCCL's calls return at once because their kernels move data
//! through buffers mapped at init; this does the same for the calls that fit, at the cost of
//! a copy in and a copy out on the caller's stream (HBM speed, against NVLink's).
//!
//! How: the send data is copied to the start of this rank's stage, the kernel runs with every
//! rank's stage as its inputs and (after the send part, 256-byte aligned) outputs, and the
//! receive part is copied out after it; all on the caller's stream, in the communicator's
//! kernel order. A part no peer's kernel reaches (`plan::reach`) is neither copied nor given
//! room: the kernel uses the caller's buffer for it. Every rank lays a call out alike from its shape, so matching calls agree;
//! the launcher thread (`defer.rs`) reads the peers' table entries behind the call and breaks
//! the communicator if one differs. A mismatched peer's kernel stays inside every stage (each
//! rank checks its own call fits, and every stage has the communicator's size), so a
//! mismatch gives an error, never a stray access. Reuse is safe without double buffering:
//! a kernel finishes on this GPU only after every peer's blocks finished the call (its done
//! barrier), so the next call's copy in comes after every peer has read this one's.

use railcc_core::call::CollKind;
use railcc_cuda::gpu::DevBuf;
use railcc_cuda::ipc;

/// This rank's stage and every rank's stage as this GPU addresses it.
pub(super) struct FixedStage {
    own: DevBuf,
    /// The communicator's size of a stage (every rank's least).
    bytes: u64,
    /// Per rank: its stage here (this rank's own at its index).
    at: Vec<u64>,
    /// Peers' stages this process opened, closed on drop.
    opened: Vec<u64>,
}

/// Where a call of `send_len` and `recv_len` bytes lies in a stage of `bytes`: its send
/// part at the start, its receive part at the returned offset (256-byte aligned); None when
/// it does not fit or the collective does not go through stages. `(ins, outs)`: whether its
/// kernel reaches the peers' inputs and outputs (`plan::reach`); a part no peer reaches stays
/// the caller's and takes no room (a reduce-scatter's output; an all-gather's or the push
/// all-reduce's input: a DDP bucket of 32 MiB then fits a stage of 64).
pub(super) fn recv_offset(
    coll: CollKind,
    (send_len, recv_len): (u64, u64),
    (ins, outs): (bool, bool),
    bytes: u64,
) -> Option<u64> {
    if !matches!(
        coll,
        CollKind::AllReduce | CollKind::AllGather | CollKind::ReduceScatter
    ) {
        return None;
    }
    let recv = if ins { send_len } else { 0 }.checked_next_multiple_of(256)?;
    (recv.checked_add(if outs { recv_len } else { 0 })? <= bytes).then_some(recv)
}

impl FixedStage {
    /// `own` (this rank's, exported to peers at init) and `at` (every rank's as mapped here;
    /// `opened` those this process opened); `bytes` the communicator's stage size.
    pub fn new(own: DevBuf, bytes: u64, at: Vec<u64>, opened: Vec<u64>) -> FixedStage {
        FixedStage {
            own,
            bytes,
            at,
            opened,
        }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Rank `r`'s stage as this GPU addresses it.
    pub fn of(&self, r: usize) -> u64 {
        self.at.get(r).copied().unwrap_or(self.own.ptr)
    }

    /// Leaves everything allocated (kernels still run: see `ProcGpu`'s drop).
    pub fn leak(self) {
        std::mem::forget(self);
    }
}

impl Drop for FixedStage {
    fn drop(&mut self) {
        for &m in &self.opened {
            // SAFETY: opened once at init; dropped after the communicator's kernels settled.
            unsafe { ipc::close(m) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_fits_its_send_part_then_its_receive_part_aligned() {
        let both = (true, true);
        assert_eq!(
            recv_offset(CollKind::AllGather, (1000, 4000), both, 8192),
            Some(1024)
        );
        // Exactly full, one byte over, and no send part.
        assert!(recv_offset(CollKind::ReduceScatter, (4096, 4096), both, 8192).is_some());
        assert!(recv_offset(CollKind::ReduceScatter, (4096, 4097), both, 8192).is_none());
        assert_eq!(
            recv_offset(CollKind::AllReduce, (0, 0), both, 8192),
            Some(0)
        );
        // Only these three collectives; and no overflow on absurd sizes.
        assert!(recv_offset(CollKind::Broadcast, (8, 8), both, 8192).is_none());
        assert!(recv_offset(CollKind::AllReduce, (u64::MAX - 10, 8), both, u64::MAX).is_none());
    }

    #[test]
    fn a_part_no_peer_reaches_takes_no_room() {
        // The push all-reduce (only outputs reached): 6 KiB in and out fit 8 KiB.
        assert_eq!(
            recv_offset(CollKind::AllReduce, (6144, 6144), (false, true), 8192),
            Some(0)
        );
        assert!(recv_offset(CollKind::AllReduce, (6144, 6144), (true, true), 8192).is_none());
        // A reduce-scatter (only inputs reached): its whole send part, no receive part.
        assert_eq!(
            recv_offset(CollKind::ReduceScatter, (8192, 2048), (true, false), 8192),
            Some(8192)
        );
        assert!(recv_offset(CollKind::ReduceScatter, (8193, 1), (true, false), 8192).is_none());
    }
}
