//! Striping one connection over several RDMA ports (rails): how a message's pieces are sized
//! and placed, and the rates that size them.
//!
//! The receiver completes a message when it has seen `split(len, nqps).1` distinct pieces (the
//! piece index travels in the immediate), whatever their sizes and queue pairs, so the sender
//! alone decides the cut: sizes follow each queue pair's measured rate, and a piece whose
//! queue pair died is written again on a live one (the same bytes to the same place; a second
//! copy of its immediate is ignored).

use std::time::{Duration, Instant};

/// A rate needs this much busy time and this many bytes before it counts.
const WINDOW: Duration = Duration::from_millis(50);
const WINDOW_BYTES: u64 = 1 << 20;
/// Each measured rate moves the estimate this far.
const EWMA: f64 = 0.5;
/// A queue pair is taken for dead after at least this long without progress (see `stalled`).
pub const STALL_MIN: Duration = Duration::from_secs(2);

/// Bytes `len` cut into `weights.len()` pieces in proportion to the weights: page multiples
/// except the last, every piece at least one page (at least one byte for the last), summing
/// to `len`. `len` is at least one byte per piece.
pub fn cut(len: usize, weights: &[f64]) -> Vec<usize> {
    let k = weights.len().max(1);
    let total: f64 = weights.iter().map(|w| w.max(1e-9)).sum();
    let mut out = Vec::with_capacity(k);
    let mut left = len;
    for (i, w) in weights.iter().enumerate().take(k - 1) {
        let want = (len as f64 * w.max(1e-9) / total) as usize / 4096 * 4096;
        // Leave at least a byte for each piece after this one.
        let room = left.saturating_sub(k - 1 - i);
        let s = want.max(4096).min(room).max(1.min(room));
        out.push(s);
        left -= s;
    }
    out.push(left);
    out
}

/// Where the `k` pieces of a message go: piece i on queue pair i while it lives, a dead one's
/// on the fastest live queue pair. None when every queue pair is dead.
pub fn placement(k: usize, live: &[bool], weights: &[f64]) -> Option<Vec<usize>> {
    let best = fastest_live(live, weights)?;
    Some(
        (0..k)
            .map(|i| if live.get(i) == Some(&true) { i } else { best })
            .collect(),
    )
}

/// The live queue pair with the highest rate, if any lives.
pub fn fastest_live(live: &[bool], weights: &[f64]) -> Option<usize> {
    (0..live.len())
        .filter(|&q| live[q])
        .max_by(|&a, &b| weights[a].total_cmp(&weights[b]))
}

/// Pieces this large or larger are written in two parts, the first signalled (a mark), so that
/// a queue pair with a single piece in flight still yields a rate free of the round trip.
pub const MARK_MIN: usize = 64 * 1024;

/// Bytes of an `n`-byte piece written before its mark (a quarter, in whole pages), or 0 when
/// the piece has no mark. Never more than `max_write`, one work request's bytes.
pub fn mark_len(n: usize, max_write: usize) -> usize {
    if n < MARK_MIN {
        return 0;
    }
    (n / 4 / 4096 * 4096).min(max_write)
}

/// Per queue pair: the rate its completions arrive at while it stays busy.
///
/// A rate is bytes completed between two completions over the time between them, counted only
/// when more was posted before the first of the two: then the link was busy all along, and the
/// round trip (the network's, and the time this thread takes to see a completion) falls out.
/// Counting from the post instead, as a first version did, mixes in the round trip: a queue
/// pair given a small share then looks slow because its pieces are short, and the split stays
/// near where it started (an emulated 2:1 pair of rails settled at 62:38).
#[derive(Clone, Debug)]
pub struct Meter {
    /// Relative rate per queue pair (bytes per second once measured; equal at first).
    pub weights: Vec<f64>,
    outstanding: Vec<u64>,
    /// Last progress: a post onto an idle queue pair, or a completion.
    since: Vec<Instant>,
    /// The next completion only starts a sample (the queue pair was idle before its post).
    fresh: Vec<bool>,
    busy: Vec<Duration>,
    acked: Vec<u64>,
    measured: Vec<bool>,
}

