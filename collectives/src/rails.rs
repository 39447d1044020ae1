//! Which interfaces a TCP connection stripes over (`RAILCC_RAILS`), and with what weights;
//! which RDMA ports an RDMA connection stripes over ([`rdma_rails`]).
//!
//! - empty: as NCCL, what `auto` finds when those are PCI NICs and the job's interface (the
//!   route to the bootstrap root) is one of the machine's NICs; otherwise (loopback, bridges,
//!   veth), or when `RAILCC_SOCKET_IFNAME` names the interface, that one interface;
//! - `auto`: the NICs the topology puts nearest this rank ([`railcc_core::topo`]): nearest its
//!   GPU when it has one (`RAILCC_GPU_ORDINAL`, set by the GPU paths), else its NUMA node;
//! - `eth0:800,eth1:400`: these interfaces, weighted by the bandwidth given in Mb/s, else by
//!   the link speed the kernel reports, else equally.
//!
//! Unless every rail's bandwidth is declared, a connection over several rails measures what
//! each stream delivers and splits by that (transport-tcp's meter.rs); the weights above are
//! only where it starts.
//!
//! Rail i of one rank connects to rail i of another, so nodes list their rails in the same
//! order (`auto` sorts by name).

use railcc_core::netif::{self, Iface};
use railcc_core::topo::Topology;
use railcc_core::{Config, Error, Result};
use railcc_transport_rdma::device::RdmaPort;
use railcc_transport_tcp::TcpRail;

/// Weight of a rail whose bandwidth nobody declared and the kernel does not report.
const UNKNOWN_MBPS: u32 = 1000;

/// Whether `RAILCC_RAILS` gives every rail's bandwidth (`eth0:800,eth1:400`): then those
/// weights hold and nothing is measured.
pub fn declared(cfg: &Config) -> bool {
    let spec = cfg.rails.trim();
    !spec.is_empty() && spec != "auto" && spec.split(',').all(|i| i.contains(':'))
}

/// Rails wanted by name, with the bandwidth declared for each (Mb/s), if any.
type Wanted = Vec<(String, Option<u32>)>;

pub fn tcp_rails(cfg: &Config, iface: &Iface) -> Result<Vec<TcpRail>> {
    let spec = cfg.rails.trim();
    // The nearest NICs, and whether they are all PCI devices with the job's interface one of
    // the topology's NICs (the default takes them only then).
    let nearest = || -> Result<(Wanted, bool)> {
        let topo = Topology::load(&cfg.topo_file, gpus_for(cfg), Vec::new())?;
        // The rank's GPU, when it has one the topology knows: the NICs nearest it.
        let gpu = usize::try_from(cfg.gpu_ordinal)
            .ok()
            .and_then(|o| topo.gpus.iter().position(|g| g.ordinal == o));
        let on_nic = topo
            .usable_nics()
            .iter()
            .any(|&i| topo.nics[i].name == iface.name);
        let rails = topo.rails(gpu, my_numa_node(&topo), &[]);
        // Bridges, container and tunnel interfaces (no PCI device) never join by default:
        // a peer's docker0 has our docker0's address.
        let physical = rails
            .iter()
            .all(|r| topo.nics[r.nic].place.pci_path.is_some());
        let rails = rails.into_iter().map(|r| (r.name, None)).collect();
        Ok((rails, on_nic && physical))
    };
    if spec.is_empty() {
        let one = vec![TcpRail {
            name: iface.name.clone(),
            ip: iface.ip,
            weight: 1,
        }];
        if !cfg.socket_ifname.trim().is_empty() {
            return Ok(one);
        }
        // Several NICs, or the one nearest this rank's GPU, when the job runs on a NIC and
        // they are PCI devices; a topology that cannot be read, a job on loopback or virtual
        // interfaces keep to the job's one interface.
        return match nearest() {
            Ok((all, true)) if all.len() > 1 || all.iter().any(|(n, _)| *n != iface.name) => {
                let rails = with_addresses(all, iface)?;
                tracing::info!(
                    "tcp rails: the NICs nearest this rank: {}",
                    describe(&rails)
                );
                Ok(rails)
            }
            _ => Ok(one),
        };
    }
    let wanted: Wanted = if spec == "auto" {
        nearest()?.0
    } else {
        spec.split(',')
            .map(|item| {
                let (name, mbps) = match item.split_once(':') {
                    Some((n, w)) => (n, Some(w)),
                    None => (item, None),
                };
                let mbps = mbps
                    .map(|w| {
                        w.parse::<u32>().ok().filter(|v| *v > 0).ok_or_else(|| {
                            Error::invalid(format!(
                                "RAILCC_RAILS: '{item}': the bandwidth after ':' must be a positive number of Mb/s"
                            ))
                        })
                    })
                    .transpose()?;
                Ok((name.trim().to_string(), mbps))
            })
            .collect::<Result<_>>()?
    };
    if wanted.is_empty() {
        return Err(Error::invalid(format!(
            "RAILCC_RAILS={spec}: no interface to use"
        )));
    }
    with_addresses(wanted, iface)
}

