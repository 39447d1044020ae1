//! The machine's topology: CPUs and NUMA nodes, NICs, RDMA devices and GPUs, the path class
//! between every GPU pair and GPU–NIC pair, and which NICs (rails) each rank uses.
//!
//! It comes from discovery ([`discover`]: sysfs, plus GPUs from the caller, who has CUDA) or
//! from a file (`RAILCC_TOPO_FILE`, the JSON that `railcc topo --json` prints), so that a
//! test can describe a box it does not have.

pub mod discover;
pub mod path;

use crate::error::{Error, Result};
pub use path::PathClass;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    /// "discovered" or the file it was read from.
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub numa: Vec<NumaNode>,
    #[serde(default)]
    pub nics: Vec<Nic>,
    #[serde(default)]
    pub rdma: Vec<RdmaDev>,
    #[serde(default)]
    pub gpus: Vec<Gpu>,
    /// NVLink counts between GPU pairs (by index in `gpus`), for pairs that have any.
    #[serde(default)]
    pub nvlinks: Vec<NvLinks>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NumaNode {
    pub id: i32,
    /// As in /sys (`0-15,32-47`).
    pub cpus: String,
}

/// Where a device sits: its sysfs path (PCI chain) and NUMA node, when known.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Place {
    #[serde(default)]
    pub pci_path: Option<String>,
    #[serde(default)]
    pub numa: Option<i32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Nic {
    pub name: String,
    /// Link speed; None when the driver does not say (veth, virtio).
    #[serde(default)]
    pub speed_mbps: Option<u64>,
    pub up: bool,
    #[serde(default)]
    pub addrs: Vec<String>,
    #[serde(default)]
    pub place: Place,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RdmaPort {
    pub port: u8,
    pub state: String,
    pub rate_gbps: f64,
    pub link_layer: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RdmaDev {
    pub name: String,
    pub ports: Vec<RdmaPort>,
    /// The Ethernet interface of a RoCE device.
    #[serde(default)]
    pub netdev: Option<String>,
    #[serde(default)]
    pub place: Place,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    pub ordinal: usize,
    pub name: String,
    pub pci_bus_id: String,
    #[serde(default)]
    pub place: Place,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NvLinks {
    pub a: usize,
    pub b: usize,
    pub links: u32,
}

/// One NIC a rank uses, with the path class from the rank's GPU (or NUMA node) to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rail {
    /// Index into `Topology::nics`.
    pub nic: usize,
    pub name: String,
    pub path: PathClass,
    /// Bandwidth to weigh striping by (declared or detected), if known.
    pub speed_mbps: Option<u64>,
}

impl Topology {
    /// Reads a topology file (the JSON of `railcc topo --json`).
    pub fn from_file(path: &str) -> Result<Topology> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("RAILCC_TOPO_FILE {path}"), &e))?;
        let bad = |e: serde_json::Error| Error::invalid(format!("RAILCC_TOPO_FILE {path}: {e}"));
        let mut v: serde_json::Value = serde_json::from_str(&text).map_err(bad)?;
        // `railcc topo --json` wraps the topology beside the rail plan; take either form.
        if let Some(inner) = v.get_mut("topology") {
            v = inner.take();
        }
        let mut t: Topology = serde_json::from_value(v).map_err(bad)?;
        t.source = path.to_string();
        t.validate()?;
        Ok(t)
    }

    /// `RAILCC_TOPO_FILE` when set, else discovery with the GPUs the caller found.
    pub fn load(topo_file: &str, gpus: Vec<Gpu>, nvlinks: Vec<NvLinks>) -> Result<Topology> {
        if !topo_file.is_empty() {
            return Topology::from_file(topo_file);
        }
        let mut t = discover::discover()?;
        t.gpus = gpus;
        t.nvlinks = nvlinks;
        Ok(t)
    }

    fn validate(&self) -> Result<()> {
        for l in &self.nvlinks {
            if l.a >= self.gpus.len() || l.b >= self.gpus.len() || l.a == l.b {
                return Err(Error::invalid(format!(
                    "topology: nvlinks entry {}-{} does not name two of the {} GPUs",
                    l.a,
                    l.b,
                    self.gpus.len()
                )));
            }
        }
        Ok(())
    }

    fn chain(p: &Place) -> Option<(String, Vec<String>)> {
        p.pci_path.as_deref().and_then(path::pci_chain)
    }

    /// The path between two devices given their places.
    pub fn place_class(&self, a: &Place, b: &Place) -> PathClass {
        Self::class_of(a, b)
    }

    fn class_of(a: &Place, b: &Place) -> PathClass {
        match (Self::chain(a), Self::chain(b)) {
            (Some(x), Some(y)) => path::pci_class(&x, &y, a.numa, b.numa),
            // A device off PCI (virtual NIC) is reached through the CPU: the same node when
            // both nodes are known and equal, or unknown.
            _ => match (a.numa, b.numa) {
                (Some(x), Some(y)) if x != y => PathClass::Sys,
                _ => PathClass::Node,
            },
        }
    }

    /// The path between GPUs `a` and `b`.
    pub fn gpu_gpu(&self, a: usize, b: usize) -> PathClass {
        if a == b {
            return PathClass::Same;
        }
        if let Some(l) = self
            .nvlinks
            .iter()
            .find(|l| (l.a, l.b) == (a, b) || (l.a, l.b) == (b, a))
        {
            return PathClass::NvLink(l.links);
        }
        Self::class_of(&self.gpus[a].place, &self.gpus[b].place)
    }

    /// The path between GPU `g` and NIC `n`.
    pub fn gpu_nic(&self, g: usize, n: usize) -> PathClass {
        Self::class_of(&self.gpus[g].place, &self.nics[n].place)
    }

    /// NICs a rank may use for inter-node traffic: up, with an address, not loopback.
    pub fn usable_nics(&self) -> Vec<usize> {
        (0..self.nics.len())
            .filter(|&i| {
                let n = &self.nics[i];
                n.up && !n.addrs.is_empty() && n.name != "lo"
            })
            .collect()
    }

    /// The rails of a rank on GPU `gpu` (or a CPU rank on NUMA node `numa`): every usable NIC
    /// at the best path class there is from it, in name order so that rail i on one node
    /// meets rail i on another. `allowed` (names, when non-empty) limits the choice first.
    pub fn rails(&self, gpu: Option<usize>, numa: Option<i32>, allowed: &[String]) -> Vec<Rail> {
        let mut cands: Vec<(PathClass, usize)> = self
            .usable_nics()
            .into_iter()
            .filter(|&i| allowed.is_empty() || allowed.contains(&self.nics[i].name))
            .map(|i| {
                let class = match gpu.filter(|&g| g < self.gpus.len()) {
                    Some(g) => self.gpu_nic(g, i),
                    None => {
                        let me = Place {
                            pci_path: None,
                            numa,
                        };
                        Self::class_of(&me, &self.nics[i].place)
                    }
                };
                (class, i)
            })
            .collect();
        let Some(best) = cands.iter().map(|c| c.0).min() else {
            return Vec::new();
        };
        cands.retain(|c| c.0 == best);
        cands.sort_by(|x, y| self.nics[x.1].name.cmp(&self.nics[y.1].name));
        cands
            .into_iter()
            .map(|(path, i)| Rail {
                nic: i,
                name: self.nics[i].name.clone(),
                path,
                speed_mbps: self.nics[i].speed_mbps,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
