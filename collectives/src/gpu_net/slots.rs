//! Flag slots: the words a caller's stream and the progress thread hand a call over with,
//! and the small-message staging a slot may own.
//!
//! Per call the stream writes `start = 1`, waits for `done == 1`, then writes `done = 0`; the
//! progress thread sees `start == 1`, clears it, runs the call and writes `done = 1`. The same
//! toggles work for a call captured in a CUDA graph (the graph writes constants) on every
//! launch. An eager call's slot is reusable once `done` reads 0 again (the stream passed it);
//! a captured call's slot is held until its graph is destroyed.

use crate::comm::Communicator;
use crate::regions::RegionId;
use parking_lot::Mutex;
use railcc_core::{Error, ErrorKind, Result};
use railcc_transport_nvlink::hostsync::{Ctx, Flags};
use railcc_transport_nvlink::staging::PinnedBuf;
use std::sync::Arc;

/// Words per slot: `start` and `done` on separate 64-byte lines.
const STRIDE: usize = 32;
const DONE: usize = 16;

pub struct Slots {
    pub flags: Flags,
    cap: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    free: Vec<usize>,
    /// Slots whose `done` the progress thread set; free again once the stream cleared it.
    draining: Vec<usize>,
    next: usize,
    stages: Vec<Option<Arc<SmallStage>>>,
    /// Stages made ahead, for calls captured into graphs: pinned memory cannot be allocated
    /// while a stream is being captured (in CUDA's global capture mode).
    pool: Vec<Arc<SmallStage>>,
}

impl Slots {
    pub fn new(ctx: &Ctx, cap: usize) -> Result<Slots> {
        Ok(Slots {
            flags: Flags::new(ctx, cap * STRIDE)?,
            cap,
            state: Mutex::new(State {
                stages: vec![None; cap],
                ..State::default()
            }),
        })
    }

    pub fn start(i: usize) -> usize {
        i * STRIDE
    }

    pub fn done(i: usize) -> usize {
        i * STRIDE + DONE
    }

    /// A slot for a new call.
    pub fn take(&self) -> Result<usize> {
        let mut st = self.state.lock();
        let flags = &self.flags;
        let (ready, still): (Vec<usize>, Vec<usize>) = st
            .draining
            .iter()
            .partition(|&&i| flags.load(Self::done(i)) == 0);
        st.draining = still;
        st.free.extend(ready);
        if let Some(i) = st.free.pop() {
            return Ok(i);
        }
        if st.next < self.cap {
            st.next += 1;
            return Ok(st.next - 1);
        }
        Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "more than {} GPU network calls in flight or held by live CUDA graphs",
                self.cap
            ),
        ))
    }

    /// The call in slot `i` is over on the host side (its `done` was set).
    pub fn give_back(&self, i: usize) {
        self.state.lock().draining.push(i);
    }

    /// Makes `n` stages ahead of use.
    pub fn prepare(
        &self,
        n: usize,
        ctx: &Ctx,
        bytes: usize,
        comm: &Arc<Communicator>,
    ) -> Result<()> {
        for _ in 0..n {
            let s = Arc::new(SmallStage::new(ctx, bytes, comm.clone())?);
            self.state.lock().pool.push(s);
        }
        Ok(())
    }

    /// Slot `i`'s small-message staging: its own, one made ahead, or a new one (not while
    /// `capturing`: then None, and the call takes the channels' staging instead).
    pub fn stage(
        &self,
        i: usize,
        ctx: &Ctx,
        bytes: usize,
        comm: &Arc<Communicator>,
        capturing: bool,
    ) -> Result<Option<Arc<SmallStage>>> {
        let mut st = self.state.lock();
        if let Some(Some(s)) = st.stages.get(i) {
            return Ok(Some(s.clone()));
        }
        let s = match st.pool.pop() {
            Some(s) => s,
            None if capturing => return Ok(None),
            None => Arc::new(SmallStage::new(ctx, bytes, comm.clone())?),
        };
        if let Some(x) = st.stages.get_mut(i) {
            *x = Some(s.clone());
        }
        Ok(Some(s))
    }
}

/// Pinned send and receive staging of one small call, registered with channel 0.
pub struct SmallStage {
    pub send: PinnedBuf,
    pub recv: PinnedBuf,
    regions: Vec<RegionId>,
    comm: Arc<Communicator>,
}

// SAFETY: the pinned buffers are plain host memory; the slot protocol gives one call at a time
// access to them (the stream before `start`, the host between `start` and `done`, the stream
// after), and the context handle only frees them.
unsafe impl Sync for SmallStage {}

impl SmallStage {
    fn new(ctx: &Ctx, bytes: usize, comm: Arc<Communicator>) -> Result<SmallStage> {
        ctx.bind()?;
        let send = PinnedBuf::in_current(ctx.ctx, bytes)?;
        let recv = PinnedBuf::in_current(ctx.ctx, bytes)?;
        let mut s = SmallStage {
            send,
            recv,
            regions: Vec::new(),
            comm,
        };
        for (p, n) in [
            (s.send.as_ptr(), s.send.len()),
            (s.recv.as_ptr(), s.recv.len()),
        ] {
            // SAFETY: the pinned buffers live in `s` until Drop deregisters them.
            let id = unsafe { s.comm.register(p, n) }?;
            s.regions.push(id);
        }
        Ok(s)
    }
}

impl Drop for SmallStage {
    fn drop(&mut self) {
        for id in self.regions.drain(..) {
            if let Err(e) = self.comm.deregister(id) {
                tracing::debug!("gpu net: deregister small stage: {e}");
            }
        }
    }
}
