//! `railcc bench <collective> --compare tcp,rdma,nvlink [--plot FILE.svg]`: the same sweep once
//! per configuration, each in a child `railcc bench` (a fresh communicator and rendezvous),
//! then one side-by-side table of bus bandwidth and, with `--plot`, an SVG of busbw by size.
//!
//! A configuration is a transport (`tcp`, `rdma`) or `nvlink` (`--device cuda`), optionally
//! with rails after a colon joined by `+`: `tcp:eth0+eth1`, `tcp:r0a=800+r1a=400` (Mb/s
//! weights), which become `RAILCC_RAILS` for that run. Under a manual launch
//! (`--rank --nranks --root-addr host:port`) every rank runs the same list and configuration
//! i meets at port + i.

use crate::args::BenchArgs;
use crate::report::bus_factor;
use std::collections::BTreeMap;
use std::process::Command;

struct Config {
    label: String,
    transport: Option<String>,
    device_cuda: bool,
    rails: Option<String>,
}

fn parse(list: &str) -> Result<Vec<Config>, String> {
    list.split(',')
        .filter(|s| !s.is_empty())
        .map(|item| {
            let (kind, rails) = match item.split_once(':') {
                Some((k, r)) => (k, Some(r.replace('+', ",").replace('=', ":"))),
                None => (item, None),
            };
            let (transport, device_cuda) = match kind {
                "tcp" | "rdma" => (Some(kind.to_string()), false),
                "nvlink" | "cuda" => (None, true),
                _ => {
                    return Err(format!(
                        "--compare: '{item}': expected tcp, rdma or nvlink, optionally :rail+rail"
                    ))
                }
            };
            if device_cuda && rails.is_some() {
                return Err(format!("--compare: '{item}': nvlink takes no rails"));
            }
            Ok(Config {
                label: item.to_string(),
                transport,
                device_cuda,
                rails,
            })
        })
        .collect()
}

/// This process's arguments without the compare options, and with the root port moved by
/// `port_shift` under a manual launch.
fn child_args(port_shift: u16) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut it = std::env::args().skip(1).peekable();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        match flag.as_str() {
            "--compare" | "--plot" | "--transport" | "--device" | "--rails" => {
                if inline.is_none() {
                    it.next();
                }
            }
            "--root-addr" => {
                let v = match inline {
                    Some(v) => v,
                    None => it.next().ok_or("--root-addr needs a value")?,
                };
                let (host, port) = v
                    .rsplit_once(':')
                    .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
                    .ok_or(format!("--root-addr {v}: expected host:port"))?;
                out.push("--root-addr".into());
                out.push(format!("{host}:{}", port.wrapping_add(port_shift)));
            }
            _ => out.push(a),
        }
    }
    Ok(out)
}

/// Out-of-place (time in µs, #wrong) per size.
type Rows = BTreeMap<u64, (f64, u64)>;

/// The rows of a bench table.
fn parse_rows(text: &str) -> Rows {
    text.lines()
        .filter(|l| l.starts_with(' '))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let size = f.first()?.parse::<u64>().ok()?;
            let us = f.get(5)?.parse::<f64>().ok()?;
            let wrong = f.get(8).and_then(|w| w.parse::<u64>().ok()).unwrap_or(0);
            Some((size, (us, wrong)))
        })
        .collect()
}

