//! The sending side of a connection: a queue of parts per stream, drained by non-blocking
//! gathered writes whenever `test` is called.

use crate::frame::{nparts, split, Header, HEADER_BYTES};
use crate::sock::{send_iov, tune, Io, StreamHello};
use crate::{TcpRail, TcpSettings, NAME};
use railcc_core::auth::{prove_client, Secret};
use railcc_core::bootstrap::connect_from;
use railcc_core::net::{ConnIdent, MemRegion, MsgTag, NetSendComm, ReqId, WaitFd};
use railcc_core::wire::write_all_by;
use railcc_core::{Error, ErrorKind, Result};
use socket2::Socket;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::Instant;

struct Part {
    seq: u64,
    header: [u8; HEADER_BYTES],
    sent_header: usize,
    data: *const u8,
    len: usize,
    sent: usize,
}

struct Stream {
    sock: Socket,
    queue: VecDeque<Part>,
}

pub struct TcpSendComm {
    streams: Vec<Stream>,
    /// Each stream's share of a striped message (its rail's bandwidth).
    weights: Vec<u32>,
    settings: TcpSettings,
    next_seq: u64,
    /// Parts still unsent per in-flight sequence number, oldest first.
    pending: VecDeque<(u64, usize, usize)>,
    broken: Option<Error>,
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
        let mut streams = Vec::with_capacity(n);
        let mut weights = Vec::with_capacity(n);
        for i in 0..n {
            let addr = addrs[i % r.min(addrs.len())];
            let rail = rails.get(i % r);
            let local = rail.map(|x| x.ip);
            let mut s = connect_from(local, addr, deadline).map_err(|e| {
                e.transport(NAME).op(format!(
                    "connect stream {i} on rail {}",
                    rail.map_or("default", |x| x.name.as_str())
                ))
            })?;
            prove_client(&mut s, secret, deadline).map_err(|e| e.transport(NAME))?;
            let weight = rail.map_or(1, |x| x.weight.max(1));
            weights.push(weight);
            let hello = StreamHello {
                who: me,
                stream: i as u16,
                nstreams: n as u16,
                weight,
            };
            write_all_by(&mut s, &hello.encode(), deadline, "tcp stream hello")?;
            let sock = Socket::from(s);
            tune(&sock, settings.socket_buffer_bytes)?;
            streams.push(Stream {
                sock,
                queue: VecDeque::new(),
            });
        }
        Ok(TcpSendComm {
            streams,
            weights,
            settings: settings.clone(),
            next_seq: 0,
            pending: VecDeque::new(),
            broken: None,
        })
    }

    fn progress(&mut self) -> Result<()> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        for (si, st) in self.streams.iter_mut().enumerate() {
            while let Some(p) = st.queue.front_mut() {
                let hdr_left = HEADER_BYTES - p.sent_header;
                let parts = [
                    (p.header[p.sent_header..].as_ptr(), hdr_left),
                    // SAFETY: `sent <= len` and the isend contract keeps data..data+len valid.
                    (unsafe { p.data.add(p.sent) }, p.len - p.sent),
                ];
                let r = match send_iov(&st.sock, &parts) {
                    Ok(r) => r,
                    Err(e) => {
                        let e = match e.kind {
                            ErrorKind::Io | ErrorKind::PeerClosed => Error::new(
                                ErrorKind::PeerClosed,
                                format!("stream {si}: {}", e.message),
                            ),
                            _ => e,
                        }
                        .transport(NAME);
                        self.broken = Some(e.clone());
                        return Err(e);
                    }
                };
                match r {
                    Io::WouldBlock => break,
                    Io::Done(mut n) => {
                        let h = n.min(hdr_left);
                        p.sent_header += h;
                        n -= h;
                        p.sent += n;
                        if p.sent_header == HEADER_BYTES && p.sent == p.len {
                            let seq = p.seq;
                            st.queue.pop_front();
                            if let Some(e) = self.pending.iter_mut().find(|e| e.0 == seq) {
                                e.1 -= 1;
                            }
                        } else {
                            break;
                        }
                    }
                }
            }
        }
        Ok(())
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
        let n = nparts(len, self.streams.len(), self.settings.stripe_min_bytes);
        for i in 0..n {
            let (off, plen) = split(len, &self.weights[..n], i);
            let h = Header {
                part: i as u16,
                nparts: n as u16,
                seq,
                tag,
                total: len as u64,
                off: off as u64,
                len: plen as u64,
            };
            self.streams[i].queue.push_back(Part {
                seq,
                header: h.encode(),
                sent_header: 0,
                data: data.add(off),
                len: plen,
                sent: 0,
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
        for s in &self.streams {
            if !s.queue.is_empty() {
                out.push(WaitFd {
                    fd: s.sock.as_raw_fd(),
                    write: true,
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
