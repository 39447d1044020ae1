//! The stream-ordered network path for GPU buffers: [`GpuNet::enqueue`] puts copies and flag
//! operations on the caller's stream and returns; a progress thread (NCCL's proxy) sees the
//! stream reach each piece, hands it to its channel's thread (or runs it itself when small),
//! and lets the stream go on once the piece's result is staged. Captured in a CUDA graph, the
//! same call runs at every launch of the graph.
//!
//! On the caller's stream, for pieces 0..n of a call, with a ring of `depth` stages (`RAILCC_GPU_NET_RING`):
//! copy pieces 0..depth in and set their `start`; then per piece k: wait for `done_k`, copy
//! piece k back, copy piece k+depth in and set its `start` (slots.rs: the flag values). Every GPU
//! operation of the call is on the caller's stream (copy engines, no kernel, no thread
//! block), so it waits for nothing but the host; the copies in run ahead of the network by
//! up to `depth` pieces and the copies back follow it piece by piece.
//!
//! A failure (a peer died, a mismatch, the deadline) breaks the engine: the first error is
//! kept, every channel is aborted so the others stop at once, and every piece still waiting
//! is let go (its `done` set) so no stream waits forever; the caller sees the error on its
//! next call and from [`GpuNet::async_error`].

mod ops;
mod progress;

use super::pieces::{pieces_in_order, stage_need, Cut, NetOp, Piece};
use super::ring::{Ring, Rings};
use super::slots::{Slots, Taken};
use super::tables::{Lease, Tables, TABLES};
use super::trace::Trace;
use super::worker::spawn;
use crate::comm::Communicator;
use crossbeam_channel::{unbounded, Sender};
use ops::kernel_fits;
use parking_lot::Mutex;
use progress::Progress;
use railcc_core::bootstrap::{RootServer, UniqueId};
use railcc_core::{Error, ErrorKind, Result};
use railcc_cuda::gpu::Stream;
use railcc_cuda::hostsync::{capturing, on_graph_destroy, Ctx, Flags};
use railcc_cuda::netcopy::{self, NetKernel};
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What `cut_settings` writes: five little-endian u64s.
const SETTINGS_BYTES: usize = 40;

/// The settings that decide how calls are cut, as every rank sends them at init.
fn cut_settings(cfg: &railcc_core::Config) -> [u8; SETTINGS_BYTES] {
    let mut b = [0u8; SETTINGS_BYTES];
    let v = [
        cfg.gpu_net_channels,
        cfg.gpu_net_chunk_bytes,
        cfg.gpu_net_staging_bytes,
        cfg.gpu_net_ring,
        cfg.gpu_net_p2p_spread_bytes,
    ];
    for (chunk, x) in b.chunks_exact_mut(8).zip(v) {
        chunk.copy_from_slice(&(x as u64).to_le_bytes());
    }
    b
}

/// Whether every member (`members[i]` sent `payloads[i]`) sent the first one's settings.
fn same_settings(members: &[usize], payloads: &[Vec<u8>]) -> Result<()> {
    let want = payloads.first().and_then(|p| p.get(..SETTINGS_BYTES));
    for (&r, got) in members.iter().zip(payloads) {
        if got.get(..SETTINGS_BYTES) != want {
            return Err(Error::invalid(format!(
                "gpu net: rank {r} has other network settings than rank {} (RAILCC_GPU_NET_CHANNELS, _CHUNK_BYTES, _STAGING_BYTES, _RING and _P2P_SPREAD_BYTES must be the same on every rank): {:?} against {:?}",
                members.first().copied().unwrap_or(0),
                settings_of(got),
                settings_of(want.unwrap_or_default())
            )));
        }
    }
    Ok(())
}

/// The values of a `cut_settings` record, for an error message.
fn settings_of(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .filter_map(|c| <[u8; 8]>::try_from(c).ok().map(u64::from_le_bytes))
        .collect()
}

