//! Socket setup and the two raw I/O calls the data path needs. Raw `sendmsg`/`recv` are used
//! (not `std::io::Write`) for `MSG_NOSIGNAL`, gathered writes and writing into caller memory.

use railcc_core::net::ConnIdent;
use railcc_core::{Error, ErrorKind, Result};
use socket2::Socket;
use std::os::fd::AsRawFd;

pub const HELLO_MAGIC: u32 = 0x4843_5452; // "RTCH"
pub const HELLO_BYTES: usize = 24;
/// `StreamHello::flags`: the sender carries on over other rails when one is lost.
pub const HELLO_FAILOVER: u32 = 1;
pub const MAX_STREAMS: usize = 64;

/// Sent on each stream after authentication: who connects, which stream of how many, and
/// the stream's weight in the split (its rail's bandwidth).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamHello {
    pub who: ConnIdent,
    pub stream: u16,
    pub nstreams: u16,
    pub weight: u32,
    pub flags: u32,
}

impl StreamHello {
    pub fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.who.rank.to_le_bytes());
        b[8..12].copy_from_slice(&self.who.channel.to_le_bytes());
        b[12..14].copy_from_slice(&self.stream.to_le_bytes());
        b[14..16].copy_from_slice(&self.nstreams.to_le_bytes());
        b[16..20].copy_from_slice(&self.weight.to_le_bytes());
        b[20..24].copy_from_slice(&self.flags.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; HELLO_BYTES]) -> Result<StreamHello> {
        let u32at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let h = StreamHello {
            who: ConnIdent {
                rank: u32at(4),
                channel: u32at(8),
            },
            stream: u16::from_le_bytes([b[12], b[13]]),
            nstreams: u16::from_le_bytes([b[14], b[15]]),
            weight: u32at(16),
            flags: u32at(20),
        };
        if u32at(0) != HELLO_MAGIC
            || h.weight == 0
            || h.flags & !HELLO_FAILOVER != 0
            || h.nstreams == 0
            || h.nstreams as usize > MAX_STREAMS
            || h.stream >= h.nstreams
        {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!("bad stream hello {h:?}"),
            ));
        }
        Ok(h)
    }
}

/// Low latency and large buffers, then non-blocking.
pub fn tune(s: &Socket, buffer_bytes: usize) -> Result<()> {
    let io = |what: &str, e: std::io::Error| {
        Error::io(format!("tcp: {what}"), &e).transport(crate::NAME)
    };
    s.set_nodelay(true).map_err(|e| io("TCP_NODELAY", e))?;
    if buffer_bytes > 0 {
        // Best effort: the kernel caps these at net.core.{w,r}mem_max.
        let _ = s.set_send_buffer_size(buffer_bytes);
        let _ = s.set_recv_buffer_size(buffer_bytes);
    }
    s.set_nonblocking(true).map_err(|e| io("O_NONBLOCK", e))
}

/// Outcome of one non-blocking I/O call.
pub enum Io {
    Done(usize),
    WouldBlock,
}

fn classify(n: isize, what: &str) -> Result<Io> {
    if n >= 0 {
        return Ok(Io::Done(n as usize));
    }
    let e = std::io::Error::last_os_error();
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(Io::WouldBlock),
        _ => Err(Error::io(what, &e).transport(crate::NAME)),
    }
}

/// Gathered, non-blocking send of `parts` without raising SIGPIPE.
pub fn send_iov(s: &Socket, parts: &[(*const u8, usize)]) -> Result<Io> {
    let mut iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 2];
    let mut n = 0;
    for &(p, l) in parts.iter().filter(|(_, l)| *l > 0).take(2) {
        iov[n] = libc::iovec {
            iov_base: p as *mut libc::c_void,
            iov_len: l,
        };
        n += 1;
    }
    if n == 0 {
        return Ok(Io::Done(0));
    }
    // SAFETY: a zeroed msghdr is valid; we point it at `iov`, which outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = n as _;
    // SAFETY: every iovec points into memory the caller guarantees valid for its length.
    let r = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    classify(r, "tcp send")
}

/// Bytes written to `s` that the peer has not acknowledged yet (SIOCOUTQ).
pub fn unacked_bytes(s: &Socket) -> Result<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (= SIOCOUTQ) writes one int through a valid pointer.
    let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
    if r < 0 {
        return Err(
            Error::io("tcp: SIOCOUTQ", &std::io::Error::last_os_error()).transport(crate::NAME)
        );
    }
    Ok(n.max(0) as u64)
}

