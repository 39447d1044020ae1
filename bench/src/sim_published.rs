//! `railcc sim all_reduce ... --published FILE`: the cost model's prediction beside published
//! figures of another library (NCCL's on 8-GPU hosts, which no machine here has). FILE holds
//! one figure a line, `SIZE BUSBW_GBPS SOURCE...` (`#` starts a comment); each is printed with
//! the prediction of the algorithm the selector picks at that size and the ratio. Published
//! figures are quotes with their source, not measurements.

use crate::args::parse_size;
use crate::sim_cmd::human_time;
use railcc_collectives::cost::{all_reduce_busbw, Machine};
use std::path::Path;

/// (size in bytes, busbw in GB/s, source)
type Figure = (u64, f64, String);

fn parse(text: &str) -> Result<Vec<Figure>, String> {
    let mut out = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let l = l.split('#').next().unwrap_or("").trim();
        if l.is_empty() {
            continue;
        }
        let f: Vec<&str> = l.split_whitespace().collect();
        let (Some(size), Some(bw)) = (f.first(), f.get(1)) else {
            return Err(format!("line {}: expected SIZE BUSBW_GBPS SOURCE", i + 1));
        };
        let size = parse_size(size).map_err(|e| format!("line {}: {e}", i + 1))?;
        let bw = bw
            .parse::<f64>()
            .ok()
            .filter(|b| *b > 0.0)
            .ok_or(format!("line {}: '{bw}' is not a bandwidth in GB/s", i + 1))?;
        let source = f.get(2..).unwrap_or(&[]).join(" ");
        if source.is_empty() {
            return Err(format!(
                "line {}: a published figure needs its source",
                i + 1
            ));
        }
        out.push((size, bw, source));
    }
    Ok(out)
}

pub fn run(m: &Machine, path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("railcc sim --published {}: {e}", path.display()))?;
    let figures =
        parse(&text).map_err(|e| format!("railcc sim --published {}: {e}", path.display()))?;
    if figures.is_empty() {
        return Err(format!(
            "railcc sim --published {}: no figures",
            path.display()
        ));
    }
    let p = m.ranks();
    println!(
        "# cost model ({} nodes x {} ranks, intra {:.0} GB/s {:.1} us) beside the figures of {}",
        m.nodes,
        m.per_node,
        m.intra.bytes_per_s / 1e9,
        m.intra.latency_s * 1e6,
        path.display()
    );
    println!(
        "# {:>12} {:>10} {:>8} {:>10} {:>10} {:>7}  source",
        "size (B)", "published", "algo", "predicted", "busbw", "ratio"
    );
    for (size, bw, source) in figures {
        let Some(&(algo, t)) = m.rank_all_reduce(size as f64).first() else {
            return Err("railcc sim: no algorithm for this machine".into());
        };
        let pred = all_reduce_busbw(size as f64, t, p) / 1e9;
        println!(
            "  {:>12} {:>10.1} {:>8} {:>10} {:>10.1} {:>6.2}x  {source}",
            size,
            bw,
            algo.name(),
            human_time(t),
            pred,
            pred / bw
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_need_a_size_a_bandwidth_and_a_source() {
        let f = parse("# comment\n8G  370   NCCL ring,  issue 212\n\n4G 475.5 H200 NVLS # note\n")
            .unwrap();
        assert_eq!(f.len(), 2);
        assert_eq!((f[0].0, f[0].1), (8 << 30, 370.0));
        assert_eq!(f[0].2, "NCCL ring, issue 212");
        assert_eq!(f[1].2, "H200 NVLS");
        assert!(parse("8G 370\n").unwrap_err().contains("needs its source"));
        assert!(parse("8G fast NCCL\n")
            .unwrap_err()
            .contains("not a bandwidth"));
        assert!(parse("eight 370 NCCL\n").unwrap_err().contains("line 1"));
    }
}
