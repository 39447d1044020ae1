//! The network-transport interface, shaped after NCCL's net plugin (v8): listen, connect,
//! accept, memory registration, non-blocking isend/irecv, test, close, and device properties.
//! TCP and RDMA implement it; rails and striping sit above it.
//!
//! Connections are one-directional: a sender's [`NetSendComm`] pairs with the receiver's
//! [`NetRecvComm`]. Messages on one connection are matched in order; each carries a [`MsgTag`]
//! that the receiver checks against the tag it posted, so ranks that disagree about a call get
//! a [`ErrorKind::Mismatch`] error instead of silently reduced garbage.

use crate::call::CollKind;
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, ErrorKind, Result};
use std::os::fd::RawFd;
use std::time::Instant;

/// What a transport device offers, as NCCL's `ncclNetProperties_t`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetProps {
    pub name: String,
    /// Line rate in Mbit/s; 0 when unknown (loopback).
    pub speed_mbps: u64,
    pub pci_path: Option<String>,
    /// Whether the device can read and write GPU memory directly.
    pub gpu_direct: bool,
    pub max_comms: usize,
}

/// Opaque bytes a listener publishes and a connector uses (at most 128, like NCCL's handle).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectHandle(pub Vec<u8>);

pub const MAX_HANDLE_BYTES: usize = 128;

impl ConnectHandle {
    /// The handle of a listener reached at a socket address (TCP data, RDMA control).
    pub fn from_addr(addr: std::net::SocketAddr) -> ConnectHandle {
        ConnectHandle(addr.to_string().into_bytes())
    }

    /// The handle of listeners on several rails, in rail order.
    pub fn from_addrs(addrs: &[std::net::SocketAddr]) -> ConnectHandle {
        let s: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
        ConnectHandle(s.join(" ").into_bytes())
    }

    /// The socket addresses in a handle made by [`ConnectHandle::from_addrs`] (or `from_addr`).
    pub fn addrs(&self, transport: &'static str) -> Result<Vec<std::net::SocketAddr>> {
        let v: Option<Vec<std::net::SocketAddr>> = std::str::from_utf8(&self.0)
            .ok()
            .map(|s| s.split(' ').map(|a| a.parse().ok()).collect())
            .and_then(|v: Option<Vec<_>>| v.filter(|v| !v.is_empty()));
        v.ok_or_else(|| {
            Error::new(
                ErrorKind::Protocol,
                format!("{transport}: connect handle is not a list of socket addresses"),
            )
            .transport(transport)
        })
    }

    /// The socket address in a handle made by [`ConnectHandle::from_addr`].
    pub fn addr(&self, transport: &'static str) -> Result<std::net::SocketAddr> {
        std::str::from_utf8(&self.0)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Protocol,
                    format!("{transport}: connect handle is not a socket address"),
                )
                .transport(transport)
            })
    }
}

/// Who is connecting: sent by the connector after authentication.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnIdent {
    pub rank: u32,
    pub channel: u32,
}

/// A request id returned by isend/irecv, completed through `test`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReqId(pub u64);

/// A registered memory region. TCP needs none; RDMA keeps its keys here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemRegion {
    pub id: u64,
    pub addr: usize,
    pub len: usize,
}

/// Describes one message of one call: which call (sequence number and arguments) and which
/// message of that call between this pair of ranks. 32 bytes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsgTag {
    pub op_seq: u64,
    pub coll: u8,
    pub dtype: u8,
    pub redop: u8,
    pub root: u32,
    pub count: u64,
    pub index: u64,
}

pub const TAG_BYTES: usize = 32;

impl MsgTag {
    pub fn new(
        op_seq: u64,
        coll: CollKind,
        dtype: DataType,
        redop: Option<ReduceOp>,
        root: Option<usize>,
        count: u64,
    ) -> MsgTag {
        MsgTag {
            op_seq,
            coll: coll as u8,
            dtype: dtype as u8,
            redop: redop.map_or(0xff, |o| o as u8),
            root: root.map_or(u32::MAX, |r| r as u32),
            count,
            index: 0,
        }
    }

