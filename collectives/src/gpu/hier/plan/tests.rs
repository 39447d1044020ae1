//! The hierarchical plans on the host: every rank's steps run in lockstep over host memory,
//! each local or cross step computed by the reference over the ranks it spans, and every
//! rank's receive buffer compared with the reference for the whole call. Many host x GPU
//! shapes, rank layouts (host-major, interleaved, shuffled), counts with and without a
//! remainder, roots, in place and out of place.

use super::*;
use crate::reference::{decode, expected, fill_input};
use railcc_core::DataType;

/// One rank's memory: arenas 0 (send, or the in-place backing), 1 (receive), 2 (scratch),
/// and where the send and receive buffers start (bytes).
struct Mem {
    arenas: [Vec<u8>; 3],
    send: (usize, usize),
    recv: (usize, usize),
}

impl Mem {
    fn loc(&self, at: At, es: usize) -> (usize, usize) {
        let (arena, base) = match at.buf {
            Buf::Send => self.send,
            Buf::Recv => self.recv,
            Buf::Scratch => (2, 0),
        };
        (arena, base + at.off * es)
    }

    fn read(&self, at: At, elems: usize, es: usize) -> Vec<u8> {
        let (a, o) = self.loc(at, es);
        let arena = &self.arenas[a];
        assert!(
            o + elems * es <= arena.len(),
            "read past {:?}: {} + {} > {}",
            at.buf,
            o,
            elems * es,
            arena.len()
        );
        arena[o..o + elems * es].to_vec()
    }

    fn write(&mut self, at: At, bytes: &[u8], es: usize) {
        let (a, o) = self.loc(at, es);
        let arena = &mut self.arenas[a];
        assert!(o + bytes.len() <= arena.len(), "write past {:?}", at.buf);
        arena[o..o + bytes.len()].copy_from_slice(bytes);
    }
}

/// Runs one collective step among `members` (their step `c`s must agree but for buffers).
fn run_coll(mems: &mut [Mem], members: &[usize], cs: &[Coll], dt: DataType) {
    let es = dt.size();
    let c0 = cs[0];
    for c in cs {
        assert_eq!(
            (c.coll, c.count, c.op, c.root),
            (c0.coll, c0.count, c0.op, c0.root),
            "ranks {members:?} disagree on a step"
        );
    }
    let sub = CollArgs {
        coll: c0.coll,
        nranks: members.len(),
        count: c0.count,
        dtype: dt,
        op: c0.op,
        root: c0.root,
    };
    let inputs: Vec<Vec<u8>> = members
        .iter()
        .zip(cs)
        .map(|(&r, c)| {
            // Every member's send buffer must exist (the runner maps it on every rank), but a
            // broadcast reads only the root's.
            let bytes = mems[r].read(c.send, sub.send_elems(), es);
            let send_here = c0.coll != CollKind::Broadcast
                || sub.root == members.iter().position(|&x| x == r).unwrap_or(0);
            if send_here {
                bytes
            } else {
                vec![0; sub.send_elems() * es]
            }
        })
        .collect();
    let outs: Vec<Vec<u8>> = members
        .iter()
        .zip(cs)
        .enumerate()
        .map(|(i, (&r, c))| {
            let prior = mems[r].read(c.recv, sub.recv_elems(), es);
            expected(&sub, &inputs, i, &prior)
        })
        .collect();
    for ((&r, c), out) in members.iter().zip(cs).zip(outs) {
        mems[r].write(c.recv, &out, es);
    }
}

