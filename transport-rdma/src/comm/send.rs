//! The sending end: matches sends to clear-to-sends in order and RDMA-WRITEs into them.

use super::*;

struct SendReq {
    seq: u64,
    data: usize,
    len: usize,
    tag: MsgTag,
    mr: Option<MemRegion>,
}

struct Cts {
    seq: u32,
    addr: u64,
    rkey: u32,
    len: u64,
    tag: MsgTag,
}

pub struct RdmaSendComm {
    link: Link,
    regions: Regions,
    next_seq: u64,
    queue: VecDeque<SendReq>,
    cts: VecDeque<Cts>,
    /// Writes in flight: (seq, send-queue entries they hold, bytes, registration).
    inflight: VecDeque<(u64, u32, usize, Reg)>,
    sq_used: u32,
    results: HashMap<u64, Result<usize>>,
}

impl RdmaSendComm {
    pub(crate) fn new(qp: Qp, peer: usize, control: TcpStream) -> Result<RdmaSendComm> {
        Ok(RdmaSendComm {
            link: Link::new(qp, peer, control)?,
            regions: Regions::default(),
            next_seq: 0,
            queue: VecDeque::new(),
            cts: VecDeque::new(),
            inflight: VecDeque::new(),
            sq_used: 0,
            results: HashMap::new(),
        })
    }

    fn progress(&mut self) -> Result<()> {
        let comps = self.link.poll()?;
        for c in &comps {
            match c.wr_id & KIND {
                K_CTRL => {
                    self.link.ctrl.free_tx.push((c.wr_id & !KIND) as usize);
                    self.sq_used -= 1;
                }
                K_RECV => {
                    let slot = (c.wr_id & !KIND) as usize;
                    let b = self.link.ctrl.rx(slot);
                    let (tag, len) = decode_tag_len(&b[16..]);
                    let cts = Cts {
                        seq: c.imm.unwrap_or(0) & SEQ_MASK,
                        addr: u64::from_le_bytes(b[..8].try_into().unwrap_or_default()),
                        rkey: u32::from_le_bytes(b[8..12].try_into().unwrap_or_default()),
                        len,
                        tag,
                    };
                    self.cts.push_back(cts);
                    if let Err(e) = self.link.ctrl.repost(&self.link.qp, slot) {
                        return Err(self.link.fail(e));
                    }
                }
                K_WRITE => {
                    let seq = c.wr_id & !KIND;
                    while let Some((s, n, len, reg)) = self.inflight.pop_front() {
                        self.sq_used -= n;
                        if let Reg::Staged { slot, .. } = reg {
                            self.link.stage.free.push(slot);
                        }
                        self.results.insert(s, Ok(len));
                        if s == seq {
                            break;
                        }
                    }
                }
                _ => {}
            }
        }
        self.link.done_with(comps);
        self.start_writes()
    }

