//! Where the host's time goes in one process per GPU's calls (`RAILCC_GPU_HOST_TRACE=1`),
//! printed to stderr when the communicator closes: per phase of a collective or a send/recv
//! group, the median, 90th percentile and largest time in microseconds.
//!
//! Why: under `mpirun`, small calls are host-bound (nccl-tests `-C 1` reads the same time as
//! the GPU's), so the host's phases are what to cut; a profiler is not always at hand on the
//! GPU machines.

use parking_lot::Mutex;
use std::time::Instant;

/// Samples kept per phase (a long job stops recording; it never grows without bound).
const KEEP: usize = 1 << 20;

#[derive(Default)]
pub struct HostTrace {
    on: bool,
    rank: usize,
    phases: Mutex<Vec<(&'static str, Vec<u32>)>>,
}

impl HostTrace {
    pub fn new(on: bool, rank: usize) -> HostTrace {
        HostTrace {
            on,
            rank,
            phases: Mutex::default(),
        }
    }

    /// A clock for [`HostTrace::lap`], or None when tracing is off (then nothing is read).
    pub fn start(&self) -> Option<Instant> {
        self.on.then(Instant::now)
    }

    /// Records the time since `clock` as phase `what` and restarts the clock.
    pub fn lap(&self, clock: &mut Option<Instant>, what: &'static str) {
        let Some(t) = clock else { return };
        *t = self.since(*t, what);
    }

    /// Records the time since `t0` as phase `what` (when on; a caller's own span, such as
    /// libnccl's whole call); returns now.
    pub fn since(&self, t0: Instant, what: &'static str) -> Instant {
        let now = Instant::now();
        if !self.on {
            return now;
        }
        let us = (now - t0).as_micros().min(u32::MAX as u128) as u32;
        let mut p = self.phases.lock();
        let v = match p.iter().position(|(n, _)| *n == what) {
            Some(i) => &mut p[i].1,
            None => {
                p.push((what, Vec::new()));
                let last = p.len() - 1;
                &mut p[last].1
            }
        };
        if v.len() < KEEP {
            v.push(us);
        }
        now
    }

    /// The report line (None when off or nothing was recorded).
    pub fn line(&self) -> Option<String> {
        if !self.on {
            return None;
        }
        let mut p = self.phases.lock();
        if p.is_empty() {
            return None;
        }
        let mut line = format!(
            "railcc: rank {} gpu host trace (us, median/p90/max):",
            self.rank
        );
        for (name, v) in p.iter_mut() {
            line += &summary(name, v);
        }
        Some(line)
    }

    /// Prints the report to stderr (when on).
    pub fn report(&self) {
        if let Some(l) = self.line() {
            eprintln!("{l}");
        }
    }
}

/// " NAME median/p90/max (n N);" of samples `v` (sorted here), or " NAME -;" when empty: the
/// report's cell, shared with the GPU network trace.
pub fn summary(name: &str, v: &mut [u32]) -> String {
    if v.is_empty() {
        return format!(" {name} -;");
    }
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
    format!(
        " {name} {}/{}/{} (n {});",
        at(0.5),
        at(0.9),
        at(1.0),
        v.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laps_are_reported_per_phase_in_first_seen_order_and_nothing_when_off() {
        let off = HostTrace::new(false, 0);
        let mut c = off.start();
        assert!(c.is_none());
        off.lap(&mut c, "x");
        assert_eq!(off.line(), None);

        let t = HostTrace::new(true, 3);
        assert_eq!(t.line(), None, "nothing recorded yet");
        let mut c = t.start();
        std::thread::sleep(std::time::Duration::from_millis(2));
        t.lap(&mut c, "post");
        t.lap(&mut c, "launch");
        let mut c = t.start();
        t.lap(&mut c, "post");
        let line = t.line().unwrap();
        assert!(line.starts_with("railcc: rank 3 gpu host trace"), "{line}");
        let post = line.find(" post ").unwrap();
        let launch = line.find(" launch ").unwrap();
        assert!(post < launch, "{line}");
        assert!(line.contains("(n 2)") && line.contains("(n 1)"), "{line}");
        // The 2 ms sleep is the largest "post" lap.
        let max: u32 = line[post..]
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.split('/').nth(2))
            .and_then(|s| s.parse().ok())
            .unwrap();
        assert!(max >= 2000, "{line}");
        assert_eq!(summary("turn", &mut []), " turn -;");
        assert_eq!(summary("run", &mut [5, 1, 9]), " run 5/5/9 (n 3);");
    }
}
