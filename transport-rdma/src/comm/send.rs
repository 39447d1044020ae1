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

/// A message being written: its pieces not yet acknowledged.
struct InFlight {
    seq: u64,
    len: usize,
    /// Piece size (see `split`).
    chunk: usize,
    left: usize,
    reg: Reg,
}

/// Send-queue entries piece `i` of a `len`-byte message cut in `chunk`s takes: one write per
/// `MAX_WRITE` bytes (at least one, for an empty message).
fn piece_wrs(len: usize, chunk: usize, i: usize) -> u32 {
    let (a, b) = (i * chunk, ((i + 1) * chunk).min(len));
    b.saturating_sub(a).div_ceil(MAX_WRITE).max(1) as u32
}

pub struct RdmaSendComm {
    link: Link,
    regions: Regions,
    next_seq: u64,
    queue: VecDeque<SendReq>,
    cts: VecDeque<Cts>,
    inflight: VecDeque<InFlight>,
    /// Send-queue entries in use, per queue pair.
    sq_used: Vec<u32>,
    results: HashMap<u64, Result<usize>>,
}

impl RdmaSendComm {
    pub(crate) fn new(qps: Vec<Qp>, peer: usize, control: TcpStream) -> Result<RdmaSendComm> {
        let link = Link::new(qps, peer, control)?;
        Ok(RdmaSendComm {
            sq_used: vec![0; link.nqps()],
            link,
            regions: Regions::default(),
            next_seq: 0,
            queue: VecDeque::new(),
            cts: VecDeque::new(),
            inflight: VecDeque::new(),
            results: HashMap::new(),
        })
    }

    /// Piece `q` of message `seq` (low bits, as in the work request id) was acknowledged.
    fn piece_done(&mut self, q: usize, seq: u64) -> Result<()> {
        let Some(i) = self.inflight.iter().position(|w| w.seq & LOW_BITS == seq) else {
            let e = Error::new(
                ErrorKind::Protocol,
                format!("rdma: completion for message {seq}, which is not being written"),
            );
            return Err(self.link.fail(e));
        };
        let w = &mut self.inflight[i];
        self.sq_used[q] -= piece_wrs(w.len, w.chunk, q);
        w.left -= 1;
        if w.left == 0 {
            if let Some(w) = self.inflight.remove(i) {
                if let Reg::Staged { slot, .. } = w.reg {
                    self.link.stage.free.push(slot);
                }
                self.results.insert(w.seq, Ok(w.len));
            }
        }
        Ok(())
    }

    fn progress(&mut self) -> Result<()> {
        let comps = self.link.poll()?;
        for c in &comps {
            match c.wr_id & KIND {
                K_CTRL => {
                    self.link.ctrl.free_tx.push((c.wr_id & !KIND) as usize);
                    self.sq_used[0] -= 1;
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
                    let q = ((c.wr_id & QP_BITS) >> QP_SHIFT) as usize;
                    self.piece_done(q.min(self.sq_used.len() - 1), c.wr_id & LOW_BITS)?;
                }
                _ => {}
            }
        }
        self.link.done_with(comps);
        self.start_writes()
    }

    /// Pairs queued sends with clear-to-sends, in order, and writes.
    fn start_writes(&mut self) -> Result<()> {
        let nqps = self.link.nqps();
        while let (Some(s), Some(c)) = (self.queue.front(), self.cts.front()) {
            let (chunk, pieces) = split(s.len, nqps);
            let full = (0..pieces).any(|q| self.sq_used[q] + piece_wrs(s.len, chunk, q) > DEPTH);
            if full || self.sq_used[0] >= DEPTH || self.link.ctrl.free_tx.is_empty() {
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
                self.sq_used[0] += 1;
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
            for q in 0..pieces {
                // Piece q: one write per MAX_WRITE bytes, the last signaled with the immediate.
                let end = ((q + 1) * chunk).min(s.len);
                let mut off = q * chunk;
                loop {
                    let n = (end - off).min(MAX_WRITE);
                    let last = off + n == end;
                    let r = self.link.qp_at(q).post_send(
                        K_WRITE | (q as u64) << QP_SHIFT | (s.seq & LOW_BITS),
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
                self.sq_used[q] += piece_wrs(s.len, chunk, q);
            }
            self.inflight.push_back(InFlight {
                seq: s.seq,
                len: s.len,
                chunk,
                left: pieces,
                reg,
            });
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

    fn reg_mr_dmabuf(
        &mut self,
        addr: usize,
        len: usize,
        fd: i32,
        offset: u64,
    ) -> Result<MemRegion> {
        self.regions
            .reg_device(&self.link.qp, addr, len, fd, offset)
            .map_err(|e| e.peer(self.link.peer))
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
             unmatched, {} message(s) unacknowledged{}, {} send-queue entries used",
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
                .map(|w| format!(
                    " (oldest: message {}, {} B, {} piece(s) left)",
                    w.seq, w.len, w.left
                ))
                .unwrap_or_default(),
            self.sq_used.iter().sum::<u32>()
        )
    }

    fn close(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}