    pub fn with_index(mut self, index: u64) -> MsgTag {
        self.index = index;
        self
    }

    pub fn encode(&self) -> [u8; TAG_BYTES] {
        let mut b = [0u8; TAG_BYTES];
        b[0..8].copy_from_slice(&self.op_seq.to_le_bytes());
        b[8] = self.coll;
        b[9] = self.dtype;
        b[10] = self.redop;
        b[12..16].copy_from_slice(&self.root.to_le_bytes());
        b[16..24].copy_from_slice(&self.count.to_le_bytes());
        b[24..32].copy_from_slice(&self.index.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; TAG_BYTES]) -> MsgTag {
        let u64at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        MsgTag {
            op_seq: u64at(0),
            coll: b[8],
            dtype: b[9],
            redop: b[10],
            root: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
            count: u64at(16),
            index: u64at(24),
        }
    }

    fn coll_name(v: u8) -> String {
        CollKind::from_u8(v).map_or_else(|| format!("unknown({v})"), |c| c.name().to_string())
    }

    /// A mismatch error that says which argument the two ranks disagree on.
    pub fn mismatch(expected: &MsgTag, got: &MsgTag) -> Error {
        let dt = |v: u8| {
            DataType::from_u8(v).map_or_else(|| format!("unknown({v})"), |d| d.name().to_string())
        };
        let op = |v: u8| {
            ReduceOp::from_u8(v).map_or_else(|| "none".to_string(), |o| o.name().to_string())
        };
        let root = |v: u32| {
            if v == u32::MAX {
                "none".to_string()
            } else {
                v.to_string()
            }
        };
        let msg = if expected.coll != got.coll {
            format!(
                "peer called {} where this rank called {}",
                Self::coll_name(got.coll),
                Self::coll_name(expected.coll)
            )
        } else if expected.dtype != got.dtype {
            format!(
                "dtype differs: peer used {}, this rank {}",
                dt(got.dtype),
                dt(expected.dtype)
            )
        } else if expected.count != got.count {
            format!(
                "count differs: peer used {}, this rank {}",
                got.count, expected.count
            )
        } else if expected.redop != got.redop {
            format!(
                "reduction differs: peer used {}, this rank {}",
                op(got.redop),
                op(expected.redop)
            )
        } else if expected.root != got.root {
            format!(
                "root differs: peer used {}, this rank {}",
                root(got.root),
                root(expected.root)
            )
        } else if expected.op_seq != got.op_seq {
            format!(
                "call sequence differs: peer is at call #{}, this rank at #{}",
                got.op_seq, expected.op_seq
            )
        } else {
            format!(
                "message order differs: peer sent message #{}, this rank expected #{}",
                got.index, expected.index
            )
        };
        Error::new(
            ErrorKind::Mismatch,
            format!("{} {msg}", Self::coll_name(expected.coll)),
        )
    }
}

/// Interest in a file descriptor, for sleeping in poll(2) when nothing is ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitFd {
    pub fd: RawFd,
    pub write: bool,
}

/// A transport: a factory for listeners and outbound connections on its devices.
pub trait NetTransport: Send + Sync {
    fn name(&self) -> &'static str;
    fn devices(&self) -> Result<Vec<NetProps>>;
    fn listen(&self, dev: usize) -> Result<Box<dyn NetListener>>;
    /// Opens a connection to the listener that published `handle`, announcing `me`.
    fn connect(
        &self,
        dev: usize,
        handle: &ConnectHandle,
        me: ConnIdent,
        deadline: Instant,
    ) -> Result<Box<dyn NetSendComm>>;
}

pub trait NetListener: Send {
    fn handle(&self) -> ConnectHandle;
    /// Returns one inbound connection that completed before `deadline`, or `None`.
    /// Connections that fail authentication are refused and logged, never returned.
    fn accept(&mut self, deadline: Instant) -> Result<Option<(ConnIdent, Box<dyn NetRecvComm>)>>;
}

/// What a transport without GPUDirect says to a GPU-memory registration.
fn no_gpu_memory() -> crate::Error {
    crate::Error::new(
        crate::ErrorKind::Unsupported,
        "this transport cannot register GPU memory (GPUDirect RDMA needs the RDMA transport)",
    )
}

