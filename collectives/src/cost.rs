//! The cost model that picks an all-reduce algorithm, and that `railcc sim` evaluates at
//! scales we cannot run. Latency-bandwidth (alpha-beta) closed forms per algorithm, on a
//! machine of `nodes` x `per_node` ranks whose rings and trees keep a node's ranks together
//! (as `plan::host_order` does):
//!
//! - ring: 2(p-1) steps of n/p bytes; every step waits for the slowest link of the ring
//!   (the network when there are several nodes): 2(p-1) a + 2(p-1)/p n / b.
//! - tree (double binary tree over the host-ordered ranks, as `plan::dtree` builds it): the
//!   data goes up and down once, pipelined in chunks, each tree carrying half, so a rank's
//!   link sends n going up and n coming down: 2 (log2(nodes) a_inter + log2(per_node)
//!   a_intra) + 2 n / b_slowest, plus one chunk's fill per level.
//! - recursive doubling: log2(p) rounds, each moving all n bytes over that round's link.
//! - direct (one-shot): every rank sends all n bytes to each of the p - 1 others at once,
//!   through its own link: a + (p - 1) n / b.
//!
//! Bandwidths are per rank (what one rank can push through the link it uses). Between nodes
//! the ring and the trees use every rank's NIC at once (one channel per rank of a node), so
//! their bandwidth there is min(intra, per_node x inter).

use crate::plan::Algo;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// Bytes per second one rank can send over it.
    pub bytes_per_s: f64,
    /// Seconds from a send to its arrival, for a small message.
    pub latency_s: f64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Machine {
    pub nodes: usize,
    pub per_node: usize,
    pub intra: Link,
    pub inter: Link,
    /// Pipelining chunk of ring and tree plans.
    pub chunk_bytes: f64,
    /// Bytes per second one rank folds into its accumulator (the reduction kernel); on a
    /// host it shares the core with the copies, so it adds to the transfer time. 0: free
    /// (a GPU, where it hides under the copy).
    pub reduce_bytes_per_s: f64,
    /// Where the CPU moves the bytes (the host executor): what the CPU adds. None on GPUs.
    pub host: Option<HostEffects>,
}

/// What a CPU-driven data path adds to the alpha-beta model. Fitted on loopback TCP with 2,
/// 4 and 8 ranks on 2 cores (bench/results/README.md, "Cost model"), where the fit is within
/// 25% for ring and tree from 2 MB up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostEffects {
    /// Ranks per core on a host (at least 1): they share its cores, so each rank's
    /// bandwidths divide by it and its latencies multiply by it.
    pub ranks_per_core: f64,
    /// Beyond this many bytes per rank the buffers leave the caches ...
    pub cache_bytes: f64,
    /// ... and bandwidths scale by this.
    pub cold_factor: f64,
    /// A ring or recursive-doubling step waits for its partner to be scheduled: each extra
    /// rank per core adds this fraction of one step's transfer. Tree levels work on
    /// pipelined chunks and showed none.
    pub step_bubble: f64,
}

impl HostEffects {
    /// The fitted values for a host with `ranks_per_core` (bench/results/README.md).
    pub fn fitted(ranks_per_core: f64) -> HostEffects {
        HostEffects {
            ranks_per_core: ranks_per_core.max(1.0),
            cache_bytes: 2.0 * 1024.0 * 1024.0,
            cold_factor: 0.5,
            step_bubble: 0.1,
        }
    }
}

fn log2_ceil(x: usize) -> f64 {
    (x.max(1) as f64).log2().ceil()
}

/// Latency and bandwidths as one rank sees them for a message of `n` bytes per rank.
#[derive(Clone, Copy)]
struct Eff {
    intra: Link,
    inter: Link,
    slow: Link,
    reduce: f64,
    /// Extra seconds per dependent ring/rdouble step, per byte of that step.
    bubble_per_byte: f64,
}

impl Machine {
    pub fn ranks(&self) -> usize {
        self.nodes * self.per_node
    }