/// Runs the plans of every rank of `lay` for `a` and checks each receive buffer.
fn check(a: &CollArgs, lay: &Layout, in_place: bool, small_bytes: usize) {
    let dt = a.dtype;
    let es = dt.size();
    let n = lay.nranks();
    let plans: Vec<HierPlan> = (0..n).map(|r| plan(a, lay, r, small_bytes)).collect();
    let inputs: Vec<Vec<u8>> = (0..n).map(|r| fill_input(a, r, 7)).collect();
    let prior: Vec<u8> = (0..a.recv_elems() * es)
        .map(|i| (i * 7 + 3) as u8)
        .collect();
    let mut mems: Vec<Mem> = (0..n)
        .map(|r| {
            let scratch = vec![0xee; plans[r].scratch * es];
            if in_place {
                let backing = a.in_place_backing(r, &inputs[r], &prior);
                let (s, rv, _) = a.in_place_ranges(r);
                Mem {
                    arenas: [backing, Vec::new(), scratch],
                    send: (0, s.start),
                    recv: (0, rv.start),
                }
            } else {
                // A broadcast's send buffer may be NULL on every rank but the root (NCCL's).
                let null_send = a.coll == CollKind::Broadcast && r != a.root;
                let send = if null_send {
                    Vec::new()
                } else {
                    inputs[r].clone()
                };
                Mem {
                    arenas: [send, prior.clone(), scratch],
                    send: (0, 0),
                    recv: (1, 0),
                }
            }
        })
        .collect();
    // What each receive buffer held before the call (in place: the input over `prior`).
    let before: Vec<Vec<u8>> = mems
        .iter()
        .map(|m| m.read(at(Buf::Recv, 0), a.recv_elems(), es))
        .collect();
    let nsteps = plans[0].steps.len();
    for p in &plans {
        assert_eq!(p.steps.len(), nsteps, "ranks' plans differ in length");
    }
    for i in 0..nsteps {
        let step = |r: usize| plans[r].steps[i];
        // Copies are the rank's own; collectives gather their members.
        for (r, m) in mems.iter_mut().enumerate() {
            if let Step::Copy { src, dst, count } = step(r) {
                let b = m.read(src, count, es);
                m.write(dst, &b, es);
            }
        }
        for (h, rs) in lay.hosts.iter().enumerate() {
            let cs: Vec<Coll> = rs
                .iter()
                .filter_map(|&r| match step(r) {
                    Step::Local { c, hosts } if hosts.has(h) => Some(c),
                    _ => None,
                })
                .collect();
            if !cs.is_empty() {
                assert_eq!(cs.len(), rs.len(), "host {h}: some ranks skip a local step");
                run_coll(&mut mems, rs, &cs, dt);
            }
        }
        for l in 0..lay.local() {
            let rs: Vec<usize> = lay.hosts.iter().map(|x| x[l]).collect();
            let cs: Vec<Coll> = rs
                .iter()
                .filter_map(|&r| match step(r) {
                    Step::Cross { c, group } if group.is_none_or(|g| g == l) => Some(c),
                    _ => None,
                })
                .collect();
            if !cs.is_empty() {
                assert_eq!(
                    cs.len(),
                    rs.len(),
                    "group {l}: some ranks skip a cross step"
                );
                run_coll(&mut mems, &rs, &cs, dt);
            }
        }
    }
    for r in 0..n {
        let want = expected(a, &inputs, r, &before[r]);
        let got = mems[r].read(at(Buf::Recv, 0), a.recv_elems(), es);
        if a.op == ReduceOp::Avg {
            let (w, g) = (decode(dt, &want), decode(dt, &got));
            let tol = if dt.size() >= 4 { 1e-5 } else { 2e-2 };
            for (j, (x, y)) in w.iter().zip(&g).enumerate() {
                assert!(
                    (x - y).abs() <= tol * x.abs().max(1.0),
                    "{a:?} {lay:?} in_place={in_place} rank {r} elem {j}: {y} != {x}"
                );
            }
        } else {
            assert!(
                want == got,
                "{a:?} {lay:?} in_place={in_place} rank {r}: {:?} != {:?}",
                decode(dt, &got),
                decode(dt, &want)
            );
        }
    }
}

/// Host-major, interleaved and a fixed shuffle of H x L ranks.
fn layouts(nh: usize, nl: usize) -> Vec<Layout> {
    let n = nh * nl;
    let major = |f: &dyn Fn(usize, usize) -> usize| {
        let ids: Vec<Vec<u8>> = (0..n).map(|r| vec![f(r, 0) as u8]).collect();
        Layout::from_host_ids(&ids).expect("even hosts")
    };
    let mut perm: Vec<usize> = (0..n).collect();
    let mut x = 12345u64;
    for i in (1..n).rev() {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        perm.swap(i, (x >> 33) as usize % (i + 1));
    }
    vec![
        major(&|r, _| r / nl),
        major(&|r, _| r % nh),
        major(&|r, _| perm[r] / nl),
    ]
}

