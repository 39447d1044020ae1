//! The sending end: matches sends to clear-to-sends in order and RDMA-WRITEs into them.

use super::*;

mod failover;

struct SendReq {
    seq: u64,
    data: usize,
    len: usize,
    tag: MsgTag,
    mr: Option<MemRegion>,
}

struct Cts {
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
    /// While ASKING: the queue pair it was lost on (an answer counts for it only once the
    /// receiver has closed that one).
    lost_on: usize,
    off: usize,
    n: usize,
    /// Send-queue entries it takes: its mark, then one write per `MAX_WRITE` bytes.
    wrs: u32,
    /// Its mark (the first part, signalled) completed on the queue pair it is on.
    marked: bool,
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
    let m = rails::mark_len(n, MAX_WRITE);
    (usize::from(m > 0) + (n - m).div_ceil(MAX_WRITE).max(1)) as u32
}

pub struct RdmaSendComm {
    link: Link,
    regions: Regions,
    next_seq: u64,
    queue: VecDeque<SendReq>,
    /// Clear-to-sends not yet matched, by message: they may come out of order (one sent
    /// again on a live queue pair after its first died) or twice (seen once).
    cts: HashMap<u64, Cts>,
    /// Messages matched so far (the next clear-to-send to match is for this one).
    matched: u64,
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
    /// Mismatch reports (tag and length sent) not yet acknowledged, and those to send again
    /// (their queue pair died).
    reports: HashMap<u64, (MsgTag, u64)>,
    rereport: VecDeque<u64>,
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
            cts: HashMap::new(),
            matched: 0,
            inflight: VecDeque::new(),
            results: HashMap::new(),
            resend: VecDeque::new(),
            queries: VecDeque::new(),
            reports: HashMap::new(),
            rereport: VecDeque::new(),
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
        let before = if piece.marked {
            rails::mark_len(n, MAX_WRITE)
        } else {
            0
        };
        if let Some(u) = self.sq_used.get_mut(q) {
            *u = u.saturating_sub(wrs);
        }
        self.meter
            .completed(q, n - before, std::time::Instant::now());
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

    fn progress(&mut self) -> Result<()> {
        let comps = self.link.poll()?;
        let r = comps.iter().try_for_each(|c| self.handle(c));
        self.link.done_with(comps);
        r?;
        self.check_stalls()?;
        self.start_writes()
    }

    fn handle(&mut self, c: &Completion) -> Result<()> {
        let q = Link::qp_of(c.wr_id);
        match c.wr_id & KIND {
            K_CTRL => {
                if let Some(u) = self.sq_used.get_mut(q) {
                    *u = u.saturating_sub(1);
                }
                match (self.link.ctrl_completed(c), c.ok) {
                    (TxUse::Report(seq), true) => drop(self.reports.remove(&seq)),
                    (TxUse::Report(seq), false) => self.rereport.push_back(seq),
                    (TxUse::Query(seq), false) => self.queries.push_back(seq),
                    _ => {}
                }
            }
            // Flushed: its queue pair was given up.
            K_RECV if !c.ok => {}
            K_RECV => {
                self.link.control_seen(q)?;
                let slot = (c.wr_id & SLOT_BITS) as usize;
                let imm = c.imm.unwrap_or(0);
                if imm & ERR_BIT != 0 {
                    let kind = (imm >> PIECE_SHIFT) & PIECE_MASK;
                    let w = |at| self.link.ctrl.rx_word(q, slot, at);
                    let (word, mask) = (w(0), w(4));
                    if kind == CTRL_ANSWER {
                        // The receiver's answer to a question about a message's pieces.
                        self.answered(imm & SEQ_MASK, word, mask);
                    } else if kind == CTRL_CLOSED {
                        self.link.close(word)?;
                    }
                } else {
                    self.cts_arrived(q, slot, imm & SEQ_MASK);
                }
                self.link.repost(c.wr_id)?;
            }
            K_WRITE => {
                let p = ((c.wr_id & LOW_BITS) >> WR_PIECE_SHIFT) as usize;
                let seq = c.wr_id & WR_SEQ;
                if c.ok {
                    self.piece_done(q, seq, p)?;
                } else {
                    self.piece_failed(q, seq, p);
                }
            }
            // A failed mark changes nothing: the piece's last write fails after it.
            K_MARK if c.ok => {
                let p = ((c.wr_id & LOW_BITS) >> WR_PIECE_SHIFT) as usize;
                self.mark_done(q, c.wr_id & WR_SEQ, p);
            }
            _ => {}
        }
        Ok(())
    }

