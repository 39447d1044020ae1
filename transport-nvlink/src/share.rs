//! How the ranks of one host reach each other's buffers, whatever allocator made them
//! (the per-process GPU path, proc.rs).
//!
//! - cudaMalloc memory: a legacy IPC handle in the call's table entry (`railcc_cuda::ipc`).
//! - VMM memory with file-descriptor handles (PyTorch's expandable segments, ncclMemAlloc):
//!   each new piece's descriptor goes once to every peer over the host's descriptor sockets
//!   (fdpass.rs) before the entry that needs it is published; the entry says how many pieces
//!   its owner had posted, so a reader waits until it has taken in that many
//!   (`railcc_cuda::vmm`). A thread per rank takes messages in as they come (the socket
//!   queues only a few, and a rank may be waiting for something else, such as a peer's
//!   table entry, while its queue fills).
//! - Anything else (`cudaMallocAsync` pools): [`Share::export`] says None and the caller moves
//!   the data through its own bounce buffer (proc.rs, `ProcGpu::bounce`).
//!
//! Each allocation's path is logged once at info level (NCCL_DEBUG=INFO in libnccl).

use crate::fdpass::{FdPost, MAX_FDS};
use parking_lot::{Condvar, Mutex};
use railcc_core::{Error, ErrorKind, Result};
use railcc_cuda::gpu::GpuCtx;
use railcc_cuda::ipc::{self, BufDesc, Imports, KIND_LEGACY, KIND_VMM};
use railcc_cuda::vmm::{self, Piece, Sharing, VmmImports};
use std::collections::{HashMap, HashSet};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What this rank has taken in from its peers.
struct Inbox {
    rank: usize,
    /// Every rank's token: a message claiming to come from rank r must carry tokens[r].
    tokens: Vec<u64>,
    /// Per peer, how many pieces it has posted that we took in.
    got: Vec<u64>,
    vmm: VmmImports,
    /// What stopped the reader (lost descriptors, an import that failed): every later map
    /// of a VMM buffer fails with it.
    failed: Option<Error>,
}

impl Inbox {
    /// Takes in every message waiting on our socket: [token, sender, the number of its
    /// first piece, then base, size and id of each] with one descriptor per piece.
    fn drain(&mut self, post: &FdPost) -> Result<()> {
        while let Some((w, fds)) = post.try_recv()? {
            let from = w.get(1).map_or(usize::MAX, |&f| f as usize);
            let ok = w.len() == 3 + 3 * fds.len()
                && from != self.rank
                && self.tokens.get(from) == w.first();
            if !ok {
                tracing::warn!(
                    "rank {}: dropped a buffer descriptor message that does not come from a peer of this communicator",
                    self.rank
                );
                continue;
            }
            for (i, fd) in fds.into_iter().enumerate() {
                let [base, size, id] = [w[3 + 3 * i], w[4 + 3 * i], w[5 + 3 * i]];
                self.vmm.add(from, Piece { base, size, id }, fd)?;
                self.got[from] = self.got[from].max(w[2] + i as u64);
            }
        }
        Ok(())
    }
}

/// The inbox, shared with the reader thread, and its signal.
type Shared = Arc<(Mutex<Inbox>, Condvar)>;

/// Takes messages in until `stop`.
fn read_loop(post: Arc<FdPost>, inbox: Shared, gpu: Arc<GpuCtx>, stop: Arc<AtomicBool>) {
    // Imports and mappings are made in this GPU's context.
    let bound = gpu.bind();
    while !stop.load(Ordering::Relaxed) {
        if !post.wait_readable(Duration::from_millis(50)) {
            continue;
        }
        let (lock, signal) = &*inbox;
        let mut i = lock.lock();
        if i.failed.is_none() {
            if let Err(e) = bound.clone().and_then(|_| i.drain(&post)) {
                tracing::warn!("rank {}: buffer descriptors: {e}", i.rank);
                i.failed = Some(e);
            }
        } else {
            // Broken: keep the queue empty so senders never wait on us.
            while let Ok(Some(_)) = post.try_recv() {}
        }
        signal.notify_all();
    }
}

/// Allocations whose handles peers got: (base, end, buffer id).
#[derive(Default)]
struct Shown(Vec<(u64, u64, u64)>);

