//! One collective call, the same shape from the C ABI down to the kernels: its kind
//! ([`CollKind`]), its arguments as NCCL counts them ([`CollArgs`]), and, on device buffers,
//! the buffers and stream ([`Call`]); point-to-point operations ([`P2pKind`], [`P2pOp`]).
//! Streams are opaque handles here (core knows nothing of CUDA); `railcc_cuda` turns them
//! back into CUDA streams.

use crate::dtype::{DataType, ReduceOp};
use std::ops::Range;

/// The collective kinds, as they travel in message tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CollKind {
    AllReduce = 1,
    AllGather = 2,
    ReduceScatter = 3,
    Broadcast = 4,
    Reduce = 5,
    SendRecv = 6,
    AllToAll = 7,
    Barrier = 8,
}

impl CollKind {
    pub const ALL: [CollKind; 8] = [
        CollKind::AllReduce,
        CollKind::AllGather,
        CollKind::ReduceScatter,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::SendRecv,
        CollKind::AllToAll,
        CollKind::Barrier,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CollKind::AllReduce => "all_reduce",
            CollKind::AllGather => "all_gather",
            CollKind::ReduceScatter => "reduce_scatter",
            CollKind::Broadcast => "broadcast",
            CollKind::Reduce => "reduce",
            CollKind::SendRecv => "send/recv",
            CollKind::AllToAll => "all_to_all",
            CollKind::Barrier => "barrier",
        }
    }

    pub fn from_u8(v: u8) -> Option<CollKind> {
        CollKind::ALL.iter().copied().find(|c| *c as u8 == v)
    }
}

/// The arguments of one collective call, as NCCL counts them: `count` is the per-rank element
/// count (all_gather: send count; reduce_scatter: receive count; all_to_all: per-peer count).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CollArgs {
    pub coll: CollKind,
    pub nranks: usize,
    pub count: usize,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub root: usize,
}

impl CollArgs {
    /// Elements in the send buffer.
    pub fn send_elems(&self) -> usize {
        match self.coll {
            CollKind::ReduceScatter | CollKind::AllToAll => self.count * self.nranks,
            CollKind::Barrier => 0,
            _ => self.count,
        }
    }

    /// Elements in the receive buffer.
    pub fn recv_elems(&self) -> usize {
        match self.coll {
            CollKind::AllGather | CollKind::AllToAll => self.count * self.nranks,
            CollKind::Barrier => 0,
            _ => self.count,
        }
    }

    /// For an in-place call, the element offsets of the send and receive buffers inside one
    /// backing buffer, and that buffer's length (NCCL's in-place conventions).
    pub fn in_place_layout(&self, rank: usize) -> (usize, usize, usize) {
        match self.coll {
            CollKind::AllGather => (rank * self.count, 0, self.recv_elems()),
            CollKind::ReduceScatter => (0, rank * self.count, self.send_elems()),
            _ => (0, 0, self.send_elems().max(self.recv_elems())),
        }
    }

    /// Byte ranges of the send and receive buffers inside an in-place call's backing buffer,
    /// and the backing buffer's length in bytes.
    pub fn in_place_ranges(&self, rank: usize) -> (Range<usize>, Range<usize>, usize) {
        let es = self.dtype.size();
        let (so, ro, total) = self.in_place_layout(rank);
        (
            so * es..(so + self.send_elems()) * es,
            ro * es..(ro + self.recv_elems()) * es,
            total * es,
        )
    }

    /// Where the receive buffer's bytes sit in what the caller holds: all of the receive
    /// buffer out of place, its part of the backing buffer in place.
    pub fn recv_range(&self, rank: usize, in_place: bool) -> Range<usize> {
        if in_place {
            self.in_place_ranges(rank).1
        } else {
            0..self.recv_elems() * self.dtype.size()
        }
    }

    /// The contents of an in-place call's backing buffer: `prior` (the receive buffer's bytes)
    /// at the receive offset, then `input` (the send buffer's) written over it at the send
    /// offset, as a caller that fills its input last would leave it.
    pub fn in_place_backing(&self, rank: usize, input: &[u8], prior: &[u8]) -> Vec<u8> {
        let (send, recv, total) = self.in_place_ranges(rank);
        let mut b = vec![0u8; total];
        b[recv.start..recv.start + prior.len().min(recv.len())]
            .copy_from_slice(&prior[..prior.len().min(recv.len())]);
        b[send.start..send.start + input.len().min(send.len())]
            .copy_from_slice(&input[..input.len().min(send.len())]);
        b
    }