    fn effective(&self, n: f64) -> Eff {
        let (s, f, bub) = match self.host {
            Some(h) => (
                h.ranks_per_core.max(1.0),
                if n > h.cache_bytes {
                    h.cold_factor
                } else {
                    1.0
                },
                h.step_bubble,
            ),
            None => (1.0, 1.0, 0.0),
        };
        let adj = |l: Link| Link {
            bytes_per_s: l.bytes_per_s * f / s,
            latency_s: l.latency_s * s,
        };
        let (intra, inter) = (adj(self.intra), adj(self.inter));
        // Every step of a ring waits for the slowest link in it: the network, when there are
        // several nodes. Rings and trees run one channel per rank of a node, each through
        // that rank's own NIC (as NCCL's channels do), so the node's NICs together carry
        // what crosses between nodes: per_node x inter, but no more than intra.
        // The host executor runs one ring (one plan per call), so there one rank's link
        // carries what crosses between nodes.
        let nics = if self.host.is_some() {
            1.0
        } else {
            self.per_node as f64
        };
        let slow = if self.nodes > 1 {
            Link {
                bytes_per_s: (inter.bytes_per_s * nics).min(intra.bytes_per_s),
                latency_s: inter.latency_s.max(intra.latency_s),
            }
        } else {
            intra
        };
        Eff {
            intra,
            inter,
            slow,
            reduce: self.reduce_bytes_per_s * f / s,
            bubble_per_byte: (s - 1.0) * bub / slow.bytes_per_s,
        }
    }

    /// Predicted seconds for one all-reduce of `n` bytes per rank with `algo`.
    pub fn all_reduce(&self, algo: Algo, n: f64) -> f64 {
        let p = self.ranks();
        if p <= 1 {
            return 0.0;
        }
        let pf = p as f64;
        let e = self.effective(n);
        let s = e.slow;
        let reduce = |bytes: f64| {
            if e.reduce > 0.0 {
                bytes / e.reduce
            } else {
                0.0
            }
        };
        match algo {
            Algo::Ring => {
                let steps = 2.0 * (pf - 1.0);
                let step_bytes = (n / pf).min(self.chunk_bytes);
                steps * (s.latency_s + step_bytes * e.bubble_per_byte)
                    + steps / pf * n / s.bytes_per_s
                    + reduce(n * (pf - 1.0) / pf)
            }
            Algo::Tree => {
                let depth_inter = log2_ceil(self.nodes);
                let depth_intra = log2_ceil(self.per_node);
                let latency =
                    2.0 * (depth_inter * e.inter.latency_s + depth_intra * e.intra.latency_s);
                // Each half goes up one tree and down it. An inner node sends its half up and
                // two copies down (1.5 n), and is a leaf in the other tree (0.5 n): 2 n in
                // all, of which it folds n. With 2 ranks each rank has one child: n and n/2.
                let volume = if p == 2 { 1.0 } else { 2.0 };
                // One chunk's transfer per level before the pipeline streams. On hosts the
                // fit found it hidden (the two trees' chunks interleave), so it is left out.
                let fill = match self.host {
                    None => {
                        2.0 * (depth_inter + depth_intra) * self.chunk_bytes.min(n / 2.0)
                            / s.bytes_per_s
                    }
                    Some(_) => 0.0,
                };
                latency + fill + volume * n / s.bytes_per_s + reduce(volume / 2.0 * n)
            }
            Algo::RecursiveDoubling => {
                let r_inter = if self.nodes > 1 {
                    log2_ceil(self.nodes)
                } else {
                    0.0
                };
                let r_intra = log2_ceil(self.per_node);
                // Not a power of two: the extra ranks fold in before and get the result after.
                let extra = if p.is_power_of_two() { 0.0 } else { 2.0 };
                let intra = if self.nodes > 1 { e.intra } else { s };
                let round = |l: Link| l.latency_s + n / l.bytes_per_s + n * e.bubble_per_byte;
                r_inter * round(e.inter)
                    + (r_intra + extra) * round(intra)
                    + reduce((r_inter + r_intra + extra / 2.0) * n)
            }
            // Not pipelined: all p - 1 copies arrive, then they are folded. The p - 1 sends
            // leave one after another, each adding part of a latency.
            Algo::Direct => {
                s.latency_s * (1.0 + (pf - 2.0) * 0.75)
                    + (pf - 1.0) * n / s.bytes_per_s
                    + reduce((pf - 1.0) * n)
            }
            // Inside each host a ring over its L ranks, across hosts L rings at once, each
            // carrying 1/L of the data through its own rank's link (`plan/hier.rs`).
            Algo::Hier(l) if self.nodes > 1 && l > 1 => {
                let (lf, hf) = (l as f64, self.nodes as f64);
                let seg = n / lf;
                let ring = |steps: f64, k: f64, bytes: f64, link: Link| {
                    steps * (link.latency_s + (bytes / k).min(self.chunk_bytes) * e.bubble_per_byte)
                        + steps / k * bytes / link.bytes_per_s
                };
                ring(2.0 * (lf - 1.0), lf, n, e.intra)
                    + ring(2.0 * (hf - 1.0), hf, seg, e.inter)
                    + reduce(n * (lf - 1.0) / lf + seg * (hf - 1.0) / hf)
            }
            _ => f64::INFINITY,
        }
    }

