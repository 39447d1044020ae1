//! Ranks as separate processes over TCP on loopback: every collective against the reference
//! for 2, 3, 4 and 8 ranks; mismatched calls, bad arguments, a rank that never arrives and a
//! stranger at the bootstrap port all end in clear errors, never a hang.

use railcc_tests::{run_job, run_job_with_id, RankOutcome};
use std::time::Duration;

const EXE: &str = env!("CARGO_BIN_EXE_railcc-test-rank");

fn all_ok(outs: &[RankOutcome]) {
    let bad: Vec<String> = outs
        .iter()
        .filter(|o| !o.success || !o.stdout.starts_with("ok: "))
        .map(|o| format!("rank {}: {}{}", o.rank, o.stdout, o.stderr))
        .collect();
    assert!(bad.is_empty(), "failed ranks:\n{}", bad.join("\n"));
}

fn every_collective(n: usize, env: &[(&str, &str)]) {
    let outs = run_job(
        EXE,
        "all",
        n,
        &(0..n).collect::<Vec<_>>(),
        env,
        Duration::from_secs(600),
    );
    all_ok(&outs);
    println!("{n} ranks {env:?}: {}", outs[0].stdout.trim());
    // A forced algorithm must be the one that ran.
    if let Some((_, algo)) = env.iter().find(|(k, _)| *k == "RAILCC_ALGO") {
        for o in &outs {
            assert!(
                o.stdout.contains(&format!("by {algo}")),
                "RAILCC_ALGO={algo} did not take effect on rank {}: {}",
                o.rank,
                o.stdout
            );
        }
    }
}

#[test]
fn every_collective_2_ranks() {
    every_collective(2, &[]);
}

#[test]
fn every_collective_3_ranks_ring_small_chunks() {
    // Forced ring with 4 KiB chunks and one stream: pipelining paths at small sizes.
    every_collective(
        3,
        &[
            ("RAILCC_ALGO", "ring"),
            ("RAILCC_CHUNK_BYTES", "4096"),
            ("RAILCC_NSOCKS_PER_PEER", "1"),
        ],
    );
}

#[test]
fn every_collective_4_ranks_striped() {
    // Four streams per peer and a small stripe threshold: messages split over streams.
    every_collective(
        4,
        &[
            ("RAILCC_NSOCKS_PER_PEER", "4"),
            ("RAILCC_STRIPE_MIN_BYTES", "1024"),
        ],
    );
}

#[test]
fn every_collective_8_ranks() {
    every_collective(8, &[]);
}

#[test]
fn all_reduce_by_tree_and_recursive_doubling_over_sockets() {
    // Non-powers of two: 5 ranks fold one pair for recursive doubling; 6 mirror the trees.
    every_collective(5, &[("RAILCC_ALGO", "rdouble")]);
    every_collective(
        6,
        &[("RAILCC_ALGO", "tree"), ("RAILCC_CHUNK_BYTES", "8192")],
    );
}

fn expect_all_fail(outs: &[RankOutcome], needle: &str) {
    railcc_tests::expect_all_fail(outs, needle, None);
}

#[test]
fn counts_that_differ_are_an_error_on_every_rank() {
    for n in [2, 4] {
        let outs = run_job(
            EXE,
            "mismatch-count",
            n,
            &(0..n).collect::<Vec<_>>(),
            &[("RAILCC_TIMEOUT_MS", "10000")],
            Duration::from_secs(60),
        );
        expect_all_fail(&outs, "count differs");
        every_rank_names(&outs, "count differs");
    }
}

/// Mismatches are caught from the message headers, so every rank fails promptly (never at
/// the 10 s deadline) and names the mismatch, itself or through the first failure it was told.
fn every_rank_names(outs: &[RankOutcome], needle: &str) {
    railcc_tests::expect_all_fail(outs, needle, Some(Duration::from_secs(5)));
    for o in outs {
        assert!(o.stdout.contains(needle), "rank {}: {}", o.rank, o.stdout);
    }
}

#[test]
fn dtypes_that_differ_are_an_error_on_every_rank() {
    let outs = run_job(
        EXE,
        "mismatch-dtype",
        3,
        &[0, 1, 2],
        &[("RAILCC_TIMEOUT_MS", "10000")],
        Duration::from_secs(60),
    );
    expect_all_fail(&outs, "dtype differs");
    every_rank_names(&outs, "dtype differs");
}

#[test]
fn a_barrier_waits_for_the_last_rank() {
    for n in [2, 3, 5] {
        let outs = run_job(
            EXE,
            "barrier-late",
            n,
            &(0..n).collect::<Vec<_>>(),
            &[],
            Duration::from_secs(60),
        );
        all_ok(&outs);
    }
}

#[test]
fn root_out_of_range_is_an_error() {
    let outs = run_job(EXE, "bad-root", 2, &[0, 1], &[], Duration::from_secs(60));
    expect_all_fail(&outs, "root 2 out of range for 2 ranks");
    assert!(outs.iter().all(|o| o.stdout.contains("invalid argument")));
}

