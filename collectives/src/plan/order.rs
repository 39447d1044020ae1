//! Rank order across hosts. With several ranks per host a ring visits each host's ranks
//! together, so only one edge per host pair crosses the network (NCCL orders its rings the
//! same way). A plan is built for the rank's position in that order (its virtual rank), then
//! its peers, and the blocks of rank-indexed layouts, are mapped back to real ranks.
//!
//! Collectives whose meaning fixes the neighbours keep the identity: send/recv (rank r sends to
//! r + 1) and all-to-all (direct, no ring).

use super::{build, Algo, Buf, CollArgs, Op, Plan, PlanOpts, Slice};
use railcc_core::call::CollKind;

/// Ranks grouped by host, hosts in order of their first rank, ranks ascending within a host.
pub fn host_order<T: PartialEq>(hosts: &[T]) -> Vec<usize> {
    let mut firsts: Vec<usize> = Vec::new();
    for (r, h) in hosts.iter().enumerate() {
        if !firsts.iter().any(|&f| hosts[f] == *h) {
            firsts.push(r);
        }
    }
    firsts
        .iter()
        .flat_map(|&f| (0..hosts.len()).filter(move |&r| hosts[r] == hosts[f]))
        .collect()
}

fn is_identity(order: &[usize]) -> bool {
    order.iter().enumerate().all(|(i, &r)| i == r)
}

/// The plan of `rank` when the ring runs through ranks in `order` (a permutation of 0..p).
pub fn build_ordered(a: &CollArgs, rank: usize, algo: Algo, o: &PlanOpts, order: &[usize]) -> Plan {
    let fixed = matches!(a.coll, CollKind::SendRecv | CollKind::AllToAll);
    if fixed || order.len() != a.nranks || is_identity(order) {
        return build(a, rank, algo, o);
    }
    let mut pos = vec![0usize; order.len()];
    for (i, &r) in order.iter().enumerate() {
        pos[r] = i;
    }
    let mut va = *a;
    if matches!(a.coll, CollKind::Broadcast | CollKind::Reduce) && a.root < a.nranks {
        va.root = pos[a.root];
    }
    let mut plan = build(&va, pos[rank], algo, o);
    // Rank-indexed blocks of `count` elements: all-gather's output, reduce-scatter's input.
    let blocks = match a.coll {
        CollKind::AllGather => Some(Buf::Recv),
        CollKind::ReduceScatter => Some(Buf::Send),
        _ => None,
    };
    let c = a.count;
    let remap = |s: &mut Slice| {
        if Some(s.buf) == blocks && c > 0 {
            let (blk, within) = (s.off / c, s.off % c);
            debug_assert!(within + s.len <= c, "a slice straddles two blocks");
            s.off = order[blk] * c + within;
        }
    };
    for st in &mut plan.steps {
        match &mut st.op {
            Op::Send { peer, src } => {
                *peer = order[*peer];
                remap(src);
            }
            Op::Recv { peer, dst } => {
                *peer = order[*peer];
                remap(dst);
            }
            Op::Reduce { dst, a, b } => {
                remap(dst);
                remap(a);
                remap(b);
            }
            Op::Copy { dst, src } => {
                remap(dst);
                remap(src);
            }
            // Only the direct all-reduce makes these, over its scratch: nothing to remap.
            Op::ReduceSlots { dst, src, .. } => {
                remap(dst);
                remap(src);
            }
            Op::Divide { buf } => remap(buf),
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_grouped_in_order_of_first_rank() {
        assert_eq!(host_order(&["a", "b", "a", "b"]), [0, 2, 1, 3]);
        assert_eq!(host_order(&["x", "x", "y"]), [0, 1, 2]);
        assert_eq!(host_order::<u8>(&[]), Vec::<usize>::new());
    }
}
