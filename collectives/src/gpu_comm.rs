//! [`GpuComm`]: the one front door for GPU buffers of one rank per process, on top of a
//! [`Communicator`]'s bootstrap, host grouping and transports. `railcc bench --per-process`
//! and libnccl both open it; it decides, from where the ranks live, how data moves:
//! - every rank on this host: peer access (NVLink/PCIe) through CUDA IPC, the per-process
//!   kernels ([`ProcGpu`]);
//! - ranks on several hosts: the stream-ordered network engine ([`GpuNet`]: RDMA, else TCP)
//!   for everything, and with several GPUs on every host the collectives as a hierarchy
//!   ([`HierGpu`]: peer access inside a host, the network between hosts);
//! - `RAILCC_GPU_PATH=net`: the network between every pair (tests and comparisons).
//!
//! Several ranks driving GPUs from one process (`ncclCommInitAll`, `railcc bench --device
//! cuda` without `--per-process`) use `railcc_transport_nvlink::multi::MultiGpu` instead.

use crate::comm::Communicator;
use crate::gpu_hier::HierGpu;
use crate::gpu_net::{GpuNet, NetOp, P2pOp};
use crate::plan::{CollArgs, P2pKind};
use railcc_core::call::CollKind;
use railcc_core::{Error, ErrorKind, Result};
use railcc_cuda::gpu::{GpuCtx, Stream};
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
    Peer(ProcGpu),
    Net { net: GpuNet, hier: Option<HierGpu> },
}

/// One send or receive of a group, on a device buffer.
#[derive(Clone, Copy, Debug)]
pub struct GpuP2p {
    pub peer: usize,
    pub send: bool,
    pub ptr: u64,
    pub bytes: usize,
    pub stream: Stream,
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
    /// Opens the path that fits where `boot`'s ranks live, for this rank's GPU `ordinal`.
    /// Collective: every rank of `boot` calls it, one rank per process.
    pub fn new(boot: &Communicator, ordinal: usize) -> Result<GpuComm> {
        GpuComm::open(boot, ordinal, boot.config().gpu_path == "net")
    }

    /// As [`GpuComm::new`], every pair over the network (`railcc bench --gpu-net`).
    pub fn over_network(boot: &Communicator, ordinal: usize) -> Result<GpuComm> {
        GpuComm::open(boot, ordinal, true)
    }