#[test]
fn short_buffer_is_an_error() {
    let outs = run_job(
        EXE,
        "short-buffer",
        2,
        &[0, 1],
        &[],
        Duration::from_secs(60),
    );
    expect_all_fail(&outs, "receive buffer holds 7992 bytes");
}

#[test]
fn registered_buffers_3_ranks() {
    let outs = run_job(
        EXE,
        "registered",
        3,
        &[0, 1, 2],
        &[],
        Duration::from_secs(120),
    );
    all_ok(&outs);
}

#[test]
fn gpu_memory_registration_is_refused_over_tcp() {
    // GPUDirect needs RDMA; over TCP the host would read device memory, so the communicator
    // refuses the registration (the RDMA side of this runs in the Soft-RoCE VM test).
    let outs = run_job(
        EXE,
        "dmabuf-refused",
        2,
        &[0, 1],
        &[],
        Duration::from_secs(60),
    );
    all_ok(&outs);
    assert!(outs.iter().all(|o| o.stdout.contains("only over RDMA")));
}

#[test]
fn a_rank_that_never_arrives_is_named() {
    // Rank 2 of 3 is never started: the others time out with its number, quickly.
    let outs = run_job(
        EXE,
        "barrier",
        3,
        &[0, 1],
        &[("RAILCC_TIMEOUT_MS", "1500")],
        Duration::from_secs(30),
    );
    for o in &outs {
        assert!(!o.success);
        assert!(
            o.stdout.contains("timeout") && o.stdout.contains("rank(s) 2 never reached"),
            "rank {}: {}",
            o.rank,
            o.stdout
        );
        assert!(o.elapsed < Duration::from_secs(10), "took {:?}", o.elapsed);
    }
}

#[test]
fn strangers_at_the_bootstrap_port_are_refused_and_the_job_completes() {
    use railcc_core::bootstrap::{RootServer, UniqueId};
    use std::io::{Read, Write};
    let root = RootServer::start("127.0.0.1:0".parse().unwrap(), Duration::from_secs(30)).unwrap();
    let addr = root.id.root;
    // Strangers: one with the wrong secret, one speaking HTTP, one that connects and stalls.
    let wrong = UniqueId {
        root: addr,
        secret: railcc_core::auth::Secret([9; 16]),
    };
    let t = std::thread::spawn(move || {
        let mut refused = 0;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut s = std::net::TcpStream::connect(wrong.root).unwrap();
        if railcc_core::auth::prove_client(&mut s, &wrong.secret, deadline).is_err() {
            refused += 1;
        }
        let mut h = std::net::TcpStream::connect(addr).unwrap();
        let _ = h.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        let mut buf = [0u8; 64];
        h.set_read_timeout(Some(Duration::from_secs(6))).unwrap();
        // Refused means closed (EOF or reset), not a read that timed out on a held connection.
        let closed = match h.read(&mut buf) {
            Ok(n) => n == 0,
            Err(e) => matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
            ),
        };
        if closed {
            refused += 1;
        }
        let _stall = std::net::TcpStream::connect(addr).unwrap();
        std::thread::sleep(Duration::from_millis(500));
        refused
    });
    std::thread::sleep(Duration::from_millis(200));
    let outs = run_job_with_id(
        EXE,
        "barrier",
        3,
        &[0, 1, 2],
        &[],
        Duration::from_secs(60),
        &root.id.to_string(),
    );
    all_ok(&outs);
    assert_eq!(t.join().unwrap(), 2, "both strangers must be refused");
}

#[test]
fn forced_rdma_without_a_usable_port_is_a_clear_error() {
    // Machines with an RDMA port are checked in the VM (tests/rdma-vm/rdma.sh); here there
    // is none.
    if !railcc_transport_rdma::device::list().is_empty() {
        println!("SKIP: this machine has RDMA ports");
        return;
    }
    let outs = run_job(
        EXE,
        "all",
        2,
        &[0, 1],
        &[("RAILCC_TRANSPORT", "rdma")],
        Duration::from_secs(60),
    );
    expect_all_fail(&outs, "no usable RDMA port");
    assert!(outs
        .iter()
        .all(|o| o.stdout.contains("RAILCC_TRANSPORT=rdma") && o.stdout.contains("unsupported")));
}

#[test]
fn an_ib_hca_that_names_no_port_is_an_error_on_every_rank() {
    // NCCL_IB_HCA feeds RAILCC_IB_HCA; "auto" does not fall back to TCP without a word.
    let outs = run_job(
        EXE,
        "all",
        2,
        &[0, 1],
        &[("NCCL_IB_HCA", "=no-such-hca:1")],
        Duration::from_secs(60),
    );
    expect_all_fail(&outs, "selects no RDMA port on rank(s) [0, 1]");
    assert!(
        outs.iter()
            .all(|o| o.stdout.contains("ports found:") && o.stdout.contains("invalid argument")),
        "{:?}",
        outs.iter().map(|o| &o.stdout).collect::<Vec<_>>()
    );
}
