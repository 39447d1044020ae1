//! A large call's staging kernel held back until its caller returns
//! (`RAILCC_GPU_NET_GATE_PIECES`, an experiment for issue 31's idle return): on an idle stream
//! a kernel that starts while its own launch call still runs made that call slower (H100,
//! `bench/experiments/launch_cost.cu`: 15.6 us against a no-op's 6.8; behind a busy stream
//! 4), also when it only spun first. The call's stream first waits for a mapped host word
//! that the caller writes once the launch, the ordering marker and the hand-off are done.

use parking_lot::Mutex;
use railcc_core::Result;
use railcc_cuda::gpu::Stream;
use railcc_cuda::hostsync::{Ctx, Flags};

pub struct Gate {
    word: Flags,
    /// Calls of at least this many pieces are held.
    min_pieces: usize,
    /// The last value handed out and the last released (the word's value).
    state: Mutex<(u32, u32)>,
}

impl Gate {
    pub fn new(ctx: &Ctx, min_pieces: usize) -> Result<Gate> {
        Ok(Gate {
            word: Flags::new(ctx, 1)?,
            min_pieces: min_pieces.max(1),
            state: Mutex::new((0, 0)),
        })
    }

    pub fn holds(&self, pieces: usize) -> bool {
        pieces >= self.min_pieces
    }

    /// Puts "wait until the word reaches v" on `stream` and returns v, which the caller must
    /// [`Gate::release`] whatever happens next (a failed enqueue is released here).
    ///
    /// # Safety
    /// `stream` is a live stream of the context the gate was made in, or null.
    pub unsafe fn hold(&self, stream: Stream) -> Result<u32> {
        let v = {
            let mut s = self.state.lock();
            s.0 = s.0.wrapping_add(1);
            s.0
        };
        // SAFETY: the caller's contract; word 0 exists.
        let r = unsafe { self.word.wait_geq_on(stream as _, 0, v) };
        if r.is_err() {
            self.release(v);
        }
        r.map(|_| v)
    }

    /// Lets every stream held at v or before go (the stream's wait compares cyclically, so a
    /// release of an earlier value after a later one is dropped: the word never goes back).
    pub fn release(&self, v: u32) {
        let mut s = self.state.lock();
        if (v.wrapping_sub(s.1) as i32) > 0 {
            s.1 = v;
            self.word.store(0, v);
        }
    }
}
