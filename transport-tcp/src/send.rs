//! The sending side of a connection: a queue of parts per stream, drained by non-blocking
//! gathered writes whenever `test` is called.
//!
//! Over several rails a message also survives losing a rail: a send completes only when the
//! peer's kernel has acknowledged every byte of it (the socket's unacknowledged count,
//! `SIOCOUTQ`), so when a rail goes down (its interface is down, or its socket fails) the
//! sender knows exactly how far each of that rail's streams got. It tells the receiver where to
//! stop reading them (a `RailDown` frame) and sends the rest of every cut part again on a
//! surviving stream (`Repair` frames); later messages are split over the survivors.
//!
//! Over several rails whose bandwidth nobody declared, each stream's delivery rate is
//! measured from the peer's acknowledgements over intervals in which the stream had bytes in
//! flight throughout (meter.rs); when the shares drift, the next striped message is split by
//! the new rates, announced by a `Weights` frame ahead of it on every stream.

use crate::frame::{
    nparts, split, weights_frame, Header, Kind, HEADER_BYTES, MAX_WEIGHTED_STREAMS,
};
use crate::meter::{shares_differ, weights_from_rates, Meter};
use crate::sock::{send_iov, tune, unacked_bytes, Io, StreamHello, HELLO_FAILOVER};
use crate::{TcpRail, TcpSettings, NAME};
use railcc_core::auth::{prove_client, Secret};
use railcc_core::bootstrap::connect_to_peer;
use railcc_core::net::{ConnIdent, MemRegion, MsgTag, NetSendComm, ReqId, WaitFd};
use railcc_core::wire::write_all_by;
use railcc_core::{Error, ErrorKind, Result};
use socket2::Socket;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// How often a sender with work outstanding looks at its rails' link state.
const LINK_CHECK: Duration = Duration::from_millis(50);

struct Part {
    seq: u64,
    header: [u8; HEADER_BYTES],
    sent_header: usize,
    data: *const u8,
    /// Offset of this part in its message, and its length.
    off: usize,
    len: usize,
    sent: usize,
    /// Stream position of the header's first byte, once writing began.
    start: u64,
    tag: MsgTag,
    total: usize,
    /// Counts toward its message's completion (control frames do not).
    counts: bool,
}

impl Part {
    fn end(&self) -> u64 {
        self.start + (HEADER_BYTES + self.len) as u64
    }
}

struct Stream {
    sock: Socket,
    rail: usize,
    alive: bool,
    weight: u32,
    /// Parts not yet fully written, in order.
    queue: VecDeque<Part>,
    /// Parts written but not yet acknowledged (failover mode only).
    sent: VecDeque<Part>,
    written: u64,
    acked: u64,
}

pub struct TcpSendComm {
    streams: Vec<Stream>,
    rails: Vec<TcpRail>,
    settings: TcpSettings,
    next_seq: u64,
    /// Parts still outstanding per in-flight sequence number, oldest first.
    pending: VecDeque<(u64, usize, usize)>,
    /// Several rails: their links are watched.
    multi: bool,
    /// Several rails and failover on: completion waits for acknowledgements.
    failover: bool,
    epoch: u32,
    last_link_check: Instant,
    broken: Option<Error>,
    /// The streams' delivery rates are measured and the split follows them.
    measure: bool,
    /// Weights measured and not yet announced: the next striped message uses them.
    reweigh: Option<Vec<u16>>,
    /// Per rail: its delivery rate, measured over all its streams together (they share
    /// its link, so what one stream gets depends on how many others are busy).
    meters: Vec<Meter>,
}

// SAFETY: the raw pointers in queued parts are only dereferenced by the thread that owns the
// comm; the isend contract makes the caller keep that memory valid until completion.
unsafe impl Send for TcpSendComm {}

