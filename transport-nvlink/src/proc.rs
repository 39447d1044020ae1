//! One process per GPU (torchrun style): each rank drives its own GPU and reaches its peers'
//! memory through CUDA IPC.
//!
//! At init the ranks of one host swap, over the bootstrap, the IPC handles of their sync areas
//! and the name of a shared-memory table (table.rs). Each call publishes the call's shape and
//! buffers in the table, reads the peers' (which also catches mismatched calls), maps any
//! allocation not seen before (share.rs: legacy IPC or VMM descriptors), and enqueues the same
//! kernel as the one-process path on the caller's stream. A buffer no peer can map (a
//! stream-ordered pool's) is copied into, or out of, this rank's bounce buffer around the
//! kernel ([`ProcGpu::bounce`]). The call returns once every rank has published, without waiting for any GPU.
//! Sends and receives go through the same table (a mailbox per pair of ranks) and copy
//! straight from the sender's buffer (`ProcGpu::p2p`).
//!
//! A watcher thread checks every 20 ms that the peers' processes live (`/proc/<pid>/stat`,
//! with the start time each reported, so a reused pid is not taken for the peer). When one
//! dies, the communicator breaks naming it: the kernels stop waiting (`GpuCtx::abort_kernels`),
//! waiting calls fail and later ones fail at once.

use crate::fdpass::FdPost;
use crate::order::KernelOrder;
use crate::plan::{choose, clamp_blocks, enqueue, reach, Choice, Kernel, Launch, Peers};
use crate::share::Share;
use crate::table::ShmTable;
use crate::Settings;
use parking_lot::Mutex;
use railcc_core::agree::{agree, Exchange};
use railcc_core::call::{Call, CollArgs, CollKind};
use railcc_core::{Error, ErrorKind, Result};
use railcc_cuda::gpu::{
    copy_async, is_capturing, stream_of, stream_waits_for, DevBuf, GpuCtx, Stream,
};
use railcc_cuda::ipc::{export, open, BufDesc, HANDLE_BYTES};
use railcc_cuda::kernels::MAX_PEERS;
use railcc_cuda::p2p_many;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod defer;
mod late;
mod p2p;
mod p2p_small;
mod stage;
pub use p2p::P2p;
use p2p::STAGE_SLOT_BYTES;

pub struct ProcGpu {
    pub gpu: Arc<GpuCtx>,
    pub rank: usize,
    pub nranks: usize,
    /// Every rank's sync area as this GPU addresses it.
    syncs: Vec<u64>,
    table: Arc<ShmTable>,
    /// Dropped by hand at close (`Drop`): left allocated, with the peers' buffers it maps,
    /// when the last call's kernels outlive the close.
    share: ManuallyDrop<Arc<Mutex<Share>>>,
    /// The launcher of calls that return before their peers arrive (`RAILCC_GPU_DEFER`),
    /// which also checks the calls made through the fixed stage.
    defer: Option<defer::Deferred>,
    /// Calls are deferred (`RAILCC_GPU_DEFER`), not only checked.
    defer_calls: bool,
    /// Every rank's fixed stage (`RAILCC_GPU_STAGE_BYTES`, `stage.rs`). Dropped by hand at
    /// close, as `share`.
    fixed: Option<stage::FixedStage>,
    /// Low-latency all-reduces launch without a meeting (`RAILCC_GPU_LL_NO_WAIT` on every
    /// rank), checked behind them by the launcher as the stage's calls are.
    ll_no_wait: bool,
    /// The slots of late kernel arguments, where every rank has them (`late.rs`).
    late: Option<Arc<late::LateSlots>>,
    /// ... which the push kernel's all-reduces take too (`RAILCC_GPU_LATE_ARGS=2`).
    late_push: bool,
    /// ... unless every peer is there within this (`RAILCC_GPU_LATE_WAIT_US`).
    late_wait: Duration,
    /// ... and a late kernel waits on its stream for its arguments (`RAILCC_GPU_LATE_GATE`).
    late_gate: bool,
    /// Where the data of buffers no peer can map goes through (made and grown on use), and
    /// the stream that used it last.
    bounce: Mutex<Bounce>,
    /// Per peer, the staging slots of buffered sends (made on first use).
    stages: Mutex<std::collections::HashMap<usize, (railcc_cuda::gpu::DevBuf, BufDesc)>>,
    calls: AtomicU64,
    /// The last collective kernel enqueued outside a capture: its stream, and a marker after it.
    kernel_order: Mutex<KernelOrder>,
    /// This rank as the communicator numbers it (the hierarchy's name), for errors.
    own_name: usize,
    /// The communicator's name of each rank here (as `own_name`).
    names: Vec<usize>,
    timeout: Duration,
    /// How calls pick their kernel, agreed at init (every rank the same).
    choice: Choice,
    /// A group's sends and receives as batch kernels (`RAILCC_GPU_P2P_BATCH`).
    p2p_batch: bool,
    p2p_fused: bool,
    p2p_early: bool,
    /// Sends up to this many bytes (at most STAGE_SLOT_BYTES) are staged.
    stage_bytes: usize,
    p2p_min_chunk: u64,
    /// Messages up to this many bytes go by `p2p_ll` (0: none), agreed at init.
    p2p_ll_bytes: usize,
    /// Where `p2p_ll` is on: the count of the other messages per (peer, send), which number
    /// them in the table instead of the caller's `seq` (that counts every message).
    p2p_ll_seqs: Mutex<std::collections::HashMap<(usize, bool), u64>>,
    trace: crate::host_trace::HostTrace,
    broken: Arc<Mutex<Option<Error>>>,
    /// The watcher's stop and closing flags, and its thread.
    watcher: Option<(Arc<AtomicBool>, Arc<AtomicBool>, JoinHandle<()>)>,
}

/// A process as `/proc` names it: pid and start time (clock ticks since boot).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Proc {
    pid: u32,
    start: u64,
}

impl Proc {
    fn me() -> Proc {
        let pid = std::process::id();
        Proc {
            pid,
            start: Proc::start_of(pid).map_or(0, |(_, s)| s),
        }
    }

    /// State letter and start time of `pid`, if it is visible here.
    fn start_of(pid: u32) -> Option<(char, u64)> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the command name (which may hold spaces and parentheses): state is field 3,
        // start time field 22.
        let rest = &stat[stat.rfind(')')? + 1..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        Some((f.first()?.chars().next()?, f.get(19)?.parse().ok()?))
    }

    /// Whether this process still runs (a zombie has exited).
    fn alive(&self) -> bool {
        matches!(Proc::start_of(self.pid), Some((st, s)) if s == self.start && st != 'Z' && st != 'X')
    }
}

/// The error of a kernel that stopped at its deadline (kernels.rs `ABORT_TIMED_OUT`), on
/// rank `rank` as the communicator numbers it.
fn kernel_timeout(rank: usize) -> Error {
    Error::new(
        ErrorKind::Timeout,
        "a GPU kernel waited longer than the timeout (RAILCC_TIMEOUT_MS) for a peer",
    )
    .rank(rank)
    .transport(crate::NAME)
}

/// The error of a low-latency receive (`p2p_ll`) that found another byte count than its
/// own: rank `rank` receives from `peer`, which sends `bytes` (as the communicator numbers
/// both).
fn size_mismatch(rank: usize, peer: usize, bytes: u64) -> Error {
    Error::new(
        ErrorKind::Mismatch,
        format!(
            "send/recv: rank {peer} sends {bytes} bytes where rank {rank} receives another count"
        ),
    )
    .rank(rank)
    .peer(peer)
    .transport(crate::NAME)
}

/// What the watcher thread of one rank looks after.
struct Watch {
    me: usize,
    /// Peers whose process is visible here, with the process each reported.
    peers: Vec<(usize, Proc)>,
    /// The communicator's rank of each local rank (the hierarchy's names).
    names: Vec<usize>,
    gpu: Arc<GpuCtx>,
    broken: Arc<Mutex<Option<Error>>>,
    table: Arc<ShmTable>,
    /// The communicator is closing (waiting for its last call's kernels): a peer that
    /// exits then has closed too, so it only stops this rank's kernels, unreported.
    closing: Arc<AtomicBool>,
    /// Lets streams waiting for the launcher go (`RAILCC_GPU_DEFER`, late arguments), and
    /// tells whether the launcher is stuck.
    release: Option<Arc<defer::Release>>,
}

