//! Hierarchical schedules for GPU buffers on H hosts of L ranks each: collectives inside a
//! host (the NVLink kernels, [`Step::Local`]) and across hosts among the ranks of one local
//! index (the network, [`Step::Cross`]: rail l meets rail l, so every GPU's NIC carries 1/L of
//! the data), with device copies between them. A plan is data: the GPU runner
//! (`super::run`) enqueues its steps on the caller's stream, and the host simulator in this
//! file's tests runs them against the reference for many host x GPU shapes and rank layouts.
//!
//! | collective | steps |
//! |---|---|
//! | all_reduce | local reduce-scatter, cross all-reduce of each rank's 1/L, local all-gather; the last `n mod L` elements: local all-reduce, cross all-reduce |
//! | reduce_scatter | copy blocks into local-index-major order, local reduce-scatter of H blocks each, cross reduce-scatter |
//! | all_gather | cross all-gather, local all-gather, copy blocks into rank order |
//! | broadcast | local broadcast on the root's host, cross broadcast of each rank's 1/L, local all-gather on the other hosts; the last `n mod L`: cross and local broadcast |
//! | reduce | local reduce to the root's local index, cross reduce among that index |

use crate::plan::CollArgs;
use railcc_core::call::CollKind;
use railcc_core::ReduceOp;

/// Where the ranks sit: `hosts[h][l]` is the rank of local index `l` on host `h`. Hosts are
/// ordered by their lowest rank and ranks within a host ascend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub hosts: Vec<Vec<usize>>,
}

impl Layout {
    /// The layout of ranks whose host ids are `ids` (one per rank, in rank order); `None`
    /// unless every host holds the same number of ranks.
    pub fn from_host_ids(ids: &[Vec<u8>]) -> Option<Layout> {
        let mut hosts: Vec<(&[u8], Vec<usize>)> = Vec::new();
        for (r, id) in ids.iter().enumerate() {
            match hosts.iter_mut().find(|h| h.0 == id.as_slice()) {
                Some(h) => h.1.push(r),
                None => hosts.push((id.as_slice(), vec![r])),
            }
        }
        let l = hosts.first()?.1.len();
        if hosts.iter().any(|h| h.1.len() != l) {
            return None;
        }
        Some(Layout {
            hosts: hosts.into_iter().map(|h| h.1).collect(),
        })
    }

    /// Hosts (H).
    pub fn nhosts(&self) -> usize {
        self.hosts.len()
    }

    /// Ranks per host (L).
    pub fn local(&self) -> usize {
        self.hosts.first().map_or(0, Vec::len)
    }

    pub fn nranks(&self) -> usize {
        self.nhosts() * self.local()
    }

    /// (host, local index) of `rank`.
    pub fn position(&self, rank: usize) -> Option<(usize, usize)> {
        self.hosts
            .iter()
            .enumerate()
            .find_map(|(h, rs)| rs.iter().position(|&r| r == rank).map(|l| (h, l)))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buf {
    Send,
    Recv,
    Scratch,
}

/// An element offset in one of the call's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct At {
    pub buf: Buf,
    pub off: usize,
}

const fn at(buf: Buf, off: usize) -> At {
    At { buf, off }
}

/// Which hosts run a local step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hosts {
    All,
    Only(usize),
    Except(usize),
}

impl Hosts {
    pub fn has(self, h: usize) -> bool {
        match self {
            Hosts::All => true,
            Hosts::Only(x) => h == x,
            Hosts::Except(x) => h != x,
        }
    }
}

/// What a step runs; `count` as NCCL counts it for the step's own ranks (all_gather: per rank
/// sent; reduce_scatter: per rank received).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coll {
    pub coll: CollKind,
    pub send: At,
    pub recv: At,
    pub count: usize,
    pub op: ReduceOp,
    /// Local index (local steps) or host index (cross steps).
    pub root: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Among the L ranks of each host in `hosts` (the NVLink kernels).
    Local { c: Coll, hosts: Hosts },
    /// Among the H ranks of local index `group` (every index when `None`), one per host in
    /// host order (the network).
    Cross { c: Coll, group: Option<usize> },
    /// A device copy of `count` elements.
    Copy { src: At, dst: At, count: usize },
}

