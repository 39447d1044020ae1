//! Communicator init over railcc's bootstrap, and the per-process GPU path.
//!
//! Every init joins the job through railcc's TCP bootstrap (the id holds the root's address
//! and secret, so a stranger at the port is refused), then the ranks swap (process id,
//! device). All in this process: they meet in a clique and use the multi-GPU kernels. One per
//! process: each opens railcc's per-process GPU path (peers' buffers through CUDA IPC; the
//! bootstrap carries the handles).

use crate::clique::{Call, Clique, Half};
use crate::Backend;
use railcc_collectives::gpu_hier::HierGpu;
use railcc_collectives::gpu_net::{GpuNet, NetOp, P2pOp};
use railcc_collectives::plan::{CollArgs, P2pKind};
use railcc_collectives::Communicator;
use railcc_core::{Error, ErrorKind, Result};
use railcc_transport_nvlink::proc::{P2p, ProcGpu};
use std::time::Duration;

/// Roots served by this process, kept until it exits (each stops once its job has met).
static ROOTS: parking_lot::Mutex<Vec<railcc_core::bootstrap::RootServer>> =
    parking_lot::Mutex::new(Vec::new());

/// A bootstrap root on the interface NCCL would pick: the first matching
/// `RAILCC_SOCKET_IFNAME`/`NCCL_SOCKET_IFNAME` (`ifname`), else the first interface that is
/// neither loopback nor virtual, else loopback.
pub fn serve_root(timeout: Duration, ifname: &str) -> Result<railcc_core::bootstrap::UniqueId> {
    let ifaces = railcc_core::netif::list()?;
    let iface = railcc_core::netif::choose(&ifaces, ifname, None)?;
    let bind = std::net::SocketAddr::new(iface.ip, 0);
    let root = railcc_core::bootstrap::RootServer::start(bind, timeout)?;
    let id = root.id;
    ROOTS.lock().push(root);
    Ok(id)
}

/// Joins the job `id` names and opens the GPU path that fits where the ranks live. The
/// bootstrap communicator comes back too: the communicator keeps it for its life (its
/// connections carry ncclCommSplit's exchanges).
pub(crate) fn connect(
    id: &railcc_core::bootstrap::UniqueId,
    rank: usize,
    nranks: usize,
    device: i32,
    timeout: Duration,
) -> Result<(Backend, Communicator)> {
    let cfg = crate::config()?;
    let boot = Communicator::init(cfg.clone(), id, rank, nranks)?;
    let backend = open(&boot, &cfg, id, rank, nranks, device, timeout)?;
    Ok((backend, boot))
}

fn open(
    boot: &Communicator,
    cfg: &railcc_core::Config,
    id: &railcc_core::bootstrap::UniqueId,
    rank: usize,
    nranks: usize,
    device: i32,
    timeout: Duration,
) -> Result<Backend> {
    let mine: Vec<u8> = [std::process::id().to_le_bytes(), device.to_le_bytes()].concat();
    let all = boot.oob_all_gather(&mine)?;
    let pids: Vec<u32> = all
        .iter()
        .map(|b| {
            b.get(..4)
                .and_then(|x| x.try_into().ok())
                .map_or(0, u32::from_le_bytes)
        })
        .collect();
    let me = std::process::id();
    // Ranks on other hosts (RAILCC_HOSTID/NCCL_HOSTID, else the boot id) are reached over
    // the network; so is everyone with RAILCC_GPU_PATH=net.
    if boot.local_ranks() < nranks || cfg.gpu_path == "net" {
        let mut sorted = pids.clone();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) && boot.local_ranks() == nranks {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "RAILCC_GPU_PATH=net needs one rank per process",
            ));
        }
        let ordinal = device.max(0) as usize;
        // Several GPUs on each of several hosts: NVLink inside a host, the network between
        // (RAILCC_GPU_PATH=net keeps every call on the network).
        let hier = match cfg.gpu_path.as_str() {
            "auto" => HierGpu::layout(boot)?
                .map(|l| HierGpu::new(boot, l, ordinal))
                .transpose()?,
            _ => None,
        };
        let net = GpuNet::new(boot, ordinal)?;
        return Ok(Backend::Net(Box::new(NetRank { net, hier })));
    }
    if pids.iter().all(|&p| p == me) {
        let clique = Clique::get(id.secret.0, nranks, timeout)?;
        clique.join(rank, device)?;
        let ready = clique.ready().map(|_| ());
        // Every rank of the clique has joined once ready returns: forget the id.
        Clique::unregister(&id.secret.0);
        ready?;
        return Ok(Backend::Local(clique));
    }
    let mut sorted = pids.clone();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != nranks {
        return Err(Error::new(
            ErrorKind::Unsupported,
            "ranks share some processes but not all (railcc's libnccl runs either every rank in one process or one rank per process)",
        ));
    }
    let cache = std::env::var_os("RAILCC_CACHE_DIR").map(std::path::PathBuf::from);
    let mut ex = |b: &[u8]| boot.oob_all_gather(b);
    let mut gpu = ProcGpu::new(
        device.max(0) as usize,
        rank,
        nranks,
        cache.as_deref(),
        timeout,
        cfg.gpu_max_blocks,
        &mut ex,
    )?;
    gpu.ll_max_bytes = cfg.gpu_ll_max_bytes;
    Ok(Backend::Proc(Box::new(ProcRank { gpu })))
}

