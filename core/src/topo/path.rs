//! Path classes between two devices, in `nvidia-smi topo -m` terms, from their PCI positions.
//!
//! A device's position is its sysfs path, `/sys/devices/pci0000:00/0000:00:01.0/0000:03:00.0`:
//! the host bridge (`pci0000:00`), then the PCI functions from the root port down to the
//! device. Everything between the host bridge and the device is a bridge.

use serde::{Deserialize, Serialize};

/// How two devices reach each other, best first (the order NCCL and nvidia-smi use).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PathClass {
    /// The same device (a NIC and its RDMA function, a GPU with itself).
    #[serde(rename = "X")]
    Same,
    /// NVLink, with this many links.
    #[serde(rename = "NV")]
    NvLink(u32),
    /// At most one PCIe bridge on each side (the same switch).
    #[serde(rename = "PIX")]
    Pix,
    /// Several PCIe bridges, without crossing the host bridge.
    #[serde(rename = "PXB")]
    Pxb,
    /// Through a PCIe host bridge (the same root complex).
    #[serde(rename = "PHB")]
    Phb,
    /// Between host bridges within one NUMA node.
    #[serde(rename = "NODE")]
    Node,
    /// Across NUMA nodes (the SMP interconnect).
    #[serde(rename = "SYS")]
    Sys,
}

impl std::fmt::Display for PathClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PathClass::Same => write!(f, "X"),
            PathClass::NvLink(n) => write!(f, "NV{n}"),
            PathClass::Pix => write!(f, "PIX"),
            PathClass::Pxb => write!(f, "PXB"),
            PathClass::Phb => write!(f, "PHB"),
            PathClass::Node => write!(f, "NODE"),
            PathClass::Sys => write!(f, "SYS"),
        }
    }
}

/// `0000:03:00.0` (or `00000000:03:00.0`): a PCI function address.
pub fn is_pci_addr(s: &str) -> bool {
    let mut it = s.split(':');
    let (Some(d), Some(b), Some(df), None) = (it.next(), it.next(), it.next(), it.next()) else {
        return false;
    };
    let hex = |x: &str| !x.is_empty() && x.chars().all(|c| c.is_ascii_hexdigit());
    let Some((dev, func)) = df.split_once('.') else {
        return false;
    };
    hex(d) && hex(b) && hex(dev) && hex(func)
}

/// The host bridge and the PCI functions below it, for a sysfs device path; None when the
/// device is not on PCI (virtual devices, veth, loopback).
pub fn pci_chain(sysfs_path: &str) -> Option<(String, Vec<String>)> {
    let mut parts = sysfs_path.split('/').filter(|p| !p.is_empty());
    let host = parts.find(|p| p.starts_with("pci") && p.contains(':'))?;
    let funcs: Vec<String> = parts
        .take_while(|p| is_pci_addr(p))
        .map(|p| p.to_ascii_lowercase())
        .collect();
    (!funcs.is_empty()).then(|| (host.to_string(), funcs))
}

/// The class of the PCI path between two devices given their chains and NUMA nodes.
pub fn pci_class(
    a: &(String, Vec<String>),
    b: &(String, Vec<String>),
    numa_a: Option<i32>,
    numa_b: Option<i32>,
) -> PathClass {
    if a.0 != b.0 {
        return if numa_a.is_some() && numa_a == numa_b {
            PathClass::Node
        } else if numa_a.is_none() || numa_b.is_none() {
            // Unknown NUMA placement (one-node machines report -1): one node.
            PathClass::Node
        } else {
            PathClass::Sys
        };
    }
    // Functions of one device (same bus, same slot) are the same device.
    let slot = |f: &str| f.rsplit_once('.').map(|(s, _)| s.to_string());
    if let (Some(x), Some(y)) = (a.1.last(), b.1.last()) {
        if slot(x) == slot(y) {
            return PathClass::Same;
        }
    }
    // Bridges are every function but the device itself.
    let (ba, bb) = (&a.1[..a.1.len() - 1], &b.1[..b.1.len() - 1]);
    let common = ba.iter().zip(bb).take_while(|(x, y)| x == y).count();
    if common == 0 {
        return PathClass::Phb;
    }
    if ba.len() - common <= 1 && bb.len() - common <= 1 {
        PathClass::Pix
    } else {
        PathClass::Pxb
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(p: &str) -> (String, Vec<String>) {
        pci_chain(p).unwrap_or_default()
    }

    #[test]
    fn classes_follow_the_pci_tree() {
        let gpu =
            chain("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0");
        let nic_same_switch =
            chain("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:04.0/0000:04:00.0");
        let nic_deeper = chain(
            "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:05:00.0/0000:06:00.0/0000:07:00.1",
        );
        let nic_other_port = chain("/sys/devices/pci0000:00/0000:00:02.0/0000:08:00.0");
        let nic_other_root = chain("/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0");
        assert_eq!(
            pci_class(&gpu, &nic_same_switch, Some(0), Some(0)),
            PathClass::Pix
        );
        assert_eq!(
            pci_class(&gpu, &nic_deeper, Some(0), Some(0)),
            PathClass::Pxb
        );
        assert_eq!(
            pci_class(&gpu, &nic_other_port, Some(0), Some(0)),
            PathClass::Phb
        );
        assert_eq!(
            pci_class(&gpu, &nic_other_root, Some(0), Some(0)),
            PathClass::Node
        );
        assert_eq!(
            pci_class(&gpu, &nic_other_root, Some(0), Some(1)),
            PathClass::Sys
        );
        let port1 = chain("/sys/devices/pci0000:00/0000:00:02.0/0000:08:00.1");
        assert_eq!(
            pci_class(&nic_other_port, &port1, Some(0), Some(0)),
            PathClass::Same
        );
    }

    #[test]
    fn virtual_devices_have_no_chain() {
        assert_eq!(pci_chain("/sys/devices/virtual/net/veth0"), None);
        assert!(pci_chain("/sys/devices/pci0000:00/0000:00:03.0/virtio2").is_some());
        assert!(is_pci_addr("00000000:18:00.0") && !is_pci_addr("virtio2"));
    }

    #[test]
    fn classes_order_best_first() {
        assert!(PathClass::NvLink(18) < PathClass::Pix && PathClass::Pix < PathClass::Sys);
        assert_eq!(PathClass::NvLink(18).to_string(), "NV18");
    }
}
