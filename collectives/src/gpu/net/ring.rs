//! The staging ring: `depth` slots of pinned send and receive staging (`RAILCC_GPU_NET_RING`)
//! that a call's copies fill and drain in stream order (piece k uses slot k mod depth). One
//! ring serves the communicator's calls on every stream, one call after another (`Rings`).

use crate::comm::Communicator;
use crate::regions::RegionId;
use parking_lot::Mutex;
use railcc_core::{Error, Result};
use railcc_cuda::gpu::LaunchOrder;
use railcc_cuda::hostsync::Ctx;
use railcc_cuda::staging::PinnedBuf;
use std::sync::Arc;
use std::time::Duration;

/// Without a budget the first ring holds pieces of this many bytes (a ring cannot grow while a stream
/// is being captured: CUDA refuses pinned allocations then), or of the budget's slot size.
const FIRST_SLOT_BYTES: usize = 4 << 20;

/// The slot size a staging budget of `budget` bytes allows at ring depth `depth` (send and
/// receive slots): a whole number of 4 KiB pages, at least one; None without a budget.
pub fn budget_slot_bytes(budget: usize, depth: usize) -> Option<usize> {
    if budget == 0 {
        return None;
    }
    let per = budget / (2 * depth.max(1));
    Some((per / 4096 * 4096).max(4096))
}

pub struct Ring {
    pub slot_bytes: usize,
    /// Pieces in flight: the copy of piece k+depth waits for piece k to be done.
    pub depth: usize,
    send: Vec<PinnedBuf>,
    recv: Vec<PinnedBuf>,
    /// The slots' addresses in the GPU's address space (the staging kernel's).
    pub send_dev: Vec<u64>,
    pub recv_dev: Vec<u64>,
    /// Registrations with the channels of every engine that uses the ring (a communicator's
    /// flat engine and its hierarchy's cross engine share the rings: one budget).
    regions: Mutex<Vec<(Arc<Communicator>, RegionId)>>,
}

// SAFETY: plain pinned host memory; the flag protocol gives the stream and the host turns
// (the stream writes a send slot before `start`, the host reads it and writes the receive
// slot before `done`, the stream reads that after), and the handles only free it.
unsafe impl Sync for Ring {}
// SAFETY: as above.
unsafe impl Send for Ring {}

impl Ring {
    pub fn new(
        ctx: &Ctx,
        slot_bytes: usize,
        depth: usize,
        comms: &[Arc<Communicator>],
    ) -> Result<Ring> {
        ctx.bind()?;
        let mut r = Ring {
            slot_bytes,
            depth,
            send: Vec::new(),
            recv: Vec::new(),
            send_dev: Vec::new(),
            recv_dev: Vec::new(),
            regions: Mutex::new(Vec::new()),
        };
        for _ in 0..depth {
            let (s, v) = (
                PinnedBuf::in_current(ctx.ctx, slot_bytes)?,
                PinnedBuf::in_current(ctx.ctx, slot_bytes)?,
            );
            r.send_dev.push(s.dev_ptr()?);
            r.recv_dev.push(v.dev_ptr()?);
            r.send.push(s);
            r.recv.push(v);
        }
        r.register_with(comms)?;
        Ok(r)
    }

    /// Registers the slots with every channel of `comms` (piece k runs on channel k mod
    /// channels), so RDMA moves the stages without a registration per transfer; a no-op for
    /// channels it is registered with already.
    pub fn register_with(&self, comms: &[Arc<Communicator>]) -> Result<()> {
        let mut regions = self.regions.lock();
        let known = |regions: &[(Arc<Communicator>, RegionId)], c: &Arc<Communicator>| {
            regions.iter().any(|(have, _)| Arc::ptr_eq(have, c))
        };
        // Channels register in order, each whole or not at all: the last one known means all.
        if comms.last().is_none_or(|c| known(&regions, c)) {
            return Ok(());
        }
        let bufs: Vec<(*const u8, usize)> = (self.send.iter())
            .chain(&self.recv)
            .map(|b| (b.as_ptr(), b.len()))
            .collect();
        for c in comms {
            if known(&regions, c) {
                continue;
            }
            let mut ids = Vec::with_capacity(bufs.len());
            for &(p, n) in &bufs {
                // SAFETY: the buffers live in `self` until Drop deregisters them.
                match unsafe { c.register(p, n) } {
                    Ok(id) => ids.push(id),
                    Err(e) => {
                        for id in ids {
                            let _ = c.deregister(id);
                        }
                        return Err(e);
                    }
                }
            }
            regions.extend(ids.into_iter().map(|id| (c.clone(), id)));
        }
        Ok(())
    }

    /// Drops the registrations with the channels of `comms`.
    pub fn deregister_from(&self, comms: &[Arc<Communicator>]) {
        let mut regions = self.regions.lock();
        regions.retain(|(c, id)| {
            let theirs = comms.iter().any(|x| Arc::ptr_eq(x, c));
            if theirs {
                if let Err(e) = c.deregister(*id) {
                    tracing::debug!("gpu net: deregister ring: {e}");
                }
            }
            !theirs
        });
    }

    pub fn send_ptr(&self, k: usize) -> *mut u8 {
        self.send[k % self.depth].as_ptr() as *mut u8
    }

    pub fn recv_ptr(&self, k: usize) -> *mut u8 {
        self.recv[k % self.depth].as_ptr() as *mut u8
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        for (c, id) in self.regions.get_mut().drain(..) {
            if let Err(e) = c.deregister(id) {
                tracing::debug!("gpu net: deregister ring: {e}");
            }
        }
    }
}