/// This process's rank of a one-rank-per-process communicator.
pub struct ProcRank {
    gpu: ProcGpu,
}

// SAFETY: ProcGpu holds driver handles that any thread may use (CUDA's driver API is thread
// safe) and serializes its calls with its own locks and counters.
unsafe impl Send for ProcRank {}
// SAFETY: as above.
unsafe impl Sync for ProcRank {}

impl ProcRank {
    /// A dead peer (the watcher) or an abort, as ncclCommGetAsyncError reports it.
    pub fn async_error(&self) -> Option<Error> {
        self.gpu.async_error()
    }

    pub fn abort(&self) {
        self.gpu.abort();
    }

    pub fn collective(&self, c: &Call) -> Result<()> {
        if c.count == 0 {
            return Ok(());
        }
        // SAFETY: NCCL's contract: device buffers of this rank's GPU (cudaMalloc/cuMemAlloc,
        // so CUDA IPC can export them), sized for the call, live until the stream passes it.
        unsafe {
            self.gpu.collective(
                c.stream as cudarc::driver::sys::CUstream,
                c.coll,
                c.send,
                c.recv,
                c.count,
                c.dtype,
                c.op,
                c.root,
            )
        }
        .map(|_| ())
    }

    /// A rank's message to itself: a copy on the receive's stream, after the send's stream
    /// reaches the send (events when the streams differ).
    pub fn self_copy(&self, s: Half, r: Half) -> Result<()> {
        use cudarc::driver::sys;
        use railcc_cuda::driver::check;
        use railcc_cuda::gpu::stream_waits_for;
        if s.bytes != r.bytes {
            return Err(Error::new(
                ErrorKind::Mismatch,
                format!(
                    "send to itself of {} bytes, receive from itself of {}",
                    s.bytes, r.bytes
                ),
            ));
        }
        if s.bytes == 0 {
            return Ok(());
        }
        let g = &self.gpu.gpu;
        let (ss, rs) = (s.stream as sys::CUstream, r.stream as sys::CUstream);
        // SAFETY: both streams are the caller's streams of this rank's GPU (NCCL's contract),
        // as are both buffers of `bytes`.
        unsafe {
            if ss != rs {
                stream_waits_for(g, rs, g, ss)?;
            }
            g.bind()?;
            check(
                sys::cuMemcpyAsync(r.ptr, s.ptr, s.bytes, rs),
                "cuMemcpyAsync",
            )?;
            if ss != rs {
                stream_waits_for(g, ss, g, rs)?;
            }
        }
        Ok(())
    }

