//! `railcc`: the command-line tool.
//!
//! - `railcc bench <collective>`: nccl-tests-style sweep over sizes, with checking.
//! - `railcc topo`: the machine's topology and each rank's rails.
//! - `railcc sim all_reduce`: the cost model's predictions at any scale, or against a run.
//! - `railcc config`: the effective configuration and where each value came from.

mod args;
mod bind;
mod compare;
mod gpu;
mod gpu_net;
mod measure;
mod plot;
mod report;
mod sim_cmd;
mod sim_published;
mod sim_validate;
mod spawn;
mod topo_cmd;

use clap::Parser;
use railcc_core::Config;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "railcc",
    version,
    about = "railcc: collective communication for host and GPU buffers over TCP, RDMA and NVLink/PCIe peer access"
)]
enum Cli {
    /// Benchmark a collective, in the manner of nccl-tests.
    Bench(Box<args::BenchArgs>),
    /// Predict every all-reduce algorithm's time at cluster scale (the cost model).
    Sim(sim_cmd::SimArgs),
    /// Print the topology (GPUs, NICs, RDMA devices, paths) and each rank's rails.
    Topo(topo_cmd::TopoArgs),
    /// Print the effective configuration (defaults overridden by RAILCC_* variables).
    Config,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            railcc_core::config::log_filter()
                .and_then(|f| tracing_subscriber::EnvFilter::try_new(f).ok())
                .unwrap_or_else(|| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let r = match Cli::parse() {
        Cli::Bench(a) => spawn::bench_main(*a),
        Cli::Config => print_config(),
        Cli::Topo(a) => topo_cmd::run(&a),
        Cli::Sim(a) => sim_cmd::run(&a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A rank of a job also logs when it stops (a timestamp to measure failure times by).
            if let Some(r) = railcc_core::config::railcc_rank() {
                tracing::error!("rank {r} stops: {e}");
            }
            eprintln!("railcc: {e}");
            ExitCode::FAILURE
        }
    }
}

fn print_config() -> Result<(), String> {
    let env = railcc_core::config::process_env;
    let cfg = Config::from_env().map_err(|e| e.to_string())?;
    let nccl = |k: &str| railcc_core::nccl_env::lookup(&env, k);
    println!("{:<28} {:<14} {:<8} meaning", "variable", "value", "source");
    for row in cfg.describe(nccl) {
        let source = match (row.from_env, env(row.var).is_some()) {
            (false, _) => "default",
            (true, true) => "env",
            (true, false) => "NCCL_*",
        };
        println!(
            "{:<28} {:<14} {:<8} {}",
            row.var, row.value, source, row.doc
        );
    }
    println!();
    println!(
        "NCCL variables (read where the RAILCC_ variable is unset; libnccl and railcc alike):"
    );
    let set = railcc_core::nccl_env::report(&env);
    for v in railcc_core::nccl_env::all() {
        let now = set
            .iter()
            .find(|s| s.0 == v.nccl)
            .map(|s| format!("= {}: {}", s.1, s.2))
            .unwrap_or_else(|| "(unset)".into());
        println!(
            "{:<28} -> {:<24} {}; {}",
            v.nccl,
            v.railcc.unwrap_or("-"),
            v.effect,
            now
        );
    }
    Ok(())
}
