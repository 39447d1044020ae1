//! One connection's two ends over RC queue pairs. The receiver drives: each `irecv`
//! registers the buffer and SENDs a clear-to-send (address, rkey, length, tag) to the sender;
//! the sender matches its `isend`s to the clear-to-sends by sequence number, checks length and
//! tag, and RDMA-WRITEs the data straight into the receiver's buffer, the last write carrying
//! the message's sequence number as an immediate, which completes the receive. Flow control is
//! the receiver's posted buffers (credits): nothing is written that was not offered. With
//! several queue pairs per connection (`RAILCC_IB_QPS_PER_CONN`, RDMA rails), a message of
//! `SPLIT_MIN` bytes or more is cut into one piece per queue pair, each written with the
//! immediate; the receive completes when every piece has arrived. Control messages go on the
//! first live queue pair (every queue pair has control receives posted), so a connection
//! survives losing any of its rails while one lives. A mismatch is reported to the receiver
//! with a SEND carrying the sender's tag, so both ranks fail with the same named cause. A TCP
//! control socket stays open beside the QPs: a peer that dies closes it, which names the dead
//! rank at once instead of after the retry timeout.

use crate::verbs::{Completion, Mr, Qp};
use crate::NAME;
use railcc_core::net::{MemRegion, MsgTag, ReqId, WaitFd, TAG_BYTES};
use railcc_core::{Error, ErrorKind, Result};
use std::collections::{HashMap, VecDeque};
use std::net::TcpStream;
use std::os::fd::AsRawFd;

mod link;
mod mem;
mod rails;
mod recv;
mod send;
use link::Link;
use mem::{decode_tag_len, encode_tag_len, Reg, Regions, TxUse};
pub use mem::{fuzz_tag_len, EAGER};
pub use recv::RdmaRecvComm;
pub use send::RdmaSendComm;

pub const DEPTH: u32 = 128;
/// A control slot's bytes; its index is the low bits of a control work request's id.
const SLOT: usize = 64;
const SLOT_BITS: u64 = 0xffff;
const MAX_WRITE: usize = 1 << 30;
/// An immediate: the message's sequence number (low 27 bits), the piece index (4 bits: a
/// piece written twice after a queue pair died counts once) and the error bit.
const SEQ_MASK: u32 = 0x07ff_ffff;
const PIECE_SHIFT: u32 = 27;
const PIECE_MASK: u32 = 0xf;
const ERR_BIT: u32 = 0x8000_0000;
/// Control messages with the error bit set carry their kind in the piece field: a mismatch
/// report (sender to receiver), a sender's question after a queue pair died (which pieces of
/// this message arrived?), the receiver's answer (a mask of pieces, or `ANSWER_DONE` when the
/// message is already complete; then the queue pairs closed at the receiver), and a notice of
/// queue pairs given up (either way; the peer closes them too).
const CTRL_MISMATCH: u32 = 0;
const CTRL_QUERY: u32 = 1;
const CTRL_ANSWER: u32 = 2;
const CTRL_CLOSED: u32 = 3;
const ANSWER_DONE: u32 = 1 << 16;
// wr_id kinds (top byte).
const K_CTRL: u64 = 1 << 56;
const K_RECV: u64 = 2 << 56;
const K_WRITE: u64 = 3 << 56;
/// The signalled first part of a large piece (`rails::mark_len`): it only times the queue pair.
const K_MARK: u64 = 4 << 56;
const KIND: u64 = 0xff << 56;
/// Which queue pair of the connection a work request went to (bits 48..56 of its id).
const QP_SHIFT: u32 = 48;
const QP_BITS: u64 = 0xff << QP_SHIFT;
const LOW_BITS: u64 = (1 << QP_SHIFT) - 1;
/// A write's piece index (bits 40..48 of its id) and message sequence number (below).
const WR_PIECE_SHIFT: u32 = 40;
const WR_SEQ: u64 = (1 << WR_PIECE_SHIFT) - 1;
/// Most ports (devices) one connection stripes over: the clear-to-send has room for one
/// remote key per device.
pub const MAX_RAILS: usize = 4;
/// Where a clear-to-send holds the remote key of each of the receiver's devices.
const CTS_RKEY_AT: [usize; MAX_RAILS] = [8, 12, 56, 60];
/// Messages this large or larger are split across the connection's queue pairs.
pub const SPLIT_MIN: usize = 64 * 1024;
/// Most queue pairs one connection may have (the handshake refuses more).
pub const MAX_QPS: usize = 16;

/// How a message of `len` bytes is cut over `nqps` queue pairs: the piece size and the number of
/// pieces (piece i goes to queue pair i). Both ends compute it, so the receiver knows how many
/// immediates complete a message.
pub fn split(len: usize, nqps: usize) -> (usize, usize) {
    if nqps <= 1 || len < SPLIT_MIN {
        return (len.max(1), 1);
    }
    let chunk = len.div_ceil(nqps).next_multiple_of(4096);
    (chunk, len.div_ceil(chunk))
}

/// The full sequence number of a clear-to-send whose low bits are `seq`, when `matched`
/// messages have been matched: None for one already matched (a copy sent again after its
/// queue pair died), whose low bits lie behind `matched`.
fn cts_seq(seq: u32, matched: u64) -> Option<u64> {
    let ahead = seq.wrapping_sub(matched as u32) & SEQ_MASK;
    (ahead <= SEQ_MASK / 2).then_some(matched + ahead as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clear_to_sends_sent_again_are_placed_or_dropped_across_the_wrap() {
        assert_eq!(cts_seq(5, 5), Some(5));
        assert_eq!(cts_seq(7, 5), Some(7));
        assert_eq!(cts_seq(4, 5), None);
        // Low bits wrap: message 2^27 + 1 arrives as 1.
        let m = SEQ_MASK as u64 + 1;
        assert_eq!(cts_seq(1, m - 2), Some(m + 1));
        assert_eq!(cts_seq(SEQ_MASK, m + 3), None);
        assert_eq!(cts_seq(SEQ_MASK, m - 1), Some(m - 1));
    }
}