/// The staging ring of a communicator's GPU network calls on every stream. One ring, not one
/// a stream (NCCL's buffers are a communicator's too): a call first waits, on the GPU, for the
/// last call's work (`Rings::in_order`, a `LaunchOrder` that waits on every stream), so the
/// calls of one communicator run one after another whatever their streams,
/// the pinned budget holds for the communicator, and a new stream allocates nothing (pinning
/// 32 MiB takes about 20 ms, which an overlapped step waited for). Captured calls neither
/// record nor wait: a graph's launches and other calls on the communicator are the caller's
/// to order, as with NCCL.
pub struct Rings {
    /// The ring every call stages through (none yet without a budget).
    ring: Mutex<Option<Arc<Ring>>>,
    order: Mutex<LaunchOrder>,
    /// Rings outgrown (no budget): graphs and calls in flight may still use them, and freeing
    /// pinned memory waits for the whole GPU; freed with the engine.
    retired: Mutex<Vec<Arc<Ring>>>,
}

impl Rings {
    /// Rings whose calls start with `ring` (made at init under a budget, whose slot size is
    /// known then: the first call allocates and registers nothing, and may be captured).
    pub fn with(ring: Option<Ring>) -> Rings {
        Rings {
            ring: Mutex::new(ring.map(Arc::new)),
            order: Mutex::new(LaunchOrder::always()),
            retired: Mutex::new(Vec::new()),
        }
    }

    /// Registers the ring with `comms`: another engine of the same GPU that shares these
    /// rings, at its init (so its first call registers nothing).
    pub fn register_with(&self, comms: &[Arc<Communicator>]) -> Result<()> {
        let ring = self.ring.lock().clone();
        ring.map_or(Ok(()), |r| r.register_with(comms))
    }

    /// Deregisters every ring from `comms` (an engine that shared the rings and closes: its
    /// channels are not kept alive by the other engine's rings).
    pub fn forget(&self, comms: &[Arc<Communicator>]) {
        let mut rings: Vec<Arc<Ring>> = self.retired.lock().clone();
        rings.extend(self.ring.lock().clone());
        for r in rings {
            r.deregister_from(comms);
        }
    }

    /// The ring for a call, with slots of at least `need` bytes. With a budget (`slot_cap`,
    /// from [`budget_slot_bytes`]) the ring made at init already has slots of that size and
    /// never grows (pieces are cut to fit it).
    pub fn for_call(
        &self,
        need: usize,
        depth: usize,
        slot_cap: Option<usize>,
        capturing: bool,
        ctx: &Ctx,
        comms: &[Arc<Communicator>],
    ) -> Result<Arc<Ring>> {
        let mut current = self.ring.lock();
        let have = current.as_ref().map_or(0, |r| r.slot_bytes);
        if have < need {
            if capturing {
                return Err(Error::invalid(format!(
                    "a captured GPU network call needs staging pieces of {need} bytes but the communicator's ring has {have}: make one call of that size before capturing (CUDA allows no pinned allocation during capture)"
                )));
            }
            let bytes = match slot_cap {
                Some(cap) => cap.max(need.next_power_of_two()),
                None => need.next_power_of_two().max(FIRST_SLOT_BYTES),
            };
            let ring = Arc::new(Ring::new(ctx, bytes, depth, comms)?);
            if let Some(old) = current.replace(ring) {
                self.retired.lock().push(old);
            }
        }
        let ring = (current.clone()).ok_or_else(|| Error::invalid("gpu net: no staging ring"))?;
        ring.register_with(comms)?;
        Ok(ring)
    }

    /// Waits up to `within` for the GPU to finish the last call staged through these rings
    /// (every earlier one ran before it); false at the deadline.
    pub fn settled(&self, ctx: &Ctx, within: Duration) -> bool {
        self.order.lock().settled(|| ctx.bind(), within)
    }

    /// Runs `enqueue` (a call's work on `stream`, not being captured) after the
    /// communicator's previous call, whatever its stream, so the two never share the ring.
    ///
    /// # Safety
    /// `stream` is a live stream of `ctx`, not being captured.
    pub unsafe fn in_order<T>(
        &self,
        ctx: &Ctx,
        stream: usize,
        enqueue: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        // SAFETY: the caller's contract.
        unsafe { self.order.lock().run_eager(|| ctx.bind(), stream, enqueue) }
    }
}

#[cfg(test)]
mod tests {
    use super::budget_slot_bytes;

    #[test]
    fn a_budget_gives_page_multiple_slots_that_fit_it() {
        assert_eq!(budget_slot_bytes(0, 8), None);
        // 64 MiB at depth 8: 8 send and 8 receive slots of 4 MiB.
        assert_eq!(budget_slot_bytes(64 << 20, 8), Some(4 << 20));
        // The default, 28 MiB: slots of 1.75 MiB.
        assert_eq!(budget_slot_bytes(28 << 20, 8), Some(1792 << 10));
        // Not a multiple of 4 KiB a slot: rounded down, so the ring stays within the budget.
        assert_eq!(budget_slot_bytes((100 << 20) + 5000, 8), Some(6400 << 10));
        // Tiny budgets: 4 KiB slots at least.
        assert_eq!(budget_slot_bytes(1000, 8), Some(4096));
        for (budget, depth) in [
            (64usize << 20, 8usize),
            (100 << 20, 8),
            (48 << 20, 3),
            (7 << 20, 16),
            (28 << 20, 8),
        ] {
            let s = budget_slot_bytes(budget, depth).unwrap_or(0);
            assert!(
                s.is_multiple_of(4096) && s > 0 && 2 * depth * s <= budget,
                "{budget} {depth}: {s}"
            );
        }
    }
}
