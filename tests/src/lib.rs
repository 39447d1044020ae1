//! Helpers for the integration tests: start N rank processes with a shared unique id, wait
//! for them with a deadline (a hang is a failure, not a stuck CI), and collect their output.

use railcc_core::bootstrap::RootServer;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What one rank process did.
#[derive(Debug)]
pub struct RankOutcome {
    pub rank: usize,
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
    /// The signal that ended the process, if one did (9: SIGKILL).
    pub signal: Option<i32>,
}

/// Everything a pipe carried, as text (bytes that are not UTF-8 replaced, never dropped).
fn drain(r: Option<impl Read + Send + 'static>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut b = Vec::new();
        let err = match r {
            Some(mut r) => r.read_to_end(&mut b).err(),
            None => None,
        };
        let mut s = String::from_utf8_lossy(&b).into_owned();
        if let Some(e) = err {
            s.push_str(&format!("\n[test harness: reading the pipe failed: {e}]"));
        }
        s
    })
}

/// Runs `exe <scenario>` as ranks `ranks` of an `nranks` job (ranks not listed are never
/// started), with `env` added, and a rendezvous root served by this test. Panics, after
/// killing every rank, if any process outlives `limit`.
pub fn run_job(
    exe: &str,
    scenario: &str,
    nranks: usize,
    ranks: &[usize],
    env: &[(&str, &str)],
    limit: Duration,
) -> Vec<RankOutcome> {
    // The root gives up when the ranks do, so that it can tell them who never arrived.
    let timeout = env
        .iter()
        .find(|(k, _)| *k == "RAILCC_TIMEOUT_MS")
        .and_then(|(_, v)| v.parse().ok())
        .map_or(limit, Duration::from_millis);
    let root =
        RootServer::start("127.0.0.1:0".parse().expect("address"), timeout).expect("root server");
    run_job_with_id(
        exe,
        scenario,
        nranks,
        ranks,
        env,
        limit,
        &root.id.to_string(),
    )
}

pub fn run_job_with_id(
    exe: &str,
    scenario: &str,
    nranks: usize,
    ranks: &[usize],
    env: &[(&str, &str)],
    limit: Duration,
    id: &str,
) -> Vec<RankOutcome> {
    run_job_killing(exe, scenario, nranks, ranks, env, limit, id, None).0
}

/// As [`run_job_with_id`]; with `kill = Some((rank, after))`, that rank's process gets SIGKILL
/// `after` every rank has joined the communicator (each writes a marker into
/// `RAILCC_TEST_READY_DIR` once its init returns): a rank killed before it reaches the
/// rendezvous leaves the others waiting for a rank that never came, which only the bootstrap
/// deadline can end, and that is not what these tests measure. Returns the outcomes and when
/// the kill happened (from the start): `None` if the victim had already exited by then, so
/// nothing was killed.
#[allow(clippy::too_many_arguments)]
pub fn run_job_killing(
    exe: &str,
    scenario: &str,
    nranks: usize,
    ranks: &[usize],
    env: &[(&str, &str)],
    limit: Duration,
    id: &str,
    kill: Option<(usize, Duration)>,
) -> (Vec<RankOutcome>, Option<Duration>) {
    let (mut killed_at, mut kill_tried) = (None, false);
    let start = Instant::now();
    let ready_dir = kill.map(|_| {
        static JOBS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let job = JOBS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("railcc-ready-{}-{job}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("ready marker folder");
        d
    });
    let mut all_ready: Option<Instant> = None;
    let mut kids: Vec<(usize, Child, JoinHandle<String>, JoinHandle<String>)> = ranks
        .iter()
        .map(|&r| {
            let mut c = Command::new(exe);
            c.arg(scenario)
                .env("RAILCC_UNIQUE_ID", id)
                .env("RAILCC_RANK", r.to_string())
                .env("RAILCC_NRANKS", nranks.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in env {
                c.env(k, v);
            }
            if let Some(d) = &ready_dir {
                c.env("RAILCC_TEST_READY_DIR", d);
            }
            let mut child = c.spawn().expect("spawn rank");
            let (o, e) = (drain(child.stdout.take()), drain(child.stderr.take()));
            (r, child, o, e)
        })
        .collect();
    let mut status: Vec<Option<(bool, Duration, Option<i32>)>> = vec![None; kids.len()];
    while status.iter().any(Option::is_none) {
        if let (Some(d), None) = (&ready_dir, all_ready) {
            if ranks.iter().all(|r| d.join(r.to_string()).exists()) {
                all_ready = Some(Instant::now());
            }
        }
        if let (Some((victim, after)), Some(ready)) = (kill, all_ready) {
            if !kill_tried && ready.elapsed() >= after {
                kill_tried = true;
                if let Some((_, k, _, _)) = kids.iter_mut().find(|k| k.0 == victim) {
                    // Only a victim still running counts as killed.
                    if matches!(k.try_wait(), Ok(None)) && k.kill().is_ok() {
                        killed_at = Some(start.elapsed()); // SIGKILL sent
                    }
                }
            }
        }
        for (i, (_, kid, _, _)) in kids.iter_mut().enumerate() {
            if status[i].is_none() {
                if let Some(s) = kid.try_wait().expect("wait") {
                    use std::os::unix::process::ExitStatusExt;
                    status[i] = Some((s.success(), start.elapsed(), s.signal()));
                }
            }
        }
        if start.elapsed() > limit {
            for (_, k, _, _) in kids.iter_mut() {
                let _ = k.kill();
            }
            let stuck: Vec<usize> = kids
                .iter()
                .zip(&status)
                .filter(|(_, s)| s.is_none())
                .map(|(k, _)| k.0)
                .collect();
            panic!(
                "scenario '{scenario}': rank(s) {stuck:?} still running after {limit:?}, a hang"
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let outs = kids
        .into_iter()
        .zip(status)
        .map(|((rank, _, o, e), s)| {
            let (success, elapsed, signal) = s.unwrap_or((false, Duration::ZERO, None));
            RankOutcome {
                rank,
                success,
                stdout: o.join().unwrap_or_default(),
                stderr: e.join().unwrap_or_default(),
                elapsed,
                signal,
            }
        })
        .collect();
    if let Some(d) = ready_dir {
        let _ = std::fs::remove_dir_all(d);
    }
    (outs, killed_at)
}

/// Every rank failed with a railcc error, each within `limit` when given, and at least one
/// named `needle` (the others may name the rank that gave up because of it).
pub fn expect_all_fail(outs: &[RankOutcome], needle: &str, limit: Option<Duration>) {
    for o in outs {
        assert!(
            !o.success,
            "rank {} should have failed: {}",
            o.rank, o.stdout
        );
        assert!(
            o.stdout.starts_with("error: railcc"),
            "rank {}: {}",
            o.rank,
            o.stdout
        );
        if let Some(limit) = limit {
            assert!(
                o.elapsed < limit,
                "rank {} took {:?} (it should not wait for the deadline)",
                o.rank,
                o.elapsed
            );
        }
    }
    expect_one_names(outs, &[needle]);
}

/// Some rank's error names one of `needles` (the disagreement as either side sees it: which
/// rank notices first is a race).
pub fn expect_one_names(outs: &[RankOutcome], needles: &[&str]) {
    assert!(
        outs.iter()
            .any(|o| needles.iter().any(|n| o.stdout.contains(n))),
        "no rank reported any of {needles:?}: {outs:#?}"
    );
}
