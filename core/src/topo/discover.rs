//! Discovery from sysfs: NICs (/sys/class/net), RDMA devices (/sys/class/infiniband), NUMA
//! nodes (/sys/devices/system/node). GPUs need CUDA, so the caller adds them.

use super::{Nic, NumaNode, Place, RdmaDev, RdmaPort, Topology};
use crate::error::Result;
use std::path::Path;

fn read(p: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

fn names(dir: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Where the device behind `dev_link` (a sysfs `device` link) sits.
pub fn place_of(dev_link: &str) -> Place {
    let Ok(real) = std::fs::canonicalize(dev_link) else {
        return Place::default();
    };
    let real = real.display().to_string();
    // The PCI function itself may be a parent (virtio: .../0000:00:03.0/virtio2).
    let pci_path = super::path::pci_chain(&real)
        .map(|(host, funcs)| format!("/sys/devices/{host}/{}", funcs.join("/")));
    let numa = pci_path.as_ref().and_then(|p| {
        read(format!("{p}/numa_node"))
            .and_then(|s| s.parse::<i32>().ok())
            .filter(|n| *n >= 0)
    });
    Place { pci_path, numa }
}

/// The place of a PCI device given its bus id (`0000:18:00.0`, any domain width).
pub fn place_of_pci(bus_id: &str) -> Place {
    let lower = bus_id.to_ascii_lowercase();
    let id = match lower.split_once(':') {
        Some((dom, rest)) if dom.len() > 4 => format!("{}:{rest}", &dom[dom.len() - 4..]),
        _ => lower,
    };
    place_of(&format!("/sys/bus/pci/devices/{id}"))
}

pub fn discover() -> Result<Topology> {
    let mut t = Topology {
        source: "discovered".into(),
        ..Topology::default()
    };
    for n in names("/sys/devices/system/node") {
        if let Some(id) = n.strip_prefix("node").and_then(|x| x.parse::<i32>().ok()) {
            let cpus = read(format!("/sys/devices/system/node/{n}/cpulist")).unwrap_or_default();
            t.numa.push(NumaNode { id, cpus });
        }
    }
    let addrs = crate::netif::list().unwrap_or_default();
    for name in names("/sys/class/net") {
        let base = format!("/sys/class/net/{name}");
        let up = read(format!("{base}/operstate")).is_some_and(|s| s == "up" || s == "unknown")
            && read(format!("{base}/flags"))
                .and_then(|f| u32::from_str_radix(f.trim_start_matches("0x"), 16).ok())
                .is_some_and(|f| f & libc::IFF_UP as u32 != 0);
        let speed_mbps = read(format!("{base}/speed"))
            .and_then(|s| s.parse::<i64>().ok())
            .filter(|s| *s > 0)
            .map(|s| s as u64);
        t.nics.push(Nic {
            addrs: addrs
                .iter()
                .filter(|a| a.name == name)
                .map(|a| a.ip.to_string())
                .collect(),
            place: place_of(&format!("{base}/device")),
            name,
            speed_mbps,
            up,
        });
    }
    for name in names("/sys/class/infiniband") {
        let base = format!("/sys/class/infiniband/{name}");
        let mut ports = Vec::new();
        for p in names(&format!("{base}/ports")) {
            let pb = format!("{base}/ports/{p}");
            // "100 Gb/sec (4X EDR)" → 100.
            let rate_gbps = read(format!("{pb}/rate"))
                .and_then(|r| r.split_whitespace().next().and_then(|x| x.parse().ok()))
                .unwrap_or(0.0);
            ports.push(RdmaPort {
                port: p.parse().unwrap_or(0),
                // "4: ACTIVE" → "ACTIVE".
                state: read(format!("{pb}/state"))
                    .map(|s| s.rsplit(' ').next().unwrap_or("").to_string())
                    .unwrap_or_default(),
                rate_gbps,
                link_layer: read(format!("{pb}/link_layer")).unwrap_or_default(),
            });
        }
        let netdev = names(&format!("{base}/device/net"))
            .into_iter()
            .next()
            .or_else(|| {
                // Soft-RoCE has no device link; its parent netdev is in `parent`.
                read(format!("{base}/parent"))
            });
        t.rdma.push(RdmaDev {
            place: place_of(&format!("{base}/device")),
            name,
            ports,
            netdev,
        });
    }
    Ok(t)
}