/// One rank's steps and the scratch elements they need.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HierPlan {
    pub steps: Vec<Step>,
    pub scratch: usize,
}

/// The most ranks a job may have for small all_reduces to leave the hierarchy (`flat`): the
/// flat engine's direct exchange sends one message per peer, a cost that grows with the
/// ranks where the hierarchy's stays one local kernel and one exchange per host.
pub const FLAT_MAX_RANKS: usize = 8;

/// Whether call `a` goes to the flat network engine although the hierarchy covers it: an
/// all_reduce of fewer bytes than `flat_below` (`RAILCC_GPU_FLAT_BELOW_BYTES`; 0: never) on at
/// most [`FLAT_MAX_RANKS`] ranks, one host step and one launch instead of the hierarchy's local
/// and cross calls with a rendezvous between the host's processes on the caller's thread
/// (bench/results/issue31/small-call-design.md, D3; measured in
/// bench/results/issue31/x4-s15).
pub fn flat(a: &CollArgs, flat_below: usize) -> bool {
    a.coll == CollKind::AllReduce
        && a.nranks <= FLAT_MAX_RANKS
        && a.count * a.dtype.size() < flat_below
}

/// Whether the hierarchical schedules cover a call: the five collectives; averages only of
/// floating types (the average of averages equals the whole average up to rounding, an
/// integer one does not).
pub fn takes(a: &CollArgs) -> bool {
    let coll = matches!(
        a.coll,
        CollKind::AllReduce
            | CollKind::ReduceScatter
            | CollKind::AllGather
            | CollKind::Broadcast
            | CollKind::Reduce
    );
    coll && (a.op != ReduceOp::Avg || a.dtype.is_float())
}