    pub fn reduces(&self) -> bool {
        matches!(
            self.coll,
            CollKind::AllReduce | CollKind::ReduceScatter | CollKind::Reduce
        )
    }
}

/// One side of a grouped point-to-point operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum P2pKind {
    Send,
    Recv,
}

impl CollArgs {
    /// The call as five words (kind, dtype, op, count, root): what ranks of one host publish
    /// to compare their calls.
    pub fn to_words(&self) -> [u64; 5] {
        [
            self.coll as u64,
            self.dtype as u64,
            self.op as u64,
            self.count as u64,
            self.root as u64,
        ]
    }

    /// A published call in words, for mismatch errors.
    pub fn describe_words(w: [u64; 5]) -> String {
        let coll = CollKind::ALL
            .iter()
            .find(|c| **c as u64 == w[0])
            .map_or("?", |c| c.name());
        let dt = DataType::ALL
            .iter()
            .find(|d| **d as u64 == w[1])
            .map_or("?", |d| d.name());
        let op = ReduceOp::ALL
            .iter()
            .find(|o| **o as u64 == w[2])
            .map_or("?", |o| o.name());
        format!("{coll} of {} {dt} (op {op}, root {})", w[3], w[4])
    }
}

/// One rank's collective call on device buffers: `send` and `recv` are device addresses,
/// `stream` the caller's CUDA stream as an opaque handle (0: the legacy default stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    pub args: CollArgs,
    pub send: u64,
    pub recv: u64,
    pub stream: usize,
}

/// One send or receive of a group on a device buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct P2pOp {
    pub peer: usize,
    pub send: bool,
    pub ptr: u64,
    pub bytes: usize,
    pub stream: usize,
}

/// Whether byte ranges `[a, a + alen)` and `[b, b + blen)` share a byte (an empty range shares
/// none): the one test of a group's buffers against each other (rounds, a rank's copies to
/// itself, the one-launch send/recv's early marks).
pub fn overlaps(a: u64, alen: u64, b: u64, blen: u64) -> bool {
    alen > 0 && blen > 0 && a < b.saturating_add(blen) && b < a.saturating_add(alen)
}

/// The round of each of one rank's sends and receives in a group (`ops` in group order:
/// (send, buffer address, bytes)): a send that reads bytes a receive before it in its round
/// writes starts a new round. Batched sends and receives of one round run at once, so a
/// group that forwards what it received (nccl-tests' hypercube all-gather: each step sends
/// the blocks the step before received) needs its rounds one after another.
pub fn p2p_rounds(ops: impl IntoIterator<Item = (bool, u64, usize)>) -> Vec<usize> {
    let mut round = 0;
    let mut written: Vec<(u64, u64)> = Vec::new();
    ops.into_iter()
        .map(|(send, ptr, bytes)| {
            let bytes = bytes as u64;
            if send {
                if written.iter().any(|&(w, n)| overlaps(w, n, ptr, bytes)) {
                    round += 1;
                    written.clear();
                }
            } else if bytes > 0 {
                written.push((ptr, bytes));
            }
            round
        })
        .collect()
}

#[cfg(test)]
mod round_tests {
    use super::p2p_rounds;

    #[test]
    fn a_send_of_received_bytes_starts_a_round() {
        // Hypercube step 1 then step 2: the second send covers the first receive.
        let ops = [
            (true, 1000, 100),
            (false, 1100, 100),
            (true, 1000, 200),
            (false, 1200, 200),
        ];
        assert_eq!(p2p_rounds(ops), vec![0, 0, 1, 1]);
        // All-to-all: disjoint buffers, one round.
        let a2a = [(true, 0, 8), (false, 100, 8), (true, 8, 8), (false, 108, 8)];
        assert_eq!(p2p_rounds(a2a), vec![0; 4]);
        // Touching but not overlapping, and an empty receive, stay in the round.
        assert_eq!(
            p2p_rounds([(false, 0, 8), (false, 50, 0), (true, 8, 42)]),
            vec![0, 0, 0]
        );
        // A zero-byte send inside received bytes reads nothing.
        assert_eq!(p2p_rounds([(false, 0, 8), (true, 4, 0)]), vec![0, 0]);
        // A receive after the send it overlaps (write after read) does not split.
        assert_eq!(p2p_rounds([(true, 0, 8), (false, 0, 8)]), vec![0, 0]);
        // Rounds count on: a third dependent send makes round 2.
        let chain = [(false, 0, 8), (true, 0, 8), (false, 8, 8), (true, 8, 8)];
        assert_eq!(p2p_rounds(chain), vec![0, 1, 1, 2]);
    }
}
