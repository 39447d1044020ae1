//! The engine's progress thread (NCCL's proxy): starts pieces in order as the streams reach
//! them, runs small ones itself, hands the others to their channels' threads, and sets each
//! piece's `done`.

use super::{Call, Live, Shared, ToProgress, INLINE_BYTES, INLINE_MANY_BYTES};
use crate::gpu::net::slots::Slots;
use crate::gpu::net::tables::Tables;
use crate::gpu::net::worker::{run_piece, Finished, Job};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use railcc_core::{Error, ErrorKind};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The progress thread's state.
pub(super) struct Progress {
    pub(super) rx: Receiver<ToProgress>,
    pub(super) done_rx: Receiver<(usize, Finished)>,
    pub(super) jobs: Vec<Sender<Job>>,
    pub(super) workers: Vec<JoinHandle<()>>,
    pub(super) slots: Arc<Slots>,
    /// Closed before calls are dropped unstarted (their launches may still read them).
    pub(super) tables: Option<Arc<Tables>>,
    pub(super) shared: Arc<Shared>,
    pub(super) timeout: Duration,
    /// How long after its last work the thread polls for a call before it parks.
    pub(super) spin: Duration,
}

/// The next message while idle: polled until `spin_until` (a sender then makes no futex
/// call, and the thread no wake-up), then waited for up to 100 ms.
fn next_call(rx: &Receiver<ToProgress>, spin_until: Instant) -> Option<ToProgress> {
    let gone = ToProgress::Stop { abort: false };
    while Instant::now() < spin_until {
        match rx.try_recv() {
            Ok(m) => return Some(m),
            Err(TryRecvError::Disconnected) => return Some(gone),
            Err(TryRecvError::Empty) => std::hint::spin_loop(),
        }
    }
    match rx.recv_timeout(Duration::from_millis(100)) {
        Ok(m) => Some(m),
        Err(RecvTimeoutError::Timeout) => None,
        Err(RecvTimeoutError::Disconnected) => Some(gone),
    }
}

/// Timer slack of 1 us for this thread: its 20 us naps between polls (a call enqueued ahead
/// of its stream) would otherwise last about 70 us at Linux's default 50 us slack.
fn fine_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer and changes only this thread's slack.
    let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong) };
    if rc != 0 {
        tracing::debug!("gpu net: PR_SET_TIMERSLACK failed; naps keep the default slack");
    }
}

/// The piece a channel runs: its slot, its token, whether a graph holds it.
type Running = (usize, u32, bool);

