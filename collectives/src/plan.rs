//! Plans are data: an algorithm turns one call into, for each rank, a list of primitive steps
//! (send a slice, receive into a slice, reduce, copy, divide) with explicit dependencies.
//! Building a plan does no I/O, so the simulator ([`crate::sim`]) can run every rank's plan in
//! memory and the host executor ([`crate::exec`]) can run one rank's plan over a transport.
//!
//! Rules every plan keeps, which the executor and simulator rely on:
//! - Sends to one peer, and receives from one peer, are matched in plan order.
//! - A step that writes a region depends on every earlier step that reads or writes it
//!   (dependencies point only backwards, so a plan can never deadlock on itself).
//! - `Reduce` may write exactly over one of its inputs, never partially over one.

pub use railcc_core::call::{CollArgs, CollKind, P2pKind};
use railcc_core::ReduceOp;
use std::collections::VecDeque;
use std::ops::Range;

/// Which buffer a slice lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The caller's input.
    Send,
    /// The caller's output (may alias `Send` for in-place calls).
    Recv,
    /// Executor-owned temporary memory of `Plan::scratch_elems` elements.
    Scratch,
    /// The i-th caller buffer of a grouped send/recv.
    User(u32),
}

/// A range of elements in one buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice {
    pub buf: Buf,
    pub off: usize,
    pub len: usize,
}

impl Slice {
    pub fn new(buf: Buf, off: usize, len: usize) -> Slice {
        Slice { buf, off, len }
    }

