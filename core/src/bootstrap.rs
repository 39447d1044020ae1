//! Bootstrap: the unique id, rendezvous at the root, and the out-of-band ring among ranks that
//! carries all-gather and barrier during setup.
//!
//! 1. Whoever creates the [`UniqueId`] starts a [`RootServer`] at the id's address.
//! 2. Every rank binds its own bootstrap listener, connects to the root, proves the secret and
//!    reports (rank, nranks, listener address). The root checks that ranks agree and are unique,
//!    then sends everyone the address table, or an error naming the ranks that never arrived.
//! 3. Each rank connects to its ring successor and accepts its predecessor (both authenticated);
//!    [`Bootstrap::all_gather`] and [`Bootstrap::barrier`] run over that ring.
//!
//! Any connection that fails the handshake is dropped and logged; the job goes on.

use crate::auth::{prove_client, verify_server, Secret};
use crate::error::{Error, ErrorKind, Result};
use crate::wire::{
    read_exact_by, recv_frame, recv_frame_body, send_frame, write_all_by, Reader, Writer,
};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bound on one bootstrap frame: protects every rank from a hostile or broken peer.
pub const MAX_BOOT_FRAME: usize = 64 << 20;
/// A stranger gets this long to finish the handshake before it is dropped.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(5);

/// Root address plus a 128-bit secret: what ranks need to find each other, like ncclUniqueId.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UniqueId {
    pub root: SocketAddr,
    pub secret: Secret,
}

const ID_MAGIC: &[u8; 4] = b"RCID";

impl UniqueId {
    /// The 128-byte form, laid out so it fits an `ncclUniqueId`.
    pub fn to_bytes(&self) -> [u8; 128] {
        let mut b = [0u8; 128];
        b[..4].copy_from_slice(ID_MAGIC);
        b[4] = 1; // version
        let (fam, ip) = match self.root.ip() {
            IpAddr::V4(v4) => (4u8, v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => (6u8, v6.octets()),
        };
        b[5] = fam;
        b[6..8].copy_from_slice(&self.root.port().to_be_bytes());
        b[8..24].copy_from_slice(&ip);
        b[24..40].copy_from_slice(&self.secret.0);
        b
    }

    pub fn from_bytes(b: &[u8]) -> Result<UniqueId> {
        if b.len() != 128 || &b[..4] != ID_MAGIC || b[4] != 1 {
            return Err(Error::invalid(
                "not a railcc unique id (bad length, magic or version)",
            ));
        }
        let port = u16::from_be_bytes([b[6], b[7]]);
        let mut ip = [0u8; 16];
        ip.copy_from_slice(&b[8..24]);
        let v6 = Ipv6Addr::from(ip);
        let ip = match b[5] {
            4 => IpAddr::V4(
                v6.to_ipv4_mapped()
                    .ok_or_else(|| Error::invalid("unique id: bad IPv4 address"))?,
            ),
            6 => IpAddr::V6(v6),
            f => {
                return Err(Error::invalid(format!(
                    "unique id: unknown address family {f}"
                )))
            }
        };
        let mut s = [0u8; 16];
        s.copy_from_slice(&b[24..40]);
        Ok(UniqueId {
            root: SocketAddr::new(ip, port),
            secret: Secret(s),
        })
    }
}

impl std::fmt::Display for UniqueId {
    /// `railcc1:<32 hex digits of secret>@<root address>`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "railcc1:")?;
        for b in self.secret.0 {
            write!(f, "{b:02x}")?;
        }
        write!(f, "@{}", self.root)
    }
}

impl std::str::FromStr for UniqueId {
    type Err = Error;
    fn from_str(s: &str) -> Result<UniqueId> {
        let bad = || {
            Error::invalid(format!(
                "'{s}' is not a railcc unique id (railcc1:<32 hex>@host:port)"
            ))
        };
        let rest = s.trim().strip_prefix("railcc1:").ok_or_else(bad)?;
        let (hex, addr) = rest.split_once('@').ok_or_else(bad)?;
        if hex.len() != 32 || !hex.is_ascii() {
            return Err(bad());
        }
        let mut secret = [0u8; 16];
        for (i, byte) in secret.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        let root: SocketAddr = addr.parse().map_err(|_| bad())?;
        Ok(UniqueId {
            root,
            secret: Secret(secret),
        })
    }
}