/// How long a closing engine waits for the GPU to pass its last call before it leaks, rather
/// than frees, what that call reads (or the communicator's timeout, if shorter).
const DRAIN_WAIT: Duration = Duration::from_secs(10);
/// The same for a broken engine, whose pieces were all let go.
const DRAIN_WAIT_BROKEN: Duration = Duration::from_millis(100);

/// Flag slots: pieces in flight plus pieces held by live CUDA graphs.
const SLOTS: usize = 8192;
/// Pieces up to this many staged bytes run on the progress thread when their channel is
/// idle (sparing a thread hand-off on small calls)...
const INLINE_BYTES: usize = 256 * 1024;
/// ...when they are their call's only piece or this small: the progress thread runs pieces
/// one after another, so a call of several larger pieces runs them on their channels' threads
/// at once (run inline, eight 256 KiB pieces took 1 ms for a 2 MB all_reduce on 2 x H100, 2 emulated hosts).
const INLINE_MANY_BYTES: usize = 32 * 1024;

/// One piece of a call: its flag slot and token, its channel and what it runs.
struct Run {
    slot: usize,
    token: u32,
    channel: usize,
    piece: Piece,
}

/// A call as the progress thread keeps it.
struct Call {
    captured: bool,
    runs: Vec<Run>,
    ring: Arc<Ring>,
    /// Tables holding the call's launches' entries (`RAILCC_GPU_NET_TABLE`), in launch
    /// order; free again when the progress thread drops the call. Empty: the parameter.
    tables: Vec<Lease>,
}

/// A call whose pieces are being started: the next piece to watch.
struct Live {
    call: Arc<Call>,
    next: usize,
}

impl Live {
    /// Takes the pieces whose `start` the stream has set, in order, into `ready`; true when
    /// every piece has started.
    fn started(&mut self, flags: &Flags, ready: &mut Vec<(Arc<Call>, usize)>) -> bool {
        while let Some(r) = self.call.runs.get(self.next) {
            if flags.load(Slots::start(r.slot)) != r.token {
                return false;
            }
            ready.push((self.call.clone(), self.next));
            self.next += 1;
        }
        true
    }
}

enum ToProgress {
    Call(Arc<Call>),
    /// The graph holding the captured call whose first piece has this slot was destroyed.
    Release(usize),
    Stop {
        abort: bool,
    },
}

struct Shared {
    broken: Mutex<Option<Error>>,
    comms: Vec<Arc<Communicator>>,
    rank: usize,
    trace: Trace,
}

impl Shared {
    fn fail(&self, e: Error) {
        let mut b = self.broken.lock();
        if b.is_none() {
            tracing::warn!("rank {}: gpu net: {e}", self.rank);
            *b = Some(e.clone());
        }
        drop(b);
        for c in &self.comms {
            c.abort_with(e.clone());
        }
    }

    fn broken(&self) -> Option<Error> {
        self.broken.lock().clone()
    }
}

pub struct GpuNet {
    rank: usize,
    nranks: usize,
    slots: Arc<Slots>,
    /// Shared with the other engine of the same communicator and GPU, if any (the flat one
    /// and the hierarchy's cross one): the communicator's calls run one after another
    /// (`Rings::in_order`), so one ring serves both, within one budget.
    rings: Arc<Rings>,
    shared: Arc<Shared>,
    tx: Sender<ToProgress>,
    progress: Option<JoinHandle<()>>,
    cut: Cut,
    /// Every staging slot's size under a budget (`RAILCC_GPU_NET_STAGING_BYTES`).
    slot_cap: Option<usize>,
    ring_depth: usize,
    /// `RAILCC_GPU_NET_KERNEL=1`: the staging kernel and its blocks per launch.
    kernel: Option<(NetKernel, u32)>,
    /// `RAILCC_GPU_NET_TRACE` with the kernel: where the staging kernel's launches stood when
    /// (the last `netcopy::STAMP_CALLS` launches) and the launches so far; summarized at close.
    stamps: Option<(Flags, std::sync::atomic::AtomicUsize)>,
    /// With a table kernel: the tables large calls' launches take their entries from.
    tables: Option<Arc<Tables>>,
    timeout: Duration,
    desc: String,
    _roots: Vec<RootServer>,
    /// Last: fields drop in order, and the kernel's module, the flags and the rings are
    /// freed in this context, which may be the last reference to the GPU's primary context.
    ctx: Arc<Ctx>,
}

