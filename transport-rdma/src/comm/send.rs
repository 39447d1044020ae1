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
    /// The receiver's remote key on each of its devices.
    rkeys: [u32; MAX_RAILS],
    len: u64,
    tag: MsgTag,
}

/// A piece's queue pair while it waits to be written again, and while the receiver is asked
/// whether it arrived.
const UNPLACED: usize = usize::MAX;
const ASKING: usize = usize::MAX - 1;

/// One piece of a message being written.
struct Piece {
    /// The queue pair it is on, or UNPLACED, or ASKING.
    qp: usize,
    off: usize,
    n: usize,
    /// Send-queue entries it takes: one write per `MAX_WRITE` bytes (at least one).
    wrs: u32,
    done: bool,
}

/// A message being written: where from, where to, its pieces.
struct InFlight {
    seq: u64,
    len: usize,
    src: usize,
    addr: u64,
    rkeys: [u32; MAX_RAILS],
    pieces: Vec<Piece>,
    left: usize,
    reg: Reg,
    /// A question about its pieces is out (or queued).
    asked: bool,
}

fn wrs_of(n: usize) -> u32 {
    n.div_ceil(MAX_WRITE).max(1) as u32
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
    /// Each queue pair's measured rate: pieces are sized by it.
    meter: rails::Meter,
    /// The receiver's device behind each queue pair (which of its remote keys to use).
    peer_dev_of: Vec<usize>,
    /// Pieces to write again (message, piece) after their queue pair died and the receiver
    /// said they are missing.
    resend: VecDeque<(u64, usize)>,
    /// Messages to ask the receiver about (which of their pieces arrived).
    queries: VecDeque<u64>,
}

impl RdmaSendComm {
    /// `peer_rails`: how many devices the receiver spread its queue pairs over (queue pair q
    /// is on its device q * peer_rails / nqps).
    pub(crate) fn new(
        qps: Vec<Qp>,
        peer: usize,
        control: TcpStream,
        failover: bool,
        peer_rails: usize,
    ) -> Result<RdmaSendComm> {
        let link = Link::new(qps, peer, control, failover)?;
        let n = link.nqps();
        let pr = peer_rails.clamp(1, MAX_RAILS);
        Ok(RdmaSendComm {
            sq_used: vec![0; n],
            meter: rails::Meter::new(n),
            peer_dev_of: (0..n).map(|q| q * pr / n).collect(),
            link,
            regions: Regions::default(),
            next_seq: 0,
            queue: VecDeque::new(),
            cts: VecDeque::new(),
            inflight: VecDeque::new(),
            results: HashMap::new(),
            resend: VecDeque::new(),
            queries: VecDeque::new(),
        })
    }

    fn find(&self, seq: u64) -> Option<usize> {
        self.inflight.iter().position(|w| w.seq & WR_SEQ == seq)
    }

    /// Piece `p` of message `seq` (low bits, as in the work request id) was acknowledged on
    /// queue pair `q`.
    fn piece_done(&mut self, q: usize, seq: u64, p: usize) -> Result<()> {
        let Some(i) = self.find(seq) else {
            let e = Error::new(
                ErrorKind::Protocol,
                format!("rdma: completion for message {seq}, which is not being written"),
            );
            return Err(self.link.fail(e));
        };
        let w = &mut self.inflight[i];
        let Some(piece) = w.pieces.get_mut(p).filter(|x| !x.done) else {
            return Ok(());
        };
        piece.done = true;
        let (n, wrs) = (piece.n, piece.wrs);
        if let Some(u) = self.sq_used.get_mut(q) {
            *u = u.saturating_sub(wrs);
        }
        self.meter.acked(q, n, std::time::Instant::now());
        w.left -= 1;
        if w.left == 0 {
            self.finish(i);
        }
        Ok(())
    }

    /// In-flight message `i` has every piece acknowledged (or reported arrived).
    fn finish(&mut self, i: usize) {
        if let Some(w) = self.inflight.remove(i) {
            if let Reg::Staged { slot, .. } = w.reg {
                self.link.stage.free.push(slot);
            }
            self.results.insert(w.seq, Ok(w.len));
        }
    }

    /// A write of piece `p` of message `seq` failed on queue pair `q`, which is dead now. It
    /// may have arrived all the same (its acknowledgement lost): the receiver is asked, and
    /// only what it lacks is written again, on a live queue pair, while its receive is still
    /// offered (a late second copy could land in a buffer already handed back).
    fn piece_failed(&mut self, q: usize, seq: u64, p: usize) {
        let Some(i) = self.find(seq) else { return };
        let w = &mut self.inflight[i];
        if let Some(piece) = w.pieces.get_mut(p) {
            if !piece.done && piece.qp == q {
                piece.qp = ASKING;
                if !w.asked {
                    w.asked = true;
                    self.queries.push_back(w.seq);
                }
            }
        }
    }