impl Watch {
    fn name(&self, x: usize) -> usize {
        self.names.get(x).copied().unwrap_or(x)
    }

    /// Until `stop` or the communicator breaks: every 20 ms, whether a peer's process died or a
    /// peer reported a failure in the table (both break this rank), and whether this rank's
    /// kernels ran past their deadline (reported to the peers, which would otherwise wait).
    fn run(&self, stop: &AtomicBool) {
        // Since when a peer's claim of the failure record has had no text.
        let mut textless: Option<Instant> = None;
        while !stop.load(Ordering::Relaxed) {
            if let Some((r, p)) = self.peers.iter().find(|(_, p)| !p.alive()) {
                if self.closing.load(Ordering::Relaxed) {
                    tracing::debug!("rank {} exited while this rank closed", self.name(*r));
                    stop_gpu_work(&self.gpu, self.release.as_deref());
                    return;
                }
                let e = Error::new(
                    ErrorKind::PeerClosed,
                    format!(
                        "rank {} (pid {}) exited during GPU collectives",
                        self.name(*r),
                        p.pid
                    ),
                )
                .peer(self.name(*r))
                .rank(self.name(self.me))
                .transport(crate::NAME);
                return self.break_with(e, true);
            }
            let report = self.table.broken().or_else(|| {
                let r = self.table.claimed().filter(|&r| r != self.me)?;
                let since = *textless.get_or_insert_with(Instant::now);
                (since.elapsed() > Duration::from_millis(200)).then(|| {
                    (
                        r,
                        "its report never completed (did its process die?)".to_string(),
                    )
                })
            });
            if let Some((r, text)) = report {
                if r != self.me {
                    let e = Error::new(
                        ErrorKind::PeerClosed,
                        format!("rank {} broke the communicator: {text}", self.name(r)),
                    )
                    .peer(self.name(r))
                    .rank(self.name(self.me))
                    .transport(crate::NAME);
                    return self.break_with(e, false);
                }
            }
            if self.gpu.kernels_timed_out() {
                return self.break_with(kernel_timeout(self.name(self.me)), true);
            }
            if let Some(d) = self.release.as_ref().and_then(|r| r.stuck()) {
                let e = Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "the GPU call launcher has been on one call for {:.1} s, past twice the communicator's timeout: stuck (in a driver call?)",
                        d.as_secs_f64()
                    ),
                )
                .rank(self.name(self.me))
                .transport(crate::NAME);
                return self.break_with(e, true);
            }
            if let Some((peer, bytes)) = self.gpu.kernels_size_mismatch() {
                let e = size_mismatch(self.name(self.me), self.name(peer), bytes);
                return self.break_with(e, true);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn break_with(&self, e: Error, report: bool) {
        tracing::warn!("{e}");
        let first = self.broken.lock().get_or_insert(e).clone();
        stop_gpu_work(&self.gpu, self.release.as_deref());
        if report {
            self.table.report_broken(self.me, &first.to_string());
        }
    }
}

/// What each rank tells the others at init.
#[derive(Clone)]
struct Hello {
    host: String,
    sync: [u8; HANDLE_BYTES],
    shm: String,
    blocks: u32,
    /// Settings that pick a call's kernel, which every rank must pick alike: each rank's
    /// low-latency limit and least blocks; the communicator takes the least of each.
    ll_max: u32,
    min_blocks: u32,
    /// All-reduces from this many bytes on the push kernel (0: never), where at least
    /// `push_min_blocks` are allowed, in tiles of at most `push_slot` bytes.
    push: u64,
    push_min_blocks: u32,
    push_slot: u32,
    /// All-gathers from this many bytes on the copy engines (0: never).
    ag_copy: u64,
    /// All-reduces from this many bytes spread on the copy engines (0: never).
    ar_copy: u64,
    /// Sends and receives up to this many bytes by `p2p_ll` (0: none): both ends of a
    /// message must classify it alike.
    p2p_ll: u32,
    /// This rank defers calls (`RAILCC_GPU_DEFER`): then no rank shows its peers an
    /// allocation over one they may have mapped (`Share`'s `keep_mappings`).
    defer: bool,
    /// This rank launches low-latency all-reduces without a meeting (`RAILCC_GPU_LL_NO_WAIT`):
    /// the communicator does where every rank does. Shares the defer flag's byte (bit 1).
    ll_no_wait: bool,
    /// This rank enqueues bulk-kernel calls before their peers arrive (`RAILCC_GPU_LATE_ARGS`,
    /// `late.rs`): the communicator does where every rank does and none defers (bit 2).
    late_args: bool,
    /// ... and all-reduces on the push kernel too (`RAILCC_GPU_LATE_ARGS=2`, bit 3).
    late_push: bool,
    /// This rank's fixed stage (`stage.rs`): its IPC handle and size (0: none).
    stage: [u8; HANDLE_BYTES],
    stage_bytes: u64,
    proc: Proc,
    /// Proves this rank's descriptor messages (fdpass.rs) to its peers.
    token: u64,
}

impl Hello {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&self.token.to_le_bytes());
        v.extend_from_slice(&self.sync);
        v.extend_from_slice(&self.blocks.to_le_bytes());
        v.extend_from_slice(&self.proc.pid.to_le_bytes());
        v.extend_from_slice(&self.proc.start.to_le_bytes());
        v.extend_from_slice(&self.ll_max.to_le_bytes());
        v.extend_from_slice(&self.min_blocks.to_le_bytes());
        v.extend_from_slice(&self.push.to_le_bytes());
        v.extend_from_slice(&self.push_min_blocks.to_le_bytes());
        v.extend_from_slice(&self.push_slot.to_le_bytes());
        v.extend_from_slice(&self.ag_copy.to_le_bytes());
        v.extend_from_slice(&self.ar_copy.to_le_bytes());
        v.extend_from_slice(&self.p2p_ll.to_le_bytes());
        v.push(
            self.defer as u8
                | (self.ll_no_wait as u8) << 1
                | (self.late_args as u8) << 2
                | (self.late_push as u8) << 3,
        );
        v.extend_from_slice(&self.stage);
        v.extend_from_slice(&self.stage_bytes.to_le_bytes());
        for s in [&self.host, &self.shm] {
            v.extend_from_slice(&(s.len() as u16).to_le_bytes());
            v.extend_from_slice(s.as_bytes());
        }
        v
    }

    fn decode(b: &[u8]) -> Option<Hello> {
        let token = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
        let b = b.get(8..)?;
        let sync: [u8; HANDLE_BYTES] = b.get(..HANDLE_BYTES)?.try_into().ok()?;
        let word = |at: usize| -> Option<u32> {
            Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
        };
        let word64 = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
        };
        let (blocks, pid) = (word(HANDLE_BYTES)?, word(HANDLE_BYTES + 4)?);
        let start = word64(HANDLE_BYTES + 8)?;
        let (ll_max, min_blocks) = (word(HANDLE_BYTES + 16)?, word(HANDLE_BYTES + 20)?);
        let push = word64(HANDLE_BYTES + 24)?;
        let (push_min_blocks, push_slot) = (word(HANDLE_BYTES + 32)?, word(HANDLE_BYTES + 36)?);
        let (ag_copy, ar_copy) = (word64(HANDLE_BYTES + 40)?, word64(HANDLE_BYTES + 48)?);
        let p2p_ll = word(HANDLE_BYTES + 56)?;
        let flags = *b.get(HANDLE_BYTES + 60)?;
        let (defer, ll_no_wait) = (flags & 1 != 0, flags & 2 != 0);
        let (late_args, late_push) = (flags & 4 != 0, flags & 8 != 0);
        let stage: [u8; HANDLE_BYTES] = b
            .get(HANDLE_BYTES + 61..2 * HANDLE_BYTES + 61)?
            .try_into()
            .ok()?;
        let stage_bytes = word64(2 * HANDLE_BYTES + 61)?;
        let mut at = 2 * HANDLE_BYTES + 69;
        let mut s = [String::new(), String::new()];
        for x in s.iter_mut() {
            let n = u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?) as usize;
            *x = String::from_utf8(b.get(at + 2..at + 2 + n)?.to_vec()).ok()?;
            at += 2 + n;
        }
        let [host, shm] = s;
        Some(Hello {
            host,
            sync: sync.to_owned(),
            shm,
            blocks,
            ll_max,
            min_blocks,
            push,
            push_min_blocks,
            push_slot,
            ag_copy,
            ar_copy,
            p2p_ll,
            defer,
            ll_no_wait,
            late_args,
            late_push,
            stage,
            stage_bytes,
            proc: Proc { pid, start },
            token,
        })
    }
}

