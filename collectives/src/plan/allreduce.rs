//! The all-reduce algorithms: ring (bandwidth), direct one-shot and recursive doubling
//! (latency), and the double binary tree (log-depth latency with full bandwidth at scale).
//! `Communicator::algo_for` chooses among them; each keeps the rules in the parent module.

use super::*;

pub(super) fn ring_all_reduce(a: &CollArgs, r: usize, o: &PlanOpts) -> Plan {
    let (p, n, ch) = (a.nranks, a.count, o.chunk_elems);
    if p == 1 {
        return single_rank(o, n, Algo::Ring);
    }
    let mut b = Builder::new(ch, o.window);
    let (next, prev) = ((r + 1) % p, (r + p - 1) % p);
    let seg = |i: usize| segment(n, p, i % p);
    let max_chunks = seg(0).1.div_ceil(ch.max(1));
    // producer[seg][chunk]: the step that last wrote Recv for that chunk.
    let mut producer: Vec<Vec<Option<usize>>> = (0..p).map(|_| vec![None; max_chunks]).collect();
    let mut readers: Vec<Vec<Vec<usize>>> = (0..p).map(|_| vec![Vec::new(); max_chunks]).collect();
    // Groups of `window` chunk indices run the whole ring (reduce-scatter, then all-gather)
    // before the next group, bounding scratch while keeping `window` chunks in flight per link.
    let w = o.window.max(1);
    for g in (0..max_chunks).step_by(w) {
        let group = g..(g + w).min(max_chunks);
        for s in 0..p - 1 {
            let (si, ri) = ((r + p - s) % p, (r + 2 * p - s - 1) % p);
            for c in group.clone() {
                if let Some((off, len)) = nth_chunk(seg(si).0, seg(si).1, ch, c) {
                    let src = if s == 0 { Buf::Send } else { Buf::Recv };
                    let st = b.push(
                        Op::Send {
                            peer: next,
                            src: Slice::new(src, off, len),
                        },
                        producer[si][c].into_iter().collect(),
                    );
                    readers[si][c].push(st);
                }
            }
            for c in group.clone() {
                if let Some((off, len)) = nth_chunk(seg(ri).0, seg(ri).1, ch, c) {
                    let dst = Slice::new(Buf::Recv, off, len);
                    let mine = Slice::new(Buf::Send, off, len);
                    let mut last = if o.in_place {
                        // The output holds our own input: stage the peer's chunk in scratch.
                        let (slot, incoming, rv) = b.recv_to_scratch(prev, len);
                        let mut deps = vec![rv];
                        deps.append(&mut readers[ri][c]);
                        let red = b.push(
                            Op::Reduce {
                                dst,
                                a: mine,
                                b: incoming,
                            },
                            deps,
                        );
                        b.release(slot, vec![rv, red]);
                        red
                    } else {
                        // Out of place: receive straight into the output and reduce there, which
                        // touches two buffers instead of three.
                        let deps = std::mem::take(&mut readers[ri][c]);
                        let rv = b.push(Op::Recv { peer: prev, dst }, deps);
                        b.push(
                            Op::Reduce {
                                dst,
                                a: dst,
                                b: mine,
                            },
                            vec![rv],
                        )
                    };
                    if s == p - 2 && a.op == ReduceOp::Avg {
                        last = b.push(Op::Divide { buf: dst }, vec![last]);
                    }
                    producer[ri][c] = Some(last);
                }
            }
        }
        for s in 0..p - 1 {
            let (si, ri) = ((r + 1 + p - s) % p, (r + p - s) % p);
            for c in group.clone() {
                if let Some((off, len)) = nth_chunk(seg(si).0, seg(si).1, ch, c) {
                    let st = b.push(
                        Op::Send {
                            peer: next,
                            src: Slice::new(Buf::Recv, off, len),
                        },
                        producer[si][c].into_iter().collect(),
                    );
                    readers[si][c].push(st);
                }
            }
            for c in group.clone() {
                if let Some((off, len)) = nth_chunk(seg(ri).0, seg(ri).1, ch, c) {
                    let mut deps: Vec<usize> = readers[ri][c].drain(..).collect();
                    deps.extend(producer[ri][c]);
                    producer[ri][c] = Some(b.push(
                        Op::Recv {
                            peer: prev,
                            dst: Slice::new(Buf::Recv, off, len),
                        },
                        deps,
                    ));
                }
            }
        }
    }
    b.finish(Algo::Ring)
}

/// Parent of `r` in the binary tree NCCL builds from bit patterns (rooted at 0): clear the
/// lowest set bit and set the next one up, or only clear it when that leaves the job. Each
/// step up raises the lowest set bit, so every rank reaches 0 in at most log2(p) steps.
fn btree_parent(p: usize, r: usize) -> Option<usize> {
    if r == 0 {
        return None;
    }
    let bit = 1usize << r.trailing_zeros();
    let up = (r ^ bit) | (bit << 1);
    Some(if up >= p { r ^ bit } else { up })
}