    /// A send or receive between the two ranks of a 2-rank communicator: a broadcast rooted at
    /// the sender, in place on both sides (the receiver's buffer gets the sender's bytes).
    /// Sends and receives of one group (or one call) with other processes: (peer, is_send,
    /// buffer, message number between the two in that direction, from 1).
    pub fn p2p(&self, ops: &[(usize, bool, Half, u64)]) -> Result<()> {
        let list: Vec<P2p> = ops
            .iter()
            .map(|&(peer, send, h, seq)| P2p {
                peer,
                send,
                ptr: h.ptr,
                bytes: h.bytes,
                stream: h.stream as cudarc::driver::sys::CUstream,
                seq,
            })
            .collect();
        // SAFETY: NCCL's contract: device buffers of this rank's GPU (cudaMalloc/cuMemAlloc,
        // so CUDA IPC can export them), sized as given, live until the streams pass the ops.
        unsafe { self.gpu.p2p(&list) }
    }
}

/// This process's rank of a communicator whose ranks sit on several hosts. With several GPUs
/// on every host, collectives run as a hierarchy (`hier`: NVLink inside a host, the network
/// between hosts); the rest (and everything with one GPU per host) goes through railcc's
/// stream-ordered network engine (no CUDA IPC, no kernels).
pub struct NetRank {
    pub net: GpuNet,
    pub hier: Option<HierGpu>,
}

impl NetRank {
    pub fn describe(&self) -> &str {
        match &self.hier {
            Some(h) => h.describe(),
            None => self.net.describe(),
        }
    }

    pub fn async_error(&self) -> Option<Error> {
        self.net
            .async_error()
            .or_else(|| self.hier.as_ref().and_then(HierGpu::async_error))
    }

    pub fn abort(&self) {
        self.net.abort();
        if let Some(h) = &self.hier {
            h.abort();
        }
    }

    pub fn collective(&self, c: &Call) -> Result<()> {
        let a = CollArgs {
            coll: c.coll,
            nranks: self.net.nranks(),
            count: c.count,
            dtype: c.dtype,
            op: c.op,
            root: c.root,
        };
        if let Some(h) = self.hier.as_ref().filter(|h| h.takes(&a)) {
            // SAFETY: NCCL's contract: device buffers of this rank's GPU (cudaMalloc, so CUDA
            // IPC can export them) sized for the call, live until the stream passes it.
            return unsafe { h.enqueue(&a, c.send, c.recv, c.stream as railcc_cuda::gpu::Stream) };
        }
        let op = NetOp::Coll {
            a,
            send: c.send,
            recv: c.recv,
        };
        // SAFETY: NCCL's contract: device buffers of this rank's GPU sized for the call, live
        // until the stream passes it; the stream is the caller's.
        unsafe { self.net.enqueue(op, c.stream as railcc_cuda::gpu::Stream) }
    }

    /// Sends and receives of one group (or one call), as one engine call on their stream.
    pub fn p2p(&self, ops: &[(usize, bool, Half)]) -> Result<()> {
        let Some(stream) = ops.first().map(|o| o.2.stream) else {
            return Ok(());
        };
        if ops.iter().any(|o| o.2.stream != stream) {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "sends and receives of one group on different streams (across hosts railcc takes one stream per group)",
            ));
        }
        let list = ops
            .iter()
            .map(|&(peer, send, h)| P2pOp {
                kind: if send { P2pKind::Send } else { P2pKind::Recv },
                peer,
                addr: h.ptr,
                bytes: h.bytes,
            })
            .collect();
        // SAFETY: as for collective.
        unsafe {
            self.net
                .enqueue(NetOp::P2p(list), stream as railcc_cuda::gpu::Stream)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two ranks of one process meet over the bootstrap and find each other; without a CUDA
    /// driver the GPUs then fail to open, on both ranks, with the reason (no hang).
    #[test]
    fn ranks_meet_over_the_bootstrap_and_fail_cleanly_without_gpus() {
        if railcc_cuda::driver::available().is_ok() {
            println!("CUDA driver present: this test is for machines without one");
            return;
        }
        let id = serve_root(Duration::from_secs(20), "lo").unwrap();
        let errs: Vec<Error> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| s.spawn(move || connect(&id, r, 2, r as i32, Duration::from_secs(20))))
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap().err().expect("no GPUs here"))
                .collect()
        });
        for e in errs {
            assert!(e.to_string().contains("CUDA driver"), "{e}");
        }
    }
}