    /// A clear-to-send for message `seq` (its low bits) in receive slot `slot` of queue pair
    /// `q`; one for a message matched already (sent again after its queue pair died) is
    /// dropped.
    fn cts_arrived(&mut self, q: usize, slot: usize, seq: u32) {
        let Some(full) = cts_seq(seq, self.matched) else {
            return;
        };
        let b = self.link.ctrl.rx(q, slot);
        let (tag, len) = decode_tag_len(&b[16..]);
        let mut rkeys = [0u32; MAX_RAILS];
        for (k, at) in rkeys.iter_mut().zip(CTS_RKEY_AT) {
            *k = u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default());
        }
        let cts = Cts {
            addr: u64::from_le_bytes(b[..8].try_into().unwrap_or_default()),
            rkeys,
            len,
            tag,
        };
        self.cts.entry(full).or_insert(cts);
    }

    /// The mark of piece `p` of message `seq` completed on queue pair `q`: its bytes feed the
    /// queue pair's rate (a mark from a queue pair the piece has left is ignored).
    fn mark_done(&mut self, q: usize, seq: u64, p: usize) {
        let Some(i) = self.find(seq) else {
            return;
        };
        let Some(piece) = self.inflight[i].pieces.get_mut(p) else {
            return;
        };
        if piece.qp != q || piece.done || piece.marked {
            return;
        }
        piece.marked = true;
        let m = rails::mark_len(piece.n, MAX_WRITE);
        self.meter.completed(q, m, std::time::Instant::now());
    }

    /// Posts piece `p` of in-flight message `i` on queue pair `q`: its mark when it has one
    /// (`rails::mark_len` bytes, signalled), then one write per `MAX_WRITE` bytes, the last
    /// signaled and carrying the immediate (sequence number and piece).
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
        let mark = rails::mark_len(n, MAX_WRITE);
        // The mark (signalled, no immediate), then the rest in writes of at most MAX_WRITE.
        let mut parts = Vec::with_capacity(wrs as usize);
        if mark > 0 {
            parts.push((K_MARK | (id & !KIND), off0, mark));
        }
        let mut off = off0 + mark;
        loop {
            let k = (end - off).min(MAX_WRITE);
            parts.push((id, off, k));
            off += k;
            if off == end {
                break;
            }
        }
        let last = parts.len() - 1;
        for (j, (id, off, k)) in parts.into_iter().enumerate() {
            let is_mark = id & KIND == K_MARK;
            let r = self.link.qp_at(q).post_send(
                id,
                src + off,
                k as u32,
                lkey,
                Some((addr + off as u64, rkey)),
                (j == last).then_some(imm),
                j == last || is_mark,
            );
            if let Err(e) = r {
                return Err(self.link.fail(e));
            }
        }
        self.sq_used[q] += wrs;
        self.inflight[i].pieces[p].qp = q;
        self.inflight[i].pieces[p].marked = false;
        self.meter.posted(q, n, std::time::Instant::now());
        Ok(())
    }

    fn live(&self) -> Vec<bool> {
        self.link.dead.iter().map(|d| !d).collect()
    }

    /// Pairs queued sends with clear-to-sends, in order, and writes.
    fn start_writes(&mut self) -> Result<()> {
        self.ask()?;
        self.resend_pieces()?;
        let nqps = self.link.nqps();
        while let Some(s) = self.queue.front().filter(|s| self.cts.contains_key(&s.seq)) {
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
            let ctrl_full = self.link.ctrl_qp().is_none_or(|q| self.sq_used[q] >= DEPTH);
            if full || ctrl_full || self.link.ctrl.free_tx.is_empty() {
                break;
            }
            let (s, c) = match self.queue.pop_front() {
                Some(s) => match self.cts.remove(&s.seq) {
                    Some(c) => (s, c),
                    None => break,
                },
                None => break,
            };
            self.matched = s.seq + 1;
            if c.tag != s.tag || c.len != s.len as u64 {
                // Tell the receiver what we sent, so it fails with the same cause.
                self.report(s.seq, &s.tag, s.len as u64)?;
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
                Some((addr, Reg::Staged { slot, keys })) => {
                    // SAFETY: `isend`'s contract keeps the caller's `len` bytes at `data`
                    // valid until the send completes; the slot has room for `len <= eager`.
                    let from = unsafe { std::slice::from_raw_parts(s.data as *const u8, s.len) };
                    self.link.stage.slot_mut(slot)[..s.len].copy_from_slice(from);
                    (addr, Reg::Staged { slot, keys })
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
                    lost_on: UNPLACED,
                    off,
                    n: *n,
                    wrs: wrs_of(*n),
                    marked: false,
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

impl Drop for RdmaSendComm {
    /// With several queue pairs, logs the shares they ended with (`RAILCC_LOG=debug`): what the
    /// meter learnt, to compare with the ports' rates.
    fn drop(&mut self) {
        if self.link.nqps() > 1 {
            tracing::debug!(
                "rdma: send connection to rank {} closes{}",
                self.link.peer,
                self.rails_state()
            );
        }
    }
}
