//! Memory registered once for every transfer into or out of it, like `ncclCommRegister`.
//!
//! Without it the RDMA transport registers (pins) the caller's buffer on every transfer, which
//! costs a system call per chunk and, for large buffers, more than the transfer itself. A region
//! is registered with a connection the first time a transfer on that connection touches it
//! (connections are made on first use), and deregistered from all of them together.
//!
//! There is deliberately no implicit cache keyed by address: memory freed and reallocated at
//! the same address maps other pages, and a stale registration would move the old ones
//! (silent corruption). Regions come only from the caller, who promises they stay mapped, or
//! from the communicator's own scratch buffer.

use crate::conn::Connections;
use railcc_core::net::MemRegion;
use railcc_core::{Error, Result};

/// Names a registered region; returned by `Communicator::register`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegionId(u64);

struct Region {
    id: u64,
    addr: usize,
    len: usize,
    /// GPU memory exported as a dma-buf: (descriptor, offset of `addr` in it).
    dmabuf: Option<(i32, u64)>,
    /// The transport's registration per peer, per direction, once made.
    sends: Vec<Option<MemRegion>>,
    recvs: Vec<Option<MemRegion>>,
}

#[derive(Default)]
pub struct Regions {
    next: u64,
    list: Vec<Region>,
}

#[derive(Clone, Copy)]
pub enum Dir {
    Send,
    Recv,
}

impl Regions {
    pub fn add(&mut self, addr: usize, len: usize, nranks: usize) -> Result<RegionId> {
        self.add_with(addr, len, nranks, None)
    }

    /// A region of GPU memory exported as dma-buf `fd` (`addr` at `offset` in it): every
    /// connection registers it for GPUDirect RDMA, or the transfer fails naming why.
    pub fn add_dmabuf(
        &mut self,
        addr: usize,
        len: usize,
        nranks: usize,
        fd: i32,
        offset: u64,
    ) -> Result<RegionId> {
        self.add_with(addr, len, nranks, Some((fd, offset)))
    }

    /// Whether `len` bytes at `addr` lie inside one GPU (dma-buf) region.
    pub fn covered_by_device(&self, addr: usize, len: usize) -> bool {
        self.list
            .iter()
            .any(|r| r.dmabuf.is_some() && addr >= r.addr && addr + len <= r.addr + r.len)
    }

    fn add_with(
        &mut self,
        addr: usize,
        len: usize,
        nranks: usize,
        dmabuf: Option<(i32, u64)>,
    ) -> Result<RegionId> {
        if len == 0 || addr.checked_add(len).is_none() {
            return Err(Error::invalid(format!(
                "register: {len} bytes at {addr:#x} is not a valid region"
            )));
        }
        self.next += 1;
        self.list.push(Region {
            id: self.next,
            addr,
            len,
            dmabuf,
            sends: vec![None; nranks],
            recvs: vec![None; nranks],
        });
        Ok(RegionId(self.next))
    }

    /// Deregisters region `id` from every connection that registered it.
    pub fn remove(&mut self, id: RegionId, conns: &mut Connections) -> Result<()> {
        let i = self.list.iter().position(|r| r.id == id.0).ok_or_else(|| {
            Error::invalid(format!("deregister: region {} is not registered", id.0))
        })?;
        let r = self.list.swap_remove(i);
        let mut first = Ok(());
        for (q, m) in r.sends.into_iter().enumerate() {
            if let (Some(m), Some(c)) = (m, conns.sends[q].as_mut()) {
                first = first.and(c.dereg_mr(m).map_err(|e| e.peer(q)));
            }
        }
        for (q, m) in r.recvs.into_iter().enumerate() {
            if let (Some(m), Some(c)) = (m, conns.recvs[q].as_mut()) {
                first = first.and(c.dereg_mr(m).map_err(|e| e.peer(q)));
            }
        }
        first
    }

    /// The connections were closed: their registrations went with them.
    pub fn forget_connections(&mut self) {
        for r in &mut self.list {
            r.sends.iter_mut().for_each(|m| *m = None);
            r.recvs.iter_mut().for_each(|m| *m = None);
        }
    }

    /// The registration covering `len` bytes at `addr` on the connection to `peer`, made now
    /// if this is the first transfer there; None when no region covers them.
    pub fn lookup(
        &mut self,
        conns: &mut Connections,
        peer: usize,
        dir: Dir,
        addr: usize,
        len: usize,
    ) -> Result<Option<MemRegion>> {
        let Some(r) = self
            .list
            .iter_mut()
            .find(|r| addr >= r.addr && addr + len <= r.addr + r.len)
        else {
            return Ok(None);
        };
        let slot = match dir {
            Dir::Send => &mut r.sends[peer],
            Dir::Recv => &mut r.recvs[peer],
        };
        if slot.is_none() {
            let (a, n) = (r.addr, r.len);
            let m = match (dir, r.dmabuf) {
                (Dir::Send, None) => conns.sends[peer].as_mut().map(|c| c.reg_mr(a, n)),
                (Dir::Recv, None) => conns.recvs[peer].as_mut().map(|c| c.reg_mr(a, n)),
                (Dir::Send, Some((fd, o))) => conns.sends[peer]
                    .as_mut()
                    .map(|c| c.reg_mr_dmabuf(a, n, fd, o)),
                (Dir::Recv, Some((fd, o))) => conns.recvs[peer]
                    .as_mut()
                    .map(|c| c.reg_mr_dmabuf(a, n, fd, o)),
            };
            match m {
                Some(m) => *slot = Some(m.map_err(|e| e.peer(peer).op("register"))?),
                None => return Ok(None),
            }
        }
        Ok(slot.clone())
    }
}