impl ProcGpu {
    /// This rank's host trace (`RAILCC_GPU_HOST_TRACE`), where callers above add their own
    /// phases (libnccl: a whole call, to set against the phases measured here).
    pub fn host_trace(&self) -> &crate::host_trace::HostTrace {
        &self.trace
    }

    /// Collective over `nranks` processes of one host, this one driving GPU `ordinal`.
    /// `exchange` is the bootstrap's all-gather (every rank's setup outcome travels in it:
    /// `railcc_core::agree`); every rank must call this together. `names`: how errors name
    /// ranks 0..nranks (a larger communicator's ranks; default themselves).
    pub fn new(
        ordinal: usize,
        rank: usize,
        nranks: usize,
        settings: &Settings,
        exchange: &mut Exchange<'_>,
        names: Option<&[usize]>,
    ) -> Result<ProcGpu> {
        if nranks == 0 || nranks > MAX_PEERS || rank >= nranks {
            return Err(Error::invalid(format!(
                "GPU ranks: rank {rank} of {nranks} (1 to {} ranks per host)",
                MAX_PEERS
            )));
        }
        let shm = format!(
            "/railcc-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        );
        let setup = settings.open_gpu(ordinal).and_then(|gpu| {
            gpu.bind()?;
            let sync = export(gpu.sync.ptr)?;
            let blocks = clamp_blocks(std::slice::from_ref(&gpu), settings.max_blocks)?;
            let table = if rank == 0 {
                Some(ShmTable::open(&shm, nranks, true)?)
            } else {
                None
            };
            let stage = match settings.stage_bytes {
                0 => None,
                bytes => {
                    let buf = gpu.alloc(bytes)?;
                    let desc = export(buf.ptr)?;
                    Some((buf, desc.handle))
                }
            };
            Ok((gpu, sync, blocks, table, stage))
        });
        let name = |x: usize| names.and_then(|n| n.get(x).copied()).unwrap_or(x);
        let secret = railcc_core::auth::Secret::random()?.0;
        let token = u64::from_le_bytes([
            secret[0], secret[1], secret[2], secret[3], secret[4], secret[5], secret[6], secret[7],
        ]);
        let ((gpu, _, _, table0, own_stage), hellos) =
            agree(setup, exchange, &name, |(_, sync, blocks, _, stage)| {
                Hello {
                    host: railcc_core::netif::hostname(),
                    sync: sync.handle,
                    shm: shm.clone(),
                    blocks: *blocks,
                    ll_max: settings.ll_max_bytes.min(u32::MAX as usize) as u32,
                    min_blocks: settings.min_blocks.min(u32::MAX as usize) as u32,
                    push: settings.push_bytes as u64,
                    push_min_blocks: settings.push_min_blocks,
                    push_slot: settings.push_slot.min(u32::MAX as usize) as u32,
                    ag_copy: settings.ag_copy_bytes as u64,
                    ar_copy: settings.ar_copy_bytes as u64,
                    p2p_ll: settings.p2p_ll_bytes.min(railcc_cuda::p2p_ll::MAX_BYTES) as u32,
                    defer: settings.defer,
                    ll_no_wait: settings.ll_no_wait,
                    late_args: settings.late_args,
                    late_push: settings.late_push,
                    stage: stage.as_ref().map_or([0; HANDLE_BYTES], |s| s.1),
                    stage_bytes: stage.as_ref().map_or(0, |s| s.0.bytes as u64),
                    proc: Proc::me(),
                    token,
                }
                .encode()
            })?;
        let hellos = hellos
            .iter()
            .enumerate()
            .map(|(r, b)| {
                Hello::decode(b).ok_or_else(|| {
                    Error::new(ErrorKind::Protocol, format!("bad GPU hello from rank {r}")).peer(r)
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // Second step: open the table and the peers' sync areas, everyone or no one.
        let gpu = Arc::new(gpu);
        let opened = (|| {
            if let Some(r) = hellos.iter().position(|h| h.host != hellos[rank].host) {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "GPU ranks must share a host for peer-to-peer: rank {r} is on {}, rank {rank} on {}",
                        hellos[r].host, hellos[rank].host
                    ),
                )
                .peer(r));
            }
            let table = match table0 {
                Some(t) => t,
                None => ShmTable::open(&hellos[0].shm, nranks, false)?,
            };
            // Bound now, before any peer can send: peers send only once init is over.
            let post = FdPost::bind(hellos[0].shm.trim_start_matches('/'), rank)?;
            gpu.bind()?;
            let mut syncs = Vec::with_capacity(nranks);
            for (r, h) in hellos.iter().enumerate() {
                syncs.push(if r == rank {
                    gpu.sync.ptr
                } else {
                    open(&h.sync).map_err(|e| e.peer(r))?
                });
            }
            let tokens = hellos.iter().map(|h| h.token).collect();
            // A launcher that maps peers' buffers (defer, late arguments) may never close a
            // mapping a waiting kernel may read (`Share`).
            let keep_mappings = hellos.iter().any(|h| h.defer || h.late_args);
            let share = Share::new(rank, gpu.clone(), post, tokens, keep_mappings)?;
            // Every rank's fixed stage, where every rank has one (the least size).
            let stage_bytes = hellos.iter().map(|h| h.stage_bytes).min().unwrap_or(0);
            let mut stages = None;
            if own_stage.is_some() && stage_bytes == 0 {
                tracing::info!(
                    "rank {rank}: a peer has RAILCC_GPU_STAGE_BYTES=0: no fixed stage for this communicator"
                );
            }
            if let (Some((own, _)), true) = (own_stage, stage_bytes > 0) {
                let (mut at, mut opened) = (Vec::with_capacity(nranks), Vec::new());
                for (r, h) in hellos.iter().enumerate() {
                    if r == rank {
                        at.push(own.ptr);
                        continue;
                    }
                    match open(&h.stage) {
                        Ok(m) => {
                            at.push(m);
                            opened.push(m);
                        }
                        Err(e) => {
                            // SAFETY: opened just now; nothing reads them yet.
                            opened
                                .iter()
                                .for_each(|&m| unsafe { railcc_cuda::ipc::close(m) });
                            return Err(e.peer(r));
                        }
                    }
                }
                stages = Some(stage::FixedStage::new(own, stage_bytes, at, opened));
            }
            Ok((table, syncs, share, stages))
        })();
        let ((table, syncs, share, fixed), _) = agree(opened, exchange, &name, |_| Vec::new())?;
        if rank == 0 {
            ShmTable::unlink(&hellos[0].shm);
        }
        let max_blocks = hellos.iter().map(|h| h.blocks).min().unwrap_or(1);
        // One kernel choice for every rank, whatever each was started with.
        let ll_max_bytes = hellos.iter().map(|h| h.ll_max as usize).min().unwrap_or(0);
        let min_blocks = hellos.iter().map(|h| h.min_blocks).min().unwrap_or(0);
        // 0 (never) on any rank is the least: then no rank pushes.
        let push_bytes = hellos.iter().map(|h| h.push).min().unwrap_or(0) as usize;
        let push_min_blocks = hellos.iter().map(|h| h.push_min_blocks).min().unwrap_or(0);
        let push_slot = hellos.iter().map(|h| h.push_slot).min().unwrap_or(0) as usize;
        let ag_copy_bytes = hellos.iter().map(|h| h.ag_copy).min().unwrap_or(0) as usize;
        let ar_copy_bytes = hellos.iter().map(|h| h.ar_copy).min().unwrap_or(0) as usize;
        let p2p_ll_bytes = hellos.iter().map(|h| h.p2p_ll).min().unwrap_or(0) as usize;
        // Without a meeting only where every rank does so (each decides alike from this).
        let ll_no_wait = ll_max_bytes > 0 && hellos.iter().all(|h| h.ll_no_wait);
        // Late arguments only where every rank asks and none defers (the two launch apart).
        let late_args = hellos.iter().all(|h| h.late_args && !h.defer);
        let late_push = late_args && hellos.iter().all(|h| h.late_push);
        let broken = Arc::new(Mutex::new(None));
        // Peers whose process this one can see (another pid namespace hides them): watched.
        let peers: Vec<(usize, Proc)> = hellos
            .iter()
            .enumerate()
            .filter(|&(r, h)| r != rank && h.proc.alive())
            .map(|(r, h)| (r, h.proc))
            .collect();
        if peers.len() + 1 < nranks {
            tracing::info!(
                "rank {rank}: {} of {} peers' processes are not visible here; their death shows at the deadline",
                nranks - 1 - peers.len(),
                nranks - 1
            );
        }
        let stop = Arc::new(AtomicBool::new(false));
        let closing = Arc::new(AtomicBool::new(false));
        let table = Arc::new(table);
        let own_name = name(rank);
        let all_names: Vec<usize> = (0..nranks).map(name).collect();
        let share = Arc::new(Mutex::new(share));
        if settings.defer {
            tracing::warn!(
                "rank {rank}: RAILCC_GPU_DEFER=1 is an experiment that hangs under PyTorch (bench/results/issue31/return-time-design.md §7); leave it unset"
            );
        }
        if let Some(f) = &fixed {
            tracing::info!(
                "rank {rank}: calls whose data fit {} bytes go through a fixed stage, without waiting for their peers on the host (RAILCC_GPU_STAGE_BYTES)",
                f.bytes()
            );
        }
        // The launcher also checks the peers' entries of calls made without a meeting.
        let unmet = fixed.is_some() || ll_no_wait || late_args;
        // The late slots with the launcher: a rank that cannot make them fails the agreement
        // below with its peers, as one whose launcher did not start.
        let late = match late_args {
            true => gpu
                .bind()
                .and_then(|()| late::LateSlots::new())
                .map(|s| Some(Arc::new(s))),
            false => Ok(None),
        };
        let started = late.and_then(|late| match settings.defer || unmet {
            true => defer::Deferred::start(defer::Parts {
                gpu: gpu.clone(),
                table: table.clone(),
                share: share.clone(),
                broken: broken.clone(),
                rank,
                nranks,
                own_name,
                syncs: syncs.clone(),
                timeout_ns: settings.timeout_ns(),
                launches: settings.defer || late_args,
                late: late.clone(),
            })
            .map(|d| (Some(d), late)),
            false => Ok((None, late)),
        });
        // Where any rank starts a launcher (every rank knows from the hellos), they agree it
        // started: one that failed must not leave its peers' staged kernels waiting for it.
        let (defer, late) = if unmet || hellos.iter().any(|h| h.defer) {
            agree(started, exchange, &name, |_| Vec::new())?.0
        } else {
            started?
        };
        let watcher = {
            let w = Watch {
                me: rank,
                peers,
                names: all_names.clone(),
                gpu: gpu.clone(),
                broken: broken.clone(),
                table: table.clone(),
                closing: closing.clone(),
                release: defer.as_ref().map(|d| d.release().clone()),
            };
            let s = stop.clone();
            std::thread::Builder::new()
                .name("railcc-gpu-watch".into())
                .spawn(move || w.run(&s))
                .map_err(|e| Error::io("starting the GPU peer watcher", &e))?
        };
        Ok(ProcGpu {
            gpu,
            rank,
            nranks,
            syncs,
            table,
            share: ManuallyDrop::new(share),
            defer,
            defer_calls: settings.defer,
            fixed,
            ll_no_wait,
            late,
            late_push,
            late_wait: settings.late_wait,
            late_gate: settings.late_gate,
            bounce: Mutex::new(Bounce::default()),
            stages: Mutex::new(std::collections::HashMap::new()),
            calls: AtomicU64::new(0),
            kernel_order: Mutex::new(KernelOrder::default()),
            own_name,
            names: all_names,
            timeout: settings.timeout,
            // Late arguments reach the bulk kernel, and the push kernel where every rank has
            // =2 (its late form); the copy engines' and the TMA form's calls need their
            // peers' addresses when enqueued.
            choice: {
                let c = Choice {
                    ll_max_bytes,
                    wide: settings.wide_loads,
                    tma: settings.tma,
                    push_bytes,
                    push_min_blocks,
                    push_slot,
                    ag_copy_bytes,
                    ar_copy_bytes,
                    min_blocks,
                    max_blocks,
                };
                match late_args {
                    true => c.for_late_args(late_push),
                    false => c,
                }
            },
            p2p_batch: settings.p2p_batch,
            p2p_fused: settings.p2p_fused,
            p2p_early: settings.p2p_early,
            stage_bytes: settings.p2p_stage_bytes.min(STAGE_SLOT_BYTES),
            p2p_min_chunk: settings.p2p_min_chunk,
            p2p_ll_bytes,
            p2p_ll_seqs: Mutex::new(std::collections::HashMap::new()),
            trace: crate::host_trace::HostTrace::new(settings.host_trace, rank),
            broken,
            watcher: Some((stop, closing, watcher)),
        })
    }

    /// The error that broke this communicator (a peer died, it was aborted, or a kernel waited
    /// past the timeout), if any.
    pub fn async_error(&self) -> Option<Error> {
        let mut b = self.broken.lock();
        if b.is_none() && self.gpu.kernels_timed_out() {
            let e = kernel_timeout(self.own_name);
            // The host's other ranks stop too (the watcher would, within 20 ms).
            self.table.report_broken(self.rank, &e.to_string());
            *b = Some(e);
        }
        if let (true, Some((peer, bytes))) = (b.is_none(), self.gpu.kernels_size_mismatch()) {
            let peer = self.names.get(peer).copied().unwrap_or(peer);
            let e = size_mismatch(self.own_name, peer, bytes);
            self.table.report_broken(self.rank, &e.to_string());
            *b = Some(e);
        }
        b.clone()
    }

    /// As [`ProcGpu::abort`], with `why` as the communicator's error; the host's other ranks
    /// break too, hearing the first failure (`why` unless one came before).
    pub fn abort_with(&self, why: Error) {
        let first = self.broken.lock().get_or_insert(why).clone();
        self.stop_gpu_work();
        self.table.report_broken(self.rank, &first.to_string());
    }

    /// Stops every call now: kernels stop waiting, later calls fail. The peers are not told
    /// (as with NCCL, each rank aborts its own communicator; a teardown that aborts one rank
    /// first must not fail the others' last calls).
    pub fn abort(&self) {
        self.broken.lock().get_or_insert_with(|| {
            Error::new(ErrorKind::Aborted, "communicator aborted")
                .rank(self.own_name)
                .transport(crate::NAME)
        });
        self.stop_gpu_work();
    }

    /// The communicator's timeout as the kernels take it.
    fn timeout_ns(&self) -> u64 {
        self.timeout.as_nanos().min(u64::MAX as u128) as u64
    }

    fn stop_gpu_work(&self) {
        stop_gpu_work(&self.gpu, self.defer.as_ref().map(|d| &**d.release()));
    }

    fn check_alive(&self) -> Result<()> {
        match self.async_error() {
            Some(e) => Err(Error::earlier(&e).rank(self.rank)),
            None => Ok(()),
        }
    }

    pub fn stream(&self) -> Stream {
        self.gpu.stream
    }

    /// Thread blocks per GPU a call takes at most (the least any rank's GPU keeps resident).
    pub fn max_blocks(&self) -> u32 {
        self.choice.max_blocks
    }

    /// Enqueues this rank's part of collective `c` (NCCL's arguments: `c.send`/`c.recv` are
    /// this rank's buffers, the count per rank) on its stream. Returns once every rank has
    /// made the same call; fails with a named cause if a rank made a different one or never
    /// came.
    ///
    /// # Safety
    /// The call's buffers are device memory of this GPU from cudaMalloc/cuMemAlloc, of the
    /// size the collective implies, valid until its stream (one of this GPU's) passes it.
    pub unsafe fn collective(&self, c: &Call) -> Result<Launch> {
        let (a, n) = (c.args, self.nranks);
        if a.nranks != n {
            return Err(Error::invalid(format!(
                "{}: a call for {} ranks on a communicator of {n}",
                a.coll.name(),
                a.nranks
            ))
            .rank(self.rank));
        }
        if a.root >= n {
            return Err(Error::invalid(format!(
                "{}: root {} out of range for {n} ranks",
                a.coll.name(),
                a.root
            ))
            .rank(self.rank));
        }
        let mut clock = self.trace.start();
        self.check_alive()?;
        self.gpu.bind()?;
        let call = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        let mut published = false;
        // SAFETY: this function's contract.
        let r = unsafe { self.collective_as(c, call, &mut published, &mut clock) };
        if let Err(e) = &r {
            // The peers must not wait for this rank's part of the call: a rank that failed
            // before publishing says so in its entry (they fail at once, naming it), and the
            // communicator breaks (its asynchronous error says why, later calls fail).
            // (Where the slot is still a peer's to read, they hear it from the host's failure
            // record instead, within the watcher's 20 ms.)
            if !published && self.table.free_for(call, self.rank) {
                self.table
                    .publish(call, self.rank, FAILED_SHAPE, [BufDesc::EMPTY; 2]);
            }
            self.abort_with(e.clone());
        }
        r
    }

    /// [`ProcGpu::collective`] as call number `call`; `published` set once this rank's entry
    /// is in the table.
    ///
    /// # Safety
    /// As for [`ProcGpu::collective`].
    unsafe fn collective_as(
        &self,
        c: &Call,
        call: u64,
        published: &mut bool,
        clock: &mut Option<Instant>,
    ) -> Result<Launch> {
        let (a, n) = (c.args, self.nranks);
        // A broadcast reads the root's send buffer alone: the others may pass NULL (NCCL's),
        // and export their receive buffer in its place.
        let send = if a.coll == CollKind::Broadcast && self.rank != a.root {
            c.recv
        } else {
            c.send
        };
        // A reduce writes the root's receive buffer alone: the others may pass NULL too.
        let no_recv = a.coll == CollKind::Reduce && self.rank != a.root && c.recv == 0;
        let c = &Call {
            recv: if no_recv { send } else { c.recv },
            ..*c
        };
        let es = a.dtype.size() as u64;
        let (send_len, recv_len) = (a.send_elems() as u64 * es, a.recv_elems() as u64 * es);
        let deadline = Instant::now() + self.timeout;
        let broken = || self.async_error();
        let k = choose(&a, &self.choice);
        if let Some(d) = &self.defer {
            // Without a meeting: through the fixed stage where the call fits, or on its own
            // buffers where the low-latency kernel takes it.
            let lens = (send_len, recv_len);
            let fits = self.fixed.as_ref().and_then(|f| {
                stage::recv_offset(a.coll, lens, reach(k, a.coll), f.bytes()).map(|at| (f, at))
            });
            let ll = self.ll_no_wait && matches!(k, Kernel::Ll { .. });
            let stream = stream_of(c.stream);
            // SAFETY: the caller's stream of this GPU (this function's contract).
            if (fits.is_some() || ll) && !unsafe { is_capturing(&self.gpu, stream) }? {
                let at = (k, fits);
                // SAFETY: this function's contract.
                return unsafe { self.unmet(c, call, d, at, lens, deadline, published, clock) };
            }
        }
        // Only the buffers peers' kernels reach are shown to them (`plan::reach`): the rest
        // need no export, nor the bounce buffer where peers could not map them (the
        // low-latency kernel's, under a capture or without RAILCC_GPU_LL_NO_WAIT: when
        // mappings are kept, a buffer over one shown before would need the bounce buffer,
        // which a capture cannot grow).
        let (peer_ins, peer_outs) = reach(k, a.coll);
        let exported = {
            let mut share = self.share.lock();
            let mut shown = |reached: bool, buf: u64, len: u64| match reached {
                true => share.export(buf, len, deadline, &broken),
                false => Ok(Some(BufDesc::EMPTY)),
            };
            (
                shown(peer_ins, send, send_len)?,
                shown(peer_outs, c.recv, recv_len)?,
            )
        };
        let stream = stream_of(c.stream);
        let (send, recv, mine, out) = match exported {
            (Some(s), Some(r)) => (send, c.recv, [s, r], None),
            _ => {
                // SAFETY: the caller's buffers and stream (this function's contract).
                let (s, r, out) =
                    unsafe { self.bounce(c.stream, (send, send_len), (c.recv, recv_len)) }?;
                (
                    s,
                    r,
                    [self.bounce_desc(s)?, self.bounce_desc(r)?],
                    Some(out),
                )
            }
        };
        let shape = a.to_words();
        self.table.wait_free(call, self.rank, deadline, &broken)?;
        self.table.publish(call, self.rank, shape, mine);
        *published = true;
        self.trace.lap(clock, "coll export+publish");
        let late_kernel = match k {
            Kernel::Bulk { .. } => true,
            Kernel::Push { .. } => self.late_push,
            _ => false,
        };
        if let (Some(d), Some(slots), true) = (&self.defer, &self.late, late_kernel) {
            // With late arguments: the kernel is enqueued now and waits on the GPU for the
            // launcher to write its peers' addresses; never under capture (a graph would
            // replay the slot's one call). Unless the peers are all there within a few
            // microseconds and no earlier call waits for its own (calls meet their peers in
            // order): then the kernel's usual form, below. Each rank decides alone: both forms
            // run the same kernel body with the same peers.
            // SAFETY: the caller's stream of this GPU (this function's contract).
            let capturing = unsafe { is_capturing(&self.gpu, stream) }?;
            if !capturing && !self.peers_within(d, call, self.late_wait) {
                let late = (d, slots.as_ref(), k);
                let copy_out = out.filter(|_| !no_recv);
                // SAFETY: this function's contract; not capturing (asked above).
                unsafe { self.late_launch(c, call, late, (send, recv), copy_out, deadline) }?;
                self.trace.lap(clock, "coll late launch");
                return Ok(k.launch());
            }
            if !capturing {
                // Named apart so a host trace shows which way each call went.
                self.trace.lap(clock, "coll peers here, not late");
            }
        }
        if let Some(d) = self.defer.as_ref().filter(|_| self.defer_calls) {
            // Deferred unless every peer is there and no earlier call still waits for its
            // peers (calls meet their peers in order); never under capture (the graph must
            // hold the kernel).
            let ready = d.idle() && self.peers_published(call);
            // SAFETY: the caller's stream of this GPU (this function's contract).
            if !ready && !unsafe { is_capturing(&self.gpu, stream) }? {
                let copy_out = out.filter(|_| !no_recv);
                // SAFETY: this function's contract; not capturing (asked above).
                unsafe {
                    self.kernel_order.lock().run_eager(&self.gpu, c.stream, || {
                        d.submit(stream, call, a, shape, (send, recv), k, copy_out, deadline)
                    })
                }?;
                self.trace.lap(clock, "coll defer");
                tracing::debug!("rank {}: call {call} deferred", self.rank);
                return Ok(k.launch());
            }
            d.wait_idle(deadline, &broken)?;
        } else if let Some(d) = &self.defer {
            // The launcher reads the peers' entries of earlier calls (made through the fixed
            // stage) first: calls meet their peers in order.
            d.wait_idle(deadline, &broken)?;
        }
        let (ins, outs) = meet_peers(
            &self.table,
            &self.share,
            (self.rank, n),
            call,
            shape,
            (send, recv),
            true,
            deadline,
            &broken,
        )?;
        self.table.finished(call, self.rank);
        self.trace.lap(clock, "coll wait peers+map");
        tracing::debug!(
            "rank {}: call {call} met its peers on the caller's thread",
            self.rank
        );
        let peers = Peers {
            ins: &ins,
            outs: &outs,
            syncs: &self.syncs,
        };
        let timeout_ns = self.timeout_ns();
        // SAFETY: the peers' buffers and sync areas are mapped into this context by IPC; the
        // caller vouches for its own buffers and stream; the bounce buffer and the caller's
        // receive buffer hold the copy out's `len` bytes.
        let launch = unsafe {
            self.kernel_order.lock().run(&self.gpu, c.stream, || {
                let launch = enqueue(&self.gpu, stream, self.rank, &a, k, &peers, timeout_ns)?;
                // Inside the order, so its marker comes after the copy out of the bounce
                // buffer too: a close waits for it before freeing the buffer.
                copy_out_of_bounce(out.filter(|_| !no_recv), stream)?;
                Ok(launch)
            })
        }?;
        self.trace.lap(clock, "coll launch");
        Ok(launch)
    }

    /// Whether every peer has published call `call` in the table.
    fn peers_published(&self, call: u64) -> bool {
        (0..self.nranks).all(|p| p == self.rank || self.table.published(call, p))
    }

    /// Whether, within `wait`, every peer has published call `call` and the launcher `d` has
    /// no call left (calls meet their peers in order: a launcher still meeting an earlier
    /// call's peers must finish first, and a call that went late makes the next one wait
    /// for it here rather than go late too). Bounded: a late peer leaves the call to the
    /// late way. Never with no wait.
    fn peers_within(&self, d: &defer::Deferred, call: u64, wait: Duration) -> bool {
        if wait.is_zero() {
            return false;
        }
        let until = Instant::now() + wait;
        loop {
            if self.peers_published(call) && d.idle() {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::hint::spin_loop();
        }
    }

    /// Call `call` without a meeting on the host: published for the launcher `d`'s check,
    /// then launched with kernel `k` on the caller's stream at once. Its buffers that peers
    /// reach go through the fixed stage `stage` (`(f, recv_at)`: its receive part at `recv_at`, its send part
    /// at the start; `stage.rs`), copied in before the kernel and out after it; those no peer
    /// reaches stay the caller's (all of them for the low-latency kernel, which may then
    /// run with no stage).
    ///
    /// # Safety
    /// As for [`ProcGpu::collective`]; `c.stream` not being captured.
    #[allow(clippy::too_many_arguments)]
    unsafe fn unmet(
        &self,
        c: &Call,
        call: u64,
        d: &defer::Deferred,
        (k, stage): (Kernel, Option<(&stage::FixedStage, u64)>),
        (send_len, recv_len): (u64, u64),
        deadline: Instant,
        published: &mut bool,
        clock: &mut Option<Instant>,
    ) -> Result<Launch> {
        let (a, n) = (c.args, self.nranks);
        let broken = || self.async_error();
        let me = self.rank;
        // Which of this rank's buffers its peers' kernels reach: only those go through the
        // stage (the low-latency kernel's peers' data comes through the sync areas' scratch).
        let (peer_ins, peer_outs) = reach(k, a.coll);
        let (mut ins, mut outs) = match stage {
            Some((f, at)) => (
                (0..n).map(|r| f.of(r)).collect::<Vec<u64>>(),
                (0..n).map(|r| f.of(r) + at).collect::<Vec<u64>>(),
            ),
            None if !peer_ins && !peer_outs => (vec![0; n], vec![0; n]),
            None => {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "{}: call {call} without a meeting needs the fixed stage",
                        a.coll.name()
                    ),
                )
                .rank(self.own_name)
                .transport(crate::NAME))
            }
        };
        if !peer_ins {
            ins[me] = c.send;
        }
        if !peer_outs {
            outs[me] = c.recv;
        }
        let mut shape = a.to_words();
        shape[4] |= STAGED_BIT;
        self.table.wait_free(call, self.rank, deadline, &broken)?;
        self.table
            .publish(call, self.rank, shape, [BufDesc::EMPTY; 2]);
        *published = true;
        d.check(call, shape, deadline)?;
        self.trace.lap(clock, "coll unmet publish");
        let peers = Peers {
            ins: &ins,
            outs: &outs,
            syncs: &self.syncs,
        };
        let stream = stream_of(c.stream);
        let timeout_ns = self.timeout_ns();
        // SAFETY: every stage is device memory mapped here at init, of `f.bytes()`, which
        // holds the layout; the caller vouches for its buffers and stream.
        let launch = unsafe {
            self.kernel_order.lock().run_eager(&self.gpu, c.stream, || {
                if send_len > 0 && peer_ins {
                    copy_async(
                        ins[me],
                        c.send,
                        send_len as usize,
                        stream,
                        "cuMemcpyAsync (into the fixed stage)",
                    )?;
                }
                let launch = enqueue(&self.gpu, stream, me, &a, k, &peers, timeout_ns)?;
                if recv_len > 0 && peer_outs {
                    copy_async(
                        c.recv,
                        outs[me],
                        recv_len as usize,
                        stream,
                        "cuMemcpyAsync (out of the fixed stage)",
                    )?;
                }
                Ok(launch)
            })
        }?;
        self.trace.lap(clock, "coll unmet launch");
        Ok(launch)
    }