    /// `slots` slices like this one laid end to end, as one slice.
    pub fn spanning(self, slots: usize) -> Slice {
        Slice {
            len: self.len * slots,
            ..self
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Send {
        peer: usize,
        src: Slice,
    },
    Recv {
        peer: usize,
        dst: Slice,
    },
    /// `dst = a op b`.
    Reduce {
        dst: Slice,
        a: Slice,
        b: Slice,
    },
    /// `dst = s_0 op s_1 op ... op s_(slots-1)` in that order, where `s_j` is the slice of
    /// `src.len` elements `j * src.len` after `src` (slices laid end to end, none overlapping
    /// `dst`). One step reduces every input, so f16/bf16 accumulate in f32 and round once.
    ReduceSlots {
        dst: Slice,
        src: Slice,
        slots: usize,
    },
    Copy {
        dst: Slice,
        src: Slice,
    },
    /// `buf /= nranks`, the end of `Avg`.
    Divide {
        buf: Slice,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub op: Op,
    pub deps: Vec<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algo {
    Ring,
    Direct,
    Chain,
    Dissemination,
    PointToPoint,
    RecursiveDoubling,
    Tree,
    /// Hierarchical all-reduce with this many ranks per host (`plan/hier.rs`).
    Hier(usize),
}

impl Algo {
    pub fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::Direct => "direct",
            Algo::Chain => "chain",
            Algo::Dissemination => "dissemination",
            Algo::PointToPoint => "p2p",
            Algo::RecursiveDoubling => "rdouble",
            Algo::Tree => "tree",
            Algo::Hier(_) => "hier",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub algo: Algo,
    pub steps: Vec<Step>,
    pub scratch_elems: usize,
}

/// Per-plan knobs: pipelining chunk, in-flight window, algorithm choice for all-reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanOpts {
    pub chunk_elems: usize,
    pub window: usize,
    pub in_place: bool,
}

/// Builds a plan step list and tracks reusable scratch slots.
struct Builder {
    steps: Vec<Step>,
    scratch_base: usize,
    slot_elems: usize,
    max_free_slots: usize,
    nslots: usize,
    /// Released slots, oldest first, with the steps a new user must wait for.
    free: VecDeque<(usize, Vec<usize>)>,
}

impl Builder {
    fn new(slot_elems: usize, window: usize) -> Builder {
        Builder {
            steps: Vec::new(),
            scratch_base: 0,
            slot_elems,
            max_free_slots: window.max(1),
            nslots: 0,
            free: VecDeque::new(),
        }
    }

    fn push(&mut self, op: Op, mut deps: Vec<usize>) -> usize {
        deps.sort_unstable();
        deps.dedup();
        self.steps.push(Step { op, deps });
        self.steps.len() - 1
    }

    /// A scratch slot of `slot_elems`, and the steps that used it last.
    fn acquire(&mut self) -> (usize, Vec<usize>) {
        if self.nslots >= self.max_free_slots {
            if let Some(s) = self.free.pop_front() {
                return s;
            }
        }
        let off = self.scratch_base + self.nslots * self.slot_elems;
        self.nslots += 1;
        (off, Vec::new())
    }

    /// Receives `len` elements from `peer` into a free scratch slot: the slot, its slice and
    /// the receive step.
    fn recv_to_scratch(&mut self, peer: usize, len: usize) -> (usize, Slice, usize) {
        let (slot, users) = self.acquire();
        let incoming = Slice::new(Buf::Scratch, slot, len);
        let rv = self.push(
            Op::Recv {
                peer,
                dst: incoming,
            },
            users,
        );
        (slot, incoming, rv)
    }

    fn release(&mut self, off: usize, users: Vec<usize>) {
        self.free.push_back((off, users));
    }

    /// `dst = x op y` as the last reduction of `dst`, then avg's division when `divide`;
    /// returns (the reduce step, the last step).
    fn reduce_last(
        &mut self,
        dst: Slice,
        x: Slice,
        y: Slice,
        deps: Vec<usize>,
        divide: bool,
    ) -> (usize, usize) {
        let red = self.push(Op::Reduce { dst, a: x, b: y }, deps);
        let last = if divide {
            self.push(Op::Divide { buf: dst }, vec![red])
        } else {
            red
        };
        (red, last)
    }

    fn finish(self, algo: Algo) -> Plan {
        Plan {
            algo,
            steps: self.steps,
            scratch_elems: self.scratch_base + self.nslots * self.slot_elems,
        }
    }
}

/// `n` elements split into `p` near-equal segments: (offset, length) of segment `i`.
pub fn segment(n: usize, p: usize, i: usize) -> (usize, usize) {
    let (base, extra) = (n / p, n % p);
    (i * base + i.min(extra), base + usize::from(i < extra))
}

/// Chunks of a segment: (offset, length) pairs of at most `chunk` elements.
fn chunks(off: usize, len: usize, chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    let chunk = chunk.max(1);
    (0..len.div_ceil(chunk)).map(move |c| (off + c * chunk, chunk.min(len - c * chunk)))
}

fn nth_chunk(off: usize, len: usize, chunk: usize, c: usize) -> Option<(usize, usize)> {
    let chunk = chunk.max(1);
    let start = c.checked_mul(chunk)?;
    (start < len).then(|| (off + start, chunk.min(len - start)))
}

/// Builds the plan for `rank`. `algo` is the all-reduce algorithm (ignored elsewhere).
pub fn build(a: &CollArgs, rank: usize, algo: Algo, o: &PlanOpts) -> Plan {
    let p = a.nranks;
    match a.coll {
        CollKind::AllReduce if algo == Algo::Direct && p > 1 => direct_all_reduce(a, rank, o),
        CollKind::AllReduce if algo == Algo::Tree => tree_all_reduce(a, rank, o),
        CollKind::AllReduce if matches!(algo, Algo::Hier(_)) => {
            let Algo::Hier(local) = algo else {
                return ring_all_reduce(a, rank, o);
            };
            hier::hier_all_reduce(a, rank, o, local)
        }
        CollKind::AllReduce if algo == Algo::RecursiveDoubling => {
            recursive_doubling_all_reduce(a, rank, o)
        }
        CollKind::AllReduce => ring_all_reduce(a, rank, o),
        CollKind::AllGather => match algo {
            Algo::Hier(local) => hier::hier_all_gather(a, rank, o, local),
            _ => ring_all_gather(a, rank, o),
        },
        CollKind::ReduceScatter => match algo {
            Algo::Hier(local) => hier::hier_reduce_scatter(a, rank, o, local),
            _ => ring_reduce_scatter(a, rank, o),
        },
        CollKind::Broadcast => match algo {
            Algo::Hier(local) => hier::hier_broadcast(a, rank, o, local),
            _ => chain_broadcast(a, rank, o),
        },
        CollKind::Reduce => match algo {
            Algo::Hier(local) => hier::hier_reduce(a, rank, o, local),
            _ => chain_reduce(a, rank, o),
        },
        CollKind::AllToAll => all_to_all(a, rank, o),
        CollKind::SendRecv => ring_send_recv(a, rank, o),
        CollKind::Barrier => dissemination_barrier(p, rank),
    }
}

mod allreduce;
mod hier;
mod order;
pub use allreduce::dtree;
use allreduce::{
    direct_all_reduce, recursive_doubling_all_reduce, ring_all_reduce, tree_all_reduce,
};
pub use order::{build_ordered, host_order};

fn copy_if_needed(
    b: &mut Builder,
    o: &PlanOpts,
    dst: Slice,
    src: Slice,
    deps: Vec<usize>,
) -> Option<usize> {
    (!o.in_place && dst.len > 0).then(|| b.push(Op::Copy { dst, src }, deps))
}

/// With one rank every collective is a copy from the send to the receive buffer (none in place).
fn single_rank(o: &PlanOpts, n: usize, algo: Algo) -> Plan {
    let mut b = Builder::new(0, 1);
    copy_if_needed(
        &mut b,
        o,
        Slice::new(Buf::Recv, 0, n),
        Slice::new(Buf::Send, 0, n),
        vec![],
    );
    b.finish(algo)
}

fn ring_all_gather(a: &CollArgs, r: usize, o: &PlanOpts) -> Plan {
    let (p, c, ch) = (a.nranks, a.count, o.chunk_elems);
    let mut b = Builder::new(0, 1);
    copy_if_needed(
        &mut b,
        o,
        Slice::new(Buf::Recv, r * c, c),
        Slice::new(Buf::Send, 0, c),
        vec![],
    );
    let (next, prev) = ((r + 1) % p, (r + p - 1) % p);
    let nch = c.div_ceil(ch.max(1));
    let mut got: Vec<Option<usize>> = vec![None; nch];
    for s in 0..p.saturating_sub(1) {
        let (si, ri) = ((r + p - s) % p, (r + 2 * p - s - 1) % p);
        for (k, (off, len)) in chunks(0, c, ch).enumerate() {
            let src = if s == 0 {
                Slice::new(Buf::Send, off, len)
            } else {
                Slice::new(Buf::Recv, si * c + off, len)
            };
            b.push(Op::Send { peer: next, src }, got[k].into_iter().collect());
        }
        for (k, (off, len)) in chunks(0, c, ch).enumerate() {
            got[k] = Some(b.push(
                Op::Recv {
                    peer: prev,
                    dst: Slice::new(Buf::Recv, ri * c + off, len),
                },
                vec![],
            ));
        }
    }
    b.finish(Algo::Ring)
}

fn ring_reduce_scatter(a: &CollArgs, r: usize, o: &PlanOpts) -> Plan {
    let (p, c, ch) = (a.nranks, a.count, o.chunk_elems);
    if p == 1 {
        return single_rank(o, c, Algo::Ring);
    }
    let mut b = Builder::new(ch, o.window);
    let (next, prev) = ((r + 1) % p, (r + p - 1) % p);
    let nch = c.div_ceil(ch.max(1));
    // acc[k]: (scratch offset, producing step) of the partial sum to forward for chunk k.
    let mut acc: Vec<Option<(usize, usize)>> = vec![None; nch];
    let w = o.window.max(1);
    for g in (0..nch).step_by(w) {
        let group = g..(g + w).min(nch);
        for s in 0..p - 1 {
            let (si, ri) = ((r + 2 * p - s - 1) % p, (r + 2 * p - s - 2) % p);
            // This step's sources are taken before its receives are built, and its sends are
            // built after them, so a receive never waits on a send of its own step (that would
            // be a cycle around the ring once sends block).
            let sources: Vec<Option<(usize, usize)>> =
                group.clone().map(|k| acc[k].take()).collect();
            for k in group.clone() {
                let Some((off, len)) = nth_chunk(0, c, ch, k) else {
                    continue;
                };
                let (slot, incoming, rv) = b.recv_to_scratch(prev, len);
                let mine = Slice::new(Buf::Send, ri * c + off, len);
                if s == p - 2 {
                    let dst = Slice::new(Buf::Recv, off, len);
                    let (red, _) =
                        b.reduce_last(dst, mine, incoming, vec![rv], a.op == ReduceOp::Avg);
                    b.release(slot, vec![rv, red]);
                } else {
                    let red = b.push(
                        Op::Reduce {
                            dst: incoming,
                            a: mine,
                            b: incoming,
                        },
                        vec![rv],
                    );
                    acc[k] = Some((slot, red));
                }
            }
            for (k, src) in group.clone().zip(sources) {
                let Some((off, len)) = nth_chunk(0, c, ch, k) else {
                    continue;
                };
                if s == 0 {
                    b.push(
                        Op::Send {
                            peer: next,
                            src: Slice::new(Buf::Send, si * c + off, len),
                        },
                        vec![],
                    );
                } else if let Some((slot, producer)) = src {
                    let st = b.push(
                        Op::Send {
                            peer: next,
                            src: Slice::new(Buf::Scratch, slot, len),
                        },
                        vec![producer],
                    );
                    b.release(slot, vec![st]);
                }
            }
        }
    }
    b.finish(Algo::Ring)
}

/// Pipelined chain root -> root+1 -> ... -> root-1, chunk by chunk.
fn chain_broadcast(a: &CollArgs, r: usize, o: &PlanOpts) -> Plan {
    let (p, n, ch) = (a.nranks, a.count, o.chunk_elems);
    let mut b = Builder::new(0, 1);
    let pos = (r + p - a.root) % p;
    let (next, prev) = ((r + 1) % p, (r + p - 1) % p);
    for (off, len) in chunks(0, n, ch) {
        if pos == 0 {
            if p > 1 {
                b.push(
                    Op::Send {
                        peer: next,
                        src: Slice::new(Buf::Send, off, len),
                    },
                    vec![],
                );
            }
            copy_if_needed(
                &mut b,
                o,
                Slice::new(Buf::Recv, off, len),
                Slice::new(Buf::Send, off, len),
                vec![],
            );
        } else {
            let rv = b.push(
                Op::Recv {
                    peer: prev,
                    dst: Slice::new(Buf::Recv, off, len),
                },
                vec![],
            );
            if pos < p - 1 {
                b.push(
                    Op::Send {
                        peer: next,
                        src: Slice::new(Buf::Recv, off, len),
                    },
                    vec![rv],
                );
            }
        }
    }
    b.finish(Algo::Chain)
}

/// Pipelined chain root+1 -> root+2 -> ... -> root, reducing as it goes; only the root's
/// receive buffer is written.
fn chain_reduce(a: &CollArgs, r: usize, o: &PlanOpts) -> Plan {
    let (p, n, ch) = (a.nranks, a.count, o.chunk_elems);
    if p == 1 {
        return single_rank(o, n, Algo::Chain);
    }
    let mut b = Builder::new(ch, o.window);
    let pos = (r + p - a.root) % p;
    let (next, prev) = ((r + 1) % p, (r + p - 1) % p);
    for (off, len) in chunks(0, n, ch) {
        let mine = Slice::new(Buf::Send, off, len);
        if pos == 1 {
            b.push(
                Op::Send {
                    peer: next,
                    src: mine,
                },
                vec![],
            );
            continue;
        }
        let (slot, incoming, rv) = b.recv_to_scratch(prev, len);
        if pos == 0 {
            let dst = Slice::new(Buf::Recv, off, len);
            let (red, _) = b.reduce_last(dst, incoming, mine, vec![rv], a.op == ReduceOp::Avg);
            b.release(slot, vec![rv, red]);
        } else {
            let red = b.push(
                Op::Reduce {
                    dst: incoming,
                    a: incoming,
                    b: mine,
                },
                vec![rv],
            );
            let st = b.push(
                Op::Send {
                    peer: next,
                    src: incoming,
                },
                vec![red],
            );
            b.release(slot, vec![st]);
        }
    }
    b.finish(Algo::Chain)
}

/// Each rank sends block j to rank j and receives block j from rank j. In place, blocks land
/// in scratch and are copied once every send has left.
fn all_to_all(a: &CollArgs, r: usize, o: &PlanOpts) -> Plan {
    let (p, c) = (a.nranks, a.count);
    let mut b = Builder::new(0, 1);
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    for k in 1..p {
        let to = (r + k) % p;
        sends.push(b.push(
            Op::Send {
                peer: to,
                src: Slice::new(Buf::Send, to * c, c),
            },
            vec![],
        ));
    }
    for k in 1..p {
        let from = (r + p - k) % p;
        let dst = if o.in_place {
            Slice::new(Buf::Scratch, from * c, c)
        } else {
            Slice::new(Buf::Recv, from * c, c)
        };
        recvs.push((from, b.push(Op::Recv { peer: from, dst }, vec![])));
    }
    copy_if_needed(
        &mut b,
        o,
        Slice::new(Buf::Recv, r * c, c),
        Slice::new(Buf::Send, r * c, c),
        vec![],
    );
    let mut plan_scratch = 0;
    if o.in_place {
        for (from, rv) in recvs {
            let mut deps = sends.clone();
            deps.push(rv);
            b.push(
                Op::Copy {
                    dst: Slice::new(Buf::Recv, from * c, c),
                    src: Slice::new(Buf::Scratch, from * c, c),
                },
                deps,
            );
        }
        plan_scratch = p * c;
    }
    let mut plan = b.finish(Algo::PointToPoint);
    plan.scratch_elems = plan_scratch;
    plan
}

/// nccl-tests' sendrecv: send to the next rank, receive from the previous one.
fn ring_send_recv(a: &CollArgs, r: usize, o: &PlanOpts) -> Plan {
    let (p, c) = (a.nranks, a.count);
    if p == 1 {
        return single_rank(o, c, Algo::PointToPoint);
    }
    let mut b = Builder::new(0, 1);
    let whole = |buf| Slice::new(buf, 0, c);
    let st = b.push(
        Op::Send {
            peer: (r + 1) % p,
            src: whole(Buf::Send),
        },
        vec![],
    );
    let dst = if o.in_place {
        whole(Buf::Scratch)
    } else {
        whole(Buf::Recv)
    };
    let rv = b.push(
        Op::Recv {
            peer: (r + p - 1) % p,
            dst,
        },
        vec![],
    );
    let mut plan_scratch = 0;
    if o.in_place {
        b.push(
            Op::Copy {
                dst: whole(Buf::Recv),
                src: whole(Buf::Scratch),
            },
            vec![st, rv],
        );
        plan_scratch = c;
    }
    let mut plan = b.finish(Algo::PointToPoint);
    plan.scratch_elems = plan_scratch;
    plan
}

/// Dissemination barrier: in round k, signal rank+2^k and wait for rank-2^k; ceil(log2 p)
/// rounds of empty messages.
fn dissemination_barrier(p: usize, r: usize) -> Plan {
    let mut b = Builder::new(0, 1);
    let mut dist = 1;
    let mut last: Option<usize> = None;
    while dist < p {
        b.push(
            Op::Send {
                peer: (r + dist) % p,
                src: Slice::new(Buf::Send, 0, 0),
            },
            last.into_iter().collect(),
        );
        last = Some(b.push(
            Op::Recv {
                peer: (r + p - dist) % p,
                dst: Slice::new(Buf::Recv, 0, 0),
            },
            vec![],
        ));
        dist *= 2;
    }
    b.finish(Algo::Dissemination)
}

/// A grouped send/recv plan: op i moves `lens[i]` elements of buffer `User(i)`. Sends to self
/// are paired with receives from self, in order, as copies.
pub fn group_plan(rank: usize, ops: &[(P2pKind, usize, usize)]) -> Result<Plan, String> {
    let mut b = Builder::new(0, 1);
    let mut self_sends: VecDeque<(u32, usize)> = VecDeque::new();
    let mut self_recvs: VecDeque<(u32, usize)> = VecDeque::new();
    for (i, &(kind, peer, len)) in ops.iter().enumerate() {
        let s = Slice::new(Buf::User(i as u32), 0, len);
        match (kind, peer == rank) {
            (P2pKind::Send, false) => {
                b.push(Op::Send { peer, src: s }, vec![]);
            }
            (P2pKind::Recv, false) => {
                b.push(Op::Recv { peer, dst: s }, vec![]);
            }
            (P2pKind::Send, true) => self_sends.push_back((i as u32, len)),
            (P2pKind::Recv, true) => self_recvs.push_back((i as u32, len)),
        }
    }
    if self_sends.len() != self_recvs.len() {
        return Err(format!(
            "rank {rank} posts {} send(s) to itself but {} receive(s) from itself in one group",
            self_sends.len(),
            self_recvs.len()
        ));
    }
    for ((si, sl), (ri, rl)) in self_sends.into_iter().zip(self_recvs) {
        if sl != rl {
            return Err(format!(
                "send to self of {sl} elements paired with a receive of {rl}"
            ));
        }
        b.push(
            Op::Copy {
                dst: Slice::new(Buf::User(ri), 0, rl),
                src: Slice::new(Buf::User(si), 0, sl),
            },
            vec![],
        );
    }
    Ok(b.finish(Algo::PointToPoint))
}

#[cfg(test)]
mod tests {
    use super::*;
    use railcc_core::DataType;

    #[test]
    fn segments_cover() {
        for n in [0, 1, 7, 100] {
            for p in 1..9 {
                let mut next = 0;
                for i in 0..p {
                    let (o, l) = segment(n, p, i);
                    assert_eq!(o, next);
                    next = o + l;
                }
                assert_eq!(next, n);
            }
        }
    }

    #[test]
    fn deps_point_backwards() {
        let a = CollArgs {
            coll: CollKind::AllReduce,
            nranks: 5,
            count: 1000,
            dtype: DataType::F32,
            op: ReduceOp::Avg,
            root: 0,
        };
        let o = PlanOpts {
            chunk_elems: 37,
            window: 3,
            in_place: false,
        };
        for r in 0..5 {
            let plan = build(&a, r, Algo::Ring, &o);
            for (i, s) in plan.steps.iter().enumerate() {
                assert!(s.deps.iter().all(|d| *d < i));
            }
            // scratch bounded by the window, not by the buffer
            assert!(
                plan.scratch_elems <= (o.window + 1) * o.chunk_elems,
                "{}",
                plan.scratch_elems
            );
        }
    }
}
