//! `railcc sim all_reduce --nodes N --gpus-per-node G --intra 450GB/s,1us --inter 50GB/s,5us
//! -b 8 -e 8G`: the cost model's predicted time and bus bandwidth of every all-reduce
//! algorithm at each size, and the one the selector picks ([`railcc_collectives::cost`]).
//! Closed forms, so 16,384 ranks take no longer than 2.

use crate::args::parse_size;
use railcc_collectives::cost::{
    all_reduce_busbw, HostEffects, Link, Machine, CANDIDATES, DIRECT_MAX_RANKS,
};

#[derive(clap::Args, Debug)]
pub struct SimArgs {
    /// The collective (all_reduce).
    pub collective: String,
    #[arg(long, default_value_t = 1)]
    pub nodes: usize,
    #[arg(long = "gpus-per-node", default_value_t = 8)]
    pub gpus_per_node: usize,
    /// Per-rank bandwidth and latency inside a node, e.g. 450GB/s,1us.
    #[arg(long, default_value = "450GB/s,1us", value_parser = parse_link)]
    pub intra: Link,
    /// Per-rank bandwidth and latency between nodes, e.g. 50GB/s,5us.
    #[arg(long, default_value = "50GB/s,5us", value_parser = parse_link)]
    pub inter: Link,
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = parse_size)]
    pub min_bytes: u64,
    #[arg(short = 'e', long = "maxbytes", default_value = "8G", value_parser = parse_size)]
    pub max_bytes: u64,
    #[arg(short = 'f', long = "stepfactor", default_value_t = 8)]
    pub step_factor: u64,
    /// Pipelining chunk (RAILCC_CHUNK_BYTES).
    #[arg(long, default_value = "512K", value_parser = parse_size)]
    pub chunk: u64,
    /// Reduction rate per rank in GB/s (0: free, as on a GPU where it hides under the copy).
    #[arg(long = "reduce-gbps", default_value_t = 0.0)]
    pub reduce_gbps: f64,
    /// Model a CPU data path with this many ranks per core (the host executor over TCP or
    /// RDMA: ranks share cores, caches run out, steps wait to be scheduled). Off: a GPU path.
    #[arg(long = "host-ranks-per-core")]
    pub host_ranks_per_core: Option<f64>,
    /// A `railcc bench all_reduce` table (or a `--compare` of algorithms) to set the
    /// predictions against: each measured time, the prediction for the algorithm it ran,
    /// and the error.
    #[arg(long)]
    pub measured: Option<std::path::PathBuf>,
    /// With --measured, the algorithm of a table without an algorithm column (GPU runs).
    #[arg(long)]
    pub algo: Option<String>,
    /// Published figures of another library (`SIZE BUSBW_GBPS SOURCE` a line, such as
    /// bench/results/nccl-published-8gpu.txt) to print the prediction beside.
    #[arg(long, conflicts_with = "measured")]
    pub published: Option<std::path::PathBuf>,
}

/// `450GB/s,1us`: bandwidth (B/s, KB/s, MB/s, GB/s; or Gb/s for bits) and latency (ns, us, ms, s).
pub fn parse_link(s: &str) -> Result<Link, String> {
    let (bw, lat) = s.split_once(',').ok_or(format!(
        "'{s}': expected BANDWIDTH,LATENCY such as 50GB/s,5us"
    ))?;
    let num = |x: &str, units: &[(&str, f64)]| -> Result<f64, String> {
        let x = x.trim();
        for (u, m) in units {
            if let Some(v) = x.strip_suffix(u) {
                return v
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|v| *v > 0.0 || *u == "us" || *u == "ns" || *u == "ms" || *u == "s")
                    .map(|v| v * m)
                    .ok_or(format!("'{x}': not a number of {u}"));
            }
        }
        Err(format!("'{x}': unknown unit"))
    };
    let bytes_per_s = num(
        bw,
        &[
            ("GB/s", 1e9),
            ("MB/s", 1e6),
            ("KB/s", 1e3),
            ("Gb/s", 1e9 / 8.0),
            ("B/s", 1.0),
        ],
    )?;
    let latency_s = num(lat, &[("ns", 1e-9), ("us", 1e-6), ("ms", 1e-3), ("s", 1.0)])?;
    Ok(Link {
        bytes_per_s,
        latency_s,
    })
}

pub fn human_time(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} us", s * 1e6)
    }
}

pub fn run(a: &SimArgs) -> Result<(), String> {
    let coll = a.collective.replace('-', "_");
    if coll != "all_reduce" && coll != "allreduce" {
        return Err(format!(
            "railcc sim: '{}': only all_reduce is modelled",
            a.collective
        ));
    }
    if a.nodes == 0 || a.gpus_per_node == 0 || a.nodes * a.gpus_per_node > 1 << 20 {
        return Err(
            "railcc sim: --nodes and --gpus-per-node must be positive (at most 2^20 ranks)".into(),
        );
    }
    let m = Machine {
        nodes: a.nodes,
        per_node: a.gpus_per_node,
        intra: a.intra,
        inter: a.inter,
        chunk_bytes: a.chunk as f64,
        reduce_bytes_per_s: a.reduce_gbps * 1e9,
        host: a.host_ranks_per_core.map(HostEffects::fitted),
    };
    if let Some(path) = &a.measured {
        return crate::sim_validate::run(&m, path, a.algo.as_deref());
    }
    if let Some(path) = &a.published {
        return crate::sim_published::run(&m, path);
    }
    let p = m.ranks();
    let algos: Vec<_> = CANDIDATES
        .iter()
        .copied()
        .filter(|&x| x != railcc_collectives::Algo::Direct || p <= DIRECT_MAX_RANKS)
        .collect();
    println!(
        "# railcc sim all_reduce: {} nodes x {} ranks = {p}; intra {:.0} GB/s {:.1} us, inter {:.0} GB/s {:.1} us per rank; chunk {} B",
        a.nodes,
        a.gpus_per_node,
        a.intra.bytes_per_s / 1e9,
        a.intra.latency_s * 1e6,
        a.inter.bytes_per_s / 1e9,
        a.inter.latency_s * 1e6,
        a.chunk
    );
    print!("# {:>12}", "size (B)");
    for x in &algos {
        print!(" {:>24}", format!("{} time, busbw", x.name()));
    }
    println!("  choice");
    let mut size = a.min_bytes.max(1);
    loop {
        print!("  {:>12}", size);
        for &x in &algos {
            let t = m.all_reduce(x, size as f64);
            let bw = all_reduce_busbw(size as f64, t, p) / 1e9;
            print!(" {:>24}", format!("{}, {bw:.2} GB/s", human_time(t)));
        }
        let best = m.rank_all_reduce(size as f64);
        println!("  {}", best.first().map_or("-", |b| b.0.name()));
        match size.checked_mul(a.step_factor.max(2)) {
            Some(n) if n <= a.max_bytes => size = n,
            _ => break,
        }
    }
    Ok(())
}