    /// Moves a call's buffers into this rank's bounce buffer (cudaMalloc memory, which peers
    /// map), for buffers peers cannot map: the send data is copied in on `stream` now, and
    /// the returned (dst, src, len) is the copy out of the receive part, for after the kernel.
    /// A send buffer inside the receive buffer, or the other way round (NCCL's in-place
    /// calls), keeps its place. The buffer grows to the largest call; a call on another
    /// stream than the last waits for that stream first, so two calls never share it.
    ///
    /// # Safety
    /// As for [`ProcGpu::collective`].
    unsafe fn bounce(
        &self,
        stream: usize,
        (send, send_len): (u64, u64),
        (recv, recv_len): (u64, u64),
    ) -> Result<(u64, u64, (u64, u64, usize))> {
        let overlap = send < recv + recv_len.max(1) && recv < send + send_len.max(1);
        let (lo, need) = if overlap {
            let lo = send.min(recv);
            (lo, (send + send_len).max(recv + recv_len) - lo)
        } else {
            (0, send_len.next_multiple_of(256) + recv_len)
        };
        // SAFETY: the caller's stream (this function's contract).
        let base = unsafe { self.bounce_room(stream, need) }?;
        let s = stream_of(stream);
        let (s_at, r_at) = if overlap {
            (base + (send - lo), base + (recv - lo))
        } else {
            (base, base + send_len.next_multiple_of(256))
        };
        if send_len > 0 {
            // SAFETY: the caller's send buffer and our bounce buffer hold `send_len` bytes.
            unsafe {
                copy_async(
                    s_at,
                    send,
                    send_len as usize,
                    s,
                    "cuMemcpyAsync (into the bounce buffer)",
                )
            }?;
        }
        Ok((s_at, r_at, (recv, r_at, recv_len as usize)))
    }

