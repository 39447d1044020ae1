//! Issue 8: each kind of bad call gets its own clear error on every rank it concerns, with
//! no hang (every job has a time limit) and no panic.

use railcc_tests::{run_job, RankOutcome};
use std::time::Duration;

const EXE: &str = env!("CARGO_BIN_EXE_railcc-test-rank");

fn job(scenario: &str, n: usize) -> Vec<RankOutcome> {
    let outs = run_job(
        EXE,
        scenario,
        n,
        &(0..n).collect::<Vec<_>>(),
        &[("RAILCC_TIMEOUT_MS", "5000")],
        Duration::from_secs(30),
    );
    for o in &outs {
        println!("{scenario} rank {}: {}", o.rank, o.stdout.trim());
        assert!(
            !o.stderr.contains("panicked"),
            "{scenario}: rank {} panicked: {}",
            o.rank,
            o.stderr
        );
    }
    outs
}

/// Every rank fails; each names the disagreement (`needle`) or that a peer failed because of
/// it; and the rank that saw it first names it.
fn all_fail(outs: &[RankOutcome], needle: &str) {
    railcc_tests::expect_all_fail(outs, needle, Some(Duration::from_secs(5)));
}

#[test]
fn ops_that_differ_are_an_error_on_every_rank() {
    all_fail(
        &job("mismatch-op", 3),
        "reduction differs: peer used max, this rank sum",
    );
}

/// Each rank takes the other for the root, so both wait to receive and nothing is sent that
/// could carry the disagreement: both fail at the deadline (5 s here). The first to give up
/// says what to check; it also tells the other, which may fail with that first failure
/// (abort frames carry its start: "rank r never connected to this rank").
#[test]
fn roots_that_differ_fail_at_the_deadline_with_the_hint() {
    let outs = job("mismatch-root", 2);
    assert!(
        outs.iter().any(|o| o.stdout.contains("same root")),
        "no rank gave the hint: {outs:#?}"
    );
    for o in &outs {
        assert!(!o.success, "rank {}: {}", o.rank, o.stdout);
        assert!(
            o.stdout.contains("same root")
                || (o.stdout.contains("first failure") && o.stdout.contains("never connected")),
            "rank {}: {}",
            o.rank,
            o.stdout
        );
        assert!(
            o.elapsed < Duration::from_secs(10),
            "rank {}: {:?}",
            o.rank,
            o.elapsed
        );
    }
}

/// Either rank may see the other's header first: rank 0 (all_reduce) or rank 1 (all_gather)
/// names the disagreement, the other may only name the rank that gave up.
#[test]
fn collectives_that_differ_are_an_error_on_every_rank() {
    let outs = job("mismatch-collective", 2);
    all_fail(&outs, "called all_");
    railcc_tests::expect_one_names(
        &outs,
        &[
            "peer called all_gather where this rank called all_reduce",
            "peer called all_reduce where this rank called all_gather",
        ],
    );
}

#[test]
fn misaligned_buffers_are_refused_before_anything_moves() {
    let outs = job("misaligned", 2);
    for o in &outs {
        assert!(
            o.stdout.contains("not aligned for float"),
            "rank {}: {}",
            o.rank,
            o.stdout
        );
    }
}

#[test]
fn a_count_that_overflows_is_an_error() {
    let outs = job("count-overflow", 2);
    for o in &outs {
        assert!(
            !o.success && o.stdout.contains("overflows"),
            "rank {}: {}",
            o.rank,
            o.stdout
        );
    }
}

#[test]
fn a_send_to_self_without_its_receive_is_an_error() {
    let outs = job("send-to-self", 2);
    for o in &outs {
        assert!(
            !o.success && o.stdout.contains("self"),
            "rank {}: {}",
            o.rank,
            o.stdout
        );
    }
}

#[test]
fn a_peer_out_of_range_is_an_error() {
    let outs = job("peer-out-of-range", 2);
    for o in &outs {
        assert!(
            !o.success && o.stdout.contains("peer 5 out of range for 2 ranks"),
            "rank {}: {}",
            o.rank,
            o.stdout
        );
    }
}

#[test]
fn abort_from_another_thread_unblocks_a_receive_within_250_ms() {
    let outs = job("abort-while-blocked", 2);
    let r0 = &outs[0];
    assert!(r0.success, "{}", r0.stdout);
    assert!(r0.stdout.contains("after the abort"), "{}", r0.stdout);
}
