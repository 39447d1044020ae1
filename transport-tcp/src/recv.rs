//! The receiving side of a connection. Each stream reads a header, checks it against the
//! receive posted for its sequence number, then reads the part straight into the caller's
//! buffer. Nothing is allocated from what a peer announces.
//!
//! A message completes when all its bytes have arrived, whichever streams carried them: after
//! a lost rail (see `send.rs`) a `RailDown` frame says where to stop reading the lost stream,
//! `Repair` frames bring the rest of its cut parts, and later messages are split over the
//! streams still alive (each loss is an epoch; a part names the epoch it was split in).

use crate::frame::{nparts, Header, Kind, HEADER_BYTES};
use crate::sock::{recv_iov, recv_raw, Io};
use crate::{TcpSettings, NAME};
use railcc_core::net::{MemRegion, MsgTag, NetRecvComm, ReqId, WaitFd};
use railcc_core::{Error, ErrorKind, Result};
use socket2::Socket;
use std::collections::VecDeque;
use std::os::fd::AsRawFd;

struct Posted {
    seq: u64,
    data: *mut u8,
    len: usize,
    tag: MsgTag,
    /// Payload bytes and part headers arrived so far.
    bytes: usize,
    headers: usize,
    taken: bool,
}

impl Posted {
    fn complete(&self) -> bool {
        self.bytes == self.len && self.headers > 0
    }
}

/// A part being read on one stream: which message, where it goes, how much has arrived.
struct Cur {
    seq: u64,
    off: usize,
    len: usize,
    got: usize,
    /// A repair of bytes this side already delivered: read and dropped.
    discard: bool,
}

/// Where a part started on its stream (for a lost stream's cut; see `rail_down`).
struct Logged {
    start: u64,
    seq: u64,
    len: usize,
}

/// Parts remembered per stream in failover mode; a cut further back than this is an error.
const LOG_PARTS: usize = 1 << 16;
/// How often a receiver over several rails looks at their link state.
const LINK_CHECK: std::time::Duration = std::time::Duration::from_millis(50);

struct Stream {
    sock: Socket,
    header: [u8; HEADER_BYTES],
    header_got: usize,
    /// Bytes of payload read speculatively together with the header (fast path).
    early: usize,
    cur: Option<Cur>,
    last_seq: Option<u64>,
    /// The parts read lately (failover mode), oldest first.
    log: VecDeque<Logged>,
    /// Bytes consumed from the socket; a lost stream is read up to `cut` and no further.
    pos: u64,
    cut: Option<u64>,
    alive: bool,
    eof: bool,
}

impl Stream {
    fn finished(&self) -> bool {
        self.eof || self.cut.is_some_and(|c| self.pos >= c)
    }
    /// How many more bytes may be read (all, for a live stream).
    fn room(&self, want: usize) -> usize {
        match self.cut {
            Some(c) => want.min(c.saturating_sub(self.pos) as usize),
            None => want,
        }
    }
}

pub struct TcpRecvComm {
    streams: Vec<Stream>,
    /// Each stream's share of a striped message, as the sender declared it.
    weights: Vec<u32>,
    /// The sender's later weights: (first message they split, per-stream weights), in order.
    reweights: Vec<(u64, Vec<u32>)>,
    /// The sender may lose rails (it said so in its hellos): no speculative reads.
    failover: bool,
    /// The local interface each stream arrived on; several: their links are watched.
    rails: Vec<String>,
    last_link_check: std::time::Instant,
    settings: TcpSettings,
    posted: VecDeque<Posted>,
    next_seq: u64,
    /// Per epoch: the first message split in it and the streams it splits over.
    epochs: Vec<(u64, Vec<usize>)>,
    /// Messages already handed back whose repairs only repeat what arrived: dropped.
    redundant: std::collections::HashSet<u64>,
    sink: Vec<u8>,
    broken: Option<Error>,
}

// SAFETY: raw pointers to posted buffers are only used by the owning thread; the irecv
// contract keeps that memory valid until completion.
unsafe impl Send for TcpRecvComm {}

