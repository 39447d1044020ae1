//! Calls whose kernel is enqueued before its peers arrive, with its arguments written later
//! (`RAILCC_GPU_LATE_ARGS`; the GPU side is `railcc_cuda::late`).
//!
//! Why: a bulk-kernel call needs its peers' buffer addresses, which differ call by call, so
//! without this the caller's thread waits on the host for the slowest peer before it can
//! launch: 0.9-1.4 ms a call in DDP and FSDP steps on 4 x H200, where NCCL's calls return
//! at once and wait on the GPU (`bench/results/issue31/return-time-design.md` §8).
//!
//! How: the caller publishes its buffers as usual, enqueues the bulk (or push) kernel's late
//! form on its stream (in the kernel order), hands the call to the launcher
//! thread (`defer.rs`) and returns. The launcher meets the peers in call order, maps their
//! buffers, and writes the call's arguments into the call's slot of mapped pinned memory
//! ([`LateSlots::fill`]), where the kernel's block 0 finds them. Unlike `RAILCC_GPU_DEFER` the
//! launcher makes no stream call; its one driver call is the IPC or VMM open of an
//! allocation not mapped before. A slot is reused every `CALL_DEPTH` calls, once the GPU has
//! acknowledged its previous call. On a failure the launcher marks the slot failed (the
//! kernels skip their data) and breaks the communicator, which stops every wait.

use super::{copy_out_of_bounce, defer, ProcGpu};
use crate::plan::{self, Kernel};
use crate::table::{wait_until, CALL_DEPTH};
use railcc_core::call::Call;
use railcc_core::{Error, ErrorKind, Result};
use railcc_cuda::gpu::stream_of;
use railcc_cuda::hostsync::Flags;
use railcc_cuda::late::{args_words, ACK, ARGS, FAILED, SLOT_U32, TOKEN};
use railcc_cuda::launch::Spec;
use std::time::Instant;

/// A call's token: the low 32 bits of its number (the GPU compares 32-bit tokens), never 0
/// (a device slot whose call failed holds no valid token): call 2^32 k takes 1, which no
/// other call of its slot (numbers 0 mod `CALL_DEPTH`) has.
pub(super) fn token(call: u64) -> u32 {
    (call as u32).max(1)
}

/// One communicator's [`CALL_DEPTH`] host slots, in mapped pinned memory of its GPU's context.
pub(super) struct LateSlots {
    flags: Flags,
}

impl LateSlots {
    /// The slots, in the context current on this thread.
    pub fn new() -> Result<LateSlots> {
        Ok(LateSlots {
            flags: Flags::new_current(CALL_DEPTH as usize * SLOT_U32)?,
        })
    }

    fn first(call: u64) -> usize {
        (call % CALL_DEPTH) as usize * SLOT_U32
    }

    /// Call `call`'s slot as the GPU addresses it.
    pub fn host_slot(&self, call: u64) -> Result<u64> {
        self.flags.dev_ptr(Self::first(call))
    }

    /// Writes call `call`'s arguments `spec` into its slot, once the GPU has acknowledged the
    /// slot's previous call (the token still in the slot; 0: none since the communicator
    /// began), by `deadline`.
    pub fn fill(
        &self,
        call: u64,
        spec: &Spec,
        deadline: Instant,
        broken: &dyn Fn() -> Option<Error>,
    ) -> Result<()> {
        let at = Self::first(call);
        let words = args_words(spec)?;
        let previous = self.flags.load(at + TOKEN);
        if previous != 0 {
            wait_until(deadline, broken, || self.flags.load(at + ACK) == previous).map_err(
                |e| {
                    e.unwrap_or_else(|| {
                        Error::new(
                            ErrorKind::Timeout,
                            format!(
                                "GPU call {call}: the kernel of the slot's previous call (token {previous}) did not take its late arguments in time"
                            ),
                        )
                        .transport(crate::NAME)
                    })
                },
            )?;
        }
        // SAFETY: the GPU reads these words only after it sees this call's token, stored
        // below; its copy of the slot's previous call is over (acknowledged above).
        unsafe { self.flags.write(at + ARGS, &words) }?;
        self.mark(call, false)
    }

    /// Marks call `call` failed in its slot, at once: the communicator is breaking, and
    /// every wait stops.
    pub fn fail(&self, call: u64) -> Result<()> {
        self.mark(call, true)
    }