    /// Pairs queued sends with clear-to-sends, in order, and writes.
    fn start_writes(&mut self) -> Result<()> {
        while let (Some(s), Some(c)) = (self.queue.front(), self.cts.front()) {
            let need = s.len.div_ceil(MAX_WRITE).max(1) as u32;
            if self.sq_used + need > DEPTH || self.link.ctrl.free_tx.is_empty() {
                break;
            }
            if c.seq != s.seq as u32 & SEQ_MASK {
                let e = Error::new(
                    ErrorKind::Protocol,
                    format!(
                        "rank {} offered message {} where {} was next",
                        self.link.peer, c.seq, s.seq
                    ),
                );
                return Err(self.link.fail(e));
            }
            let (s, c) = match (self.queue.pop_front(), self.cts.pop_front()) {
                (Some(s), Some(c)) => (s, c),
                _ => break,
            };
            if c.tag != s.tag || c.len != s.len as u64 {
                // Tell the receiver what we sent, so it fails with the same cause.
                let slot = self.link.ctrl.free_tx.pop().unwrap_or(0);
                let o = slot * SLOT;
                encode_tag_len(&mut self.link.ctrl.buf[o..o + SLOT], &s.tag, s.len as u64);
                let (a, lkey) = (self.link.ctrl.tx_addr(slot), self.link.ctrl.mr.lkey);
                self.sq_used += 1;
                if let Err(e) = self.link.qp.post_send(
                    K_CTRL | slot as u64,
                    a,
                    (TAG_BYTES + 8) as u32,
                    lkey,
                    None,
                    Some(ERR_BIT | (s.seq as u32 & SEQ_MASK)),
                    true,
                ) {
                    return Err(self.link.fail(e));
                }
                let e = if c.tag == s.tag {
                    Error::new(
                        ErrorKind::Mismatch,
                        format!(
                            "rank {} receives {} bytes where this rank sends {}",
                            self.link.peer, c.len, s.len
                        ),
                    )
                } else {
                    MsgTag::mismatch(&s.tag, &c.tag)
                };
                self.results
                    .insert(s.seq, Err(e.peer(self.link.peer).transport(NAME)));
                continue;
            }
            let (src, reg) = match self.link.stage.take_reg(s.len, s.mr.as_ref()) {
                Some((addr, Reg::Staged { slot, lkey, rkey })) => {
                    // SAFETY: `isend`'s contract keeps the caller's `len` bytes at `data`
                    // valid until the send completes; the slot has room for `len <= eager`.
                    let from = unsafe { std::slice::from_raw_parts(s.data as *const u8, s.len) };
                    self.link.stage.slot_mut(slot)[..s.len].copy_from_slice(from);
                    (addr, Reg::Staged { slot, lkey, rkey })
                }
                Some(other) => other,
                None => (
                    s.data,
                    Reg::get(
                        &self.link.qp,
                        s.data,
                        s.len,
                        s.mr.as_ref(),
                        &self.regions.map,
                    )
                    .map_err(|e| self.link.fail(e))?,
                ),
            };
            let (lkey, _) = reg.keys();
            let mut off = 0;
            loop {
                let n = (s.len - off).min(MAX_WRITE);
                let last = off + n == s.len;
                let r = self.link.qp.post_send(
                    K_WRITE | s.seq,
                    src + off,
                    n as u32,
                    lkey,
                    Some((c.addr + off as u64, c.rkey)),
                    last.then_some(s.seq as u32 & SEQ_MASK),
                    last,
                );
                if let Err(e) = r {
                    return Err(self.link.fail(e));
                }
                off += n;
                if last {
                    break;
                }
            }
            self.sq_used += need;
            self.inflight.push_back((s.seq, need, s.len, reg));
        }
        Ok(())
    }
}

impl railcc_core::net::NetSendComm for RdmaSendComm {
    fn reg_mr(&mut self, addr: usize, len: usize) -> Result<MemRegion> {
        self.regions.reg(&self.link.qp, addr, len)
    }

    fn dereg_mr(&mut self, mr: MemRegion) -> Result<()> {
        self.regions.dereg(mr)
    }

    unsafe fn isend(
        &mut self,
        data: *const u8,
        len: usize,
        tag: MsgTag,
        mr: Option<&MemRegion>,
    ) -> Result<ReqId> {
        if let Some(e) = &self.link.broken {
            return Err(e.clone());
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.queue.push_back(SendReq {
            seq,
            data: data as usize,
            len,
            tag,
            mr: mr.cloned(),
        });
        self.progress()?;
        Ok(ReqId(seq))
    }

    fn test(&mut self, req: ReqId) -> Result<Option<usize>> {
        if !self.results.contains_key(&req.0) {
            self.progress()?;
        }
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
            "rdma send to rank {}: {} send(s) waiting for a clear-to-send{}, {} clear-to-send(s) \
             unmatched, {} write(s) unacknowledged{}, {} send-queue entries used",
            self.link.peer,
            self.queue.len(),
            self.queue
                .front()
                .map(|s| format!(" (next: message {}, {} B)", s.seq, s.len))
                .unwrap_or_default(),
            self.cts.len(),
            self.inflight.len(),
            self.inflight
                .front()
                .map(|w| format!(" (oldest: message {}, {} B)", w.0, w.2))
                .unwrap_or_default(),
            self.sq_used
        )
    }

    fn close(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}