impl Meter {
    pub fn new(nqps: usize) -> Meter {
        let now = Instant::now();
        Meter {
            weights: vec![1.0; nqps],
            outstanding: vec![0; nqps],
            since: vec![now; nqps],
            fresh: vec![true; nqps],
            busy: vec![Duration::ZERO; nqps],
            acked: vec![0; nqps],
            measured: vec![false; nqps],
        }
    }

    /// `n` bytes were posted on queue pair `q`.
    pub fn posted(&mut self, q: usize, n: usize, now: Instant) {
        if q >= self.outstanding.len() {
            return;
        }
        if self.outstanding[q] == 0 {
            self.since[q] = now;
            self.fresh[q] = true;
        }
        self.outstanding[q] += n as u64;
    }

    /// A completion on queue pair `q` covers `n` more bytes (a mark, or the rest of a piece).
    pub fn completed(&mut self, q: usize, n: usize, now: Instant) {
        if q >= self.outstanding.len() {
            return;
        }
        let interval = now.saturating_duration_since(self.since[q]);
        self.since[q] = now;
        self.outstanding[q] = self.outstanding[q].saturating_sub(n as u64);
        if std::mem::take(&mut self.fresh[q]) {
            return;
        }
        self.busy[q] += interval;
        self.acked[q] += n as u64;
        if self.busy[q] >= WINDOW && self.acked[q] >= WINDOW_BYTES {
            let rate = self.acked[q] as f64 / self.busy[q].as_secs_f64();
            if self.measured.iter().all(|m| !m) {
                // The first rate measured sets the scale for the others' starting guesses.
                for (i, w) in self.weights.iter_mut().enumerate() {
                    if i != q {
                        *w = rate;
                    }
                }
            }
            self.weights[q] = if self.measured[q] {
                self.weights[q] * (1.0 - EWMA) + rate * EWMA
            } else {
                rate
            };
            self.measured[q] = true;
            self.busy[q] = Duration::ZERO;
            self.acked[q] = 0;
        }
    }

    /// How long queue pair `q` has had writes outstanding without an acknowledgement, when
    /// that is past what its rate explains: four times the time its outstanding bytes need at
    /// its measured rate, and at least `STALL_MIN`. A port that went down shows this way even
    /// where the device's own resend limit never fires (Soft-RoCE).
    pub fn stalled(&self, q: usize, now: Instant) -> Option<Duration> {
        let out = *self.outstanding.get(q)?;
        if out == 0 {
            return None;
        }
        let idle = now.saturating_duration_since(self.since[q]);
        let rate = if self.measured[q] {
            self.weights[q]
        } else {
            1e6
        };
        let need = Duration::from_secs_f64(4.0 * out as f64 / rate.max(1.0));
        (idle > need.max(STALL_MIN)).then_some(idle)
    }