    /// The bounce buffer's address, with room for `need` bytes, for work on `stream`: made or
    /// grown (not under capture: nothing can be allocated then), and after the last user's
    /// stream's work when that was another stream.
    ///
    /// # Safety
    /// `stream` a live stream of this GPU.
    unsafe fn bounce_room(&self, stream: usize, need: u64) -> Result<u64> {
        let mut b = self.bounce.lock();
        let s = stream_of(stream);
        // SAFETY: the caller's stream of this GPU.
        let capturing = unsafe { is_capturing(&self.gpu, s) }?;
        // A capture neither waits on an eager stream's event nor becomes the last user (its
        // replays come later, unseen: see `Bounce`).
        if !capturing {
            if let Some(last) = b.last.filter(|&l| l != stream) {
                // SAFETY: both streams of this GPU, live (the caller's contract for each call).
                unsafe { stream_waits_for(&self.gpu, s, &self.gpu, stream_of(last)) }?;
            }
            b.last = Some(stream);
        }
        if b.buf.as_ref().is_none_or(|d| (d.bytes as u64) < need) {
            if capturing {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "a buffer peers cannot map (from a stream-ordered pool such as cudaMallocAsync's?) in a CUDA graph capture needs {need} bytes of bounce buffer; run one such call outside the capture first"
                    ),
                )
                .rank(self.rank)
                .transport(crate::NAME));
            }
            let bytes = (need as usize).next_power_of_two().max(1 << 20);
            tracing::info!(
                "rank {}: bounce buffer of {bytes} bytes for buffers peers cannot map",
                self.rank
            );
            let new = self.alloc_for_peers(bytes, Some(&mut b.retired))?;
            b.desc = Some(export(new.ptr)?);
            // The old one stays until the communicator goes: work in flight or a captured
            // graph may still use it, and freeing would wait for the whole device.
            if let Some(old) = b.buf.replace(new) {
                b.retired.push(old);
            }
        }
        Ok(b.buf.as_ref().map_or(0, |d| d.ptr))
    }

    /// `bytes` of device memory for peers to map, not where an allocation peers mapped was
    /// (see `Share`'s `keep_mappings`: their stale mapping could not be closed). The rejected
    /// tries are held until a try lands elsewhere, then kept in `keep` (graphs or work in
    /// flight may use them) or freed.
    fn alloc_for_peers(&self, bytes: usize, keep: Option<&mut Vec<DevBuf>>) -> Result<DevBuf> {
        let mut rejected = Vec::new();
        let mut new = self.gpu.alloc(bytes)?;
        while self.share.lock().overlaps_shown(new.ptr, bytes as u64) {
            if rejected.len() >= 8 {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!("no buffer of {bytes} bytes for peers away from memory they mapped before, in 8 tries"),
                )
                .rank(self.rank)
                .transport(crate::NAME));
            }
            rejected.push(std::mem::replace(&mut new, self.gpu.alloc(bytes)?));
        }
        if let Some(k) = keep {
            k.append(&mut rejected);
        }
        Ok(new)
    }

    /// The descriptor peers map for `at`, an address in the bounce buffer.
    fn bounce_desc(&self, at: u64) -> Result<BufDesc> {
        match self.bounce.lock().desc {
            Some(d) if d.base <= at && at < d.base + d.size.max(1) => Ok(BufDesc {
                offset: at - d.base,
                ..d
            }),
            _ => export(at),
        }
    }

    /// After sends from the bounce buffer on several streams: the last user's stream waits
    /// for the others, so the next user waits for all of them.
    ///
    /// # Safety
    /// Live streams of this GPU.
    unsafe fn bounce_joins(&self, others: &[usize]) -> Result<()> {
        let b = self.bounce.lock();
        if let Some(last) = b.last {
            for &o in others.iter().filter(|&&o| o != last) {
                // SAFETY: both streams of this GPU (the caller's contract).
                unsafe { stream_waits_for(&self.gpu, stream_of(last), &self.gpu, stream_of(o)) }?;
            }
        }
        Ok(())
    }
}

