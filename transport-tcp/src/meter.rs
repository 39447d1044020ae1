//! What a sender learns of each rail's delivery rate, and the weights that follow from it.
//!
//! A rail's rate is measured from the peer's acknowledgements over its streams (acknowledged
//! = written - `SIOCOUTQ`), only over intervals in which the rail had bytes in flight from
//! start to end (it acknowledged less than what was in flight at the interval's start), so
//! idle time never counts and the rate is the path's, not the application's. Intervals add up to windows of
//! `WINDOW` and `WINDOW_BYTES`; each window moves the estimate halfway to what it saw.

use std::time::{Duration, Instant};

/// At most one acknowledgement sample per rail this often (fast links drain a socket buffer
/// in well under a millisecond, and only intervals that never ran dry count).
const SAMPLE_EVERY: Duration = Duration::from_micros(50);
/// Busy time and bytes per rate estimate: enough to average over a shaper's bursts and what
/// socket buffers absorb (a rate from less is mostly those).
const WINDOW: Duration = Duration::from_millis(200);
const WINDOW_BYTES: u64 = 4 << 20;
/// Weights are announced again only when a live stream's share moves by more than this (a
/// stream given 2 points too much of a message finishes that much later than the others).
const SHARE_DRIFT: f64 = 0.02;
/// The fastest stream's weight (the others in proportion, at least 1).
const SCALE: f64 = 1000.0;

#[derive(Default)]
pub struct Meter {
    /// The last sample: when, bytes acknowledged then, bytes in flight then.
    last: Option<(Instant, u64, u64)>,
    win_bytes: u64,
    win: Duration,
    rate: Option<f64>,
}

impl Meter {
    /// Takes a sample at `now`, `written` bytes written to the stream so far, `in_flight`
    /// reading the socket's unacknowledged count. True when the rate estimate changed.
    pub fn sample(
        &mut self,
        now: Instant,
        written: u64,
        in_flight: impl FnOnce() -> Option<u64>,
    ) -> bool {
        if let Some((t, acked, q)) = self.last {
            if now.duration_since(t) < SAMPLE_EVERY {
                return false;
            }
            if q == 0 && written == acked {
                // Idle: nothing in flight and nothing new; no need to ask the socket.
                self.last = Some((now, acked, 0));
                return false;
            }
        }
        let Some(q) = in_flight() else {
            self.last = None;
            return false;
        };
        let q = q.min(written);
        let acked = written - q;
        if let Some((t, a0, q0)) = self.last {
            let moved = acked.saturating_sub(a0);
            if q0 > 0 && moved < q0 {
                self.win_bytes += moved;
                self.win += now.duration_since(t);
            }
        }
        self.last = Some((now, acked, q));
        if self.win < WINDOW || self.win_bytes < WINDOW_BYTES {
            return false;
        }
        let r = self.win_bytes as f64 / self.win.as_secs_f64();
        self.rate = Some(self.rate.map_or(r, |o| 0.5 * o + 0.5 * r));
        self.win_bytes = 0;
        self.win = Duration::ZERO;
        true
    }

    /// Bytes per second, once a window has been seen.
    pub fn rate(&self) -> Option<f64> {
        self.rate
    }
}

/// Weights in proportion to `rates` (the fastest `SCALE`, none below 1); a stream with no
/// rate (dead) keeps its weight from `cur`, bounded to what a `Weights` frame carries.
pub fn weights_from_rates(rates: &[f64], cur: &[u32]) -> Vec<u16> {
    let top = rates.iter().cloned().fold(0.0f64, f64::max);
    rates
        .iter()
        .zip(cur)
        .map(|(&r, &c)| {
            if r > 0.0 && top > 0.0 {
                (SCALE * r / top).round().clamp(1.0, u16::MAX as f64) as u16
            } else {
                c.clamp(1, u16::MAX as u32) as u16
            }
        })
        .collect()
}

/// Whether any live stream's share of the weight moves by more than `SHARE_DRIFT`.
pub fn shares_differ(cur: &[u32], new: &[u16], live: &[bool]) -> bool {
    let sum =
        |f: &dyn Fn(usize) -> f64| -> f64 { (0..live.len()).filter(|&i| live[i]).map(f).sum() };
    let (sc, sn) = (sum(&|i| cur[i] as f64), sum(&|i| new[i] as f64));
    if sc <= 0.0 || sn <= 0.0 {
        return false;
    }
    (0..live.len())
        .filter(|&i| live[i])
        .any(|i| (cur[i] as f64 / sc - new[i] as f64 / sn).abs() > SHARE_DRIFT)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream delivering `rate` B/s with `backlog` bytes always in flight.
    fn feed(m: &mut Meter, t0: Instant, rate: f64, backlog: u64, ms: u64) -> u64 {
        let mut changed = 0;
        for k in 1..=ms {
            let now = t0 + Duration::from_millis(k);
            let acked = (rate * k as f64 / 1000.0) as u64;
            let written = acked + backlog;
            if m.sample(now, written, || Some(backlog)) {
                changed += 1;
            }
        }
        changed
    }

    #[test]
    fn a_backlogged_stream_measures_its_rate() {
        let mut m = Meter::default();
        let t0 = Instant::now();
        assert!(feed(&mut m, t0, 100e6, 4 << 20, 1000) >= 4);
        let r = m.rate().unwrap();
        assert!((r - 100e6).abs() < 3e6, "{r}");
    }

    #[test]
    fn idle_time_does_not_count() {
        let mut m = Meter::default();
        let t0 = Instant::now();
        // Busy 100 ms at 50 MB/s, then everything acknowledged, then idle 500 ms, then busy.
        feed(&mut m, t0, 50e6, 1 << 20, 400);
        let acked = 20_000_000 + (1 << 20);
        m.sample(t0 + Duration::from_millis(410), acked, || Some(0));
        for k in 0..500 {
            m.sample(t0 + Duration::from_millis(420 + k), acked, || Some(0));
        }
        let r = m.rate().unwrap();
        assert!((r - 50e6).abs() < 3e6, "idle time lowered the rate: {r}");
    }

    #[test]
    fn weights_follow_rates_and_drift_is_needed_to_change() {
        let w = weights_from_rates(&[100e6, 50e6, 100e6, 50e6], &[1000; 4]);
        assert_eq!(w, vec![1000, 500, 1000, 500]);
        let live = [true; 4];
        assert!(shares_differ(&[1000; 4], &w, &live));
        assert!(!shares_differ(
            &[1000, 500, 1000, 500],
            &[1000, 505, 1000, 503],
            &live
        ));
        assert!(shares_differ(
            &[1000, 500, 1000, 500],
            &[1000, 700, 1000, 700],
            &live
        ));
        // A dead stream keeps its old weight and is left out of the shares.
        let w = weights_from_rates(&[100e6, 0.0], &[7, 9]);
        assert_eq!(w, vec![1000, 9]);
        assert!(!shares_differ(&[1, 9], &[1000, 9], &[true, false]));
    }
}
