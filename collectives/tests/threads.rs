//! Ranks as threads of one process, talking over real TCP sockets on loopback.

use railcc_collectives::{Communicator, Config, ErrorKind, ReduceOp};
use railcc_core::bootstrap::RootServer;
use std::sync::Arc;
use std::time::Duration;

fn with_ranks<F>(n: usize, cfg: Config, f: F)
where
    F: Fn(Communicator) + Send + Sync + 'static,
{
    let root = RootServer::start("127.0.0.1:0".parse().unwrap(), Duration::from_secs(20)).unwrap();
    let id = root.id;
    let f = Arc::new(f);
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let (f, cfg) = (f.clone(), cfg.clone());
            std::thread::spawn(move || f(Communicator::init(cfg, &id, r, n).unwrap()))
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

#[test]
fn all_reduce_ring_and_direct_three_ranks() {
    for algo in ["ring", "direct"] {
        let cfg = Config::default()
            .apply_vars(|k| (k == "RAILCC_ALGO").then(|| algo.to_string()))
            .unwrap();
        let cfg = Config {
            chunk_bytes: 4096,
            ..cfg
        };
        with_ranks(3, cfg, move |c| {
            let n = 100_003;
            let args = railcc_collectives::plan::CollArgs {
                coll: railcc_core::call::CollKind::AllReduce,
                nranks: 3,
                count: n,
                dtype: railcc_core::DataType::F32,
                op: ReduceOp::Sum,
                root: 0,
            };
            assert_eq!(
                c.algo_for(&args).name(),
                algo,
                "RAILCC_ALGO={algo} took effect"
            );
            let send: Vec<f32> = (0..n).map(|i| (i % 7) as f32 + c.rank() as f32).collect();
            let mut recv = vec![0f32; n];
            c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
            for (i, v) in recv.iter().enumerate() {
                assert_eq!(*v, 3.0 * (i % 7) as f32 + 3.0, "element {i}");
            }
            let mut buf = send.clone();
            c.all_reduce_in_place(&mut buf, ReduceOp::Max).unwrap();
            for (i, v) in buf.iter().enumerate() {
                assert_eq!(*v, (i % 7) as f32 + 2.0, "max, element {i}");
            }
            c.barrier().unwrap();
        });
    }
}

#[test]
fn p2p_pairs_and_group() {
    with_ranks(2, Config::default(), |c| {
        let other = 1 - c.rank();
        let mine = vec![c.rank() as u64 + 10; 1000];
        let mut got = vec![0u64; 1000];
        use railcc_collectives::P2p;
        c.group(&mut [
            P2p::Send {
                peer: other,
                buf: &mine,
            },
            P2p::Recv {
                peer: other,
                buf: &mut got,
            },
        ])
        .unwrap();
        assert!(got.iter().all(|v| *v == other as u64 + 10));
    });
}

#[test]
fn short_buffer_and_bad_root_are_errors() {
    with_ranks(2, Config::default(), |c| {
        let mut small = vec![0f32; 3];
        let e = c
            .all_reduce(&[1f32; 8], &mut small, ReduceOp::Sum)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("receive buffer holds 12 bytes"), "{e}");
        let e = c.broadcast_in_place(&mut [0f32; 4], 7).unwrap_err();
        assert!(e.message.contains("root 7 out of range"), "{e}");
        // still usable after argument errors
        c.barrier().unwrap();
    });
}

#[test]
fn abort_from_another_thread_unblocks_a_waiter_quickly() {
    // No connection exists between the two ranks, so rank 1 learns nothing from rank 0's abort
    // and ends on its own (short) deadline, naming rank 0.
    let cfg = Config {
        timeout_ms: 3000,
        ..Config::default()
    };
    with_ranks(2, cfg, |c| {
        let c = Arc::new(c);
        if c.rank() == 0 {
            // Rank 1 never sends: this receive would wait for the full 60 s timeout.
            let c2 = c.clone();
            let aborter = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                c2.abort();
            });
            let t = std::time::Instant::now();
            let mut buf = vec![0u8; 16];
            let e = c.recv(&mut buf, 1).unwrap_err();
            assert!(matches!(e.kind, ErrorKind::Aborted), "{e}");
            assert!(
                t.elapsed() < Duration::from_secs(1) + Duration::from_millis(200),
                "took {:?}",
                t.elapsed()
            );
            aborter.join().unwrap();
            assert!(c.async_error().is_some());
            assert_eq!(c.barrier().unwrap_err().kind, ErrorKind::Aborted);
        } else {
            // Wait for rank 0 to give up; its closed connection ends our receive too.
            let mut buf = vec![0u8; 16];
            let e = c.recv(&mut buf, 0).unwrap_err();
            assert!(
                matches!(e.kind, ErrorKind::PeerClosed | ErrorKind::Timeout),
                "{e}"
            );
            assert!(e.message.contains("rank 0"), "{e}");
        }
    });
}