/// This rank's bounce buffer (for the data of buffers no peer can map), the last stream that
/// used it (the next user's stream waits for it), and the smaller ones it replaced. Limit: a
/// CUDA graph captured with a bounced call replays on the buffer it was captured with,
/// unordered with eager calls that use it meanwhile.
#[derive(Default)]
struct Bounce {
    buf: Option<DevBuf>,
    /// `buf`'s IPC descriptor, made once per buffer rather than on every call.
    desc: Option<BufDesc>,
    last: Option<usize>,
    retired: Vec<DevBuf>,
}

/// Enqueues `out`, a copy out of the bounce buffer (dst, src, len), if any, on `stream`.
///
/// # Safety
/// `stream` a live stream of the current context; both ranges hold `len` bytes until the
/// stream passes the copy.
unsafe fn copy_out_of_bounce(out: Option<(u64, u64, usize)>, stream: Stream) -> Result<()> {
    match out {
        // SAFETY: this function's contract.
        Some((dst, src, len)) => unsafe {
            copy_async(
                dst,
                src,
                len,
                stream,
                "cuMemcpyAsync (out of the bounce buffer)",
            )
        },
        None => Ok(()),
    }
}

/// What a broken communicator does on this GPU, whoever saw the break (the watcher, an
/// abort, a failed call, the deferred launcher): its kernels stop waiting, and every stream
/// waiting for a deferred call goes on.
fn stop_gpu_work(gpu: &GpuCtx, release: Option<&defer::Release>) {
    gpu.abort_kernels();
    if let Some(r) = release {
        r.all();
    }
}

