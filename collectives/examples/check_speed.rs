//! How long the bench's host side takes to make one rank's input and to check one rank's
//! result (issue 30: `railcc bench --device cuda -b 1G` spent most of its time there):
//! `cargo run --release -p railcc-collectives --example check_speed -- [MiB] [ranks]`
//! (default 256 MiB of f32 and 4 ranks). Prints each step's time and the threads it used.

use railcc_collectives::precision::{self, Fill};
use railcc_collectives::reference;
use railcc_collectives::{CollArgs, CollKind, DataType, ReduceOp};
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(256);
    let nranks: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
    let a = CollArgs {
        coll: CollKind::AllReduce,
        nranks,
        count: (mib << 20) / 4,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        root: 0,
    };
    let threads = std::thread::available_parallelism().map_or(1, |p| p.get());
    println!("check_speed: {mib} MiB of f32, all_reduce of {nranks} ranks, {threads} cores");
    for fill in [Fill::Exact, Fill::Random] {
        let t = Instant::now();
        let input = precision::fill_input(fill, &a, 1, 7);
        println!(
            "  {fill:?} input: {:.3} s ({} bytes)",
            t.elapsed().as_secs_f64(),
            input.len()
        );
    }
    // A correct result, then the check of it.
    let mut out = vec![0u8; a.count * 4];
    for (i, slot) in out.chunks_exact_mut(4).enumerate() {
        let v = reference::expected_value(&a, 0, i, 7).unwrap_or(0.0) as f32;
        slot.copy_from_slice(&v.to_le_bytes());
    }
    let t = Instant::now();
    let wrong = precision::count_wrong(Fill::Exact, &a, 0, &out, 7);
    println!(
        "  Exact check: {:.3} s, {wrong} wrong",
        t.elapsed().as_secs_f64()
    );
}