    fn open(boot: &Communicator, ordinal: usize, net_only: bool) -> Result<GpuComm> {
        let (rank, nranks) = (boot.rank(), boot.nranks());
        let hosts = boot.oob_all_gather(crate::comm::host_id(boot.config()).as_bytes())?;
        // One rank per process: (host, pid and pid namespace) differ (hosts may reuse pids,
        // containers always do).
        let pids = boot.oob_all_gather(&crate::comm::process_id())?;
        let mut procs: Vec<(&[u8], &[u8])> = hosts
            .iter()
            .map(Vec::as_slice)
            .zip(pids.iter().map(Vec::as_slice))
            .collect();
        procs.sort_unstable();
        procs.dedup();
        if procs.len() != nranks {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "GPU ranks share processes: one rank per process here (one process driving several GPUs is railcc_transport_nvlink::multi::MultiGpu)",
            )
            .rank(rank));
        }
        let reach: Vec<Reach> = hosts
            .iter()
            .enumerate()
            .map(|(p, h)| match p {
                _ if p == rank => Reach::Me,
                _ if !net_only && *h == hosts[rank] => Reach::PeerAccess,
                _ => Reach::Network,
            })
            .collect();
        let several_hosts = boot.local_ranks() < nranks;
        let path = if net_only || several_hosts {
            // Both are opened on every rank whatever the other gave (each is collective), then
            // every rank learns every outcome, so all leave together: with the same path, or
            // with the same error.
            let hier = match net_only {
                false => HierGpu::layout(&hosts).map(|l| HierGpu::new(boot, l, ordinal)),
                true => None,
            };
            let net = GpuNet::new(boot, ordinal);
            let mine = [outcome(&net), hier.as_ref().map_or(vec![1], outcome)];
            let all = boot.oob_all_gather(&mine.concat())?;
            let net = net?;
            if let Some((r, why)) = all.iter().enumerate().find_map(|(r, b)| failure(r, b, 0)) {
                let e = format!("rank {r} failed to open its GPU network engine: {why}");
                return Err(Error::new(ErrorKind::Io, e).peer(r).rank(rank));
            }
            // The hierarchy is a speed-up: where a rank could not open it, every rank runs
            // the flat network path instead.
            let hier = match all.iter().enumerate().find_map(|(r, b)| failure(r, b, 1)) {
                Some((r, why)) => {
                    tracing::warn!(
                        "rank {rank}: GPU hierarchy off (rank {r} could not open it: {why}); every call goes over the network"
                    );
                    None
                }
                None => hier.transpose()?,
            };
            Path::Net { net, hier }
        } else {
            let cfg = boot.config();
            let cache = cfg.kernel_cache_dir();
            let mut ex = |b: &[u8]| boot.oob_all_gather(b);
            let mut pg = ProcGpu::new(
                ordinal,
                rank,
                nranks,
                cache.as_deref(),
                cfg.timeout(),
                cfg.gpu_max_blocks,
                &mut ex,
                None,
            )?;
            pg.ll_max_bytes = cfg.gpu_ll_max_bytes;
            Path::Peer(pg)
        };
        let desc = match &path {
            Path::Peer(pg) => format!(
                "one rank per process, peers by CUDA IPC, up to {} blocks per GPU",
                pg.max_blocks
            ),
            Path::Net { hier: Some(h), .. } => h.describe().to_string(),
            Path::Net { net, .. } => net.describe().to_string(),
        };
        Ok(GpuComm {
            rank,
            nranks,
            path,
            reach,
            seqs: parking_lot::Mutex::new(std::collections::HashMap::new()),
            desc,
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

    /// The per-process kernels' GPU when every peer is reached by peer access (for copies
    /// between this rank's own streams).
    pub fn peer_gpu(&self) -> Option<&GpuCtx> {
        match &self.path {
            Path::Peer(pg) => Some(&pg.gpu),
            Path::Net { .. } => None,
        }
    }

    /// An error when either part of the communicator is broken; the other part is then
    /// stopped with the same cause, so the peers waiting on it hear it too.
    fn not_broken(&self) -> Result<()> {
        let cause = match &self.path {
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
            _ => self.async_error(),
        };
        cause.map_or(Ok(()), |e| Err(Error::earlier(&e).rank(self.rank)))
    }

    /// The error that broke the communicator (a peer died, an abort), if any.
    pub fn async_error(&self) -> Option<Error> {
        match &self.path {
            Path::Peer(pg) => pg.async_error(),
            Path::Net { net, hier } => net
                .async_error()
                .or_else(|| hier.as_ref().and_then(|h| h.async_error())),
        }
    }

    /// Stops every call now: kernels and waiting streams let go, later calls fail.
    pub fn abort(&self) {
        match &self.path {
            Path::Peer(pg) => pg.abort(),
            Path::Net { net, hier } => {
                net.abort();
                if let Some(h) = hier {
                    h.abort();
                }
            }
        }
    }

    /// Enqueues collective `a` on `stream` and returns; the thread blocks it takes on this
    /// GPU (0: copy engines and host threads only).
    ///
    /// # Safety
    /// `stream` is a live stream of this rank's GPU; `send` and `recv` are device memory of
    /// that GPU from cudaMalloc/cuMemAlloc (CUDA IPC exports them), sized as `a` implies,
    /// valid until the stream passes the call.
    pub unsafe fn collective(
        &self,
        a: &CollArgs,
        send: u64,
        recv: u64,
        stream: Stream,
    ) -> Result<u32> {
        if a.count == 0 {
            return Ok(0);
        }
        match &self.path {
            // SAFETY: the caller's contract.
            Path::Peer(pg) => {
                unsafe { pg.collective(stream, a.coll, send, recv, a.count, a.dtype, a.op, a.root) }
                    .map(|l| l.blocks_per_gpu)
            }
            Path::Net { net, hier } => {
                // Either part broken breaks the communicator: a call on the other would run
                // here while the peers that saw the failure have stopped.
                self.not_broken()?;
                if let Some(h) = hier
                    .as_ref()
                    .filter(|_| a.coll == CollKind::AllToAll && send != recv)
                {
                    // SAFETY: the caller's contract.
                    return unsafe { self.all_to_all_split(h, a, send, recv, stream) }.map(|_| 0);
                }
                if let Some(h) = hier.as_ref().filter(|h| h.takes(a)) {
                    // SAFETY: the caller's contract.
                    return unsafe { h.enqueue(a, send, recv, stream) }.map(|_| 0);
                }
                let op = NetOp::Coll { a: *a, send, recv };
                // SAFETY: the caller's contract.
                unsafe { net.enqueue(op, stream) }.map(|_| 0)
            }
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
    pub unsafe fn p2p(&self, ops: &[GpuP2p]) -> Result<()> {
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
            // SAFETY: the caller's contract.
            Path::Peer(pg) => unsafe { pg.p2p(&self.numbered(ops, Some)) },
            Path::Net { net, hier } => {
                self.not_broken()?;
                let local =
                    |o: &&GpuP2p| hier.is_some() && self.reach(o.peer) == Some(Reach::PeerAccess);
                let (near, far): (Vec<&GpuP2p>, Vec<&GpuP2p>) = ops.iter().partition(local);
                let Some(h) = hier.as_ref().filter(|_| !near.is_empty()) else {
                    // SAFETY: the caller's contract.
                    return unsafe { self.net_p2p(net, &far) };
                };
                let mut near: Vec<GpuP2p> = near.into_iter().copied().collect();
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
                    let fork = match main {
                        Some(m) => Some((m, h.side_stream(m)?)),
                        None => None,
                    };
                    if let Some((main, side)) = fork {
                        near.iter_mut().for_each(|o| o.stream = side);
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
    fn numbered(&self, ops: &[GpuP2p], index: impl Fn(usize) -> Option<usize>) -> Vec<P2p> {
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
                    stream: o.stream,
                    seq: *n,
                }
            })
            .collect()
    }

    /// # Safety
    /// As for [`GpuComm::p2p`].
    unsafe fn net_p2p(&self, net: &GpuNet, ops: &[&GpuP2p]) -> Result<()> {
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
            .map(|o| P2pOp {
                kind: if o.send { P2pKind::Send } else { P2pKind::Recv },
                peer: o.peer,
                addr: o.ptr,
                bytes: o.bytes,
            })
            .collect();
        // SAFETY: the caller's contract.
        unsafe { net.enqueue(NetOp::P2p(list), stream) }
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
        stream: Stream,
    ) -> Result<()> {
        let chunk = a.count * a.dtype.size();
        let mut ops = Vec::with_capacity(2 * a.nranks);
        for p in (0..a.nranks).filter(|&p| p != self.rank) {
            let at = (p * chunk) as u64;
            ops.push(GpuP2p {
                peer: p,
                send: true,
                ptr: send + at,
                bytes: chunk,
                stream,
            });
            ops.push(GpuP2p {
                peer: p,
                send: false,
                ptr: recv + at,
                bytes: chunk,
                stream,
            });
        }
        let me = (self.rank * chunk) as u64;
        // SAFETY: the caller's buffers on its stream.
        unsafe { h.copy(recv + me, send + me, chunk, stream) }?;
        // SAFETY: the caller's contract.
        unsafe { self.p2p(&ops) }
    }
}

/// A rank's outcome as one record of the setup agreement: 1 (it worked), or 0, the error's
/// text and a 0 byte that ends it.
fn outcome<T>(r: &Result<T>) -> Vec<u8> {
    match r {
        Ok(_) => vec![1],
        Err(e) => {
            let mut b = vec![0];
            b.extend(e.to_string().bytes().filter(|&c| c != 0));
            b.push(0);
            b
        }
    }
}

/// Record `k` of rank `r`'s agreement payload (records as [`outcome`] writes them), when it
/// says that part failed: (r, the reason).
fn failure(r: usize, payload: &[u8], k: usize) -> Option<(usize, String)> {
    let mut records = Vec::new();
    let mut rest = payload;
    while let Some((&first, tail)) = rest.split_first() {
        if first == 1 {
            records.push(None);
            rest = tail;
        } else {
            let end = tail.iter().position(|&c| c == 0).unwrap_or(tail.len());
            records.push(Some(String::from_utf8_lossy(&tail[..end]).into_owned()));
            rest = tail.get(end + 1..).unwrap_or_default();
        }
    }
    match records.get(k) {
        Some(None) => None,
        Some(Some(why)) => Some((r, why.clone())),
        None => Some((r, "no setup record".to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::{failure, outcome};
    use railcc_core::{Error, Result};

    #[test]
    fn setup_records_name_the_part_that_failed() {
        let ok: Result<()> = Ok(());
        let bad: Result<()> = Err(Error::invalid("no pinned memory"));
        let both_ok = [outcome(&ok), outcome(&ok)].concat();
        assert_eq!(failure(3, &both_ok, 0), None);
        assert_eq!(failure(3, &both_ok, 1), None);
        let hier_bad = [outcome(&ok), outcome(&bad)].concat();
        assert_eq!(failure(2, &hier_bad, 0), None);
        let (r, why) = failure(2, &hier_bad, 1).expect("record 1 failed");
        assert_eq!(r, 2);
        assert!(why.contains("no pinned memory"), "{why}");
        let net_bad = [outcome(&bad), outcome(&ok)].concat();
        assert!(failure(1, &net_bad, 0).is_some());
        assert_eq!(failure(1, &net_bad, 1), None);
        // A payload with fewer records than asked for is a failure, not a pass.
        assert!(failure(0, &[1], 1).is_some());
        assert!(failure(0, &[], 0).is_some());
    }
}