/// The steps of `a` for `rank` (which the layout holds; `takes(a)`). An all_reduce or
/// broadcast of at most `small_bytes` skips the split into 1/L parts: one local and one cross
/// step over the whole buffer (two steps' latency, not three; every rank must pass the same).
pub fn plan(a: &CollArgs, lay: &Layout, rank: usize, small_bytes: usize) -> HierPlan {
    let (h, l) = lay.position(rank).unwrap_or((0, 0));
    let (nh, nl) = (lay.nhosts(), lay.local());
    let (n, op) = (a.count, a.op);
    let mut steps = Vec::new();
    let mut scratch = 0;
    let c = |coll, send, recv, count, root| Coll {
        coll,
        send,
        recv,
        count,
        op,
        root,
    };
    use Buf::*;
    use CollKind::*;
    match a.coll {
        AllReduce => {
            let whole = n * a.dtype.size() <= small_bytes;
            // Small: the whole buffer as the tail below (local all-reduce, cross all-reduce).
            let (s, m) = if whole { (0, 0) } else { (n / nl, n / nl * nl) };
            if s > 0 {
                let mine = at(Recv, l * s);
                steps.push(Step::Local {
                    c: c(ReduceScatter, at(Send, 0), mine, s, 0),
                    hosts: Hosts::All,
                });
                steps.push(Step::Cross {
                    c: c(AllReduce, mine, mine, s, 0),
                    group: None,
                });
                steps.push(Step::Local {
                    c: c(AllGather, mine, at(Recv, 0), s, 0),
                    hosts: Hosts::All,
                });
            }
            if m < n {
                let tail = at(Recv, m);
                steps.push(Step::Local {
                    c: c(AllReduce, at(Send, m), tail, n - m, 0),
                    hosts: Hosts::All,
                });
                steps.push(Step::Cross {
                    c: c(AllReduce, tail, tail, n - m, 0),
                    group: None,
                });
            }
        }
        ReduceScatter => {
            // Scratch block [l'][h'] holds the send block of rank hosts[h'][l'].
            scratch = n * nh * nl;
            for (h2, rs) in lay.hosts.iter().enumerate() {
                for (l2, &r) in rs.iter().enumerate() {
                    steps.push(Step::Copy {
                        src: at(Send, r * n),
                        dst: at(Scratch, (l2 * nh + h2) * n),
                        count: n,
                    });
                }
            }
            let mine = at(Scratch, l * nh * n);
            steps.push(Step::Local {
                c: c(ReduceScatter, at(Scratch, 0), mine, nh * n, 0),
                hosts: Hosts::All,
            });
            steps.push(Step::Cross {
                c: c(ReduceScatter, mine, at(Recv, 0), n, 0),
                group: None,
            });
        }
        AllGather => {
            scratch = n * nh * nl;
            let mine = at(Scratch, l * nh * n);
            steps.push(Step::Cross {
                c: c(AllGather, at(Send, 0), mine, n, 0),
                group: None,
            });
            steps.push(Step::Local {
                c: c(AllGather, mine, at(Scratch, 0), nh * n, 0),
                hosts: Hosts::All,
            });
            for (h2, rs) in lay.hosts.iter().enumerate() {
                for (l2, &r) in rs.iter().enumerate() {
                    steps.push(Step::Copy {
                        src: at(Scratch, (l2 * nh + h2) * n),
                        dst: at(Recv, r * n),
                        count: n,
                    });
                }
            }
        }
        Broadcast => {
            let (h0, l0) = lay.position(a.root).unwrap_or((0, 0));
            let (s, m) = (n / nl, n / nl * nl);
            // Only the root's send buffer is read (NCCL's: the others may be NULL).
            let src = if rank == a.root {
                at(Send, 0)
            } else {
                at(Recv, 0)
            };
            if n * a.dtype.size() <= small_bytes {
                // Small: across hosts among the root's local index, then inside every host.
                steps.push(Step::Cross {
                    c: c(Broadcast, src, at(Recv, 0), n, h0),
                    group: Some(l0),
                });
                steps.push(Step::Local {
                    c: c(Broadcast, at(Recv, 0), at(Recv, 0), n, l0),
                    hosts: Hosts::All,
                });
            } else {
                steps.push(Step::Local {
                    c: c(Broadcast, src, at(Recv, 0), n, l0),
                    hosts: Hosts::Only(h0),
                });
                if s > 0 {
                    let mine = at(Recv, l * s);
                    steps.push(Step::Cross {
                        c: c(Broadcast, mine, mine, s, h0),
                        group: None,
                    });
                    steps.push(Step::Local {
                        c: c(AllGather, mine, at(Recv, 0), s, 0),
                        hosts: Hosts::Except(h0),
                    });
                }
                if m < n {
                    let tail = at(Recv, m);
                    steps.push(Step::Cross {
                        c: c(Broadcast, tail, tail, n - m, h0),
                        group: Some(l0),
                    });
                    steps.push(Step::Local {
                        c: c(Broadcast, tail, tail, n - m, l0),
                        hosts: Hosts::Except(h0),
                    });
                }
            }
        }
        Reduce => {
            let (h0, l0) = lay.position(a.root).unwrap_or((0, 0));
            scratch = n;
            steps.push(Step::Local {
                c: c(Reduce, at(Send, 0), at(Scratch, 0), n, l0),
                hosts: Hosts::All,
            });
            // Only the root's receive buffer is written (NCCL's: the others may be NULL).
            let out = if h == h0 { at(Recv, 0) } else { at(Scratch, 0) };
            steps.push(Step::Cross {
                c: c(Reduce, at(Scratch, 0), out, n, h0),
                group: Some(l0),
            });
        }
        AllToAll | SendRecv | Barrier => {}
    }
    // Steps that move nothing are left out on every rank alike (counts do not depend on the rank).
    steps.retain(|s| match s {
        Step::Local { c, .. } | Step::Cross { c, .. } => c.count > 0,
        Step::Copy { count, .. } => *count > 0,
    });
    HierPlan { steps, scratch }
}

#[cfg(test)]
mod tests;
