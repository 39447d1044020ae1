//! The GPU network engine's cut (`gpu_net::pieces`) run with host memory where the device
//! memory would be: ranks as threads over real loopback sockets, each piece copied into a
//! stage, its host call run, and copied back, exactly as a channel's thread does with device
//! copies. Every collective, in and out of place, and send/recv groups whose messages are cut
//! into different numbers of pieces, against the reference.

use railcc_collectives::gpu::net::host::run_host;
use railcc_collectives::gpu::net::pieces::{pieces, stage_need, Cut, NetOp, P2pOp};
use railcc_collectives::plan::{CollArgs, P2pKind};
use railcc_collectives::reference::{expected, fill_input};
use railcc_collectives::{CollKind, Communicator, Config, DataType, ReduceOp};
use railcc_core::bootstrap::RootServer;
use std::sync::Arc;
use std::time::Duration;

fn with_ranks<F>(n: usize, f: F)
where
    F: Fn(Communicator) + Send + Sync + 'static,
{
    let root = RootServer::start("127.0.0.1:0".parse().unwrap(), Duration::from_secs(30)).unwrap();
    let id = root.id;
    let f = Arc::new(f);
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let f = f.clone();
            std::thread::spawn(move || f(Communicator::init(Config::default(), &id, r, n).unwrap()))
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

/// Runs `op` the way the engine does, channel after channel, with host addresses.
fn run(comm: &Communicator, op: &NetOp, cut: &Cut) {
    let per_channel = pieces(op, comm.rank(), cut);
    let (sn, rn) = stage_need(per_channel.iter().flatten());
    let mut send = vec![0u8; sn];
    let mut recv = vec![0u8; rn];
    for p in per_channel.iter().flatten() {
        for s in &p.down {
            // SAFETY: `s.dev` is an address inside the caller's buffer of the call's size.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    s.dev as *const u8,
                    send[s.stage..].as_mut_ptr(),
                    s.bytes,
                )
            };
        }
        run_host(comm, &p.call, &send, &mut recv).unwrap();
        for s in &p.up {
            // SAFETY: as above, the other way.
            unsafe {
                std::ptr::copy_nonoverlapping(recv[s.stage..].as_ptr(), s.dev as *mut u8, s.bytes)
            };
        }
    }
}

const CUT: Cut = Cut {
    channels: 3,
    chunk_bytes: 1000,
    max_piece_bytes: 1000,
    target_pieces: 8,
    min_spread_bytes: 256,
    p2p_min_spread_bytes: 256,
    p2p_max_piece_bytes: 1000,
};

#[test]
fn every_collective_cut_into_pieces_matches_the_reference() {
    let n = 3;
    with_ranks(n, move |c| {
        let me = c.rank();
        for coll in [
            CollKind::AllReduce,
            CollKind::AllGather,
            CollKind::ReduceScatter,
            CollKind::Broadcast,
            CollKind::Reduce,
            CollKind::AllToAll,
            CollKind::SendRecv,
        ] {
            for (dtype, op) in [
                (DataType::F32, ReduceOp::Sum),
                (DataType::I32, ReduceOp::Max),
                (DataType::Bf16, ReduceOp::Avg),
            ] {
                for count in [1usize, 250, 1001] {
                    let a = CollArgs {
                        coll,
                        nranks: n,
                        count,
                        dtype,
                        op,
                        root: 1,
                    };
                    let es = dtype.size();
                    let inputs: Vec<Vec<u8>> = (0..n).map(|r| fill_input(&a, r, 7)).collect();
                    // Out of place.
                    let send = inputs[me].clone();
                    let prior = vec![0x5Au8; a.recv_elems() * es];
                    let mut recv = prior.clone();
                    let op_ = NetOp::Coll {
                        a,
                        send: send.as_ptr() as u64,
                        recv: recv.as_mut_ptr() as u64,
                    };
                    run(&c, &op_, &CUT);
                    let want = expected(&a, &inputs, me, &prior);
                    assert!(
                        recv == want,
                        "{coll:?} {dtype} {op:?} count {count}, out of place, rank {me}"
                    );
                    // In place (NCCL's layouts), where NCCL allows it.
                    if matches!(coll, CollKind::AllToAll | CollKind::SendRecv) {
                        continue;
                    }
                    let (sr, rr, total) = a.in_place_ranges(me);
                    let mut buf = vec![0x33u8; total];
                    buf[sr.clone()].copy_from_slice(&inputs[me][..sr.len()]);
                    let prior = buf[rr.clone()].to_vec();
                    let base = buf.as_mut_ptr() as u64;
                    let op_ = NetOp::Coll {
                        a,
                        send: base + sr.start as u64,
                        recv: base + rr.start as u64,
                    };
                    run(&c, &op_, &CUT);
                    let want = expected(&a, &inputs, me, &prior);
                    assert!(
                        buf[rr.clone()] == want[..],
                        "{coll:?} {dtype} {op:?} count {count}, in place, rank {me}"
                    );
                }
            }
        }
        c.barrier().unwrap();
    });
}

fn msg_bytes(src: usize, dst: usize) -> usize {
    // Uneven: from 1 byte to several pieces, different in each direction.
    [1, 999, 2500, 4097, 37, 3001, 0, 1500, 6000][(src * 3 + dst) % 9]
}

fn byte(src: usize, dst: usize, i: usize) -> u8 {
    (src * 31 + dst * 7 + i * 13) as u8
}

#[test]
fn send_recv_groups_with_messages_cut_differently() {
    let n = 3;
    with_ranks(n, move |c| {
        let me = c.rank();
        let sends: Vec<Vec<u8>> = (0..n)
            .map(|d| (0..msg_bytes(me, d)).map(|i| byte(me, d, i)).collect())
            .collect();
        let mut recvs: Vec<Vec<u8>> = (0..n).map(|s| vec![0u8; msg_bytes(s, me)]).collect();
        let mut ops = Vec::new();
        // Receives first on odd ranks, sends first on even ones: the order inside a group
        // must not matter.
        for d in 0..n {
            let s = P2pOp {
                kind: P2pKind::Send,
                peer: d,
                addr: sends[d].as_ptr() as u64,
                bytes: sends[d].len(),
            };
            let r = P2pOp {
                kind: P2pKind::Recv,
                peer: d,
                addr: recvs[d].as_mut_ptr() as u64,
                bytes: recvs[d].len(),
            };
            if me % 2 == 0 {
                ops.extend([s, r])
            } else {
                ops.extend([r, s])
            }
        }
        ops.retain(|o| o.bytes > 0);
        // Messages spread over the channels from 256 bytes a channel, then never (only
        // the piece cap cuts them): both ends cut each message alike either way.
        for spread in [256, 1 << 20] {
            for r in recvs.iter_mut() {
                r.fill(0);
            }
            let cut = Cut {
                p2p_min_spread_bytes: spread,
                ..CUT
            };
            run(&c, &NetOp::P2p(ops.clone()), &cut);
            for (s, got) in recvs.iter().enumerate() {
                for (i, b) in got.iter().enumerate() {
                    assert_eq!(
                        *b,
                        byte(s, me, i),
                        "rank {me}, spread {spread}: byte {i} from {s}"
                    );
                }
            }
            c.barrier().unwrap();
        }
    });
}
