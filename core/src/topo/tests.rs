use super::*;

/// A DGX-like box as a topology file would describe it: two NUMA nodes, 8 GPUs, 8 NICs, one
/// PCIe switch per GPU–NIC pair (each on its own root port), NVLink between every GPU pair.
fn dgx_like() -> Topology {
    let sw = |root: u32, i: u32| {
        format!(
            "/sys/devices/pci0000:{root:02x}/0000:{root:02x}:{:02x}.0/0000:{:02x}:00.0",
            i + 1,
            0x10 + i
        )
    };
    let gpus = (0..8)
        .map(|i| Gpu {
            ordinal: i as usize,
            name: "H100".into(),
            pci_bus_id: format!("0000:{:02x}:00.0", 0x20 + i),
            place: Place {
                pci_path: Some(format!(
                    "{}/0000:{:02x}:00.0/0000:{:02x}:00.0",
                    sw(if i < 4 { 0 } else { 0x80 }, i),
                    0x18 + i,
                    0x20 + i
                )),
                numa: Some(if i < 4 { 0 } else { 1 }),
            },
        })
        .collect();
    let nics = (0..8)
        .map(|i| Nic {
            name: format!("ib{i}"),
            speed_mbps: Some(400_000),
            up: true,
            addrs: vec![format!("10.0.{i}.1")],
            place: Place {
                pci_path: Some(format!(
                    "{}/0000:{:02x}:01.0/0000:{:02x}:00.0",
                    sw(if i < 4 { 0 } else { 0x80 }, i),
                    0x18 + i,
                    0x40 + i
                )),
                numa: Some(if i < 4 { 0 } else { 1 }),
            },
        })
        .collect();
    let mut nvlinks = Vec::new();
    for a in 0..8 {
        for b in a + 1..8 {
            nvlinks.push(NvLinks { a, b, links: 18 });
        }
    }
    Topology {
        source: "test".into(),
        numa: vec![],
        nics,
        rdma: vec![],
        gpus,
        nvlinks,
    }
}

#[test]
fn each_gpu_gets_its_own_switch_nic() {
    let t = dgx_like();
    for g in 0..8 {
        let r = t.rails(Some(g), None, &[]);
        assert_eq!(r.len(), 1, "GPU {g}: {r:?}");
        assert_eq!(r[0].name, format!("ib{g}"));
        assert_eq!(r[0].path, PathClass::Pix);
    }
    assert_eq!(t.gpu_nic(0, 1), PathClass::Phb);
    assert_eq!(t.gpu_nic(0, 5), PathClass::Sys);
    assert_eq!(t.gpu_gpu(0, 7), PathClass::NvLink(18));
}

#[test]
fn cpu_ranks_use_the_nics_of_their_numa_node() {
    let t = dgx_like();
    let names: Vec<String> = t
        .rails(None, Some(1), &[])
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, ["ib4", "ib5", "ib6", "ib7"]);
    let only: Vec<String> = t
        .rails(None, Some(1), &["ib0".to_string(), "ib1".to_string()])
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(
        only,
        ["ib0", "ib1"],
        "allowed NICs come first, even off-node"
    );
}

#[test]
fn the_json_form_round_trips_and_bad_links_are_refused() {
    let t = dgx_like();
    let dir = std::env::temp_dir().join(format!("railcc-topo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("t.json");
    std::fs::write(&f, serde_json::to_string(&t).unwrap()).unwrap();
    let back = Topology::from_file(f.to_str().unwrap()).unwrap();
    assert_eq!(back.gpus, t.gpus);
    assert_eq!(back.rails(Some(3), None, &[])[0].name, "ib3");
    let wrapped = serde_json::json!({"topology": t, "rails": {}});
    std::fs::write(&f, wrapped.to_string()).unwrap();
    assert_eq!(
        Topology::from_file(f.to_str().unwrap()).unwrap().nics,
        t.nics
    );
    std::fs::write(
        &f,
        r#"{"gpus": [], "nvlinks": [{"a": 0, "b": 1, "links": 4}]}"#,
    )
    .unwrap();
    let e = Topology::from_file(f.to_str().unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not name two of the 0 GPUs"), "{e}");
    std::fs::write(&f, "{not json").unwrap();
    let e = Topology::from_file(f.to_str().unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("RAILCC_TOPO_FILE"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn discovery_finds_this_machines_interfaces() {
    // Real sysfs: every interface /sys/class/net lists is there, loopback is never a rail.
    let t = discover::discover().unwrap();
    let listed = std::fs::read_dir("/sys/class/net").unwrap().count();
    assert_eq!(t.nics.len(), listed);
    assert!(t.usable_nics().iter().all(|&i| t.nics[i].name != "lo"));
    assert!(
        !t.numa.is_empty(),
        "no NUMA node found in /sys/devices/system/node"
    );
}
