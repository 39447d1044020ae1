//! How one GPU call across the network is cut into pieces: each piece copies part of the
//! device buffers into a staging buffer, runs one host collective (or group of sends and
//! receives) on the staged bytes, and copies the result back. Pieces go round-robin to the
//! channels, so the channels' threads and connections share a large message, and each
//! channel's pieces pipeline (copies of one overlap the network of the next).
//!
//! Every rank cuts the same call the same way (the cut depends only on the call's shape and
//! the settings every rank shares), so piece j of channel c on one rank meets piece j of
//! channel c on every other. Send/recv messages are cut one by one, from their own size, so
//! the two ends of a message agree even when their groups hold different other messages.
//!
//! Pure arithmetic: tested on CI against the reference with host memory standing in for the
//! device (`tests/gpu_net_pieces.rs`).

use crate::plan::{CollArgs, P2pKind};
use railcc_core::call::CollKind;
use smallvec::{smallvec, SmallVec};

/// A copy between device memory and a staging buffer (`stage` is a byte offset in it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seg {
    pub dev: u64,
    pub stage: usize,
    pub bytes: usize,
}

/// What runs on the host between the copies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostCall {
    /// A collective from the send stage's first `send_bytes` to the receive stage's first
    /// `recv_bytes`.
    Coll(CollArgs),
    /// Sends (from the send stage) and receives (into the receive stage): kind, peer, stage
    /// offset, bytes.
    P2p(Vec<(P2pKind, usize, usize, usize)>),
}

/// A piece's segments on one side: most pieces have one, held inline (no heap block).
pub type Segs = SmallVec<[Seg; 1]>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Device -> send stage, before the call.
    pub down: Segs,
    pub call: HostCall,
    /// Receive stage -> device, after the call.
    pub up: Segs,
    pub send_bytes: usize,
    pub recv_bytes: usize,
}

/// One send or receive of a group, on device memory.
#[derive(Clone, Copy, Debug)]
pub struct P2pOp {
    pub kind: P2pKind,
    pub peer: usize,
    pub addr: u64,
    pub bytes: usize,
}

/// A call on device buffers (device addresses; NCCL's layouts and in-place conventions).
#[derive(Clone, Debug)]
pub enum NetOp {
    Coll { a: CollArgs, send: u64, recv: u64 },
    P2p(Vec<P2pOp>),
}

/// How calls are cut.
#[derive(Clone, Copy, Debug)]
pub struct Cut {
    pub channels: usize,
    /// Pieces are at least this many staged bytes (the larger of a piece's send and receive
    /// side) when the call holds that much: the pipelining grain.
    pub chunk_bytes: usize,
    /// Pieces are at most this many staged bytes (a staging ring's slot).
    pub max_piece_bytes: usize,
    /// A call is cut into about this many pieces (each costs operations on the caller's
    /// stream, so the call returns sooner with fewer).
    pub target_pieces: usize,
    /// A call is spread over every channel only when each gets at least this many bytes.
    pub min_spread_bytes: usize,
    /// The same for one message of a send/recv group (`RAILCC_GPU_NET_P2P_SPREAD_BYTES`): a
    /// message is cut by its own size alone, so both ends cut it alike.
    pub p2p_min_spread_bytes: usize,
    /// And at most this many bytes of each message in a piece (a send/recv group's piece
    /// holds a chunk of each of its messages).
    pub p2p_max_piece_bytes: usize,
}

/// Ranges `[a, b)` cutting `n` units of `unit_bytes` staged bytes each.
fn ranges(n: usize, unit_bytes: usize, cut: &Cut) -> Vec<(usize, usize)> {
    if n == 0 {
        return Vec::new();
    }
    let total = n.saturating_mul(unit_bytes.max(1));
    // Whole units per piece under the cap: no piece is over it, so the staging slot (the
    // cap under a budget) holds every piece when a unit does not divide it.
    let by_cap = n.div_ceil((cut.max_piece_bytes / unit_bytes.max(1)).max(1));
    let by_grain = total.div_ceil(cut.chunk_bytes.max(1));
    let mut k = by_cap.max(by_grain.min(cut.target_pieces.max(1)));
    if k < cut.channels && total / cut.channels >= cut.min_spread_bytes {
        k = cut.channels;
    }
    let k = k.clamp(1, n);
    (0..k).map(|i| (n * i / k, n * (i + 1) / k)).collect()
}

