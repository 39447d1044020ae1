//! What both ends of a connection share: the queue pairs (rails), which of them are dead,
//! the control slots and the control socket. Control messages go on the first live queue
//! pair; a queue pair given up here is named to the peer (`CTRL_CLOSED`), which closes its end
//! too, and a control message arriving on queue pair q says the peer gave up every one below.

use super::*;
use crate::verbs::Ctx;
use mem::{Ctrl, Staging};
use std::sync::Arc;
use std::time::Instant;

pub(super) struct Link {
    /// The queue pairs, in order; any of them carries pieces and, while it is the first
    /// live one, control messages.
    pub qps: Vec<Qp>,
    /// The devices (rails) the queue pairs live on, in order, and each queue pair's device.
    pub devs: Vec<Arc<Ctx>>,
    pub dev_of: Vec<usize>,
    /// Queue pairs found dead (their port went down); with `failover`, the others carry on.
    pub dead: Vec<bool>,
    pub failover: bool,
    pub ctrl: Ctrl,
    pub stage: Staging,
    pub peer: usize,
    control: TcpStream,
    pub broken: Option<Error>,
    polls: u32,
    comps: Vec<Completion>,
    /// Control SENDs outstanding per queue pair, and since when without progress: a port
    /// that died under control messages alone shows this way (`check_ctrl_stalls`).
    ctrl_out: Vec<u32>,
    ctrl_since: Vec<Instant>,
    /// Queue pairs given up here that the peer has not been told about yet.
    tell: bool,
}

impl Link {
    /// `qps`: at least one.
    pub fn new(qps: Vec<Qp>, peer: usize, control: TcpStream, failover: bool) -> Result<Link> {
        if qps.is_empty() {
            return Err(Error::invalid("rdma: a connection needs a queue pair").transport(NAME));
        }
        let mut devs: Vec<Arc<Ctx>> = Vec::new();
        let mut dev_of = Vec::with_capacity(qps.len());
        for q in &qps {
            let d = match devs.iter().position(|c| Arc::ptr_eq(c, &q.ctx)) {
                Some(d) => d,
                None => {
                    devs.push(q.ctx.clone());
                    devs.len() - 1
                }
            };
            dev_of.push(d);
        }
        if devs.len() > MAX_RAILS {
            return Err(Error::invalid(format!(
                "rdma: a connection over {} devices (at most {MAX_RAILS})",
                devs.len()
            ))
            .transport(NAME));
        }
        let n = qps.len();
        let ctrl = Ctrl::new(&devs, n)?;
        for (q, qp) in qps.iter().enumerate() {
            for i in 0..DEPTH as usize {
                ctrl.post(qp, q, dev_of[q], i)?;
            }
        }
        let stage = Staging::new(&devs)?;
        Ok(Link {
            qps,
            devs,
            dev_of,
            dead: vec![false; n],
            failover,
            ctrl,
            stage,
            peer,
            control,
            broken: None,
            polls: 0,
            comps: Vec::with_capacity(16),
            ctrl_out: vec![0; n],
            ctrl_since: vec![Instant::now(); n],
            tell: false,
        })
    }

    pub fn nqps(&self) -> usize {
        self.qps.len()
    }

    pub fn qp_at(&self, i: usize) -> &Qp {
        &self.qps[i.min(self.qps.len() - 1)]
    }

    /// The queue pair of a work request (from its id).
    pub fn qp_of(wr_id: u64) -> usize {
        ((wr_id & QP_BITS) >> QP_SHIFT) as usize
    }

    /// The queue pair that carries control messages: the first live one.
    pub fn ctrl_qp(&self) -> Option<usize> {
        self.dead.iter().position(|d| !d)
    }

    pub fn dead_mask(&self) -> u32 {
        (0..self.nqps().min(32))
            .filter(|&q| self.dead[q])
            .fold(0, |m, q| m | 1 << q)
    }

    /// "device port N" of queue pair `q`, for messages.
    pub fn port_of(&self, q: usize) -> String {
        let c = &self.qp_at(q).ctx;
        format!("{} port {}", c.name, c.port)
    }

