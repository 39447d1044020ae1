//! Every channel of a new engine connects and runs one piece-sized all-reduce, all at once.

use crate::comm::Communicator;
use railcc_core::{Error, ErrorKind, Result};
use std::sync::Arc;

/// Every channel runs one piece-sized all-reduce now, all at once: a channel connects to its
/// peers on first use, so without this the first large call (often inside an overlapped
/// training step) waited for most channels' connections, their TCP slow start and their
/// first plans and scratch. Collective: every rank of the engine runs it at init.
pub(super) fn warm_channels(comms: &[Arc<Communicator>], slot_cap: Option<usize>) -> Result<()> {
    use crate::comm::Bufs;
    use railcc_core::call::{CollArgs, CollKind};
    use railcc_core::{DataType, ReduceOp};
    let bytes = slot_cap.unwrap_or(1 << 20).clamp(4096, 4 << 20);
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(ch, c)| {
                s.spawn(move || {
                    let a = CollArgs {
                        coll: CollKind::AllReduce,
                        nranks: c.nranks(),
                        count: bytes / 4,
                        dtype: DataType::F32,
                        op: ReduceOp::Sum,
                        root: 0,
                    };
                    let send = vec![0u8; bytes];
                    let mut recv = vec![0u8; bytes];
                    c.collective(
                        a,
                        Bufs::OutOfPlace {
                            send: &send,
                            recv: &mut recv,
                        },
                    )
                    .map_err(|e| e.op(format!("gpu net channel {ch} warm-up")))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Error::new(
                        ErrorKind::Aborted,
                        "gpu net: a channel's warm-up panicked",
                    ))
                })
            })
            .collect()
    });
    results.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::warm_channels;
    use crate::comm::Communicator;
    use railcc_core::bootstrap::RootServer;
    use railcc_core::config::Config;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// `channels` communicators of 2 ranks over loopback TCP; `f(rank, comms)` on each rank's
    /// thread, its results in rank order.
    fn two_ranks<T: Send + 'static>(
        channels: usize,
        cfg: Config,
        f: impl Fn(usize, Vec<Arc<Communicator>>) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let roots: Vec<RootServer> = (0..channels)
            .map(|_| RootServer::start("127.0.0.1:0".parse().unwrap(), cfg.timeout()).unwrap())
            .collect();
        let ids: Vec<_> = roots.iter().map(|r| r.id).collect();
        let f = Arc::new(f);
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let (f, cfg, ids) = (f.clone(), cfg.clone(), ids.clone());
                std::thread::spawn(move || {
                    // Each channel's init waits for both ranks: made on threads of their own.
                    let comms: Vec<Arc<Communicator>> = std::thread::scope(|s| {
                        let hs: Vec<_> = ids
                            .iter()
                            .map(|id| {
                                let cfg = cfg.clone();
                                s.spawn(move || Communicator::init(cfg, id, r, 2).unwrap())
                            })
                            .collect();
                        hs.into_iter()
                            .map(|h| Arc::new(h.join().unwrap()))
                            .collect()
                    });
                    f(r, comms)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    /// Both ranks warm three channels at once with 2 MiB pieces: every channel's all-reduce
    /// completes on both.
    #[test]
    fn channels_warm_up_together() {
        let res = two_ranks(3, Config::default(), |_, comms| {
            warm_channels(&comms, Some(2 << 20))
        });
        for (r, x) in res.into_iter().enumerate() {
            assert!(x.is_ok(), "rank {r}: {x:?}");
        }
    }

    /// A rank whose peer never warms up (it closed its channels) gets an error naming the
    /// peer, not a hang.
    #[test]
    fn a_peer_that_leaves_fails_the_warm_up() {
        let cfg = Config {
            timeout_ms: 5000,
            ..Config::default()
        };
        let res = two_ranks(2, cfg, |r, comms| {
            if r == 1 {
                drop(comms);
                return None;
            }
            let t0 = Instant::now();
            Some((warm_channels(&comms, Some(64 << 10)), t0.elapsed()))
        });
        let Some((Err(e), took)) = &res[0] else {
            panic!("rank 0 should fail: {:?}", res[0]);
        };
        assert!(e.to_string().contains("peer 1"), "{e}");
        assert!(*took < Duration::from_secs(20), "{took:?}");
    }
}
