//! [`GpuComm`]: the one front door for GPU buffers, for one process driving every GPU of a
//! communicator and for one rank per process, built from `Config` in one place
//! (`super::settings`). The path comes from [`Placement::choose`] (`super::path`):
//! - every rank in this process: [`MultiGpu`], kernels over peer access;
//! - one rank per process, every rank on this host: [`ProcGpu`], the same kernels with the
//!   peers' buffers mapped by CUDA IPC;
//! - ranks on several hosts: the stream-ordered network engine ([`GpuNet`]: RDMA, else TCP)
//!   for everything, and with several GPUs on every host the collectives as a hierarchy
//!   ([`HierGpu`]: peer access inside a host, the network between hosts);
//! - `RAILCC_GPU_PATH=net`: the network between every pair (tests and comparisons).

use super::hier::HierGpu;
use super::net::{GpuNet, NetOp, P2pOp as NetP2p};
use super::path::{GpuPath, Placement};
use crate::comm::Communicator;
use railcc_core::agree;
use railcc_core::call::{Call, CollArgs, CollKind, P2pKind, P2pOp};
use railcc_core::{Config, Error, ErrorKind, Result};
use railcc_cuda::gpu::{stream_of, GpuCtx};
use railcc_transport_nvlink::multi::MultiGpu;
use railcc_transport_nvlink::proc::{P2p, ProcGpu};

/// How this rank reaches a peer's GPU memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// This rank itself.
    Me,
    /// CUDA peer access on this host (NVLink or PCIe).
    PeerAccess,
    /// Only over the network.
    Network,
}

// One per communicator: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Path {
    InProcess(MultiGpu),
    Peer(ProcGpu),
    Net { net: GpuNet, hier: Option<HierGpu> },
}

impl Path {
    /// How data moves, for logs and bench headers.
    fn describe(&self) -> String {
        match self {
            Path::InProcess(m) => format!(
                "{} GPU(s) in one process, kernels over peer access, up to {} blocks per GPU",
                m.len(),
                m.max_blocks()
            ),
            Path::Peer(pg) => format!(
                "one rank per process, peers by CUDA IPC, up to {} blocks per GPU",
                pg.max_blocks()
            ),
            Path::Net { hier: Some(h), .. } => h.describe().to_string(),
            Path::Net { net, .. } => net.describe().to_string(),
        }
    }
}

pub struct GpuComm {
    rank: usize,
    nranks: usize,
    path: Path,
    reach: Vec<Reach>,
    /// Per (peer, is_send): messages so far over peer access, which pairs them by number
    /// (both ends count the same).
    seqs: parking_lot::Mutex<std::collections::HashMap<(usize, bool), u64>>,
    desc: String,
}

impl GpuComm {
    /// Opens the path that fits where `boot`'s ranks live, for this rank's GPU `ordinal`, one
    /// rank per process. Collective: every rank of `boot` calls it.
    pub fn new(boot: &Communicator, ordinal: usize) -> Result<GpuComm> {
        let placement = Placement::gather(boot)?;
        let path = placement.choose_for(boot.config())?;
        GpuComm::open(boot, ordinal, &placement, path)
    }

    /// As [`GpuComm::new`], every pair over the network (`railcc bench --gpu-net`).
    pub fn over_network(boot: &Communicator, ordinal: usize) -> Result<GpuComm> {
        let placement = Placement::gather(boot)?;
        let path = placement.choose(true)?;
        GpuComm::open(boot, ordinal, &placement, path)
    }

    /// Every rank of a communicator in this process, rank g on GPU `ordinals[g]`
    /// ([`GpuPath::InProcess`]; libnccl's clique, `railcc bench --device cuda`).
    pub fn in_process(cfg: &Config, ordinals: &[usize]) -> Result<GpuComm> {
        let path = Path::InProcess(MultiGpu::new(ordinals, &super::settings(cfg))?);
        let n = ordinals.len();
        Ok(GpuComm {
            rank: 0,
            nranks: n,
            desc: path.describe(),
            path,
            reach: vec![Reach::PeerAccess; n],
            seqs: parking_lot::Mutex::new(std::collections::HashMap::new()),
        })
    }

