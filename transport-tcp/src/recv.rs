//! The receiving side of a connection. Each stream reads a header, checks it against the
//! receive posted for its sequence number, then reads the part straight into the caller's
//! buffer. Nothing is allocated from what a peer announces.

use crate::frame::{nparts, Header, HEADER_BYTES};
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
    nparts: usize,
    parts_done: usize,
    taken: bool,
}

/// A part being read on one stream: which message, where it goes, how much has arrived.
struct Cur {
    seq: u64,
    off: usize,
    len: usize,
    got: usize,
}

struct Stream {
    sock: Socket,
    header: [u8; HEADER_BYTES],
    header_got: usize,
    /// Bytes of payload read speculatively together with the header (fast path).
    early: usize,
    cur: Option<Cur>,
    last_seq: Option<u64>,
}

pub struct TcpRecvComm {
    streams: Vec<Stream>,
    /// Each stream's share of a striped message, as the sender declared it.
    weights: Vec<u32>,
    settings: TcpSettings,
    posted: VecDeque<Posted>,
    next_seq: u64,
    broken: Option<Error>,
}

// SAFETY: raw pointers to posted buffers are only used by the owning thread; the irecv
// contract keeps that memory valid until completion.
unsafe impl Send for TcpRecvComm {}

impl TcpRecvComm {
    pub(crate) fn new(socks: Vec<Socket>, weights: Vec<u32>, settings: TcpSettings) -> TcpRecvComm {
        let streams = socks
            .into_iter()
            .map(|sock| Stream {
                sock,
                header: [0; HEADER_BYTES],
                header_got: 0,
                early: 0,
                cur: None,
                last_seq: None,
            })
            .collect();
        TcpRecvComm {
            streams,
            weights,
            settings,
            posted: VecDeque::new(),
            next_seq: 0,
            broken: None,
        }
    }

    fn slot(&mut self, seq: u64) -> Option<&mut Posted> {
        let base = self.posted.front()?.seq;
        let i = usize::try_from(seq.checked_sub(base)?).ok()?;
        self.posted.get_mut(i)
    }