fn proto(m: String) -> Error {
    Error::new(ErrorKind::Protocol, m)
}

impl TcpRecvComm {
    pub(crate) fn new(
        socks: Vec<Socket>,
        weights: Vec<u32>,
        rails: Vec<String>,
        failover: bool,
        settings: TcpSettings,
    ) -> TcpRecvComm {
        let n = socks.len();
        let streams = socks
            .into_iter()
            .map(|sock| Stream {
                sock,
                header: [0; HEADER_BYTES],
                header_got: 0,
                early: 0,
                cur: None,
                last_seq: None,
                log: VecDeque::new(),
                pos: 0,
                cut: None,
                alive: true,
                eof: false,
            })
            .collect();
        TcpRecvComm {
            streams,
            weights,
            reweights: Vec::new(),
            failover,
            rails,
            last_link_check: std::time::Instant::now(),
            settings,
            posted: VecDeque::new(),
            next_seq: 0,
            epochs: vec![(0, (0..n).collect())],
            redundant: std::collections::HashSet::new(),
            sink: Vec::new(),
            broken: None,
        }
    }

    fn slot(&mut self, seq: u64) -> Option<&mut Posted> {
        let base = self.posted.front()?.seq;
        let i = usize::try_from(seq.checked_sub(base)?).ok()?;
        self.posted.get_mut(i)
    }

    /// The epoch message `seq` was split in, as far as this side knows.
    fn epoch_of(&self, seq: u64) -> usize {
        self.epochs.iter().rposition(|e| e.0 <= seq).unwrap_or(0)
    }