/// The pieces of `op` on `rank`, in order; piece k runs on channel k mod `cut.channels`.
pub fn pieces_in_order(op: &NetOp, rank: usize, cut: &Cut) -> Vec<Piece> {
    match op {
        NetOp::Coll { a, send, recv } => coll_pieces(a, *send, *recv, rank, cut),
        NetOp::P2p(ops) => p2p_pieces(ops, cut),
    }
}

/// The pieces of `op` on `rank`, per channel, in order.
pub fn pieces(op: &NetOp, rank: usize, cut: &Cut) -> Vec<Vec<Piece>> {
    let ch = cut.channels.max(1);
    let mut out: Vec<Vec<Piece>> = vec![Vec::new(); ch];
    for (k, p) in pieces_in_order(op, rank, cut).into_iter().enumerate() {
        out[k % ch].push(p);
    }
    out
}

fn coll_pieces(a: &CollArgs, send: u64, recv: u64, rank: usize, cut: &Cut) -> Vec<Piece> {
    let es = a.dtype.size();
    let p = a.nranks;
    if a.coll == CollKind::Barrier {
        return vec![Piece {
            down: Segs::new(),
            call: HostCall::Coll(*a),
            up: Segs::new(),
            send_bytes: 0,
            recv_bytes: 0,
        }];
    }
    // Staged bytes per unit of `count`: the larger side.
    let rows = match a.coll {
        CollKind::AllGather | CollKind::ReduceScatter | CollKind::AllToAll => p,
        _ => 1,
    };
    let at = |base: u64, elems: usize| base + (elems * es) as u64;
    ranges(a.count, es * rows, cut)
        .into_iter()
        .map(|(lo, hi)| {
            let m = hi - lo;
            let mb = m * es;
            let one = |dev: u64| -> Segs {
                smallvec![Seg {
                    dev,
                    stage: 0,
                    bytes: mb,
                }]
            };
            let rowed = |base: u64| -> Segs {
                (0..p)
                    .map(|r| Seg {
                        dev: at(base, r * a.count + lo),
                        stage: r * mb,
                        bytes: mb,
                    })
                    .collect()
            };
            let (down, up) = match a.coll {
                CollKind::AllGather => (one(at(send, lo)), rowed(recv)),
                CollKind::ReduceScatter => (rowed(send), one(at(recv, lo))),
                CollKind::AllToAll => (rowed(send), rowed(recv)),
                CollKind::Broadcast => (
                    if rank == a.root {
                        one(at(send, lo))
                    } else {
                        Segs::new()
                    },
                    one(at(recv, lo)),
                ),
                CollKind::Reduce => (
                    one(at(send, lo)),
                    if rank == a.root {
                        one(at(recv, lo))
                    } else {
                        Segs::new()
                    },
                ),
                _ => (one(at(send, lo)), one(at(recv, lo))),
            };
            let piece_args = CollArgs { count: m, ..*a };
            Piece {
                down,
                call: HostCall::Coll(piece_args),
                up,
                send_bytes: piece_args.send_elems() * es,
                recv_bytes: piece_args.recv_elems() * es,
            }
        })
        .collect()
}

