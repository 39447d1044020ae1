//! RDMA devices as the kernel lists them in /sys/class/infiniband: ports, state, link layer,
//! rate, and the GID to use. Reading sysfs needs no verbs library call, so "is there RDMA
//! here?" is answered without opening anything.

use std::path::Path;

#[derive(Debug, Clone, PartialEq)]
pub struct RdmaPort {
    pub device: String,
    pub port: u8,
    pub active: bool,
    /// "InfiniBand" or "Ethernet" (RoCE).
    pub link_layer: String,
    /// Line rate in Gb/s (active speed times width, as the kernel reports it).
    pub rate_gbps: f64,
    /// The GID index to use (RoCE v2 with an IPv4-mapped address when there is one).
    pub gid_index: u8,
    pub gid: String,
    /// The network interface under a RoCE port.
    pub netdev: Option<String>,
    pub pci_path: Option<String>,
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Every port of every RDMA device under `root` (normally /sys/class/infiniband).
pub fn list_at(root: &Path) -> Vec<RdmaPort> {
    let mut out = Vec::new();
    let Ok(devs) = std::fs::read_dir(root) else {
        return out;
    };
    let mut names: Vec<String> = devs
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for dev in names {
        let d = root.join(&dev);
        let Ok(ports) = std::fs::read_dir(d.join("ports")) else {
            continue;
        };
        let mut nums: Vec<u8> = ports
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
            .collect();
        nums.sort();
        for port in nums {
            let p = d.join("ports").join(port.to_string());
            let state = read(&p.join("state")).unwrap_or_default();
            let link_layer = read(&p.join("link_layer")).unwrap_or_default();
            let rate_gbps = read(&p.join("rate"))
                .and_then(|r| r.split_whitespace().next().and_then(|x| x.parse().ok()))
                .unwrap_or(0.0);
            let (gid_index, gid) = choose_gid(&p, link_layer == "Ethernet");
            let netdev = read(&p.join("gid_attrs/ndevs").join(gid_index.to_string()))
                .filter(|s| !s.is_empty());
            out.push(RdmaPort {
                device: dev.clone(),
                port,
                active: state.contains("ACTIVE"),
                link_layer,
                rate_gbps,
                gid_index,
                gid,
                netdev,
                pci_path: std::fs::canonicalize(d.join("device"))
                    .ok()
                    .map(|x| x.display().to_string()),
            });
        }
    }
    out
}

pub fn list() -> Vec<RdmaPort> {
    list_at(Path::new("/sys/class/infiniband"))
}

/// Uses GID `index` of port `p` (RAILCC_IB_GID_INDEX / NCCL_IB_GID_INDEX) instead of the one
/// [`list`] chose; an index with no GID is an error naming it.
pub fn set_gid_index(p: &mut RdmaPort, index: u8) -> Result<(), String> {
    set_gid_index_at(Path::new("/sys/class/infiniband"), p, index)
}

fn set_gid_index_at(root: &Path, p: &mut RdmaPort, index: u8) -> Result<(), String> {
    let port = root.join(&p.device).join("ports").join(p.port.to_string());
    let gid = read(&port.join("gids").join(index.to_string())).unwrap_or_default();
    if gid.is_empty() || gid.chars().all(|c| c == '0' || c == ':') {
        return Err(format!(
            "IB_GID_INDEX={index}: {}:{} has no GID there",
            p.device, p.port
        ));
    }
    p.gid_index = index;
    p.gid = gid;
    p.netdev =
        read(&port.join("gid_attrs/ndevs").join(index.to_string())).filter(|s| !s.is_empty());
    Ok(())
}

/// RoCE: the first RoCE v2 GID holding an IPv4-mapped address (::ffff:a.b.c.d), else the first
/// RoCE v2 GID, else index 0. InfiniBand: index 0 (routing uses the LID).
fn choose_gid(port: &Path, ethernet: bool) -> (u8, String) {
    let gid = |i: u8| read(&port.join("gids").join(i.to_string())).unwrap_or_default();
    if !ethernet {
        return (0, gid(0));
    }
    let mut v2_first = None;
    for i in 0..=254u8 {
        let g = gid(i);
        if g.is_empty() {
            break;
        }
        if g.chars().all(|c| c == '0' || c == ':') {
            continue;
        }
        let ty = read(&port.join("gid_attrs/types").join(i.to_string())).unwrap_or_default();
        if !ty.contains("v2") {
            continue;
        }
        if g.starts_with("0000:0000:0000:0000:0000:ffff:") {
            return (i, g);
        }
        v2_first.get_or_insert((i, g));
    }
    v2_first.unwrap_or_else(|| (0, gid(0)))
}

/// A port list in `NCCL_IB_HCA`'s syntax: comma-separated `name[:port]` entries, each name a
/// prefix of device names (`mlx5` takes mlx5_0, mlx5_1, ...) unless the list starts with `=`
/// (exact names); a leading `^` excludes what the list names instead (`^=mlx5_2`, `^mlx5`).
/// Empty: every port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaFilter {
    exclude: bool,
    exact: bool,
    entries: Vec<(String, Option<u8>)>,
}

