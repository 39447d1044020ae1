//! Which network transport a communicator uses: RDMA when every rank has a usable port (and
//! the configuration allows it), else TCP over the job's rails.

use super::*;

/// Identifies this host: the kernel's boot id, or the hostname where that is unreadable.
/// RDMA when every rank has a usable port (and config allows it), else TCP. Ranks agree over
/// the bootstrap, so a job never mixes transports.
pub(super) fn choose_transport(
    cfg: &Config,
    id: &UniqueId,
    rank: usize,
    (local_rank, local_ranks): (usize, usize),
    iface: &netif::Iface,
    bootstrap: &mut Bootstrap,
) -> Result<(Arc<dyn NetTransport>, String)> {
    let mut rdma = None;
    let mut why = String::from("RAILCC_TRANSPORT=tcp");
    let tuning = RdmaTuning {
        timeout: cfg.ib_timeout,
        retry_cnt: cfg.ib_retry_cnt,
        eager_bytes: cfg.ib_eager_bytes,
        qps_per_conn: cfg.ib_qps_per_conn,
        failover: cfg.rail_failover != 0,
        traffic_class: cfg.ib_tc,
        service_level: cfg.ib_sl,
    };
    // A port list that names no port here is a mistake, not a wish for TCP: every rank fails,
    // naming the ports found (NCCL_IB_HCA feeds RAILCC_IB_HCA).
    let found = match cfg.transport.as_str() {
        "tcp" => Vec::new(),
        _ => railcc_transport_rdma::device::list(),
    };
    let mut unmatched = match cfg.transport.as_str() {
        "tcp" => None,
        _ => railcc_transport_rdma::device::no_match(&found, &cfg.ib_hca),
    };
    if cfg.transport != "tcp" && unmatched.is_none() {
        let mut ports = crate::rails::rdma_rails(cfg, &found, local_rank, local_ranks);
        // NCCL_IB_GID_INDEX: a GID index that names no GID is an error like a port list
        // that names no port.
        if let Ok(index) = u8::try_from(cfg.ib_gid_index) {
            let set = ports
                .iter_mut()
                .filter(|p| p.link_layer == "Ethernet")
                .try_for_each(|p| railcc_transport_rdma::device::set_gid_index(p, index));
            if let Err(e) = set {
                unmatched = Some(e);
            }
        }
        if unmatched.is_some() {
            why = "the RDMA port settings select no port".into();
        } else if ports.is_empty() {
            why = "no active RDMA port".into();
        } else {
            match RdmaTransport::open(&ports, iface.ip, id.secret, rank, tuning) {
                Ok(t) => rdma = Some(t),
                Err(e) => {
                    let names: Vec<String> = ports
                        .iter()
                        .map(|p| format!("{}:{}", p.device, p.port))
                        .collect();
                    why = format!("{} unusable: {e}", names.join(","));
                }
            }
        }
    }
    let mine = [if unmatched.is_some() {
        2
    } else {
        u8::from(rdma.is_some())
    }];
    let all = bootstrap.all_gather(&mine)?;
    let unmatched_on: Vec<usize> = (0..all.len()).filter(|&r| all[r] == [2]).collect();
    if !unmatched_on.is_empty() {
        let here = unmatched.map_or(String::new(), |w| format!(" (here: {w})"));
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "RAILCC_IB_HCA/NCCL_IB_HCA={:?} or the GID index ({}) selects no RDMA port on rank(s) {unmatched_on:?}{here}",
                cfg.ib_hca, cfg.ib_gid_index
            ),
        )
        .rank(rank)
        .transport(railcc_transport_rdma::NAME));
    }
    let without: Vec<usize> = (0..all.len()).filter(|&r| all[r] != [1]).collect();
    if let (Some(t), true) = (rdma, without.is_empty()) {
        let desc = format!("rdma {}", t.describe());
        tracing::info!("rank {rank}: transport {desc}");
        return Ok((Arc::new(t), desc));
    }
    if cfg.transport == "rdma" {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "RAILCC_TRANSPORT=rdma, but rank(s) {without:?} have no usable RDMA port{}",
                if without.contains(&rank) {
                    format!(" (here: {why})")
                } else {
                    String::new()
                }
            ),
        )
        .transport(railcc_transport_rdma::NAME));
    }
    if cfg.transport == "auto" && rank == 0 {
        let here = if without.contains(&0) {
            format!(" (rank 0: {why})")
        } else {
            String::new()
        };
        tracing::info!(
            "transport TCP over {}: no usable RDMA port on rank(s) {without:?}{here}",
            iface.name
        );
    } else if without.contains(&rank) {
        tracing::debug!("rank {rank}: no RDMA: {why}");
    }
    let rails = crate::rails::tcp_rails(cfg, iface).map_err(|e| e.rank(rank))?;
    let mut settings = TcpSettings::from_config(cfg);
    settings.measure_rails = !crate::rails::declared(cfg);
    let desc = format!(
        "tcp over {}{}",
        crate::rails::describe(&rails),
        if rails.len() > 1 && settings.measure_rails {
            ", split by measured rates"
        } else {
            ""
        }
    );
    let t = TcpTransport::with_rails(rails, id.secret, settings);
    Ok((Arc::new(t), desc))
}
