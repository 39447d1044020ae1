//! Which algorithm a call uses: forced by `RAILCC_ALGO`, or the cost model's choice per size
//! bucket for all-reduce.

use super::*;

impl Communicator {
    /// The cost model's all-reduce algorithm for `bytes` per rank, cached per power-of-two
    /// size bucket ([`crate::cost`]; links from `RAILCC_LOCAL_*` and `RAILCC_NET_*`).
    fn model_choice(&self, bytes: usize) -> Algo {
        let bucket = usize::BITS - bytes.leading_zeros();
        if let Some(&a) = self.algo_cache.lock().get(&bucket) {
            return a;
        }
        let link = |lat_us: u64, mbps: u64| Link {
            bytes_per_s: mbps.max(1) as f64 * 1e6,
            latency_s: lat_us as f64 * 1e-6,
        };
        let m = Machine {
            nodes: self.nodes,
            per_node: self.nranks.div_ceil(self.nodes.max(1)),
            intra: link(self.cfg.local_lat_us, self.cfg.local_mbytes_per_s),
            inter: link(self.cfg.net_lat_us, self.cfg.net_mbytes_per_s),
            chunk_bytes: self.cfg.chunk_bytes as f64,
            reduce_bytes_per_s: self.cfg.reduce_mbytes_per_s as f64 * 1e6,
            host: Some(HostEffects::fitted(
                self.local_ranks as f64 / host_cores().max(1) as f64,
            )),
        };
        // The bucket's smallest size stands for it: it is the size itself when sizes are
        // powers of two, as they usually are.
        let at = if bucket == 0 {
            0.0
        } else {
            (1u64 << (bucket - 1)) as f64
        };
        // The hierarchical plan needs the same rank count on every host.
        let a = m
            .rank_all_reduce(at)
            .into_iter()
            .map(|x| x.0)
            .find(|a| !matches!(a, Algo::Hier(_)) || Some(*a) == self.hier())
            .unwrap_or(Algo::Ring);
        self.algo_cache.lock().insert(bucket, a);
        a
    }

    /// The hierarchical plan, when every host holds the same number of ranks.
    fn hier(&self) -> Option<Algo> {
        self.per_host.map(Algo::Hier)
    }

    /// The hierarchical plan when `RAILCC_ALGO=hier` asks for it and the hosts allow it.
    fn forced_hier(&self) -> Option<Algo> {
        (self.cfg.algo == AlgoChoice::Hier)
            .then(|| self.hier())
            .flatten()
    }

    /// The algorithm a call would use.
    pub fn algo_for(&self, a: &CollArgs) -> Algo {
        match a.coll {
            CollKind::AllReduce => {
                let bytes = a.count * a.dtype.size();
                match self.cfg.algo {
                    AlgoChoice::Ring => Algo::Ring,
                    AlgoChoice::Direct => Algo::Direct,
                    AlgoChoice::RecursiveDoubling => Algo::RecursiveDoubling,
                    AlgoChoice::Tree => Algo::Tree,
                    AlgoChoice::Hier => self.hier().unwrap_or(Algo::Ring),
                    AlgoChoice::Auto => self.model_choice(bytes),
                }
            }
            CollKind::Broadcast | CollKind::Reduce => self.forced_hier().unwrap_or(Algo::Chain),
            CollKind::AllToAll | CollKind::SendRecv => Algo::PointToPoint,
            CollKind::Barrier => Algo::Dissemination,
            CollKind::AllGather | CollKind::ReduceScatter => {
                self.forced_hier().unwrap_or(Algo::Ring)
            }
        }
    }
}