impl HcaFilter {
    /// Parses `hca`; an entry whose port is not a number 1-255 is an error naming it.
    pub fn parse(hca: &str) -> Result<HcaFilter, String> {
        let s = hca.trim();
        let (exclude, s) = match s.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let (exact, s) = match s.strip_prefix('=') {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let mut entries = Vec::new();
        for e in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (name, port) = match e.split_once(':') {
                Some((n, p)) => match p.trim().parse::<u8>() {
                    Ok(p) if p > 0 => (n.trim(), Some(p)),
                    _ => return Err(format!("'{e}': the port after ':' must be 1 to 255")),
                },
                None => (e, None),
            };
            entries.push((name.to_string(), port));
        }
        Ok(HcaFilter {
            exclude,
            exact,
            entries,
        })
    }

    /// Whether the filter takes `p` (its state aside).
    pub fn takes(&self, p: &RdmaPort) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        let named = self.entries.iter().any(|(name, port)| {
            let by_name = if self.exact {
                p.device == *name
            } else {
                p.device.starts_with(name.as_str())
            };
            by_name && port.is_none_or(|n| n == p.port)
        });
        named != self.exclude
    }
}

/// The active ports `hca` (`RAILCC_IB_HCA`/`NCCL_IB_HCA`, [`HcaFilter`]'s syntax) takes; an
/// unparsable list takes none.
pub fn select(ports: &[RdmaPort], hca: &str) -> Vec<RdmaPort> {
    let Ok(f) = HcaFilter::parse(hca) else {
        return Vec::new();
    };
    ports
        .iter()
        .filter(|p| p.active && f.takes(p))
        .cloned()
        .collect()
}

