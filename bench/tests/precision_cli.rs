//! `railcc bench --fill random`: random inputs of every dtype through real ranks (processes
//! over loopback TCP), every collective, every op, checked against the error bound of
//! `collectives::precision` (the unit tests there show the check rejects values past it).

use std::process::Command;

const RAILCC: &str = env!("CARGO_BIN_EXE_railcc");

fn bench(coll: &str, extra: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let out = Command::new(RAILCC)
        .args(["bench", coll, "--ranks", "3", "--fill", "random"])
        .args([
            "-b", "1000", "-e", "140K", "-f", "140", "-n", "1", "-w", "0",
        ])
        .args(extra)
        .env("RAILCC_TIMEOUT_MS", "30000")
        .envs(env.iter().copied())
        .output()
        .expect("railcc runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Rows of the table and the #wrong columns that are not 0 (out of place and in place).
fn rows_and_wrong(text: &str) -> (usize, usize) {
    let rows: Vec<Vec<&str>> = text
        .lines()
        .filter(|l| l.starts_with(' ') && l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| l.split_whitespace().collect())
        .collect();
    let wrong = rows
        .iter()
        .filter(|r| {
            [8, 12]
                .iter()
                .any(|&i| r.get(i).is_some_and(|v| *v != "0" && *v != "N/A"))
        })
        .count();
    (rows.len(), wrong)
}

#[test]
fn random_inputs_every_collective_dtype_and_op() {
    for coll in [
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "reduce",
        "sendrecv",
        "alltoall",
    ] {
        let (ok, text) = bench(coll, &["-d", "all", "-o", "all", "-r", "1"], &[]);
        let (rows, wrong) = rows_and_wrong(&text);
        println!("{coll} --fill random -d all -o all: {rows} rows, {wrong} with #wrong != 0");
        assert!(ok, "{coll}: {text}");
        assert!(text.contains("random inputs"), "{coll}: {text}");
        assert!(
            text.contains("Out of bounds values : 0 OK"),
            "{coll}: {text}"
        );
        assert!(rows >= 20, "{coll}: only {rows} rows: {text}");
        assert_eq!(wrong, 0, "{coll}: {text}");
    }
    // Every all-reduce algorithm, f16 and bf16 sums and averages of random values, 3 ranks.
    for algo in ["ring", "direct", "rdouble", "tree"] {
        let (ok, text) = bench(
            "all_reduce",
            &["-d", "half,bfloat16", "-o", "sum,avg"],
            &[("RAILCC_ALGO", algo)],
        );
        let (rows, wrong) = rows_and_wrong(&text);
        assert!(ok && rows == 8 && wrong == 0, "{algo}: {text}");
        assert!(
            text.contains("Out of bounds values : 0 OK"),
            "{algo}: {text}"
        );
        assert!(
            text.contains(&format!("  {algo}")),
            "{algo} did not run: {text}"
        );
    }
}