pub trait NetSendComm: Send {
    fn reg_mr(&mut self, addr: usize, len: usize) -> Result<MemRegion>;
    fn dereg_mr(&mut self, mr: MemRegion) -> Result<()>;
    /// Registers GPU memory for GPUDirect RDMA: `len` bytes at device address `addr`, exported
    /// as the dma-buf `fd` with `addr` at `offset` in it (NCCL's regMrDmaBuf). Transports that
    /// cannot move device memory refuse; so must every caller that cannot handle it.
    fn reg_mr_dmabuf(
        &mut self,
        _addr: usize,
        _len: usize,
        _fd: i32,
        _offset: u64,
    ) -> Result<MemRegion> {
        Err(no_gpu_memory())
    }
    /// Starts sending `len` bytes at `data`.
    ///
    /// # Safety
    /// `data..data+len` must stay valid and unmodified until `test` reports the request done
    /// or the comm is dropped.
    unsafe fn isend(
        &mut self,
        data: *const u8,
        len: usize,
        tag: MsgTag,
        mr: Option<&MemRegion>,
    ) -> Result<ReqId>;
    /// Makes progress; returns the byte count once `req` is complete.
    fn test(&mut self, req: ReqId) -> Result<Option<usize>>;
    /// Descriptors to sleep on while requests are pending.
    fn wait_fds(&self, out: &mut Vec<WaitFd>);
    /// Tells the peer, best effort, why this rank is giving up before it closes, so the peer's
    /// error names the first cause (say, the rank that died) instead of only "rank X left".
    fn abort(&mut self, _reason: &str) {}
    /// What the connection is waiting for, for a stall error ("" when it has nothing to say).
    fn state(&self) -> String {
        String::new()
    }
    fn close(self: Box<Self>) -> Result<()>;
}

pub trait NetRecvComm: Send {
    fn reg_mr(&mut self, addr: usize, len: usize) -> Result<MemRegion>;
    fn dereg_mr(&mut self, mr: MemRegion) -> Result<()>;
    /// As [`NetSendComm::reg_mr_dmabuf`].
    fn reg_mr_dmabuf(
        &mut self,
        _addr: usize,
        _len: usize,
        _fd: i32,
        _offset: u64,
    ) -> Result<MemRegion> {
        Err(no_gpu_memory())
    }
    /// Posts a receive of exactly `len` bytes into `data`; the message must carry `tag`.
    ///
    /// # Safety
    /// `data..data+len` must stay valid, and not be read or written by anyone else, until
    /// `test` reports the request done or the comm is dropped.
    unsafe fn irecv(
        &mut self,
        data: *mut u8,
        len: usize,
        tag: MsgTag,
        mr: Option<&MemRegion>,
    ) -> Result<ReqId>;
    fn test(&mut self, req: ReqId) -> Result<Option<usize>>;
    fn wait_fds(&self, out: &mut Vec<WaitFd>);
    /// As [`NetSendComm::abort`].
    fn abort(&mut self, _reason: &str) {}
    /// What the connection is waiting for, for a stall error ("" when it has nothing to say).
    fn state(&self) -> String {
        String::new()
    }
    fn close(self: Box<Self>) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_round_trips_and_explains() {
        let a = MsgTag::new(
            7,
            CollKind::AllReduce,
            DataType::F32,
            Some(ReduceOp::Sum),
            None,
            100,
        )
        .with_index(3);
        assert_eq!(MsgTag::decode(&a.encode()), a);
        let mut b = a;
        b.dtype = DataType::I32 as u8;
        assert!(MsgTag::mismatch(&a, &b)
            .message
            .contains("dtype differs: peer used int32, this rank float"));
        let mut c = a;
        c.count = 50;
        assert!(MsgTag::mismatch(&a, &c).message.contains("count differs"));
        let mut d = a;
        d.coll = CollKind::Broadcast as u8;
        assert!(MsgTag::mismatch(&a, &d)
            .message
            .contains("peer called broadcast"));
    }
}