#[test]
fn every_plan_matches_the_reference() {
    let colls = [
        CollKind::AllReduce,
        CollKind::ReduceScatter,
        CollKind::AllGather,
        CollKind::Broadcast,
        CollKind::Reduce,
    ];
    let mut runs = 0;
    for (nh, nl) in [(1, 1), (1, 3), (2, 1), (2, 2), (3, 2), (2, 4), (4, 3)] {
        for lay in layouts(nh, nl) {
            let n = nh * nl;
            for coll in colls {
                for count in [1, 2, 5, 12, 13] {
                    for (dt, op) in [
                        (DataType::I32, ReduceOp::Sum),
                        (DataType::U8, ReduceOp::Prod),
                        (DataType::F32, ReduceOp::Max),
                        (DataType::Bf16, ReduceOp::Min),
                        (DataType::F32, ReduceOp::Avg),
                        (DataType::F16, ReduceOp::Avg),
                    ] {
                        for root in [0, n - 1, n / 2] {
                            let a = CollArgs {
                                coll,
                                nranks: n,
                                count,
                                dtype: dt,
                                op,
                                root,
                            };
                            if !takes(&a) {
                                continue;
                            }
                            // 24 bytes: some counts go whole (small), the rest split.
                            for (in_place, small) in
                                [(false, 0), (true, 0), (false, 24), (true, 24)]
                            {
                                check(&a, &lay, in_place, small);
                                runs += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(runs > 1000, "only {runs} runs");
}

#[test]
fn integer_averages_and_other_collectives_are_not_taken() {
    let a = |coll, dtype, op| CollArgs {
        coll,
        nranks: 4,
        count: 8,
        dtype,
        op,
        root: 0,
    };
    assert!(!takes(&a(
        CollKind::AllReduce,
        DataType::I32,
        ReduceOp::Avg
    )));
    assert!(!takes(&a(CollKind::AllToAll, DataType::F32, ReduceOp::Sum)));
    assert!(takes(&a(CollKind::AllReduce, DataType::F32, ReduceOp::Avg)));
    assert!(takes(&a(CollKind::Broadcast, DataType::U8, ReduceOp::Sum)));
}

#[test]
fn layouts_need_even_hosts() {
    let ids = |v: &[u8]| v.iter().map(|&x| vec![x]).collect::<Vec<_>>();
    assert_eq!(Layout::from_host_ids(&ids(&[0, 1, 0])), None);
    let l = Layout::from_host_ids(&ids(&[5, 9, 5, 9])).expect("even");
    assert_eq!(l.hosts, vec![vec![0, 2], vec![1, 3]]);
    assert_eq!(l.position(3), Some((1, 1)));
}

#[test]
fn network_bytes_are_split_over_the_local_ranks() {
    // 2 hosts x 4: each rank's cross all-reduce moves a quarter of the call.
    let ids: Vec<Vec<u8>> = (0..8).map(|r| vec![(r / 4) as u8]).collect();
    let lay = Layout::from_host_ids(&ids).expect("even");
    let a = CollArgs {
        coll: CollKind::AllReduce,
        nranks: 8,
        count: 1 << 20,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        root: 0,
    };
    for r in 0..8 {
        let cross: usize = plan(&a, &lay, r, 0)
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Cross { c, .. } => Some(c.count),
                _ => None,
            })
            .sum();
        assert_eq!(cross, a.count / 4, "rank {r}");
    }
}

#[test]
fn small_calls_run_whole_in_two_steps() {
    // 2 hosts x 2: an 8-byte all_reduce is one local and one cross all-reduce of both
    // elements (not three steps over halves); above the threshold it splits again.
    let ids: Vec<Vec<u8>> = (0..4).map(|r| vec![(r / 2) as u8]).collect();
    let lay = Layout::from_host_ids(&ids).expect("even");
    for (coll, root) in [(CollKind::AllReduce, 0), (CollKind::Broadcast, 3)] {
        let a = CollArgs {
            coll,
            nranks: 4,
            count: 2,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            root,
        };
        for r in 0..4 {
            let small = plan(&a, &lay, r, 8).steps;
            let kinds: Vec<bool> = small
                .iter()
                .map(|s| matches!(s, Step::Cross { .. }))
                .collect();
            let want = if coll == CollKind::AllReduce {
                vec![false, true]
            } else {
                vec![true, false]
            };
            assert_eq!(kinds, want, "{coll:?} rank {r}: {small:?}");
            for s in &small {
                if let Step::Cross { c, .. } | Step::Local { c, .. } = s {
                    assert_eq!(c.count, 2, "{coll:?} rank {r}: the whole buffer");
                }
            }
            assert!(
                plan(&a, &lay, r, 4).steps.len() >= 3,
                "{coll:?} rank {r}: split above 4 bytes"
            );
        }
    }
}

#[test]
fn only_small_all_reduces_skip_the_hierarchy() {
    let a = |coll, count| CollArgs {
        coll,
        nranks: 4,
        count,
        dtype: DataType::F32,
        op: ReduceOp::Sum,
        root: 0,
    };
    // Below 32 KiB of f32: flat; at it: the hierarchy; 0: never flat.
    assert!(flat(&a(CollKind::AllReduce, 2), 32 * 1024));
    assert!(flat(&a(CollKind::AllReduce, 8 * 1024 - 1), 32 * 1024));
    assert!(!flat(&a(CollKind::AllReduce, 8 * 1024), 32 * 1024));
    assert!(!flat(&a(CollKind::AllReduce, 2), 0));
    assert!(!flat(&a(CollKind::Broadcast, 2), 32 * 1024));
    // Past FLAT_MAX_RANKS ranks: the hierarchy whatever the size.
    let many = CollArgs {
        nranks: FLAT_MAX_RANKS + 1,
        ..a(CollKind::AllReduce, 2)
    };
    assert!(!flat(&many, 32 * 1024));
    assert!(flat(
        &CollArgs {
            nranks: FLAT_MAX_RANKS,
            ..many
        },
        32 * 1024
    ));
}