    /// The receiver's answer about message `seq`: the pieces it has (`word`'s low 16 bits), or
    /// `ANSWER_DONE`. The others are written again.
    fn answered(&mut self, seq: u32, word: u32) {
        let Some(i) = self
            .inflight
            .iter()
            .position(|w| w.seq as u32 & SEQ_MASK == seq)
        else {
            return;
        };
        let w = &mut self.inflight[i];
        w.asked = false;
        for (p, piece) in w.pieces.iter_mut().enumerate() {
            if piece.qp != ASKING {
                continue;
            }
            if word & ANSWER_DONE != 0 || word & (1 << p) != 0 {
                piece.done = true;
                w.left -= 1;
            } else {
                piece.qp = UNPLACED;
                self.resend.push_back((w.seq, p));
            }
        }
        if w.left == 0 {
            self.finish(i);
        }
    }

    /// Sends the questions queued by `piece_failed` on the first queue pair.
    fn ask(&mut self) -> Result<()> {
        while let Some(&seq) = self.queries.front() {
            if self.sq_used[0] >= DEPTH {
                break;
            }
            let Some(slot) = self.link.ctrl.free_tx.pop() else {
                break;
            };
            self.queries.pop_front();
            // The question carries the queue pairs found dead here (a mask): the receiver
            // closes them before it answers.
            let mask: u32 = (0..self.link.nqps())
                .filter(|&q| self.link.dead[q])
                .fold(0, |m, q| m | 1 << q);
            self.sq_used[0] += 1;
            self.link
                .send_word(slot, mask, CTRL_QUERY, seq as u32 & SEQ_MASK)?;
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
                K_RECV if c.imm.unwrap_or(0) & ERR_BIT != 0 => {
                    // The receiver's answer to a question about a message's pieces.
                    let slot = (c.wr_id & !KIND) as usize;
                    let imm = c.imm.unwrap_or(0);
                    let b = self.link.ctrl.rx(slot);
                    let word = u32::from_le_bytes(b[..4].try_into().unwrap_or_default());
                    if (imm >> PIECE_SHIFT) & PIECE_MASK == CTRL_ANSWER {
                        self.answered(imm & SEQ_MASK, word);
                    }
                    if let Err(e) = self.link.ctrl.repost(&self.link.qp, slot) {
                        return Err(self.link.fail(e));
                    }
                }
                K_RECV => {
                    let slot = (c.wr_id & !KIND) as usize;
                    let b = self.link.ctrl.rx(slot);
                    let (tag, len) = decode_tag_len(&b[16..]);
                    let mut rkeys = [0u32; MAX_RAILS];
                    for (k, at) in rkeys.iter_mut().zip(CTS_RKEY_AT) {
                        *k = u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default());
                    }
                    let cts = Cts {
                        seq: c.imm.unwrap_or(0) & SEQ_MASK,
                        addr: u64::from_le_bytes(b[..8].try_into().unwrap_or_default()),
                        rkeys,
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
                    let p = ((c.wr_id & LOW_BITS) >> WR_PIECE_SHIFT) as usize;
                    let seq = c.wr_id & WR_SEQ;
                    if c.ok {
                        self.piece_done(q, seq, p)?;
                    } else {
                        self.piece_failed(q, seq, p);
                    }
                }
                _ => {}
            }
        }
        self.link.done_with(comps);
        self.check_stalls()?;
        self.start_writes()
    }

    /// A queue pair (not the first) that stopped acknowledging is given up on: moved to the
    /// error state, so its writes come back flushed and are asked about; the receiver is told
    /// to close its end too, so nothing late lands after its answer. Without failover the
    /// stall is the connection's error, naming the port.
    fn check_stalls(&mut self) -> Result<()> {
        let now = std::time::Instant::now();
        for q in 1..self.link.nqps() {
            if self.link.dead[q] {
                continue;
            }
            let Some(idle) = self.meter.stalled(q, now) else {
                continue;
            };
            let c = &self.link.qp_at(q).ctx;
            let what = format!(
                "queue pair {q} to rank {} on {} port {} has had writes unacknowledged for {:.1} s (its port or link is down?)",
                self.link.peer,
                c.name,
                c.port,
                idle.as_secs_f64()
            );
            if !self.link.failover {
                let e = Error::new(
                    ErrorKind::PeerClosed,
                    format!(
                        "{what} (RAILCC_RAIL_FAILOVER=0: a rail that fails ends the connection)"
                    ),
                );
                return Err(self.link.fail(e));
            }
            tracing::warn!("rdma: {what}; its rail is out, the others carry on");
            self.link.dead[q] = true;
            if let Err(e) = self.link.qp_at(q).set_error() {
                return Err(self.link.fail(e));
            }
        }
        Ok(())
    }

    /// Posts piece `p` of in-flight message `i` on queue pair `q`: one write per `MAX_WRITE`
    /// bytes, the last signaled and carrying the immediate (sequence number and piece).
    fn post_piece(&mut self, i: usize, p: usize, q: usize) -> Result<()> {
        let (dev, pdev) = (self.link.dev_of[q], self.peer_dev_of[q]);
        let w = &self.inflight[i];
        let piece = &w.pieces[p];
        let (lkey, _) = w.reg.keys(dev);
        let rkey = w.rkeys[pdev];
        let (src, addr, seq) = (w.src, w.addr, w.seq);
        let (off0, n, wrs) = (piece.off, piece.n, piece.wrs);
        let imm = (seq as u32 & SEQ_MASK) | ((p as u32 & PIECE_MASK) << PIECE_SHIFT);
        let id = K_WRITE | (q as u64) << QP_SHIFT | (p as u64) << WR_PIECE_SHIFT | (seq & WR_SEQ);
        let end = off0 + n;
        let mut off = off0;
        loop {
            let k = (end - off).min(MAX_WRITE);
            let last = off + k == end;
            let r = self.link.qp_at(q).post_send(
                id,
                src + off,
                k as u32,
                lkey,
                Some((addr + off as u64, rkey)),
                last.then_some(imm),
                last,
            );
            if let Err(e) = r {
                return Err(self.link.fail(e));
            }
            off += k;
            if last {
                break;
            }
        }
        self.sq_used[q] += wrs;
        self.inflight[i].pieces[p].qp = q;
        self.meter.posted(q, n, std::time::Instant::now());
        Ok(())
    }

    fn live(&self) -> Vec<bool> {
        self.link.dead.iter().map(|d| !d).collect()
    }

    /// Writes again the missing pieces whose queue pair died, on the fastest live one.
    fn resend_pieces(&mut self) -> Result<()> {
        while let Some(&(seq, p)) = self.resend.front() {
            let Some(i) = self.inflight.iter().position(|w| w.seq == seq) else {
                self.resend.pop_front();
                continue;
            };
            let best = rails::fastest_live(&self.live(), &self.meter.weights);
            let Some(q) = best else {
                let e = Error::new(
                    ErrorKind::PeerClosed,
                    format!("every queue pair to rank {} is down", self.link.peer),
                );
                return Err(self.link.fail(e));
            };
            if self.sq_used[q] + self.inflight[i].pieces[p].wrs > DEPTH {
                break;
            }
            self.resend.pop_front();
            self.post_piece(i, p, q)?;
        }
        Ok(())
    }

    /// Pairs queued sends with clear-to-sends, in order, and writes.
    fn start_writes(&mut self) -> Result<()> {
        self.ask()?;
        self.resend_pieces()?;
        let nqps = self.link.nqps();
        while let (Some(s), Some(c)) = (self.queue.front(), self.cts.front()) {
            let k = split(s.len, nqps).1;
            let live = self.live();
            let Some(on) = rails::placement(k, &live, &self.meter.weights) else {
                let e = Error::new(
                    ErrorKind::PeerClosed,
                    format!("every queue pair to rank {} is down", self.link.peer),
                );
                return Err(self.link.fail(e));
            };
            let sizes = if k == 1 {
                vec![s.len]
            } else {
                let w: Vec<f64> = (0..k)
                    .map(|i| if live[i] { self.meter.weights[i] } else { 0.0 })
                    .collect();
                rails::cut(s.len, &w)
            };
            let mut need = vec![0u32; nqps];
            for (q, n) in on.iter().zip(&sizes) {
                need[*q] += wrs_of(*n);
            }
            let full = (0..nqps).any(|q| self.sq_used[q] + need[q] > DEPTH);
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
                    Some(ERR_BIT | (CTRL_MISMATCH << PIECE_SHIFT) | (s.seq as u32 & SEQ_MASK)),
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
                        &self.link.devs,
                        s.data,
                        s.len,
                        s.mr.as_ref(),
                        &self.regions.map,
                    )
                    .map_err(|e| self.link.fail(e))?,
                ),
            };
            let mut pieces = Vec::with_capacity(k);
            let mut off = 0;
            for n in &sizes {
                pieces.push(Piece {
                    qp: UNPLACED,
                    off,
                    n: *n,
                    wrs: wrs_of(*n),
                    done: false,
                });
                off += n;
            }
            self.inflight.push_back(InFlight {
                seq: s.seq,
                len: s.len,
                src,
                addr: c.addr,
                rkeys: c.rkeys,
                pieces,
                left: k,
                reg,
                asked: false,
            });
            let i = self.inflight.len() - 1;
            for (p, q) in on.into_iter().enumerate() {
                self.post_piece(i, p, q)?;
            }
        }
        Ok(())
    }
}

impl railcc_core::net::NetSendComm for RdmaSendComm {
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
            self.sq_used.iter().sum::<u32>(),
        ) + &self.rails_state()
    }

    fn close(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

impl RdmaSendComm {
    /// With several queue pairs: their shares of each message, and which are dead.
    fn rails_state(&self) -> String {
        if self.link.nqps() < 2 {
            return String::new();
        }
        let dead: Vec<usize> = (0..self.link.nqps())
            .filter(|&q| self.link.dead[q])
            .collect();
        format!(
            "; queue pairs on {} device(s), shares (measured) {}{}",
            self.link.devs.len(),
            self.meter.shares(),
            if dead.is_empty() {
                String::new()
            } else {
                format!(", dead {dead:?}")
            }
        )
    }
}
