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

/// The staging kernel's stamps (`netcopy::Params::stamps`: per launch, `per` words of the GPU
/// timer's low 32 bits, at entry, block 0's pieces staged, its first piece done, its exit) as
/// "; name median/p90 us" parts: where a small call's time goes on the GPU between the host's
/// `start` and `done`. Launch k sits at entry k modulo the table, so neighbours in the table
/// are launches one after another: the gap is from one's exit to the next one's entry (up to
/// 1 ms; longer is the caller not enqueueing).
pub fn stamp_summary(words: &[u32], per: usize) -> String {
    const NEIGHBOUR: usize = 1;
    let per = per.max(4);
    let at = |i: usize| words.get(i * per..i * per + 4);
    let launches: Vec<(usize, [u32; 4])> = (0..words.len() / per)
        .filter_map(|i| {
            let w = at(i)?;
            w.iter()
                .all(|&x| x != 0)
                .then(|| (i, [w[0], w[1], w[2], w[3]]))
        })
        .collect();
    let ns = |a: u32, b: u32| b.wrapping_sub(a) as i32;
    let mut parts: [(&str, Vec<u32>); 4] = [
        ("copy in", Vec::new()),
        ("wait for done", Vec::new()),
        ("back and exit", Vec::new()),
        ("gap after the launch before", Vec::new()),
    ];
    for (k, (i, t)) in launches.iter().enumerate() {
        for (part, (a, b)) in [(t[0], t[1]), (t[1], t[2]), (t[2], t[3])]
            .iter()
            .enumerate()
        {
            if let Ok(d) = u32::try_from(ns(*a, *b)) {
                parts[part].1.push(d);
            }
        }
        if let Some((j, u)) = k.checked_sub(1).and_then(|p| launches.get(p)) {
            let gap = ns(u[3], t[0]);
            if i - j <= NEIGHBOUR && (0..1_000_000).contains(&gap) {
                parts[3].1.push(gap as u32);
            }
        }
    }
    let mut out = format!(" (us, median/p90; {} launches):", launches.len());
    for (name, v) in parts.iter_mut() {
        v.sort_unstable();
        let q = |f: f64| v.get(((v.len() as f64 * f) as usize).min(v.len().saturating_sub(1)));
        match (q(0.5), q(0.9)) {
            (Some(m), Some(p)) => {
                out += &format!(" {name} {:.1}/{:.1};", *m as f64 / 1e3, *p as f64 / 1e3)
            }
            _ => out += &format!(" {name} -;"),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::stamp_summary;

    #[test]
    fn stamps_give_each_step_and_the_gap_between_launches() {
        // Launch 0 at index 3: 10 us in, 30 us waiting, 5 us back; launch 1 at index 4, 7 us
        // after launch 0's exit; index 6 only half written (skipped).
        let mut w = vec![0u32; 8 * 4];
        let t0 = u32::MAX - 20_000; // the timer's low bits wrap inside launch 0
        w[12..16].copy_from_slice(&[
            t0,
            t0.wrapping_add(10_000),
            t0.wrapping_add(40_000),
            t0.wrapping_add(45_000),
        ]);
        let t1 = t0.wrapping_add(52_000);
        w[16..20].copy_from_slice(&[
            t1,
            t1.wrapping_add(12_000),
            t1.wrapping_add(32_000),
            t1.wrapping_add(36_000),
        ]);
        w[24] = 5;
        let s = stamp_summary(&w, 4);
        assert!(s.contains("2 launches"), "{s}");
        assert!(s.contains("copy in 12.0/12.0"), "{s}");
        assert!(s.contains("back and exit 5.0/5.0"), "{s}");
        assert!(s.contains("gap after the launch before 7.0/7.0"), "{s}");
    }
}
