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
    let mut head = [0u8; HELLO_HEAD];
    let n = bytes.len().min(head.len());
    head[..n].copy_from_slice(&bytes[..n]);
    let _ = decode_hello_head(&head, "fuzz");
    comm::fuzz_tag_len(bytes);
}

use comm::{RdmaRecvComm, RdmaSendComm};
use device::RdmaPort;
use railcc_core::auth::{fill_random, prove_client, verify_server, Secret};
use railcc_core::bootstrap::connect_to_peer;
use railcc_core::handshake::HandshakeListener;
use railcc_core::net::{
    ConnIdent, ConnectHandle, NetListener, NetProps, NetRecvComm, NetSendComm, NetTransport,
};
use railcc_core::wire::{read_exact_by, write_all_by};
use railcc_core::{Error, ErrorKind, Result};
use std::net::{IpAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};
pub use verbs::RdmaTuning;
use verbs::{Ctx, Qp, QpInfo, QP_INFO_BYTES};

pub const NAME: &str = "rdma";
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);
/// A hello (and its reply) starts with rank, channel (0 in the reply) and the number of queue
/// pairs; each queue pair's data follows.
const HELLO_HEAD: usize = 12;

fn encode_hello(rank: u32, channel: u32, infos: &[QpInfo]) -> Vec<u8> {
    let mut b = Vec::with_capacity(HELLO_HEAD + infos.len() * QP_INFO_BYTES);
    b.extend_from_slice(&rank.to_le_bytes());
    b.extend_from_slice(&channel.to_le_bytes());
    b.extend_from_slice(&(infos.len() as u32).to_le_bytes());
    infos.iter().for_each(|i| b.extend_from_slice(&i.encode()));
    b
}

/// (rank, channel, queue pairs) from a hello's head; the count must be 1 to `MAX_QPS`.
fn decode_hello_head(b: &[u8; HELLO_HEAD], what: &str) -> Result<(u32, u32, usize)> {
    let at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let n = at(8) as usize;
    if n == 0 || n > comm::MAX_QPS {
        return Err(Error::new(
            ErrorKind::Protocol,
            format!(
                "rdma {what}: {n} queue pairs (1 to {} allowed)",
                comm::MAX_QPS
            ),
        )
        .transport(NAME));
    }
    Ok((at(0), at(4), n))
}

fn read_hello(s: &mut TcpStream, deadline: Instant, what: &str) -> Result<(u32, u32, Vec<QpInfo>)> {
    let mut head = [0u8; HELLO_HEAD];
    read_exact_by(s, &mut head, deadline, what)?;
    let (rank, channel, n) = decode_hello_head(&head, what)?;
    let mut infos = Vec::with_capacity(n);
    for _ in 0..n {
        let mut b = [0u8; QP_INFO_BYTES];
        read_exact_by(s, &mut b, deadline, what)?;
        infos.push(QpInfo::decode(&b)?);
    }
    Ok((rank, channel, infos))
}

/// `n` new queue pairs, each with its starting PSN, spread over the rails in order: queue
/// pair j on rail j * rails / n, so with both ends doing the same rail i meets rail i.
fn new_qps(ctxs: &[Arc<Ctx>], n: usize) -> Result<Vec<(Qp, u32)>> {
    (0..n)
        .map(|j| Ok((Qp::new(&ctxs[j * ctxs.len() / n], comm::DEPTH)?, psn())))
        .collect()
}

/// Connects ours to theirs, pair by pair, and hands back the queue pairs.
fn connect_all(mine: Vec<(Qp, u32)>, theirs: &[QpInfo], peer: usize) -> Result<Vec<Qp>> {
    if mine.len() != theirs.len() {
        return Err(Error::new(
            ErrorKind::Protocol,
            format!(
                "rdma: rank {peer} answered with {} queue pairs where {} were asked for",
                theirs.len(),
                mine.len()
            ),
        )
        .transport(NAME));
    }
    mine.into_iter()
        .zip(theirs)
        .map(|((qp, psn), info)| {
            qp.connect(info, psn).map_err(|e| e.peer(peer))?;
            Ok(qp)
        })
        .collect()
}

