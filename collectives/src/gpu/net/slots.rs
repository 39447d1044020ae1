//! Flag slots: the words a caller's stream and the progress thread hand one piece of a call
//! over with.
//!
//! An eager piece gets a token, the slot's use count (never 0): the stream writes
//! `start = token` after copying the piece into its stage and waits for `done >= token`
//! (a cyclic comparison, so tokens may wrap); the progress thread sees `start == token`, runs
//! the piece and writes `done = token`. A slot is reusable as soon as the progress thread has
//! finished with it: a stream still to pass an older wait passes it with any later token, so
//! no clearing operation is needed on the stream.
//!
//! A piece captured in a CUDA graph writes constants at every launch, so it uses toggles: the
//! stream writes `start = 1`, waits for `done == 1` and writes `done = 0`. Captured slots come
//! from their own pool and are held until the graph is destroyed.

use parking_lot::Mutex;
use railcc_core::{Error, ErrorKind, Result};
use railcc_cuda::hostsync::{Ctx, Flags};
use std::time::{Duration, Instant};

/// Words per slot: `start` and `done` on separate 64-byte lines.
const STRIDE: usize = 32;
const DONE: usize = 16;
/// The token of every captured piece.
pub const CAPTURED_TOKEN: u32 = 1;

pub struct Slots {
    pub flags: Flags,
    cap: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    eager: Vec<usize>,
    captured: Vec<usize>,
    /// Per eager slot: its last token.
    tokens: Vec<u32>,
    next: usize,
}

/// A slot taken for one piece, and the value its `start` and `done` carry.
#[derive(Clone, Copy, Debug)]
pub struct Taken {
    pub slot: usize,
    pub token: u32,
}

impl Slots {
    pub fn new(ctx: &Ctx, cap: usize) -> Result<Slots> {
        Ok(Slots {
            flags: Flags::new(ctx, cap * STRIDE)?,
            cap,
            state: Mutex::new(State {
                tokens: vec![0; cap],
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

    fn try_take(&self, captured: bool) -> Option<Taken> {
        let mut st = self.state.lock();
        let pool = if captured {
            &mut st.captured
        } else {
            &mut st.eager
        };
        let slot = match pool.pop() {
            Some(i) => i,
            None if st.next < self.cap => {
                st.next += 1;
                st.next - 1
            }
            None => return None,
        };
        if captured {
            return Some(Taken {
                slot,
                token: CAPTURED_TOKEN,
            });
        }
        let t = &mut st.tokens[slot];
        *t = t.wrapping_add(1).max(1);
        Some(Taken { slot, token: *t })
    }

    /// A slot for a new piece. When every slot is in use and `wait` is set (an eager call),
    /// waits for the progress thread to finish earlier pieces, until `deadline` or `broken`
    /// says stop.
    pub fn take(
        &self,
        captured: bool,
        broken: &dyn Fn() -> Option<Error>,
        deadline: Duration,
    ) -> Result<Taken> {
        let t0 = Instant::now();
        loop {
            if let Some(t) = self.try_take(captured) {
                return Ok(t);
            }
            if let Some(e) = broken() {
                return Err(e);
            }
            if captured {
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

    /// The eager piece in slot `i` is over on the host side (its `done` was set), or was
    /// never enqueued.
    pub fn give_back(&self, i: usize) {
        self.state.lock().eager.push(i);
    }

    /// The graph holding the captured piece in slot `i` is gone: no stream reaches it again.
    pub fn give_back_captured(&self, i: usize) {
        self.flags.store(Self::start(i), 0);
        self.flags.store(Self::done(i), 0);
        self.state.lock().captured.push(i);
    }
}
