//! The stream-ordered network path for GPU buffers: [`GpuNet::enqueue`] puts a few stream
//! operations on the caller's stream and returns; a progress thread (NCCL's proxy) sees the
//! stream reach the call, hands its pieces to the channels' threads, and lets the stream go on
//! once every piece is back on the GPU. Captured in a CUDA graph, the same call runs at every
//! launch of the graph.
//!
//! On the caller's stream, per call: [small calls: copies into the slot's pinned stage]
//! `start = 1`, wait `done == 1`, `done = 0`, [small calls: copies back]. No kernel runs, so
//! no SM is taken from the caller's work.
//!
//! A failure (a peer died, a mismatch, the deadline) breaks the engine: the first error is
//! kept, every channel is aborted so the others stop at once, and every call still waiting is
//! let go (its `done` set) so no stream waits forever; the caller sees the error on its next
//! call and from [`GpuNet::async_error`].

use super::pieces::{pieces, stage_need, Cut, NetOp, Piece};
use super::slots::{Slots, SmallStage};
use super::worker::{run_small, spawn, Finished, Job, Work};
use crate::comm::Communicator;
use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;
use railcc_core::bootstrap::{RootServer, UniqueId};
use railcc_core::{Error, ErrorKind, Result};
use railcc_transport_nvlink::gpu::Stream;
use railcc_transport_nvlink::hostsync::{capturing, d2h, h2d, on_graph_destroy, Ctx};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Flag slots: calls in flight plus calls held by live CUDA graphs.
const SLOTS: usize = 4096;
/// Small-message stages made at init, for calls captured into CUDA graphs (more are made as
/// eager calls need them; a captured call finding none takes the channels' path).
const STAGES_AHEAD: usize = 32;

/// One call as the progress thread keeps it.
struct Entry {
    slot: usize,
    captured: bool,
    small: Option<(Piece, Arc<SmallStage>)>,
    channels: Vec<Vec<Piece>>,
}

enum ToProgress {
    Call(Box<Entry>),
    /// The graph holding the captured call in this slot was destroyed.
    Release(usize),
    Stop {
        abort: bool,
    },
}

struct Shared {
    broken: Mutex<Option<Error>>,
    comms: Vec<Arc<Communicator>>,
    rank: usize,
}

impl Shared {
    fn fail(&self, e: Error) {
        let mut b = self.broken.lock();
        if b.is_none() {
            tracing::warn!("rank {}: gpu net: {e}", self.rank);
            *b = Some(e);
        }
        drop(b);
        for c in &self.comms {
            c.abort();
        }
    }
}

pub struct GpuNet {
    rank: usize,
    nranks: usize,
    ctx: Arc<Ctx>,
    slots: Arc<Slots>,
    shared: Arc<Shared>,
    tx: Sender<ToProgress>,
    progress: Option<JoinHandle<()>>,
    cut: Cut,
    small_bytes: usize,
    desc: String,
    _roots: Vec<RootServer>,
}