/// The rails `wanted` (name, declared Mb/s) with their addresses and starting weights.
fn with_addresses(wanted: Wanted, iface: &Iface) -> Result<Vec<TcpRail>> {
    let all = netif::list()?;
    wanted
        .into_iter()
        .map(|(name, mbps)| {
            // The address of the bootstrap's family, so rails of all ranks can reach each other.
            let ip = all
                .iter()
                .find(|i| i.name == name && i.ip.is_ipv4() == iface.ip.is_ipv4())
                .map(|i| i.ip)
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "RAILCC_RAILS: interface '{name}' is not up with an {} address",
                        if iface.ip.is_ipv4() { "IPv4" } else { "IPv6" }
                    ))
                })?;
            let detected = std::fs::read_to_string(format!("/sys/class/net/{name}/speed"))
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
                .filter(|s| *s > 0)
                .map(|s| s.min(u32::MAX as i64) as u32);
            Ok(TcpRail {
                weight: mbps.or(detected).unwrap_or(UNKNOWN_MBPS),
                name,
                ip,
            })
        })
        .collect()
}

/// The machine's GPUs for the topology, when this rank has one and no topology file says
/// what the machine is (no driver: none, and rails fall back to the NUMA node's NICs).
/// The RDMA ports (rails) this rank stripes its connections over, from the active ports that
/// `RAILCC_IB_HCA` matches: `RAILCC_IB_RAILS` of them, or by default (0) an equal share, the
/// ports over the ranks of this host (at least 1, at most 4), so one rank per host uses them
/// all, as NCCL does, and eight ranks on eight ports one each.
///
/// Which ones: with a GPU the topology knows (`RAILCC_GPU_ORDINAL`, which the GPU network
/// engine sets for its channels) and ports it places, the ports nearest that GPU, so each
/// GPU's traffic leaves through its own NIC (rail i meets rail i on a rail-optimised cluster);
/// several equally near share out by local rank. Otherwise local rank l takes ports l*n ..
/// l*n+n-1 in name order.
/// `found`: the machine's ports (`railcc_transport_rdma::device::list`).
pub fn rdma_rails(
    cfg: &Config,
    found: &[RdmaPort],
    local_rank: usize,
    local_ranks: usize,
) -> Vec<RdmaPort> {
    let ports = railcc_transport_rdma::device::select(found, &cfg.ib_hca);
    if ports.is_empty() {
        return ports;
    }
    let n = match cfg.ib_rails {
        0 => (ports.len() / local_ranks.max(1)).max(1),
        n => n,
    }
    .min(ports.len())
    .min(railcc_transport_rdma::comm::MAX_RAILS);
    match nearest_gpu_ports(cfg, &ports) {
        Some(order) => {
            let best = order[0].1;
            let tied: Vec<RdmaPort> = order
                .iter()
                .filter(|o| o.1 == best)
                .map(|o| o.0.clone())
                .collect();
            let chosen: Vec<RdmaPort> = if tied.len() >= n {
                railcc_transport_rdma::share(&tied, local_rank, n)
            } else {
                order.iter().take(n).map(|o| o.0.clone()).collect()
            };
            tracing::info!(
                "rdma rails: GPU {} is {best:?} from {}",
                cfg.gpu_ordinal,
                chosen
                    .iter()
                    .map(|p| format!("{}:{}", p.device, p.port))
                    .collect::<Vec<_>>()
                    .join(",")
            );
            chosen
        }
        None => railcc_transport_rdma::share(&ports, local_rank, n),
    }
}