/// Parent and children of `r` in tree `t` (0 or 1) of the double binary tree. Tree 1 is tree 0
/// mirrored (even p) or shifted by one (odd p), so most ranks that are leaves in one tree are
/// inner nodes in the other and every rank's links carry about the same load.
pub fn dtree(p: usize, r: usize, t: usize) -> (Option<usize>, Vec<usize>) {
    let to_virtual = |x: usize| match (t, p % 2) {
        (0, _) => x,
        (_, 0) => p - 1 - x,
        _ => (x + p - 1) % p,
    };
    let to_real = |v: usize| match (t, p % 2) {
        (0, _) => v,
        (_, 0) => p - 1 - v,
        _ => (v + 1) % p,
    };
    let parent = |x: usize| btree_parent(p, to_virtual(x)).map(to_real);
    let children = (0..p).filter(|&q| q != r && parent(q) == Some(r)).collect();
    (parent(r), children)
}

/// Below this many bytes the tree all-reduce uses one tree, not two.
const TREE_SPLIT_MIN_BYTES: usize = 16 * 1024;

/// Double binary tree all-reduce (as NCCL's): each half of the buffer goes up one tree in
/// chunks (every rank reduces its children's chunks into its own and passes the sum to its
/// parent) and the root's result comes back down, so latency grows as log2(p) and the two
/// trees share the links. The root computes every value once, so all ranks get the same bits.
pub(super) fn tree_all_reduce(a: &CollArgs, r: usize, o: &PlanOpts) -> Plan {
    let (p, n, ch) = (a.nranks, a.count, o.chunk_elems.max(1));
    if p == 1 {
        return single_rank(o, n, Algo::Tree);
    }
    let mut b = Builder::new(ch, o.window);
    // A small buffer goes down one tree: splitting it would only double the messages, and for
    // small sizes the message count, not the link bandwidth, sets the time.
    let trees = if n * a.dtype.size() <= TREE_SPLIT_MIN_BYTES {
        1
    } else {
        2
    };
    for t in 0..trees {
        let (off0, len0) = segment(n, trees, t);
        let (parent, children) = dtree(p, r, t);
        for (off, len) in chunks(off0, len0, ch) {
            let mine = Slice::new(Buf::Recv, off, len);
            let mut acc = Slice::new(Buf::Send, off, len);
            let mut acc_step: Option<usize> = None;
            for &c in &children {
                let (slot, incoming, rv) = b.recv_to_scratch(c, len);
                let deps = std::iter::once(rv).chain(acc_step).collect();
                let red = b.push(
                    Op::Reduce {
                        dst: mine,
                        a: acc,
                        b: incoming,
                    },
                    deps,
                );
                b.release(slot, vec![rv, red]);
                acc = mine;
                acc_step = Some(red);
            }
            let result = match parent {
                Some(up) => {
                    let s = b.push(
                        Op::Send { peer: up, src: acc },
                        acc_step.into_iter().collect(),
                    );
                    let deps = std::iter::once(s).chain(acc_step).collect();
                    b.push(
                        Op::Recv {
                            peer: up,
                            dst: mine,
                        },
                        deps,
                    )
                }
                None if a.op == ReduceOp::Avg => {
                    b.push(Op::Divide { buf: mine }, acc_step.into_iter().collect())
                }
                // The root of a job of 2 or more always has a child, so acc_step is set.
                None => acc_step.unwrap_or_default(),
            };
            for &c in &children {
                b.push(Op::Send { peer: c, src: mine }, vec![result]);
            }
        }
    }
    b.finish(Algo::Tree)
}

/// Recursive doubling: log2(p) rounds, each swapping the whole running result with one partner
/// (rank ^ 2^k) and reducing, so a small all-reduce costs log2(p) latencies and messages per
/// rank instead of p - 1. For p not a power of two, the first 2 * (p - 2^m) ranks pair up
/// first: each even one hands its input to the odd one above it, sits out the rounds, and gets
/// the result back at the end. Each pair reduces with the lower virtual rank's data first, so
/// every rank ends with the same bits.
pub(super) fn recursive_doubling_all_reduce(a: &CollArgs, r: usize, o: &PlanOpts) -> Plan {
    let (p, n) = (a.nranks, a.count);
    if p == 1 {
        return single_rank(o, n, Algo::RecursiveDoubling);
    }
    let pow = 1usize << (usize::BITS - 1 - p.leading_zeros());
    let rem = p - pow;
    let real = |v: usize| if v < rem { 2 * v + 1 } else { v + rem };
    let mut b = Builder::new(n, 1);
    let acc = Slice::new(Buf::Recv, 0, n);
    let (slot_off, _) = b.acquire();
    let slot = Slice::new(Buf::Scratch, slot_off, n);
    let mut last: Vec<usize> = copy_if_needed(&mut b, o, acc, Slice::new(Buf::Send, 0, n), vec![])
        .into_iter()
        .collect();
    let mut slot_readers: Vec<usize> = Vec::new();
    let divide = a.op == ReduceOp::Avg;
    if r < 2 * rem && r.is_multiple_of(2) {
        // Sits out: its input goes up, the result comes back.
        let s = b.push(
            Op::Send {
                peer: r + 1,
                src: acc,
            },
            last,
        );
        b.push(
            Op::Recv {
                peer: r + 1,
                dst: acc,
            },
            vec![s],
        );
        return b.finish(Algo::RecursiveDoubling);
    }
    let v = if r < 2 * rem {
        let rv = b.push(
            Op::Recv {
                peer: r - 1,
                dst: slot,
            },
            vec![],
        );
        let mut deps = vec![rv];
        deps.extend(&last);
        // The lower rank's data first.
        last = vec![b.push(
            Op::Reduce {
                dst: acc,
                a: slot,
                b: acc,
            },
            deps,
        )];
        slot_readers = last.clone();
        r / 2
    } else {
        r - rem
    };
    let rounds = pow.trailing_zeros();
    for k in 0..rounds {
        let vp = v ^ (1 << k);
        let peer = real(vp);
        let s = b.push(Op::Send { peer, src: acc }, last.clone());
        let rv = b.push(
            Op::Recv { peer, dst: slot },
            std::mem::take(&mut slot_readers),
        );
        let mut deps = vec![s, rv];
        deps.extend(&last);
        let (x, y) = if v < vp { (acc, slot) } else { (slot, acc) };
        let final_round = k + 1 == rounds;
        let (red, end) = b.reduce_last(acc, x, y, deps, divide && final_round);
        slot_readers = vec![red];
        last = vec![end];
    }
    if r < 2 * rem {
        b.push(
            Op::Send {
                peer: r - 1,
                src: acc,
            },
            last,
        );
    }
    b.finish(Algo::RecursiveDoubling)
}

