//! `railcc topo [--json]`: the GPUs, NICs and RDMA devices of this machine, the path class
//! between each pair (as `nvidia-smi topo -m` prints them), and each rank's rails.

use railcc_core::topo::{Gpu, NvLinks, PathClass, Place, Topology};
use railcc_core::Config;

#[derive(clap::Args, Debug)]
pub struct TopoArgs {
    /// Print the topology and rail plan as JSON (the form RAILCC_TOPO_FILE reads).
    #[arg(long)]
    pub json: bool,
}

/// GPUs from CUDA and NVLink counts from NVML; nothing (with a note) when either is absent.
fn gpus() -> (Vec<Gpu>, Vec<NvLinks>, Vec<String>) {
    let mut notes = Vec::new();
    let found = match railcc_cuda::driver::devices() {
        Ok(g) => g,
        Err(e) => {
            notes.push(format!("no GPUs: {e}"));
            return (Vec::new(), Vec::new(), notes);
        }
    };
    let gpus: Vec<Gpu> = found
        .iter()
        .map(|g| Gpu {
            ordinal: g.ordinal,
            name: g.name.clone(),
            pci_bus_id: g.pci_bus_id.clone(),
            place: railcc_core::topo::discover::place_of_pci(&g.pci_bus_id),
        })
        .collect();
    let ids: Vec<String> = gpus.iter().map(|g| g.pci_bus_id.clone()).collect();
    let mut links = Vec::new();
    match railcc_cuda::nvml::nvlink_counts(&ids) {
        Ok(m) => {
            let pairs = (0..ids.len()).flat_map(|a| (a + 1..ids.len()).map(move |b| (a, b)));
            for (a, b) in pairs {
                let n = m[a][b].max(m[b][a]);
                if n > 0 {
                    links.push(NvLinks { a, b, links: n });
                }
            }
        }
        Err(e) => notes.push(format!("NVLink counts unknown: {e}")),
    }
    (gpus, links, notes)
}

/// One column or row of the matrix: a GPU, a NIC, or an RDMA device.
struct Dev<'a> {
    label: String,
    place: &'a Place,
    gpu: Option<usize>,
}

fn class(t: &Topology, a: &Dev, b: &Dev) -> PathClass {
    if std::ptr::eq(a, b) {
        return PathClass::Same;
    }
    match (a.gpu, b.gpu) {
        (Some(x), Some(y)) => t.gpu_gpu(x, y),
        _ => t.place_class(a.place, b.place),
    }
}

pub fn run(a: &TopoArgs) -> Result<(), String> {
    let cfg = Config::from_env().map_err(|e| e.to_string())?;
    let (g, l, notes) = if cfg.topo_file.is_empty() {
        gpus()
    } else {
        (Vec::new(), Vec::new(), Vec::new())
    };
    let t = Topology::load(&cfg.topo_file, g, l).map_err(|e| e.to_string())?;
    let allowed: Vec<String> = cfg
        .socket_ifname
        .split(',')
        .filter(|s| !s.is_empty() && !s.starts_with('^'))
        .map(|s| s.trim_start_matches('=').to_string())
        .collect();
    let nodes: Vec<i32> = t.numa.iter().map(|n| n.id).collect();
    let plan_gpu: Vec<_> = (0..t.gpus.len())
        .map(|g| (g, t.rails(Some(g), None, &[])))
        .collect();
    let plan_cpu: Vec<_> = nodes
        .iter()
        .map(|&n| (n, t.rails(None, Some(n), &allowed)))
        .collect();
    if a.json {
        let v = serde_json::json!({
            "topology": t,
            "rails": {
                "gpu": plan_gpu.iter().map(|(g, r)| serde_json::json!({"gpu": g, "rails": r})).collect::<Vec<_>>(),
                "cpu": plan_cpu.iter().map(|(n, r)| serde_json::json!({"numa": n, "rails": r})).collect::<Vec<_>>(),
            },
            "notes": notes,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    println!("# railcc topo ({})", t.source);
    for n in &notes {
        println!("# {n}");
    }
    let mut devs: Vec<Dev> = t
        .gpus
        .iter()
        .enumerate()
        .map(|(i, g)| Dev {
            label: format!("GPU{}", g.ordinal),
            place: &g.place,
            gpu: Some(i),
        })
        .collect();
    for &i in &t.usable_nics() {
        devs.push(Dev {
            label: t.nics[i].name.clone(),
            place: &t.nics[i].place,
            gpu: None,
        });
    }
    for r in &t.rdma {
        devs.push(Dev {
            label: r.name.clone(),
            place: &r.place,
            gpu: None,
        });
    }
    let w = devs.iter().map(|d| d.label.len()).max().unwrap_or(4).max(5) + 1;
    print!("{:w$}", "");
    for d in &devs {
        print!("{:>w$}", d.label);
    }
    println!();
    for x in &devs {
        print!("{:<w$}", x.label);
        for y in &devs {
            print!("{:>w$}", class(&t, x, y).to_string());
        }
        println!();
    }
    println!();
    for g in &t.gpus {
        println!(
            "GPU{} {} bus {} NUMA {}",
            g.ordinal,
            g.name,
            g.pci_bus_id,
            numa(&g.place)
        );
        if cfg.topo_file.is_empty() {
            let path = railcc_cuda::staging::gpu_net_path(g.ordinal);
            println!("  GPU{} data to the network: {path}", g.ordinal);
        }
    }
    for n in &t.nics {
        println!(
            "NIC {} {} speed {} addrs [{}] pci {} NUMA {}",
            n.name,
            if n.up { "up" } else { "down" },
            n.speed_mbps
                .map_or("unknown".into(), |s| format!("{s} Mb/s")),
            n.addrs.join(" "),
            pci(&n.place),
            numa(&n.place)
        );
    }
    for r in &t.rdma {
        for p in &r.ports {
            println!(
                "RDMA {} port {} {} {} {} Gb/s netdev {} pci {}",
                r.name,
                p.port,
                p.state,
                p.link_layer,
                p.rate_gbps,
                r.netdev.as_deref().unwrap_or("-"),
                pci(&r.place)
            );
        }
    }
    for n in &t.numa {
        println!("NUMA node {} CPUs {}", n.id, n.cpus);
    }
    println!();
    println!("Rail plan (rail i of one node meets rail i of another):");
    for (g, r) in &plan_gpu {
        println!("  rank on GPU{g}: {}", rails(r));
    }
    for (n, r) in &plan_cpu {
        println!("  CPU rank on NUMA node {n}: {}", rails(r));
    }
    Ok(())
}

fn rails(r: &[railcc_core::topo::Rail]) -> String {
    if r.is_empty() {
        return "no NIC besides loopback (single-node only)".into();
    }
    r.iter()
        .enumerate()
        .map(|(i, x)| format!("rail {i} = {} ({})", x.name, x.path))
        .collect::<Vec<_>>()
        .join(", ")
}

fn numa(p: &Place) -> String {
    p.numa.map_or("-".into(), |n| n.to_string())
}

fn pci(p: &Place) -> String {
    p.pci_path
        .as_deref()
        .and_then(|s| s.rsplit('/').next())
        .unwrap_or("-")
        .to_string()
}