/// `ports` by path class from this rank's GPU, nearest first (name order among equals), when
/// the topology knows the GPU and places every port's device; else None.
fn nearest_gpu_ports(
    cfg: &Config,
    ports: &[RdmaPort],
) -> Option<Vec<(RdmaPort, railcc_core::topo::PathClass)>> {
    let o = usize::try_from(cfg.gpu_ordinal).ok()?;
    let topo = Topology::load(&cfg.topo_file, gpus_for(cfg), Vec::new()).ok()?;
    let gpu = topo.gpus.iter().find(|g| g.ordinal == o)?;
    let mut order = ports
        .iter()
        .map(|p| {
            let dev = topo.rdma.iter().find(|d| d.name == p.device)?;
            Some((p.clone(), topo.place_class(&gpu.place, &dev.place)))
        })
        .collect::<Option<Vec<_>>>()?;
    order.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.device.cmp(&b.0.device)));
    Some(order)
}

fn gpus_for(cfg: &Config) -> Vec<railcc_core::topo::Gpu> {
    if cfg.gpu_ordinal < 0 || !cfg.topo_file.is_empty() {
        return Vec::new();
    }
    railcc_cuda::driver::devices()
        .map(|found| {
            found
                .iter()
                .map(|g| railcc_core::topo::Gpu {
                    ordinal: g.ordinal,
                    name: g.name.clone(),
                    pci_bus_id: g.pci_bus_id.clone(),
                    place: railcc_core::topo::discover::place_of_pci(&g.pci_bus_id),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The NUMA node of the CPU this thread runs on (bind ranks to keep it stable).
fn my_numa_node(topo: &Topology) -> Option<i32> {
    // SAFETY: sched_getcpu has no arguments and only returns a number.
    let cpu = unsafe { libc::sched_getcpu() };
    if cpu < 0 {
        return None;
    }
    let cpu = cpu as u32;
    topo.numa
        .iter()
        .find(|n| in_cpulist(&n.cpus, cpu))
        .map(|n| n.id)
}

/// Whether `cpu` is in a sysfs CPU list such as `0-15,32-47`.
fn in_cpulist(list: &str, cpu: u32) -> bool {
    list.split(',').any(|r| {
        let mut ends = r.trim().splitn(2, '-').map(|x| x.parse::<u32>().ok());
        match (ends.next().flatten(), ends.next()) {
            (Some(a), None) => a == cpu,
            (Some(a), Some(Some(b))) => (a..=b).contains(&cpu),
            _ => false,
        }
    })
}

/// `v0(800 Mb/s) v1(400 Mb/s)`, for logs and the bench header.
pub fn describe(rails: &[TcpRail]) -> String {
    if rails.len() == 1 {
        return rails[0].name.clone();
    }
    rails
        .iter()
        .map(|r| format!("{}({} Mb/s)", r.name, r.weight))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_lists_parse_as_sysfs_writes_them() {
        assert!(super::in_cpulist("0-15,32-47", 40));
        assert!(super::in_cpulist("3", 3));
        assert!(!super::in_cpulist("0-15,32-47", 20));
        assert!(!super::in_cpulist("", 0));
    }
}