/// The port this rank should use: the active ports matching `hca`, the `local_rank`-th of them
/// (round robin), or `None` when there is none.
pub fn choose(hca: &str, local_rank: usize) -> Option<RdmaPort> {
    choose_rails(hca, local_rank, 1).into_iter().next()
}

/// The ports (rails) this rank stripes its connections over: `n` of the active ports matching
/// `hca` (0: all of them), local rank l taking ports l*n .. l*n+n-1 (round robin), so ranks
/// of a host share the ports out; at most `comm::MAX_RAILS`. Empty when there is none.
pub fn choose_rails(hca: &str, local_rank: usize, n: usize) -> Vec<RdmaPort> {
    share(&device::select(&device::list(), hca), local_rank, n)
}

/// `n` of `ports` (0: all) for local rank `local_rank`: ports l*n .. l*n+n-1, round robin;
/// at most `comm::MAX_RAILS`.
pub fn share(ports: &[RdmaPort], local_rank: usize, n: usize) -> Vec<RdmaPort> {
    if ports.is_empty() {
        return Vec::new();
    }
    let n = if n == 0 {
        ports.len()
    } else {
        n.min(ports.len())
    };
    let n = n.min(comm::MAX_RAILS);
    (0..n)
        .map(|i| ports[(local_rank * n + i) % ports.len()].clone())
        .collect()
}

pub struct RdmaTransport {
    /// One opened device per rail, in rail order.
    ctxs: Vec<Arc<Ctx>>,
    pub ports: Vec<RdmaPort>,
    ip: IpAddr,
    secret: Secret,
    rank: usize,
}

impl RdmaTransport {
    /// Opens `ports` (the rails, at least one); control sockets listen on `ip` (the bootstrap
    /// interface).
    pub fn open(
        ports: &[RdmaPort],
        ip: IpAddr,
        secret: Secret,
        rank: usize,
        tuning: RdmaTuning,
    ) -> Result<RdmaTransport> {
        if ports.is_empty() || ports.len() > comm::MAX_RAILS {
            return Err(Error::invalid(format!(
                "rdma: {} ports to open (1 to {})",
                ports.len(),
                comm::MAX_RAILS
            ))
            .transport(NAME));
        }
        let ctxs = ports
            .iter()
            .map(|p| Ctx::open(&p.device, p.port, p.gid_index, tuning))
            .collect::<Result<Vec<_>>>()?;
        Ok(RdmaTransport {
            ctxs,
            ports: ports.to_vec(),
            ip,
            secret,
            rank,
        })
    }

    fn tuning(&self) -> RdmaTuning {
        self.ctxs[0].tuning
    }

    /// Queue pairs a connection this side opens: `qps_per_conn` per rail.
    fn qps_per_conn(&self) -> usize {
        (self.ctxs.len() * self.tuning().qps_per_conn.max(1) as usize).min(comm::MAX_QPS)
    }

