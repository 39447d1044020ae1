//! One connection's two ends over an RC queue pair. The receiver drives: each `irecv`
//! registers the buffer and SENDs a clear-to-send (address, rkey, length, tag) to the sender;
//! the sender matches its `isend`s to the clear-to-sends in order, checks length and tag, and
//! RDMA-WRITEs the data straight into the receiver's buffer, the last write carrying the
//! message's sequence number as an immediate, which completes the receive. Flow control is the
//! receiver's posted buffers (credits): nothing is written that was not offered. With several
//! queue pairs per connection (`RAILCC_IB_QPS_PER_CONN`), a message of `SPLIT_MIN` bytes or more
//! is cut into one piece per queue pair, each written with the immediate; the receive completes
//! when every piece has arrived. Control messages use the first queue pair. A mismatch is
//! reported to the receiver with a SEND carrying the sender's tag, so both ranks fail with the
//! same named cause. A TCP control socket stays open beside the QP: a peer that dies closes it,
//! which names the dead rank at once instead of after the retry timeout.

use crate::verbs::{Completion, Mr, Qp};
use crate::NAME;
use railcc_core::net::{MemRegion, MsgTag, ReqId, WaitFd, TAG_BYTES};
use railcc_core::{Error, ErrorKind, Result};
use std::collections::{HashMap, VecDeque};
use std::net::TcpStream;
use std::os::fd::AsRawFd;

mod rails;
mod recv;
mod send;
pub use recv::RdmaRecvComm;
pub use send::RdmaSendComm;

pub const DEPTH: u32 = 128;
const SLOT: usize = 64;
const MAX_WRITE: usize = 1 << 30;
/// An immediate: the message's sequence number (low 27 bits), the piece index (4 bits: a
/// piece written twice after a queue pair died counts once) and the error bit.
const SEQ_MASK: u32 = 0x07ff_ffff;
const PIECE_SHIFT: u32 = 27;
const PIECE_MASK: u32 = 0xf;
const ERR_BIT: u32 = 0x8000_0000;
/// Control messages with the error bit set carry their kind in the piece field: a mismatch
/// report (receiver to sender... and back), a sender's question after a queue pair died
/// (which pieces of this message arrived?) and the receiver's answer (a mask of pieces, or
/// `ANSWER_DONE` when the message is already complete).
const CTRL_MISMATCH: u32 = 0;
const CTRL_QUERY: u32 = 1;
const CTRL_ANSWER: u32 = 2;
const ANSWER_DONE: u32 = 1 << 16;
// wr_id kinds (top byte).
const K_CTRL: u64 = 1 << 56;
const K_RECV: u64 = 2 << 56;
const K_WRITE: u64 = 3 << 56;
/// A receive on a data queue pair (the second and later): it only takes an immediate.
const K_DATA: u64 = 4 << 56;
const KIND: u64 = 0xff << 56;
/// Which queue pair of the connection a work request went to (bits 48..56 of its id).
const QP_SHIFT: u32 = 48;
const QP_BITS: u64 = 0xff << QP_SHIFT;
const LOW_BITS: u64 = (1 << QP_SHIFT) - 1;
/// A write's piece index (bits 40..48 of its id) and message sequence number (below).
const WR_PIECE_SHIFT: u32 = 40;
const WR_SEQ: u64 = (1 << WR_PIECE_SHIFT) - 1;
/// Most ports (devices) one connection stripes over: the clear-to-send has room for one
/// remote key per device.
pub const MAX_RAILS: usize = 4;
/// Where a clear-to-send holds the remote key of each of the receiver's devices.
const CTS_RKEY_AT: [usize; MAX_RAILS] = [8, 12, 56, 60];
/// Messages this large or larger are split across the connection's queue pairs.
pub const SPLIT_MIN: usize = 64 * 1024;
/// Most queue pairs one connection may have (the handshake refuses more).
pub const MAX_QPS: usize = 16;