/// The shape a rank publishes for a call it failed before its entry was ready.
const FAILED_SHAPE: [u64; 5] = [u64::MAX; 5];

/// Set in a published shape's root word for a call made without a meeting (through the
/// fixed stage or on the low-latency kernel; its entry carries no buffers): every rank must
/// have made it so, or the call is a mismatch, never a kernel run on the empty buffers of a
/// rank that staged it (one rank capturing a graph and another not would otherwise differ
/// silently).
const STAGED_BIT: u64 = 1 << 63;

/// A published shape for an error; `mixed`: one side of the mismatch made the call without a
/// meeting and the other met its peers, which the text then says.
fn describe_shape(mut w: [u64; 5], mixed: bool) -> String {
    let staged = w[4] & STAGED_BIT != 0;
    w[4] &= !STAGED_BIT;
    let what = CollArgs::describe_words(w);
    match (mixed, staged) {
        (false, _) => what,
        (true, true) => format!(
            "{what} without meeting its peers (through the fixed stage or the low-latency kernel)"
        ),
        (true, false) => format!(
            "{what} meeting its peers on the host (under a graph capture, or too large for the fixed stage)"
        ),
    }
}

/// Reads every peer's entry of `call` (waiting to `deadline`), checks it against this rank's
/// `shape`, and maps the peers' buffers: every rank's send and receive buffer as this GPU
/// addresses them (`bufs`: this rank's own). The table is read without `share`'s lock, so a
/// late peer does not hold up this rank's next export (`defer.rs` meets peers on another
/// thread, with `may_close` false: see [`Share::map`]).
#[allow(clippy::too_many_arguments)]
fn meet_peers(
    table: &ShmTable,
    share: &Mutex<Share>,
    (rank, n): (usize, usize),
    call: u64,
    shape: [u64; 5],
    (send, recv): (u64, u64),
    may_close: bool,
    deadline: Instant,
    broken: &dyn Fn() -> Option<Error>,
) -> Result<(Vec<u64>, Vec<u64>)> {
    let entries = read_peers(table, (rank, n), call, shape, deadline, broken)?;
    let (mut ins, mut outs) = (vec![send; n], vec![recv; n]);
    let mut share = share.lock();
    for (p, bufs) in entries {
        ins[p] = share.map(p, &bufs[0], may_close, deadline, broken)?;
        outs[p] = share.map(p, &bufs[1], may_close, deadline, broken)?;
    }
    Ok((ins, outs))
}

