//! `railcc bench <collective> --compare tcp,rdma,nvlink [--plot FILE.svg]`: the same sweep once
//! per configuration, each in a child `railcc bench` (a fresh communicator and rendezvous),
//! then one side-by-side table of bus bandwidth and, with `--plot`, an SVG of busbw by size.
//!
//! A configuration is a transport (`tcp`, `rdma`) or `nvlink` (`--device cuda`), optionally
//! with rails after a colon joined by `+`: `tcp:eth0+eth1`, `tcp:r0a=800+r1a=400` (Mb/s
//! weights), which become `RAILCC_RAILS` for that run. Under a manual launch
//! (`--rank --nranks --root-addr host:port`) every rank runs the same list and configuration
//! i meets at port + i.
//!
//! An item may instead be an all-reduce algorithm (`ring`, `tree`, `rdouble`, `direct`,
//! `auto`), run with `RAILCC_ALGO` set to it over the bench's own transport: with `auto`
//! and at least one forced algorithm, the table adds the algorithm auto chose and its time
//! over the best forced one's (issue 6: the selector must pick the faster algorithm).

use crate::args::BenchArgs;
use crate::report::bus_factor;
use std::collections::BTreeMap;
use std::process::Command;

struct Config {
    label: String,
    transport: Option<String>,
    device_cuda: bool,
    rails: Option<String>,
    algo: Option<String>,
}

const ALGOS: [&str; 5] = ["ring", "tree", "rdouble", "direct", "auto"];