/// How a message of `len` bytes is cut over `nqps` queue pairs: the piece size and the number of
/// pieces (piece i goes to queue pair i). Both ends compute it, so the receiver knows how many
/// immediates complete a message.
pub fn split(len: usize, nqps: usize) -> (usize, usize) {
    if nqps <= 1 || len < SPLIT_MIN {
        return (len.max(1), 1);
    }
    let chunk = len.div_ceil(nqps).next_multiple_of(4096);
    (chunk, len.div_ceil(chunk))
}

/// Registered control slots: `DEPTH` to send from, `DEPTH` to receive into.
struct Ctrl {
    buf: Vec<u8>,
    mr: Mr,
    free_tx: Vec<usize>,
}

impl Ctrl {
    fn new(qp: &Qp) -> Result<Ctrl> {
        let buf = vec![0u8; 2 * DEPTH as usize * SLOT];
        let mr = qp.ctx.reg(buf.as_ptr() as usize, buf.len())?;
        Ok(Ctrl {
            buf,
            mr,
            free_tx: (0..DEPTH as usize).collect(),
        })
    }
    fn tx_addr(&self, i: usize) -> usize {
        self.buf.as_ptr() as usize + i * SLOT
    }
    fn rx(&self, i: usize) -> &[u8] {
        let o = (DEPTH as usize + i) * SLOT;
        &self.buf[o..o + SLOT]
    }
    fn rx_addr(&self, i: usize) -> usize {
        self.buf.as_ptr() as usize + (DEPTH as usize + i) * SLOT
    }
    fn post_all_recvs(&self, qp: &Qp) -> Result<()> {
        (0..DEPTH as usize).try_for_each(|i| {
            qp.post_recv(
                K_RECV | i as u64,
                self.rx_addr(i),
                SLOT as u32,
                self.mr.lkey,
            )
        })
    }
    fn repost(&self, qp: &Qp, i: usize) -> Result<()> {
        qp.post_recv(
            K_RECV | i as u64,
            self.rx_addr(i),
            SLOT as u32,
            self.mr.lkey,
        )
    }
}

/// Messages up to `eager_bytes` (at most `EAGER`) go through pre-registered staging slots, copied in and out,
/// instead of registering the caller's buffer per transfer (a registration is a system call
/// that pins pages: it costs more than copying a small message).
pub const EAGER: usize = 16 * 1024;
const STAGE_SLOTS: usize = 32;

/// Registered staging slots of `eager` bytes each (one set per direction per peer).
struct Staging {
    buf: Vec<u8>,
    mr: Mr,
    free: Vec<usize>,
    eager: usize,
}

impl Staging {
    fn new(qp: &Qp) -> Result<Staging> {
        let eager = qp.ctx.tuning.eager_bytes.min(EAGER);
        let buf = vec![0u8; (STAGE_SLOTS * eager).max(1)];
        let mr = qp.ctx.reg(buf.as_ptr() as usize, buf.len())?;
        Ok(Staging {
            buf,
            mr,
            free: if eager == 0 {
                Vec::new()
            } else {
                (0..STAGE_SLOTS).rev().collect()
            },
            eager,
        })
    }
    /// A free slot for a message of `len` bytes, if it is small enough and one is free.
    fn take(&mut self, len: usize) -> Option<usize> {
        if len == 0 || len > self.eager {
            return None;
        }
        self.free.pop()
    }
    /// A slot for a message the caller did not register (`mr` None), as a registration.
    fn take_reg(&mut self, len: usize, mr: Option<&MemRegion>) -> Option<(usize, Reg)> {
        let slot = if mr.is_none() {
            self.take(len)?
        } else {
            return None;
        };
        let (lkey, rkey) = (self.mr.lkey, self.mr.rkey);
        Some((self.addr(slot), Reg::Staged { slot, lkey, rkey }))
    }
    fn addr(&self, slot: usize) -> usize {
        self.buf.as_ptr() as usize + slot * self.eager
    }
    fn slot_mut(&mut self, slot: usize) -> &mut [u8] {
        &mut self.buf[slot * self.eager..(slot + 1) * self.eager]
    }
    fn slot(&self, slot: usize) -> &[u8] {
        &self.buf[slot * self.eager..(slot + 1) * self.eager]
    }
}