/// Piece k holds chunk k of every message that has one; each side of the stage lays its
/// messages' chunks end to end.
fn p2p_pieces(ops: &[P2pOp], cut: &Cut) -> Vec<Piece> {
    let msg_cut = Cut {
        min_spread_bytes: cut.p2p_min_spread_bytes,
        max_piece_bytes: cut.p2p_max_piece_bytes.min(cut.max_piece_bytes),
        ..*cut
    };
    let cuts: Vec<Vec<(usize, usize)>> =
        (ops.iter()).map(|o| ranges(o.bytes, 1, &msg_cut)).collect();
    let n = cuts.iter().map(Vec::len).max().unwrap_or(0);
    let mut out = Vec::with_capacity(n);
    for k in 0..n {
        let mut piece = Piece {
            down: Segs::new(),
            call: HostCall::P2p(vec![]),
            up: Segs::new(),
            send_bytes: 0,
            recv_bytes: 0,
        };
        let mut calls = Vec::new();
        for (o, c) in ops.iter().zip(&cuts) {
            let Some(&(lo, hi)) = c.get(k) else { continue };
            let bytes = hi - lo;
            let dev = o.addr + lo as u64;
            match o.kind {
                P2pKind::Send => {
                    let stage = piece.send_bytes;
                    piece.down.push(Seg { dev, stage, bytes });
                    calls.push((o.kind, o.peer, stage, bytes));
                    piece.send_bytes += bytes;
                }
                P2pKind::Recv => {
                    let stage = piece.recv_bytes;
                    piece.up.push(Seg { dev, stage, bytes });
                    calls.push((o.kind, o.peer, stage, bytes));
                    piece.recv_bytes += bytes;
                }
            }
        }
        piece.call = HostCall::P2p(calls);
        out.push(piece);
    }
    out
}

