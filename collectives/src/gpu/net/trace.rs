//! Where a GPU network communicator's time goes (`RAILCC_GPU_NET_TRACE=1`), printed to stderr
//! when it closes: how long calls took to enqueue, how long each piece's host part ran, and
//! the stream's turnaround (from one piece's `done` to the next piece's `start` seen).

use parking_lot::Mutex;
use std::time::{Duration, Instant};

#[derive(Default)]
pub struct Trace {
    on: bool,
    rank: usize,
    samples: Mutex<Samples>,
}

#[derive(Default)]
struct Samples {
    enqueue: Vec<u32>,
    stream_ops: Vec<u32>,
    /// Of the stream operations, the staging kernel's launches alone (cuLaunchKernel).
    launches: Vec<u32>,
    run: Vec<u32>,
    turn: Vec<u32>,
    last_done: Option<Instant>,
}

/// Turnarounds longer than this are the caller not enqueueing, not the stream.
const TURN_MAX: Duration = Duration::from_millis(1);
/// Samples kept per kind (a long job stops recording, it never grows without bound).
const KEEP: usize = 1 << 20;

fn us(d: Duration) -> u32 {
    d.as_micros().min(u32::MAX as u128) as u32
}

impl Trace {
    pub fn new(on: bool, rank: usize) -> Trace {
        Trace {
            on,
            rank,
            samples: Mutex::default(),
        }
    }

    pub fn on(&self) -> bool {
        self.on
    }

    /// A call took `total` to enqueue, `ops` of it putting operations on the stream.
    /// A staging-kernel call's time in cuLaunchKernel.
    pub fn launched(&self, d: Duration) {
        if self.on {
            let mut s = self.samples.lock();
            if s.launches.len() < KEEP {
                s.launches.push(us(d));
            }
        }
    }

    pub fn enqueued(&self, total: Duration, ops: Duration) {
        if self.on {
            let mut s = self.samples.lock();
            if s.enqueue.len() < KEEP {
                s.enqueue.push(us(total));
                s.stream_ops.push(us(ops));
            }
        }
    }

    /// A piece was seen started at `seen` and finished now.
    pub fn piece(&self, seen: Instant) {
        if self.on {
            let now = Instant::now();
            let mut s = self.samples.lock();
            if s.run.len() < KEEP {
                s.run.push(us(now - seen));
                if let Some(t) = s.last_done.filter(|t| *t < seen && seen - *t < TURN_MAX) {
                    s.turn.push(us(seen - t));
                }
            }
            s.last_done = Some(now);
        }
    }

    pub fn report(&self) {
        if !self.on {
            return;
        }
        let mut guard = self.samples.lock();
        let s = &mut *guard;
        let mut line = format!(
            "railcc: rank {} gpu net trace (us, median/p90/max):",
            self.rank
        );
        for (name, v) in [
            ("enqueue", &mut s.enqueue),
            ("stream ops", &mut s.stream_ops),
            ("of which launches", &mut s.launches),
            ("piece host part", &mut s.run),
            ("stream turnaround", &mut s.turn),
        ] {
            line += &railcc_transport_nvlink::host_trace::summary(name, v);
        }
        eprintln!("{line}");
    }
}
