//! The receiving end: offers buffers (clear-to-send) and completes receives on the writer's
//! immediate.

use super::*;

struct RecvReq {
    seq: u64,
    len: usize,
    tag: MsgTag,
    /// The caller's buffer (written directly, or copied into from a staging slot).
    dst: usize,
    /// Where the sender writes (the caller's buffer or a staging slot).
    target: usize,
    reg: Reg,
    /// Pieces not yet written (see `split`), and which have been (a piece written again
    /// after its queue pair died counts once).
    left: usize,
    got: u16,
}

pub struct RdmaRecvComm {
    link: Link,
    regions: Regions,
    next_seq: u64,
    pending: VecDeque<RecvReq>,
    results: HashMap<u64, Result<usize>>,
    /// Answers owed to the sender's questions (sequence numbers): each is worked out when a
    /// control slot is free, from what has arrived by then.
    answers: VecDeque<u32>,
    /// Clear-to-sends to send again: their queue pair died under them.
    rects: VecDeque<u64>,
}

impl RdmaRecvComm {
    pub(crate) fn new(
        qps: Vec<Qp>,
        peer: usize,
        control: TcpStream,
        failover: bool,
    ) -> Result<RdmaRecvComm> {
        Ok(RdmaRecvComm {
            link: Link::new(qps, peer, control, failover)?,
            regions: Regions::default(),
            next_seq: 0,
            pending: VecDeque::new(),
            results: HashMap::new(),
            answers: VecDeque::new(),
            rects: VecDeque::new(),
        })
    }

    fn progress(&mut self) -> Result<()> {
        let comps = self.link.poll()?;
        let mut queries = Vec::new();
        let r = comps.iter().try_for_each(|c| self.handle(c, &mut queries));
        self.link.done_with(comps);
        r?;
        if !queries.is_empty() {
            // The queue pairs the sender gave up were closed here; whatever landed on them
            // before counts in the answer, so nothing arrives after it.
            let mut more = Vec::new();
            for q in 0..self.link.nqps() {
                if self.link.dead[q] {
                    self.link.drain(q, &mut more)?;
                }
            }
            more.iter().try_for_each(|c| self.handle(c, &mut queries))?;
        }
        self.answers.extend(queries);
        self.link.check_ctrl_stalls(std::time::Instant::now())?;
        self.send_queued()
    }

    /// One completion. Questions (their sequence numbers) go to `queries`.
    fn handle(&mut self, c: &Completion, queries: &mut Vec<u32>) -> Result<()> {
        match c.wr_id & KIND {
            K_CTRL => match self.link.ctrl_completed(c) {
                TxUse::Cts(seq) if !c.ok => self.rects.push_back(seq),
                TxUse::Answer(seq) if !c.ok => self.answers.push_back(seq),
                _ => {}
            },
            // Flushed: its queue pair was given up.
            K_RECV if !c.ok => {}
            K_RECV => {
                let q = Link::qp_of(c.wr_id);
                let slot = (c.wr_id & SLOT_BITS) as usize;
                let imm = c.imm.unwrap_or(0);
                let r = if imm & ERR_BIT != 0 {
                    self.control(q, slot, imm, queries)
                } else {
                    self.piece_arrived(imm)
                };
                self.link.repost(c.wr_id)?;
                r?;
            }
            _ => {}
        }
        Ok(())
    }

    /// A control message from the sender, in receive slot `slot` of queue pair `q`.
    fn control(&mut self, q: usize, slot: usize, imm: u32, queries: &mut Vec<u32>) -> Result<()> {
        self.link.control_seen(q)?;
        match (imm >> PIECE_SHIFT) & PIECE_MASK {
            // The queue pairs the sender gave up: closed here first, so no late piece lands
            // after the answer. Answered once every completion of this poll is in.
            CTRL_QUERY => {
                self.link.close(self.link.ctrl.rx_word(q, slot, 0))?;
                queries.push(imm & SEQ_MASK);
                Ok(())
            }
            CTRL_CLOSED => self.link.close(self.link.ctrl.rx_word(q, slot, 0)),
            CTRL_MISMATCH => {
                let mismatch = decode_tag_len(self.link.ctrl.rx(q, slot));
                self.sender_refused(imm, mismatch)
            }
            k => {
                let e = Error::new(
                    ErrorKind::Protocol,
                    format!(
                        "rdma: rank {} sent control message kind {k}",
                        self.link.peer
                    ),
                );
                Err(self.link.fail(e))
            }
        }
    }