fn parse(list: &str) -> Result<Vec<Config>, String> {
    list.split(',')
        .filter(|s| !s.is_empty())
        .map(|item| {
            let (kind, rails) = match item.split_once(':') {
                Some((k, r)) => (k, Some(r.replace('+', ",").replace('=', ":"))),
                None => (item, None),
            };
            if ALGOS.contains(&kind) && rails.is_none() {
                return Ok(Config {
                    label: item.to_string(),
                    transport: None,
                    device_cuda: false,
                    rails: None,
                    algo: Some(kind.to_string()),
                });
            }
            let (transport, device_cuda) = match kind {
                "tcp" | "rdma" => (Some(kind.to_string()), false),
                "nvlink" | "cuda" => (None, true),
                _ => {
                    return Err(format!(
                        "--compare: '{item}': expected tcp, rdma or nvlink (optionally :rail+rail), or an algorithm: ring, tree, rdouble, direct, auto"
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
                algo: None,
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

/// The algorithm column of each row (the last field, when it is a word).
fn parse_algos(text: &str) -> BTreeMap<u64, String> {
    text.lines()
        .filter(|l| l.starts_with(' '))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let size = f.first()?.parse::<u64>().ok()?;
            let last = f.last()?;
            last.chars()
                .all(|c| c.is_ascii_alphabetic())
                .then(|| (size, last.to_string()))
        })
        .collect()
}

/// One child bench for configuration `c` (index `i`): its stdout and its rows, or why it
/// failed.
fn run_one(
    a: &BenchArgs,
    exe: &std::path::Path,
    c: &Config,
    i: usize,
) -> Result<(String, Result<Rows, String>), String> {
    let mut cmd = Command::new(exe);
    cmd.args(child_args(i as u16)?);
    if let Some(t) = c.transport.as_ref().or(a.transport.as_ref()) {
        cmd.args(["--transport", t]);
    }
    if c.device_cuda {
        cmd.args(["--device", "cuda"]);
    }
    match &c.algo {
        Some(x) => cmd.env("RAILCC_ALGO", x),
        None => &mut cmd,
    };
    match c.rails.as_ref().or(a.rails.as_ref()) {
        Some(r) => cmd.env("RAILCC_RAILS", r),
        None => cmd.env_remove("RAILCC_RAILS"),
    };
    let out = cmd
        .output()
        .map_err(|e| format!("--compare {}: cannot run: {e}", c.label))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
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
    Ok((text, r))
}

/// Per size, the median time over rounds and the most wrong elements any round saw; the
/// first failure if any round failed.
fn median_rows(runs: Vec<Result<Rows, String>>) -> Result<Rows, String> {
    let mut by_size: BTreeMap<u64, (Vec<f64>, u64)> = BTreeMap::new();
    for r in runs {
        for (size, (us, wrong)) in r? {
            let e = by_size.entry(size).or_default();
            e.0.push(us);
            e.1 = e.1.max(wrong);
        }
    }
    Ok(by_size
        .into_iter()
        .map(|(size, (mut t, wrong))| {
            t.sort_by(f64::total_cmp);
            (size, (t[t.len() / 2], wrong))
        })
        .collect())
}

pub fn run(a: &BenchArgs, list: &str) -> Result<(), String> {
    let configs = parse(list)?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
    let lead = a.rank.unwrap_or(0) == 0;
    let coll = a.collective.kind();
    let mut results: Vec<(String, Result<Rows, String>)> = Vec::new();
    let mut auto_choice = BTreeMap::new();
    let mut nranks = a.nranks.unwrap_or(a.ranks);
    let rounds = a.rounds.max(1);
    let mut per_round: Vec<Vec<Result<Rows, String>>> = vec![Vec::new(); configs.len()];
    for round in 0..rounds {
        for (i, c) in configs.iter().enumerate() {
            let (text, r) = run_one(a, &exe, c, i)?;
            if lead && round == 0 {
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
            if c.algo.as_deref() == Some("auto") && round == 0 {
                auto_choice = parse_algos(&text);
            }
            per_round[i].push(r);
        }
    }
    for (c, runs) in configs.iter().zip(per_round) {
        results.push((c.label.clone(), median_rows(runs)));
    }
    if rounds > 1 && lead {
        println!("# {rounds} rounds of the list, interleaved; each cell is the median round");
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
    // auto against the best forced algorithm, when both were run.
    let auto_at = configs
        .iter()
        .position(|c| c.algo.as_deref() == Some("auto"));
    let forced: Vec<usize> = (0..configs.len())
        .filter(|&i| configs[i].algo.as_deref().is_some_and(|x| x != "auto"))
        .collect();
    let judge = auto_at.is_some() && !forced.is_empty();
    print!("# {:>12}", "size (B)");
    for (label, _) in &results {
        print!(" {:>24}", label);
    }
    if judge {
        print!(" {:>8} {:>10} {:>11}", "chose", "auto/best", "chosen/best");
    }
    println!();
    let mut worst: f64 = 0.0;
    let mut worst_chosen: f64 = 0.0;
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
        if let Some(ai) = auto_at.filter(|_| judge) {
            let time = |i: usize| {
                results[i]
                    .1
                    .as_ref()
                    .ok()
                    .and_then(|m| m.get(&s))
                    .map(|v| v.0)
            };
            let best = forced
                .iter()
                .filter_map(|&i| time(i))
                .fold(f64::INFINITY, f64::min);
            let chose = auto_choice.get(&s).map_or("-", |x| x.as_str());
            // The chosen algorithm's own forced run against the best: the selector's quality
            // without the noise of one more run.
            let chosen = configs
                .iter()
                .position(|c| c.algo.as_deref() == Some(chose))
                .and_then(time);
            let ratio = |t: Option<f64>| match t {
                Some(t) if best.is_finite() => format!("{:.2}", t / best),
                _ => "-".into(),
            };
            if let Some(t) = chosen.filter(|_| best.is_finite()) {
                worst_chosen = worst_chosen.max(t / best);
            }
            if let Some(t) = time(ai).filter(|_| best.is_finite()) {
                worst = worst.max(t / best);
            }
            print!(" {chose:>8} {:>10} {:>11}", ratio(time(ai)), ratio(chosen));
        }
        println!();
    }
    if judge {
        println!(
            "# worst size: auto's time over the best forced algorithm's {worst:.2}; the chosen algorithm's forced time over the best {worst_chosen:.2}"
        );
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
