//! TCP transport: the [`railcc_core::net`] interface over real sockets.
//!
//! - A connection is `nsocks_per_peer` TCP streams per rail (one rail unless `RAILCC_RAILS`
//!   names several interfaces); a message of at least two stripes is split over them in
//!   proportion to their rails' bandwidth ([`frame::split`]), a small one goes on stream 0.
//! - Every part starts with a [`frame::Header`] that the receiver checks against what it
//!   posted: magic, sequence, tag, length and split. A bad header is an error, never an
//!   allocation (data goes straight into the caller's buffer) or a panic.
//! - Sockets are non-blocking with `TCP_NODELAY` and large buffers; progress happens in `test`.
//! - Every stream proves the job secret ([`railcc_core::auth`]) before it carries data.

pub mod frame;
mod listener;
mod meter;
mod recv;
mod send;
mod sock;

/// Every decoder of TCP transport traffic on `bytes` (for the fuzzer: `railcc-fuzz`): the
/// stream hello, the frame header, its check against a posted receive, the abort text.
#[doc(hidden)]
pub fn fuzz_decoders(bytes: &[u8]) {
    use railcc_core::net::{MsgTag, TAG_BYTES};
    let mut hello = [0u8; sock::HELLO_BYTES];
    let n = bytes.len().min(hello.len());
    hello[..n].copy_from_slice(&bytes[..n]);
    let _ = sock::StreamHello::decode(&hello);
    let mut h = [0u8; frame::HEADER_BYTES];
    let n = bytes.len().min(h.len());
    h[..n].copy_from_slice(&bytes[..n]);
    let _ = frame::abort_text(&h);
    if let Ok(hdr) = frame::Header::decode(&h) {
        let mut t = [0u8; TAG_BYTES];
        t.copy_from_slice(&h[16..48]);
        let posted = MsgTag::decode(&t);
        let weights: Vec<u32> = bytes
            .iter()
            .skip(80)
            .take(8)
            .map(|&w| u32::from(w) + 1)
            .collect();
        let weights = if weights.is_empty() { vec![1] } else { weights };
        let stream = usize::from(hdr.part) % weights.len();
        let _ = hdr.check(stream, &weights, &posted, hdr.total, 4096, 1 << 40);
    }
}

pub use listener::TcpListenerComm;
pub use recv::TcpRecvComm;
pub use send::TcpSendComm;

use railcc_core::auth::Secret;
use railcc_core::net::{
    ConnIdent, ConnectHandle, NetListener, NetProps, NetSendComm, NetTransport,
};
use railcc_core::{Config, Error, Result};
use std::net::IpAddr;
use std::time::Instant;

pub const NAME: &str = "tcp";

/// Settings the TCP transport takes from [`Config`].
#[derive(Debug, Clone)]
pub struct TcpSettings {
    pub nstreams: usize,
    pub stripe_min_bytes: usize,
    pub socket_buffer_bytes: usize,
    pub max_message_bytes: u64,
    /// Over several rails, carry on over the others when one is lost (else fail the call).
    pub rail_failover: bool,
    /// A rail whose socket leaves data unacknowledged this long is lost (TCP_USER_TIMEOUT).
    pub rail_timeout: std::time::Duration,
    /// Over several rails, split by the delivery rate each stream achieves (measured from
    /// the peer's acknowledgements) instead of the rails' declared weights.
    pub measure_rails: bool,
}

impl TcpSettings {
    pub fn from_config(c: &Config) -> TcpSettings {
        TcpSettings {
            nstreams: c.nsocks_per_peer,
            stripe_min_bytes: c.stripe_min_bytes.max(1),
            socket_buffer_bytes: c.socket_buffer_bytes,
            max_message_bytes: c.max_message_bytes,
            rail_failover: c.rail_failover != 0,
            rail_timeout: std::time::Duration::from_millis(c.rail_timeout_ms.max(1)),
            measure_rails: true,
        }
    }
}

/// One local interface a connection stripes over, and its share (bandwidth, any unit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpRail {
    pub name: String,
    pub ip: IpAddr,
    pub weight: u32,
}

/// The TCP transport over one or more local interfaces (rails). Rail i of one rank connects
/// to rail i of another.
pub struct TcpTransport {
    rails: Vec<TcpRail>,
    secret: Secret,
    settings: TcpSettings,
}

impl TcpTransport {
    pub fn new(ifname: String, ip: IpAddr, secret: Secret, settings: TcpSettings) -> TcpTransport {
        let rail = TcpRail {
            name: ifname,
            ip,
            weight: 1,
        };
        TcpTransport::with_rails(vec![rail], secret, settings)
    }

    /// Over several rails (at least one).
    pub fn with_rails(rails: Vec<TcpRail>, secret: Secret, settings: TcpSettings) -> TcpTransport {
        TcpTransport {
            rails,
            secret,
            settings,
        }
    }

    pub fn local_ip(&self) -> IpAddr {
        self.rails[0].ip
    }

    pub fn rails(&self) -> &[TcpRail] {
        &self.rails
    }
}

/// An interface's operstate (`up`, `down`, `lowerlayerdown`, ...); "" when unreadable.
pub(crate) fn link_state(ifname: &str) -> String {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/operstate"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn link_speed_mbps(ifname: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/speed"))
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .filter(|v| *v > 0)
        .map_or(0, |v| v as u64)
}

impl NetTransport for TcpTransport {
    fn name(&self) -> &'static str {
        NAME
    }

    fn devices(&self) -> Result<Vec<NetProps>> {
        Ok(self
            .rails
            .iter()
            .map(|r| NetProps {
                name: format!("{} ({})", r.name, r.ip),
                speed_mbps: link_speed_mbps(&r.name),
                pci_path: std::fs::canonicalize(format!("/sys/class/net/{}/device", r.name))
                    .ok()
                    .map(|p| p.display().to_string()),
                gpu_direct: false,
                max_comms: 65536,
            })
            .collect())
    }

    fn listen(&self, dev: usize) -> Result<Box<dyn NetListener>> {
        if dev != 0 {
            return Err(Error::invalid(format!("tcp: no device {dev}")).transport(NAME));
        }
        Ok(Box::new(TcpListenerComm::bind(
            &self.rails,
            self.secret,
            self.settings.clone(),
        )?))
    }

    fn connect(
        &self,
        dev: usize,
        handle: &ConnectHandle,
        me: ConnIdent,
        deadline: Instant,
    ) -> Result<Box<dyn NetSendComm>> {
        if dev != 0 {
            return Err(Error::invalid(format!("tcp: no device {dev}")).transport(NAME));
        }
        let addrs = handle.addrs(NAME)?;
        Ok(Box::new(TcpSendComm::connect(
            &addrs,
            &self.rails,
            me,
            &self.secret,
            &self.settings,
            deadline,
        )?))
    }
}