impl GpuNet {
    /// Opens the channels (each a communicator of its own over `parent`'s job, so its own
    /// connections) and the threads, for this rank's GPU `ordinal`. Collective: every rank of
    /// `parent` calls it.
    pub fn new(parent: &Communicator, ordinal: usize) -> Result<GpuNet> {
        GpuNet::sharing(parent, ordinal, None)
    }

    /// As [`GpuNet::new`], staging through `rings` (another engine's of this GPU, see
    /// [`GpuNet::rings`]) when given.
    pub fn sharing(
        parent: &Communicator,
        ordinal: usize,
        rings: Option<Arc<Rings>>,
    ) -> Result<GpuNet> {
        let all: Vec<usize> = (0..parent.nranks()).collect();
        GpuNet::open(parent, ordinal, &all, rings)
    }

    /// The staging rings, for another engine of this GPU to share ([`GpuNet::sharing`]).
    pub fn rings(&self) -> Arc<Rings> {
        self.rings.clone()
    }

    /// As [`GpuNet::new`], over the ranks `members` of `parent` only (this rank among them;
    /// their order gives the engine's ranks). Every rank of `parent` calls it together, each
    /// with its own group (the groups do not overlap): the hierarchical path's one engine per
    /// local index.
    pub fn among(parent: &Communicator, ordinal: usize, members: &[usize]) -> Result<GpuNet> {
        GpuNet::open(parent, ordinal, members, None)
    }

