//! Registered memory of a connection: control slots, staging slots, and the registrations a
//! request holds. Each is registered on every device of the connection, so any of its queue
//! pairs (rails) can use it.

use super::*;
use crate::verbs::Ctx;
use std::sync::Arc;

/// What a control slot being sent carries: after its queue pair dies (the SEND comes back
/// flushed) it is sent again on a live one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TxUse {
    Free,
    /// The receiver's clear-to-send for message `seq`.
    Cts(u64),
    /// The sender's question about message `seq`.
    Query(u64),
    /// The receiver's answer about message `seq` (low bits, as in the immediate).
    Answer(u32),
    /// The sender's mismatch report for message `seq`.
    Report(u64),
    /// A notice of queue pairs given up.
    Closed,
}

/// Registered control slots: `DEPTH` to send from (any queue pair), then `DEPTH` per queue
/// pair to receive into (every queue pair can carry control messages).
pub(super) struct Ctrl {
    pub buf: Vec<u8>,
    mrs: Vec<Mr>,
    pub free_tx: Vec<usize>,
    pub uses: Vec<TxUse>,
}

impl Ctrl {
    pub fn new(devs: &[Arc<Ctx>], nqps: usize) -> Result<Ctrl> {
        let buf = vec![0u8; (1 + nqps) * DEPTH as usize * SLOT];
        let mrs = devs
            .iter()
            .map(|d| d.reg(buf.as_ptr() as usize, buf.len()))
            .collect::<Result<Vec<_>>>()?;
        Ok(Ctrl {
            buf,
            mrs,
            free_tx: (0..DEPTH as usize).collect(),
            uses: vec![TxUse::Free; DEPTH as usize],
        })
    }
    pub fn lkey(&self, dev: usize) -> u32 {
        self.mrs.get(dev).map_or(0, |m| m.lkey)
    }
    pub fn tx_addr(&self, i: usize) -> usize {
        self.buf.as_ptr() as usize + i * SLOT
    }
    pub fn tx_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self.buf[i * SLOT..(i + 1) * SLOT]
    }
    fn rx_at(q: usize, i: usize) -> usize {
        ((1 + q) * DEPTH as usize + i) * SLOT
    }
    /// Receive slot `i` of queue pair `q`.
    pub fn rx(&self, q: usize, i: usize) -> &[u8] {
        let o = Ctrl::rx_at(q, i);
        &self.buf[o..o + SLOT]
    }
    /// A 4-byte word of receive slot `i` of queue pair `q`, at byte `at`.
    pub fn rx_word(&self, q: usize, i: usize, at: usize) -> u32 {
        let b = self.rx(q, i);
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
    }
    /// Posts receive slot `i` on queue pair `q` (on device `dev`).
    pub fn post(&self, qp: &Qp, q: usize, dev: usize, i: usize) -> Result<()> {
        qp.post_recv(
            K_RECV | (q as u64) << QP_SHIFT | i as u64,
            self.buf.as_ptr() as usize + Ctrl::rx_at(q, i),
            SLOT as u32,
            self.lkey(dev),
        )
    }
}

/// Messages up to `eager_bytes` (at most `EAGER`) go through pre-registered staging slots, copied in and out,
/// instead of registering the caller's buffer per transfer (a registration is a system call
/// that pins pages: it costs more than copying a small message).
pub const EAGER: usize = 16 * 1024;
const STAGE_SLOTS: usize = 32;

/// Registered staging slots of `eager` bytes each (one set per direction per peer).
pub(super) struct Staging {
    buf: Vec<u8>,
    /// (lkey, rkey) on each device.
    keys: [(u32, u32); MAX_RAILS],
    _mrs: Vec<Mr>,
    pub free: Vec<usize>,
    eager: usize,
}

impl Staging {
    pub fn new(devs: &[Arc<Ctx>]) -> Result<Staging> {
        let eager = devs.first().map_or(0, |d| d.tuning.eager_bytes.min(EAGER));
        let buf = vec![0u8; (STAGE_SLOTS * eager).max(1)];
        let mrs = devs
            .iter()
            .map(|d| d.reg(buf.as_ptr() as usize, buf.len()))
            .collect::<Result<Vec<_>>>()?;
        let mut keys = [(0, 0); MAX_RAILS];
        for (k, m) in keys.iter_mut().zip(&mrs) {
            *k = (m.lkey, m.rkey);
        }
        Ok(Staging {
            buf,
            keys,
            _mrs: mrs,
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
    pub fn take_reg(&mut self, len: usize, mr: Option<&MemRegion>) -> Option<(usize, Reg)> {
        let slot = if mr.is_none() {
            self.take(len)?
        } else {
            return None;
        };
        let keys = self.keys;
        Some((self.addr(slot), Reg::Staged { slot, keys }))
    }
    fn addr(&self, slot: usize) -> usize {
        self.buf.as_ptr() as usize + slot * self.eager
    }
    pub fn slot_mut(&mut self, slot: usize) -> &mut [u8] {
        &mut self.buf[slot * self.eager..(slot + 1) * self.eager]
    }
    pub fn slot(&self, slot: usize) -> &[u8] {
        &self.buf[slot * self.eager..(slot + 1) * self.eager]
    }
}

pub(super) fn encode_tag_len(b: &mut [u8], tag: &MsgTag, len: u64) {
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

pub(super) fn decode_tag_len(b: &[u8]) -> (MsgTag, u64) {
    let mut t = [0u8; TAG_BYTES];
    t.copy_from_slice(&b[..TAG_BYTES]);
    let mut l = [0u8; 8];
    l.copy_from_slice(&b[TAG_BYTES..TAG_BYTES + 8]);
    (MsgTag::decode(&t), u64::from_le_bytes(l))
}

/// A registration held by one request: the caller's region, or our own for this request; on
/// each device of the connection (keys per device).
pub(super) enum Reg {
    Caller {
        keys: Vec<(u32, u32)>,
    },
    Own(Vec<Mr>),
    /// Staging slot `slot` ((lkey, rkey) of the staging region on each device).
    Staged {
        slot: usize,
        keys: [(u32, u32); MAX_RAILS],
    },
    None,
}

impl Reg {
    pub fn get(
        devs: &[Arc<Ctx>],
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
    pub fn keys(&self, dev: usize) -> (u32, u32) {
        match self {
            Reg::Caller { keys } => keys.get(dev).copied().unwrap_or((0, 0)),
            Reg::Own(m) => m.get(dev).map_or((0, 0), |m| (m.lkey, m.rkey)),
            Reg::Staged { keys, .. } => keys.get(dev).copied().unwrap_or((0, 0)),
            Reg::None => (0, 0),
        }
    }
}

/// Regions the caller registered with `reg_mr` (kept until `dereg_mr`), on every device.
#[derive(Default)]
pub(super) struct Regions {
    next: u64,
    pub map: HashMap<u64, Vec<Mr>>,
}

impl Regions {
    pub fn reg(&mut self, devs: &[Arc<Ctx>], addr: usize, len: usize) -> Result<MemRegion> {
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
    pub fn reg_device(
        &mut self,
        devs: &[Arc<Ctx>],
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

    pub fn dereg(&mut self, m: MemRegion) -> Result<()> {
        self.map.remove(&m.id).map(drop).ok_or_else(|| {
            Error::invalid(format!(
                "rdma: memory region {} is not registered here",
                m.id
            ))
            .transport(NAME)
        })
    }
}