/// One-shot: everyone sends its whole buffer to everyone, then reduces all of them in rank
/// order in one step, so every rank computes the same bits. One round of latency: the
/// small-message algorithm.
pub(super) fn direct_all_reduce(a: &CollArgs, r: usize, o: &PlanOpts) -> Plan {
    let (p, n) = (a.nranks, a.count);
    let mut b = Builder::new(0, 1);
    let whole = |buf| Slice::new(buf, 0, n);
    let mut sends = Vec::new();
    for k in 1..p {
        sends.push(b.push(
            Op::Send {
                peer: (r + k) % p,
                src: whole(Buf::Send),
            },
            vec![],
        ));
    }
    // Scratch slot i holds rank i's contribution.
    let mut recv_of = vec![None; p];
    for k in 1..p {
        let q = (r + p - k) % p;
        recv_of[q] = Some(b.push(
            Op::Recv {
                peer: q,
                dst: Slice::new(Buf::Scratch, q * n, n),
            },
            vec![],
        ));
    }
    // Our own contribution joins the others in scratch, so one step reduces all p slots in
    // rank order (f16/bf16 in f32, rounded once, as the GPU kernels do).
    let own = b.push(
        Op::Copy {
            dst: Slice::new(Buf::Scratch, r * n, n),
            src: whole(Buf::Send),
        },
        vec![],
    );
    let mut deps: Vec<usize> = recv_of.iter().flatten().copied().collect();
    deps.push(own);
    deps.extend(&sends); // in place, Recv is Send: sends must be done first
    let reduced = b.push(
        Op::ReduceSlots {
            dst: whole(Buf::Recv),
            src: Slice::new(Buf::Scratch, 0, n),
            slots: p,
        },
        deps,
    );
    if a.op == ReduceOp::Avg {
        b.push(
            Op::Divide {
                buf: whole(Buf::Recv),
            },
            vec![reduced],
        );
    }
    let _ = o;
    let mut plan = b.finish(Algo::Direct);
    plan.scratch_elems = p * n;
    plan
}

#[cfg(test)]
mod tree_tests {
    use super::dtree;

    #[test]
    fn both_trees_are_binary_trees_of_log_depth_and_share_the_inner_work() {
        for p in 1..=70usize {
            let depth_limit = usize::BITS - p.leading_zeros() + 1;
            let mut inner_in_both = 0;
            for t in 0..2 {
                let roots: Vec<usize> = (0..p).filter(|&r| dtree(p, r, t).0.is_none()).collect();
                assert_eq!(roots.len(), 1, "p {p} tree {t}: roots {roots:?}");
                for r in 0..p {
                    let (_, kids) = dtree(p, r, t);
                    assert!(kids.len() <= 2, "p {p} tree {t}: rank {r} has {kids:?}");
                    let (mut x, mut steps) = (r, 0);
                    while let Some(up) = dtree(p, x, t).0 {
                        assert!(dtree(p, up, t).1.contains(&x));
                        x = up;
                        steps += 1;
                        assert!(steps <= depth_limit, "p {p} tree {t}: rank {r} too deep");
                    }
                    assert_eq!(x, roots[0]);
                }
            }
            for r in 0..p {
                if !dtree(p, r, 0).1.is_empty() && !dtree(p, r, 1).1.is_empty() {
                    inner_in_both += 1;
                }
            }
            // Complementary trees: few ranks do inner-node work in both.
            assert!(
                inner_in_both <= p / 4 + 2,
                "p {p}: {inner_in_both} ranks inner in both trees"
            );
        }
    }
}
