//! File descriptors between the processes of one host: the handles of VMM buffers
//! (`railcc_cuda::vmm`), which, unlike legacy IPC handles, are descriptors and so travel only
//! over a Unix socket (SCM_RIGHTS). One abstract datagram socket per rank: datagrams keep each
//! message whole with its descriptor, and an abstract name leaves nothing on disk.
//!
//! Why libc here: std's Unix sockets cannot send ancillary data on stable Rust.
//! A message is some u64 words with up to [`MAX_FDS`] descriptors: one message per buffer,
//! however many pieces it has, since a datagram socket queues only a few messages
//! (net.unix.max_dgram_qlen, 10 by default) before a sender must wait for the reader.
//! The words start with the sender's token (from the authenticated bootstrap), so a
//! stranger's datagram is dropped by the reader. The reader is a thread of its own
//! (share.rs), so a queue never stays full while its owner waits for something else.

use railcc_core::{Error, ErrorKind, Result};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// Descriptors one message carries at most (the kernel's SCM_MAX_FD is 253).
pub const MAX_FDS: usize = 200;
/// Words one message carries at most.
pub const MAX_WORDS: usize = 8 + 4 * MAX_FDS;

pub struct FdPost {
    sock: OwnedFd,
    prefix: String,
}

fn addr_of(name: &str) -> Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: a plain C struct; zero is its empty value.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let b = name.as_bytes();
    if b.len() + 1 > a.sun_path.len() {
        return Err(Error::invalid(format!("socket name {name} is too long")));
    }
    // Abstract: a leading NUL, then the name (not NUL-terminated).
    for (i, c) in b.iter().enumerate() {
        a.sun_path[i + 1] = *c as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + b.len();
    Ok((a, len as libc::socklen_t))
}

fn os_err(what: &str) -> Error {
    Error::new(
        ErrorKind::Io,
        format!("{what}: {}", std::io::Error::last_os_error()),
    )
    .transport(crate::NAME)
}