    fn progress(&mut self) -> Result<()> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let waiting = self.posted.iter().any(|p| !p.complete());
        let cutting = self
            .streams
            .iter()
            .any(|s| s.cut.is_some() && !s.finished());
        if !waiting && !cutting {
            return Ok(());
        }
        if let Err(e) = self.check_links() {
            let e = e.transport(NAME);
            self.broken = Some(e.clone());
            return Err(e);
        }
        for si in 0..self.streams.len() {
            if let Err(e) = self.progress_stream(si) {
                let e = e.transport(NAME);
                self.broken = Some(e.clone());
                return Err(e);
            }
        }
        if let Err(e) = self.check_closed() {
            let e = e.transport(NAME);
            self.broken = Some(e.clone());
            return Err(e);
        }
        Ok(())
    }

    /// Over several rails without failover, a rail whose interface goes down fails the
    /// receive at once, naming it (with failover the sender moves the data and says so).
    fn check_links(&mut self) -> Result<()> {
        let multi = self.rails.iter().any(|r| *r != self.rails[0]);
        if self.failover || !multi || self.last_link_check.elapsed() < LINK_CHECK {
            return Ok(());
        }
        self.last_link_check = std::time::Instant::now();
        let mut seen: Vec<&String> = Vec::new();
        for r in &self.rails {
            if seen.contains(&r) {
                continue;
            }
            seen.push(r);
            let state = crate::link_state(r);
            if !matches!(state.as_str(), "up" | "unknown" | "") {
                return Err(Error::new(
                    ErrorKind::PeerClosed,
                    format!("rail {r} lost (interface {r} is {state}); RAILCC_RAIL_FAILOVER=0 makes that an error"),
                ));
            }
        }
        Ok(())
    }

    /// A closed stream is an error only when what it owed can no longer come.
    fn check_closed(&self) -> Result<()> {
        for (si, s) in self.streams.iter().enumerate() {
            if s.eof && s.cut.is_some_and(|c| s.pos < c) {
                return Err(Error::new(
                    ErrorKind::PeerClosed,
                    format!("stream {si} closed before the bytes the peer said it delivered"),
                ));
            }
            if s.eof && s.alive && (s.cur.is_some() || s.header_got > 0) {
                return Err(Error::new(
                    ErrorKind::PeerClosed,
                    format!("peer closed stream {si} in the middle of a message"),
                ));
            }
        }
        let open = self.streams.iter().any(|s| s.alive && !s.eof);
        if !open && self.posted.iter().any(|p| !p.complete()) {
            return Err(Error::new(
                ErrorKind::PeerClosed,
                "peer closed the connection with a receive outstanding",
            ));
        }
        Ok(())
    }

    fn progress_stream(&mut self, si: usize) -> Result<()> {
        loop {
            if self.streams[si].finished() {
                return Ok(());
            }
            if self.streams[si].cur.is_none() && !self.read_header(si)? {
                return Ok(());
            }
            if !self.read_payload(si)? {
                return Ok(());
            }
        }
    }

    /// Reads and applies the next header on stream `si`; false when it cannot go on now.
    fn read_header(&mut self, si: usize) -> Result<bool> {
        // Fast path: stream 0 carries part 0 of every message in order, so when the next
        // message is posted and fits one part, read header and payload in one call.
        let want = self.streams[0].last_seq.map_or(0, |s| s + 1);
        let spec = if !self.failover && si == 0 && self.streams[0].header_got == 0 {
            let (n, stripe) = (self.streams.len(), self.settings.stripe_min_bytes);
            self.slot(want)
                .filter(|p| !p.complete() && nparts(p.len, n, stripe) == 1)
                .map(|p| (p.data, p.len))
        } else {
            None
        };
        let st = &mut self.streams[si];
        if st.header_got < HEADER_BYTES {
            let got = st.header_got;
            let room = st.room(HEADER_BYTES - got);
            // SAFETY: the header array is ours; `spec` points to a posted buffer of `len`
            // bytes that the irecv contract keeps valid.
            let r = unsafe {
                match spec {
                    Some(d) => recv_iov(&st.sock, (st.header.as_mut_ptr(), HEADER_BYTES), d)?,
                    None => recv_raw(&st.sock, st.header.as_mut_ptr().add(got), room)?,
                }
            };
            match r {
                Io::WouldBlock => return Ok(false),
                Io::Done(0) => {
                    st.eof = true;
                    return Ok(false);
                }
                Io::Done(n) => {
                    st.pos += n as u64;
                    let h = n.min(HEADER_BYTES - got);
                    st.header_got += h;
                    st.early = n - h;
                }
            }
            if st.header_got < HEADER_BYTES {
                return Ok(false);
            }
        }
        let h = Header::decode(&st.header)
            .map_err(|e| Error::new(e.kind, format!("stream {si}: {}", e.message)))?;
        let early = st.early;
        match h.kind {
            Kind::Weights => {
                let w = crate::frame::weights_of(&self.streams[si].header, &h, self.streams.len())
                    .map_err(|e| proto(format!("stream {si}: {}", e.message)))?;
                self.reweigh(si, h.seq, w)?;
                if early > 0 {
                    self.rewind(si, want, early)?;
                    return Ok(true);
                }
            }
            Kind::Abort => {
                let text = crate::frame::abort_text(&self.streams[si].header);
                return Err(Error::new(
                    ErrorKind::PeerClosed,
                    format!(
                        "stream {si}: the peer failed and closed; {}{text}",
                        crate::frame::FIRST_FAILURE
                    ),
                )
                .transport(NAME));
            }
            Kind::RailDown => self.rail_down(si, &h)?,
            Kind::Repair => {
                if h.epoch as usize >= self.epochs.len() {
                    return Err(proto(format!(
                        "stream {si}: repair of epoch {} before its rail-down",
                        h.epoch
                    )));
                }
                if !self.accept(si, &h, 0)? {
                    return Ok(false);
                }
            }
            Kind::Data => {
                if h.epoch as usize >= self.epochs.len() {
                    return Ok(false); // Split after a loss we have not read about yet.
                }
                let st = &self.streams[si];
                if st.last_seq.is_some_and(|l| h.seq <= l) {
                    return Err(proto(format!(
                        "stream {si}: sequence {} after {:?}",
                        h.seq, st.last_seq
                    )));
                }
                if early > 0 && h.seq != want {
                    return Err(proto(format!(
                        "stream 0: sequence {} where {want} was due",
                        h.seq
                    )));
                }
                if h.epoch as usize != self.epoch_of(h.seq) {
                    return Err(proto(format!(
                        "stream {si}: message {} split in epoch {}, expected {}",
                        h.seq,
                        h.epoch,
                        self.epoch_of(h.seq)
                    )));
                }
                if !self.accept(si, &h, early)? {
                    return Ok(false);
                }
                self.streams[si].last_seq = Some(h.seq);
            }
        }
        let st = &mut self.streams[si];
        st.header_got = 0;
        st.early = 0;
        Ok(true)
    }

    /// Checks a data or repair header against its posted receive and starts reading the part;
    /// false when the receive is not posted yet (the header is kept until it is).
    fn accept(&mut self, si: usize, h: &Header, early: usize) -> Result<bool> {
        let (stripe, maxm) = (
            self.settings.stripe_min_bytes,
            self.settings.max_message_bytes,
        );
        let live = self.epochs[h.epoch as usize].1.clone();
        let next_seq = self.next_seq;
        let taken = self.slot(h.seq).is_none_or(|p| p.taken);
        if h.kind == Kind::Repair && h.seq < next_seq && taken {
            if !self.redundant.contains(&h.seq) {
                return Err(proto(format!(
                    "stream {si}: repair of finished message {}",
                    h.seq
                )));
            }
            if early > 0 {
                return Err(proto("payload read ahead into a repair".into()));
            }
            self.streams[si].cur = Some(Cur {
                seq: h.seq,
                off: 0,
                len: h.len as usize,
                got: 0,
                discard: true,
            });
            return Ok(true);
        }
        let Some(p) = self.slot(h.seq) else {
            if h.seq < next_seq {
                return Err(proto(format!("stream {si}: stale sequence {}", h.seq)));
            }
            if early > 0 {
                return Err(proto("payload arrived for a receive not yet posted".into()));
            }
            return Ok(false);
        };
        if p.taken || p.complete() && h.len > 0 {
            return Err(proto(format!("stream {si}: part for a finished receive")));
        }
        let (tag, len) = (p.tag, p.len as u64);
        match h.kind {
            Kind::Data => {
                let li = live.iter().position(|&s| s == si).ok_or_else(|| {
                    proto(format!(
                        "stream {si}: a part on a stream lost before its split"
                    ))
                })?;
                let all = self.weights_for(h.seq);
                let w: Vec<u32> = live.iter().map(|&s| all[s]).collect();
                h.check(li, &w, &tag, len, stripe, maxm)?;
            }
            Kind::Abort => return Err(proto(format!("stream {si}: abort frame as a part"))),
            _ => {
                if h.tag != tag {
                    return Err(MsgTag::mismatch(&tag, &h.tag));
                }
                if h.total != len || h.off.checked_add(h.len).is_none_or(|e| e > len) {
                    return Err(proto(format!(
                        "stream {si}: repair {}+{} outside a {len}-byte message",
                        h.off, h.len
                    )));
                }
            }
        }
        let Some(p) = self.slot(h.seq) else {
            return Ok(false);
        };
        p.headers += 1;
        if p.bytes + early > p.len {
            return Err(proto(format!(
                "stream {si}: more bytes than the message holds"
            )));
        }
        p.bytes += early;
        let st = &mut self.streams[si];
        if self.failover {
            if st.log.len() >= LOG_PARTS {
                st.log.pop_front();
            }
            st.log.push_back(Logged {
                start: st.pos - (early + HEADER_BYTES) as u64,
                seq: h.seq,
                len: h.len as usize,
            });
        }
        st.cur = Some(Cur {
            seq: h.seq,
            off: h.off as usize,
            len: h.len as usize,
            got: early,
            discard: false,
        });
        Ok(true)
    }

    /// The weights message `seq` is split with.
    fn weights_for(&self, seq: u64) -> &[u32] {
        self.reweights
            .iter()
            .rev()
            .find(|(from, _)| *from <= seq)
            .map_or(&self.weights, |(_, w)| w)
    }

    /// A `Weights` frame on stream `si`: messages from `from` on split with `w`. Every stream
    /// carries the same frame (streams may deliver them in any order between each other);
    /// the first one read counts, the others must agree.
    fn reweigh(&mut self, si: usize, from: u64, w: Vec<u32>) -> Result<()> {
        match self.reweights.binary_search_by_key(&from, |e| e.0) {
            Ok(i) if self.reweights[i].1 != w => {
                return Err(proto(format!(
                    "stream {si}: weights {w:?} from message {from} differ from {:?} on another stream",
                    self.reweights[i].1
                )));
            }
            Ok(_) => {}
            Err(i) => self.reweights.insert(i, (from, w)),
        }
        // Messages before the oldest one still open are never checked again.
        let open = self.posted.front().map_or(self.next_seq, |p| p.seq);
        while self.reweights.len() > 1 && self.reweights[1].0 <= open {
            self.reweights.remove(0);
        }
        Ok(())
    }

    /// The fast path read a frame's header and then the next frame into the posted buffer of
    /// message `want`: put the next frame's header back where headers are read, and the
    /// start of its payload (part 0, at offset 0) where it belongs.
    fn rewind(&mut self, si: usize, want: u64, early: usize) -> Result<()> {
        let Some(data) = self.slot(want).map(|p| p.data) else {
            return Err(proto(format!(
                "stream {si}: bytes read ahead with no receive posted"
            )));
        };
        let st = &mut self.streams[si];
        let k = early.min(HEADER_BYTES);
        // SAFETY: the fast path read `early` bytes into `data`, a posted buffer of at least
        // that many bytes that the irecv contract keeps valid; the header array holds 80.
        unsafe {
            std::ptr::copy_nonoverlapping(data, st.header.as_mut_ptr(), k);
            if early > k {
                std::ptr::copy(data.add(k), data, early - k);
            }
        }
        st.header_got = k;
        st.early = early - k;
        Ok(())
    }

    /// Applies a rail-down frame: stop reading stream `part` at byte `total`; messages from
    /// `seq` on are split over the streams still alive.
    fn rail_down(&mut self, si: usize, h: &Header) -> Result<()> {
        let d = h.part as usize;
        let bad = |why: &str| Err(proto(format!("stream {si}: bad rail-down frame: {why}")));
        if h.epoch as usize != self.epochs.len() {
            return bad("out of order");
        }
        if d >= self.streams.len() || !self.streams[d].alive || d == si {
            return bad("names no live stream");
        }
        if h.seq < self.epochs.last().map_or(0, |e| e.0) {
            return bad("switch point goes back");
        }
        let cut = h.total;
        if cut < self.streams[d].pos {
            self.unread(d, cut)?;
        }
        let st = &mut self.streams[d];
        st.alive = false;
        if cut <= st.pos {
            // Nothing more to read here; a part half read is repaired in full from `cut`.
            st.cut = Some(st.pos);
            st.cur = None;
            st.header_got = 0;
        } else {
            st.cut = Some(cut);
        }
        let live: Vec<usize> = (0..self.streams.len())
            .filter(|&i| self.streams[i].alive)
            .collect();
        tracing::warn!(
            "tcp: peer lost the rail of stream {d}; receiving over {} stream(s)",
            live.len()
        );
        self.epochs.push((h.seq, live));
        Ok(())
    }

    /// The sender's cut of lost stream `d` lies before what this side read (its
    /// acknowledgements were lost with the rail): it will repair bytes from `cut` on, so what
    /// was read past `cut` is taken back from the messages' counts, or, for messages already
    /// handed back, their repairs are marked to be dropped.
    fn unread(&mut self, d: usize, cut: u64) -> Result<()> {
        let pos = self.streams[d].pos;
        let log: Vec<(u64, u64, usize)> = self.streams[d]
            .log
            .iter()
            .filter(|l| l.start + (HEADER_BYTES + l.len) as u64 > cut)
            .map(|l| (l.start, l.seq, l.len))
            .collect();
        if self.streams[d].log.front().is_none_or(|l| l.start > cut) && pos > cut {
            return Err(proto(format!(
                "stream {d}: the peer cut it at byte {cut}, before the parts this side remembers"
            )));
        }
        for (start, seq, len) in log {
            let body = start + HEADER_BYTES as u64;
            let read_end = pos.min(body + len as u64);
            let again = read_end.saturating_sub(cut.max(body)) as usize;
            let header_again = body > cut;
            match self.slot(seq) {
                Some(p) if !p.taken => {
                    p.bytes -= again.min(p.bytes);
                    if header_again {
                        p.headers = p.headers.saturating_sub(1);
                    }
                }
                _ => {
                    self.redundant.insert(seq);
                }
            }
        }
        Ok(())
    }

    /// Reads the current part's payload; false when it cannot go on now.
    fn read_payload(&mut self, si: usize) -> Result<bool> {
        let Some(cur) = self.streams[si].cur.as_ref() else {
            return Ok(true);
        };
        let (seq, off, len, got) = (cur.seq, cur.off, cur.len, cur.got);
        if cur.discard {
            return self.drop_payload(si, len - got);
        }
        let data = match self.slot(seq) {
            Some(p) => p.data,
            None => return Err(proto("part for a finished receive".into())),
        };
        if got < len {
            let st = &mut self.streams[si];
            let room = st.room(len - got);
            if room == 0 {
                return Ok(false); // Cut here: the rest comes as a repair.
            }
            // SAFETY: off+len <= posted len (checked on accept); memory valid per irecv.
            match unsafe { recv_raw(&st.sock, data.add(off + got), room)? } {
                Io::WouldBlock => return Ok(false),
                Io::Done(0) => {
                    st.eof = true;
                    return Ok(false);
                }
                Io::Done(n) => {
                    st.pos += n as u64;
                    if let Some(c) = st.cur.as_mut() {
                        c.got += n;
                    }
                    if let Some(p) = self.slot(seq) {
                        p.bytes += n;
                    }
                    return Ok(true);
                }
            }
        }
        self.streams[si].cur = None;
        Ok(true)
    }
}

