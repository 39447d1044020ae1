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
        with_ranks(3, cfg, |c| {
            let n = 100_003;
            let send: Vec<f32> = (0..n).map(|i| (i % 7) as f32 + c.rank() as f32).collect();
            let mut recv = vec![0f32; n];
            c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
            for (i, v) in recv.iter().enumerate() {
                assert_eq!(*v, 3.0 * (i % 7) as f32 + 3.0, "element {i}");
            }
            let mut buf = send.clone();
            c.all_reduce_in_place(&mut buf, ReduceOp::Max).unwrap();
            assert_eq!(buf[0], 2.0);
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
