//! The receiving end: offers buffers (clear-to-send) and completes receives on the writer's
//! immediate.

use super::*;

struct RecvReq {
    seq: u64,
    len: usize,
    tag: MsgTag,
    /// The caller's buffer (written directly, or copied into from a staging slot).
    dst: usize,
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
    /// Answers to the sender's questions (sequence number, word) waiting for a control slot.
    answers: VecDeque<(u32, u32)>,
}

impl RdmaRecvComm {
    pub(crate) fn new(
        qps: Vec<Qp>,
        peer: usize,
        control: TcpStream,
        failover: bool,
    ) -> Result<RdmaRecvComm> {
        let link = Link::new(qps, peer, control, failover)?;
        link.post_data_recvs()?;
        Ok(RdmaRecvComm {
            link,
            regions: Regions::default(),
            next_seq: 0,
            pending: VecDeque::new(),
            results: HashMap::new(),
            answers: VecDeque::new(),
        })
    }

    fn progress(&mut self) -> Result<()> {
        let comps = self.link.poll()?;
        let mut queries = Vec::new();
        for c in &comps {
            match c.wr_id & KIND {
                K_CTRL => self.link.ctrl.free_tx.push((c.wr_id & !KIND) as usize),
                K_RECV => {
                    let slot = (c.wr_id & !KIND) as usize;
                    let imm = c.imm.unwrap_or(0);
                    let kind = (imm >> PIECE_SHIFT) & PIECE_MASK;
                    let r = if imm & ERR_BIT != 0 && kind == CTRL_QUERY {
                        // The queue pairs the sender gave up on: closed here first, so no
                        // late piece lands after the answer.
                        let b = self.link.ctrl.rx(slot);
                        let mask = u32::from_le_bytes(b[..4].try_into().unwrap_or_default());
                        self.close_dead(mask)?;
                        // Answered once every completion of this poll is in: a piece that
                        // arrived on another queue pair in the same batch counts.
                        queries.push(imm & SEQ_MASK);
                        Ok(())
                    } else if imm & ERR_BIT != 0 && kind == CTRL_MISMATCH {
                        let mismatch = decode_tag_len(self.link.ctrl.rx(slot));
                        self.sender_refused(imm, mismatch)
                    } else {
                        self.piece_arrived(imm)
                    };
                    if let Err(e) = self.link.ctrl.repost(&self.link.qp, slot) {
                        return Err(self.link.fail(e));
                    }
                    r?;
                }
                // A data queue pair that died (failover): its receives come back flushed.
                K_DATA if !c.ok => {}
                K_DATA => {
                    self.link.repost_data(c.wr_id)?;
                    self.piece_arrived(c.imm.unwrap_or(0))?;
                }
                _ => {}
            }
        }
        self.link.done_with(comps);
        for seq in queries {
            let word = match self.pending.iter().find(|r| r.seq as u32 & SEQ_MASK == seq) {
                Some(r) => r.got as u32,
                None => ANSWER_DONE,
            };
            self.answers.push_back((seq, word));
        }
        self.send_answers()
    }

    /// Closes the data queue pairs in `mask` (never the first: it carries control messages).
    fn close_dead(&mut self, mask: u32) -> Result<()> {
        for q in 1..self.link.nqps().min(32) {
            if mask & (1 << q) != 0 && !self.link.dead[q] {
                self.link.dead[q] = true;
                if let Err(e) = self.link.qp_at(q).set_error() {
                    return Err(self.link.fail(e));
                }
            }
        }
        Ok(())
    }

    /// Tells the sender which pieces of a message arrived (it asks after a queue pair died,
    /// and writes again only the missing ones, while the receive is still offered).
    fn send_answers(&mut self) -> Result<()> {
        while let Some(&(seq, word)) = self.answers.front() {
            let Some(slot) = self.link.ctrl.free_tx.pop() else {
                break;
            };
            self.answers.pop_front();
            self.link.send_word(slot, word, CTRL_ANSWER, seq)?;
        }
        Ok(())
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
        let a = self.link.ctrl.tx_addr(slot);
        {
            let o = slot * SLOT;
            let b = &mut self.link.ctrl.buf[o..o + SLOT];
            b[..8].copy_from_slice(&(target as u64).to_le_bytes());
            // One remote key per device: the writer uses the one of the queue pair it writes on.
            for (d, at) in CTS_RKEY_AT.iter().enumerate() {
                let rkey = if d < self.link.devs.len() {
                    reg.keys(d).1
                } else {
                    0
                };
                b[*at..at + 4].copy_from_slice(&rkey.to_le_bytes());
            }
            encode_tag_len(&mut b[16..], &tag, len as u64);
        }
        let lkey = self.link.ctrl.mr.lkey;
        if let Err(e) = self.link.qp.post_send(
            K_CTRL | slot as u64,
            a,
            SLOT as u32,
            lkey,
            None,
            Some(seq as u32 & SEQ_MASK),
            true,
        ) {
            return Err(self.link.fail(e));
        }
        self.pending.push_back(RecvReq {
            seq,
            len,
            tag,
            dst: data as usize,
            reg,
            left: split(len, self.link.nqps()).1,
            got: 0,
        });
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
        )
    }

    fn close(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}