impl Shown {
    /// Past this many, no new allocation is shown (bounded; slower, never stale).
    const MAX: usize = 4096;

    /// Whether allocation `p` may be shown to peers: it was before, or it overlaps none
    /// shown (then it is recorded).
    fn take(&mut self, p: Piece) -> bool {
        if self.0.iter().any(|&(b, _, id)| b == p.base && id == p.id) {
            return true;
        }
        if self.overlaps(p.base, p.size) || self.0.len() >= Self::MAX {
            return false;
        }
        self.0.push((p.base, p.end(), p.id));
        true
    }

    fn overlaps(&self, base: u64, size: u64) -> bool {
        self.0
            .iter()
            .any(|&(b, e, _)| b < base + size.max(1) && base < e)
    }
}

/// One rank's side of buffer sharing on its host.
pub struct Share {
    rank: usize,
    nranks: usize,
    device: i32,
    post: Arc<FdPost>,
    inbox: Shared,
    tokens: Vec<u64>,
    /// Pieces posted to every peer: base to (buffer id, size).
    sent: HashMap<u64, (u64, u64)>,
    posted: u64,
    legacy: Imports,
    /// Our legacy IPC handles: allocation base to (buffer id, descriptor at the base, or
    /// None for one peers must not map: see `keep_mappings`). The driver's buffer id tells a
    /// new allocation at the same base apart; taken once, the handle costs no driver call on
    /// later calls.
    handles: HashMap<u64, (u64, Option<BufDesc>)>,
    /// Some rank defers calls (`RAILCC_GPU_DEFER`): its launcher maps peers' buffers while
    /// streams of its device wait for it, and there a stale mapping cannot be closed
    /// (cuIpcCloseMemHandle waits for the device). So an allocation of ours over a range
    /// peers may have mapped before (freed and made again at the same address) is never
    /// shown to peers: its data goes through the bounce buffer instead.
    keep_mappings: bool,
    /// With `keep_mappings`, every allocation whose handle peers got.
    shown: Shown,
    /// Allocations whose path was logged.
    told: HashSet<u64>,
    /// Descriptors cannot reach some peer (another network namespace): VMM buffers are
    /// bounced from then on.
    no_fds: bool,
    reader: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
}