/// Bytes the largest piece stages on each side.
pub fn stage_need<'a>(pieces: impl IntoIterator<Item = &'a Piece>) -> (usize, usize) {
    pieces.into_iter().fold((0, 0), |(s, r), p| {
        (s.max(p.send_bytes), r.max(p.recv_bytes))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use railcc_core::{DataType, ReduceOp};

    fn cut(ch: usize, chunk: usize) -> Cut {
        Cut {
            channels: ch,
            chunk_bytes: chunk,
            max_piece_bytes: chunk,
            target_pieces: 8,
            min_spread_bytes: 1024,
            p2p_min_spread_bytes: 1024,
            p2p_max_piece_bytes: chunk,
        }
    }

    #[test]
    fn ranges_cover_and_respect_the_chunk() {
        for n in [1usize, 5, 1000, 4097, 1 << 20] {
            for unit in [1usize, 4, 32] {
                for c in [cut(1, 4096), cut(4, 4096), cut(3, 1 << 20)] {
                    let r = ranges(n, unit, &c);
                    assert_eq!(r.first().map(|x| x.0), Some(0));
                    assert_eq!(r.last().map(|x| x.1), Some(n));
                    for w in r.windows(2) {
                        assert_eq!(w[0].1, w[1].0);
                    }
                    for (a, b) in &r {
                        assert!(b > a);
                        // Even cuts are at most one unit over the chunk.
                        assert!((b - a) * unit <= c.chunk_bytes + unit, "{n} {unit} {c:?}");
                    }
                }
            }
        }
        assert!(ranges(0, 4, &cut(4, 4096)).is_empty());
        // Big enough to spread: every channel gets a piece even below one chunk.
        assert_eq!(ranges(4096, 4, &cut(4, 1 << 20)).len(), 4);
        // Too small to spread: one piece.
        assert_eq!(ranges(16, 4, &cut(4, 1 << 20)).len(), 1);
        // A large call: about 8 pieces of at least the grain, none over the cap.
        let big = Cut {
            channels: 4,
            chunk_bytes: 4 << 20,
            max_piece_bytes: 32 << 20,
            target_pieces: 8,
            min_spread_bytes: 64 << 10,
            p2p_min_spread_bytes: 64 << 10,
            p2p_max_piece_bytes: 32 << 20,
        };
        assert_eq!(ranges(32 << 20, 4, &big).len(), 8); // 128 MB: 8 x 16 MB
        assert_eq!(ranges(4 << 20, 4, &big).len(), 4); // 16 MB: 4 x 4 MB
        assert_eq!(ranges(256 << 20, 4, &big).len(), 32); // 1 GB: 32 x 32 MB
        assert_eq!(ranges(1 << 19, 4, &big).len(), 4); // 2 MB: spread over 4 channels

        // A unit that does not divide the cap (6 ranks' floats: 24 bytes): no piece over it.
        let n = (256 << 20) / 24;
        for (a, b) in ranges(n, 24, &big) {
            assert!((b - a) * 24 <= big.max_piece_bytes, "{a}..{b}");
        }
    }

    #[test]
    fn all_gather_rows_land_in_each_ranks_block() {
        let a = CollArgs {
            coll: CollKind::AllGather,
            nranks: 3,
            count: 10,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            root: 0,
        };
        let ps = pieces(
            &NetOp::Coll {
                a,
                send: 1000,
                recv: 5000,
            },
            1,
            &cut(2, 48),
        );
        let all: Vec<&Piece> = ps.iter().flatten().collect();
        // 10 elements x 3 rows x 4 bytes = 120 bytes, 48 per piece: 3 pieces over 2 channels.
        assert_eq!(all.len(), 3);
        assert_eq!(ps[0].len(), 2);
        let first = &ps[0][0];
        assert_eq!(
            first.down[..],
            [Seg {
                dev: 1000,
                stage: 0,
                bytes: 12
            }]
        );
        assert_eq!(
            first.up[1],
            Seg {
                dev: 5000 + 40,
                stage: 12,
                bytes: 12
            }
        );
        assert_eq!(first.recv_bytes, 36);
    }

    #[test]
    fn messages_are_cut_from_their_own_size() {
        let op = |bytes| P2pOp {
            kind: P2pKind::Send,
            peer: 1,
            addr: 0,
            bytes,
        };
        let c = cut(2, 100);
        let alone = p2p_pieces(&[op(250)], &c);
        let with_other = p2p_pieces(&[op(40), op(250)], &c);
        assert_eq!(alone.len(), 3);
        assert_eq!(with_other.len(), 3);
        for (x, y) in alone.iter().zip(&with_other) {
            let bytes = |p: &Piece| p.down.last().map(|s| s.bytes);
            assert_eq!(bytes(x), bytes(y));
        }
    }

    #[test]
    fn a_message_spreads_by_its_own_size() {
        // 2 x 2 all-to-all of 1 MB: 256 KB to each of two peers across hosts, one group.
        let op = |kind, peer, bytes| P2pOp {
            kind,
            peer,
            addr: 0,
            bytes,
        };
        let group = [
            op(P2pKind::Send, 1, 256 << 10),
            op(P2pKind::Recv, 1, 256 << 10),
            op(P2pKind::Send, 3, 256 << 10),
            op(P2pKind::Recv, 3, 256 << 10),
        ];
        let mut c = Cut {
            channels: 8,
            chunk_bytes: 1792 << 10,
            max_piece_bytes: 1792 << 10,
            target_pieces: 8,
            min_spread_bytes: 64 << 10,
            p2p_min_spread_bytes: 64 << 10,
            p2p_max_piece_bytes: 32 << 20,
        };
        // 32 KiB a channel is under 64 KiB: the whole group is one piece (one channel).
        assert_eq!(p2p_pieces(&group, &c).len(), 1);
        c.p2p_min_spread_bytes = 16 << 10;
        let ps = p2p_pieces(&group, &c);
        assert_eq!(ps.len(), 8);
        for p in &ps {
            assert_eq!((p.send_bytes, p.recv_bytes), (64 << 10, 64 << 10));
        }
        // The peer's receive of the same message, alone in its group, is cut the same way.
        let alone = p2p_pieces(&[op(P2pKind::Recv, 0, 256 << 10)], &c);
        assert_eq!(alone.len(), 8);
        assert!(alone.iter().all(|p| p.recv_bytes == 32 << 10));
        // Three peers' sends of 8 MiB each: with each message's chunk at a third of the
        // slot (the engine's cap on 4 ranks), no piece stages more than a slot.
        c.p2p_max_piece_bytes = (1792 << 10) / 3 / 4096 * 4096;
        let big: Vec<P2pOp> = (1..4).map(|p| op(P2pKind::Send, p, 8 << 20)).collect();
        let ps = p2p_pieces(&big, &c);
        assert!(
            ps.iter().all(|p| p.send_bytes <= 1792 << 10),
            "{}",
            ps.len()
        );
        assert_eq!(ps.iter().map(|p| p.send_bytes).sum::<usize>(), 24 << 20);
    }
}