impl TcpRecvComm {
    /// Reads up to `left` bytes of a redundant repair into the sink and drops them.
    fn drop_payload(&mut self, si: usize, left: usize) -> Result<bool> {
        if left == 0 {
            self.streams[si].cur = None;
            return Ok(true);
        }
        if self.sink.is_empty() {
            self.sink = vec![0u8; 64 * 1024];
        }
        let n = left.min(self.sink.len());
        let st = &mut self.streams[si];
        // SAFETY: the sink is ours and holds at least `n` bytes.
        match unsafe { recv_raw(&st.sock, self.sink.as_mut_ptr(), n)? } {
            Io::WouldBlock => Ok(false),
            Io::Done(0) => {
                st.eof = true;
                Ok(false)
            }
            Io::Done(k) => {
                st.pos += k as u64;
                if let Some(c) = st.cur.as_mut() {
                    c.got += k;
                }
                Ok(true)
            }
        }
    }
}

impl NetRecvComm for TcpRecvComm {
    fn reg_mr(&mut self, addr: usize, len: usize) -> Result<MemRegion> {
        Ok(MemRegion { id: 0, addr, len })
    }

    fn dereg_mr(&mut self, _mr: MemRegion) -> Result<()> {
        Ok(())
    }

    unsafe fn irecv(
        &mut self,
        data: *mut u8,
        len: usize,
        tag: MsgTag,
        _mr: Option<&MemRegion>,
    ) -> Result<ReqId> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.posted.push_back(Posted {
            seq,
            data,
            len,
            tag,
            bytes: 0,
            headers: 0,
            taken: false,
        });
        self.progress()?;
        Ok(ReqId(seq))
    }

    fn test(&mut self, req: ReqId) -> Result<Option<usize>> {
        let p = self.slot(req.0).ok_or_else(|| {
            Error::invalid(format!("tcp: unknown receive request {}", req.0)).transport(NAME)
        })?;
        if p.taken {
            return Err(Error::invalid(format!(
                "tcp: receive request {} already completed",
                req.0
            ))
            .transport(NAME));
        }
        if !p.complete() {
            self.progress()?;
        }
        let Some(p) = self.slot(req.0) else {
            return Ok(None);
        };
        if !p.complete() {
            return Ok(None);
        }
        p.taken = true;
        let len = p.len;
        while self.posted.front().is_some_and(|p| p.taken) {
            self.posted.pop_front();
        }
        Ok(Some(len))
    }

    fn wait_fds(&self, out: &mut Vec<WaitFd>) {
        let cutting = self
            .streams
            .iter()
            .any(|s| s.cut.is_some() && !s.finished());
        if cutting || self.posted.iter().any(|p| !p.complete()) {
            for s in self.streams.iter().filter(|s| !s.finished()) {
                out.push(WaitFd {
                    fd: s.sock.as_raw_fd(),
                    write: false,
                });
            }
        }
    }

    fn state(&self) -> String {
        let lost = self.streams.iter().filter(|s| !s.alive).count();
        let waiting: Vec<String> = self
            .posted
            .iter()
            .filter(|p| !p.complete())
            .take(4)
            .map(|p| format!("message {} has {}/{} bytes", p.seq, p.bytes, p.len))
            .collect();
        format!(
            "{}{}",
            waiting.join(", "),
            if lost > 0 {
                format!("; {lost} stream(s) lost with their rail")
            } else {
                String::new()
            }
        )
    }

    /// Leaves an abort frame on the way back to the sender: its next write fails, and then it
    /// reads why (`sock::abort_left_by_peer`).
    fn abort(&mut self, reason: &str) {
        let frame = crate::frame::abort_frame(reason);
        for st in &self.streams {
            crate::sock::write_within(&st.sock, &frame, std::time::Duration::from_millis(20));
        }
    }

    fn close(self: Box<Self>) -> Result<()> {
        for s in &self.streams {
            let _ = s.sock.shutdown(std::net::Shutdown::Both);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The receiver against a sender written by hand on real loopback sockets: `Weights`
    //! frames change how later messages split, in whatever order the streams deliver them,
    //! and a frame the one-call fast path reads past is put back.
    use super::*;
    use crate::frame::{nparts, split, weights_frame};
    use railcc_core::call::CollKind;
    use railcc_core::net::NetRecvComm;
    use railcc_core::DataType;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::time::{Duration, Instant};

    fn streams(n: usize) -> (Vec<TcpStream>, Vec<Socket>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        (0..n)
            .map(|_| {
                let w = TcpStream::connect(addr).unwrap();
                let (r, _) = l.accept().unwrap();
                r.set_nonblocking(true).unwrap();
                (w, Socket::from(r))
            })
            .unzip()
    }

    fn settings() -> TcpSettings {
        TcpSettings {
            nstreams: 2,
            stripe_min_bytes: 4096,
            socket_buffer_bytes: 1 << 20,
            max_message_bytes: 1 << 30,
            rail_failover: false,
            rail_timeout: Duration::from_secs(3),
            measure_rails: true,
        }
    }

    fn tag(n: usize) -> MsgTag {
        MsgTag::new(1, CollKind::AllReduce, DataType::U8, None, None, n as u64)
    }

    /// Writes message `seq` (`data`) split by `weights` over the writers, part i on writer i.
    fn send(w: &mut [TcpStream], seq: u64, data: &[u8], weights: &[u32]) {
        let n = nparts(data.len(), w.len(), 4096);
        for (i, s) in w.iter_mut().enumerate().take(n) {
            let (off, len) = split(data.len(), &weights[..n], i);
            let h = Header {
                part: i as u16,
                nparts: n as u16,
                seq,
                tag: tag(data.len()),
                total: data.len() as u64,
                off: off as u64,
                len: len as u64,
                epoch: 0,
                kind: Kind::Data,
            };
            s.write_all(&h.encode()).unwrap();
            s.write_all(&data[off..off + len]).unwrap();
        }
    }

    fn recv(r: &mut TcpRecvComm, len: usize) -> Result<Vec<u8>> {
        let mut got = vec![0u8; len];
        // SAFETY: `got` outlives the request, which completes (or fails) below.
        let req = unsafe { r.irecv(got.as_mut_ptr(), len, tag(len), None) }?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while r.test(req)?.is_none() {
            assert!(Instant::now() < deadline, "receive hung");
        }
        Ok(got)
    }

    fn pattern(n: usize, k: u8) -> Vec<u8> {
        (0..n).map(|i| (i % 251) as u8 ^ k).collect()
    }

    #[test]
    fn weights_frames_change_the_split_from_their_message_on() {
        let (mut w, socks) = streams(2);
        let mut r = TcpRecvComm::new(socks, vec![1, 1], vec!["lo".into(); 2], false, settings());
        let (a, b) = (pattern(1 << 20, 1), pattern(1 << 20, 2));
        send(&mut w, 0, &a, &[1, 1]);
        assert_eq!(recv(&mut r, a.len()).unwrap(), a);
        // From message 1 on, 3:1; stream 1 delivers its Weights frame and part first.
        let wf = weights_frame(1, &[3, 1]);
        w[1].write_all(&wf).unwrap();
        let n = b.len();
        let (off, len) = split(n, &[3, 1], 1);
        let h = |part: usize, off: usize, len: usize| Header {
            part: part as u16,
            nparts: 2,
            seq: 1,
            tag: tag(n),
            total: n as u64,
            off: off as u64,
            len: len as u64,
            epoch: 0,
            kind: Kind::Data,
        };
        w[1].write_all(&h(1, off, len).encode()).unwrap();
        w[1].write_all(&b[off..off + len]).unwrap();
        w[0].write_all(&wf).unwrap();
        w[0].write_all(&h(0, 0, off).encode()).unwrap();
        w[0].write_all(&b[..off]).unwrap();
        assert_eq!(recv(&mut r, n).unwrap(), b);
        // A part split by the old weights after the change is refused by name.
        send(&mut w, 2, &a, &[1, 1]);
        let e = recv(&mut r, a.len()).unwrap_err();
        assert!(e.message.contains("bad split"), "{e}");
    }

    #[test]
    fn a_weights_frame_read_by_the_fast_path_is_put_back() {
        let (mut w, socks) = streams(2);
        let mut r = TcpRecvComm::new(socks, vec![1, 1], vec!["lo".into(); 2], false, settings());
        // Message 0 is small (one part, stream 0): the receiver reads header and payload in
        // one call. Then a Weights frame for message 1 and message 1 itself, also small:
        // the fast path reads the frame's header and message 1's frame into message 1's
        // buffer, and must move them back.
        let small = pattern(3000, 7);
        send(&mut w, 0, &small, &[1, 1]);
        assert_eq!(recv(&mut r, small.len()).unwrap(), small);
        let wf = weights_frame(1, &[5, 2]);
        for s in w.iter_mut() {
            s.write_all(&wf).unwrap();
        }
        let next = pattern(3000, 9);
        send(&mut w, 1, &next, &[5, 2]);
        assert_eq!(recv(&mut r, next.len()).unwrap(), next);
        // And a striped message after it, split 5:2.
        let big = pattern(1 << 20, 3);
        send(&mut w, 2, &big, &[5, 2]);
        assert_eq!(recv(&mut r, big.len()).unwrap(), big);
    }

    #[test]
    fn weights_frames_that_disagree_are_a_protocol_error() {
        let (mut w, socks) = streams(2);
        let mut r = TcpRecvComm::new(socks, vec![1, 1], vec!["lo".into(); 2], false, settings());
        w[0].write_all(&weights_frame(0, &[3, 1])).unwrap();
        w[1].write_all(&weights_frame(0, &[1, 3])).unwrap();
        let data = pattern(1 << 20, 4);
        send(&mut w, 0, &data, &[3, 1]);
        let e = recv(&mut r, data.len()).unwrap_err();
        assert!(e.message.contains("differ"), "{e}");
    }
}