impl TcpSendComm {
    /// Connects `nstreams` streams over each rail: stream s goes from local rail s mod r to the
    /// peer's rail s mod r (`addrs[i]` is the peer's listener on its rail i, `rails[i]` ours).
    pub fn connect(
        addrs: &[SocketAddr],
        rails: &[TcpRail],
        me: ConnIdent,
        secret: &Secret,
        settings: &TcpSettings,
        deadline: Instant,
    ) -> Result<TcpSendComm> {
        let r = addrs.len().min(rails.len()).max(1);
        let n = (settings.nstreams * r).clamp(1, crate::sock::MAX_STREAMS);
        let multi = r > 1;
        let failover = multi && settings.rail_failover;
        let mut streams = Vec::with_capacity(n);
        for i in 0..n {
            let addr = addrs[i % r.min(addrs.len())];
            let rail = rails.get(i % r);
            let local = rail.map(|x| x.ip);
            let mut s = connect_to_peer(local, addr, deadline).map_err(|e| {
                e.transport(NAME).op(format!(
                    "connect stream {i} on rail {}",
                    rail.map_or("default", |x| x.name.as_str())
                ))
            })?;
            prove_client(&mut s, secret, deadline).map_err(|e| e.transport(NAME))?;
            let weight = rail.map_or(1, |x| x.weight.max(1));
            let hello = StreamHello {
                who: me,
                stream: i as u16,
                nstreams: n as u16,
                weight,
                flags: if failover { HELLO_FAILOVER } else { 0 },
            };
            write_all_by(&mut s, &hello.encode(), deadline, "tcp stream hello")?;
            let sock = Socket::from(s);
            tune(&sock, settings.socket_buffer_bytes)?;
            if failover {
                // A path that stops acknowledging fails the socket instead of stalling it.
                let _ = sock.set_tcp_user_timeout(Some(settings.rail_timeout));
            }
            streams.push(Stream {
                sock,
                rail: i % r,
                alive: true,
                weight,
                queue: VecDeque::new(),
                sent: VecDeque::new(),
                written: 0,
                acked: 0,
            });
        }
        Ok(TcpSendComm {
            streams,
            rails: rails[..r.min(rails.len())].to_vec(),
            settings: settings.clone(),
            next_seq: 0,
            pending: VecDeque::new(),
            multi,
            failover,
            epoch: 0,
            last_link_check: Instant::now(),
            broken: None,
            measure: multi && settings.measure_rails && n <= MAX_WEIGHTED_STREAMS,
            reweigh: None,
            meters: (0..r).map(|_| Meter::default()).collect(),
        })
    }

    fn live(&self) -> Vec<usize> {
        (0..self.streams.len())
            .filter(|&i| self.streams[i].alive)
            .collect()
    }

    fn part_done(&mut self, seq: u64) {
        if let Some(e) = self.pending.iter_mut().find(|e| e.0 == seq) {
            e.1 -= 1;
        }
    }