    /// One line for logs and bench headers: device, port, GID and rate of each rail.
    pub fn describe(&self) -> String {
        let rails: Vec<String> = self
            .ports
            .iter()
            .map(|p| {
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
            })
            .collect();
        format!(
            "{}, {} QP(s) per connection{}",
            rails.join(" + "),
            self.qps_per_conn(),
            if self.ports.len() > 1 {
                ", split by measured rates"
            } else {
                ""
            }
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
            speed_mbps: self
                .ports
                .iter()
                .map(|p| (p.rate_gbps * 1000.0) as u64)
                .sum(),
            pci_path: self.ports[0].pci_path.clone(),
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
            ctxs: self.ctxs.clone(),
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
        let mut s = connect_to_peer(None, addr, deadline).map_err(|e| e.transport(NAME))?;
        prove_client(&mut s, &self.secret, deadline).map_err(|e| e.transport(NAME))?;
        let mine = new_qps(&self.ctxs, self.qps_per_conn())?;
        let infos: Vec<QpInfo> = mine.iter().map(|(q, p)| q.info(*p)).collect();
        let hello = encode_hello(me.rank, me.channel, &infos);
        write_all_by(&mut s, &hello, deadline, "rdma hello")?;
        // The reply's second word: how many rails the receiver spread its queue pairs over.
        let (peer, peer_rails, theirs) = read_hello(&mut s, deadline, "rdma hello reply")?;
        let peer = peer as usize;
        let qps = connect_all(mine, &theirs, peer)?;
        let control = s
            .try_clone()
            .map_err(|e| Error::io("rdma: control socket", &e))?;
        let failover = self.tuning().failover;
        // Posts our receives.
        let comm = RdmaSendComm::new(qps, peer, control, failover, peer_rails.max(1) as usize)?;
        write_all_by(&mut s, &[1], deadline, "rdma ready")?;
        Ok(Box::new(comm))
    }
}

pub struct RdmaListener {
    hs: HandshakeListener<(ConnIdent, RdmaRecvComm)>,
    ctxs: Vec<Arc<Ctx>>,
    secret: Secret,
    rank: usize,
}

/// The accepting side of a connection: runs on its own short-lived thread, so a stranger who
/// connects and stalls delays nobody.
fn serve(
    mut s: TcpStream,
    ctxs: &[Arc<Ctx>],
    secret: &Secret,
    rank: usize,
) -> Result<(ConnIdent, RdmaRecvComm)> {
    s.set_nonblocking(false)
        .map_err(|e| Error::io("rdma", &e))?;
    let deadline = Instant::now() + HANDSHAKE_LIMIT;
    verify_server(&mut s, secret, deadline)?;
    let (rank_in, channel, theirs) = read_hello(&mut s, deadline, "rdma hello")?;
    let who = ConnIdent {
        rank: rank_in,
        channel,
    };
    // The connecting side chose how many queue pairs; we make as many, over our rails.
    let mine = new_qps(ctxs, theirs.len())?;
    let rails = ctxs.len().min(theirs.len());
    let infos: Vec<QpInfo> = mine.iter().map(|(q, p)| q.info(*p)).collect();
    let qps = connect_all(mine, &theirs, who.rank as usize)?;
    let control = s
        .try_clone()
        .map_err(|e| Error::io("rdma: control socket", &e))?;
    let failover = ctxs[0].tuning.failover;
    // Posts our receives.
    let comm = RdmaRecvComm::new(qps, who.rank as usize, control, failover)?;
    let reply = encode_hello(rank as u32, rails as u32, &infos);
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
        let (ctxs, secret, rank) = (self.ctxs.clone(), self.secret, self.rank);
        let shake = move |s: TcpStream| serve(s, &ctxs, &secret, rank);
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
    use super::*;

    #[test]
    fn hello_head_round_trips_and_bounds_the_queue_pair_count() {
        let info = QpInfo {
            qpn: 5,
            psn: 7,
            lid: 0,
            gid: [1; 16],
            mtu: 3,
        };
        let b = encode_hello(3, 9, &[info, info]);
        assert_eq!(b.len(), HELLO_HEAD + 2 * QP_INFO_BYTES);
        let head: [u8; HELLO_HEAD] = b[..HELLO_HEAD].try_into().unwrap();
        assert_eq!(decode_hello_head(&head, "t").unwrap(), (3, 9, 2));
        for n in [0u32, comm::MAX_QPS as u32 + 1, u32::MAX] {
            let mut h = head;
            h[8..12].copy_from_slice(&n.to_le_bytes());
            let e = decode_hello_head(&h, "t").unwrap_err().to_string();
            assert!(e.contains("queue pairs"), "{e}");
        }
    }

    #[test]
    fn messages_split_into_whole_pages_one_per_queue_pair() {
        use comm::{split, SPLIT_MIN};
        assert_eq!(split(0, 4), (1, 1));
        assert_eq!(split(SPLIT_MIN - 1, 4), (SPLIT_MIN - 1, 1));
        assert_eq!(split(1 << 20, 1), (1 << 20, 1));
        assert_eq!(split(1 << 20, 4), (1 << 18, 4));
        for len in [SPLIT_MIN, SPLIT_MIN + 1, 1_000_003, 3 << 20] {
            for n in 2..=comm::MAX_QPS {
                let (chunk, k) = split(len, n);
                assert!(k >= 1 && k <= n, "{len} {n}");
                assert_eq!(chunk % 4096, 0);
                assert!(chunk * k >= len && chunk * (k - 1) < len, "{len} {n}");
            }
        }
    }
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
