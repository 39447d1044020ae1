//! Connections to peers, made on first use. Outbound connections are opened by the caller;
//! inbound ones are accepted by a background thread (so two ranks that connect to each other at
//! once never deadlock) and handed over by rank.

use parking_lot::{Condvar, Mutex};
use railcc_core::net::{
    ConnIdent, ConnectHandle, NetListener, NetRecvComm, NetSendComm, NetTransport,
};
use railcc_core::{Error, ErrorKind, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[derive(Default)]
struct Inbound {
    ready: Mutex<HashMap<usize, Box<dyn NetRecvComm>>>,
    arrived: Condvar,
}

pub struct Connections {
    pub rank: usize,
    pub nranks: usize,
    transport: Arc<dyn NetTransport>,
    handles: Vec<ConnectHandle>,
    pub sends: Vec<Option<Box<dyn NetSendComm>>>,
    pub recvs: Vec<Option<Box<dyn NetRecvComm>>>,
    inbound: Arc<Inbound>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl Connections {
    pub fn new(
        rank: usize,
        nranks: usize,
        transport: Arc<dyn NetTransport>,
        mut listener: Box<dyn NetListener>,
        handles: Vec<ConnectHandle>,
    ) -> Result<Connections> {
        let inbound = Arc::new(Inbound::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (inb, st) = (inbound.clone(), stop.clone());
        let acceptor = std::thread::Builder::new()
            .name(format!("railcc-accept-{rank}"))
            .spawn(move || {
                while !st.load(Ordering::Relaxed) {
                    match listener.accept(Instant::now() + Duration::from_millis(20)) {
                        Ok(Some((ConnIdent { rank: from, .. }, comm))) => {
                            let from = from as usize;
                            let mut ready = inb.ready.lock();
                            if from >= nranks || from == rank || ready.contains_key(&from) {
                                tracing::warn!("rank {rank}: dropped an unexpected connection claiming rank {from}");
                                continue;
                            }
                            ready.insert(from, comm);
                            inb.arrived.notify_all();
                        }
                        Ok(None) => {}
                        Err(e) => {
                            tracing::warn!("rank {rank}: accept: {e}");
                            std::thread::sleep(Duration::from_millis(10));
                        }
                    }
                }
            })
            .map_err(|e| Error::io("spawn accept thread", &e))?;
        Ok(Connections {
            rank,
            nranks,
            transport,
            handles,
            sends: (0..nranks).map(|_| None).collect(),
            recvs: (0..nranks).map(|_| None).collect(),
            inbound,
            stop,
            acceptor: Some(acceptor),
        })
    }

    pub fn transport_name(&self) -> &'static str {
        self.transport.name()
    }

    /// Opens the outbound connection to `peer` if it is not open yet.
    pub fn ensure_send(&mut self, peer: usize, deadline: Instant) -> Result<()> {
        if self.sends[peer].is_none() {
            let me = ConnIdent {
                rank: self.rank as u32,
                channel: 0,
            };
            let c = self
                .transport
                .connect(0, &self.handles[peer], me, deadline)
                .map_err(|e| e.peer(peer).op("connect"))?;
            self.sends[peer] = Some(c);
        }
        Ok(())
    }

    /// Waits for `peer`'s inbound connection if it has not arrived yet.
    pub fn ensure_recv(
        &mut self,
        peer: usize,
        deadline: Instant,
        abort: &AtomicBool,
    ) -> Result<()> {
        if self.recvs[peer].is_some() {
            return Ok(());
        }
        let mut ready = self.inbound.ready.lock();
        let mut probe_at = Instant::now() + PROBE_EVERY;
        loop {
            if let Some(c) = ready.remove(&peer) {
                self.recvs[peer] = Some(c);
                return Ok(());
            }
            // A peer that died before it connected leaves no socket to see closing: ask its
            // listening port now and then (without holding the lock the acceptor needs).
            if Instant::now() >= probe_at {
                probe_at = Instant::now() + PROBE_EVERY;
                if let Some(why) = parking_lot::MutexGuard::unlocked(&mut ready, || self.gone(peer))
                {
                    return Err(Error::new(ErrorKind::PeerClosed, why)
                        .peer(peer)
                        .op("accept"));
                }
                continue;
            }
            if abort.load(Ordering::Relaxed) {
                return Err(Error::new(
                    ErrorKind::Aborted,
                    "communicator aborted while waiting for a connection",
                )
                .peer(peer));
            }
            if Instant::now() >= deadline {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!("rank {peer} never connected to this rank (it is stuck, dead, or in a different call: check that every rank makes the same calls with the same root)"),
                )
                .peer(peer)
                .op("accept"));
            }
            self.inbound
                .arrived
                .wait_for(&mut ready, Duration::from_millis(10));
        }
    }

    /// Closes every connection so that peers blocked on us see the failure at once.
    pub fn close_all(&mut self) {
        self.abort_all("");
    }

    /// Closes every connection, first telling each peer `reason` where the transport can.
    pub fn abort_all(&mut self, reason: &str) {
        // Peers we never connected to, after those we did (they hear it on their streams).
        let unconnected: Vec<usize> = (0..self.nranks)
            .filter(|&p| p != self.rank && self.sends[p].is_none())
            .collect();
        for mut c in self.sends.iter_mut().filter_map(Option::take) {
            if !reason.is_empty() {
                c.abort(reason);
            }
            let _ = c.close();
        }
        for mut c in self.recvs.iter_mut().filter_map(Option::take) {
            if !reason.is_empty() {
                c.abort(reason);
            }
            let _ = c.close();
        }
        for (_, c) in self.inbound.ready.lock().drain() {
            let _ = c.close();
        }
        if !reason.is_empty() {
            self.tell_unconnected(&unconnected, reason);
        }
    }
}