    fn progress(&mut self) -> Result<()> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        if self.multi && self.last_link_check.elapsed() >= LINK_CHECK {
            self.last_link_check = Instant::now();
            for r in 0..self.rails.len() {
                let state = crate::link_state(&self.rails[r].name);
                let up = matches!(state.as_str(), "up" | "unknown" | "");
                if !up && self.streams.iter().any(|s| s.rail == r && s.alive) {
                    self.lose_rail(r, &format!("interface {} is {state}", self.rails[r].name))?;
                }
            }
        }
        let mut lost: Vec<(usize, String)> = Vec::new();
        for si in 0..self.streams.len() {
            if !self.streams[si].alive {
                continue;
            }
            match self.drive(si) {
                Ok(done) => {
                    for seq in done {
                        self.part_done(seq);
                    }
                }
                Err(e) if self.failover => lost.push((self.streams[si].rail, e.message)),
                Err(e) => {
                    let e = match e.kind {
                        ErrorKind::Io | ErrorKind::PeerClosed => {
                            Error::new(ErrorKind::PeerClosed, format!("stream {si}: {}", e.message))
                        }
                        _ => e,
                    }
                    .transport(NAME);
                    self.broken = Some(e.clone());
                    return Err(e);
                }
            }
        }
        for (r, why) in lost {
            if self.streams.iter().any(|s| s.rail == r && s.alive) {
                self.lose_rail(r, &why)?;
            }
        }
        if self.measure {
            self.measure_rates();
        }
        Ok(())
    }

    /// Samples each stream's acknowledgements; when every live stream has a rate and the
    /// shares they imply drift from the current weights, the next striped message changes.
    fn measure_rates(&mut self) {
        let now = Instant::now();
        let mut changed = false;
        for (r, meter) in self.meters.iter_mut().enumerate() {
            let on_rail = || self.streams.iter().filter(move |s| s.alive && s.rail == r);
            let written: u64 = on_rail().map(|s| s.written).sum();
            let in_flight = || on_rail().map(|s| unacked_bytes(&s.sock).ok()).sum();
            changed |= meter.sample(now, written, in_flight);
        }
        if !changed {
            return;
        }
        // A stream's rate: its rail's, shared by the rail's live streams.
        let rates: Option<Vec<f64>> = self
            .streams
            .iter()
            .map(|s| {
                let k = self
                    .streams
                    .iter()
                    .filter(|o| o.alive && o.rail == s.rail)
                    .count();
                match self.meters.get(s.rail).and_then(Meter::rate) {
                    _ if !s.alive => Some(0.0),
                    Some(r) => Some(r / k.max(1) as f64),
                    None => None,
                }
            })
            .collect();
        let Some(rates) = rates else { return };
        let new = weights_from_rates(
            &rates,
            &self.streams.iter().map(|s| s.weight).collect::<Vec<_>>(),
        );
        let live: Vec<bool> = self.streams.iter().map(|s| s.alive).collect();
        let cur: Vec<u32> = self.streams.iter().map(|s| s.weight).collect();
        if shares_differ(&cur, &new, &live) {
            tracing::debug!("tcp: measured stream rates {rates:?} B/s: weights {new:?}");
            self.reweigh = Some(new);
        }
    }

    /// Writes what stream `si` can take; returns the messages whose parts completed on it.
    fn drive(&mut self, si: usize) -> Result<Vec<u64>> {
        let failover = self.failover;
        let st = &mut self.streams[si];
        let mut done = Vec::new();
        while let Some(p) = st.queue.front_mut() {
            if p.sent_header == 0 && p.sent == 0 {
                p.start = st.written;
            }
            let hdr_left = HEADER_BYTES - p.sent_header;
            let parts = [
                (p.header[p.sent_header..].as_ptr(), hdr_left),
                // SAFETY: `sent <= len` and the isend contract keeps data..data+len valid.
                (unsafe { p.data.add(p.off + p.sent) }, p.len - p.sent),
            ];
            let sent = send_iov(&st.sock, &parts)
                .map_err(|e| crate::sock::with_peer_abort(e, &st.sock))?;
            match sent {
                Io::WouldBlock => break,
                Io::Done(mut n) => {
                    st.written += n as u64;
                    let h = n.min(hdr_left);
                    p.sent_header += h;
                    n -= h;
                    p.sent += n;
                    if p.sent_header == HEADER_BYTES && p.sent == p.len {
                        if let Some(p) = st.queue.pop_front() {
                            if failover {
                                st.sent.push_back(p);
                            } else if p.counts {
                                done.push(p.seq);
                            }
                        }
                    } else {
                        break;
                    }
                }
            }
        }
        if failover && !st.sent.is_empty() {
            // A peer that died after taking our bytes into its kernel answers with a reset;
            // nothing is written any more to surface it, so ask the socket.
            if let Ok(Some(e)) = st.sock.take_error() {
                let e = Error::io("tcp: waiting for acknowledgements", &e).transport(NAME);
                return Err(crate::sock::with_peer_abort(e, &st.sock));
            }
            let unacked = unacked_bytes(&st.sock)?;
            st.acked = st.acked.max(st.written.saturating_sub(unacked));
            while st.sent.front().is_some_and(|p| p.end() <= st.acked) {
                if let Some(p) = st.sent.pop_front() {
                    if p.counts {
                        done.push(p.seq);
                    }
                }
            }
        }
        Ok(done)
    }

    /// Rail `r` is gone: cut its streams where the peer's acknowledgements reached, send the
    /// rest on the first surviving stream, and split later messages over the survivors.
    fn lose_rail(&mut self, r: usize, why: &str) -> Result<()> {
        let name = self.rails[r].name.clone();
        if !self.failover {
            let e = Error::new(
                ErrorKind::PeerClosed,
                format!("rail {name} lost ({why}); RAILCC_RAIL_FAILOVER=0 makes that an error"),
            )
            .transport(NAME);
            self.broken = Some(e.clone());
            return Err(e);
        }
        let dead: Vec<usize> = (0..self.streams.len())
            .filter(|&i| self.streams[i].rail == r && self.streams[i].alive)
            .collect();
        for &d in &dead {
            self.streams[d].alive = false;
        }
        let live = self.live();
        let Some(&ctl) = live.first() else {
            let e = Error::new(
                ErrorKind::PeerClosed,
                format!("every rail to the peer is lost (last: {name}: {why})"),
            )
            .transport(NAME);
            self.broken = Some(e.clone());
            return Err(e);
        };
        tracing::warn!(
            "tcp: rail {name} lost ({why}); carrying on over {} stream(s)",
            live.len()
        );
        // Order on the control stream: control frames of earlier losses that were cut too,
        // then this loss's RailDown frames, then the repairs.
        let (mut old_ctl, mut downs, mut repairs, mut finished) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for &d in &dead {
            let st = &mut self.streams[d];
            if let Ok(u) = unacked_bytes(&st.sock) {
                st.acked = st.acked.max(st.written.saturating_sub(u));
            }
            let cut = st.acked;
            // One epoch per lost stream, all switching at the same message.
            self.epoch += 1;
            downs.push(control(Header {
                part: d as u16,
                nparts: 0,
                seq: self.next_seq,
                tag: MsgTag::decode(&[0; railcc_core::net::TAG_BYTES]),
                total: cut,
                off: 0,
                len: 0,
                epoch: self.epoch,
                kind: Kind::RailDown,
            }));
            let cut_parts: Vec<Part> = st.sent.drain(..).chain(st.queue.drain(..)).collect();
            for p in cut_parts {
                let begun = p.sent_header > 0 || p.sent > 0;
                if begun && p.end() <= cut {
                    // Acknowledged in full after all.
                    if p.counts {
                        finished.push(p.seq);
                    }
                    continue;
                }
                if !p.counts {
                    // Every live stream carries its own copy of a Weights frame.
                    if Header::decode(&p.header).is_ok_and(|h| h.kind == Kind::Weights) {
                        continue;
                    }
                    old_ctl.push(Part {
                        sent_header: 0,
                        sent: 0,
                        start: 0,
                        ..p
                    });
                    continue;
                }
                let body = p.start + HEADER_BYTES as u64;
                let delivered = if begun && cut > body {
                    ((cut - body) as usize).min(p.len)
                } else {
                    0
                };
                let (off, len) = (p.off + delivered, p.len - delivered);
                let h = Header {
                    part: 0,
                    nparts: 0,
                    seq: p.seq,
                    tag: p.tag,
                    total: p.total as u64,
                    off: off as u64,
                    len: len as u64,
                    epoch: self.epoch,
                    kind: Kind::Repair,
                };
                repairs.push(Part {
                    header: h.encode(),
                    sent_header: 0,
                    off,
                    len,
                    sent: 0,
                    start: 0,
                    ..p
                });
            }
        }
        for seq in finished {
            self.part_done(seq);
        }
        let frames: Vec<Part> = old_ctl.into_iter().chain(downs).chain(repairs).collect();
        // After whatever the control stream is in the middle of writing, before anything else.
        let q = &mut self.streams[ctl].queue;
        let at = usize::from(q.front().is_some_and(|p| p.sent_header > 0 || p.sent > 0));
        for (i, f) in frames.into_iter().enumerate() {
            q.insert(at + i, f);
        }
        Ok(())
    }
}