    /// Sends what waits for a control slot: the notice of queue pairs given up, clear-to-sends
    /// lost with their queue pair, and answers (which pieces of a message arrived: the sender
    /// writes again only the missing ones, while the receive is still offered; with the
    /// queue pairs closed here, whose pieces can no longer land).
    fn send_queued(&mut self) -> Result<()> {
        self.link.tell_peer()?;
        while let Some(&seq) = self.rects.front() {
            let Some(i) = self.pending.iter().position(|r| r.seq == seq) else {
                self.rects.pop_front();
                continue;
            };
            let Some(slot) = self.link.ctrl.free_tx.pop() else {
                break;
            };
            self.rects.pop_front();
            self.post_cts(slot, i)?;
        }
        while let Some(&seq) = self.answers.front() {
            let Some(slot) = self.link.ctrl.free_tx.pop() else {
                break;
            };
            self.answers.pop_front();
            let word = match self.pending.iter().find(|r| r.seq as u32 & SEQ_MASK == seq) {
                Some(r) => r.got as u32,
                None => ANSWER_DONE,
            };
            let closed = self.link.dead_mask();
            self.link
                .send_words(slot, [word, closed], CTRL_ANSWER, seq, TxUse::Answer(seq))?;
        }
        Ok(())
    }

    /// SENDs the clear-to-send of pending receive `i` from control slot `slot`.
    fn post_cts(&mut self, slot: usize, i: usize) -> Result<()> {
        let r = &self.pending[i];
        let (seq, target, tag, len) = (r.seq, r.target, r.tag, r.len);
        // One remote key per device: the writer uses the one of the queue pair it writes on.
        let mut rkeys = [0u32; MAX_RAILS];
        for (d, k) in rkeys.iter_mut().enumerate().take(self.link.devs.len()) {
            *k = r.reg.keys(d).1;
        }
        let b = self.link.ctrl.tx_mut(slot);
        b[..8].copy_from_slice(&(target as u64).to_le_bytes());
        for (k, at) in rkeys.iter().zip(CTS_RKEY_AT) {
            b[at..at + 4].copy_from_slice(&k.to_le_bytes());
        }
        encode_tag_len(&mut b[16..], &tag, len as u64);
        let imm = seq as u32 & SEQ_MASK;
        self.link
            .send_ctrl(slot, SLOT as u32, imm, TxUse::Cts(seq))
            .map(drop)
    }

    /// Message `imm` (its sequence number) was offered and is complete already.
    fn finished_before(&self, imm: u32) -> bool {
        let seq = imm & SEQ_MASK;
        let d = (self.next_seq as u32).wrapping_sub(seq) & SEQ_MASK;
        d != 0 && d <= SEQ_MASK / 2 && !self.pending.iter().any(|r| r.seq as u32 & SEQ_MASK == seq)
    }

    /// The offered receive for message `imm` (its low 31 bits), or a protocol error.
    fn offered(&mut self, imm: u32) -> Result<usize> {
        let seq = imm & SEQ_MASK;
        match self
            .pending
            .iter()
            .position(|r| r.seq as u32 & SEQ_MASK == seq)
        {
            Some(i) => Ok(i),
            None => {
                let e = Error::new(
                    ErrorKind::Protocol,
                    format!(
                        "rank {} wrote message {seq}, which this rank has not offered",
                        self.link.peer
                    ),
                );
                Err(self.link.fail(e))
            }
        }
    }

    /// One piece of a message was written; the last one completes the receive.
    fn piece_arrived(&mut self, imm: u32) -> Result<()> {
        let i = self.offered(imm)?;
        let bit = 1u16 << ((imm >> PIECE_SHIFT) & PIECE_MASK);
        let r = &mut self.pending[i];
        if r.got & bit != 0 {
            // Written again on another queue pair after its first one died.
            return Ok(());
        }
        r.got |= bit;
        r.left = r.left.saturating_sub(1);
        if r.left == 0 {
            if let Some(req) = self.pending.remove(i) {
                let len = req.len;
                self.finish(req, Ok(len));
            }
        }
        Ok(())
    }