impl Connections {
    /// Why `peer` is certainly gone, if it is: its listening port refuses connections (its
    /// process exited; the kernel closed the port). `None` while it is there, or unknown.
    fn gone(&self, peer: usize) -> Option<String> {
        gone(&self.handles[peer], self.transport.name(), peer)
    }

    /// A peer we never connected to may be waiting for that connection (its next step
    /// receives from us), where no abort frame can reach it: connect to each such peer and
    /// tell it `reason`, so it fails now instead of at the deadline. Best effort, within
    /// [`TELL_WITHIN`]; a peer that is gone refuses at once.
    fn tell_unconnected(&self, peers: &[usize], reason: &str) {
        let deadline = Instant::now() + TELL_WITHIN;
        let me = ConnIdent {
            rank: self.rank as u32,
            channel: 0,
        };
        // A few threads, so that a failing call returns in milliseconds even with many peers.
        let per_thread = peers.len().div_ceil(TELL_THREADS).max(1);
        let (rank, transport, handles) = (self.rank, &self.transport, &self.handles);
        std::thread::scope(|sc| {
            for chunk in peers.chunks(per_thread) {
                sc.spawn(move || {
                    for &peer in chunk {
                        // A peer that is gone needs no telling (and would refuse for a while).
                        if Instant::now() >= deadline
                            || gone(&handles[peer], transport.name(), peer).is_some()
                        {
                            continue;
                        }
                        match transport.connect(0, &handles[peer], me, deadline) {
                            Ok(mut c) => {
                                c.abort(reason);
                                let _ = c.close();
                            }
                            Err(e) => {
                                tracing::debug!("rank {rank}: telling rank {peer} why: {e}")
                            }
                        }
                    }
                });
            }
        });
    }
}

/// See [`Connections::gone`].
fn gone(handle: &ConnectHandle, transport: &'static str, peer: usize) -> Option<String> {
    let addrs = handle.addrs(transport).ok()?;
    let a = *addrs.first()?;
    match std::net::TcpStream::connect_timeout(&a, PROBE_EVERY) {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Some(format!(
            "rank {peer} is gone before it connected to this rank: its port {a} refuses connections (the process exited)"
        )),
        _ => None,
    }
}

/// How often a rank waiting for a peer's first connection checks that the peer still exists.
const PROBE_EVERY: Duration = Duration::from_millis(100);

/// Threads a failing rank uses to tell peers it never talked to why.
const TELL_THREADS: usize = 8;

/// How long a failing rank spends connecting to peers it never talked to, to tell them why.
const TELL_WITHIN: Duration = Duration::from_millis(500);

impl Drop for Connections {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.close_all();
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}