    fn progress(&mut self) -> Result<()> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        if self.posted.iter().all(|p| p.parts_done == p.nparts) {
            return Ok(());
        }
        for si in 0..self.streams.len() {
            if let Err(e) = self.progress_stream(si) {
                let e = e.transport(NAME);
                self.broken = Some(e.clone());
                return Err(e);
            }
        }
        Ok(())
    }

    fn progress_stream(&mut self, si: usize) -> Result<()> {
        let nstreams = self.streams.len();
        loop {
            // Read only while a posted receive still needs this stream: reading ahead would turn
            // a peer's orderly close after its last message into a spurious error.
            if self.streams[si].cur.is_none()
                && !self
                    .posted
                    .iter()
                    .any(|p| p.parts_done < p.nparts && p.nparts > si)
            {
                return Ok(());
            }
            if self.streams[si].cur.is_none() {
                // Fast path: stream 0 carries part 0 of every message in order, so when the next
                // message is posted and fits one part, read header and payload in one call.
                let want = self.streams[0].last_seq.map_or(0, |s| s + 1);
                let spec = if si == 0 && self.streams[0].header_got == 0 {
                    let stripe = self.settings.stripe_min_bytes;
                    self.slot(want)
                        .filter(|p| p.nparts == 1 && nparts(p.len, nstreams, stripe) == 1)
                        .map(|p| (p.data, p.len))
                } else {
                    None
                };
                let st = &mut self.streams[si];
                if st.header_got < HEADER_BYTES {
                    let got = st.header_got;
                    // SAFETY: the header array is ours; `spec` points to a posted buffer of `len`
                    // bytes that the irecv contract keeps valid.
                    let r = unsafe {
                        match spec {
                            Some(d) => {
                                recv_iov(&st.sock, (st.header.as_mut_ptr(), HEADER_BYTES), d)?
                            }
                            None => recv_raw(
                                &st.sock,
                                st.header.as_mut_ptr().add(got),
                                HEADER_BYTES - got,
                            )?,
                        }
                    };
                    match r {
                        Io::WouldBlock => return Ok(()),
                        Io::Done(0) => {
                            return Err(Error::new(
                                ErrorKind::PeerClosed,
                                format!("peer closed stream {si} of the connection"),
                            ))
                        }
                        Io::Done(n) => {
                            let h = n.min(HEADER_BYTES - got);
                            st.header_got += h;
                            st.early = n - h;
                        }
                    }
                    if st.header_got < HEADER_BYTES {
                        return Ok(());
                    }
                }
                let h = Header::decode(&st.header)
                    .map_err(|e| Error::new(e.kind, format!("stream {si}: {}", e.message)))?;
                if st.last_seq.is_some_and(|l| h.seq <= l) {
                    return Err(Error::new(
                        ErrorKind::Protocol,
                        format!("stream {si}: sequence {} after {:?}", h.seq, st.last_seq),
                    ));
                }
                let early = st.early;
                if early > 0 && h.seq != want {
                    return Err(Error::new(
                        ErrorKind::Protocol,
                        format!("stream 0: sequence {} where {want} was due", h.seq),
                    ));
                }
                let (stripe, maxm) = (
                    self.settings.stripe_min_bytes,
                    self.settings.max_message_bytes,
                );
                let Some(p) = self.slot(h.seq) else {
                    if h.seq < self.next_seq {
                        return Err(Error::new(
                            ErrorKind::Protocol,
                            format!("stream {si}: stale sequence {}", h.seq),
                        ));
                    }
                    if early > 0 {
                        return Err(Error::new(
                            ErrorKind::Protocol,
                            "payload arrived for a receive not yet posted",
                        ));
                    }
                    return Ok(()); // Not posted yet: keep the header until it is.
                };
                let (tag, len) = (p.tag, p.len as u64);
                h.check(si, &self.weights, &tag, len, stripe, maxm)?;
                let st = &mut self.streams[si];
                st.last_seq = Some(h.seq);
                st.cur = Some(Cur {
                    seq: h.seq,
                    off: h.off as usize,
                    len: h.len as usize,
                    got: early,
                });
                st.header_got = 0;
                st.early = 0;
            }
            let Some(cur) = self.streams[si].cur.as_ref() else {
                return Ok(());
            };
            let (seq, off, len, got) = (cur.seq, cur.off, cur.len, cur.got);
            let data = match self.slot(seq) {
                Some(p) => p.data,
                None => {
                    return Err(Error::new(
                        ErrorKind::Protocol,
                        "part for a finished receive",
                    ))
                }
            };
            let mut got_now = got;
            if got < len {
                let st = &self.streams[si];
                // SAFETY: off+len <= posted len (checked by Header::check); memory valid per irecv.
                match unsafe { recv_raw(&st.sock, data.add(off + got), len - got)? } {
                    Io::WouldBlock => return Ok(()),
                    Io::Done(0) => {
                        return Err(Error::new(
                            ErrorKind::PeerClosed,
                            format!("peer closed stream {si} in the middle of a message"),
                        ))
                    }
                    Io::Done(n) => got_now += n,
                }
            }
            if got_now < len {
                if let Some(c) = self.streams[si].cur.as_mut() {
                    c.got = got_now;
                }
                continue;
            }
            self.streams[si].cur = None;
            if let Some(p) = self.slot(seq) {
                p.parts_done += 1;
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
        let n = nparts(len, self.streams.len(), self.settings.stripe_min_bytes);
        self.posted.push_back(Posted {
            seq,
            data,
            len,
            tag,
            nparts: n,
            parts_done: 0,
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
        if p.parts_done < p.nparts {
            self.progress()?;
        }
        let Some(p) = self.slot(req.0) else {
            return Ok(None);
        };
        if p.parts_done < p.nparts {
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
        if self.posted.iter().any(|p| p.parts_done < p.nparts) {
            for s in &self.streams {
                out.push(WaitFd {
                    fd: s.sock.as_raw_fd(),
                    write: false,
                });
            }
        }
    }

    fn close(self: Box<Self>) -> Result<()> {
        for s in &self.streams {
            let _ = s.sock.shutdown(std::net::Shutdown::Both);
        }
        Ok(())
    }
}