    /// Opens `path` (from `placement.choose`) for this rank of `boot`, one rank per process.
    /// Collective over `boot`.
    pub fn open(
        boot: &Communicator,
        ordinal: usize,
        placement: &Placement,
        path: GpuPath,
    ) -> Result<GpuComm> {
        let (rank, nranks) = (boot.rank(), boot.nranks());
        let hosts = &placement.hosts;
        let reach: Vec<Reach> = hosts
            .iter()
            .enumerate()
            .map(|(p, h)| match p {
                _ if p == rank => Reach::Me,
                _ if path != (GpuPath::Network { hier: None }) && *h == hosts[rank] => {
                    Reach::PeerAccess
                }
                _ => Reach::Network,
            })
            .collect();
        let path = match path {
            GpuPath::InProcess => {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    "GPU ranks share processes: every rank of this communicator is in this process (GpuComm::in_process drives them all; GpuComm::new takes one rank per process)",
                )
                .rank(rank))
            }
            GpuPath::PeerAccess => {
                let mut ex = |b: &[u8]| boot.oob_all_gather(b);
                let s = super::settings(boot.config());
                Path::Peer(ProcGpu::new(ordinal, rank, nranks, &s, &mut ex, None)?)
            }
            GpuPath::Network { hier } => {
                // Both are opened on every rank whatever the other gave (each is collective),
                // then every rank learns every outcome, so all leave together: with the same
                // path, or with the same error.
                let hier = hier.map(|l| HierGpu::new(boot, l, ordinal));
                // The flat engine (all-to-all and send/recv across hosts) stages through the
                // hierarchy's ring: one pinned budget for the communicator.
                let rings = hier.as_ref().and_then(|h| h.as_ref().ok()).map(|h| h.cross_rings());
                let net = GpuNet::sharing(boot, ordinal, rings);
                let h: Result<()> = match &hier {
                    Some(Err(e)) => Err(e.clone()),
                    _ => Ok(()),
                };
                let mine = [agree::record(&net, |_| vec![]), agree::record(&h, |_| vec![])];
                let all = boot.oob_all_gather(&mine.concat())?;
                let net = net?;
                if let Some((r, why)) = agree::first_failure(&all, 0) {
                    let e = format!("rank {r} failed to open its GPU network engine: {why}");
                    return Err(Error::new(ErrorKind::Io, e).peer(r).rank(rank));
                }
                // The hierarchy is a speed-up: where a rank could not open it, every rank runs
                // the flat network path instead.
                let hier = match agree::first_failure(&all, 1) {
                    Some((r, why)) => {
                        tracing::warn!(
                            "rank {rank}: GPU hierarchy off (rank {r} could not open it: {why}); every call goes over the network"
                        );
                        None
                    }
                    None => hier.transpose()?,
                };
                Path::Net { net, hier }
            }
        };
        Ok(GpuComm {
            rank,
            nranks,
            desc: path.describe(),
            path,
            reach,
            seqs: parking_lot::Mutex::new(std::collections::HashMap::new()),
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

    /// How this rank reaches `peer`'s GPU memory.
    pub fn reach(&self, peer: usize) -> Option<Reach> {
        self.reach.get(peer).copied()
    }

    /// The host trace of one process per GPU (`RAILCC_GPU_HOST_TRACE`; None on the other
    /// paths), for the caller's own phases.
    pub fn host_trace(&self) -> Option<&railcc_transport_nvlink::host_trace::HostTrace> {
        match &self.path {
            Path::Peer(pg) => Some(pg.host_trace()),
            Path::InProcess(_) | Path::Net { .. } => None,
        }
    }

    /// The per-process kernels' GPU when every peer is reached by peer access (for copies
    /// between this rank's own streams).
    pub fn peer_gpu(&self) -> Option<&GpuCtx> {
        match &self.path {
            Path::Peer(pg) => Some(&pg.gpu),
            Path::InProcess(_) | Path::Net { .. } => None,
        }
    }

    /// The GPUs this process drives for every rank ([`GpuPath::InProcess`]): their contexts
    /// and own streams, for callers that allocate and synchronize (the bench).
    pub fn in_process_gpus(&self) -> Option<&MultiGpu> {
        match &self.path {
            Path::InProcess(m) => Some(m),
            _ => None,
        }
    }

    /// An error when either part of the communicator is broken (see `async_error`).
    fn not_broken(&self) -> Result<()> {
        self.async_error()
            .map_or(Ok(()), |e| Err(Error::earlier(&e).rank(self.rank)))
    }

    /// The error that broke the communicator (a peer died, an abort), if any. When one part
    /// of a networked communicator broke, the other is stopped with the same cause before the
    /// caller hears of it, so the peers waiting on that part hear it too, even when the caller
    /// then aborts at once (ncclCommShrink after a failure).
    pub fn async_error(&self) -> Option<Error> {
        match &self.path {
            Path::InProcess(m) => m.async_error(),
            Path::Peer(pg) => pg.async_error(),
            Path::Net { net, hier: None } => net.async_error(),
            Path::Net { net, hier: Some(h) } => match (net.async_error(), h.async_error()) {
                (Some(e), None) => {
                    h.abort_with(e.clone());
                    Some(e)
                }
                (None, Some(e)) => {
                    net.abort_with(e.clone());
                    Some(e)
                }
                (n, h) => n.or(h),
            },
        }
    }

    /// Stops every call now: kernels and waiting streams let go, later calls fail.
    pub fn abort(&self) {
        match &self.path {
            Path::InProcess(m) => m.abort(),
            Path::Peer(pg) => pg.abort(),
            Path::Net { net, hier } => {
                net.abort();
                if let Some(h) = hier {
                    h.abort();
                }
            }
        }
    }

    /// Enqueues one collective and returns: `calls` holds the call of every rank this
    /// process drives (all of them in one process; this rank's alone with one rank per
    /// process), each on its rank's stream. Returns the thread blocks it takes per GPU (0:
    /// copy engines and host threads only).
    ///
    /// # Safety
    /// Each call's stream is a live stream of its rank's GPU; its `send` and `recv` are device
    /// memory of that GPU from cudaMalloc/cuMemAlloc (CUDA IPC exports them), sized as its
    /// arguments imply, valid until the stream passes the call.
    pub unsafe fn collective(&self, calls: &[Call]) -> Result<u32> {
        let Some(c) = calls.first().copied() else {
            return Ok(0);
        };
        if c.args.count == 0 {
            return Ok(0);
        }
        if let Path::InProcess(m) = &self.path {
            // SAFETY: the caller's contract.
            return unsafe { m.collective(calls) }.map(|l| l.blocks_per_gpu);
        }
        if calls.len() != 1 {
            return Err(Error::invalid(format!(
                "{}: {} calls for one rank per process",
                c.args.coll.name(),
                calls.len()
            ))
            .rank(self.rank));
        }
        let (a, send, recv, stream) = (c.args, c.send, c.recv, stream_of(c.stream));
        match &self.path {
            Path::InProcess(_) => Ok(0),
            // SAFETY: the caller's contract.
            Path::Peer(pg) => unsafe { pg.collective(&c) }.map(|l| l.blocks_per_gpu),
            Path::Net { net, hier } => {
                // Either part broken breaks the communicator: a call on the other would run
                // here while the peers that saw the failure have stopped.
                self.not_broken()?;
                if let Some(h) = hier
                    .as_ref()
                    .filter(|_| a.coll == CollKind::AllToAll && send != recv)
                {
                    // SAFETY: the caller's contract.
                    return unsafe { self.all_to_all_split(h, &a, send, recv, c.stream) }
                        .map(|_| 0);
                }
                if let Some(h) = hier.as_ref().filter(|h| h.takes(&a)) {
                    // SAFETY: the caller's contract.
                    return unsafe { h.enqueue(&a, send, recv, stream) }.map(|_| 0);
                }
                let op = NetOp::Coll { a, send, recv };
                // SAFETY: the caller's contract.
                unsafe { net.enqueue(op, stream) }.map(|_| net.blocks())
            }
        }
    }

    /// A message between two ranks of this process ([`GpuPath::InProcess`]): rank `src`'s
    /// send `s` (to rank `s.peer`) into that rank's receive `r`, ordered on both streams.
    ///
    /// # Safety
    /// Both buffers are device memory of their rank's GPU with `s.bytes`, each stream a live
    /// stream of that GPU, valid until the streams pass the copy.
    pub unsafe fn copy(&self, src: usize, s: &P2pOp, r: &P2pOp) -> Result<()> {
        match &self.path {
            // SAFETY: the caller's contract.
            Path::InProcess(m) => unsafe { m.copy(src, s, r) },
            _ => Err(Error::new(
                ErrorKind::Unsupported,
                "a copy between ranks of one process on a communicator of one rank per process",
            )
            .rank(self.rank)),
        }
    }

    /// Enqueues the sends and receives of one group (or one call) and returns. Peers on this
    /// host go by peer access when there is a path for it (one host, or the hierarchy's);
    /// the rest over the network, enqueued first (it never waits on the host, and peer
    /// access may, for a send to be posted).
    ///
    /// # Safety
    /// Each op's buffer is device memory of this rank's GPU from cudaMalloc/cuMemAlloc with
    /// `bytes`, and its stream a live stream of that GPU, valid until the stream passes it.
    pub unsafe fn p2p(&self, ops: &[P2pOp]) -> Result<()> {
        // Checked before any message is numbered, so a refused group leaves both ends'
        // counts equal.
        if let Some(o) = ops.iter().find(|o| o.peer >= self.nranks) {
            return Err(Error::invalid(format!(
                "send/recv: peer {} out of range for {} ranks",
                o.peer, self.nranks
            ))
            .rank(self.rank));
        }
        match &self.path {
            Path::InProcess(_) => Err(Error::new(
                ErrorKind::Unsupported,
                "send/recv between ranks of one process pair up in GpuComm::copy",
            )
            .rank(self.rank)),
            // SAFETY: the caller's contract.
            Path::Peer(pg) => unsafe { pg.p2p(&self.numbered(ops, Some)) },
            Path::Net { net, hier } => {
                self.not_broken()?;
                let local =
                    |o: &&P2pOp| hier.is_some() && self.reach(o.peer) == Some(Reach::PeerAccess);
                let (near, far): (Vec<&P2pOp>, Vec<&P2pOp>) = ops.iter().partition(local);
                let Some(h) = hier.as_ref().filter(|_| !near.is_empty()) else {
                    // SAFETY: the caller's contract.
                    return unsafe { self.net_p2p(net, &far) };
                };
                let mut near: Vec<P2pOp> = near.into_iter().copied().collect();
                // Both kinds in one group: the same-host ones go on a side stream forked from
                // the caller's and joined back, so they run beside the network ones as NCCL
                // runs a group's operations together (one after the other, a ring that
                // crosses hosts twice would wait on itself). One stream for the whole group,
                // as for the network's part: the fork keeps only that stream's order.
                let main = far.first().map(|f| f.stream);
                if main.is_some_and(|m| near.iter().any(|o| o.stream != m)) {
                    return Err(Error::new(
                        ErrorKind::Unsupported,
                        "sends and receives of one group on different streams (across hosts railcc takes one stream per group)",
                    )
                    .rank(self.rank));
                }
                // Past this point this rank's peers take part in the group: a failure here
                // would leave the message counts apart, so it stops the communicator.
                let r = (|| -> Result<()> {
                    let fork = match main.map(stream_of) {
                        Some(m) => Some((m, h.side_stream(m)?)),
                        None => None,
                    };
                    if let Some((main, side)) = fork {
                        near.iter_mut().for_each(|o| o.stream = side as usize);
                        // SAFETY: both are live streams of this rank's GPU.
                        unsafe { h.stream_waits_for(side, main) }?;
                    }
                    // SAFETY: the caller's contract.
                    let sent = unsafe { self.net_p2p(net, &far) };
                    let list = self.numbered(&near, |p| h.local_index(p));
                    // SAFETY: the caller's contract; the side stream is this GPU's.
                    let local = sent.and_then(|_| unsafe { h.p2p_local(&list) });
                    // Joined back whatever happened: a capture with an open fork is invalid.
                    let joined = match fork {
                        // SAFETY: as above.
                        Some((main, side)) => unsafe { h.stream_waits_for(main, side) },
                        None => Ok(()),
                    };
                    local.and(joined)
                })();
                if let Err(e) = &r {
                    net.abort_with(e.clone());
                    h.abort_with(e.clone());
                }
                r
            }
        }
    }

    /// The peer-access path's ops: peers as `index` numbers them, each message numbered.
    fn numbered(&self, ops: &[P2pOp], index: impl Fn(usize) -> Option<usize>) -> Vec<P2p> {
        let mut seqs = self.seqs.lock();
        ops.iter()
            .map(|o| {
                let n = seqs.entry((o.peer, o.send)).or_insert(0);
                *n += 1;
                P2p {
                    peer: index(o.peer).unwrap_or(usize::MAX),
                    send: o.send,
                    ptr: o.ptr,
                    bytes: o.bytes,
                    stream: stream_of(o.stream),
                    seq: *n,
                }
            })
            .collect()
    }

    /// # Safety
    /// As for [`GpuComm::p2p`].
    unsafe fn net_p2p(&self, net: &GpuNet, ops: &[&P2pOp]) -> Result<()> {
        let Some(stream) = ops.first().map(|o| o.stream) else {
            return Ok(());
        };
        if ops.iter().any(|o| o.stream != stream) {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "sends and receives of one group on different streams (across hosts railcc takes one stream per group)",
            )
            .rank(self.rank));
        }
        let list = ops
            .iter()
            .map(|o| NetP2p {
                kind: if o.send { P2pKind::Send } else { P2pKind::Recv },
                peer: o.peer,
                addr: o.ptr,
                bytes: o.bytes,
            })
            .collect();
        // SAFETY: the caller's contract.
        unsafe { net.enqueue(NetOp::P2p(list), stream_of(stream)) }
    }

    /// An all-to-all as sends and receives, so peers on this host go by peer access (the
    /// hierarchy's); the chunk to itself is a copy.
    ///
    /// # Safety
    /// As for [`GpuComm::collective`].
    unsafe fn all_to_all_split(
        &self,
        h: &HierGpu,
        a: &CollArgs,
        send: u64,
        recv: u64,
        stream: usize,
    ) -> Result<()> {
        let chunk = a.count * a.dtype.size();
        let mut ops = Vec::with_capacity(2 * a.nranks);
        for p in (0..a.nranks).filter(|&p| p != self.rank) {
            let at = (p * chunk) as u64;
            ops.push(P2pOp {
                peer: p,
                send: true,
                ptr: send + at,
                bytes: chunk,
                stream,
            });
            ops.push(P2pOp {
                peer: p,
                send: false,
                ptr: recv + at,
                bytes: chunk,
                stream,
            });
        }
        let me = (self.rank * chunk) as u64;
        // SAFETY: the caller's buffers on its stream.
        unsafe { h.copy(recv + me, send + me, chunk, stream_of(stream)) }?;
        // SAFETY: the caller's contract.
        unsafe { self.p2p(&ops) }
    }
}
