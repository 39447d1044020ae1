//! Communicator init over railcc's bootstrap, and the per-process GPU path.
//!
//! Every init joins the job through railcc's TCP bootstrap (the id holds the root's address
//! and secret, so a stranger at the port is refused), then the ranks swap (process id,
//! device). All in this process: they meet in a clique and use the multi-GPU kernels. One per
//! process: each opens railcc's per-process GPU path (peers' buffers through CUDA IPC; the
//! bootstrap carries the handles).

use crate::clique::Clique;
use crate::Backend;
use railcc_collectives::gpu::{GpuComm, GpuPath, Placement};
use railcc_collectives::Communicator;
use railcc_core::call::P2pOp;
use railcc_core::{Error, Result};
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
    comm_config: &crate::abi::CommConfig,
) -> Result<(Backend, Communicator)> {
    let mut cfg = crate::config()?;
    comm_config
        .apply(&mut cfg)
        .map_err(|e| Error::invalid(format!("ncclCommInitRankConfig: {e}")))?;
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
    // GpuComm's one decision of the path: every rank in this process meets in the clique,
    // which drives them all through one in-process GpuComm; otherwise this rank opens its
    // own (peer access, the network or both as a hierarchy).
    let placement = Placement::gather(boot)?;
    let path = placement.choose_for(cfg)?;
    if path == GpuPath::InProcess {
        let clique = Clique::get(id.secret.0, nranks, timeout)?;
        clique.join(rank, device)?;
        let ready = clique.open(cfg).map(|_| ());
        // Every rank of the clique has joined once ready returns: forget the id.
        Clique::unregister(&id.secret.0);
        ready?;
        return Ok(Backend::Local(clique));
    }
    let comm = GpuComm::open(boot, device.max(0) as usize, &placement, path)?;
    Ok(Backend::Gpu(Box::new(GpuRank { comm })))
}

/// This process's rank of a one-rank-per-process communicator (railcc's [`GpuComm`]).
pub struct GpuRank {
    pub comm: GpuComm,
}

impl GpuRank {
    /// Sends and receives of one group (or one call).
    pub fn p2p(&self, ops: &[P2pOp]) -> Result<()> {
        // SAFETY: NCCL's contract: device buffers of this rank's GPU (cudaMalloc/cuMemAlloc,
        // so CUDA IPC can export them), sized as given, live until the streams pass the ops.
        unsafe { self.comm.p2p(ops) }
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
                .map(|r| {
                    s.spawn(move || {
                        let none = crate::abi::CommConfig::default();
                        connect(&id, r, 2, r as i32, Duration::from_secs(20), &none)
                    })
                })
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