/// Reads every peer's entry of `call` (waiting to `deadline`) and checks it against this
/// rank's `shape`: each peer's buffers, as published.
fn read_peers(
    table: &ShmTable,
    (rank, n): (usize, usize),
    call: u64,
    shape: [u64; 5],
    deadline: Instant,
    broken: &dyn Fn() -> Option<Error>,
) -> Result<Vec<(usize, [BufDesc; 2])>> {
    let mut entries = Vec::with_capacity(n);
    for p in (0..n).filter(|&p| p != rank) {
        let (theirs, bufs) = table
            .read(call, p, deadline, broken)
            .map_err(|e| e.rank(rank))?;
        if theirs == FAILED_SHAPE {
            return Err(Error::new(
                ErrorKind::Aborted,
                format!("GPU call {call}: rank {p} failed its part of the call"),
            )
            .peer(p)
            .rank(rank)
            .transport(crate::NAME));
        }
        if theirs != shape {
            let mixed = (theirs[4] ^ shape[4]) & STAGED_BIT != 0;
            return Err(Error::new(
                ErrorKind::Mismatch,
                format!(
                    "GPU call {call}: rank {p} called {}, rank {rank} called {}",
                    describe_shape(theirs, mixed),
                    describe_shape(shape, mixed)
                ),
            )
            .peer(p)
            .rank(rank)
            .transport(crate::NAME));
        }
        entries.push((p, bufs));
    }
    tracing::debug!("rank {rank}: read every peer's entry of GPU call {call}");
    Ok(entries)
}

impl Drop for ProcGpu {
    fn drop(&mut self) {
        self.trace.report();
        // The last call's kernels read this rank's buffers and its peers' mappings, freed
        // with the fields: wait for them first, as NCCL's destroy waits for the
        // communicator's work, up to the timeout (their own deadline), with the watcher still
        // running (a peer's death stops them). Past that, stop them; any still running then
        // (their stream held up by other work) keep what they read, leaked. Once the
        // kernels were stopped (an abort, a failure), the wait is the grace alone, so
        // ncclCommAbort returns as NCCL's does.
        // The launcher first, while a peer's death still breaks the communicator (once
        // closing, the watcher takes it for the peer's close): its calls' peers are met
        // or failed, and every kernel is on a stream.
        if let Some(d) = &mut self.defer {
            d.stop();
        }
        if let Some((_, closing, _)) = &self.watcher {
            closing.store(true, Ordering::Relaxed);
        }
        let settled =
            self.gpu.bind().is_err() || self.kernel_order.lock().drained(&self.gpu, self.timeout);
        if let Some((stop, _, h)) = self.watcher.take() {
            stop.store(true, Ordering::Relaxed);
            let _ = h.join();
        }
        if settled {
            // SAFETY: dropped once, here; nothing uses `share` after `drop`.
            unsafe { ManuallyDrop::drop(&mut self.share) };
        } else {
            tracing::warn!(
                "rank {}: the GPU had not finished the communicator's last call {:?} after its close, nor once its kernels were stopped: its buffers and peers' mappings stay allocated",
                self.rank,
                self.timeout
            );
            std::mem::forget(std::mem::take(&mut *self.stages.lock()));
            let mut b = self.bounce.lock();
            std::mem::forget(b.buf.take());
            std::mem::forget(std::mem::take(&mut b.retired));
            drop(b);
            std::mem::forget(self.table.clone());
            std::mem::forget(self.gpu.clone());
            std::mem::forget(self.late.clone());
            if let Some(f) = self.fixed.take() {
                f.leak();
            }
        }
        // Closes the peers' stages and frees this rank's (the kernels have settled).
        drop(self.fixed.take());
        if let Some(d) = self.defer.take() {
            d.free(&self.gpu, settled);
        }
        // Before the GPU's context can go with the `gpu` field.
        if self.gpu.bind().is_ok() {
            self.kernel_order.lock().release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mismatch_says_when_one_rank_went_through_the_stage_and_one_did_not() {
        let a = CollArgs {
            coll: CollKind::AllReduce,
            count: 1024,
            dtype: railcc_core::DataType::F32,
            op: railcc_core::ReduceOp::Sum,
            root: 0,
            nranks: 2,
        };
        let plain = a.to_words();
        let mut staged = plain;
        staged[4] |= STAGED_BIT;
        assert_ne!(plain, staged, "the flag tells them apart");
        let mixed = (plain[4] ^ staged[4]) & STAGED_BIT != 0;
        assert!(mixed);
        let (p, s) = (describe_shape(plain, mixed), describe_shape(staged, mixed));
        assert!(
            p.contains("meeting its peers on the host (under a graph capture")
                && p.contains("root 0"),
            "{p}"
        );
        assert!(
            s.contains("without meeting its peers (through the fixed stage")
                && s.contains("root 0"),
            "{s}"
        );
        // Two staged calls of different counts: the counts, no word about the stage.
        let mut other = staged;
        other[3] = 2048;
        let t = describe_shape(other, false);
        assert!(
            t.contains("2048") && !t.contains("meet") && t.contains("root 0"),
            "{t}"
        );
    }

    #[test]
    fn hello_round_trips() {
        let h = Hello {
            host: "node-1".into(),
            sync: [7; HANDLE_BYTES],
            shm: "/railcc-1-2".into(),
            blocks: 132,
            ll_max: 65536,
            min_blocks: 8,
            push: 1 << 24,
            push_min_blocks: 24,
            push_slot: 172032,
            ag_copy: 1 << 26,
            ar_copy: 1 << 27,
            p2p_ll: 1 << 20,
            defer: true,
            ll_no_wait: false,
            late_args: false,
            late_push: false,
            stage: [9; HANDLE_BYTES],
            stage_bytes: 1 << 26,
            proc: Proc { pid: 42, start: 7 },
            token: 99,
        };
        let bytes = h.encode();
        let flipped = Hello {
            defer: false,
            ll_no_wait: true,
            ..h.clone()
        };
        let late = Hello {
            defer: false,
            late_args: true,
            ..h.clone()
        };
        let late_push = Hello {
            defer: false,
            late_push: true,
            ..h.clone()
        };
        assert!(Hello::decode(&bytes[..70]).is_none());
        // Cut inside the last settings word (p2p_ll, ending 60 bytes past the handle), and
        // before the defer byte.
        assert!(Hello::decode(&bytes[..8 + HANDLE_BYTES + 59]).is_none());
        assert!(Hello::decode(&bytes[..8 + HANDLE_BYTES + 60]).is_none());
        // And inside the stage's size.
        assert!(Hello::decode(&bytes[..8 + 2 * HANDLE_BYTES + 68]).is_none());
        let d = Hello::decode(&bytes).unwrap();
        assert_eq!(
            (d.host, d.shm, d.blocks, d.sync, d.proc, d.token),
            (h.host, h.shm, 132, h.sync, h.proc, 99)
        );
        assert_eq!((d.stage, d.stage_bytes), ([9; HANDLE_BYTES], 1 << 26));
        assert_eq!((d.defer, d.ll_no_wait, d.late_args), (true, false, false));
        // The three flags share a byte: each comes back alone.
        let e = Hello::decode(&flipped.encode()).unwrap();
        assert_eq!((e.defer, e.ll_no_wait, e.late_args), (false, true, false));
        let l = Hello::decode(&late.encode()).unwrap();
        assert_eq!((l.defer, l.ll_no_wait, l.late_args), (false, false, true));
        let lp = Hello::decode(&late_push.encode()).unwrap();
        assert_eq!((lp.late_args, lp.late_push), (false, true));
        assert!(!l.late_push);
        assert_eq!(
            (
                d.ll_max,
                d.min_blocks,
                d.push,
                d.push_min_blocks,
                d.push_slot,
                d.ag_copy,
                d.ar_copy,
                d.p2p_ll,
                d.defer
            ),
            (
                65536,
                8,
                1 << 24,
                24,
                172032,
                1 << 26,
                1 << 27,
                1 << 20,
                true
            )
        );
    }

    #[test]
    fn a_process_is_alive_until_it_exits_and_a_reused_pid_is_not_it() {
        let me = Proc::me();
        assert!(me.start > 0 && me.alive());
        assert!(
            !Proc {
                start: me.start + 1,
                ..me
            }
            .alive(),
            "another start time is another process"
        );
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let c = Proc {
            pid: child.id(),
            start: Proc::start_of(child.id()).unwrap().1,
        };
        assert!(c.alive());
        child.kill().unwrap();
        // Killed but not yet reaped: a zombie, which counts as dead.
        let t0 = Instant::now();
        while c.alive() && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!c.alive(), "a killed child still reads as alive");
        child.wait().unwrap();
        assert!(!c.alive());
    }
}
