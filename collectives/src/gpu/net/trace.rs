//! Where a GPU network communicator's time goes (`RAILCC_GPU_NET_TRACE=1`), printed to stderr
//! when it closes: how long calls took to enqueue, how long each piece's host part ran, and
//! the stream's turnaround (from one piece's `done` to the next piece's `start` seen). At 2,
//! also the first [`ROWS`] calls one line each (which of them came to an idle stream: the
//! time since the call before returned). A line is an engine call (a hierarchical call's
//! network steps are a line each) and takes the steps recorded since the last line: with two
//! threads enqueueing at once (NCCL does not allow it on one communicator) lines mix.

use parking_lot::Mutex;
use std::time::{Duration, Instant};

#[derive(Default)]
pub struct Trace {
    on: bool,
    /// Each call's own line too (`RAILCC_GPU_NET_TRACE=2`).
    rows: bool,
    rank: usize,
    samples: Mutex<Samples>,
}

#[derive(Default)]
struct Samples {
    enqueue: Vec<u32>,
    /// Of the enqueue, what comes before the stream operations: checking the call, cutting
    /// it, taking its flag slots and the ring.
    slots: Vec<u32>,
    stream_ops: Vec<u32>,
    /// Of the stream operations, the staging kernel's launches alone (cuLaunchKernel).
    launches: Vec<u32>,
    run: Vec<u32>,
    turn: Vec<u32>,
    last_done: Option<Instant>,
    /// Named steps of an enqueue (`Trace::step`), in the order first seen.
    steps: Vec<(&'static str, Vec<u32>)>,
    /// With rows: this call's steps so far, the first calls' lines, and when the last
    /// enqueue returned.
    pending: Vec<(&'static str, u32)>,
    lines: Vec<String>,
    last_return: Option<Instant>,
}

/// Calls given a line of their own.
const ROWS: usize = 40;

/// Turnarounds longer than this are the caller not enqueueing, not the stream.
const TURN_MAX: Duration = Duration::from_millis(1);
/// Samples kept per kind (a long job stops recording, it never grows without bound).
const KEEP: usize = 1 << 20;

fn us(d: Duration) -> u32 {
    d.as_micros().min(u32::MAX as u128) as u32
}

impl Trace {
    /// `level` 0: off; 1: summaries; 2: and the first calls' lines.
    pub fn new(level: u8, rank: usize) -> Trace {
        Trace {
            on: level > 0,
            rows: level > 1,
            rank,
            samples: Mutex::default(),
        }
    }

    pub fn on(&self) -> bool {
        self.on
    }

    /// One named step of an enqueue took `d` (reported after the enqueue's own figures).
    pub fn step(&self, name: &'static str, d: Duration) {
        if self.on {
            let mut s = self.samples.lock();
            let i = match s.steps.iter().position(|(n, _)| *n == name) {
                Some(i) => i,
                None => {
                    s.steps.push((name, Vec::new()));
                    s.steps.len() - 1
                }
            };
            let v = &mut s.steps[i].1;
            if v.len() < KEEP {
                v.push(us(d));
            }
            if self.rows && s.lines.len() < ROWS {
                s.pending.push((name, us(d)));
            }
        }
    }

    /// A staging-kernel call's time in cuLaunchKernel.
    pub fn launched(&self, d: Duration) {
        if self.on {
            let mut s = self.samples.lock();
            if s.launches.len() < KEEP {
                s.launches.push(us(d));
            }
            if self.rows && s.lines.len() < ROWS {
                s.pending.push(("launches", us(d)));
            }
        }
    }

    /// A call took `total` to enqueue: `slots` of it before the stream operations (checking
    /// and cutting the call, taking flag slots and the ring), `ops` putting operations on the
    /// stream.
    pub fn enqueued(&self, total: Duration, slots: Duration, ops: Duration) {
        if self.on {
            let mut s = self.samples.lock();
            if s.enqueue.len() < KEEP {
                s.enqueue.push(us(total));
                s.slots.push(us(slots));
                s.stream_ops.push(us(ops));
            }
            if self.rows && s.lines.len() < ROWS {
                // The time since the call before returned, up to this call's start.
                let now = Instant::now();
                let start = now.checked_sub(total);
                let idle =
                    (s.last_return.zip(start)).map(|(t, b)| us(b.saturating_duration_since(t)));
                let mut line = format!(
                    "call {}: after {} us; enqueue {} = slots {} + ops {} + hand;",
                    s.lines.len(),
                    idle.map_or("-".into(), |u| u.to_string()),
                    us(total),
                    us(slots),
                    us(ops)
                );
                for (name, u) in s.pending.drain(..) {
                    line += &format!(" {name} {u};");
                }
                s.lines.push(line);
                s.last_return = Some(now);
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
            ("of which slots", &mut s.slots),
            ("stream ops", &mut s.stream_ops),
            ("of which launches", &mut s.launches),
            ("piece host part", &mut s.run),
            ("stream turnaround", &mut s.turn),
        ] {
            line += &railcc_transport_nvlink::host_trace::summary(name, v);
        }
        for (name, v) in s.steps.iter_mut() {
            line += &railcc_transport_nvlink::host_trace::summary(name, v);
        }
        eprintln!("{line}");
        for l in &s.lines {
            eprintln!("railcc: rank {} gpu net {l}", self.rank);
        }
    }
}

/// The staging kernel's stamps (`netcopy::Header::stamps`: per launch, `per` words of the GPU
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
    use super::{stamp_summary, Trace};
    use std::time::Duration;

    #[test]
    fn level_two_gives_each_call_its_steps() {
        let us = Duration::from_micros;
        for level in [1, 2] {
            let t = Trace::new(level, 0);
            for call in 0..2u64 {
                t.step("cut", us(3 + call));
                t.launched(us(5));
                t.step("hand", us(1));
                t.enqueued(us(10 + call), us(4), us(6));
            }
            let lines = t.samples.lock().lines.clone();
            if level == 1 {
                assert!(lines.is_empty(), "{lines:?}");
                continue;
            }
            assert_eq!(lines.len(), 2, "{lines:?}");
            assert_eq!(
                lines[0],
                "call 0: after - us; enqueue 10 = slots 4 + ops 6 + hand; cut 3; launches 5; hand 1;"
            );
            assert!(lines[1].starts_with("call 1: after "), "{}", lines[1]);
            assert!(
                lines[1]
                    .ends_with("enqueue 11 = slots 4 + ops 6 + hand; cut 4; launches 5; hand 1;"),
                "{}",
                lines[1]
            );
        }
    }

    #[test]
    fn stamps_give_each_step_and_the_gap_between_launches() {
        // Three launches at entries 3, 4 and 5 (one after another); the timer's low bits wrap
        // inside launch 0's wait. Entry 7: a fourth launch two entries on (not a neighbour of
        // 5: no gap from it), and entry 6 only half written (skipped).
        let mut w = vec![0u32; 8 * 4];
        let t0 = u32::MAX - 20_000;
        let put = |w: &mut Vec<u32>, i: usize, t: u32, steps: [u32; 3]| {
            w[i * 4] = t;
            w[i * 4 + 1] = t.wrapping_add(steps[0]);
            w[i * 4 + 2] = t.wrapping_add(steps[0] + steps[1]);
            w[i * 4 + 3] = t.wrapping_add(steps[0] + steps[1] + steps[2]);
        };
        put(&mut w, 3, t0, [10_000, 30_000, 5_000]); // exits at t0 + 45 us
        put(&mut w, 4, t0.wrapping_add(52_000), [12_000, 20_000, 4_000]); // gap 7 us; exits +88
        put(&mut w, 5, t0.wrapping_add(97_000), [11_000, 25_000, 6_000]); // gap 9 us
        put(&mut w, 7, t0.wrapping_add(500_000), [13_000, 40_000, 3_000]);
        w[24] = 5;
        let s = stamp_summary(&w, 4);
        assert!(s.contains("4 launches"), "{s}");
        // Medians of four: the upper middle value; p90 the largest.
        assert!(s.contains("copy in 12.0/13.0"), "{s}");
        assert!(s.contains("wait for done 30.0/40.0"), "{s}");
        assert!(s.contains("back and exit 5.0/6.0"), "{s}");
        // Gaps 7 and 9 us only (entry 7 is two entries after 5).
        assert!(s.contains("gap after the launch before 9.0/9.0"), "{s}");
        // Nothing stamped: every part says so.
        let none = stamp_summary(&[0u32; 16], 4);
        assert!(
            none.contains("0 launches") && none.contains("copy in -;"),
            "{none}"
        );
    }
}