/// Why `hca` selects no port among `ports`, naming every port found and its state, for an
/// error (`None` when it selects some, or when `hca` is empty).
pub fn no_match(ports: &[RdmaPort], hca: &str) -> Option<String> {
    if hca.trim().is_empty() || !select(ports, hca).is_empty() {
        return None;
    }
    let found: Vec<String> = ports
        .iter()
        .map(|p| {
            let state = if p.active { "active" } else { "not active" };
            format!("{}:{} ({state})", p.device, p.port)
        })
        .collect();
    let found = if found.is_empty() {
        "none".to_string()
    } else {
        found.join(", ")
    };
    Some(match HcaFilter::parse(hca) {
        Err(e) => format!("IB_HCA={hca} does not parse: {e}; ports found: {found}"),
        Ok(_) => format!("IB_HCA={hca} matches no active RDMA port; ports found: {found}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_port(root: &Path, dev: &str, state: &str, gids: &[(&str, &str)]) {
        let p = root.join(dev).join("ports/1");
        std::fs::create_dir_all(p.join("gids")).unwrap();
        std::fs::create_dir_all(p.join("gid_attrs/types")).unwrap();
        std::fs::create_dir_all(p.join("gid_attrs/ndevs")).unwrap();
        std::fs::write(p.join("state"), state).unwrap();
        std::fs::write(p.join("link_layer"), "Ethernet\n").unwrap();
        std::fs::write(p.join("rate"), "10 Gb/sec (1X QDR)\n").unwrap();
        for (i, (g, t)) in gids.iter().enumerate() {
            std::fs::write(p.join("gids").join(i.to_string()), g).unwrap();
            std::fs::write(p.join("gid_attrs/types").join(i.to_string()), t).unwrap();
            std::fs::write(p.join("gid_attrs/ndevs").join(i.to_string()), "v0\n").unwrap();
        }
    }

    #[test]
    fn picks_the_roce_v2_ipv4_gid_and_filters_ports() {
        let root = std::env::temp_dir().join(format!("railcc-ib-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        fake_port(
            &root,
            "rxe0",
            "4: ACTIVE\n",
            &[
                ("fe80:0000:0000:0000:0000:00ff:fe00:0001", "IB/RoCE v1"),
                ("0000:0000:0000:0000:0000:ffff:0a63:0001", "IB/RoCE v1"),
                ("0000:0000:0000:0000:0000:ffff:0a63:0001", "RoCE v2"),
            ],
        );
        fake_port(&root, "rxe1", "1: DOWN\n", &[("fe80::1", "RoCE v2")]);
        let ports = list_at(&root);
        assert_eq!(ports.len(), 2);
        assert_eq!(ports[0].gid_index, 2);
        assert_eq!(ports[0].rate_gbps, 10.0);
        assert_eq!(ports[0].netdev.as_deref(), Some("v0"));
        assert!(!ports[1].active);
        assert_eq!(select(&ports, "").len(), 1);
        assert_eq!(
            select(&ports, "rxe1").len(),
            0,
            "inactive ports are never used"
        );
        assert_eq!(select(&ports, "^rxe0").len(), 0);
        assert!(no_match(&ports, "").is_none() && no_match(&ports, "rxe").is_none());
        let why = no_match(&ports, "mlx5").expect("nothing matches");
        assert!(
            why.contains("rxe0:1 (active), rxe1:1 (not active)"),
            "{why}"
        );
        assert!(list_at(Path::new("/nonexistent")).is_empty());
        // NCCL_IB_GID_INDEX: index 1 is the RoCE v1 entry; index 5 has no GID.
        let mut p = ports[0].clone();
        set_gid_index_at(&root, &mut p, 1).unwrap();
        assert_eq!((p.gid_index, p.netdev.as_deref()), (1, Some("v0")));
        let e = set_gid_index_at(&root, &mut p, 5).unwrap_err();
        assert!(e.contains("IB_GID_INDEX=5") && e.contains("rxe0:1"), "{e}");
        let _ = std::fs::remove_dir_all(&root);
    }

    fn port(device: &str, port: u8) -> RdmaPort {
        RdmaPort {
            device: device.into(),
            port,
            active: true,
            link_layer: "InfiniBand".into(),
            rate_gbps: 400.0,
            gid_index: 0,
            gid: String::new(),
            netdev: None,
            pci_path: None,
        }
    }

    #[test]
    fn nccl_ib_hca_forms() {
        let ports = [
            port("mlx5_0", 1),
            port("mlx5_0", 2),
            port("mlx5_1", 1),
            port("mlx5_10", 1),
            port("mlx4_0", 1),
        ];
        let names = |hca: &str| -> Vec<String> {
            select(&ports, hca)
                .iter()
                .map(|p| format!("{}:{}", p.device, p.port))
                .collect()
        };
        // A prefix, as NCCL: mlx5 takes every mlx5 device, mlx5_1 takes mlx5_10 too.
        assert_eq!(names("mlx5").len(), 4);
        assert_eq!(names("mlx5_1"), ["mlx5_1:1", "mlx5_10:1"]);
        // '=' makes names exact.
        assert_eq!(names("=mlx5_1"), ["mlx5_1:1"]);
        // ':port' picks one port of a device.
        assert_eq!(names("mlx5_0:1"), ["mlx5_0:1"]);
        assert_eq!(names("=mlx5_0:2,mlx4_0"), ["mlx5_0:2", "mlx4_0:1"]);
        // '^' excludes, by prefix or exactly.
        assert_eq!(names("^mlx5"), ["mlx4_0:1"]);
        assert_eq!(names("^=mlx5_1").len(), 4);
        assert_eq!(names("^mlx5_0:1").len(), 4);
        // Spaces and empty entries are ignored; an empty list takes every port.
        assert_eq!(names(" mlx4_0 , ").len(), 1);
        assert_eq!(names("").len(), 5);
        // Nothing matches: an error naming what was found; a bad port does not parse.
        assert!(names("bnxt").is_empty());
        let why = no_match(&ports, "bnxt").unwrap();
        assert!(
            why.contains("mlx5_0:1 (active)") && why.contains("mlx4_0:1"),
            "{why}"
        );
        assert!(HcaFilter::parse("mlx5_0:x").is_err());
        assert!(no_match(&ports, "mlx5_0:0")
            .unwrap()
            .contains("does not parse"));
    }
}