/// What both ends share: the queue pairs, the control slots, the peer, the control socket.
struct Link {
    /// The first queue pair: control messages and a message's first piece.
    qp: Qp,
    /// The other queue pairs (none by default): later pieces of large messages.
    data: Vec<Qp>,
    /// The devices (rails) the queue pairs live on, in order, and each queue pair's device.
    devs: Vec<std::sync::Arc<crate::verbs::Ctx>>,
    dev_of: Vec<usize>,
    /// Queue pairs found dead (their port went down); with `failover`, the others carry on.
    dead: Vec<bool>,
    failover: bool,
    ctrl: Ctrl,
    stage: Staging,
    peer: usize,
    control: TcpStream,
    broken: Option<Error>,
    polls: u32,
    comps: Vec<Completion>,
}

impl Link {
    /// `qps`: at least one; the first carries control messages.
    fn new(mut qps: Vec<Qp>, peer: usize, control: TcpStream, failover: bool) -> Result<Link> {
        if qps.is_empty() {
            return Err(Error::invalid("rdma: a connection needs a queue pair").transport(NAME));
        }
        let mut devs: Vec<std::sync::Arc<crate::verbs::Ctx>> = Vec::new();
        let mut dev_of = Vec::with_capacity(qps.len());
        for q in &qps {
            let d = match devs.iter().position(|c| std::sync::Arc::ptr_eq(c, &q.ctx)) {
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
        let dead = vec![false; qps.len()];
        let data = qps.split_off(1);
        let qp = qps.remove(0);
        let ctrl = Ctrl::new(&qp)?;
        ctrl.post_all_recvs(&qp)?;
        let stage = Staging::new(&qp)?;
        Ok(Link {
            qp,
            data,
            devs,
            dev_of,
            dead,
            failover,
            ctrl,
            stage,
            peer,
            control,
            broken: None,
            polls: 0,
            comps: Vec::with_capacity(16),
        })
    }

    fn nqps(&self) -> usize {
        1 + self.data.len()
    }

    fn qp_at(&self, i: usize) -> &Qp {
        if i == 0 {
            &self.qp
        } else {
            &self.data[i - 1]
        }
    }

    fn data_recv_id(i: usize) -> u64 {
        K_DATA | (i as u64) << QP_SHIFT
    }

    /// The receiving end: fills each data queue pair with receives that take an immediate.
    fn post_data_recvs(&self) -> Result<()> {
        for (i, q) in self.data.iter().enumerate() {
            for _ in 0..DEPTH {
                q.post_recv(Link::data_recv_id(i + 1), 0, 0, 0)?;
            }
        }
        Ok(())
    }

    /// A data queue pair's receive was used: post another.
    fn repost_data(&mut self, wr_id: u64) -> Result<()> {
        let i = ((wr_id & QP_BITS) >> QP_SHIFT) as usize;
        match self.data.get(i.wrapping_sub(1)) {
            Some(q) => q.post_recv(wr_id, 0, 0, 0).map_err(|e| self.fail(e)),
            None => Err(self.fail(Error::new(
                ErrorKind::Protocol,
                format!("rdma: completion for queue pair {i}, which does not exist"),
            ))),
        }
    }

    fn fail(&mut self, e: Error) -> Error {
        let e = e.peer(self.peer).transport(NAME);
        self.broken.get_or_insert(e.clone());
        e
    }

    /// Polls the CQ; also, now and then, the control socket (EOF: the peer is gone).
    fn poll(&mut self) -> Result<Vec<Completion>> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        self.comps.clear();
        let mut comps = std::mem::take(&mut self.comps);
        let polled = std::iter::once(&self.qp)
            .chain(&self.data)
            .try_for_each(|q| q.poll(&mut comps));
        if let Err(e) = polled {
            return Err(self.fail(e));
        }
        for c in &comps {
            if c.ok {
                continue;
            }
            let kind = c.wr_id & KIND;
            let q = ((c.wr_id & QP_BITS) >> QP_SHIFT) as usize;
            // A write or data receive on a queue pair other than the first (which carries the
            // control messages, so it lives as long as the connection) fails that queue pair
            // alone: its pieces are written again elsewhere.
            if self.failover && q != 0 && q < self.nqps() && (kind == K_WRITE || kind == K_DATA) {
                if !self.dead[q] {
                    self.dead[q] = true;
                    tracing::warn!(
                        "rdma: queue pair {q} to rank {} on {} port {} failed ({}); its rail is out, the others carry on",
                        self.peer,
                        self.qp_at(q).ctx.name,
                        self.qp_at(q).ctx.port,
                        c.status
                    );
                }
                continue;
            }
            let what = match kind {
                K_CTRL => "control message",
                K_RECV | K_DATA => "receive",
                _ => "RDMA write",
            };
            let qc = &self.qp_at(q.min(self.nqps() - 1)).ctx;
            let e = Error::new(
                ErrorKind::PeerClosed,
                format!(
                    "{what} (work request {:#x}, queue pair {q} of {}) to rank {} on {} port {} failed: {}{}",
                    c.wr_id & LOW_BITS,
                    self.nqps(),
                    self.peer,
                    qc.name,
                    qc.port,
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

    fn done_with(&mut self, comps: Vec<Completion>) {
        self.comps = comps;
    }

    /// Sleeping ranks wake when a completion arrives (the armed completion channel) or the
    /// control socket turns readable (the peer died or gave up).
    fn wait_fds(&self, out: &mut Vec<WaitFd>) {
        for q in std::iter::once(&self.qp).chain(&self.data) {
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

    /// SENDs a 4-byte control word from control slot `slot` on the first queue pair, with the
    /// error bit, control kind `kind` and sequence number `seq` in the immediate (the
    /// sender's questions and the receiver's answers after a queue pair died).
    fn send_word(&mut self, slot: usize, word: u32, kind: u32, seq: u32) -> Result<()> {
        let o = slot * SLOT;
        self.ctrl.buf[o..o + 4].copy_from_slice(&word.to_le_bytes());
        let (a, lkey) = (self.ctrl.tx_addr(slot), self.ctrl.mr.lkey);
        let imm = ERR_BIT | (kind << PIECE_SHIFT) | (seq & SEQ_MASK);
        match self
            .qp
            .post_send(K_CTRL | slot as u64, a, 4, lkey, None, Some(imm), true)
        {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Best effort: the reason goes on the control socket, where the peer's next look finds it.
    fn abort(&mut self, reason: &str) {
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

fn encode_tag_len(b: &mut [u8], tag: &MsgTag, len: u64) {
    b[..TAG_BYTES].copy_from_slice(&tag.encode());
    b[TAG_BYTES..TAG_BYTES + 8].copy_from_slice(&len.to_le_bytes());
}

/// decode_tag_len on any bytes (padded), for the fuzzer.
#[doc(hidden)]
pub fn fuzz_tag_len(bytes: &[u8]) {
    let mut b = [0u8; TAG_BYTES + 8];
    let n = bytes.len().min(b.len());
    b[..n].copy_from_slice(&bytes[..n]);
    let _ = decode_tag_len(&b);
}

fn decode_tag_len(b: &[u8]) -> (MsgTag, u64) {
    let mut t = [0u8; TAG_BYTES];
    t.copy_from_slice(&b[..TAG_BYTES]);
    let mut l = [0u8; 8];
    l.copy_from_slice(&b[TAG_BYTES..TAG_BYTES + 8]);
    (MsgTag::decode(&t), u64::from_le_bytes(l))
}

/// A registration held by one request: the caller's region, or our own for this request; on
/// each device of the connection (keys per device).
enum Reg {
    Caller {
        keys: Vec<(u32, u32)>,
    },
    Own(Vec<Mr>),
    /// Staging slot `slot` (lkey, rkey of the staging region, on the first device).
    Staged {
        slot: usize,
        lkey: u32,
        rkey: u32,
    },
    None,
}

impl Reg {
    fn get(
        devs: &[std::sync::Arc<crate::verbs::Ctx>],
        addr: usize,
        len: usize,
        mr: Option<&MemRegion>,
        own: &HashMap<u64, Vec<Mr>>,
    ) -> Result<Reg> {
        if len == 0 {
            return Ok(Reg::None);
        }
        if let Some(m) = mr {
            if let Some(rs) = own.get(&m.id) {
                if rs
                    .iter()
                    .all(|r| addr >= r.addr && addr + len <= r.addr + r.len)
                {
                    return Ok(Reg::Caller {
                        keys: rs.iter().map(|r| (r.lkey, r.rkey)).collect(),
                    });
                }
            }
        }
        Ok(Reg::Own(
            devs.iter()
                .map(|d| d.reg(addr, len))
                .collect::<Result<Vec<_>>>()?,
        ))
    }
    /// (lkey, rkey) on device `dev`.
    fn keys(&self, dev: usize) -> (u32, u32) {
        match self {
            Reg::Caller { keys } => keys.get(dev).copied().unwrap_or((0, 0)),
            Reg::Own(m) => m.get(dev).map_or((0, 0), |m| (m.lkey, m.rkey)),
            Reg::Staged { lkey, rkey, .. } => (*lkey, *rkey),
            Reg::None => (0, 0),
        }
    }
}

/// Regions the caller registered with `reg_mr` (kept until `dereg_mr`), on every device.
#[derive(Default)]
struct Regions {
    next: u64,
    map: HashMap<u64, Vec<Mr>>,
}

impl Regions {
    fn reg(
        &mut self,
        devs: &[std::sync::Arc<crate::verbs::Ctx>],
        addr: usize,
        len: usize,
    ) -> Result<MemRegion> {
        let mrs = devs
            .iter()
            .map(|d| d.reg(addr, len))
            .collect::<Result<Vec<_>>>()?;
        Ok(self.keep(mrs, addr, len))
    }

    fn keep(&mut self, mrs: Vec<Mr>, addr: usize, len: usize) -> MemRegion {
        self.next += 1;
        self.map.insert(self.next, mrs);
        MemRegion {
            id: self.next,
            addr,
            len,
        }
    }
    /// GPU memory: through dma-buf, or, where that fails and nvidia-peermem is loaded, as
    /// an ordinary registration of the device address (peermem resolves it).
    fn reg_device(
        &mut self,
        devs: &[std::sync::Arc<crate::verbs::Ctx>],
        addr: usize,
        len: usize,
        fd: i32,
        offset: u64,
    ) -> Result<MemRegion> {
        let mut mrs = Vec::with_capacity(devs.len());
        for d in devs {
            let mr = match d.reg_dmabuf(fd, offset, len, addr) {
                Ok(mr) => mr,
                Err(e) if std::path::Path::new("/sys/module/nvidia_peermem").exists() => {
                    tracing::info!("{e}; registering through nvidia-peermem instead");
                    d.reg(addr, len)?
                }
                Err(e) => return Err(e),
            };
            mrs.push(mr);
        }
        Ok(self.keep(mrs, addr, len))
    }

    fn dereg(&mut self, m: MemRegion) -> Result<()> {
        self.map.remove(&m.id).map(drop).ok_or_else(|| {
            Error::invalid(format!(
                "rdma: memory region {} is not registered here",
                m.id
            ))
            .transport(NAME)
        })
    }
}