pub fn run(a: &BenchArgs, list: &str) -> Result<(), String> {
    let configs = parse(list)?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
    let lead = a.rank.unwrap_or(0) == 0;
    let coll = a.collective.kind();
    let mut results: Vec<(String, Result<Rows, String>)> = Vec::new();
    let mut nranks = a.nranks.unwrap_or(a.ranks);
    for (i, c) in configs.iter().enumerate() {
        let mut cmd = Command::new(&exe);
        cmd.args(child_args(i as u16)?);
        if let Some(t) = &c.transport {
            cmd.args(["--transport", t]);
        }
        if c.device_cuda {
            cmd.args(["--device", "cuda"]);
        }
        match c.rails.as_ref().or(a.rails.as_ref()) {
            Some(r) => cmd.env("RAILCC_RAILS", r),
            None => cmd.env_remove("RAILCC_RAILS"),
        };
        let out = cmd
            .output()
            .map_err(|e| format!("--compare {}: cannot run: {e}", c.label))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if lead {
            // Each run's own header says what it used (transport, device, rails).
            for l in text.lines().filter(|l| l.starts_with("# railcc bench")) {
                println!("{l}");
            }
            // The GPU sweep drives every local GPU: its rank count is the GPUs it lists.
            let gpus = text.lines().filter(|l| l.starts_with("#  GPU ")).count();
            if c.device_cuda && gpus > 0 && a.gpus.is_none() {
                nranks = gpus;
            }
        }
        let r = if out.status.success() {
            Ok(parse_rows(&text))
        } else {
            // The first rank's own error says why; the spawner's summary only that it failed.
            let err = String::from_utf8_lossy(&out.stderr);
            let why = err
                .lines()
                .find(|l| l.starts_with("railcc: railcc"))
                .or_else(|| err.lines().last())
                .unwrap_or("failed");
            Err(why.to_string())
        };
        results.push((c.label.clone(), r));
    }
    if !lead {
        return Ok(());
    }
    let sizes: Vec<u64> = results
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok())
        .flat_map(|m| m.keys().copied())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let factor = bus_factor(coll, nranks);
    let busbw = |size: u64, us: f64| size as f64 / us / 1e3 * factor;
    println!("#");
    println!(
        "# {} compared: out-of-place busbw in GB/s (time in us)",
        coll.name()
    );
    print!("# {:>12}", "size (B)");
    for (label, _) in &results {
        print!(" {:>24}", label);
    }
    println!();
    for &s in &sizes {
        print!("  {:>12}", s);
        for (_, r) in &results {
            let cell = match r.as_ref().map(|m| m.get(&s)) {
                Ok(Some(&(us, 0))) => format!("{:.3} ({:.0})", busbw(s, us), us),
                Ok(Some(&(_, w))) => format!("{w} WRONG"),
                Ok(None) => "-".into(),
                Err(_) => "failed".into(),
            };
            print!(" {:>24}", cell);
        }
        println!();
    }
    let mut failed = Vec::new();
    for (label, r) in &results {
        if let Err(e) = r {
            println!("# {label}: {e}");
            failed.push(label.clone());
        }
    }
    let wrong: u64 = results
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok())
        .flat_map(|m| m.values().map(|v| v.1))
        .sum();
    if let Some(path) = &a.plot {
        let series: Vec<(String, Vec<(u64, f64)>)> = results
            .iter()
            .filter_map(|(l, r)| {
                let m = r.as_ref().ok()?;
                Some((
                    l.clone(),
                    m.iter().map(|(&s, &(us, _))| (s, busbw(s, us))).collect(),
                ))
            })
            .collect();
        crate::plot::busbw_svg(path, &format!("railcc {} busbw", coll.name()), &series)?;
        println!("# plot: {}", path.display());
    }
    if wrong > 0 {
        return Err(format!("--compare: {wrong} wrong elements"));
    }
    if !failed.is_empty() {
        return Err(format!("--compare: {} failed", failed.join(", ")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn items_parse_and_rails_become_railcc_rails() {
        let c = super::parse("tcp,tcp:r0a=800+r1a=400,nvlink").unwrap();
        assert_eq!(c.len(), 3);
        assert_eq!(c[1].rails.as_deref(), Some("r0a:800,r1a:400"));
        assert!(c[2].device_cuda && c[2].transport.is_none());
        assert!(super::parse("udp").is_err());
        assert!(super::parse("nvlink:x").is_err());
    }

    #[test]
    fn rows_are_read_from_the_table() {
        let t = "# head\n        1024           256     float     sum      -1    50.64    0.02    0.03      0    50.30    0.02    0.03      0  direct\n";
        let m = super::parse_rows(t);
        assert_eq!(m.get(&1024), Some(&(50.64, 0)));
    }
}