/// Non-blocking receive into raw memory. `Done(0)` means the peer closed the stream.
///
/// # Safety
/// `ptr..ptr+len` must be valid for writes.
pub unsafe fn recv_raw(s: &Socket, ptr: *mut u8, len: usize) -> Result<Io> {
    let r = libc::recv(
        s.as_raw_fd(),
        ptr as *mut libc::c_void,
        len,
        libc::MSG_DONTWAIT,
    );
    classify(r, "tcp recv")
}

/// Gathered receive: header bytes then payload, in one call (saves a syscall for small
/// messages).
///
/// # Safety
/// Both ranges must be valid for writes.
pub unsafe fn recv_iov(s: &Socket, a: (*mut u8, usize), b: (*mut u8, usize)) -> Result<Io> {
    let mut iov = [
        libc::iovec {
            iov_base: a.0 as *mut libc::c_void,
            iov_len: a.1,
        },
        libc::iovec {
            iov_base: b.0 as *mut libc::c_void,
            iov_len: b.1,
        },
    ];
    let mut msg: libc::msghdr = std::mem::zeroed();
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = if b.1 > 0 { 2 } else { 1 };
    let r = libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT);
    classify(r, "tcp recv")
}

/// After a send failed: the abort frame the peer left on the socket's way back, if any (a
/// receiver that fails writes one there, so that its sender learns the first failure).
pub fn abort_left_by_peer(s: &Socket) -> Option<String> {
    let mut b = [0u8; crate::frame::HEADER_BYTES];
    let mut got = 0;
    while got < b.len() {
        // SAFETY: the pointer and length describe the unfilled tail of `b`.
        let n = unsafe {
            libc::recv(
                std::os::fd::AsRawFd::as_raw_fd(s),
                b[got..].as_mut_ptr().cast(),
                b.len() - got,
                libc::MSG_DONTWAIT,
            )
        };
        if n <= 0 {
            return None;
        }
        got += n as usize;
    }
    let kind = u32::from_le_bytes([b[76], b[77], b[78], b[79]]);
    let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    (magic == crate::frame::MAGIC && kind == 3).then(|| crate::frame::abort_text(&b))
}

/// A failed send's error, with the first failure the peer left in an abort frame, if any.
pub fn with_peer_abort(e: Error, s: &Socket) -> Error {
    match abort_left_by_peer(s) {
        Some(text) => Error::new(
            railcc_core::ErrorKind::PeerClosed,
            format!(
                "{}; the peer failed and closed; {}{text}",
                e.message,
                crate::frame::FIRST_FAILURE
            ),
        )
        .transport(crate::NAME),
        None => e,
    }
}

/// Writes `frame` within `budget`, or gives up (a full or broken socket).
pub fn write_within(s: &Socket, frame: &[u8], budget: std::time::Duration) {
    let until = std::time::Instant::now() + budget;
    let mut at = 0;
    while at < frame.len() && std::time::Instant::now() < until {
        // SAFETY: the range lies inside `frame`, which outlives the call.
        let part = [(unsafe { frame.as_ptr().add(at) }, frame.len() - at)];
        match send_iov(s, &part) {
            Ok(Io::Done(n)) => at += n,
            Ok(Io::WouldBlock) => std::thread::sleep(std::time::Duration::from_micros(200)),
            Err(_) => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn hello_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), HELLO_BYTES)) {
            let mut b = [0u8; HELLO_BYTES];
            b.copy_from_slice(&bytes);
            if let Ok(h) = StreamHello::decode(&b) {
                prop_assert!(h.stream < h.nstreams && h.nstreams as usize <= MAX_STREAMS && h.weight > 0);
            }
        }
    }

    #[test]
    fn hello_round_trips() {
        let h = StreamHello {
            who: ConnIdent {
                rank: 7,
                channel: 1,
            },
            stream: 2,
            nstreams: 4,
            weight: 800,
            flags: HELLO_FAILOVER,
        };
        assert_eq!(StreamHello::decode(&h.encode()).unwrap(), h);
        let zero = StreamHello { weight: 0, ..h };
        assert!(
            StreamHello::decode(&zero.encode()).is_err(),
            "a zero weight is refused"
        );
    }
}