    /// Stores call `call`'s token with its failed flag in one 8-byte store: the GPU reads
    /// both as one u64.
    fn mark(&self, call: u64, failed: bool) -> Result<()> {
        const _: () = assert!(TOKEN.is_multiple_of(2) && FAILED == TOKEN + 1);
        let word = u64::from(failed) << 32 | u64::from(token(call));
        self.flags.store_u64(Self::first(call) + TOKEN, word)
    }
}

/// The late form a call's kernel takes, with what its launch needs.
enum LateForm {
    Bulk {
        blocks: u32,
        wide: bool,
        n_in: usize,
    },
    Push {
        blocks: u32,
        slot: usize,
    },
}

impl ProcGpu {
    /// Call `call`, published with buffers `bufs`, with late arguments (`late.rs`): hands it
    /// to the launcher `d`, which writes its kernel's arguments into its slot once it has met
    /// the peers, and enqueues on the caller's stream, in the kernel order,
    /// the late form of kernel `k` (the bulk kernel, or the push kernel, whose outputs come
    /// late) and `copy_out` of the bounce buffer.
    ///
    /// # Safety
    /// As for [`ProcGpu::collective`]; `c.stream` not being captured.
    pub(super) unsafe fn late_launch(
        &self,
        c: &Call,
        call: u64,
        (d, slots, k): (&defer::Deferred, &LateSlots, Kernel),
        bufs: (u64, u64),
        copy_out: Option<(u64, u64, usize)>,
        deadline: Instant,
    ) -> Result<()> {
        let (a, n, me) = (c.args, self.nranks, self.rank);
        // Which late form, checked before the launcher takes the call.
        let form = match k {
            Kernel::Push { blocks, slot } => LateForm::Push { blocks, slot },
            Kernel::Bulk { blocks, wide, .. } => {
                // Its input count from the call's shape alone (distinct stand-in addresses:
                // only the launcher knows the peers').
                let (ins, outs): (Vec<u64>, Vec<u64>) =
                    (0..n as u64).map(|i| (2 * i, 2 * i + 1)).unzip();
                let part = plan::spec(a.coll, me, &ins, &outs, a.count, a.dtype, a.root)?;
                LateForm::Bulk {
                    blocks,
                    wide,
                    n_in: part.ins.len(),
                }
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    "late arguments take the bulk and push kernels only",
                )
                .rank(self.own_name)
                .transport(crate::NAME))
            }
        };
        let late = railcc_cuda::late::LateSlot {
            host: slots.host_slot(call)?,
            dev: railcc_cuda::late::dev_slot(self.gpu.sync.ptr, call),
            token: token(call),
        };
        let timeout_ns = self.timeout_ns();
        d.late(
            call,
            a.to_words(),
            deadline,
            defer::LateJob { args: a, bufs },
        )?;
        let stream = stream_of(c.stream);
        // SAFETY: both slots live as long as the communicator, whose close waits for its
        // kernels; the caller vouches for its buffers and stream, the launcher for the peers'
        // (mapped before it writes the slot).
        unsafe {
            self.kernel_order.lock().run_eager(&self.gpu, c.stream, || {
                if self.late_gate {
                    d.gate(stream, call)?;
                }
                match form {
                    LateForm::Push { blocks, slot } => railcc_cuda::push::launch(
                        &self.gpu,
                        stream,
                        me,
                        bufs.0,
                        railcc_cuda::push::Outs::Late(late),
                        a.count,
                        a.dtype,
                        a.op,
                        &self.syncs,
                        (blocks, slot),
                        timeout_ns,
                    )?,
                    LateForm::Bulk { blocks, wide, n_in } => {
                        let shape = railcc_cuda::launch::CallShape {
                            dt: a.dtype,
                            op: a.op,
                            syncs: &self.syncs,
                            avg_n: n as i32,
                            blocks,
                            timeout_ns,
                            wide,
                            tma: 0,
                        };
                        railcc_cuda::launch::launch_late(&self.gpu, stream, me, n_in, late, &shape)?
                    }
                }
                copy_out_of_bounce(copy_out, stream)
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_never_zero_and_never_repeats_within_its_slot_across_the_wrap() {
        assert_eq!(token(5), 5);
        assert_eq!(token(1 << 32), 1, "the wrap takes 1, not 0");
        // The calls of slot 0 around the wrap: every token differs from its neighbours'
        // (the GPU tells a slot's calls apart by their tokens).
        let slot0: Vec<u32> = (0..4)
            .map(|k| token((1u64 << 32) - 2 * CALL_DEPTH + k * CALL_DEPTH))
            .collect();
        assert!(slot0.iter().all(|&t| t != 0), "{slot0:?}");
        assert!(slot0.windows(2).all(|w| w[0] != w[1]), "{slot0:?}");
    }
}
