//! Staging rings: per caller stream, `depth` slots of pinned send and receive staging
//! (`RAILCC_GPU_NET_RING`). The stream's own copies fill and drain them in stream order
//! (piece k uses slot k mod depth),
//! so no other stream's work is ever waited for: a stream waiting on a flag can block the
//! hardware queue it shares with other streams, and copies on those would never run.

use crate::comm::Communicator;
use crate::regions::RegionId;
use parking_lot::Mutex;
use railcc_core::{Error, Result};
use railcc_cuda::hostsync::Ctx;
use railcc_cuda::staging::PinnedBuf;
use std::collections::HashMap;
use std::sync::Arc;

/// A new stream's ring holds pieces of this many bytes (a ring cannot grow while the stream
/// is being captured: CUDA refuses pinned allocations then), or of the budget's slot size.
const FIRST_SLOT_BYTES: usize = 4 << 20;

/// The slot size a staging budget of `budget` bytes per stream allows at ring depth `depth`
/// (send and receive slots): a power of two, at least 4 KiB; None without a budget.
pub fn budget_slot_bytes(budget: usize, depth: usize) -> Option<usize> {
    if budget == 0 {
        return None;
    }
    let per = budget / (2 * depth.max(1));
    let pow = if per.is_power_of_two() {
        per
    } else {
        per.next_power_of_two() / 2
    };
    Some(pow.max(4096))
}

pub struct Ring {
    pub slot_bytes: usize,
    /// Pieces in flight per stream: the copy of piece k+depth waits for piece k to be done.
    pub depth: usize,
    send: Vec<PinnedBuf>,
    recv: Vec<PinnedBuf>,
    /// The slots' addresses in the GPU's address space (the staging kernel's).
    pub send_dev: Vec<u64>,
    pub recv_dev: Vec<u64>,
    /// Registrations with the channels of every engine that uses the ring (a communicator's
    /// flat engine and its hierarchy's cross engine share the rings: one budget a stream).
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

#[derive(Default)]
pub struct Rings {
    by_stream: Mutex<HashMap<usize, Arc<Ring>>>,
    /// A ring made at init (under a budget, whose slot size is known then): the first stream
    /// takes it, so its first call allocates and registers nothing (pinning takes
    /// milliseconds, which an overlapped step would wait for), and may be captured.
    spare: Mutex<Option<Arc<Ring>>>,
    /// Rings outgrown: graphs and calls in flight may still use them, and freeing pinned
    /// memory waits for the whole GPU; freed with the engine.
    retired: Mutex<Vec<Arc<Ring>>>,
}

impl Rings {
    /// Rings whose first stream takes `spare`.
    pub fn with_spare(spare: Ring) -> Rings {
        Rings {
            spare: Mutex::new(Some(Arc::new(spare))),
            ..Rings::default()
        }
    }

    /// Registers every ring made so far with `comms`: another engine of the same GPU that
    /// shares these rings, at its init (so its first call registers nothing).
    pub fn register_with(&self, comms: &[Arc<Communicator>]) -> Result<()> {
        let spare = self.spare.lock().clone();
        let live: Vec<Arc<Ring>> = self.by_stream.lock().values().cloned().collect();
        spare
            .iter()
            .chain(&live)
            .try_for_each(|r| r.register_with(comms))
    }

    /// `stream`'s ring, with slots of at least `need` bytes.
    /// With a budget (`slot_cap`, from [`budget_slot_bytes`]), the first ring already has
    /// slots of that size and never grows (pieces are cut to fit it).
    #[allow(clippy::too_many_arguments)]
    pub fn for_stream(
        &self,
        stream: usize,
        need: usize,
        depth: usize,
        slot_cap: Option<usize>,
        capturing: bool,
        ctx: &Ctx,
        comms: &[Arc<Communicator>],
    ) -> Result<Arc<Ring>> {
        let mut m = self.by_stream.lock();
        let have = m.get(&stream).map_or(0, |r| r.slot_bytes);
        if let Some(r) = m.get(&stream).filter(|r| r.slot_bytes >= need) {
            r.register_with(comms)?;
            return Ok(r.clone());
        }
        if have == 0 {
            let mut spare = self.spare.lock();
            if let Some(r) = spare.take_if(|r| r.slot_bytes >= need && r.depth == depth) {
                r.register_with(comms)?;
                m.insert(stream, r.clone());
                return Ok(r);
            }
        }
        if capturing && have < need {
            return Err(Error::invalid(format!(
                "a captured GPU network call needs staging pieces of {need} bytes but this stream has {have}: make one call of that size on this stream before capturing (CUDA allows no pinned allocation during capture)"
            )));
        }
        let bytes = match slot_cap {
            Some(cap) => cap.max(need.next_power_of_two()),
            None => need.next_power_of_two().max(FIRST_SLOT_BYTES),
        };
        let ring = Arc::new(Ring::new(ctx, bytes, depth, comms)?);
        if let Some(old) = m.insert(stream, ring.clone()) {
            self.retired.lock().push(old);
        }
        Ok(ring)
    }
}

#[cfg(test)]
mod tests {
    use super::budget_slot_bytes;

    #[test]
    fn a_budget_gives_power_of_two_slots_that_fit_it() {
        assert_eq!(budget_slot_bytes(0, 8), None);
        // 64 MiB at depth 8: 8 send and 8 receive slots of 4 MiB.
        assert_eq!(budget_slot_bytes(64 << 20, 8), Some(4 << 20));
        // Not a power of two: rounded down, so the ring stays within the budget.
        assert_eq!(budget_slot_bytes(100 << 20, 8), Some(4 << 20));
        assert_eq!(budget_slot_bytes(48 << 20, 3), Some(8 << 20));
        // Tiny budgets: 4 KiB slots at least.
        assert_eq!(budget_slot_bytes(1000, 8), Some(4096));
        for (budget, depth) in [
            (64usize << 20, 8usize),
            (100 << 20, 8),
            (48 << 20, 3),
            (7 << 20, 16),
        ] {
            let s = budget_slot_bytes(budget, depth).unwrap_or(0);
            assert!(
                s.is_power_of_two() && 2 * depth * s <= budget,
                "{budget} {depth}: {s}"
            );
        }
    }
}
