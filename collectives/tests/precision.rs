//! Precision: every collective's plans, run by the simulator with the real host reduction
//! kernels on random inputs of every dtype, stay within the error bound of
//! `railcc_collectives::precision` (integers exact), for every algorithm, dtype, op and rank
//! count; and f16/bf16 sums whose digits plain storage-type accumulation loses come out right
//! where one step reduces several inputs.

use proptest::prelude::*;
use railcc_collectives::plan::{Algo, CollArgs, PlanOpts};
use railcc_collectives::precision::{count_wrong, fill_input, Fill};
use railcc_collectives::sim;
use railcc_core::call::CollKind;
use railcc_core::{DataType, ReduceOp};

/// (collective, algorithm) pairs: every all-reduce algorithm, the ring for the rest.
const CASES: [(CollKind, Algo); 10] = [
    (CollKind::AllReduce, Algo::Ring),
    (CollKind::AllReduce, Algo::Direct),
    (CollKind::AllReduce, Algo::RecursiveDoubling),
    (CollKind::AllReduce, Algo::Tree),
    (CollKind::AllGather, Algo::Ring),
    (CollKind::ReduceScatter, Algo::Ring),
    (CollKind::Broadcast, Algo::Ring),
    (CollKind::Reduce, Algo::Ring),
    (CollKind::AllToAll, Algo::Ring),
    (CollKind::SendRecv, Algo::Ring),
];

/// Wrong elements over every rank's receive buffer.
fn wrong(a: CollArgs, algo: Algo, o: PlanOpts, seed: u64) -> Result<u64, String> {
    let p = a.nranks;
    let inputs: Vec<Vec<u8>> = (0..p)
        .map(|r| fill_input(Fill::Random, &a, r, seed))
        .collect();
    let prior: Vec<Vec<u8>> = (0..p)
        .map(|r| {
            let blank = vec![0x7E; a.recv_elems() * a.dtype.size()];
            if o.in_place {
                a.in_place_backing(r, &inputs[r], &blank)[a.recv_range(r, true)].to_vec()
            } else {
                blank
            }
        })
        .collect();
    let out = sim::run(&a, algo, &o, &inputs, &prior, seed).map_err(|e| e.to_string())?;
    Ok((0..p)
        .map(|r| count_wrong(Fill::Random, &a, r, &out[r], seed))
        .sum())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn random_inputs_stay_within_the_bound(
        case in 0usize..CASES.len(),
        nranks in 1usize..=17,
        count in 1usize..2000,
        dt in prop::sample::select(DataType::ALL.to_vec()),
        op in prop::sample::select(ReduceOp::ALL.to_vec()),
        root_seed in 0usize..1000,
        in_place in any::<bool>(),
        chunk in prop::sample::select(vec![1usize, 7, 64, 1000]),
        seed in any::<u64>(),
    ) {
        let (coll, algo) = CASES[case];
        let a = CollArgs { coll, nranks, count, dtype: dt, op, root: root_seed % nranks };
        let o = PlanOpts { chunk_elems: chunk.max(count / 32).max(1), window: 2, in_place };
        let w = wrong(a, algo, o, seed).map_err(TestCaseError::fail)?;
        prop_assert_eq!(w, 0, "{:?} {:?} {:?}", a, algo, o);
    }
}

#[test]
fn every_dtype_op_algorithm_and_rank_count_small() {
    for (coll, algo) in CASES {
        for p in 1..=9 {
            for dt in DataType::ALL {
                for op in ReduceOp::ALL {
                    for in_place in [false, true] {
                        let a = CollArgs {
                            coll,
                            nranks: p,
                            count: 301,
                            dtype: dt,
                            op,
                            root: p / 2,
                        };
                        let o = PlanOpts {
                            chunk_elems: 16,
                            window: 2,
                            in_place,
                        };
                        assert_eq!(wrong(a, algo, o, 77), Ok(0), "{a:?} {algo:?} {o:?}");
                    }
                }
            }
        }
    }
}
