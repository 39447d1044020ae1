//! The hierarchical plans (`plan/hier.rs`: all-reduce, all-gather, reduce-scatter,
//! broadcast, reduce) under the simulator against the reference,
//! for many host x rank-per-host shapes, with ranks spread over hosts in order and
//! interleaved (so host order differs from rank order), every dtype and op, in place and out
//! of place, several chunk sizes and windows. The simulator fails a plan that overwrites a
//! region a pending send still reads, or whose steps wait on themselves.

use railcc_collectives::plan::{build_ordered, host_order, Algo, CollArgs, Op, PlanOpts};
use railcc_collectives::reference::{expected, fill_input};
use railcc_collectives::sim;
use railcc_core::call::CollKind;
use railcc_core::{DataType, ReduceOp};

fn check(a: CollArgs, local: usize, o: PlanOpts, order: &[usize], seed: u64) {
    let p = a.nranks;
    let inputs: Vec<Vec<u8>> = (0..p).map(|r| fill_input(&a, r, seed)).collect();
    let prior: Vec<Vec<u8>> = (0..p)
        .map(|r| vec![0xA5 ^ r as u8; a.recv_elems() * a.dtype.size()])
        .collect();
    let prior: Vec<Vec<u8>> = if o.in_place {
        (0..p)
            .map(|r| a.in_place_backing(r, &inputs[r], &prior[r])[a.recv_range(r, true)].to_vec())
            .collect()
    } else {
        prior
    };
    let algo = Algo::Hier(local);
    let out = sim::run_ordered(&a, algo, &o, &inputs, &prior, seed, order)
        .unwrap_or_else(|e| panic!("{a:?} local {local} {o:?} order {order:?}: {e}"));
    for r in 0..p {
        let want = expected(&a, &inputs, r, &prior[r]);
        assert!(
            out[r] == want,
            "{a:?} local {local} {o:?} order {order:?}: rank {r} differs from the reference"
        );
    }
}

/// The collectives with a hierarchical plan.
const COLLS: [CollKind; 5] = [
    CollKind::AllReduce,
    CollKind::AllGather,
    CollKind::ReduceScatter,
    CollKind::Broadcast,
    CollKind::Reduce,
];

#[test]
fn hierarchical_plans_match_the_reference_for_many_shapes() {
    let mut cases = 0;
    for hosts in 1..=4usize {
        for local in 1..=4usize {
            let p = hosts * local;
            // Ranks on hosts in blocks (0 0 1 1) and interleaved (0 1 0 1).
            let blocked: Vec<usize> = (0..p).map(|r| r / local).collect();
            let spread: Vec<usize> = (0..p).map(|r| r % hosts).collect();
            for (li, labels) in [blocked, spread].iter().enumerate() {
                let order = host_order(labels);
                for (i, count) in [0usize, 1, 5, 37, 1000, 4099].into_iter().enumerate() {
                    let dt = DataType::ALL[(i + li + p) % DataType::ALL.len()];
                    let op = ReduceOp::ALL[(i + hosts + local) % ReduceOp::ALL.len()];
                    for (in_place, chunk, window) in [(false, 64, 4), (true, 7, 1), (false, 19, 2)]
                    {
                        for coll in COLLS {
                            let a = CollArgs {
                                coll,
                                nranks: p,
                                count,
                                dtype: dt,
                                op,
                                root: (i * 5 + 3) % p,
                            };
                            let o = PlanOpts {
                                chunk_elems: chunk,
                                window,
                                in_place,
                            };
                            check(a, local, o, &order, (i * 31 + p) as u64);
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(cases, 16 * 2 * 6 * 3 * COLLS.len());
}

#[test]
fn every_op_and_dtype_on_two_hosts_of_three() {
    let labels = [0usize, 1, 0, 1, 0, 1];
    let order = host_order(&labels);
    for dt in DataType::ALL {
        for op in ReduceOp::ALL {
            for (in_place, coll) in [false, true]
                .into_iter()
                .flat_map(|i| COLLS.map(|c| (i, c)))
            {
                let a = CollArgs {
                    coll,
                    nranks: 6,
                    count: 301,
                    dtype: dt,
                    op,
                    root: 4,
                };
                let o = PlanOpts {
                    chunk_elems: 16,
                    window: 2,
                    in_place,
                };
                check(a, 3, o, &order, 11);
            }
        }
    }
}

/// Between hosts each rank sends 2 (H-1)/H of its 1/L share: L times less than a ring's
/// host-edge rank, and every rank sends some (each local index has its own inter-host ring).
#[test]
fn inter_host_bytes_are_split_over_the_local_ranks() {
    let (hosts, local, n) = (2usize, 4usize, 4096usize);
    let p = hosts * local;
    let labels: Vec<usize> = (0..p).map(|r| r / local).collect();
    let order = host_order(&labels);
    let a = CollArgs {
        coll: CollKind::AllReduce,
        nranks: p,
        count: n,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        root: 0,
    };
    let o = PlanOpts {
        chunk_elems: 128,
        window: 4,
        in_place: false,
    };
    let cross = |algo: Algo, r: usize| -> usize {
        build_ordered(&a, r, algo, &o, &order)
            .steps
            .iter()
            .filter_map(|s| match &s.op {
                Op::Send { peer, src } if labels[*peer] != labels[r] => Some(src.len),
                _ => None,
            })
            .sum()
    };
    for r in 0..p {
        assert_eq!(cross(Algo::Hier(local), r), n / local, "rank {r}");
    }
    // The ring: one rank per host carries all of it across.
    let ring: Vec<usize> = (0..p).map(|r| cross(Algo::Ring, r)).collect();
    assert_eq!(ring.iter().max(), Some(&(2 * (p - 1) * n / p)));
    assert_eq!(ring.iter().filter(|&&b| b > 0).count(), hosts);
}