#[test]
fn an_abort_with_a_reason_reaches_the_peers() {
    // The hierarchical GPU path aborts its network engine with the failure it saw on the host
    // (a GPU peer's death): the waiter here and the peer across the connection both name it.
    let cfg = Config {
        timeout_ms: 5000,
        ..Config::default()
    };
    with_ranks(2, cfg, |c| {
        let c = Arc::new(c);
        c.barrier().unwrap();
        let mut buf = vec![0u8; 16];
        if c.rank() == 0 {
            let c2 = c.clone();
            let aborter = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                let why = railcc_collectives::Error::new(
                    ErrorKind::PeerClosed,
                    "rank 7 (pid 1) exited during GPU collectives",
                )
                .peer(7)
                .rank(0);
                c2.abort_with(why);
            });
            let e = c.recv(&mut buf, 1).unwrap_err();
            aborter.join().unwrap();
            assert_eq!(e.kind, ErrorKind::PeerClosed, "{e}");
            assert!(e.to_string().contains("rank 7 (pid 1) exited"), "{e}");
            assert!(c
                .async_error()
                .is_some_and(|a| a.to_string().contains("rank 7")));
        } else {
            let e = c.recv(&mut buf, 0).unwrap_err();
            assert!(e.to_string().contains("rank 7"), "{e}");
        }
    });
}

/// f16/bf16 sums accumulate wider than their storage where one step reduces every input (the
/// direct algorithm): 256 + 7 x 1 over 8 ranks is 263, 264 in bf16; adding one rank at a time
/// in bf16 gives 256 (256 + 1 rounds back to 256). Ring and tree partial sums travel between
/// ranks in the storage type, as NCCL's do, so there the bound of `precision` applies instead.
#[test]
fn half_sums_keep_their_digits_in_the_direct_algorithm() {
    use half::{bf16, f16};
    let narrow = (0..7).fold(bf16::from_f32(256.0), |a, _| {
        bf16::from_f32(a.to_f32() + 1.0)
    });
    assert_eq!(
        narrow.to_f32(),
        256.0,
        "the premise: plain bf16 loses the ones"
    );
    let cfg = Config::default()
        .apply_vars(|k| (k == "RAILCC_ALGO").then(|| "direct".to_string()))
        .unwrap();
    with_ranks(8, cfg, |c| {
        let big = c.rank() == 0;
        let send: Vec<bf16> = vec![bf16::from_f32(if big { 256.0 } else { 1.0 }); 1001];
        let mut recv = vec![bf16::ZERO; send.len()];
        c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
        assert!(
            recv.iter().all(|v| v.to_f32() == 264.0),
            "bf16: {}",
            recv[0]
        );
        let mut avg = send.clone();
        c.all_reduce_in_place(&mut avg, ReduceOp::Avg).unwrap();
        assert!(
            avg.iter().all(|v| v.to_f32() == 33.0),
            "bf16 avg: {}",
            avg[0]
        );
        let send: Vec<f16> = vec![f16::from_f32(if big { 2048.0 } else { 1.0 }); 1001];
        let mut recv = vec![f16::ZERO; send.len()];
        c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
        assert!(
            recv.iter().all(|v| v.to_f32() == 2056.0),
            "f16: {}",
            recv[0]
        );
    });
}