/// A frame with no payload that does not count toward any message.
fn control(h: Header) -> Part {
    Part {
        seq: h.seq,
        header: h.encode(),
        sent_header: 0,
        data: std::ptr::NonNull::<u8>::dangling().as_ptr(),
        off: 0,
        len: 0,
        sent: 0,
        start: 0,
        tag: h.tag,
        total: 0,
        counts: false,
    }
}

impl NetSendComm for TcpSendComm {
    fn reg_mr(&mut self, addr: usize, len: usize) -> Result<MemRegion> {
        Ok(MemRegion { id: 0, addr, len })
    }

    fn dereg_mr(&mut self, _mr: MemRegion) -> Result<()> {
        Ok(())
    }

    unsafe fn isend(
        &mut self,
        data: *const u8,
        len: usize,
        tag: MsgTag,
        _mr: Option<&MemRegion>,
    ) -> Result<ReqId> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let live = self.live();
        let n = nparts(len, live.len(), self.settings.stripe_min_bytes);
        if n > 1 {
            if let Some(w) = self.reweigh.take() {
                // Ahead of this message's parts on every live stream.
                let frame = weights_frame(seq, &w);
                for (st, &wi) in self.streams.iter_mut().zip(&w) {
                    st.weight = wi as u32;
                    if st.alive {
                        let mut c = control(Header::decode(&frame)?);
                        c.header = frame;
                        st.queue.push_back(c);
                    }
                }
            }
        }
        let weights: Vec<u32> = live.iter().map(|&i| self.streams[i].weight).collect();
        for (i, &si) in live.iter().enumerate().take(n) {
            let (off, plen) = split(len, &weights[..n], i);
            let h = Header {
                part: i as u16,
                nparts: n as u16,
                seq,
                tag,
                total: len as u64,
                off: off as u64,
                len: plen as u64,
                epoch: self.epoch,
                kind: Kind::Data,
            };
            self.streams[si].queue.push_back(Part {
                seq,
                header: h.encode(),
                sent_header: 0,
                data,
                off,
                len: plen,
                sent: 0,
                start: 0,
                tag,
                total: len,
                counts: true,
            });
        }
        self.pending.push_back((seq, n, len));
        // Try at once: small messages leave in this call, with no extra wake-up.
        self.progress()?;
        Ok(ReqId(seq))
    }

    fn test(&mut self, req: ReqId) -> Result<Option<usize>> {
        self.progress()?;
        let Some(pos) = self.pending.iter().position(|e| e.0 == req.0) else {
            return Err(
                Error::invalid(format!("tcp: unknown send request {}", req.0)).transport(NAME),
            );
        };
        let (_, left, len) = self.pending[pos];
        if left == 0 {
            self.pending.remove(pos);
            return Ok(Some(len));
        }
        Ok(None)
    }

    fn wait_fds(&self, out: &mut Vec<WaitFd>) {
        for s in self.streams.iter().filter(|s| s.alive) {
            if !s.queue.is_empty() {
                out.push(WaitFd {
                    fd: s.sock.as_raw_fd(),
                    write: true,
                });
            }
        }
    }

    fn state(&self) -> String {
        let dead: Vec<&str> = (0..self.rails.len())
            .filter(|&r| !self.streams.iter().any(|s| s.rail == r && s.alive))
            .map(|r| self.rails[r].name.as_str())
            .collect();
        let waiting: usize = self
            .streams
            .iter()
            .map(|s| s.queue.len() + s.sent.len())
            .sum();
        let weights: Vec<String> = self.streams.iter().map(|s| s.weight.to_string()).collect();
        format!(
            "{} part(s) unsent or unacknowledged{}{}",
            waiting,
            if dead.is_empty() {
                String::new()
            } else {
                format!("; rails lost: {}", dead.join(", "))
            },
            if self.measure {
                format!("; stream weights (measured) {}", weights.join("/"))
            } else {
                String::new()
            }
        )
    }

    /// Tells the peer why we fail, where a stream is between frames: one abort frame, written
    /// within a few milliseconds or not at all (a full or broken socket is skipped).
    fn abort(&mut self, reason: &str) {
        let frame = crate::frame::abort_frame(reason);
        for st in self.streams.iter().filter(|s| s.alive) {
            if st
                .queue
                .front()
                .is_some_and(|p| p.sent_header > 0 || p.sent > 0)
            {
                continue; // mid-frame: the peer will see the close instead
            }
            crate::sock::write_within(&st.sock, &frame, Duration::from_millis(20));
        }
    }

    fn close(self: Box<Self>) -> Result<()> {
        for s in &self.streams {
            let _ = s.sock.shutdown(std::net::Shutdown::Both);
        }
        Ok(())
    }
}
