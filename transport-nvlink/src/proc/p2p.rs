//! Send/recv between processes of one host (`ProcGpu::p2p`): a group's messages posted in the
//! table's mailbox, staged or read from the caller's buffer, and received by the batch kernels
//! (`railcc_cuda::p2p_many`) or copy engines, round by round.

use super::*;
use crate::selfcopy;

/// Bytes of one staging slot of a buffered send (larger sends rendezvous).
pub(super) const STAGE_SLOT_BYTES: usize = 2 << 20;
/// Staging slots per peer, used in turn.
const STAGE_SLOTS: u64 = 2;
/// Bytes from one slot's start to the next: a send sits in its slot at its source's offset
/// from 16 bytes, so both copies of it can take 16-byte loads.
const STAGE_SLOT_STRIDE: u64 = STAGE_SLOT_BYTES as u64 + 256;

/// One send or receive of a group (or one eager call) between processes.
#[derive(Debug, Clone, Copy)]
pub struct P2p {
    pub peer: usize,
    pub send: bool,
    pub ptr: u64,
    pub bytes: usize,
    pub stream: Stream,
    /// The message's number between this rank and `peer` in its direction (1, 2, ...): both
    /// ends count the same.
    pub seq: u64,
}

impl ProcGpu {
    /// Sends and receives between processes, any rank count, stream-ordered, by CUDA IPC:
    /// the sender posts its buffer in the table's mailbox and, on its stream, marks the data
    /// ready in the receiver's counters (`P2P_OFFSET`, one-thread kernels that count on the
    /// GPU, so CUDA graphs replay); the receiver's stream waits for that, copies from the
    /// posted buffer (a copy engine) and marks it copied in the sender's counters. A send of
    /// up to STAGE_SLOT_BYTES is first copied into one of STAGE_SLOTS staging slots per peer
    /// and is then done on the sender's stream (as NCCL's sends that fit its buffers are), so
    /// unbatched sends and receives in a ring, as PyTorch issues them, do not wait on each
    /// other; the slot is refilled once the receiver copied it. A larger send is read from the
    /// caller's buffer, and the sender's stream waits for the copy before anything after the
    /// send may touch the buffer. In one group every send is posted before any receive, and
    /// marked ready before any receive of its round (`p2p_rounds`: a send of bytes an earlier
    /// receive writes waits for it) and any wait for a copy, so two ranks that exchange in one
    /// group never wait on each other. Only a receive waits on the host (for its send to be
    /// posted; a send waits only when its receiver is MAIL_DEPTH messages behind). In one
    /// launch (`RAILCC_GPU_P2P_BATCH=2`) the kernel itself copies the staged sends into their
    /// slots before it marks them.
    ///
    /// Messages of up to the communicator's `p2p_ll` limit (`RAILCC_GPU_P2P_LL_BYTES`) go
    /// instead by `railcc_cuda::p2p_ll` (`p2p_small.rs`).
    ///
    /// # Safety
    /// Each op's buffer must be device memory of this GPU from cudaMalloc/cuMemAlloc with
    /// `bytes`, and its stream a stream of this GPU, valid until the stream passes the op.
    pub unsafe fn p2p(&self, all: &[P2p]) -> Result<()> {
        self.check_alive()?;
        self.gpu.bind()?;
        if let Some(o) = all.iter().find(|o| o.peer >= self.nranks) {
            return Err(Error::invalid(format!(
                "send/recv: peer {} of {} ranks",
                o.peer, self.nranks
            ))
            .rank(self.rank));
        }
        // SAFETY: the caller's contract.
        unsafe {
            if self.p2p_ll_bytes > 0 {
                self.p2p_split(all)
            } else {
                self.p2p_posted(all, None)
            }
        }
    }