impl FdPost {
    /// Binds rank `rank`'s socket; `prefix` is the communicator's unique name.
    pub fn bind(prefix: &str, rank: usize) -> Result<FdPost> {
        // SAFETY: plain libc call; the descriptor is owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_UNIX,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                0,
            )
        };
        if fd < 0 {
            return Err(os_err("socket(AF_UNIX)"));
        }
        // SAFETY: a fresh descriptor, ours alone.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        let (a, len) = addr_of(&format!("{prefix}-fd-{rank}"))?;
        // SAFETY: `a` is a valid sockaddr_un of `len` bytes.
        if unsafe { libc::bind(fd, &a as *const _ as *const libc::sockaddr, len) } != 0 {
            return Err(os_err("bind (descriptor socket)"));
        }
        Ok(FdPost {
            sock,
            prefix: prefix.to_string(),
        })
    }

    /// Sends `words` with copies of `fds` to rank `to`. A full receiver queue (or too many
    /// descriptors in flight) is waited for until its reader catches up; `broken` and the
    /// deadline end the wait.
    pub fn send(
        &self,
        to: usize,
        words: &[u64],
        fds: &[BorrowedFd<'_>],
        deadline: Instant,
        broken: &dyn Fn() -> Option<Error>,
    ) -> Result<()> {
        if words.len() > MAX_WORDS || fds.is_empty() || fds.len() > MAX_FDS {
            return Err(Error::invalid(format!(
                "a descriptor message of {} words and {} descriptors (1 to {MAX_FDS})",
                words.len(),
                fds.len()
            )));
        }
        let (mut a, len) = addr_of(&format!("{}-fd-{to}", self.prefix))?;
        let mut payload = words.to_vec();
        let mut iov = libc::iovec {
            iov_base: payload.as_mut_ptr() as *mut libc::c_void,
            iov_len: payload.len() * 8,
        };
        let fd_bytes = (std::mem::size_of::<i32>() * fds.len()) as u32;
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE(fd_bytes) } as usize;
        // u64 words: aligned for the cmsghdr laid over them.
        let mut control = vec![0u64; space.div_ceil(8)];
        loop {
            // SAFETY: every pointer in the header points at live locals of the right sizes;
            // the control buffer holds exactly one SCM_RIGHTS message with `fds`.
            let r = unsafe {
                let mut m: libc::msghdr = std::mem::zeroed();
                m.msg_name = &mut a as *mut _ as *mut libc::c_void;
                m.msg_namelen = len;
                m.msg_iov = &mut iov;
                m.msg_iovlen = 1;
                m.msg_control = control.as_mut_ptr() as *mut libc::c_void;
                m.msg_controllen = space as _;
                let c = libc::CMSG_FIRSTHDR(&m);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(fd_bytes) as _;
                let data = libc::CMSG_DATA(c) as *mut i32;
                for (i, fd) in fds.iter().enumerate() {
                    std::ptr::write_unaligned(data.add(i), fd.as_raw_fd());
                }
                libc::sendmsg(self.sock.as_raw_fd(), &m, libc::MSG_NOSIGNAL)
            };
            if r >= 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            let failed =
                |kind, what: String| Err(Error::new(kind, what).peer(to).transport(crate::NAME));
            match e.raw_os_error() {
                // The receiver's queue is full, or too many descriptors are in flight: wait.
                Some(libc::EAGAIN) | Some(libc::ETOOMANYREFS) => {}
                // No socket of that name here: the peer is gone, or lives in another network
                // namespace (abstract names are scoped by it). Unsupported: the caller may
                // move the data another way.
                Some(libc::ECONNREFUSED) | Some(libc::ENOENT) => {
                    return failed(
                        ErrorKind::Unsupported,
                        format!("rank {to}'s descriptor socket cannot be reached (another network namespace?): {e}"),
                    )
                }
                _ => {
                    return failed(
                        ErrorKind::Io,
                        format!("sending a buffer's descriptor to rank {to}: {e}"),
                    )
                }
            }
            if let Some(e) = broken() {
                return Err(e);
            }
            if Instant::now() > deadline {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!("rank {to} did not read the descriptors of buffers in time"),
                )
                .peer(to)
                .transport(crate::NAME));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// The next message (its words and descriptors), if one waits now.
    #[allow(clippy::type_complexity)]
    pub fn try_recv(&self) -> Result<Option<(Vec<u64>, Vec<OwnedFd>)>> {
        let mut payload = vec![0u64; MAX_WORDS];
        let mut iov = libc::iovec {
            iov_base: payload.as_mut_ptr() as *mut libc::c_void,
            iov_len: payload.len() * 8,
        };
        // SAFETY: a pure size computation.
        let space = unsafe { libc::CMSG_SPACE((std::mem::size_of::<i32>() * (MAX_FDS + 8)) as u32) }
            as usize;
        // u64 words: aligned for the cmsghdr laid over them.
        let mut control = vec![0u64; space.div_ceil(8)];
        // SAFETY: pointers to live locals of the right sizes; the kernel fills at most
        // `space` control bytes.
        let (n, m) = unsafe {
            let mut m: libc::msghdr = std::mem::zeroed();
            m.msg_iov = &mut iov;
            m.msg_iovlen = 1;
            m.msg_control = control.as_mut_ptr() as *mut libc::c_void;
            m.msg_controllen = space as _;
            let n = libc::recvmsg(
                self.sock.as_raw_fd(),
                &mut m,
                libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
            );
            (n, m)
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) => Ok(None),
                _ => Err(Error::new(
                    ErrorKind::Io,
                    format!("receiving a buffer's descriptor: {e}"),
                )
                .transport(crate::NAME)),
            };
        }
        // Every descriptor that came is owned (and closed) even when the message is bad.
        let mut fds = Vec::new();
        // SAFETY: walking the control messages the kernel wrote into `control`.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&m);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c) as *const i32;
                    let k = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                    for i in 0..k {
                        fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                    }
                }
                c = libc::CMSG_NXTHDR(&m, c);
            }
        }
        let whole = (n as usize).is_multiple_of(8) && m.msg_flags & libc::MSG_TRUNC == 0;
        if m.msg_flags & libc::MSG_CTRUNC != 0 {
            // Descriptors were lost (this process ran out of them): the pieces they stood
            // for can never be mapped, so the communicator cannot go on.
            return Err(Error::new(
                ErrorKind::Io,
                "descriptors of a peer's buffer were lost on the way (too many open files?)",
            )
            .transport(crate::NAME));
        }
        match (whole, fds.len()) {
            (true, 1..) => {
                payload.truncate(n as usize / 8);
                Ok(Some((payload, fds)))
            }
            _ => {
                tracing::warn!(
                    "dropped a malformed message on the descriptor socket ({n} bytes, {} descriptors)",
                    fds.len()
                );
                Ok(None)
            }
        }
    }

    /// Waits up to `timeout` for a message to read; whether one is there.
    pub fn wait_readable(&self, timeout: Duration) -> bool {
        let mut p = libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, timeout.as_millis().min(i32::MAX as u128) as i32) };
        let readable = r > 0 && p.revents & libc::POLLIN != 0;
        if r != 0 && !readable {
            // An error state or an interrupted poll: wait anyway, so a caller's loop never spins.
            std::thread::sleep(timeout);
        }
        readable
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;

    fn text_of(fd: OwnedFd) -> String {
        let mut g = std::fs::File::from(fd);
        g.rewind().unwrap();
        let mut s = String::new();
        g.read_to_string(&mut s).unwrap();
        s
    }

    #[test]
    fn descriptors_travel_with_their_words() {
        let prefix = format!("railcc-test-fd-{}", std::process::id());
        let a = FdPost::bind(&prefix, 0).unwrap();
        let b = FdPost::bind(&prefix, 1).unwrap();
        assert!(FdPost::bind(&prefix, 1).is_err(), "a name is taken once");
        let mut f = tempfile_with(b"piece");
        let f2 = tempfile_with(b"second");
        let later = Instant::now() + Duration::from_secs(5);
        let fds = [f.as_fd(), f2.as_fd()];
        a.send(1, &[1, 0, 7, 8, 9], &fds, later, &|| None).unwrap();
        f.write_all(b"!").unwrap();
        let (w, mut got) = b.try_recv().unwrap().expect("a message waits");
        assert_eq!(w, [1, 0, 7, 8, 9]);
        assert_eq!(got.len(), 2, "both descriptors came");
        assert_eq!(text_of(got.pop().unwrap()), "second", "in order");
        // The same open file: what was written after sending shows through the copy.
        assert_eq!(text_of(got.pop().unwrap()), "piece!");
        assert!(b.try_recv().unwrap().is_none(), "one message was sent");
        let e = a.send(1, &[0; 4], &[], later, &|| None).unwrap_err();
        assert!(e.to_string().contains("0 descriptors"), "{e}");
    }

    #[test]
    fn a_full_receiver_is_a_named_timeout() {
        let prefix = format!("railcc-test-fdfull-{}", std::process::id());
        let a = FdPost::bind(&prefix, 0).unwrap();
        let b = FdPost::bind(&prefix, 1).unwrap();
        let f = tempfile_with(b"x");
        assert!(
            !b.wait_readable(Duration::from_millis(1)),
            "nothing sent yet"
        );
        let mut last = Ok(());
        let mut sent = 0;
        for _ in 0..10_000 {
            let soon = Instant::now() + Duration::from_millis(100);
            last = a.send(1, &[0; 4], &[f.as_fd()], soon, &|| None);
            if last.is_err() {
                break;
            }
            sent += 1;
        }
        let e = last.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
        assert!(e.to_string().contains("rank 1"), "{e}");
        // The reader catches up: every message is whole, and sending works again.
        assert!(b.wait_readable(Duration::from_millis(100)));
        let mut read = 0;
        while b.try_recv().unwrap().is_some() {
            read += 1;
        }
        assert_eq!(read, sent);
        let later = Instant::now() + Duration::from_secs(5);
        a.send(1, &[0; 4], &[f.as_fd()], later, &|| None).unwrap();
        // A broken communicator ends the wait with its error.
        let gone = || Some(Error::new(ErrorKind::PeerClosed, "rank 1 died"));
        for _ in 0..10_000 {
            if let Err(e) = a.send(1, &[0; 4], &[f.as_fd()], later, &gone) {
                assert_eq!(e.kind, ErrorKind::PeerClosed);
                break;
            }
        }
        // Nobody listens under this name: an error naming the rank, not a hang, of the kind
        // that lets the caller bounce the data instead.
        let e = a
            .send(5, &[0; 4], &[f.as_fd()], Instant::now(), &|| None)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unsupported, "{e}");
        assert!(e.to_string().contains("rank 5"), "{e}");
    }

    fn tempfile_with(b: &[u8]) -> std::fs::File {
        let p =
            std::env::temp_dir().join(format!("railcc-fdpass-{}-{}", std::process::id(), b.len()));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        let _ = std::fs::remove_file(&p);
        f.write_all(b).unwrap();
        f
    }
}
