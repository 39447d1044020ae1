//! A rank's messages to itself in a send/recv group of one process per GPU (all-to-all's own
//! block): the k-th send to itself pairs with the k-th receive from itself, and the pair is a
//! copy on the GPU. Where the group goes in one launch (`p2p_many::fused`) and no other
//! message of the group touches the pair's bytes, the launch copies it with its staged sends
//! (no copy-engine call of its own: a driver call less on the host, whose time bounds small
//! calls under `mpirun`); else it is a copy on the receive's stream after the group, as
//! before.

use crate::proc::P2p;
use railcc_core::{Error, ErrorKind, Result};
use railcc_cuda::gpu::{copy_async, stream_waits_for, GpuCtx};

/// A send to this rank itself and its receive.
pub type Pair = (P2p, P2p);

/// `ops` split into the messages to other ranks and the pairs to itself (send, receive), each
/// pair of one size. A send to itself without its receive, or the other way round, or two
/// sizes, is an error (before anything is posted, so the peers' counts stay equal).
pub fn split(ops: &[P2p], me: usize) -> Result<(Vec<P2p>, Vec<Pair>)> {
    let others: Vec<P2p> = ops.iter().filter(|o| o.peer != me).copied().collect();
    let sends: Vec<P2p> = ops
        .iter()
        .filter(|o| o.peer == me && o.send)
        .copied()
        .collect();
    let recvs: Vec<P2p> = ops
        .iter()
        .filter(|o| o.peer == me && !o.send)
        .copied()
        .collect();
    if sends.len() != recvs.len() {
        return Err(Error::invalid(format!(
            "{} send(s) to this rank itself but {} receive(s) from itself in one group",
            sends.len(),
            recvs.len()
        ))
        .rank(me));
    }
    let mut pairs = Vec::with_capacity(sends.len());
    for (s, r) in sends.into_iter().zip(recvs) {
        if s.bytes != r.bytes {
            return Err(Error::new(
                ErrorKind::Mismatch,
                format!(
                    "send to itself of {} bytes, receive from itself of {}",
                    s.bytes, r.bytes
                ),
            )
            .rank(me));
        }
        pairs.push((s, r));
    }
    Ok((others, pairs))
}

fn overlap(a: u64, alen: usize, b: u64, blen: usize) -> bool {
    railcc_core::call::overlaps(a, alen as u64, b, blen as u64)
}

/// Whether the launch may copy `pairs` before the group's marks and receives (on `stream`,
/// the group's one stream): every pair on it, and no pair's destination touching any other
/// bytes of the group (a send's source, a receive's destination, another pair's source or
/// destination) nor its source a receive's destination. Copied after the group, these would
/// read what the receives wrote, or land after them.
pub fn foldable(pairs: &[Pair], others: &[P2p], stream: railcc_cuda::gpu::Stream) -> bool {
    pairs.iter().enumerate().all(|(i, (s, r))| {
        s.stream == stream
            && r.stream == stream
            && others.iter().all(|o| {
                !overlap(r.ptr, r.bytes, o.ptr, o.bytes)
                    && (o.send || !overlap(s.ptr, s.bytes, o.ptr, o.bytes))
            })
            && pairs.iter().enumerate().all(|(j, (s2, r2))| {
                i == j
                    || (!overlap(r.ptr, r.bytes, s2.ptr, s2.bytes)
                        && !overlap(r.ptr, r.bytes, r2.ptr, r2.bytes))
            })
    })
}

/// Copies each pair on its receive's stream, after its send's stream reaches the send
/// (events when the streams differ), in order.
///
/// # Safety
/// Both buffers of every pair are `bytes` of this GPU's device memory and both streams the
/// caller's streams of this GPU, live until the streams pass the copy.
pub unsafe fn copy_after(gpu: &GpuCtx, pairs: &[Pair]) -> Result<()> {
    for (s, r) in pairs {
        if s.bytes == 0 || s.ptr == r.ptr {
            continue;
        }
        // SAFETY: the caller's streams and buffers.
        unsafe {
            if s.stream != r.stream {
                stream_waits_for(gpu, r.stream, gpu, s.stream)?;
            }
            gpu.bind()?;
            copy_async(
                r.ptr,
                s.ptr,
                s.bytes,
                r.stream,
                "cuMemcpyAsync (a rank to itself)",
            )?;
            if s.stream != r.stream {
                stream_waits_for(gpu, s.stream, gpu, r.stream)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(peer: usize, send: bool, ptr: u64, bytes: usize) -> P2p {
        P2p {
            peer,
            send,
            ptr,
            bytes,
            stream: std::ptr::null_mut(),
            seq: 1,
        }
    }

    #[test]
    fn a_group_splits_into_other_ranks_and_pairs_to_itself_in_order() {
        let ops = [
            op(0, true, 0x1000, 64),
            op(1, true, 0x2000, 8),
            op(1, false, 0x9000, 8),
            op(1, true, 0x3000, 16),
            op(2, false, 0x4000, 64),
            op(1, false, 0xa000, 16),
        ];
        let (others, pairs) = split(&ops, 1).unwrap();
        assert_eq!(others.len(), 2);
        assert_eq!(
            pairs
                .iter()
                .map(|(s, r)| (s.ptr, r.ptr))
                .collect::<Vec<_>>(),
            [(0x2000, 0x9000), (0x3000, 0xa000)]
        );
        let e = split(&[op(1, true, 0, 8)], 1).unwrap_err();
        assert!(
            e.to_string()
                .contains("1 send(s) to this rank itself but 0"),
            "{e}"
        );
        let e = split(&[op(1, true, 0, 8), op(1, false, 0x100, 4)], 1).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Mismatch);
    }

    #[test]
    fn a_pair_folds_only_where_no_other_bytes_of_the_group_meet_it() {
        let st = std::ptr::null_mut();
        // In-place all-to-all of 3 ranks, rank 1: block k of one buffer goes to rank k.
        let buf = 0x10_000u64;
        let at = |k: u64| buf + k * 256;
        let others = [
            op(0, true, at(0), 256),
            op(0, false, at(0), 256),
            op(2, true, at(2), 256),
            op(2, false, at(2), 256),
            op(0, true, 0x50_000, 64), // a send alone (no receive lands there)
        ];
        let own = [(op(1, true, at(1), 256), op(1, false, at(1), 256))];
        assert!(foldable(&own, &others, st));
        // The pair writes where a send reads.
        let bad = [(op(1, true, 0x90_000, 256), op(1, false, at(2) + 8, 256))];
        assert!(!foldable(&bad, &others, st));
        // The pair reads what a receive writes.
        let bad = [(op(1, true, at(0) + 100, 16), op(1, false, 0x90_000, 16))];
        assert!(!foldable(&bad, &others, st));
        // It reads what a send reads: fine.
        let ok = [(op(1, true, 0x50_010, 16), op(1, false, 0x90_000, 16))];
        assert!(foldable(&ok, &others, st));
        // Two pairs, one writing the other's source.
        let two = [
            (op(1, true, 0x90_000, 16), op(1, false, 0x91_000, 16)),
            (op(1, true, 0x91_000, 16), op(1, false, 0x92_000, 16)),
        ];
        assert!(!foldable(&two, &others, st));
        // Another stream.
        let other_stream = 8usize as railcc_cuda::gpu::Stream;
        assert!(!foldable(&own, &others, other_stream));
    }
}