impl Share {
    /// `post` bound under the communicator's name; `tokens` every rank's (from the
    /// bootstrap). Starts the reader thread.
    pub fn new(
        rank: usize,
        gpu: Arc<GpuCtx>,
        post: FdPost,
        tokens: Vec<u64>,
        keep_mappings: bool,
    ) -> Result<Share> {
        let nranks = tokens.len();
        let post = Arc::new(post);
        let inbox: Shared = Arc::new((
            Mutex::new(Inbox {
                rank,
                tokens: tokens.clone(),
                got: vec![0; nranks],
                vmm: VmmImports::default(),
                failed: None,
            }),
            Condvar::new(),
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let device = gpu.ordinal as i32;
        let reader = {
            let (p, i, s) = (post.clone(), inbox.clone(), stop.clone());
            std::thread::Builder::new()
                .name("railcc-gpu-fds".into())
                .spawn(move || read_loop(p, i, gpu, s))
                .map_err(|e| Error::io("starting the descriptor reader", &e))?
        };
        Ok(Share {
            rank,
            nranks,
            device,
            post,
            inbox,
            tokens,
            sent: HashMap::new(),
            posted: 0,
            legacy: Imports::default(),
            handles: HashMap::new(),
            keep_mappings,
            shown: Shown::default(),
            told: HashSet::new(),
            no_fds: false,
            reader: Some((stop, reader)),
        })
    }

    /// With `keep_mappings`: whether allocation `p` lies over another whose handle peers got
    /// (then it is never shown to them); otherwise records it as shown. Past 4096 recorded
    /// allocations every new one counts as shown before (bounced): slower, never stale.
    fn shown_before(&mut self, p: Piece) -> bool {
        if !self.keep_mappings || self.shown.take(p) {
            return false;
        }
        tracing::info!(
            "rank {}: allocation 0x{:x} ({} bytes) lies where one peers mapped was, or past {} allocations: its data goes through the bounce buffer while calls are deferred",
            self.rank,
            p.base,
            p.size,
            Shown::MAX
        );
        true
    }

    /// Whether `[base, base + size)` overlaps an allocation whose handle peers got (recorded
    /// only with `keep_mappings`; never otherwise): memory this rank allocates for peers to
    /// map (its bounce buffer) must not lie there either.
    pub fn overlaps_shown(&self, base: u64, size: u64) -> bool {
        self.shown.overlaps(base, size)
    }

    /// Logs `how` for the allocation at `key` once.
    fn tell(&mut self, key: u64, ptr: u64, len: u64, how: Sharing) {
        if self.told.len() < 4096 && self.told.insert(key) {
            tracing::info!(
                "rank {}: buffer 0x{ptr:x} ({len} bytes) reaches peers by {}",
                self.rank,
                how.name()
            );
        }
    }

    /// What peers need to reach `[ptr, ptr + len)`, or None when they cannot (the caller
    /// bounces the data). New VMM pieces are posted to every peer first.
    pub fn export(
        &mut self,
        ptr: u64,
        len: u64,
        deadline: Instant,
        broken: &dyn Fn() -> Option<Error>,
    ) -> Result<Option<BufDesc>> {
        if len == 0 {
            // Nothing to reach (NCCL lets a count-0 buffer be NULL): no handle, and a peer's
            // map of it is 0.
            return Ok(Some(BufDesc::EMPTY));
        }
        let at = vmm::info(ptr).map_err(|e| e.rank(self.rank))?;
        self.export_at(at, ptr, len, deadline, broken)
    }

    /// As [`Share::export`], with `at` the driver's [`vmm::info`] of `ptr`.
    pub fn export_at(
        &mut self,
        at: vmm::PtrInfo,
        ptr: u64,
        len: u64,
        deadline: Instant,
        broken: &dyn Fn() -> Option<Error>,
    ) -> Result<Option<BufDesc>> {
        let how = match at.sharing {
            Sharing::Fd if self.no_fds => Sharing::None,
            h => h,
        };
        self.tell(at.piece.base, ptr, len, how);
        match how {
            Sharing::Legacy => {
                let base = match self.handles.get(&at.piece.base) {
                    Some((id, d)) if *id == at.piece.id => *d,
                    _ => {
                        let d = if self.shown_before(at.piece) {
                            None
                        } else {
                            Some(ipc::export_in(at.piece.base, at.piece.base, at.piece.size)?)
                        };
                        if self.handles.len() >= 4096 {
                            self.handles.clear(); // bounded: freed allocations linger here
                        }
                        self.handles.insert(at.piece.base, (at.piece.id, d));
                        d
                    }
                };
                Ok(base.map(|b| BufDesc {
                    offset: ptr - at.piece.base,
                    ..b
                }))
            }
            Sharing::None => Ok(None),
            Sharing::Fd => {
                let pieces = vmm::pieces(at.piece, ptr, len)?;
                let new: Vec<Piece> = pieces
                    .into_iter()
                    .filter(|p| self.sent.get(&p.base) != Some(&(p.id, p.size)))
                    .collect();
                // One message per peer for up to MAX_FDS pieces.
                for batch in new.chunks(MAX_FDS) {
                    let fds = batch
                        .iter()
                        .map(|p| vmm::export_fd(p.base))
                        .collect::<Result<Vec<_>>>()?;
                    let mut words = vec![
                        self.tokens.get(self.rank).copied().unwrap_or(0),
                        self.rank as u64,
                        self.posted + 1,
                    ];
                    for p in batch {
                        words.extend_from_slice(&[p.base, p.size, p.id]);
                    }
                    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
                    for to in (0..self.nranks).filter(|&r| r != self.rank) {
                        match self.post.send(to, &words, &borrowed, deadline, broken) {
                            Ok(()) => {}
                            Err(e) if e.kind == ErrorKind::Unsupported => {
                                // Peers that got this message count it, so later numbers
                                // still agree; nothing more is sent to anyone.
                                tracing::warn!(
                                    "rank {}: {e}; buffers of VMM memory go through the bounce buffer from now on",
                                    self.rank
                                );
                                self.no_fds = true;
                                return Ok(None);
                            }
                            Err(e) => return Err(e.rank(self.rank)),
                        }
                    }
                    self.posted += batch.len() as u64;
                    for p in batch {
                        // A piece replaced in our process replaces what it overlaps at the peers.
                        self.sent
                            .retain(|b, (_, size)| *b >= p.end() || b + *size <= p.base);
                        self.sent.insert(p.base, (p.id, p.size));
                    }
                }
                let mut handle = [0u8; ipc::HANDLE_BYTES];
                handle[..8].copy_from_slice(&self.posted.to_le_bytes());
                Ok(Some(BufDesc {
                    kind: KIND_VMM,
                    handle,
                    base: ptr,
                    offset: 0,
                    size: len,
                }))
            }
        }
    }

    /// Peer `peer`'s buffer `d` as an address in this process; `may_close` as for
    /// [`Imports::map`] (false on the deferred launcher).
    pub fn map(
        &mut self,
        peer: usize,
        d: &BufDesc,
        may_close: bool,
        deadline: Instant,
        broken: &dyn Fn() -> Option<Error>,
    ) -> Result<u64> {
        if *d == BufDesc::EMPTY {
            return Ok(0); // an empty range (`Share::export`): nothing is read
        }
        match d.kind {
            KIND_LEGACY => self.legacy.map(peer, d, may_close),
            KIND_VMM => {
                let mut need = [0u8; 8];
                need.copy_from_slice(&d.handle[..8]);
                let need = u64::from_le_bytes(need);
                let (lock, signal) = &*self.inbox;
                let mut i = lock.lock();
                while i.got.get(peer).copied().unwrap_or(u64::MAX) < need {
                    if let Some(e) = &i.failed {
                        return Err(Error::earlier(e).rank(self.rank));
                    }
                    if let Some(e) = broken() {
                        return Err(e);
                    }
                    if Instant::now() > deadline {
                        return Err(Error::new(
                            ErrorKind::Timeout,
                            format!(
                                "rank {peer} published a buffer whose descriptors did not come in time"
                            ),
                        )
                        .peer(peer)
                        .transport(crate::NAME));
                    }
                    signal.wait_for(&mut i, Duration::from_millis(20));
                }
                i.vmm
                    .view(peer, d.base, d.size, self.device)
                    .map_err(|e| e.rank(self.rank))
            }
            k => Err(Error::new(
                ErrorKind::Protocol,
                format!("rank {peer} published a buffer of unknown kind {k}"),
            )
            .peer(peer)
            .transport(crate::NAME)),
        }
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        if let Some((stop, h)) = self.reader.take() {
            stop.store(true, Ordering::Relaxed);
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allocation_over_one_shown_before_is_never_shown() {
        let mut s = Shown::default();
        let a = Piece {
            base: 0x1000,
            size: 0x1000,
            id: 1,
        };
        assert!(s.take(a), "a first allocation is shown");
        assert!(s.take(a), "and again on later calls");
        // Freed and made again at the same address: a new buffer id.
        assert!(!s.take(Piece { id: 2, ..a }));
        // Overlapping the end, or inside; one just past it is fine.
        assert!(!s.take(Piece {
            base: 0x1800,
            size: 0x1000,
            id: 3
        }));
        assert!(!s.take(Piece {
            base: 0x1100,
            size: 0x10,
            id: 4
        }));
        assert!(s.take(Piece {
            base: 0x2000,
            size: 0x1000,
            id: 5
        }));
        assert!(s.overlaps(0x2fff, 1) && !s.overlaps(0x3000, 0x100));
        assert!(s.overlaps(0x0f00, 0x200) && !s.overlaps(0x0f00, 0x100));
    }

    #[test]
    fn past_the_bound_no_new_allocation_is_shown() {
        let mut s = Shown::default();
        for i in 0..Shown::MAX as u64 {
            assert!(s.take(Piece {
                base: i << 20,
                size: 1 << 20,
                id: i
            }));
        }
        let shown = Piece {
            base: 7 << 20,
            size: 1 << 20,
            id: 7,
        };
        assert!(s.take(shown), "one shown before still is");
        assert!(!s.take(Piece {
            base: 1 << 40,
            size: 1 << 20,
            id: 1 << 20
        }));
    }
}