    fn open(
        parent: &Communicator,
        ordinal: usize,
        members: &[usize],
        shared_rings: Option<Arc<Rings>>,
    ) -> Result<GpuNet> {
        let mut cfg = parent.config().clone();
        // The channels' rails: the NICs nearest this GPU.
        cfg.gpu_ordinal = ordinal as i64;
        let nranks = members.len();
        let nch = cfg.gpu_net_channels;
        let slot_cap = super::ring::budget_slot_bytes(cfg.gpu_net_staging_bytes, cfg.gpu_net_ring);
        // This rank's part before the all-gather; a failure still takes part in it (so every
        // rank of `parent` leaves at the same all-gather, and the caller's next ones pair up).
        let prep = (|| -> Result<_> {
            let rank = (members.iter())
                .position(|&r| r == parent.rank())
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "gpu net: rank {} is not in the group {members:?}",
                        parent.rank()
                    ))
                })?;
            let ctx = Arc::new(Ctx::new(ordinal)?);
            let kernel = match cfg.gpu_net_kernel {
                0 => None,
                _ => Some((
                    NetKernel::load(
                        &ctx,
                        cfg.kernel_cache_dir().as_deref(),
                        cfg.gpu_net_big_launch != 0,
                        cfg.gpu_net_table != 0,
                    )
                    .map_err(|e| e.op("gpu net: loading the staging kernel"))?,
                    netcopy::blocks_for(cfg.gpu_net_ring, cfg.gpu_net_blocks),
                )),
            };
            // Rank 0 serves one rendezvous per channel; everyone learns their ids. Before
            // them, the settings both ends of a piece must share (checked below).
            let mut roots = Vec::new();
            let mut mine = cut_settings(&cfg).to_vec();
            if rank == 0 {
                for _ in 0..nch {
                    let bind = SocketAddr::new(parent.interface_ip(), 0);
                    let r = RootServer::start(bind, cfg.timeout())?;
                    mine.extend_from_slice(&r.id.to_bytes());
                    roots.push(r);
                }
            }
            Ok((rank, ctx, kernel, roots, mine))
        })();
        let mine = railcc_core::agree::record(&prep, |(.., ids)| ids.clone());
        let all = parent.oob_all_gather(&mine)?;
        let failed = railcc_core::agree::first_failure(&all, 0);
        let (rank, ctx, kernel, roots, _) = match (prep, failed) {
            (Err(e), _) => return Err(e),
            (Ok(_), Some((r, why))) => {
                let e = format!("rank {r} failed to open its GPU network engine: {why}");
                return Err(Error::new(ErrorKind::Io, e).peer(r));
            }
            (Ok(p), None) => p,
        };
        // Both ends of a message or a collective's piece cut the call alike only with the same
        // settings: a difference fails every rank here, naming it, instead of a hang later.
        let payloads: Vec<Vec<u8>> = (members.iter())
            .map(|&r| {
                all.get(r)
                    .map(|b| railcc_core::agree::payload(b, 0))
                    .unwrap_or_default()
            })
            .collect();
        same_settings(members, &payloads)?;
        let first = payloads.first().cloned().unwrap_or_default();
        let ids = first.get(SETTINGS_BYTES..).unwrap_or_default().to_vec();
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
        super::warm::warm_channels(&comms, slot_cap)?;
        let slots = Arc::new(Slots::new(&ctx, SLOTS)?);
        // Under a budget the ring is made now, not in the first call.
        let rings = match (shared_rings, slot_cap) {
            (Some(r), _) => {
                r.register_with(&comms)?;
                r
            }
            (None, Some(cap)) => Arc::new(Rings::with(Some(Ring::new(
                &ctx,
                cap,
                cfg.gpu_net_ring,
                &comms,
            )?))),
            (None, None) => Arc::new(Rings::with(None)),
        };
        let shared = Arc::new(Shared {
            broken: Mutex::new(None),
            comms: comms.clone(),
            rank,
            trace: Trace::new(cfg.gpu_net_trace, rank),
        });
        let (done_tx, done_rx) = unbounded();
        let mut jobs = Vec::new();
        let mut workers = Vec::new();
        for (c, comm) in comms.iter().enumerate() {
            let (jtx, jrx) = unbounded();
            workers.push(spawn(c, comm.clone(), jrx, done_tx.clone())?);
            jobs.push(jtx);
        }
        let (tx, rx) = unbounded();
        let tables = match &kernel {
            Some((k, _)) if k.limits().table > 0 => {
                Some(Tables::new(&ctx, TABLES, k.limits().table)?)
            }
            _ => None,
        };
        let progress = Progress {
            rx,
            done_rx,
            jobs,
            workers,
            slots: slots.clone(),
            tables: tables.clone(),
            shared: shared.clone(),
            timeout: cfg.timeout(),
            // RAILCC_SPIN_US's rule, on the whole job's ranks of this host (an engine's own
            // communicators may hold one rank a host): none where they outnumber the cores,
            // or where RAILCC_SPIN_US is 0.
            spin: if parent.spin().is_zero() {
                Duration::ZERO
            } else {
                Duration::from_micros(cfg.gpu_net_spin_us)
            },
        };
        // Before the progress thread: nothing may fail once it runs.
        let stamps = match (&kernel, cfg.gpu_net_trace != 0) {
            (Some(_), true) => Some((
                Flags::new(&ctx, netcopy::STAMP_CALLS * netcopy::STAMP_WORDS)?,
                Default::default(),
            )),
            _ => None,
        };
        let progress = std::thread::Builder::new()
            .name("railcc-progress".into())
            .spawn(move || progress.run())
            .map_err(|e| Error::io("gpu net: starting the progress thread", &e))?;
        let desc = match &kernel {
            None => format!(
                "{nch} channel(s) over {}, staged through pinned host memory by copies on the caller's stream (about 8 pieces per call, {} KiB to 32 MiB each); no thread blocks",
                parent.transport(),
                cfg.gpu_net_chunk_bytes / 1024
            ),
            Some((_, b)) => format!(
                "{nch} channel(s) over {}, staged through pinned host memory by a kernel of {b} thread block(s) per call (SM copies to and from the mapped ring){}",
                parent.transport(),
                match slot_cap {
                    Some(cap) => format!(
                        "; one ring of {} x 2 slots of {} KiB for every stream",
                        cfg.gpu_net_ring,
                        cap / 1024
                    ),
                    None => String::new(),
                }
            ),
        };
        Ok(GpuNet {
            rank,
            nranks,
            ctx,
            slots,
            rings,
            shared,
            tx,
            progress: Some(progress),
            cut: Cut {
                channels: nch,
                chunk_bytes: slot_cap
                    .map_or(cfg.gpu_net_chunk_bytes, |c| c.min(cfg.gpu_net_chunk_bytes)),
                max_piece_bytes: slot_cap.unwrap_or(cfg.gpu_net_chunk_bytes.max(32 << 20)),
                target_pieces: 8,
                min_spread_bytes: 64 * 1024,
                p2p_min_spread_bytes: cfg.gpu_net_p2p_spread_bytes.max(1),
                // A group's piece k holds chunk k of each message, up to one send and one
                // receive per peer: each at most a slot over the peers, so a piece fits the
                // ring (a group that repeats a peer may still grow it, past the budget).
                // (Without a budget `max_piece_bytes` alone bounds a message's chunk.)
                p2p_max_piece_bytes: slot_cap.map_or(usize::MAX, |c| {
                    (c / nranks.saturating_sub(1).max(1) / 4096 * 4096).max(4096)
                }),
            },
            slot_cap,
            ring_depth: cfg.gpu_net_ring,
            kernel,
            stamps,
            tables,
            timeout: cfg.timeout(),
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

    /// Thread blocks a call's staging kernel launches take (0: copies on the stream, no
    /// kernel).
    pub fn blocks(&self) -> u32 {
        self.kernel.as_ref().map_or(0, |(_, b)| *b)
    }

    /// How data moves, for logs and bench headers.
    pub fn describe(&self) -> &str {
        &self.desc
    }

    /// The error that broke the engine, if any (ncclCommGetAsyncError).
    pub fn async_error(&self) -> Option<Error> {
        self.shared.broken()
    }

    /// As [`GpuNet::abort`], with `why` as the engine's error and the reason its peers hear.
    pub fn abort_with(&self, why: Error) {
        self.shared.fail(why);
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
        let t0 = self.shared.trace.on().then(Instant::now);
        if let Some(e) = self.async_error() {
            return Err(Error::earlier(&e).rank(self.rank));
        }
        let op = match self.checked(op)? {
            Some(op) => op,
            None => return Ok(()),
        };
        // From here on the peers enqueue their part of this call: a failure that leaves this
        // rank without it would pair its next call with theirs, so it breaks the engine
        // (every rank then fails naming the cause) instead of returning quietly.
        // SAFETY: the caller's stream (contract above).
        let r = unsafe { self.take_slots(op, stream) }.map_err(|e| e.rank(self.rank));
        let (captured, ring, runs) = r.inspect_err(|e| self.shared.fail(e.clone()))?;
        let tables = match &self.tables {
            Some(t) if !captured => t.take(tables_for(&runs, t.entries())),
            _ => Vec::new(),
        };
        let call = Arc::new(Call {
            captured,
            runs,
            ring,
            tables,
        });
        // SAFETY: the caller's stream and buffers (contract above); the ring's slots hold
        // every piece's staged bytes (sized by stage_need).
        let t_ops = t0.map(|_| Instant::now());
        let ops = || unsafe {
            match &self.kernel {
                Some((k, blocks)) if kernel_fits(&call) => {
                    self.kernel_ops(&call, stream, k, *blocks)
                }
                _ => self.stream_ops(&call, stream),
            }
        };
        // After the communicator's previous call, whatever its stream (one ring for all).
        // SAFETY: the caller's stream, of this engine's context.
        let ops = match call.captured {
            true => ops(),
            false => unsafe { self.rings.in_order(&self.ctx, stream as usize, ops) },
        };
        let times = t0.zip(t_ops).map(|(t0, t)| (t0, t - t0, t.elapsed()));
        if let Err(e) = &ops {
            // Part of the call may be on the stream already: break the engine so the progress
            // thread lets every piece go instead of the stream waiting forever.
            self.shared.fail(e.clone().rank(self.rank));
        }
        let first = call.runs.first().map_or(0, |r| r.slot);
        let t_hand = t0.map(|_| Instant::now());
        self.tx.send(ToProgress::Call(call)).map_err(|_| {
            Error::new(ErrorKind::Aborted, "gpu net: progress thread gone").rank(self.rank)
        })?;
        if let Some(t) = t_hand {
            // A wake-up of the progress thread when it had parked.
            self.shared.trace.step("hand", t.elapsed());
        }
        if let Some((t0, slots, ops)) = times {
            // The total includes handing the call to the progress thread (a wake-up).
            self.shared.trace.enqueued(t0.elapsed(), slots, ops);
        }
        ops?;
        if captured {
            let tx = self.tx.clone();
            // SAFETY: the stream is being captured (checked above).
            unsafe {
                on_graph_destroy(
                    stream,
                    Box::new(move || {
                        let _ = tx.send(ToProgress::Release(first));
                    }),
                )
            }?;
        }
        Ok(())
    }

    /// Cuts a checked call into pieces and takes a flag slot for each, with the staging ring
    /// of `stream` (grown to the largest piece). A failure takes no slot.
    ///
    /// # Safety
    /// `stream` as in [`GpuNet::enqueue`].
    unsafe fn take_slots(&self, op: NetOp, stream: Stream) -> Result<(bool, Arc<Ring>, Vec<Run>)> {
        let trace = &self.shared.trace;
        let t0 = trace.on().then(Instant::now);
        let pieces = pieces_in_order(&op, self.rank, &self.cut);
        let (sb, rb) = stage_need(&pieces);
        let t1 = trace.on().then(Instant::now);
        self.ctx.bind()?;
        // SAFETY: the caller's stream (contract above).
        let captured = unsafe { capturing(stream) }?;
        let ring = self.rings.for_call(
            sb.max(rb),
            self.ring_depth,
            self.slot_cap,
            captured,
            &self.ctx,
            &self.shared.comms,
        )?;
        let t2 = trace.on().then(Instant::now);
        let broken = || self.shared.broken();
        let taken = self
            .slots
            .take(pieces.len(), captured, &broken, self.timeout)?;
        let runs = (pieces.into_iter().zip(taken).enumerate())
            .map(|(k, (piece, Taken { slot, token }))| Run {
                slot,
                token,
                channel: k % self.cut.channels,
                piece,
            })
            .collect();
        if let (Some(t0), Some(t1), Some(t2)) = (t0, t1, t2) {
            trace.step("cut", t1 - t0);
            trace.step("ring", t2 - t1);
            trace.step("take", t2.elapsed());
        }
        Ok((captured, ring, runs))
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
                if a.count == 0 && a.coll != railcc_core::call::CollKind::Barrier {
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

/// Launches of more entries than this take a table (`RAILCC_GPU_NET_TABLE`); smaller ones
/// pass their few entries in the parameter.
const TABLE_ABOVE_ENTRIES: usize = 64;

/// Tables a call's launches need, counting every piece at its most entries (a pair piece
/// takes 2 of its 3); 0 when the call is small enough for the parameter.
fn tables_for(runs: &[Run], per_table: usize) -> usize {
    let entries: usize = (runs.iter())
        .map(|r| 1 + r.piece.down.len() + r.piece.up.len())
        .sum();
    match entries > TABLE_ABOVE_ENTRIES && per_table > 0 {
        true => entries.div_ceil(per_table),
        false => 0,
    }
}

impl Drop for GpuNet {
    fn drop(&mut self) {
        let _ = self.tx.send(ToProgress::Stop { abort: false });
        if let Some(h) = self.progress.take() {
            let _ = h.join();
        }
        // The rings may be shared with another engine that lives on: not through them.
        self.rings.forget(&self.shared.comms);
        // Launches and copies still ahead on a stream read the flags, the tables and the
        // rings and run the kernel's code: freed once the GPU has passed the last call (as
        // NCCL's destroy waits for the communicator's work). A stream held up past that by
        // the caller's own work keeps them, leaked with a warning, rather than read freed
        // memory. Broken (aborted, a peer lost), every piece was let go: a stream still
        // behind is held by the caller's other work, which waiting would not end (and
        // NCCL's abort returns).
        let within = match self.shared.broken() {
            Some(_) => DRAIN_WAIT_BROKEN,
            None => self.timeout.min(DRAIN_WAIT),
        };
        let settled = self.rings.settled(&self.ctx, within);
        self.shared.trace.report();
        if let Some((f, _)) = &self.stamps {
            let words: Vec<u32> = (0..f.words()).map(|i| f.load(i)).collect();
            eprintln!(
                "railcc: rank {} gpu net kernel stamps{}",
                self.rank,
                super::trace::stamp_summary(&words, netcopy::STAMP_WORDS)
            );
        }
        if !settled {
            tracing::warn!(
                "rank {}: gpu net: the GPU had not finished the communicator's last call {within:?} after its close: its flags and staging stay allocated",
                self.rank
            );
            std::mem::forget(self.slots.clone());
            std::mem::forget(self.rings.clone());
            std::mem::forget(self.tables.take());
            std::mem::forget(self.stamps.take());
            std::mem::forget(self.kernel.take());
            std::mem::forget(self.ctx.clone());
        }
    }
}

#[cfg(test)]
mod settings_tests {
    use super::{cut_settings, same_settings};

    #[test]
    fn ranks_with_other_cut_settings_are_named() {
        let cfg = railcc_core::Config::default();
        let mut other = cfg.clone();
        other.gpu_net_p2p_spread_bytes = 16384;
        let ids = [7u8; 3];
        let a = [cut_settings(&cfg).as_slice(), &ids].concat();
        let b = cut_settings(&cfg).to_vec();
        assert!(same_settings(&[0, 2, 4], &[a.clone(), b.clone(), b]).is_ok());
        let c = cut_settings(&other).to_vec();
        let e = same_settings(&[0, 2, 4], &[a, cut_settings(&cfg).to_vec(), c])
            .expect_err("rank 4 differs");
        let msg = e.to_string();
        assert!(msg.contains("rank 4") && msg.contains("16384"), "{msg}");
    }
}

#[cfg(test)]
mod table_tests {
    use super::{tables_for, Piece, Run};
    use crate::gpu::net::pieces::{HostCall, Seg, Segs};

    fn runs(n: usize, nd: usize, nu: usize) -> Vec<Run> {
        let seg = Seg {
            dev: 0,
            stage: 0,
            bytes: 8,
        };
        (0..n)
            .map(|k| Run {
                slot: k,
                token: 1,
                channel: 0,
                piece: Piece {
                    down: Segs::from_elem(seg, nd),
                    call: HostCall::P2p(vec![]),
                    up: Segs::from_elem(seg, nu),
                    send_bytes: 8,
                    recv_bytes: 8,
                },
            })
            .collect()
    }

    #[test]
    fn large_calls_take_tables_and_small_ones_the_parameter() {
        // Counted at 3 entries a piece of two segments: 21 pieces (63) pass the parameter,
        // 22 (66) take a table.
        assert_eq!(tables_for(&runs(21, 1, 1), 2012), 0);
        assert_eq!(tables_for(&runs(22, 1, 1), 2012), 1);
        // A 128 MB and a 1 GB all_reduce (74 and 592 pieces of 1.75 MiB): one table each;
        // 700 pieces counted at 2100 entries: two.
        assert_eq!(tables_for(&runs(74, 1, 1), 2012), 1);
        assert_eq!(tables_for(&runs(592, 1, 1), 2012), 1);
        assert_eq!(tables_for(&runs(700, 1, 1), 2012), 2);
        // Pieces of many segments (an all-to-all's rows).
        assert_eq!(tables_for(&runs(40, 8, 8), 2012), 1);
        // No table kernel.
        assert_eq!(tables_for(&runs(74, 1, 1), 0), 0);
    }
}