    /// The all-reduce algorithms a job of this size may use, best predicted first.
    pub fn rank_all_reduce(&self, n: f64) -> Vec<(Algo, f64)> {
        // The hierarchical plans run on the host path, between several nodes of several ranks.
        let hier = (self.host.is_some() && self.nodes > 1 && self.per_node > 1)
            .then_some(Algo::Hier(self.per_node));
        let mut v: Vec<(Algo, f64)> = CANDIDATES
            .iter()
            .copied()
            .chain(hier)
            .filter(|&a| a != Algo::Direct || self.ranks() <= DIRECT_MAX_RANKS)
            .map(|a| (a, self.all_reduce(a, n)))
            .collect();
        v.sort_by(|x, y| x.1.total_cmp(&y.1));
        v
    }
}

/// The all-reduce algorithms the model chooses among; on a tie the earlier wins (with 2
/// ranks ring and tree price the same, and the ring measured faster).
pub const CANDIDATES: [Algo; 4] = [
    Algo::Direct,
    Algo::RecursiveDoubling,
    Algo::Ring,
    Algo::Tree,
];
/// One-shot all-reduce sends p - 1 copies at once, which the model prices as parallel; past
/// this many ranks the senders' CPUs serialise them (measured over TCP, bench/results), so
/// it is not offered.
pub const DIRECT_MAX_RANKS: usize = 4;

