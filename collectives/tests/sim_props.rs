//! Property tests: every collective's plans, run by the simulator for every rank, agree bit for
//! bit with the reference, for 1 to 33 ranks, awkward counts, every dtype and op, in place and
//! out of place, and a range of chunk sizes and windows.

use proptest::prelude::*;
use railcc_collectives::plan::{Algo, CollArgs, PlanOpts};
use railcc_collectives::reference::{expected, fill_input};
use railcc_collectives::sim;
use railcc_core::call::CollKind;
use railcc_core::{DataType, ReduceOp};

const COLLS: [CollKind; 10] = [
    CollKind::AllReduce,
    CollKind::AllReduce, // four times: ring, direct, recursive doubling, double binary tree
    CollKind::AllReduce,
    CollKind::AllReduce,
    CollKind::AllGather,
    CollKind::ReduceScatter,
    CollKind::Broadcast,
    CollKind::Reduce,
    CollKind::AllToAll,
    CollKind::SendRecv,
];

/// The all-reduce algorithm for entry `i` of COLLS (ring for every other collective).
fn algo_of(i: usize) -> Algo {
    match i {
        1 => Algo::Direct,
        2 => Algo::RecursiveDoubling,
        3 => Algo::Tree,
        _ => Algo::Ring,
    }
}

fn check(a: CollArgs, algo: Algo, o: PlanOpts, seed: u64) -> Result<(), TestCaseError> {
    let identity: Vec<usize> = (0..a.nranks).collect();
    check_ordered(a, algo, o, seed, &identity)
}

/// As `check`, with rings through the ranks in `order` (hosts grouped, as a job with several
/// ranks per host runs them).
fn check_ordered(
    a: CollArgs,
    algo: Algo,
    o: PlanOpts,
    seed: u64,
    order: &[usize],
) -> Result<(), TestCaseError> {
    let p = a.nranks;
    let inputs: Vec<Vec<u8>> = (0..p).map(|r| fill_input(&a, r, seed)).collect();
    // Receive buffers start as a recognisable pattern so unwritten output shows up.
    let prior: Vec<Vec<u8>> = (0..p)
        .map(|r| vec![0xA5 ^ r as u8; a.recv_elems() * a.dtype.size()])
        .collect();
    let prior = if o.in_place {
        // In place, the receive buffer overlaps the input: its prior contents are the input's
        // where they overlap (rooted reduce leaves non-root buffers as they were).
        (0..p)
            .map(|r| a.in_place_backing(r, &inputs[r], &prior[r])[a.recv_range(r, true)].to_vec())
            .collect()
    } else {
        prior
    };
    let out = sim::run_ordered(&a, algo, &o, &inputs, &prior, seed, order)
        .map_err(|e| TestCaseError::fail(format!("{a:?} {algo:?} {o:?} order {order:?}: {e}")))?;
    for r in 0..p {
        let want = expected(&a, &inputs, r, &prior[r]);
        if out[r] != want {
            let es = a.dtype.size();
            let first = (0..want.len() / es)
                .find(|i| out[r][i * es..(i + 1) * es] != want[i * es..(i + 1) * es]);
            return Err(TestCaseError::fail(format!(
                "{a:?} {algo:?} {o:?} order {order:?}: rank {r} differs first at element {first:?}"
            )));
        }
    }
    Ok(())
}

fn count_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        Just(1usize),
        prop::sample::select(vec![2usize, 3, 5, 7, 13, 31, 97, 257, 1021, 4093]),
        1usize..3000,
        Just(262_147usize), // about a megabyte of f32, not a multiple of anything
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn plans_match_reference(
        coll_i in 0usize..COLLS.len(),
        nranks in 1usize..=33,
        count in count_strategy(),
        dt in prop::sample::select(DataType::ALL.to_vec()),
        op in prop::sample::select(ReduceOp::ALL.to_vec()),
        root_seed in 0usize..1000,
        in_place in any::<bool>(),
        chunk in prop::sample::select(vec![1usize, 3, 64, 1000, 65536]),
        window in 1usize..6,
        seed in any::<u64>(),
    ) {
        let coll = COLLS[coll_i];
        // Beyond 16 ranks, small counts only: the simulator's cost grows with ranks x count.
        let count = if nranks > 16 { count.min(5000) } else { count };
        let algo = algo_of(coll_i);
        let a = CollArgs { coll, nranks, count, dtype: dt, op, root: root_seed % nranks };
        // Keep the simulated step count manageable: at most ~64 chunks per segment.
        let chunk_elems = chunk.max(count / 64).max(1);
        let o = PlanOpts { chunk_elems, window, in_place };
        check(a, algo, o, seed)?;
    }

    #[test]
    fn plans_in_host_order_match_reference(
        coll_i in 0usize..COLLS.len(),
        nranks in 2usize..=17,
        count in count_strategy(),
        dt in prop::sample::select(DataType::ALL.to_vec()),
        op in prop::sample::select(ReduceOp::ALL.to_vec()),
        root_seed in 0usize..1000,
        in_place in any::<bool>(),
        nhosts in 2usize..5,
        seed in any::<u64>(),
    ) {
        // Ranks dealt round-robin to hosts (the worst case for a rank-order ring).
        let hosts: Vec<usize> = (0..nranks).map(|r| r % nhosts).collect();
        let order = railcc_collectives::plan::host_order(&hosts);
        let coll = COLLS[coll_i];
        let count = count.min(20_000);
        let a = CollArgs { coll, nranks, count, dtype: dt, op, root: root_seed % nranks };
        let o = PlanOpts { chunk_elems: (count / 16).max(1), window: 2, in_place };
        check_ordered(a, algo_of(coll_i), o, seed, &order)?;
    }
}

#[test]
fn barrier_plans_complete() {
    for p in 1..=17 {
        let a = CollArgs {
            coll: CollKind::Barrier,
            nranks: p,
            count: 0,
            dtype: DataType::U8,
            op: ReduceOp::Sum,
            root: 0,
        };
        let o = PlanOpts {
            chunk_elems: 1,
            window: 1,
            in_place: false,
        };
        let inputs = vec![Vec::new(); p];
        sim::run(&a, Algo::Dissemination, &o, &inputs, &inputs, 7).unwrap();
    }
}

#[test]
fn every_dtype_op_and_rank_count_small() {
    // Exhaustive over the small space, on top of the random search above.
    for (coll_i, &coll) in COLLS.iter().enumerate() {
        for p in 1..=9 {
            for dt in DataType::ALL {
                for op in ReduceOp::ALL {
                    for in_place in [false, true] {
                        if !matches!(
                            coll,
                            CollKind::AllReduce | CollKind::ReduceScatter | CollKind::Reduce
                        ) && op != ReduceOp::Sum
                        {
                            continue;
                        }
                        let algo = algo_of(coll_i);
                        let a = CollArgs {
                            coll,
                            nranks: p,
                            count: 11,
                            dtype: dt,
                            op,
                            root: p / 2,
                        };
                        let o = PlanOpts {
                            chunk_elems: 2,
                            window: 2,
                            in_place,
                        };
                        check(a, algo, o, 42).unwrap();
                    }
                }
            }
        }
    }
}
