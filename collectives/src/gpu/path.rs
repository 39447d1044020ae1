//! How a GPU communicator moves data, decided once at init from where its ranks live
//! ([`Placement::choose`], the only place that decides), and per peer how it is reached.

use super::hier::{HierGpu, Layout};
use crate::comm::Communicator;
use railcc_core::{Config, Error, ErrorKind, Result};

/// Where every rank of a communicator lives, as every rank learnt it at init: its host
/// (`RAILCC_HOSTID`/`NCCL_HOSTID`, else the hostname and boot id) and its process (host, pid
/// and pid namespace: hosts may reuse pids, containers always do).
#[derive(Debug, Clone)]
pub struct Placement {
    pub rank: usize,
    pub hosts: Vec<Vec<u8>>,
    pub procs: Vec<Vec<u8>>,
}

/// The path a communicator's GPU data takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuPath {
    /// Every rank in this process: one process drives every GPU, kernels over peer access
    /// (`ncclCommInitAll`, nccl-tests `-g N`, `railcc bench --device cuda`).
    InProcess,
    /// One rank per process, every rank on this host: the per-process kernels, peers' buffers
    /// by CUDA IPC.
    PeerAccess,
    /// Ranks on several hosts (or `RAILCC_GPU_PATH=net`): the network engine for every call,
    /// and with `hier` the collectives it has a plan for as a hierarchy (peer access inside a
    /// host, the network between hosts).
    Network { hier: Option<Layout> },
}

impl Placement {
    /// Every rank's host and process, over `boot`'s bootstrap (collective).
    pub fn gather(boot: &Communicator) -> Result<Placement> {
        let hosts = boot.oob_all_gather(crate::comm::host_id(boot.config()).as_bytes())?;
        let procs = boot.oob_all_gather(&crate::comm::process_id())?;
        Ok(Placement {
            rank: boot.rank(),
            hosts,
            procs,
        })
    }

    pub fn nranks(&self) -> usize {
        self.hosts.len()
    }

    /// The path for these ranks: `net_only` (`RAILCC_GPU_PATH=net`, `railcc bench
    /// --gpu-net`) keeps every pair on the network. Ranks that share a process must all
    /// share it (one process driving every GPU) or none may.
    pub fn choose(&self, net_only: bool) -> Result<GpuPath> {
        let n = self.nranks();
        let same_proc = self.procs.iter().all(|p| *p == self.procs[self.rank]);
        let mut distinct: Vec<(&[u8], &[u8])> = (self.hosts.iter().map(Vec::as_slice))
            .zip(self.procs.iter().map(Vec::as_slice))
            .collect();
        distinct.sort_unstable();
        distinct.dedup();
        let one_host = self.hosts.iter().all(|h| *h == self.hosts[self.rank]);
        if same_proc && one_host && !net_only {
            return Ok(GpuPath::InProcess);
        }
        if distinct.len() != n {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "GPU ranks share processes: {} processes for {n} ranks (either one process drives every rank{}, or each rank has a process of its own)",
                    distinct.len(),
                    if net_only { " on peer access" } else { " of one host" }
                ),
            )
            .rank(self.rank));
        }
        if one_host && !net_only {
            return Ok(GpuPath::PeerAccess);
        }
        let hier = match net_only {
            false => HierGpu::layout(&self.hosts),
            true => None,
        };
        Ok(GpuPath::Network { hier })
    }

    /// The path `cfg` asks for (`RAILCC_GPU_PATH`).
    pub fn choose_for(&self, cfg: &Config) -> Result<GpuPath> {
        self.choose(cfg.gpu_path == "net")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placement(rank: usize, hosts: &[u8], procs: &[u8]) -> Placement {
        Placement {
            rank,
            hosts: hosts.iter().map(|&h| vec![h]).collect(),
            procs: procs.iter().map(|&p| vec![p]).collect(),
        }
    }

    #[test]
    fn the_path_follows_where_ranks_live() {
        // One process, one host: every GPU driven here.
        assert_eq!(
            placement(1, &[0, 0], &[5, 5]).choose(false).unwrap(),
            GpuPath::InProcess
        );
        // A process per rank on one host: CUDA IPC.
        assert_eq!(
            placement(0, &[0, 0], &[5, 6]).choose(false).unwrap(),
            GpuPath::PeerAccess
        );
        // Forced onto the network: never peer access, never the hierarchy.
        assert_eq!(
            placement(0, &[0, 0], &[5, 6]).choose(true).unwrap(),
            GpuPath::Network { hier: None }
        );
        // Two hosts of one rank: the network, no hierarchy.
        assert_eq!(
            placement(0, &[0, 1], &[5, 5]).choose(false).unwrap(),
            GpuPath::Network { hier: None }
        );
        // Two hosts of two: the hierarchy.
        let two_by_two = placement(2, &[0, 0, 1, 1], &[1, 2, 3, 4])
            .choose(false)
            .unwrap();
        assert!(
            matches!(two_by_two, GpuPath::Network { hier: Some(_) }),
            "{two_by_two:?}"
        );
    }

    #[test]
    fn ranks_that_share_some_processes_are_refused() {
        let e = placement(0, &[0, 0, 0], &[5, 5, 6])
            .choose(false)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unsupported);
        assert!(e.to_string().contains("2 processes for 3 ranks"), "{e}");
        // All in one process but forced onto the network: refused, not run wrongly.
        assert!(placement(0, &[0, 0], &[5, 5]).choose(true).is_err());
    }
}