    /// The sender found our receive does not match its send: fail it with the same cause.
    fn sender_refused(&mut self, imm: u32, (theirs, len): (MsgTag, u64)) -> Result<()> {
        if self.finished_before(imm) {
            return Ok(()); // a report sent again after its queue pair died: failed already
        }
        let i = self.offered(imm)?;
        if let Some(req) = self.pending.remove(i) {
            let e = if theirs == req.tag {
                Error::new(
                    ErrorKind::Mismatch,
                    format!(
                        "{}: rank {} sends {len} bytes where this rank receives {}",
                        req.tag.op_seq, self.link.peer, req.len
                    ),
                )
            } else {
                MsgTag::mismatch(&req.tag, &theirs)
            };
            let e = e.peer(self.link.peer).transport(NAME);
            self.finish(req, Err(e));
        }
        Ok(())
    }

    fn finish(&mut self, req: RecvReq, r: Result<usize>) {
        if let Reg::Staged { slot: s, .. } = req.reg {
            if r.is_ok() {
                // SAFETY: `irecv`'s contract keeps the caller's `len` bytes at `dst` valid
                // until this receive completes, which is now; the slot holds `len <= eager`
                // bytes the peer wrote, and the two cannot overlap.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.link.stage.slot(s).as_ptr(),
                        req.dst as *mut u8,
                        req.len,
                    );
                }
            }
            self.link.stage.free.push(s);
        }
        self.results.insert(req.seq, r);
    }
}

impl railcc_core::net::NetRecvComm for RdmaRecvComm {
    fn reg_mr(&mut self, addr: usize, len: usize) -> Result<MemRegion> {
        self.regions.reg(&self.link.devs, addr, len)
    }

    fn dereg_mr(&mut self, mr: MemRegion) -> Result<()> {
        self.regions.dereg(mr)
    }

    fn reg_mr_dmabuf(
        &mut self,
        addr: usize,
        len: usize,
        fd: i32,
        offset: u64,
    ) -> Result<MemRegion> {
        self.regions
            .reg_device(&self.link.devs, addr, len, fd, offset)
            .map_err(|e| e.peer(self.link.peer))
    }

    unsafe fn irecv(
        &mut self,
        data: *mut u8,
        len: usize,
        tag: MsgTag,
        mr: Option<&MemRegion>,
    ) -> Result<ReqId> {
        // A free control slot: they come back as soon as earlier clear-to-sends complete.
        let start = std::time::Instant::now();
        while self.link.ctrl.free_tx.is_empty() {
            self.progress()?;
            if start.elapsed() > std::time::Duration::from_secs(30) {
                let e = Error::new(ErrorKind::Timeout, "no control slot came back in 30 s");
                return Err(self.link.fail(e));
            }
        }
        let (target, reg) = match self.link.stage.take_reg(len, mr) {
            Some(staged) => staged,
            None => (
                data as usize,
                Reg::get(&self.link.devs, data as usize, len, mr, &self.regions.map)
                    .map_err(|e| self.link.fail(e))?,
            ),
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        let slot = self.link.ctrl.free_tx.pop().unwrap_or(0);
        self.pending.push_back(RecvReq {
            seq,
            len,
            tag,
            dst: data as usize,
            target,
            reg,
            left: split(len, self.link.nqps()).1,
            got: 0,
        });
        self.post_cts(slot, self.pending.len() - 1)?;
        Ok(ReqId(seq))
    }

    fn test(&mut self, req: ReqId) -> Result<Option<usize>> {
        if let Some(r) = self.results.remove(&req.0) {
            return r.map(Some);
        }
        self.progress()?;
        match self.results.remove(&req.0) {
            Some(r) => r.map(Some),
            None => Ok(None),
        }
    }

    fn wait_fds(&self, out: &mut Vec<WaitFd>) {
        self.link.wait_fds(out);
    }

    fn abort(&mut self, reason: &str) {
        self.link.abort(reason);
    }

    fn state(&self) -> String {
        format!(
            "rdma receive from rank {}: {} receive(s) offered and not written{}, {} control \
             slot(s) free, {} queue pair(s)",
            self.link.peer,
            self.pending.len(),
            self.pending
                .front()
                .map(|r| format!(
                    " (oldest: message {}, {} B, {} piece(s) left)",
                    r.seq, r.len, r.left
                ))
                .unwrap_or_default(),
            self.link.ctrl.free_tx.len(),
            self.link.nqps()
        ) + &match self.link.dead_mask() {
            0 => String::new(),
            m => format!(" (dead: mask {m:#x})"),
        }
    }

    fn close(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}