impl GpuNet {
    /// Opens the channels (each a communicator of its own over `parent`'s job, so its own
    /// connections) and the threads, for this rank's GPU `ordinal`. Collective: every rank of
    /// `parent` calls it.
    pub fn new(parent: &Communicator, ordinal: usize) -> Result<GpuNet> {
        let cfg = parent.config().clone();
        let (rank, nranks) = (parent.rank(), parent.nranks());
        let ctx = Arc::new(Ctx::new(ordinal)?);
        let nch = cfg.gpu_net_channels;
        // Rank 0 serves one rendezvous per channel; everyone learns their ids.
        let mut roots = Vec::new();
        let mut mine = Vec::new();
        if rank == 0 {
            for _ in 0..nch {
                let bind = SocketAddr::new(parent.interface_ip(), 0);
                let r = RootServer::start(bind, cfg.timeout())?;
                mine.extend_from_slice(&r.id.to_bytes());
                roots.push(r);
            }
        }
        let all = parent.oob_all_gather(&mine)?;
        let ids = all.first().map(Vec::as_slice).unwrap_or_default();
        let mut comms = Vec::with_capacity(nch);
        for c in 0..nch {
            let b = ids
                .get(c * 128..(c + 1) * 128)
                .ok_or_else(|| Error::invalid("gpu net: rank 0 sent too few channel ids"))?;
            let id = UniqueId::from_bytes(b)?;
            let comm = Communicator::init(cfg.clone(), &id, rank, nranks)
                .map_err(|e| e.op(format!("gpu net channel {c} init")))?;
            comms.push(Arc::new(comm));
        }
        let slots = Arc::new(Slots::new(&ctx, SLOTS)?);
        slots.prepare(STAGES_AHEAD, &ctx, cfg.gpu_net_small_bytes, &comms[0])?;
        let shared = Arc::new(Shared {
            broken: Mutex::new(None),
            comms: comms.clone(),
            rank,
        });
        let (done_tx, done_rx) = unbounded();
        let mut jobs = Vec::new();
        let mut workers = Vec::new();
        for (c, comm) in comms.iter().enumerate() {
            let (jtx, jrx) = unbounded();
            workers.push(spawn(
                c,
                comm.clone(),
                ctx.clone(),
                jrx,
                done_tx.clone(),
                cfg.gpu_net_chunk_bytes,
            )?);
            jobs.push(jtx);
        }
        let (tx, rx) = unbounded();
        let progress = Progress {
            rx,
            done_rx,
            jobs,
            workers,
            slots: slots.clone(),
            shared: shared.clone(),
            timeout: cfg.timeout(),
        };
        let progress = std::thread::Builder::new()
            .name("railcc-progress".into())
            .spawn(move || progress.run())
            .map_err(|e| Error::io("gpu net: starting the progress thread", &e))?;
        let desc = format!(
            "{nch} channel(s) over {}, staged through pinned host memory in chunks of {} KiB; stream-ordered, no thread blocks",
            parent.transport(),
            cfg.gpu_net_chunk_bytes / 1024
        );
        Ok(GpuNet {
            rank,
            nranks,
            ctx,
            slots,
            shared,
            tx,
            progress: Some(progress),
            cut: Cut {
                channels: nch,
                chunk_bytes: cfg.gpu_net_chunk_bytes,
                min_spread_bytes: 64 * 1024,
            },
            small_bytes: cfg.gpu_net_small_bytes,
            desc,
            _roots: roots,
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// How data moves, for logs and bench headers.
    pub fn describe(&self) -> &str {
        &self.desc
    }

    /// The error that broke the engine, if any (ncclCommGetAsyncError).
    pub fn async_error(&self) -> Option<Error> {
        self.shared.broken.lock().clone()
    }

    /// Stops every call now: waiting streams are let go, later calls fail.
    pub fn abort(&self) {
        self.shared
            .fail(Error::new(ErrorKind::Aborted, "communicator aborted").rank(self.rank));
    }

    /// Enqueues `op` on `stream` and returns; the data moves when the stream reaches it.
    ///
    /// # Safety
    /// `stream` is a live stream of this GPU's context (or null); the device addresses in
    /// `op` are this GPU's memory of the sizes the call implies and stay allocated until the
    /// stream has passed the call (for a captured call: until the graph's last launch is done).
    pub unsafe fn enqueue(&self, op: NetOp, stream: Stream) -> Result<()> {
        if let Some(e) = self.async_error() {
            return Err(Error::new(
                e.kind,
                format!("communicator is broken by an earlier error: {e}"),
            )
            .rank(self.rank));
        }
        let op = match self.checked(op)? {
            Some(op) => op,
            None => return Ok(()),
        };
        let whole = pieces(&op, self.rank, &Cut::WHOLE);
        let (sb, rb) = stage_need(whole.iter().flatten());
        self.ctx.bind()?;
        // SAFETY: the caller's stream (contract above).
        let captured = unsafe { capturing(stream) }?;
        let slot = self.slots.take()?;
        let flags = &self.slots.flags;
        let (start, done) = (Slots::start(slot), Slots::done(slot));
        let mut entry = Entry {
            slot,
            captured,
            small: None,
            channels: Vec::new(),
        };
        let stage = if sb.max(rb) <= self.small_bytes {
            let comm0 = &self.shared.comms[0];
            self.slots
                .stage(slot, &self.ctx, self.small_bytes, comm0, captured)?
        } else {
            None
        };
        if let Some(stage) = stage {
            let piece =
                whole.into_iter().flatten().next().ok_or_else(|| {
                    Error::invalid("gpu net: a call with no piece").rank(self.rank)
                })?;
            let base = stage.send.as_ptr() as *mut u8;
            for s in &piece.down {
                // SAFETY: the stage holds small_bytes >= every offset + length of the piece;
                // the device range is the caller's (contract above).
                unsafe { d2h(stream, base.add(s.stage), s.dev, s.bytes) }?;
            }
            entry.small = Some((piece, stage));
        } else {
            entry.channels = pieces(&op, self.rank, &self.cut);
        }
        // SAFETY: the slot's words are ours until it is given back; the stream is the caller's.
        unsafe {
            flags.write_on(stream, start, 1)?;
            flags.wait_on(stream, done, 1)?;
            flags.write_on(stream, done, 0)?;
        }
        if let Some((piece, stage)) = &entry.small {
            let base = stage.recv.as_ptr();
            for s in &piece.up {
                // SAFETY: as for the copies in.
                unsafe { h2d(stream, s.dev, base.add(s.stage), s.bytes) }?;
            }
        }
        if captured {
            let tx = self.tx.clone();
            // SAFETY: the stream is being captured (checked above).
            unsafe {
                on_graph_destroy(
                    stream,
                    Box::new(move || {
                        let _ = tx.send(ToProgress::Release(slot));
                    }),
                )
            }?;
        }
        self.tx
            .send(ToProgress::Call(Box::new(entry)))
            .map_err(|_| {
                Error::new(ErrorKind::Aborted, "gpu net: progress thread gone").rank(self.rank)
            })
    }

    /// Checks what the host path would only see later; drops what moves no bytes.
    fn checked(&self, op: NetOp) -> Result<Option<NetOp>> {
        let bad = |m: String| Err(Error::invalid(m).rank(self.rank));
        match op {
            NetOp::Coll { a, .. } => {
                if a.nranks != self.nranks {
                    return bad(format!(
                        "{}: nranks {} differs from the communicator's {}",
                        a.coll.name(),
                        a.nranks,
                        self.nranks
                    ));
                }
                if a.root >= self.nranks {
                    return bad(format!(
                        "{}: root {} out of range for {} ranks",
                        a.coll.name(),
                        a.root,
                        self.nranks
                    ));
                }
                if a.count == 0 && a.coll != railcc_core::net::CollKind::Barrier {
                    return Ok(None);
                }
                Ok(Some(op))
            }
            NetOp::P2p(ops) => {
                if let Some(o) = ops.iter().find(|o| o.peer >= self.nranks) {
                    return bad(format!(
                        "send/recv: peer {} out of range for {} ranks",
                        o.peer, self.nranks
                    ));
                }
                let ops: Vec<_> = ops.into_iter().filter(|o| o.bytes > 0).collect();
                Ok((!ops.is_empty()).then_some(NetOp::P2p(ops)))
            }
        }
    }
}

impl Drop for GpuNet {
    fn drop(&mut self) {
        let _ = self.tx.send(ToProgress::Stop { abort: false });
        if let Some(h) = self.progress.take() {
            let _ = h.join();
        }
    }
}

/// The progress thread's state.
struct Progress {
    rx: Receiver<ToProgress>,
    done_rx: Receiver<(usize, Finished)>,
    jobs: Vec<Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
    slots: Arc<Slots>,
    shared: Arc<Shared>,
    timeout: Duration,
}

/// A call the channels are running.
struct Running {
    slot: usize,
    captured: bool,
    left: usize,
}

impl Progress {
    fn run(self) {
        let Progress {
            rx,
            done_rx,
            jobs,
            workers,
            slots,
            shared,
            timeout,
        } = self;
        let flags = &slots.flags;
        let mut queue: VecDeque<Entry> = VecDeque::new();
        let mut held: HashMap<usize, (Entry, bool)> = HashMap::new();
        let mut running: HashMap<u64, Running> = HashMap::new();
        let mut busy = vec![0usize; jobs.len()];
        let mut next_id = 0u64;
        let mut stop: Option<Instant> = None;
        let mut last_work = Instant::now();
        let finish = |r: &Running, held: &mut HashMap<usize, (Entry, bool)>| {
            flags.store(Slots::done(r.slot), 1);
            if r.captured {
                if let Some(h) = held.get_mut(&r.slot) {
                    h.1 = false;
                }
            } else {
                slots.give_back(r.slot);
            }
        };
        loop {
            let idle = queue.is_empty() && running.is_empty() && held.is_empty();
            let first = if idle && stop.is_none() {
                match rx.recv_timeout(Duration::from_millis(100)) {
                    Ok(m) => Some(m),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => Some(ToProgress::Stop { abort: false }),
                }
            } else {
                None
            };
            for m in first.into_iter().chain(rx.try_iter()) {
                match m {
                    ToProgress::Call(e) if e.captured => {
                        held.insert(e.slot, (*e, false));
                    }
                    ToProgress::Call(e) => queue.push_back(*e),
                    ToProgress::Release(slot) => {
                        if held.remove(&slot).is_some() {
                            slots.give_back(slot);
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
                if let Some(r) = running.get_mut(&f.op) {
                    r.left = r.left.saturating_sub(1);
                    if r.left == 0 {
                        if let Some(r) = running.remove(&f.op) {
                            finish(&r, &mut held);
                        }
                    }
                }
            }
            // Once broken, every queued call is let go at once: its stream may pass it without
            // waiting for its turn here (thousands of queued calls would otherwise drain one
            // by one), and no new call is accepted, so its slot is never reused.
            if !queue.is_empty() && shared.broken.lock().is_some() {
                for e in queue.drain(..) {
                    flags.store(Slots::done(e.slot), 1);
                }
                worked = true;
            }
            // Calls start in the order they were made; captured calls when their graph's
            // launch reaches them.
            let mut ready: Vec<Entry> = Vec::new();
            while queue
                .front()
                .is_some_and(|e| flags.load(Slots::start(e.slot)) == 1)
            {
                if let Some(e) = queue.pop_front() {
                    ready.push(e);
                }
            }
            let mut launches: Vec<usize> = held
                .iter()
                .filter(|(s, (_, on))| !on && flags.load(Slots::start(**s)) == 1)
                .map(|(s, _)| *s)
                .collect();
            launches.sort_unstable();
            for slot in launches {
                if let Some(h) = held.get_mut(&slot) {
                    h.1 = true;
                    let e = &h.0;
                    ready.push(Entry {
                        slot: e.slot,
                        captured: true,
                        small: e.small.clone(),
                        channels: e.channels.clone(),
                    });
                }
            }
            for e in ready {
                worked = true;
                flags.store(Slots::start(e.slot), 0);
                let id = next_id;
                next_id += 1;
                let mut r = Running {
                    slot: e.slot,
                    captured: e.captured,
                    left: 0,
                };
                if shared.broken.lock().is_some() {
                    finish(&r, &mut held);
                    continue;
                }
                if let Some((piece, stage)) = e.small {
                    if busy[0] == 0 {
                        // Channel 0 is idle: run it here, sparing a thread hand-off.
                        if let Err(err) = run_small(&shared.comms[0], &piece, &stage) {
                            shared.fail(err.rank(shared.rank));
                        }
                        finish(&r, &mut held);
                        continue;
                    }
                    let _ = jobs[0].send(Job {
                        op: id,
                        work: Work::Small { piece, stage },
                    });
                    busy[0] += 1;
                    r.left = 1;
                } else {
                    for (ch, ps) in e.channels.into_iter().enumerate() {
                        if ps.is_empty() {
                            continue;
                        }
                        if jobs[ch]
                            .send(Job {
                                op: id,
                                work: Work::Pieces(ps),
                            })
                            .is_ok()
                        {
                            busy[ch] += 1;
                            r.left += 1;
                        }
                    }
                }
                if r.left == 0 {
                    finish(&r, &mut held);
                } else {
                    running.insert(id, r);
                }
            }
            if let Some(deadline) = stop {
                let late = Instant::now() > deadline || shared.broken.lock().is_some();
                if running.is_empty() && (queue.is_empty() || late) {
                    // Let every stream that may still reach a call go on.
                    for e in queue.drain(..) {
                        flags.store(Slots::done(e.slot), 1);
                    }
                    for (slot, _) in held.drain() {
                        flags.store(Slots::done(slot), 1);
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
