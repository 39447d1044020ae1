//! A group's small sends and receives between processes by `railcc_cuda::p2p_ll`
//! (`RAILCC_GPU_P2P_LL_BYTES`, 1 MiB by default): one launch per wave, no post, take or map on
//! the host.
//!
//! Both ends classify a message by its own size alone (at most the communicator's agreed
//! limit: `p2p_ll`), so the k-th small message between two ranks is the k-th on both ends
//! whatever else their groups hold; the other messages keep the posted path
//! (`ProcGpu::p2p_posted`), numbered among themselves. A group runs round by round
//! (`p2p_rounds`: a send of bytes an earlier receive writes waits for it); in a round the
//! small messages' launch goes where the posted path's receives begin: after its sends are
//! marked ready (a peer's posted receive may wait for those marks while its own launch waits
//! for ours) and before its receives and its waits for copies.
//!
//! Both ends must agree on a message's size, as with NCCL: where one end's count is within the
//! limit and the other's is not, the message goes two ways and the call waits (no deadline by
//! default; `RAILCC_TIMEOUT_MS` ends it). Counts that differ within the limit are named
//! (`p2p_ll`'s header line).

use super::*;
use crate::selfcopy::{self, Pair};
use railcc_cuda::p2p_ll::{self, LlMsg, SelfCopy};

impl ProcGpu {
    /// [`ProcGpu::p2p`] where `p2p_ll` is on.
    ///
    /// # Safety
    /// As for [`ProcGpu::p2p`].
    pub(super) unsafe fn p2p_split(&self, all: &[P2p]) -> Result<()> {
        let me = self.rank;
        let (mut others, pairs) = selfcopy::split(all, me)?;
        let small = |o: &P2p| o.bytes <= self.p2p_ll_bytes;
        {
            // The posted path numbers its messages among themselves.
            let mut seqs = self.p2p_ll_seqs.lock();
            for o in others.iter_mut().filter(|o| !small(o)) {
                let n = seqs.entry((o.peer, o.send)).or_insert(0);
                *n += 1;
                o.seq = *n;
            }
        }
        if !others.iter().any(small) {
            let with_pairs: Vec<P2p> = others.iter().copied().chain(unpair(&pairs)).collect();
            // SAFETY: the caller's contract.
            return unsafe { self.p2p_posted(&with_pairs, None) };
        }
        let mut clock = self.trace.start();
        let rounds = railcc_core::call::p2p_rounds(others.iter().map(|o| (o.send, o.ptr, o.bytes)));
        let last = rounds.last().copied().unwrap_or(0);
        let all_small = others.iter().all(small);
        // The own copies go in the launch where nothing else of the group touches them.
        let fold = all_small
            && last == 0
            && pairs.len() <= p2p_ll::MAX_MSGS
            && others
                .first()
                .is_some_and(|o| selfcopy::foldable(&pairs, &others, o.stream));
        for k in 0..=last {
            let (ll, mut rest): (Vec<P2p>, Vec<P2p>) = (0..others.len())
                .filter(|&i| rounds[i] == k)
                .map(|i| others[i])
                .partition(small);
            let own: &[Pair] = if fold { &pairs } else { &[] };
            if k == last && !fold {
                rest.extend(unpair(&pairs));
            }
            // SAFETY: the caller's buffers and streams.
            let launch = || unsafe { self.ll_round(&ll, own) };
            if rest.is_empty() {
                launch()?;
            } else {
                // SAFETY: the caller's contract.
                unsafe { self.p2p_posted(&rest, Some(&launch)) }?;
            }
        }
        self.trace.lap(&mut clock, "p2p ll");
        Ok(())
    }

    /// One round's small messages `ops` (and the own copies `own`) in waves: wave w holds the
    /// w-th message per peer and direction, one launch each on the first op's stream (the
    /// others' streams joined before and after, also when a launch fails: a capture must not
    /// be left forked). Where a receive writes bytes a send of the round reads: in one wave,
    /// each such receive paired with the send of exactly its bytes (all-to-all or send/recv in
    /// place: the kernel writes a pair's bytes once they are read); else every wave's sends in
    /// launches before every wave's receives (a send never waits for this call's receives).
    ///
    /// # Safety
    /// As for [`ProcGpu::p2p`].
    unsafe fn ll_round(&self, ops: &[P2p], own: &[Pair]) -> Result<()> {
        let Some(stream) = ops
            .first()
            .map(|o| o.stream)
            .or_else(|| own.first().map(|p| p.0.stream))
        else {
            return Ok(());
        };
        let mut joined: Vec<Stream> = Vec::new();
        for st in ops
            .iter()
            .map(|o| o.stream)
            .chain(own.iter().flat_map(|(s, r)| [s.stream, r.stream]))
        {
            if st != stream && !joined.contains(&st) {
                joined.push(st);
            }
        }
        for &st in &joined {
            // SAFETY: the caller's streams of this GPU.
            unsafe { stream_waits_for(&self.gpu, stream, &self.gpu, st) }?;
        }
        // SAFETY: the caller's contract.
        let launched = unsafe { self.ll_launches(stream, ops, own) };
        for &st in &joined {
            // SAFETY: as above.
            unsafe { stream_waits_for(&self.gpu, st, &self.gpu, stream) }?;
        }
        launched
    }

    /// [`ProcGpu::ll_round`]'s launches, all on `stream`.
    ///
    /// # Safety
    /// As for [`ProcGpu::p2p`]; every op's stream waits for `stream`'s work before and after.
    unsafe fn ll_launches(&self, stream: Stream, ops: &[P2p], own: &[Pair]) -> Result<()> {
        let copies: Vec<SelfCopy> = own
            .iter()
            .filter(|(s, r)| s.bytes > 0 && s.ptr != r.ptr)
            .map(|(s, r)| SelfCopy {
                src: s.ptr,
                dst: r.ptr,
                bytes: s.bytes as u64,
            })
            .collect();
        let msg = |o: &P2p| LlMsg {
            peer: o.peer,
            ptr: o.ptr,
            bytes: o.bytes as u64,
        };
        let launches = p2p_ll::plan(&ops.iter().map(|o| (o.send, msg(o))).collect::<Vec<_>>());
        let timeout_ns = self.timeout_ns();
        let n = launches.len();
        for (i, (sends, recvs, paired)) in launches.iter().enumerate() {
            // The own copies with the last launch: after every receive of the round.
            let c: &[SelfCopy] = if i + 1 == n { &copies } else { &[] };
            // In the communicator's kernel order: the step counts live in the area.
            // SAFETY: the peers' areas are mapped for the communicator's life; the buffers
            // are the caller's, on its stream.
            unsafe {
                self.kernel_order
                    .lock()
                    .run(&self.gpu, stream as usize, || {
                        p2p_ll::launch(
                            &self.gpu,
                            stream,
                            (self.gpu.sync.ptr, &self.syncs),
                            self.rank,
                            (sends, recvs, c),
                            *paired,
                            timeout_ns,
                        )
                    })
            }
            .map_err(|e| e.rank(self.own_name))?;
        }
        Ok(())
    }
}

/// The ops of `pairs` again (each copy as its send and its receive).
fn unpair(pairs: &[Pair]) -> impl Iterator<Item = P2p> + '_ {
    pairs.iter().flat_map(|&(s, r)| [s, r])
}