/// Every hierarchical plan over real sockets (all-reduce, all-gather, reduce-scatter,
/// broadcast, reduce): 2 hosts (RAILCC_HOSTID) of 2 ranks,
/// interleaved (ranks 0 and 2 on one, 1 and 3 on the other), sums and averages checked.
#[test]
fn hierarchical_all_reduce_two_hosts_of_two() {
    let root = RootServer::start("127.0.0.1:0".parse().unwrap(), Duration::from_secs(20)).unwrap();
    let id = root.id;
    let hs: Vec<_> = (0..4usize)
        .map(|r| {
            std::thread::spawn(move || {
                let cfg = Config::default()
                    .apply_vars(|k| match k {
                        "RAILCC_ALGO" => Some("hier".into()),
                        "RAILCC_HOSTID" => Some(format!("host{}", r % 2)),
                        _ => None,
                    })
                    .unwrap();
                let cfg = Config {
                    chunk_bytes: 4096,
                    ..cfg
                };
                let c = Communicator::init(cfg, &id, r, 4).unwrap();
                let n = 50_001;
                let args = railcc_collectives::plan::CollArgs {
                    coll: railcc_core::call::CollKind::AllReduce,
                    nranks: 4,
                    count: n,
                    dtype: railcc_core::DataType::F32,
                    op: ReduceOp::Sum,
                    root: 0,
                };
                assert_eq!(
                    c.algo_for(&args).name(),
                    "hier",
                    "RAILCC_ALGO=hier took effect"
                );
                let send: Vec<f32> = (0..n).map(|i| (i % 5) as f32 + r as f32).collect();
                let mut recv = vec![0f32; n];
                c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
                for (i, v) in recv.iter().enumerate() {
                    assert_eq!(*v, 4.0 * (i % 5) as f32 + 6.0, "rank {r}, element {i}");
                }
                let mut buf = send.clone();
                c.all_reduce_in_place(&mut buf, ReduceOp::Avg).unwrap();
                for (i, v) in buf.iter().enumerate() {
                    assert_eq!(*v, (i % 5) as f32 + 1.5, "avg, rank {r}, element {i}");
                }
                // All-gather takes the hierarchical plan too; blocks land in rank order.
                let mine: Vec<u32> = (0..1001).map(|i| (r * 10_000 + i) as u32).collect();
                let mut all = vec![0u32; 4 * 1001];
                c.all_gather(&mine, &mut all).unwrap();
                for (j, v) in all.iter().enumerate() {
                    let (from, i) = (j / 1001, j % 1001);
                    assert_eq!(*v, (from * 10_000 + i) as u32, "rank {r}, gathered {j}");
                }
                // And reduce-scatter: block b of every rank's input summed, to rank b.
                let input: Vec<i64> = (0..4 * 777).map(|j| (j + r) as i64).collect();
                let mut mine = vec![0i64; 777];
                c.reduce_scatter(&input, &mut mine, ReduceOp::Sum).unwrap();
                for (i, v) in mine.iter().enumerate() {
                    let j = (r * 777 + i) as i64;
                    assert_eq!(*v, 4 * j + 6, "rank {r}, reduced {i}");
                }
                // Broadcast from rank 3 and reduce to rank 2 (roots on either host).
                let src: Vec<u32> = (0..3001).map(|i| (i * 7 + r) as u32).collect();
                let mut got = vec![0u32; 3001];
                c.broadcast(&src, &mut got, 3).unwrap();
                for (i, v) in got.iter().enumerate() {
                    assert_eq!(*v, (i * 7 + 3) as u32, "rank {r}, broadcast {i}");
                }
                let mut total = vec![-1i64; 3001];
                c.reduce(&input[..3001], &mut total, ReduceOp::Sum, 2)
                    .unwrap();
                for (i, v) in total.iter().enumerate() {
                    let want = if r == 2 { 4 * i as i64 + 6 } else { -1 };
                    assert_eq!(*v, want, "rank {r}, reduce {i}");
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

/// GpuComm::new takes one rank per process: ranks sharing a process on one host are refused
/// before any GPU is touched (that placement is `GpuComm::in_process`'s); on different hosts the same pid is no conflict (containers reuse pids),
/// so the check passes and, here without a driver, the GPU part fails instead.
#[test]
fn gpu_ranks_may_share_a_pid_only_across_hosts() {
    use railcc_collectives::gpu::GpuComm;
    if railcc_cuda::driver::available().is_ok() {
        println!("CUDA driver present: this test is for machines without one");
        return;
    }
    with_ranks(2, Config::default(), |c| {
        let e = GpuComm::new(&c, 0)
            .err()
            .expect("two ranks of one process on one host");
        assert!(e.to_string().contains("share processes"), "{e}");
    });
    let root = RootServer::start("127.0.0.1:0".parse().unwrap(), Duration::from_secs(20)).unwrap();
    let id = root.id;
    let hs: Vec<_> = (0..2)
        .map(|r| {
            std::thread::spawn(move || {
                let cfg = Config {
                    hostid: format!("host{r}"),
                    ..Config::default()
                };
                let c = Communicator::init(cfg, &id, r, 2).unwrap();
                let e = GpuComm::new(&c, 0).err().expect("no GPU here");
                assert!(!e.to_string().contains("share processes"), "{e}");
                assert!(e.to_string().contains("CUDA driver"), "{e}");
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}
