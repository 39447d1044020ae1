//! Joining a job: from a unique id, from launcher variables, and the setup they share
//! (interface, bootstrap, host grouping, transport, connections).

use super::transport::choose_transport;
use super::*;

impl Communicator {
    /// Joins the job described by `id` as `rank` of `nranks`.
    pub fn init(cfg: Config, id: &UniqueId, rank: usize, nranks: usize) -> Result<Communicator> {
        Communicator::init_inner(cfg, id, rank, nranks, None)
    }

    /// Joins the job described by launcher variables (torchrun, Open MPI, Slurm, PMI, or
    /// `RAILCC_RANK`/`RAILCC_NRANKS`). Rank 0 serves the rendezvous unless a unique id was given.
    pub fn from_env(cfg: Config) -> Result<Communicator> {
        let info = railcc_core::config::launch_from_env()?.ok_or_else(|| {
            Error::invalid("no launcher variables found (RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, SLURM_*, PMI_*, or RAILCC_RANK/RAILCC_NRANKS)")
        })?;
        Communicator::from_launch(cfg, &info, !info.id_given)
    }

    /// Joins the job `info` describes; rank 0 serves the rendezvous when `serve_root` is set
    /// (that is, when no separate process created the unique id).
    pub fn from_launch(
        cfg: Config,
        info: &launch::LaunchInfo,
        serve_root: bool,
    ) -> Result<Communicator> {
        if info.weak_secret {
            tracing::warn!("no RAILCC_UNIQUE_ID or RAILCC_SECRET: the job secret is derived from job ids, which anyone who sees the environment knows");
        }
        let root = if info.rank == 0 && serve_root {
            let bind = SocketAddr::new(unspecified_like(info.id.root.ip()), info.id.root.port());
            Some(RootServer::start_with_secret(
                bind,
                info.id.secret,
                cfg.timeout(),
            )?)
        } else {
            None
        };
        Communicator::init_inner(cfg, &info.id, info.rank, info.nranks, root)
    }

    fn init_inner(
        cfg: Config,
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        root: Option<RootServer>,
    ) -> Result<Communicator> {
        cfg.validate()?;
        let ctx = |e: Error| e.rank(rank).op("init");
        let ifaces = netif::list().map_err(ctx)?;
        let iface = netif::choose(&ifaces, &cfg.socket_ifname, Some(id.root.ip())).map_err(ctx)?;
        let mut bootstrap = Bootstrap::init(id, rank, nranks, iface.ip, cfg.timeout())?;
        // Ranks on the same host (same boot id), and this rank's place among them.
        let host = host_id(&cfg);
        let hosts = bootstrap.all_gather(host.as_bytes())?;
        let local_rank = hosts[..rank]
            .iter()
            .filter(|h| h.as_slice() == host.as_bytes())
            .count();
        let local_ranks = hosts
            .iter()
            .filter(|h| h.as_slice() == host.as_bytes())
            .count();
        let (transport, transport_desc) = choose_transport(
            &cfg,
            id,
            rank,
            (local_rank, local_ranks),
            &iface,
            &mut bootstrap,
        )
        .map_err(ctx)?;
        let listener = transport.listen(0).map_err(ctx)?;
        let handles = bootstrap.all_gather(&listener.handle().0)?;
        let handles = handles
            .into_iter()
            .map(railcc_core::net::ConnectHandle)
            .collect();
        let conns = Connections::new(rank, nranks, transport, listener, handles).map_err(ctx)?;
        // When ranks on this host outnumber the cores, waiting ranks sleep in poll(2) at once
        // instead of spinning, so the rank with work gets the core.
        let cores = host_cores();
        let spin = if local_ranks > cores {
            Duration::ZERO
        } else {
            Duration::from_micros(cfg.spin_us)
        };
        // Ranks per host, counted once (a job may have thousands of ranks).
        let mut per_host: HashMap<&[u8], usize> = HashMap::new();
        for h in &hosts {
            *per_host.entry(h.as_slice()).or_default() += 1;
        }
        bootstrap.barrier()?;
        tracing::debug!(
            "rank {rank}/{nranks} ready on {} ({})",
            iface.name,
            iface.ip
        );
        Ok(Communicator {
            rank,
            nranks,
            iface: iface.name,
            iface_ip: iface.ip,
            transport_desc,
            cfg,
            state: Mutex::new(State {
                conns,
                plans: HashMap::new(),
                ws: Workspace::default(),
                bootstrap,
                op_seq: 0,
                scratch: Vec::new(),
                scratch_region: None,
                regions: Regions::default(),
                broken: None,
            }),
            abort: Arc::new(AtomicBool::new(false)),
            abort_why: parking_lot::Mutex::new(None),
            spin,
            local_ranks,
            ring_order: host_order(&hosts),
            nodes: per_host.len(),
            per_host: per_host
                .values()
                .all(|&n| n == local_ranks)
                .then_some(local_ranks),
            algo_cache: Mutex::new(HashMap::new()),
            _root: root,
        })
    }
}
/// Identifies this host: `RAILCC_HOSTID`, else, as NCCL's host hash, the hostname and the
/// kernel's boot id. Containers of one machine share the boot id but, as a rule, not the IPC
/// and /dev/shm that peer access needs: their hostnames tell them apart.
pub(crate) fn host_id(cfg: &Config) -> String {
    if !cfg.hostid.is_empty() {
        return cfg.hostid.clone();
    }
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    format!("{}/{}", railcc_core::netif::hostname(), boot.trim())
}

/// Identifies this process on its host: its pid and its pid namespace (containers on one
/// host reuse pids, the first process of each is pid 1).
pub(crate) fn process_id() -> Vec<u8> {
    let ns = std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    [&std::process::id().to_le_bytes()[..], ns.as_bytes()].concat()
}

#[cfg(test)]
mod tests {
    use super::{host_id, process_id};
    use railcc_core::Config;

    #[test]
    fn the_host_is_the_hostname_and_boot_id_unless_given() {
        let mut cfg = Config::default();
        let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string());
        if let (Ok(name), Ok(boot)) = (
            read("/proc/sys/kernel/hostname"),
            read("/proc/sys/kernel/random/boot_id"),
        ) {
            assert_eq!(host_id(&cfg), format!("{name}/{boot}"));
        }
        cfg.hostid = "node7".into();
        assert_eq!(host_id(&cfg), "node7");
        // The pid first (4 bytes), then the pid namespace where /proc shows it.
        let me = process_id();
        assert_eq!(me[..4], std::process::id().to_le_bytes());
        if let Ok(ns) = std::fs::read_link("/proc/self/ns/pid") {
            assert_eq!(&me[4..], ns.to_string_lossy().as_bytes());
            assert!(ns.to_string_lossy().starts_with("pid:["), "{ns:?}");
        }
    }
}
