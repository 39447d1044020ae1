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

mod recv;
mod send;
pub use recv::RdmaRecvComm;
pub use send::RdmaSendComm;

pub const DEPTH: u32 = 128;
const SLOT: usize = 64;
const MAX_WRITE: usize = 1 << 30;
const SEQ_MASK: u32 = 0x7fff_ffff;
const ERR_BIT: u32 = 0x8000_0000;
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
    fn new(mut qps: Vec<Qp>, peer: usize, control: TcpStream) -> Result<Link> {
        if qps.is_empty() {
            return Err(Error::invalid("rdma: a connection needs a queue pair").transport(NAME));
        }
        let data = qps.split_off(1);
        let qp = qps.remove(0);
        let ctrl = Ctrl::new(&qp)?;
        ctrl.post_all_recvs(&qp)?;
        let stage = Staging::new(&qp)?;
        Ok(Link {
            qp,
            data,
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
            if !c.ok {
                let what = match c.wr_id & KIND {
                    K_CTRL => "control message",
                    K_RECV | K_DATA => "receive",
                    _ => "RDMA write",
                };
                let e = Error::new(
                    ErrorKind::PeerClosed,
                    format!(
                        "{what} (work request {:#x}, queue pair {} of {}) to rank {} on {} failed: {}",
                        c.wr_id & LOW_BITS,
                        (c.wr_id & QP_BITS) >> QP_SHIFT,
                        self.nqps(),
                        self.peer,
                        self.qp.ctx.name,
                        c.status
                    ),
                );
                return Err(self.fail(e));
            }
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

/// A registration held by one request: the caller's region, or our own for this request.
enum Reg {
    Caller {
        lkey: u32,
        rkey: u32,
    },
    Own(Mr),
    /// Staging slot `slot` (lkey, rkey of the staging region).
    Staged {
        slot: usize,
        lkey: u32,
        rkey: u32,
    },
    None,
}

impl Reg {
    fn get(
        qp: &Qp,
        addr: usize,
        len: usize,
        mr: Option<&MemRegion>,
        own: &HashMap<u64, Mr>,
    ) -> Result<Reg> {
        if len == 0 {
            return Ok(Reg::None);
        }
        if let Some(m) = mr {
            if let Some(r) = own.get(&m.id) {
                if addr >= r.addr && addr + len <= r.addr + r.len {
                    return Ok(Reg::Caller {
                        lkey: r.lkey,
                        rkey: r.rkey,
                    });
                }
            }
        }
        Ok(Reg::Own(qp.ctx.reg(addr, len)?))
    }
    fn keys(&self) -> (u32, u32) {
        match self {
            Reg::Caller { lkey, rkey } => (*lkey, *rkey),
            Reg::Own(m) => (m.lkey, m.rkey),
            Reg::Staged { lkey, rkey, .. } => (*lkey, *rkey),
            Reg::None => (0, 0),
        }
    }
}

/// Regions the caller registered with `reg_mr` (kept until `dereg_mr`).
#[derive(Default)]
struct Regions {
    next: u64,
    map: HashMap<u64, Mr>,
}

impl Regions {
    fn reg(&mut self, qp: &Qp, addr: usize, len: usize) -> Result<MemRegion> {
        let mr = qp.ctx.reg(addr, len)?;
        Ok(self.keep(mr, addr, len))
    }

    fn keep(&mut self, mr: Mr, addr: usize, len: usize) -> MemRegion {
        self.next += 1;
        self.map.insert(self.next, mr);
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
        qp: &Qp,
        addr: usize,
        len: usize,
        fd: i32,
        offset: u64,
    ) -> Result<MemRegion> {
        let mr = match qp.ctx.reg_dmabuf(fd, offset, len, addr) {
            Ok(mr) => mr,
            Err(e) if std::path::Path::new("/sys/module/nvidia_peermem").exists() => {
                tracing::info!("{e}; registering through nvidia-peermem instead");
                qp.ctx.reg(addr, len)?
            }
            Err(e) => return Err(e),
        };
        Ok(self.keep(mr, addr, len))
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
