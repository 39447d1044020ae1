//! Flag slots: the words a caller's stream and the progress thread hand one piece of a call
//! over with.
//!
//! Per piece the stream writes `start = 1` (after copying the piece into its stage), waits for
//! `done == 1`, writes `done = 0` (and copies the result back); the progress thread sees
//! `start == 1`, clears it, runs the piece and writes `done = 1`. The same toggles work for a
//! call captured in a CUDA graph (the graph writes constants) at every launch. An eager
//! piece's slot is reusable once `done` reads 0 again (the stream passed it); a captured
//! piece's slot is held until its graph is destroyed.

use parking_lot::Mutex;
use railcc_core::{Error, ErrorKind, Result};
use railcc_transport_nvlink::hostsync::{Ctx, Flags};
use std::time::{Duration, Instant};

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
}

impl Slots {
    pub fn new(ctx: &Ctx, cap: usize) -> Result<Slots> {
        Ok(Slots {
            flags: Flags::new(ctx, cap * STRIDE)?,
            cap,
            state: Mutex::new(State::default()),
        })
    }

    pub fn start(i: usize) -> usize {
        i * STRIDE
    }

    pub fn done(i: usize) -> usize {
        i * STRIDE + DONE
    }

    fn try_take(&self) -> Option<usize> {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        let flags = &self.flags;
        // Slots the stream has passed (their `done` back to 0) are free again.
        st.draining.retain(|&i| {
            let passed = flags.load(Self::done(i)) == 0;
            if passed {
                st.free.push(i);
            }
            !passed
        });
        if let Some(i) = st.free.pop() {
            return Some(i);
        }
        if st.next < self.cap {
            st.next += 1;
            return Some(st.next - 1);
        }
        None
    }

    /// A slot for a new piece. When every slot is in use and `wait` is set (an eager call),
    /// waits for the streams to pass earlier pieces, until `deadline` or `broken` says stop.
    pub fn take(
        &self,
        wait: bool,
        broken: &dyn Fn() -> Option<Error>,
        deadline: Duration,
    ) -> Result<usize> {
        let t0 = Instant::now();
        loop {
            if let Some(i) = self.try_take() {
                return Ok(i);
            }
            if let Some(e) = broken() {
                return Err(e);
            }
            if !wait {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "more than {} pieces of GPU network calls held by live CUDA graphs and calls in flight",
                        self.cap
                    ),
                ));
            }
            if t0.elapsed() > deadline {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "{} pieces of GPU network calls still in flight after {deadline:?}",
                        self.cap
                    ),
                ));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// The piece in slot `i` is over on the host side (its `done` was set).
    pub fn give_back(&self, i: usize) {
        self.state.lock().draining.push(i);
    }
}