    /// For logs: each queue pair's share, in percent.
    pub fn shares(&self) -> String {
        let total: f64 = self.weights.iter().sum();
        self.weights
            .iter()
            .map(|w| format!("{:.0}%", 100.0 * w / total.max(1e-9)))
            .collect::<Vec<_>>()
            .join("/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_follow_weights_in_whole_pages_and_cover_the_message() {
        for len in [65536usize, 65537, 1 << 20, 3_000_001, 64 << 20] {
            for w in [
                vec![1.0, 1.0],
                vec![2.0, 1.0],
                vec![1.0, 0.0],
                vec![5.0, 1.0, 1.0, 1.0],
            ] {
                let c = cut(len, &w);
                assert_eq!(c.len(), w.len());
                assert_eq!(c.iter().sum::<usize>(), len, "{len} {w:?}");
                assert!(c.iter().all(|&s| s >= 1), "{len} {w:?} {c:?}");
                assert!(c[..c.len() - 1].iter().all(|s| s % 4096 == 0), "{c:?}");
            }
        }
        let c = cut(12 << 20, &[2.0, 1.0]);
        assert_eq!(c, vec![8 << 20, 4 << 20]);
        // A dead queue pair's piece shrinks to a page.
        assert_eq!(cut(1 << 20, &[1.0, 0.0]), vec![(1 << 20) - 4096, 4096]);
    }

    #[test]
    fn dead_queue_pairs_hand_their_pieces_to_the_fastest_live_one() {
        assert_eq!(placement(2, &[true, true], &[1.0, 1.0]), Some(vec![0, 1]));
        assert_eq!(placement(2, &[true, false], &[1.0, 9.0]), Some(vec![0, 0]));
        assert_eq!(
            placement(3, &[false, true, true], &[1.0, 1.0, 3.0]),
            Some(vec![2, 1, 2])
        );
        assert_eq!(placement(2, &[false, false], &[1.0, 1.0]), None);
    }

    #[test]
    fn marks_are_a_page_aligned_quarter_of_large_pieces() {
        assert_eq!(mark_len(MARK_MIN - 1, 1 << 30), 0);
        assert_eq!(mark_len(MARK_MIN, 1 << 30), 16384);
        assert_eq!(mark_len((8 << 20) + 5, 1 << 30), 2 << 20);
        assert_eq!(mark_len(8 << 20, 1 << 20), 1 << 20);
    }

    #[test]
    fn meter_learns_each_queue_pairs_rate_between_completions() {
        let mut m = Meter::new(2);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        // One piece each; the first completion (the mark) comes after a round trip and only
        // starts the sample. Queue pair 0 then moves 6 MB in 60 ms, queue pair 1 1.5 MB.
        m.posted(0, 8 << 20, t0);
        m.posted(1, 2 << 20, t0);
        m.completed(0, 2 << 20, t0 + ms(30));
        m.completed(1, 512 << 10, t0 + ms(40));
        m.completed(0, 6 << 20, t0 + ms(90));
        m.completed(1, 1536 << 10, t0 + ms(100));
        let r = m.weights[0] / m.weights[1];
        assert!((r - 4.0).abs() < 0.01, "{r}");
        // Idle time and a long round trip do not count: queue pair 1 again after a pause,
        // its mark 500 ms late, then 1.5 MB in 60 ms.
        let t1 = t0 + Duration::from_secs(5);
        m.posted(1, 2 << 20, t1);
        m.completed(1, 512 << 10, t1 + ms(500));
        m.completed(1, 1536 << 10, t1 + ms(560));
        let r = m.weights[0] / m.weights[1];
        assert!((r - 4.0).abs() < 0.01, "{r}");
        assert_eq!(m.shares(), "80%/20%");
        // Backlogged, no marks: two pieces posted together; the first completion only starts
        // the sample, the second measures the link (2 MB in 80 ms = 25 MB/s, as before).
        let t3 = t1 + Duration::from_secs(5);
        m.posted(1, 1 << 20, t3);
        m.posted(1, 2 << 20, t3);
        m.completed(1, 1 << 20, t3 + ms(300));
        m.completed(1, 2 << 20, t3 + ms(380));
        let r = m.weights[0] / m.weights[1];
        assert!((r - 4.0).abs() < 0.01, "{r}");
        // Outstanding bytes with no acknowledgement: a stall only past 4x their time at the
        // measured rate (1 MB at 25 MB/s: 160 ms), and never under STALL_MIN.
        let t2 = t3 + Duration::from_secs(1);
        m.posted(1, 1 << 20, t2);
        assert_eq!(m.stalled(1, t2 + Duration::from_millis(1500)), None);
        assert!(m
            .stalled(1, t2 + STALL_MIN + Duration::from_millis(10))
            .is_some());
        assert_eq!(m.stalled(0, t2 + Duration::from_secs(60)), None);
    }
}