    /// [`ProcGpu::p2p`] by posting each message in the table (every message where `p2p_ll`
    /// is off; the larger ones where it is on, numbered among themselves). `between` (one
    /// round's small messages: `all` then holds one round) is enqueued after the sends are
    /// marked ready and before any receive or wait for a copy, as a receive of this group:
    /// its launch waits for peers whose posted receives may wait for these marks.
    ///
    /// # Safety
    /// As for [`ProcGpu::p2p`].
    pub(super) unsafe fn p2p_posted(
        &self,
        all: &[P2p],
        between: Option<&dyn Fn() -> Result<()>>,
    ) -> Result<()> {
        use railcc_cuda::launch::{p2p_step, P2pStep};
        let mut clock = self.trace.start();
        let me = self.rank;
        // Messages to this rank itself are copies (`selfcopy`).
        let (others, pairs) = selfcopy::split(all, me)?;
        let ops = &others[..];
        if ops.is_empty() {
            if let Some(f) = between {
                f()?;
            }
            // SAFETY: the caller's buffers and streams (this function's contract).
            return unsafe { selfcopy::copy_after(&self.gpu, &pairs) };
        }
        let deadline = Instant::now() + self.timeout;
        let broken = || self.async_error();
        let timeout_ns = self.timeout_ns();
        let areas = |p: usize| (self.gpu.sync.ptr, self.syncs[p]);
        let step = |o: &P2p, s: P2pStep, lag: u64| {
            // SAFETY: both areas live for the communicator's life (the peer's mapped by IPC).
            unsafe {
                p2p_step(
                    &self.gpu,
                    o.stream,
                    (s, lag),
                    areas(o.peer),
                    (me, o.peer),
                    timeout_ns,
                )
            }
        };
        let copy = |dst: u64, src: u64, o: &P2p, what: &str| {
            if o.bytes == 0 {
                return Ok(());
            }
            // SAFETY: both ranges hold `bytes` (the caller's buffer, our staging slot, or the
            // sender's buffer or slot mapped by IPC), live until the stream passes the copy.
            unsafe { copy_async(dst, src, o.bytes, o.stream, what) }
        };
        // How each send goes: through a staging slot (small, at most STAGE_SLOTS per peer in
        // a batch, not under capture), from the caller's buffer, or, for a buffer no peer can
        // map, through the bounce buffer, each at its own place in it.
        let mut staged = vec![false; ops.len()];
        let mut before = vec![0u32; ops.len()]; // sends to the same peer ahead in the group
        let mut infos = vec![None; ops.len()]; // the driver's word on each send's buffer
        let mut bounced = std::collections::HashMap::<usize, u64>::new();
        let mut per_peer = std::collections::HashMap::<usize, u64>::new();
        let mut need = 0u64;
        // Whether each stream of the group is being captured, asked once (a driver call).
        let mut captures: Vec<(Stream, bool)> = Vec::new();
        let mut capturing_of = |st: Stream| -> Result<bool> {
            if let Some(&(_, c)) = captures.iter().find(|(s, _)| *s == st) {
                return Ok(c);
            }
            // SAFETY: the caller's stream of this GPU (this function's contract).
            let c = unsafe { is_capturing(&self.gpu, st) }?;
            captures.push((st, c));
            Ok(c)
        };
        for (i, o) in ops.iter().enumerate().filter(|(_, o)| o.send) {
            let capturing = capturing_of(o.stream)?;
            // Only a peer's first STAGE_SLOTS sends of the group may be staged, whatever their
            // size: a later one's slot wait would be for a message of this group, which the
            // peer copies only after its own sends (two ranks doing this wait on each other).
            let k = per_peer.entry(o.peer).or_insert(0);
            before[i] = (*k).min(u64::from(u32::MAX)) as u32;
            let early = *k < STAGE_SLOTS;
            *k += 1;
            if early && self.stage_bytes > 0 && o.bytes <= self.stage_bytes && !capturing {
                staged[i] = true;
            } else if o.bytes > 0 {
                let at = railcc_cuda::vmm::info(o.ptr).map_err(|e| e.rank(me))?;
                if at.sharing == railcc_cuda::vmm::Sharing::None {
                    bounced.insert(i, need);
                    need += (o.bytes as u64).next_multiple_of(256);
                }
                infos[i] = Some(at);
            }
        }
        // Batch kernels (`railcc_cuda::p2p_many`) where the counts keep message order: every
        // message of the group on one stream, not under capture (a graph's batch could run
        // beside another's). A staged send first marks the sends before it to the same peer
        // ready (its slot's wait counts every earlier message).
        let one_stream = ops.windows(2).all(|w| w[0].stream == w[1].stream);
        let batch = self.p2p_batch
            && one_stream
            && match ops.first() {
                Some(o) => !capturing_of(o.stream)?,
                None => false,
            };
        let mut ready: Vec<(Stream, [u32; MAX_PEERS])> = Vec::new();
        let count_in = |v: &mut Vec<(Stream, [u32; MAX_PEERS])>, o: &P2p| match v
            .iter_mut()
            .find(|(st, _)| *st == o.stream)
        {
            Some((_, c)) => c[o.peer] += 1,
            None => {
                let mut c = [0u32; MAX_PEERS];
                c[o.peer] = 1;
                v.push((o.stream, c));
            }
        };
        let mut bounce_streams: Vec<usize> = Vec::new();
        for (i, o) in ops.iter().enumerate() {
            let s = o.stream as usize;
            if bounced.contains_key(&i) && !bounce_streams.contains(&s) {
                bounce_streams.push(s);
            }
        }
        if let Some(&first) = bounce_streams.first() {
            // SAFETY: the caller's streams (this function's contract).
            let base = unsafe { self.bounce_room(first, need) }?;
            for at in bounced.values_mut() {
                *at += base;
            }
            for &other in &bounce_streams[1..] {
                // Each stream's copies in come after the buffer's last user.
                // SAFETY: as above.
                unsafe {
                    stream_waits_for(&self.gpu, stream_of(other), &self.gpu, stream_of(first))
                }?;
            }
        }
        self.trace.lap(&mut clock, "p2p prepare");
        // Every send posted first, whatever its round: a receiver (in another process) only
        // needs the buffer's description to queue its copy, which waits on the GPU for the
        // send's mark. Its data is written (slot, bounce buffer) and marked in its round.
        let mut slots: Vec<Option<u64>> = vec![None; ops.len()]; // each staged send's slot
        for (i, o) in ops.iter().enumerate().filter(|(_, o)| o.send) {
            let slot = if staged[i] { self.stage_slot(o)? } else { None };
            let desc = match (slot, bounced.get(&i)) {
                (Some((_, desc)), _) => desc,
                (None, Some(&at)) => self.bounce_desc(at)?,
                (None, None) => {
                    let mut share = self.share.lock();
                    match infos[i] {
                        Some(at) => {
                            share.export_at(at, o.ptr, o.bytes as u64, deadline, &broken)?
                        }
                        None => share.export(o.ptr, o.bytes as u64, deadline, &broken)?,
                    }
                }
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "send to rank {}: buffer 0x{:x} cannot be shared",
                        o.peer, o.ptr
                    ))
                    .rank(me)
                })?,
            };
            slots[i] = slot.map(|(at, _)| at);
            self.table
                .post(me, o.peer, o.seq, (o.bytes as u64, desc), deadline, &broken)
                .map_err(|e| e.rank(me))?;
        }
        self.trace.lap(&mut clock, "p2p post");
        // A send of bytes a receive before it writes waits for that receive: the group runs
        // as rounds, one after another on the stream (`p2p_rounds`; nccl-tests' hypercube
        // forwards what it received). The last round's receives are launched below.
        let rounds = railcc_core::call::p2p_rounds(ops.iter().map(|o| (o.send, o.ptr, o.bytes)));
        let last = rounds.last().copied().unwrap_or(0);
        // RAILCC_GPU_P2P_BATCH=2: staging, marks, receives and waits in one launch where it
        // fits.
        // The pairs to itself copied by that launch too, where nothing else of the group
        // touches them.
        let copies: Vec<p2p_many::StageMsg> = pairs
            .iter()
            .filter(|(s, r)| s.bytes > 0 && s.ptr != r.ptr)
            .map(|(s, r)| p2p_many::StageMsg {
                src: s.ptr,
                dst: r.ptr,
                bytes: s.bytes as u64,
                peer: me,
                before: 0,
            })
            .collect();
        let fold = !pairs.is_empty()
            && ops
                .first()
                .is_some_and(|o| selfcopy::foldable(&pairs, ops, o.stream));
        let in_launch = staged.iter().filter(|&&s| s).count() + if fold { copies.len() } else { 0 };
        // The one launch has no place between its marks and its receives for `between`.
        let fused = batch
            && between.is_none()
            && self.p2p_fused
            && last == 0
            && ops.iter().filter(|o| !o.send).count() <= p2p_many::MAX_MSGS
            && in_launch <= p2p_many::MAX_MSGS;
        let fold = fused && fold;
        let mut stage = if fold { copies } else { Vec::new() };
        let mut waits = Vec::new();
        let mut msgs = Vec::new();
        for k in 0..=last {
            if let (false, Some(o)) = (msgs.is_empty(), ops.first()) {
                // The round before's receives, ahead of this round's sends on the stream.
                // SAFETY: the peers' buffers are mapped, ours the caller's, on its stream.
                unsafe {
                    self.kernel_order
                        .lock()
                        .run(&self.gpu, o.stream as usize, || {
                            self.recv_many(&msgs, o.stream, timeout_ns)
                        })
                }?;
                msgs.clear();
            }
            let in_round = |i: usize| rounds[i] == k;
            for (i, o) in ops
                .iter()
                .enumerate()
                .filter(|(i, o)| o.send && in_round(*i))
            {
                match slots[i] {
                    Some(slot) if fused => stage.push(p2p_many::StageMsg {
                        src: o.ptr,
                        dst: slot,
                        bytes: o.bytes as u64,
                        peer: o.peer,
                        before: before[i],
                    }),
                    Some(slot) => {
                        if let Some((_, c)) = ready
                            .iter_mut()
                            .find(|(st, c)| *st == o.stream && c[o.peer] > 0)
                        {
                            let mut only = [0u32; MAX_PEERS];
                            only[o.peer] = std::mem::take(&mut c[o.peer]);
                            // SAFETY: the caller's stream; the areas live for the communicator.
                            unsafe {
                                p2p_many::ready_many(
                                    &self.gpu,
                                    o.stream,
                                    (self.gpu.sync.ptr, &self.syncs),
                                    me,
                                    &only,
                                )
                            }?;
                        }
                        step(o, P2pStep::WaitCopied, STAGE_SLOTS - 1)?;
                        copy(slot, o.ptr, o, "cuMemcpyAsync (send into a staging slot)")?;
                    }
                    None => {
                        waits.push(*o);
                        if let Some(&at) = bounced.get(&i) {
                            copy(at, o.ptr, o, "cuMemcpyAsync (send into the bounce buffer)")?;
                        }
                    }
                }
                if batch {
                    count_in(&mut ready, o);
                } else {
                    step(o, P2pStep::Ready, 0)?;
                }
            }
            for (st, c) in ready.iter_mut() {
                if fused || c.iter().all(|&n| n == 0) {
                    continue;
                }
                // SAFETY: the caller's stream; the areas live for the communicator's life.
                unsafe {
                    p2p_many::ready_many(&self.gpu, *st, (self.gpu.sync.ptr, &self.syncs), me, c)
                }?;
                *c = [0; MAX_PEERS];
            }
            if let (0, Some(f)) = (k, between) {
                f()?;
            }
            for (_, o) in ops
                .iter()
                .enumerate()
                .filter(|(i, o)| !o.send && in_round(*i))
            {
                let (bytes, desc) = self
                    .table
                    .take(o.peer, me, o.seq, deadline, &broken)
                    .map_err(|e| e.rank(me))?;
                if bytes != o.bytes as u64 {
                    return Err(Error::new(
                        ErrorKind::Mismatch,
                        format!(
                            "message {} from rank {}: it sends {bytes} bytes, rank {me} receives {}",
                            o.seq, o.peer, o.bytes
                        ),
                    )
                    .peer(o.peer)
                    .rank(me)
                    .transport(crate::NAME));
                }
                let src =
                    self.share
                        .lock()
                        .map(o.peer, &desc, !self.defer_calls, deadline, &broken)?;
                if batch {
                    msgs.push(p2p_many::RecvMsg {
                        src,
                        dst: o.ptr,
                        bytes: o.bytes as u64,
                        peer: o.peer,
                    });
                    continue;
                }
                step(o, P2pStep::WaitReady, 0)?;
                copy(o.ptr, src, o, "cuMemcpyAsync (receive from a peer process)")?;
                step(o, P2pStep::Copied, 0)?;
            }
        }
        self.trace.lap(&mut clock, "p2p rounds (take+map)");
        // Sends straight from the caller's buffer end when the receiver has copied them.
        let mut copied = Vec::new();
        for o in waits.iter().filter(|_| batch) {
            count_in(&mut copied, o);
        }
        if let (true, Some(o)) = (fused, ops.first()) {
            // Every op is on one stream (`batch`): `ready` and `copied` hold one entry at most.
            let of = |v: &[(Stream, [u32; MAX_PEERS])]| v.first().map_or([0; MAX_PEERS], |x| x.1);
            let (marks, copied) = (of(&ready), of(&copied));
            // Early marks only where no receive overwrites a staged source (in place).
            let early = self.p2p_early && p2p_many::early_marks_safe(&msgs, &stage);
            // In the communicator's kernel order: the kernel counts its finished blocks in the
            // area. `fused` implies `batch`: the stream is not being captured.
            // SAFETY: the peers' buffers are mapped, ours the caller's, on its stream.
            unsafe {
                self.kernel_order
                    .lock()
                    .run_eager(&self.gpu, o.stream as usize, || {
                        p2p_many::fused(
                            &self.gpu,
                            o.stream,
                            (self.gpu.sync.ptr, &self.syncs),
                            me,
                            &msgs,
                            (&marks, &copied),
                            (&stage, STAGE_SLOTS - 1, early),
                            (self.choice.max_blocks, self.p2p_min_chunk),
                            timeout_ns,
                        )
                    })
            }?;
        } else if let (true, Some(o), false) =
            (batch, ops.first(), msgs.is_empty() && copied.is_empty())
        {
            // The last receives and the waits for the peers' copies of our sends, in the
            // communicator's kernel order together: its marker comes after both, so a close
            // waits for them before the sync area and staging slots go (every op of a batch
            // group is on this one stream, so the marker covers the group).
            // SAFETY: the peers' buffers are mapped, ours the caller's, on its stream; the
            // areas live for the communicator's life.
            unsafe {
                self.kernel_order
                    .lock()
                    .run(&self.gpu, o.stream as usize, || {
                        if !msgs.is_empty() {
                            self.recv_many(&msgs, o.stream, timeout_ns)?;
                        }
                        for (st, c) in &copied {
                            p2p_many::wait_copied_many(
                                &self.gpu,
                                *st,
                                self.gpu.sync.ptr,
                                c,
                                timeout_ns,
                                0,
                            )?;
                        }
                        Ok(())
                    })
            }?;
        } else if !batch {
            for o in &waits {
                step(o, P2pStep::WaitCopied, 0)?;
            }
        }
        if bounce_streams.len() > 1 {
            // SAFETY: the caller's streams.
            unsafe { self.bounce_joins(&bounce_streams) }?;
        }
        if !fold {
            // SAFETY: the caller's buffers and streams.
            unsafe { selfcopy::copy_after(&self.gpu, &pairs) }?;
        }
        self.trace.lap(&mut clock, "p2p launch");
        Ok(())
    }

    /// Launches the batch receives `msgs` on `stream` (every op of the group's). The caller
    /// runs it in the communicator's kernel order: two at once on two streams would share
    /// the area's count of finished blocks.
    ///
    /// # Safety
    /// The peers' buffers are mapped here and ours are this GPU's, live until the stream
    /// passes the receives.
    unsafe fn recv_many(
        &self,
        msgs: &[p2p_many::RecvMsg],
        stream: Stream,
        timeout_ns: u64,
    ) -> Result<u32> {
        // SAFETY: the caller's contract; the areas live for the communicator's life.
        unsafe {
            p2p_many::recv_many(
                &self.gpu,
                stream,
                (self.gpu.sync.ptr, &self.syncs),
                self.rank,
                msgs,
                (self.choice.max_blocks, self.p2p_min_chunk),
                timeout_ns,
            )
        }
    }

    /// The staging slot for send `o` (slot `seq mod STAGE_SLOTS` of the peer's staging
    /// buffer, made on first use) and what the peer needs to map it, or None where the send is
    /// too large. The caller stages nothing under capture (a captured slot would be refilled
    /// on replay without the rotation; nothing can be allocated then either). The buffer's
    /// IPC handle is taken once: two driver calls a send less.
    fn stage_slot(&self, o: &P2p) -> Result<Option<(u64, BufDesc)>> {
        if o.bytes > STAGE_SLOT_BYTES {
            return Ok(None);
        }
        let mut stages = self.stages.lock();
        let (b, desc) = match stages.entry(o.peer) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let b = self.alloc_for_peers((STAGE_SLOT_STRIDE * STAGE_SLOTS) as usize, None)?;
                let desc = export(b.ptr)?;
                e.insert((b, desc))
            }
        };
        let at = (o.seq % STAGE_SLOTS) * STAGE_SLOT_STRIDE + (o.ptr & 15);
        Ok(Some((
            b.ptr + at,
            BufDesc {
                offset: desc.offset + at,
                ..*desc
            },
        )))
    }
}
