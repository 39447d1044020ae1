//! `railcc sim`: 16,384 ranks answer at once, every size gets a choice, and bad arguments are
//! named.

use std::process::Command;
use std::time::{Duration, Instant};

const RAILCC: &str = env!("CARGO_BIN_EXE_railcc");

fn sim(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(RAILCC)
        .arg("sim")
        .args(args)
        .output()
        .expect("railcc runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn sixteen_thousand_ranks_in_well_under_seconds() {
    let t = Instant::now();
    let (ok, out, err) = sim(&[
        "all_reduce",
        "--nodes",
        "2048",
        "--gpus-per-node",
        "8",
        "--intra",
        "450GB/s,1us",
        "--inter",
        "50GB/s,5us",
        "-b",
        "8",
        "-e",
        "8G",
    ]);
    assert!(ok, "{err}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with(' ')).collect();
    assert_eq!(rows.len(), 11, "{out}"); // 8 B .. 8 GB by 8
    assert!(out.contains("16384"), "{out}");
    // Small calls go to a log-depth algorithm at this scale, large ones to a bandwidth one.
    assert!(
        rows[0].ends_with("rdouble") || rows[0].ends_with("tree"),
        "{}",
        rows[0]
    );
    assert!(
        rows[10].ends_with("tree") || rows[10].ends_with("ring"),
        "{}",
        rows[10]
    );
}

#[test]
fn bad_links_and_collectives_are_named() {
    let (ok, _, err) = sim(&["all_reduce", "--inter", "fast"]);
    assert!(!ok && err.contains("BANDWIDTH,LATENCY"), "{err}");
    let (ok, _, err) = sim(&["all_reduce", "--intra", "450GB/x,1us"]);
    assert!(!ok && err.contains("unknown unit"), "{err}");
    let (ok, _, err) = sim(&["broadcast"]);
    assert!(!ok && err.contains("only all_reduce"), "{err}");
    let (ok, _, err) = sim(&["all_reduce", "--nodes", "0"]);
    assert!(!ok && err.contains("must be positive"), "{err}");
}

#[test]
fn measured_tables_get_an_error_column() {
    let dir = std::env::temp_dir().join(format!("railcc-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("bench.txt");
    std::fs::write(
        &f,
        "#     size (B)                     ring                     tree\n\
         \x20     4194304            0.343 (10714)             0.398 (9226)\n",
    )
    .unwrap();
    let (ok, out, err) = sim(&[
        "all_reduce",
        "--nodes",
        "1",
        "--gpus-per-node",
        "8",
        "--host-ranks-per-core",
        "4",
        "--intra",
        "3.6GB/s,10us",
        "--reduce-gbps",
        "7.5",
        "--measured",
        f.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("from 2 MB up: mean absolute error"), "{out}");
    assert_eq!(out.lines().filter(|l| l.contains('%')).count(), 3, "{out}");
    let (ok, _, err) = sim(&["all_reduce", "--measured", "/nonexistent/x"]);
    assert!(!ok && err.contains("/nonexistent/x"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