impl Progress {
    pub(super) fn run(self) {
        let Progress {
            rx,
            done_rx,
            jobs,
            workers,
            slots,
            tables,
            shared,
            timeout,
            spin,
        } = self;
        let close_tables = || {
            if let Some(t) = &tables {
                t.close();
            }
        };
        if !spin.is_zero() {
            fine_timer_slack();
        }
        let flags = &slots.flags;
        let mut queue: VecDeque<Live> = VecDeque::new();
        let mut held: Vec<(usize, Live)> = Vec::new();
        let mut running: HashMap<u64, (Running, Instant)> = HashMap::new();
        let mut busy = vec![0usize; jobs.len()];
        let mut next_id = 0u64;
        let mut stop: Option<Instant> = None;
        let mut last_work = Instant::now();
        let finish = |(slot, token, captured): Running| {
            flags.store(Slots::done(slot), token);
            if !captured {
                slots.give_back(slot);
            }
        };
        loop {
            let idle = queue.is_empty() && running.is_empty() && held.is_empty();
            let first = if idle && stop.is_none() {
                next_call(&rx, last_work + spin)
            } else {
                None
            };
            for m in first.into_iter().chain(rx.try_iter()) {
                match m {
                    ToProgress::Call(c) => {
                        let live = Live { call: c, next: 0 };
                        if live.call.captured {
                            let first = live.call.runs.first().map_or(0, |r| r.slot);
                            held.push((first, live));
                        } else {
                            queue.push_back(live);
                        }
                    }
                    ToProgress::Release(first) => {
                        if let Some(i) = held.iter().position(|h| h.0 == first) {
                            let (_, live) = held.remove(i);
                            for r in &live.call.runs {
                                slots.give_back_captured(r.slot);
                            }
                        }
                    }
                    ToProgress::Stop { abort } => {
                        if abort {
                            shared.fail(Error::new(ErrorKind::Aborted, "communicator aborted"));
                        }
                        stop.get_or_insert(Instant::now() + timeout);
                    }
                }
            }
            let mut worked = false;
            for (ch, f) in done_rx.try_iter() {
                worked = true;
                busy[ch] = busy[ch].saturating_sub(1);
                if let Err(e) = f.result {
                    shared.fail(e.rank(shared.rank));
                }
                if let Some((r, seen)) = running.remove(&f.op) {
                    finish(r);
                    shared.trace.piece(seen);
                }
            }
            let broken = shared.broken().is_some();
            // Once broken, every queued piece is let go at once: its stream may pass it
            // without waiting for its turn here, and no new call is accepted.
            if broken && !queue.is_empty() {
                close_tables();
                for live in queue.drain(..) {
                    // Not given back: the stream may still write their `start`.
                    for r in &live.call.runs[live.next..] {
                        flags.store(Slots::done(r.slot), r.token);
                    }
                }
                worked = true;
            }
            // Pieces start in order, call after call; a captured call's pieces at each launch.
            let mut ready: Vec<(Arc<Call>, usize)> = Vec::new();
            while queue
                .front_mut()
                .is_some_and(|l| l.started(flags, &mut ready))
            {
                queue.pop_front();
            }
            for (_, live) in held.iter_mut() {
                if live.started(flags, &mut ready) {
                    // The launch has started every piece; the next launch starts over.
                    live.next = 0;
                }
            }
            let seen = Instant::now();
            for (call, k) in ready {
                worked = true;
                let r = &call.runs[k];
                flags.store(Slots::start(r.slot), 0);
                if shared.broken().is_some() {
                    finish((r.slot, r.token, call.captured));
                    continue;
                }
                let bytes = r.piece.send_bytes.max(r.piece.recv_bytes);
                let small =
                    bytes <= INLINE_BYTES && (call.runs.len() == 1 || bytes <= INLINE_MANY_BYTES);
                if small && busy[r.channel] == 0 {
                    // The channel is idle: run it here, sparing a thread hand-off.
                    let comm = &shared.comms[r.channel];
                    if let Err(e) = run_piece(comm, &r.piece.call, &call.ring, k) {
                        shared.fail(e.rank(shared.rank));
                    }
                    finish((r.slot, r.token, call.captured));
                    shared.trace.piece(seen);
                    continue;
                }
                let id = next_id;
                next_id += 1;
                let job = Job {
                    op: id,
                    call: r.piece.call.clone(),
                    ring: call.ring.clone(),
                    k,
                };
                if jobs[r.channel].send(job).is_ok() {
                    busy[r.channel] += 1;
                    running.insert(id, ((r.slot, r.token, call.captured), seen));
                } else {
                    shared.fail(Error::new(
                        ErrorKind::Aborted,
                        "gpu net: a channel thread is gone",
                    ));
                    finish((r.slot, r.token, call.captured));
                }
            }
            if let Some(deadline) = stop {
                let late = Instant::now() > deadline || shared.broken().is_some();
                if running.is_empty() && (queue.is_empty() || late) {
                    // Let every stream that may still reach a piece go on. Those pieces never
                    // move data: say so (a stream that reaches one later gets stale bytes, as
                    // does a graph launched after its communicator is gone).
                    if !queue.is_empty() || !held.is_empty() {
                        shared.fail(Error::new(
                            ErrorKind::Timeout,
                            format!(
                                "gpu net: closed with {} call(s) the streams had not reached and {} kept by CUDA graphs; their pieces are let go without moving data",
                                queue.len(),
                                held.len()
                            ),
                        ));
                    }
                    if !queue.is_empty() {
                        close_tables();
                    }
                    for live in queue.drain(..) {
                        for r in &live.call.runs {
                            flags.store(Slots::done(r.slot), r.token);
                        }
                    }
                    for (_, live) in held.drain(..) {
                        for r in &live.call.runs {
                            flags.store(Slots::done(r.slot), r.token);
                        }
                    }
                    break;
                }
            }
            if worked {
                last_work = Instant::now();
            } else if last_work.elapsed() > Duration::from_millis(2) {
                std::thread::sleep(Duration::from_micros(20));
            } else {
                std::hint::spin_loop();
            }
        }
        drop(jobs);
        for w in workers {
            let _ = w.join();
        }
    }
}
