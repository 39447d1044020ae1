//! How a bench process becomes a rank: under a launcher (torchrun, mpirun, srun, PMI), by
//! hand (`--rank --nranks --root-addr`), or as the parent of `--ranks N` local processes.

use crate::args::BenchArgs;
use crate::measure::run_rank;
use railcc_collectives::Communicator;
use railcc_core::bootstrap::RootServer;
use railcc_core::{launch, Config};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

pub fn bench_main(a: BenchArgs) -> Result<(), String> {
    if let Some(list) = &a.compare {
        return crate::compare::run(&a, list);
    }
    if a.plot.is_some() {
        return Err("--plot goes with --compare".into());
    }
    if let Some(r) = &a.rails {
        // Read by Config::from_env here and inherited by the ranks this process starts.
        std::env::set_var("RAILCC_RAILS", r);
    }
    if let Some(t) = &a.transport {
        // Read by Config::from_env here and inherited by the ranks this process starts.
        std::env::set_var("RAILCC_TRANSPORT", t);
    }
    let cfg = Config::from_env().map_err(|e| e.to_string())?;
    let env = |k: &str| std::env::var(k).ok();
    let launched = launch::discover(env).map_err(|e| e.to_string())?;
    match a.device.as_str() {
        "host" => {}
        "cuda" if !a.per_process && launched.is_none() && a.rank.is_none() => {
            return crate::gpu::run(&a)
        }
        "cuda" => {}
        d => return Err(format!("--device {d}: expected host or cuda")),
    }
    if let Some(info) = launched {
        bind(&a, info.local_rank.unwrap_or(info.rank))?;
        let comm = Communicator::from_launch(cfg, &info, env("RAILCC_UNIQUE_ID").is_none())
            .map_err(|e| e.to_string())?;
        return run_rank(&comm, &a);
    }
    match (a.rank, a.nranks, a.root_addr.clone()) {
        (Some(rank), Some(n), Some(root)) => {
            let overlay = |k: &str| match k {
                "RAILCC_RANK" => Some(rank.to_string()),
                "RAILCC_NRANKS" => Some(n.to_string()),
                "RAILCC_ROOT" => Some(root.clone()),
                _ => std::env::var(k).ok(),
            };
            let info = launch::discover(overlay)
                .map_err(|e| e.to_string())?
                .ok_or("could not form launch info")?;
            bind(&a, info.local_rank.unwrap_or(info.rank))?;
            let comm = Communicator::from_launch(cfg, &info, true).map_err(|e| e.to_string())?;
            run_rank(&comm, &a)
        }
        (None, None, None) => spawn_local(&a, &cfg),
        _ => Err("--rank, --nranks and --root-addr go together".into()),
    }
}

fn bind(a: &BenchArgs, local_rank: usize) -> Result<(), String> {
    if a.bind == "core" {
        let cpu = crate::bind::bind_to_core(local_rank)?;
        tracing::info!("local rank {local_rank} bound to CPU {cpu}");
    }
    Ok(())
}

/// Starts `--ranks` copies of this program on this machine, serving their rendezvous here.
/// If one fails, the others are stopped; the exit status is the first failure's.
fn spawn_local(a: &BenchArgs, cfg: &Config) -> Result<(), String> {
    let n = a.ranks;
    if n == 0 || n > 1024 {
        return Err(format!("--ranks {n}: expected 1 to 1024"));
    }
    if a.hosts == 0 || !n.is_multiple_of(a.hosts) {
        return Err(format!(
            "--hosts {}: expected a divisor of --ranks {n}",
            a.hosts
        ));
    }
    let per_host = n / a.hosts;
    let root = RootServer::start(
        "127.0.0.1:0".parse().map_err(|_| "bad address")?,
        cfg.timeout(),
    )
    .map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
    let mut kids: Vec<Child> = Vec::with_capacity(n);
    for r in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.args(std::env::args_os().skip(1))
            .env("RAILCC_UNIQUE_ID", root.id.to_string())
            .env("RAILCC_RANK", r.to_string())
            .env("RAILCC_NRANKS", n.to_string())
            .env("RAILCC_LOCAL_RANK", (r % per_host).to_string());
        if a.hosts > 1 {
            cmd.env("RAILCC_HOSTID", format!("bench-host{}", r / per_host));
        }
        let child = cmd.spawn();
        match child {
            Ok(c) => kids.push(c),
            Err(e) => {
                stop_all(&mut kids);
                return Err(format!("could not start rank {r}: {e}"));
            }
        }
    }
    let mut failed: Option<(usize, String)> = None;
    let mut failed_at: Option<Instant> = None;
    let mut live = n;
    let mut exited = vec![false; n];
    while live > 0 {
        for (r, k) in kids.iter_mut().enumerate() {
            if exited[r] {
                continue;
            }
            match k.try_wait() {
                Ok(Some(status)) => {
                    exited[r] = true;
                    live -= 1;
                    if !status.success() && failed.is_none() {
                        failed = Some((r, status.to_string()));
                        failed_at = Some(Instant::now());
                    }
                }
                Ok(None) => {}
                Err(e) => return Err(format!("waiting for rank {r}: {e}")),
            }
        }
        // Survivors of a failure get a grace period to report their own errors, then stop.
        if failed_at.is_some_and(|t| t.elapsed() > cfg.timeout() + Duration::from_secs(5)) {
            stop_all(&mut kids);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(root);
    match failed {
        Some((r, s)) => Err(format!("rank {r} failed ({s})")),
        None => Ok(()),
    }
}

fn stop_all(kids: &mut [Child]) {
    for k in kids.iter_mut() {
        let _ = k.kill();
    }
}
