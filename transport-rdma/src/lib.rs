//! RDMA transport over ibverbs RC queue pairs: the [`railcc_core::net`] interface on an
//! InfiniBand or RoCE port (tested on Soft-RoCE).
//!
//! - [`device`]: ports from sysfs (state, link layer, rate, GID choice) and selection
//!   (`RAILCC_IB_HCA`);
//! - [`verbs`]: the verbs calls behind owner types (device context, protection domain, memory
//!   regions, CQ + RC QP, state transitions, post and poll);
//! - [`comm`]: the two ends of a connection: receiver-offered buffers (clear-to-send), RDMA
//!   WRITE with immediate, mismatches reported to both ends, dead peers seen on a control
//!   socket;
//! - this file: the transport and its listener. Connection setup runs over a TCP socket that
//!   first proves the job secret, then swaps queue-pair data (QPN, PSN, LID, GID, MTU).
//!
//! GPU memory (GPUDirect RDMA) is not handled here yet: buffers must be host memory.

pub mod comm;
pub mod device;
pub mod verbs;

/// Every decoder of RDMA connection data on `bytes` (for the fuzzer: `railcc-fuzz`): the
/// queue-pair info of the hello, and the tag and length of a message.
#[doc(hidden)]
pub fn fuzz_decoders(bytes: &[u8]) {
    let mut qp = [0u8; verbs::QP_INFO_BYTES];
    let n = bytes.len().min(qp.len());
    qp[..n].copy_from_slice(&bytes[..n]);
    let _ = verbs::QpInfo::decode(&qp);
    comm::fuzz_tag_len(bytes);
}

use comm::{RdmaRecvComm, RdmaSendComm};
use device::RdmaPort;
use railcc_core::auth::{fill_random, prove_client, verify_server, Secret};
use railcc_core::bootstrap::connect_by;
use railcc_core::handshake::HandshakeListener;
use railcc_core::net::{
    ConnIdent, ConnectHandle, NetListener, NetProps, NetRecvComm, NetSendComm, NetTransport,
};
use railcc_core::wire::{read_exact_by, write_all_by};
use railcc_core::{Error, Result};
use std::net::{IpAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};
pub use verbs::RdmaTuning;
use verbs::{Ctx, Qp, QpInfo, QP_INFO_BYTES};

pub const NAME: &str = "rdma";
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);
const HELLO_BYTES: usize = 8 + QP_INFO_BYTES;

/// The port this rank should use: the active ports matching `hca`, the `local_rank`-th of them
/// (round robin), or `None` when there is none.
pub fn choose(hca: &str, local_rank: usize) -> Option<RdmaPort> {
    let ports = device::select(&device::list(), hca);
    if ports.is_empty() {
        return None;
    }
    Some(ports[local_rank % ports.len()].clone())
}

pub struct RdmaTransport {
    ctx: Arc<Ctx>,
    pub port: RdmaPort,
    ip: IpAddr,
    secret: Secret,
    rank: usize,
}

impl RdmaTransport {
    /// Opens `port`; control sockets listen on `ip` (the bootstrap interface).
    pub fn open(
        port: &RdmaPort,
        ip: IpAddr,
        secret: Secret,
        rank: usize,
        tuning: RdmaTuning,
    ) -> Result<RdmaTransport> {
        let ctx = Ctx::open(&port.device, port.port, port.gid_index, tuning)?;
        Ok(RdmaTransport {
            ctx,
            port: port.clone(),
            ip,
            secret,
            rank,
        })
    }

    /// One line for logs and bench headers: device, port, GID and rate.
    pub fn describe(&self) -> String {
        let p = &self.port;
        format!(
            "{}:{} {} GID[{}] {}{} {} Gb/s",
            p.device,
            p.port,
            p.link_layer,
            p.gid_index,
            p.gid,
            p.netdev
                .as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default(),
            p.rate_gbps
        )
    }
}

fn psn() -> u32 {
    let mut b = [0u8; 4];
    let _ = fill_random(&mut b);
    u32::from_le_bytes(b) & 0xff_ffff
}