/// The rendezvous server. Runs on a thread until every rank has the table, the deadline passes,
/// or it is dropped.
pub struct RootServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    pub id: UniqueId,
}

impl RootServer {
    /// Binds `bind` (port 0 picks one), makes a fresh secret, and serves in the background.
    pub fn start(bind: SocketAddr, timeout: Duration) -> Result<RootServer> {
        RootServer::start_with_secret(bind, Secret::random()?, timeout)
    }

    pub fn start_with_secret(
        bind: SocketAddr,
        secret: Secret,
        timeout: Duration,
    ) -> Result<RootServer> {
        let listener = TcpListener::bind(bind)
            .map_err(|e| Error::io(format!("bootstrap root bind {bind}"), &e))?;
        let root = listener
            .local_addr()
            .map_err(|e| Error::io("bootstrap root address", &e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("bootstrap root", &e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("railcc-root".into())
            .spawn(move || {
                if let Err(e) = serve_root(listener, secret, timeout, &stop2) {
                    tracing::warn!("bootstrap root: {e}");
                }
            })
            .map_err(|e| Error::io("spawn bootstrap root", &e))?;
        Ok(RootServer {
            stop,
            thread: Some(thread),
            id: UniqueId { root, secret },
        })
    }

    /// Waits for the root to finish serving this job.
    pub fn join(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for RootServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

const MSG_HELLO: u8 = 1;
const MSG_TABLE: u8 = 2;
const MSG_FAIL: u8 = 3;

struct Hello {
    rank: usize,
    nranks: usize,
    addr: SocketAddr,
}

fn encode_addr(w: &mut Writer, a: SocketAddr) {
    let s = a.to_string();
    w.bytes(s.as_bytes());
}

fn decode_addr(r: &mut Reader) -> Result<SocketAddr> {
    let b = r.bytes(64)?;
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Error::new(ErrorKind::Protocol, "bootstrap: bad socket address"))
}

fn decode_hello(b: &[u8]) -> Result<Hello> {
    let mut r = Reader::new(b, "bootstrap hello");
    if r.u8()? != MSG_HELLO {
        return Err(Error::new(ErrorKind::Protocol, "bootstrap: expected hello"));
    }
    let rank = r.u32()? as usize;
    let nranks = r.u32()? as usize;
    let addr = decode_addr(&mut r)?;
    r.finish()?;
    Ok(Hello { rank, nranks, addr })
}

/// Accepts, authenticates and records ranks until all are present or the deadline passes.
fn serve_root(
    listener: TcpListener,
    secret: Secret,
    timeout: Duration,
    stop: &AtomicBool,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let (tx, rx) = std::sync::mpsc::channel::<(TcpStream, Hello)>();
    let mut ranks: Vec<Option<(TcpStream, SocketAddr)>> = Vec::new();
    let mut nranks: Option<usize> = None;
    let mut present = 0usize;
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        match listener.accept() {
            Ok((s, from)) => {
                let tx = tx.clone();
                // Each handshake on its own thread: a stalling stranger cannot block the job.
                let _ = std::thread::Builder::new()
                    .name("railcc-root-conn".into())
                    .spawn(move || match admit(s, &secret) {
                        Ok((s, h)) => {
                            let _ = tx.send((s, h));
                        }
                        Err(e) => {
                            tracing::warn!("bootstrap root: refused connection from {from}: {e}")
                        }
                    });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => tracing::warn!("bootstrap root: accept failed: {e}"),
        }
        while let Ok((mut s, h)) = rx.try_recv() {
            let n = *nranks.get_or_insert(h.nranks);
            let problem = if h.nranks != n {
                Some(format!(
                    "rank {} says nranks={}, earlier ranks said {n}",
                    h.rank, h.nranks
                ))
            } else if h.rank >= n {
                Some(format!("rank {} is out of range for nranks={n}", h.rank))
            } else if ranks.get(h.rank).is_some_and(|r| r.is_some()) {
                Some(format!("rank {} arrived twice", h.rank))
            } else {
                None
            };
            if let Some(p) = problem {
                tracing::warn!("bootstrap root: {p}");
                let mut w = Writer::default();
                w.u8(MSG_FAIL).bytes(p.as_bytes());
                let _ = send_frame(
                    &mut s,
                    &w.buf,
                    Instant::now() + HANDSHAKE_LIMIT,
                    "bootstrap fail",
                );
                continue;
            }
            if ranks.len() < n {
                ranks.resize_with(n, || None);
            }
            ranks[h.rank] = Some((s, h.addr));
            present += 1;
        }
        if let Some(n) = nranks {
            if present == n {
                let mut w = Writer::default();
                w.u8(MSG_TABLE).u32(n as u32);
                for r in ranks.iter().flatten() {
                    encode_addr(&mut w, r.1);
                }
                for (i, r) in ranks.iter_mut().enumerate() {
                    if let Some((s, _)) = r {
                        if let Err(e) = send_frame(s, &w.buf, deadline, "bootstrap table") {
                            tracing::warn!("bootstrap root: rank {i}: {e}");
                        }
                    }
                }
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            let missing: Vec<String> = match nranks {
                Some(n) => (0..n)
                    .filter(|i| ranks.get(*i).is_none_or(|r| r.is_none()))
                    .map(|i| i.to_string())
                    .collect(),
                None => vec!["all".into()],
            };
            let msg = format!(
                "rank(s) {} never reached the bootstrap root within {} ms",
                missing.join(", "),
                timeout.as_millis()
            );
            let mut w = Writer::default();
            w.u8(MSG_FAIL).bytes(msg.as_bytes());
            for (s, _) in ranks.iter_mut().flatten() {
                let _ = send_frame(
                    s,
                    &w.buf,
                    Instant::now() + HANDSHAKE_LIMIT,
                    "bootstrap fail",
                );
            }
            return Err(Error::new(ErrorKind::Timeout, msg));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The root's answer: every rank's address, or the reason the job cannot start.
fn decode_table(reply: &[u8], nranks: usize) -> Result<Vec<SocketAddr>> {
    let mut r = Reader::new(reply, "bootstrap table");
    match r.u8()? {
        MSG_TABLE => {
            let n = r.u32()? as usize;
            if n != nranks {
                return Err(Error::new(
                    ErrorKind::Protocol,
                    "bootstrap table has the wrong size",
                ));
            }
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(decode_addr(&mut r)?);
            }
            r.finish()?;
            Ok(v)
        }
        MSG_FAIL => {
            let msg = String::from_utf8_lossy(r.bytes(4096)?).into_owned();
            let kind = if msg.contains("never reached") {
                ErrorKind::Timeout
            } else {
                ErrorKind::InvalidArgument
            };
            Err(Error::new(kind, msg))
        }
        t => Err(Error::new(
            ErrorKind::Protocol,
            format!("bootstrap: unexpected message {t}"),
        )),
    }
}

fn admit(mut s: TcpStream, secret: &Secret) -> Result<(TcpStream, Hello)> {
    s.set_nonblocking(false)
        .map_err(|e| Error::io("bootstrap", &e))?;
    let deadline = Instant::now() + HANDSHAKE_LIMIT;
    verify_server(&mut s, secret, deadline)?;
    let b = recv_frame(&mut s, 256, deadline, "bootstrap hello")?;
    Ok((s, decode_hello(&b)?))
}

/// A rank's view of the bootstrap network: every rank's address, and ring links for
/// all-gather and barrier.
pub struct Bootstrap {
    pub rank: usize,
    pub nranks: usize,
    pub secret: Secret,
    pub peer_addrs: Vec<SocketAddr>,
    next: Option<TcpStream>,
    prev: Option<TcpStream>,
    timeout: Duration,
    /// Why the ring failed: later calls return it (a failed ring is not used again).
    broken: Option<Error>,
}

impl Bootstrap {
    /// Joins the job: rendezvous at the root, then ring links. `local_ip` is where this rank
    /// listens (chosen by [`crate::netif`]).
    pub fn init(
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        local_ip: IpAddr,
        timeout: Duration,
    ) -> Result<Bootstrap> {
        let ctx = |e: Error| e.rank(rank).op("bootstrap").transport("tcp");
        if nranks == 0 || rank >= nranks {
            return Err(ctx(Error::invalid(format!(
                "rank {rank} out of range for nranks={nranks}"
            ))));
        }
        let deadline = Instant::now() + timeout;
        let listener = TcpListener::bind(SocketAddr::new(local_ip, 0)).map_err(|e| {
            ctx(Error::io(
                format!("bind bootstrap listener on {local_ip}"),
                &e,
            ))
        })?;
        let my_addr = listener
            .local_addr()
            .map_err(|e| ctx(Error::io("listener address", &e)))?;

        let mut root =
            connect_by(id.root, deadline).map_err(|e| ctx(e.op("bootstrap connect to root")))?;
        prove_client(&mut root, &id.secret, deadline)
            .map_err(|e| ctx(e.op("bootstrap root handshake")))?;
        let mut w = Writer::default();
        w.u8(MSG_HELLO).u32(rank as u32).u32(nranks as u32);
        encode_addr(&mut w, my_addr);
        send_frame(&mut root, &w.buf, deadline, "bootstrap hello").map_err(ctx)?;
        // The root answers once everyone is in; wait slightly past our own deadline so that
        // its report of who is missing reaches us rather than a bare timeout.
        let reply = recv_frame(
            &mut root,
            64 * nranks + 1024,
            deadline + Duration::from_secs(2),
            "bootstrap table",
        )
        .map_err(|e| match e.kind {
            ErrorKind::Timeout => Error::new(
                ErrorKind::Timeout,
                format!(
                    "the bootstrap root did not complete rendezvous within {} ms",
                    timeout.as_millis()
                ),
            ),
            _ => e,
        })
        .map_err(ctx)?;
        let peer_addrs = decode_table(&reply, nranks).map_err(ctx)?;
        let mut b = Bootstrap {
            rank,
            nranks,
            secret: id.secret,
            peer_addrs,
            next: None,
            prev: None,
            timeout,
            broken: None,
        };
        if nranks > 1 {
            b.link_ring(listener, deadline).map_err(ctx)?;
        }
        Ok(b)
    }

    fn link_ring(&mut self, listener: TcpListener, deadline: Instant) -> Result<()> {
        let next = (self.rank + 1) % self.nranks;
        let prev = (self.rank + self.nranks - 1) % self.nranks;
        let secret = self.secret;
        let me = self.rank;
        let next_addr = self.peer_addrs[next];
        // Connect forward on a helper thread while accepting from behind, so the ring forms
        // in any arrival order.
        let connector = std::thread::spawn(move || -> Result<TcpStream> {
            let mut s = connect_to_peer(None, next_addr, deadline).map_err(|e| e.peer(next))?;
            prove_client(&mut s, &secret, deadline).map_err(|e| e.peer(next))?;
            let mut w = Writer::default();
            w.u32(me as u32);
            send_frame(&mut s, &w.buf, deadline, "bootstrap ring hello")
                .map_err(|e| e.peer(next))?;
            Ok(s)
        });
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("bootstrap listener", &e))?;
        let prev_stream = loop {
            match listener.accept() {
                Ok((mut s, from)) => {
                    let r = (|| -> Result<usize> {
                        s.set_nonblocking(false)
                            .map_err(|e| Error::io("bootstrap", &e))?;
                        let d = deadline.min(Instant::now() + HANDSHAKE_LIMIT);
                        verify_server(&mut s, &secret, d)?;
                        let b = recv_frame(&mut s, 16, d, "bootstrap ring hello")?;
                        let mut r = Reader::new(&b, "bootstrap ring hello");
                        let who = r.u32()? as usize;
                        r.finish()?;
                        Ok(who)
                    })();
                    match r {
                        Ok(who) if who == prev => break s,
                        Ok(who) => tracing::warn!("rank {me}: bootstrap ring: rank {who} connected, expected {prev}; dropped"),
                        Err(e) => tracing::warn!("rank {me}: bootstrap: refused connection from {from}: {e}"),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(Error::new(
                            ErrorKind::Timeout,
                            format!("ring predecessor rank {prev} did not connect"),
                        )
                        .peer(prev));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(Error::io("bootstrap accept", &e)),
            }
        };
        let next_stream = connector
            .join()
            .map_err(|_| Error::new(ErrorKind::Io, "bootstrap connector thread panicked"))??;
        self.next = Some(next_stream);
        self.prev = Some(prev_stream);
        Ok(())
    }

    /// Every rank contributes `mine`; returns all contributions in rank order.
    pub fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let r = self.all_gather_inner(mine);
        if let Err(e) = &r {
            self.tell_next(e);
            self.broken = Some(e.clone());
        }
        r
    }

    fn all_gather_inner(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let n = self.nranks;
        let mut out: Vec<Vec<u8>> = vec![Vec::new(); n];
        out[self.rank] = mine.to_vec();
        let (Some(next), Some(prev)) = (self.next.as_mut(), self.prev.as_mut()) else {
            return Ok(out);
        };
        let deadline = Instant::now() + self.timeout;
        let me = self.rank;
        let (pn, pp) = ((me + 1) % n, (me + n - 1) % n);
        for step in 0..n - 1 {
            let send_idx = (me + n - step) % n;
            let recv_idx = (me + n - step - 1) % n;
            let payload = &out[send_idx];
            // Send on a scoped thread so large blobs cannot deadlock the ring.
            let got = std::thread::scope(|sc| {
                let h = sc.spawn(|| send_frame(next, payload, deadline, "bootstrap all-gather"));
                let r = recv_ring_frame(prev, deadline).map_err(|e| e.peer(pp));
                let s = h
                    .join()
                    .unwrap_or_else(|_| Err(Error::new(ErrorKind::Io, "sender thread panicked")))
                    .map_err(|e| e.peer(pn));
                // The previous rank's failure explains ours better than a send to a closed ring.
                match (r, s) {
                    (Err(e), _) | (Ok(_), Err(e)) => Err(e),
                    (Ok(v), Ok(())) => Ok(v),
                }
            })
            .map_err(|e| {
                e.rank(me)
                    .op(format!("bootstrap all-gather step {step}"))
                    .transport("tcp")
            })?;
            out[recv_idx] = got;
        }
        Ok(out)
    }

    /// After a failed ring step: passes the job's first failure to the next rank, which may be
    /// waiting on us, so every rank names the rank that failed first (ranks fail one after
    /// another around the ring, each in milliseconds). Best effort, briefly.
    fn tell_next(&mut self, e: &Error) {
        let text = match e.message.split_once(FIRST_FAILURE) {
            Some((_, first)) => first.to_string(),
            None => format!(
                "rank {}, peer {}: {}",
                self.rank,
                e.peer.map_or("?".into(), |p| p.to_string()),
                e.message
            ),
        };
        if let Some(next) = self.next.as_mut() {
            let mut frame = ABORT_FRAME.to_le_bytes().to_vec();
            let text = &text.as_bytes()[..text.len().min(MAX_ABORT_TEXT)];
            frame.extend_from_slice(&(text.len() as u32).to_le_bytes());
            frame.extend_from_slice(text);
            let deadline = Instant::now() + Duration::from_millis(200);
            let _ = write_all_by(next, &frame, deadline, "bootstrap abort");
        }
    }

    pub fn barrier(&mut self) -> Result<()> {
        self.all_gather(&[]).map(|_| ())
    }
}

/// A ring frame length that announces an abort: a u32 text length and the text follow.
const ABORT_FRAME: u32 = u32::MAX;
const MAX_ABORT_TEXT: usize = 1024;
const FIRST_FAILURE: &str = "first failure: ";

/// One all-gather frame from the previous rank, or its abort as an error that carries the
/// job's first failure.
fn recv_ring_frame(s: &mut TcpStream, deadline: Instant) -> Result<Vec<u8>> {
    let what = "bootstrap all-gather";
    let mut len = [0u8; 4];
    read_exact_by(s, &mut len, deadline, what)?;
    let len = u32::from_le_bytes(len);
    if len == ABORT_FRAME {
        let mut tl = [0u8; 4];
        read_exact_by(s, &mut tl, deadline, what)?;
        let tl = (u32::from_le_bytes(tl) as usize).min(MAX_ABORT_TEXT);
        let mut text = vec![0u8; tl];
        read_exact_by(s, &mut text, deadline, what)?;
        return Err(Error::new(
            ErrorKind::PeerClosed,
            format!(
                "the previous rank in the bootstrap ring failed; {FIRST_FAILURE}{}",
                String::from_utf8_lossy(&text)
            ),
        ));
    }
    recv_frame_body(s, len as usize, MAX_BOOT_FRAME, deadline, what)
}

/// Connects with retries until `deadline`: the listener may not be up yet.
pub fn connect_by(addr: SocketAddr, deadline: Instant) -> Result<TcpStream> {
    connect_from(None, addr, deadline)
}

/// As [`connect_by`], from local address `local` when given (a rail's interface).
pub fn connect_from(
    local: Option<std::net::IpAddr>,
    addr: SocketAddr,
    deadline: Instant,
) -> Result<TcpStream> {
    connect_retrying(local, addr, deadline, None)
}

/// How long a peer's port may refuse connections before the peer counts as gone.
pub const GONE_AFTER: Duration = Duration::from_millis(20);

/// Connects to a listener known to exist: a peer's, whose address the peer itself published
/// after it started listening. A refusal that lasts [`GONE_AFTER`] means the peer's process
/// has exited (the kernel closed its port), and fails at once with `PeerClosed` instead of at
/// the deadline. From `local` when given.
pub fn connect_to_peer(
    local: Option<std::net::IpAddr>,
    addr: SocketAddr,
    deadline: Instant,
) -> Result<TcpStream> {
    connect_retrying(local, addr, deadline, Some(GONE_AFTER))
}

fn connect_retrying(
    local: Option<std::net::IpAddr>,
    addr: SocketAddr,
    deadline: Instant,
    gone_after: Option<Duration>,
) -> Result<TcpStream> {
    let mut last: Option<std::io::Error> = None;
    let mut refused_since: Option<Instant> = None;
    let attempt = |left: Duration| -> std::io::Result<TcpStream> {
        let Some(ip) = local else {
            return TcpStream::connect_timeout(&addr, left);
        };
        let s = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        s.bind(&SocketAddr::new(ip, 0).into())?;
        s.connect_timeout(&addr.into(), left)?;
        Ok(s.into())
    };
    while Instant::now() < deadline {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .min(Duration::from_secs(2));
        match attempt(left.max(Duration::from_millis(1))) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => {
                if e.kind() == std::io::ErrorKind::ConnectionRefused {
                    let since = *refused_since.get_or_insert_with(Instant::now);
                    if gone_after.is_some_and(|g| since.elapsed() >= g) {
                        return Err(Error::new(
                            ErrorKind::PeerClosed,
                            format!("{addr} refuses connections: the peer's process has exited"),
                        ));
                    }
                } else {
                    refused_since = None;
                }
                last = Some(e);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    Err(Error::new(
        ErrorKind::Timeout,
        format!(
            "could not connect to {addr} before the deadline{}",
            last.map(|e| format!(" (last error: {e})"))
                .unwrap_or_default()
        ),
    ))
}

/// The wildcard address of the same family, for binding a root reachable from anywhere.
pub fn unspecified_like(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

/// Every decoder of bootstrap traffic on `bytes` (for the fuzzer: `railcc-fuzz`). Results are
/// thrown away; what matters is that nothing panics or allocates past its bound.
#[doc(hidden)]
pub fn fuzz_decoders(bytes: &[u8]) {
    let _ = decode_hello(bytes);
    let n = bytes.first().map_or(0, |&b| b as usize);
    let _ = decode_table(bytes, n);
    let _ = UniqueId::from_bytes(bytes);
    let _ = String::from_utf8_lossy(bytes).parse::<UniqueId>();
    let mut r = crate::wire::Reader::new(bytes, "fuzz");
    let _ = r.bytes(1 << 16);
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;

    proptest! {
        // Whatever a peer or a stranger sends, decoders return errors, never panic, and never
        // allocate beyond their bounds (the readers check lengths first).
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300), n in 0usize..64) {
            let _ = decode_hello(&bytes);
            let _ = decode_table(&bytes, n);
            let _ = UniqueId::from_bytes(&bytes);
            let _ = String::from_utf8_lossy(&bytes).parse::<UniqueId>();
        }

        #[test]
        fn table_round_trips(ports in proptest::collection::vec(1u16..u16::MAX, 1..20)) {
            let mut w = Writer::default();
            w.u8(MSG_TABLE).u32(ports.len() as u32);
            let addrs: Vec<SocketAddr> = ports.iter().map(|p| SocketAddr::from(([127, 0, 0, 1], *p))).collect();
            for a in &addrs {
                encode_addr(&mut w, *a);
            }
            prop_assert_eq!(decode_table(&w.buf, addrs.len()).unwrap(), addrs);
        }
    }

    #[test]
    fn unique_id_round_trips() {
        let id = UniqueId {
            root: "127.0.0.1:4242".parse().unwrap(),
            secret: Secret([7; 16]),
        };
        assert_eq!(UniqueId::from_bytes(&id.to_bytes()).unwrap(), id);
        assert_eq!(id.to_string().parse::<UniqueId>().unwrap(), id);
        let v6 = UniqueId {
            root: "[::1]:9".parse().unwrap(),
            secret: Secret([1; 16]),
        };
        assert_eq!(UniqueId::from_bytes(&v6.to_bytes()).unwrap(), v6);
        assert!("railcc1:zz@1.2.3.4:5".parse::<UniqueId>().is_err());
        assert!(UniqueId::from_bytes(&[0u8; 128]).is_err());
    }

    #[test]
    fn ranks_in_threads_all_gather() {
        let root =
            RootServer::start("127.0.0.1:0".parse().unwrap(), Duration::from_secs(10)).unwrap();
        let id = root.id;
        let n = 4;
        let hs: Vec<_> = (0..n)
            .map(|r| {
                std::thread::spawn(move || {
                    let mut b = Bootstrap::init(
                        &id,
                        r,
                        n,
                        "127.0.0.1".parse().unwrap(),
                        Duration::from_secs(10),
                    )
                    .unwrap();
                    let all = b.all_gather(&[r as u8; 3]).unwrap();
                    b.barrier().unwrap();
                    all
                })
            })
            .collect();
        for h in hs {
            let all = h.join().unwrap();
            assert_eq!(all, (0..n).map(|r| vec![r as u8; 3]).collect::<Vec<_>>());
        }
    }

    #[test]
    fn missing_rank_is_named() {
        let root =
            RootServer::start("127.0.0.1:0".parse().unwrap(), Duration::from_millis(600)).unwrap();
        let id = root.id;
        let e = Bootstrap::init(
            &id,
            0,
            2,
            "127.0.0.1".parse().unwrap(),
            Duration::from_millis(600),
        )
        .err()
        .unwrap();
        assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
        assert!(e.message.contains("rank(s) 1 never reached"), "{e}");
    }
}
