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

impl State {
    /// `n` slots from `captured`'s pool (then never used ones, up to `cap`), or none.
    fn take(&mut self, n: usize, captured: bool, cap: usize) -> Option<Vec<Taken>> {
        let pool = if captured {
            &mut self.captured
        } else {
            &mut self.eager
        };
        let fresh = n.saturating_sub(pool.len());
        if self.next + fresh > cap {
            return None;
        }
        let from_pool = pool.len() - (n - fresh);
        let mut out: Vec<usize> = pool.drain(from_pool..).rev().collect();
        out.extend(self.next..self.next + fresh);
        self.next += fresh;
        Some(
            out.into_iter()
                .map(|slot| {
                    if captured {
                        return Taken {
                            slot,
                            token: CAPTURED_TOKEN,
                        };
                    }
                    let t = &mut self.tokens[slot];
                    *t = t.wrapping_add(1).max(1);
                    Taken { slot, token: *t }
                })
                .collect(),
        )
    }
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

    /// Slots for a call's `n` pieces, taken together (one lock for the whole call: a large
    /// call has about a hundred pieces and the caller waits for each lock). When fewer are
    /// free and the call is eager, waits for the progress thread to finish earlier pieces,
    /// until `deadline` or `broken` says stop.
    pub fn take(
        &self,
        n: usize,
        captured: bool,
        broken: &dyn Fn() -> Option<Error>,
        deadline: Duration,
    ) -> Result<Vec<Taken>> {
        if n > self.cap {
            return Err(Error::invalid(format!(
                "a GPU network call of {n} pieces: more than the engine's {} flag slots",
                self.cap
            )));
        }
        let t0 = Instant::now();
        loop {
            if let Some(t) = self.state.lock().take(n, captured, self.cap) {
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
                        "a GPU network call of {n} pieces found fewer than {n} of the engine's {} flag slots free for {deadline:?}: earlier calls' pieces still in flight",
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

#[cfg(test)]
mod tests {
    use super::{State, CAPTURED_TOKEN};

    fn state(cap: usize) -> State {
        State {
            tokens: vec![0; cap],
            ..State::default()
        }
    }

    #[test]
    fn a_call_takes_its_slots_together_or_none() {
        let mut st = state(8);
        let a = st.take(5, false, 8).unwrap();
        assert_eq!(
            a.iter().map(|t| t.slot).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4]
        );
        assert!(a.iter().all(|t| t.token == 1));
        // 3 never used are left: a call of 4 gets none, and takes nothing.
        assert!(st.take(4, false, 8).is_none());
        assert_eq!(st.next, 5);
        // Given back slots first (latest first), then never used ones; tokens count uses.
        st.eager.extend([1, 3]);
        let b = st.take(4, false, 8).unwrap();
        assert_eq!(b.iter().map(|t| t.slot).collect::<Vec<_>>(), [3, 1, 5, 6]);
        assert_eq!(b.iter().map(|t| t.token).collect::<Vec<_>>(), [2, 2, 1, 1]);
        assert!(st.eager.is_empty());
        // A pool larger than the call: its latest slots go, the rest stay.
        st.eager.extend([0, 2, 4]);
        let c = st.take(2, false, 8).unwrap();
        assert_eq!(c.iter().map(|t| t.slot).collect::<Vec<_>>(), [4, 2]);
        assert_eq!(st.eager, [0]);
        // Captured pieces: their own pool, the constant token, the same fresh slots.
        st.captured.push(6);
        let d = st.take(2, true, 8).unwrap();
        assert_eq!(d.iter().map(|t| t.slot).collect::<Vec<_>>(), [6, 7]);
        assert!(d.iter().all(|t| t.token == CAPTURED_TOKEN));
        assert!(st.take(1, true, 8).is_none());
        // Slots are reused only after they were given back: 13 taken, 8 distinct.
        let mut all: Vec<usize> = [a, b, c, d].iter().flatten().map(|t| t.slot).collect();
        all.sort_unstable();
        let n = all.len();
        all.dedup();
        assert_eq!(n, 5 + 4 + 2 + 2);
        assert_eq!(all.len(), 8);
    }
}