impl NetTransport for RdmaTransport {
    fn name(&self) -> &'static str {
        NAME
    }

    fn devices(&self) -> Result<Vec<NetProps>> {
        Ok(vec![NetProps {
            name: self.describe(),
            speed_mbps: (self.port.rate_gbps * 1000.0) as u64,
            pci_path: self.port.pci_path.clone(),
            gpu_direct: false,
            max_comms: 65536,
        }])
    }

    fn listen(&self, dev: usize) -> Result<Box<dyn NetListener>> {
        if dev != 0 {
            return Err(Error::invalid(format!("rdma: no device {dev}")).transport(NAME));
        }
        Ok(Box::new(RdmaListener {
            hs: HandshakeListener::bind(self.ip, NAME)?,
            ctx: self.ctx.clone(),
            secret: self.secret,
            rank: self.rank,
        }))
    }

    fn connect(
        &self,
        dev: usize,
        handle: &ConnectHandle,
        me: ConnIdent,
        deadline: Instant,
    ) -> Result<Box<dyn NetSendComm>> {
        if dev != 0 {
            return Err(Error::invalid(format!("rdma: no device {dev}")).transport(NAME));
        }
        let addr = handle.addr(NAME)?;
        let mut s = connect_by(addr, deadline).map_err(|e| e.transport(NAME))?;
        prove_client(&mut s, &self.secret, deadline).map_err(|e| e.transport(NAME))?;
        let qp = Qp::new(&self.ctx, comm::DEPTH)?;
        let my_psn = psn();
        let mut hello = [0u8; HELLO_BYTES];
        hello[0..4].copy_from_slice(&me.rank.to_le_bytes());
        hello[4..8].copy_from_slice(&me.channel.to_le_bytes());
        hello[8..].copy_from_slice(&qp.info(my_psn).encode());
        write_all_by(&mut s, &hello, deadline, "rdma hello")?;
        let mut reply = [0u8; HELLO_BYTES];
        read_exact_by(&mut s, &mut reply, deadline, "rdma hello reply")?;
        let peer = u32::from_le_bytes([reply[0], reply[1], reply[2], reply[3]]) as usize;
        let info = QpInfo::decode(
            reply[8..]
                .try_into()
                .map_err(|_| Error::invalid("rdma reply"))?,
        )?;
        qp.connect(&info, my_psn).map_err(|e| e.peer(peer))?;
        let control = s
            .try_clone()
            .map_err(|e| Error::io("rdma: control socket", &e))?;
        let comm = RdmaSendComm::new(qp, peer, control)?; // posts our receives
        write_all_by(&mut s, &[1], deadline, "rdma ready")?;
        Ok(Box::new(comm))
    }
}

pub struct RdmaListener {
    hs: HandshakeListener<(ConnIdent, RdmaRecvComm)>,
    ctx: Arc<Ctx>,
    secret: Secret,
    rank: usize,
}

/// The accepting side of a connection: runs on its own short-lived thread, so a stranger who
/// connects and stalls delays nobody.
fn serve(
    mut s: TcpStream,
    ctx: &Arc<Ctx>,
    secret: &Secret,
    rank: usize,
) -> Result<(ConnIdent, RdmaRecvComm)> {
    s.set_nonblocking(false)
        .map_err(|e| Error::io("rdma", &e))?;
    let deadline = Instant::now() + HANDSHAKE_LIMIT;
    verify_server(&mut s, secret, deadline)?;
    let mut hello = [0u8; HELLO_BYTES];
    read_exact_by(&mut s, &mut hello, deadline, "rdma hello")?;
    let who = ConnIdent {
        rank: u32::from_le_bytes([hello[0], hello[1], hello[2], hello[3]]),
        channel: u32::from_le_bytes([hello[4], hello[5], hello[6], hello[7]]),
    };
    let info = QpInfo::decode(
        hello[8..]
            .try_into()
            .map_err(|_| Error::invalid("rdma hello"))?,
    )?;
    let qp = Qp::new(ctx, comm::DEPTH)?;
    let my_psn = psn();
    let mine = qp.info(my_psn);
    qp.connect(&info, my_psn)
        .map_err(|e| e.peer(who.rank as usize))?;
    let control = s
        .try_clone()
        .map_err(|e| Error::io("rdma: control socket", &e))?;
    let comm = RdmaRecvComm::new(qp, who.rank as usize, control)?; // posts our receives
    let mut reply = [0u8; HELLO_BYTES];
    reply[0..4].copy_from_slice(&(rank as u32).to_le_bytes());
    reply[8..].copy_from_slice(&mine.encode());
    write_all_by(&mut s, &reply, deadline, "rdma hello reply")?;
    let mut ready = [0u8; 1];
    read_exact_by(&mut s, &mut ready, deadline, "rdma ready")?;
    Ok((who, comm))
}

impl NetListener for RdmaListener {
    fn handle(&self) -> ConnectHandle {
        ConnectHandle::from_addr(self.hs.addr())
    }

    fn accept(&mut self, deadline: Instant) -> Result<Option<(ConnIdent, Box<dyn NetRecvComm>)>> {
        let (ctx, secret, rank) = (self.ctx.clone(), self.secret, self.rank);
        let shake = move |s: TcpStream| serve(s, &ctx, &secret, rank);
        loop {
            if let Some((who, comm)) = self.hs.poll(&shake) {
                return Ok(Some((who, Box::new(comm))));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn no_device_means_none() {
        // On machines without RDMA (CI) there is nothing to choose; with a filter that
        // matches no device there is nothing either.
        assert!(super::choose("no-such-device-xyz", 0).is_none());
        match super::choose("", 0) {
            None => println!("SKIP RDMA device tests: no active RDMA port on this machine"),
            Some(p) => println!("RDMA port present: {p:?}"),
        }
    }
}