    /// A control receive came back: post it again (not on a dead queue pair, whose receives
    /// only come back flushed).
    pub fn repost(&mut self, wr_id: u64) -> Result<()> {
        let q = Link::qp_of(wr_id);
        if q >= self.nqps() || self.dead[q] {
            return Ok(());
        }
        let i = (wr_id & SLOT_BITS) as usize % DEPTH as usize;
        match self.ctrl.post(&self.qps[q], q, self.dev_of[q], i) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fail(e)),
        }
    }

    pub fn fail(&mut self, e: Error) -> Error {
        let e = e.peer(self.peer).transport(NAME);
        self.broken.get_or_insert(e.clone());
        e
    }

    /// Gives queue pair `q` up (`why` says what was seen): moved to the error state, so its
    /// outstanding work comes back flushed and is done again elsewhere; the peer is told.
    pub fn give_up(&mut self, q: usize, why: &str) -> Result<()> {
        if q >= self.nqps() || self.dead[q] {
            return Ok(());
        }
        self.dead[q] = true;
        self.tell = true;
        let moved = match self.ctrl_qp() {
            Some(c) if q < c => format!(" (control messages move to queue pair {c})"),
            _ => String::new(),
        };
        tracing::warn!(
            "rdma: queue pair {q} to rank {} on {} {why}; its rail is out, the others carry on{moved}",
            self.peer,
            self.port_of(q)
        );
        match self.qps[q].set_error() {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Closes the queue pairs in `mask` that the peer gave up (no notice back).
    pub fn close(&mut self, mask: u32) -> Result<()> {
        for q in 0..self.nqps().min(32) {
            if mask & (1 << q) != 0 && !self.dead[q] {
                self.dead[q] = true;
                tracing::warn!(
                    "rdma: rank {} gave up queue pair {q} (here on {}); its rail is out, the others carry on",
                    self.peer,
                    self.port_of(q)
                );
                if let Err(e) = self.qps[q].set_error() {
                    return Err(self.fail(e));
                }
            }
        }
        Ok(())
    }

    /// A control message came on queue pair `q`: the peer sends them on its first live queue
    /// pair, so it gave up every one below `q`.
    pub fn control_seen(&mut self, q: usize) -> Result<()> {
        let below = (1u32 << q.min(31)) - 1;
        self.close(below & !self.dead_mask())
    }

    /// Every completion still in queue pair `q`'s queue (after it was closed: what landed
    /// before, then flushes).
    pub fn drain(&mut self, q: usize, out: &mut Vec<Completion>) -> Result<()> {
        loop {
            let n = out.len();
            if let Err(e) = self.qps[q].poll(out) {
                return Err(self.fail(e));
            }
            if out.len() == n {
                return Ok(());
            }
        }
    }

    /// SENDs `len` bytes of control slot `slot` with immediate `imm` on the first live queue
    /// pair, for `what`; gives back the queue pair.
    pub fn send_ctrl(&mut self, slot: usize, len: u32, imm: u32, what: TxUse) -> Result<usize> {
        let Some(q) = self.ctrl_qp() else {
            let e = Error::new(
                ErrorKind::PeerClosed,
                format!("every queue pair to rank {} is down", self.peer),
            );
            return Err(self.fail(e));
        };
        let (a, lkey) = (self.ctrl.tx_addr(slot), self.ctrl.lkey(self.dev_of[q]));
        let id = K_CTRL | (q as u64) << QP_SHIFT | slot as u64;
        if let Err(e) = self.qps[q].post_send(id, a, len, lkey, None, Some(imm), true) {
            return Err(self.fail(e));
        }
        self.ctrl.uses[slot] = what;
        if self.ctrl_out[q] == 0 {
            self.ctrl_since[q] = Instant::now();
        }
        self.ctrl_out[q] += 1;
        Ok(q)
    }

    /// SENDs two control words (`words`) from control slot `slot`, with the error bit,
    /// control kind `kind` and sequence number `seq` in the immediate.
    pub fn send_words(
        &mut self,
        slot: usize,
        words: [u32; 2],
        kind: u32,
        seq: u32,
        what: TxUse,
    ) -> Result<usize> {
        let b = self.ctrl.tx_mut(slot);
        b[..4].copy_from_slice(&words[0].to_le_bytes());
        b[4..8].copy_from_slice(&words[1].to_le_bytes());
        let imm = ERR_BIT | (kind << PIECE_SHIFT) | (seq & SEQ_MASK);
        self.send_ctrl(slot, 8, imm, what)
    }

    /// A control SEND came back (`c`): its slot is free again. Gives back what it carried;
    /// when it failed (its queue pair died) the caller sends that again on a live one.
    pub fn ctrl_completed(&mut self, c: &Completion) -> TxUse {
        let q = Link::qp_of(c.wr_id);
        let slot = (c.wr_id & SLOT_BITS) as usize;
        if let Some(n) = self.ctrl_out.get_mut(q) {
            *n = n.saturating_sub(1);
            self.ctrl_since[q] = Instant::now();
        }
        let Some(u) = self.ctrl.uses.get_mut(slot) else {
            return TxUse::Free;
        };
        let what = std::mem::replace(u, TxUse::Free);
        self.ctrl.free_tx.push(slot);
        if what == TxUse::Closed && !c.ok {
            // A lost notice is sent again (with every queue pair dead by then).
            self.tell = true;
        }
        what
    }

    /// Tells the peer which queue pairs are given up here, once a control slot is free;
    /// gives back the queue pair it went on, if it went.
    pub fn tell_peer(&mut self) -> Result<Option<usize>> {
        if !self.tell || self.ctrl_qp().is_none() {
            return Ok(None);
        }
        let Some(slot) = self.ctrl.free_tx.pop() else {
            return Ok(None);
        };
        self.tell = false;
        let mask = self.dead_mask();
        self.send_words(slot, [mask, 0], CTRL_CLOSED, 0, TxUse::Closed)
            .map(Some)
    }

    /// Control SENDs left unacknowledged for `rails::STALL_MIN` on a live queue pair: its
    /// port is taken for dead (Soft-RoCE never reports that itself). With failover and
    /// another live queue pair, it is given up; without failover that is the connection's
    /// error, naming the port. The last live queue pair is never given up for a stall.
    pub fn check_ctrl_stalls(&mut self, now: Instant) -> Result<()> {
        if self.nqps() < 2 {
            return Ok(());
        }
        for q in 0..self.nqps() {
            if self.dead[q] || self.ctrl_out[q] == 0 {
                continue;
            }
            let idle = now.saturating_duration_since(self.ctrl_since[q]);
            if idle < rails::STALL_MIN {
                continue;
            }
            let why = format!(
                "has had control messages unacknowledged for {:.1} s (its port or link is down?)",
                idle.as_secs_f64()
            );
            self.stalled(q, &why)?;
        }
        Ok(())
    }

    /// Queue pair `q` stalled (`why`): given up, or the connection's error without failover.
    pub fn stalled(&mut self, q: usize, why: &str) -> Result<()> {
        if !self.failover {
            let e = Error::new(
                ErrorKind::PeerClosed,
                format!(
                    "queue pair {q} to rank {} on {} {why} (RAILCC_RAIL_FAILOVER=0: a rail that fails ends the connection)",
                    self.peer,
                    self.port_of(q)
                ),
            );
            return Err(self.fail(e));
        }
        if self.live_besides(q) {
            self.give_up(q, why)?;
        }
        Ok(())
    }

    /// Whether a queue pair other than `q` lives.
    fn live_besides(&self, q: usize) -> bool {
        (0..self.nqps()).any(|i| i != q && !self.dead[i])
    }

    /// Polls the CQs; also, now and then, the control socket (EOF: the peer is gone). A
    /// failed work request on a live queue pair gives that queue pair up when failover is on
    /// and another lives (the completion is handed on: its work is done again elsewhere);
    /// otherwise it is the connection's error, naming the port.
    pub fn poll(&mut self) -> Result<Vec<Completion>> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        self.comps.clear();
        let mut comps = std::mem::take(&mut self.comps);
        let polled = self.qps.iter().try_for_each(|q| q.poll(&mut comps));
        if let Err(e) = polled {
            return Err(self.fail(e));
        }
        for c in &comps {
            if c.ok {
                continue;
            }
            let kind = c.wr_id & KIND;
            let q = Link::qp_of(c.wr_id);
            let what = match kind {
                K_CTRL => "control message",
                K_RECV => "receive",
                _ => "RDMA write",
            };
            if q < self.nqps() && self.dead[q] {
                continue; // flushed after it was given up
            }
            if self.failover && q < self.nqps() && self.live_besides(q) {
                self.give_up(q, &format!("failed ({what}: {})", c.status))?;
                continue;
            }
            let e = Error::new(
                ErrorKind::PeerClosed,
                format!(
                    "{what} (work request {:#x}, queue pair {q} of {}) to rank {} on {} failed: {}{}",
                    c.wr_id & LOW_BITS,
                    self.nqps(),
                    self.peer,
                    self.port_of(q),
                    c.status,
                    if self.devs.len() > 1 && !self.failover {
                        " (RAILCC_RAIL_FAILOVER=0: a rail that fails ends the connection)"
                    } else {
                        ""
                    }
                ),
            );
            return Err(self.fail(e));
        }
        self.polls = self.polls.wrapping_add(1);
        if comps.is_empty() && self.polls.is_multiple_of(64) {
            let mut b = [0u8; 1];
            // SAFETY: a one-byte peek into a valid buffer on our own socket; MSG_DONTWAIT keeps
            // it from blocking whatever mode the socket is in.
            let r = unsafe {
                libc::recv(
                    self.control.as_raw_fd(),
                    b.as_mut_ptr() as *mut libc::c_void,
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            let r = if r < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(r as usize)
            };
            match r {
                Ok(n) if n > 0 => {
                    // The peer gave up and said why before closing (`abort`).
                    let mut why = [0u8; 1024];
                    // SAFETY: reading into a valid buffer of that length; non-blocking.
                    let got = unsafe {
                        libc::recv(
                            self.control.as_raw_fd(),
                            why.as_mut_ptr() as *mut libc::c_void,
                            why.len(),
                            libc::MSG_DONTWAIT,
                        )
                    };
                    let text = String::from_utf8_lossy(&why[..got.max(0) as usize]).into_owned();
                    let e = Error::new(
                        ErrorKind::PeerClosed,
                        format!("rank {} gave up: {}", self.peer, text.trim()),
                    );
                    return Err(self.fail(e));
                }
                Ok(0) => {
                    let e = Error::new(
                        ErrorKind::PeerClosed,
                        format!("rank {} closed its connection (process gone?)", self.peer),
                    );
                    return Err(self.fail(e));
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(self.fail(Error::io("rdma: control socket", &e))),
            }
        }
        Ok(comps)
    }

    pub fn done_with(&mut self, comps: Vec<Completion>) {
        self.comps = comps;
    }

    /// Sleeping ranks wake when a completion arrives (the armed completion channel) or the
    /// control socket turns readable (the peer died or gave up).
    pub fn wait_fds(&self, out: &mut Vec<WaitFd>) {
        for q in &self.qps {
            q.arm();
            out.push(WaitFd {
                fd: q.event_fd(),
                write: false,
            });
        }
        out.push(WaitFd {
            fd: self.control.as_raw_fd(),
            write: false,
        });
    }

    /// Best effort: the reason goes on the control socket, where the peer's next look finds it.
    pub fn abort(&mut self, reason: &str) {
        let b = reason.as_bytes();
        let b = &b[..b.len().min(1000)];
        // SAFETY: sending from a valid buffer; non-blocking and without SIGPIPE.
        unsafe {
            libc::send(
                self.control.as_raw_fd(),
                b.as_ptr() as *const libc::c_void,
                b.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            );
        }
    }
}