/// Bus bandwidth of an all-reduce of `n` bytes per rank taking `t` seconds (nccl-tests).
pub fn all_reduce_busbw(n: f64, t: f64, p: usize) -> f64 {
    if t <= 0.0 {
        return 0.0;
    }
    n / t * 2.0 * (p as f64 - 1.0) / p as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ib(nodes: usize) -> Machine {
        Machine {
            nodes,
            per_node: 8,
            intra: Link {
                bytes_per_s: 450e9,
                latency_s: 1e-6,
            },
            inter: Link {
                bytes_per_s: 50e9,
                latency_s: 5e-6,
            },
            chunk_bytes: 512.0 * 1024.0,
            reduce_bytes_per_s: 0.0,
            host: None,
        }
    }

    #[test]
    fn tree_latency_grows_as_log_n_and_ring_as_n() {
        let (small, big) = (ib(64), ib(1024));
        let ring = big.all_reduce(Algo::Ring, 8.0) / small.all_reduce(Algo::Ring, 8.0);
        let tree = big.all_reduce(Algo::Tree, 8.0) / small.all_reduce(Algo::Tree, 8.0);
        assert!(
            (15.0..17.0).contains(&ring),
            "ring at 16x the ranks: {ring}x"
        );
        // log2: 6 -> 10 levels between nodes (plus the chain inside each).
        assert!((1.0..2.0).contains(&tree), "tree at 16x the ranks: {tree}x");
    }

    #[test]
    fn ranks_sharing_cores_slow_every_algorithm_and_16384_ranks_are_instant() {
        let mut m = ib(1);
        let alone = m.all_reduce(Algo::Ring, 1e6);
        m.host = Some(HostEffects::fitted(4.0));
        let shared = m.all_reduce(Algo::Ring, 1e6);
        assert!(shared > 3.0 * alone, "{alone} -> {shared}");
        // Fewer than one rank per core counts as one.
        m.host = Some(HostEffects::fitted(0.25));
        assert_eq!(m.host.map(|h| h.ranks_per_core), Some(1.0));
        let big = ib(2048);
        assert_eq!(big.ranks(), 16384);
        for a in CANDIDATES {
            let t = big.all_reduce(a, 8e9);
            assert!(t.is_finite() && t > 0.0, "{a:?}: {t}");
        }
    }

    #[test]
    fn between_nodes_every_nic_of_a_node_carries_the_ring() {
        // 8 ranks x 50 GB/s of NICs per node, capped by 450 GB/s inside: busbw -> 400 GB/s.
        let m = ib(248);
        let t = m.all_reduce(Algo::Ring, 64e9);
        let bw = all_reduce_busbw(64e9, t, m.ranks());
        assert!(bw > 350e9 && bw <= 400e9, "{bw}");
    }

    /// Two hosts of two ranks on the host path (the netns rails: 150 MB/s between the nodes,
    /// shared): the hierarchical plan crosses with half the ring's bytes per rank, so it is
    /// chosen for large calls (measured 1.45x the ring at 16 MB, bench/results); on GPUs
    /// (no host effects) it is not offered.
    #[test]
    fn host_jobs_across_nodes_choose_the_hierarchical_plan_for_large_calls() {
        let m = Machine {
            nodes: 2,
            per_node: 2,
            intra: Link {
                bytes_per_s: 3.6e9,
                latency_s: 10e-6,
            },
            inter: Link {
                bytes_per_s: 150e6,
                latency_s: 25e-6,
            },
            chunk_bytes: 512.0 * 1024.0,
            reduce_bytes_per_s: 7.5e9,
            host: Some(HostEffects::fitted(1.0)),
        };
        assert_eq!(m.rank_all_reduce(16e6)[0].0, Algo::Hier(2));
        let ring = m.all_reduce(Algo::Ring, 16e6);
        let hier = m.all_reduce(Algo::Hier(2), 16e6);
        assert!(ring / hier > 1.3, "ring {ring} s, hier {hier} s");
        let gpu = Machine { host: None, ..m };
        assert!(gpu
            .rank_all_reduce(16e6)
            .iter()
            .all(|(a, _)| !matches!(a, Algo::Hier(_))));
        let one = Machine { nodes: 1, ..m };
        assert!(one
            .rank_all_reduce(16e6)
            .iter()
            .all(|(a, _)| !matches!(a, Algo::Hier(_))));
    }

    #[test]
    fn large_messages_go_to_the_bandwidth_algorithms() {
        let m = ib(1024);
        let small = m.rank_all_reduce(8.0)[0].0;
        assert!(
            matches!(small, Algo::Tree | Algo::RecursiveDoubling),
            "{small:?}"
        );
        let big = m.rank_all_reduce(8e9)[0].0;
        assert!(matches!(big, Algo::Ring | Algo::Tree), "{big:?}");
        // Tree busbw approaches the node's network bandwidth (8 x 50 GB/s).
        let t = m.all_reduce(Algo::Tree, 8e9);
        let bw = all_reduce_busbw(8e9, t, m.ranks());
        assert!(bw > 0.8 * 400e9 && bw <= 400e9, "{bw}");
    }
}
