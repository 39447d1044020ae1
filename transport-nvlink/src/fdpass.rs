//! File descriptors between the processes of one host: the handles of VMM buffers
//! (`railcc_cuda::vmm`), which, unlike legacy IPC handles, are descriptors and so travel only
//! over a Unix socket (SCM_RIGHTS). One abstract datagram socket per rank: datagrams keep each
//! message whole with its descriptor, and an abstract name leaves nothing on disk.
//!
//! Why libc here: std's Unix sockets cannot send ancillary data on stable Rust.
//! Each message carries the sender's token (from the authenticated bootstrap), so a stranger's
//! datagram is dropped.

use railcc_core::{Error, ErrorKind, Result};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// Words of one message: token, sender rank, then the payload.
pub const WORDS: usize = 6;

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

    /// Sends `words` with a copy of `fd` to rank `to`. A full receiver (it has not read its
    /// messages yet) is waited for, while `drain` empties our own queue so that two ranks
    /// sending to each other do not wait on each other; `broken` and the deadline end the wait.
    pub fn send(
        &self,
        to: usize,
        words: [u64; WORDS],
        fd: BorrowedFd<'_>,
        deadline: Instant,
        broken: &dyn Fn() -> Option<Error>,
        drain: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        let (mut a, len) = addr_of(&format!("{}-fd-{to}", self.prefix))?;
        let mut payload = words;
        let mut iov = libc::iovec {
            iov_base: payload.as_mut_ptr() as *mut libc::c_void,
            iov_len: std::mem::size_of_val(&payload),
        };
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) } as usize;
        let mut control = vec![0u8; space];
        loop {
            // SAFETY: every pointer in the header points at live locals of the right sizes;
            // the control buffer holds exactly one SCM_RIGHTS message with one descriptor.
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
                (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut i32, fd.as_raw_fd());
                libc::sendmsg(self.sock.as_raw_fd(), &m, libc::MSG_NOSIGNAL)
            };
            if r >= 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EAGAIN) {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!("sending a buffer's descriptor to rank {to}: {e}"),
                )
                .peer(to)
                .transport(crate::NAME));
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
            drain()?;
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// The next message and its descriptor, if one waits now.
    pub fn try_recv(&self) -> Result<Option<([u64; WORDS], OwnedFd)>> {
        let mut payload = [0u64; WORDS];
        let mut iov = libc::iovec {
            iov_base: payload.as_mut_ptr() as *mut libc::c_void,
            iov_len: std::mem::size_of_val(&payload),
        };
        // SAFETY: a pure size computation.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32 * 4) } as usize;
        let mut control = vec![0u8; space];
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
        let whole = n as usize == std::mem::size_of_val(&payload)
            && m.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) == 0;
        match (whole, fds.len()) {
            (true, 1) => Ok(fds.pop().map(|fd| (payload, fd))),
            _ => {
                tracing::warn!(
                    "dropped a malformed message on the descriptor socket ({n} bytes, {} descriptors)",
                    fds.len()
                );
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

    #[test]
    fn a_descriptor_travels_with_its_words() {
        let prefix = format!("railcc-test-fd-{}", std::process::id());
        let a = FdPost::bind(&prefix, 0).unwrap();
        let b = FdPost::bind(&prefix, 1).unwrap();
        assert!(FdPost::bind(&prefix, 1).is_err(), "a name is taken once");
        let mut f = tempfile_with(b"piece");
        let later = Instant::now() + Duration::from_secs(5);
        a.send(
            1,
            [1, 0, 7, 8, 9, 10],
            std::os::fd::AsFd::as_fd(&f),
            later,
            &|| None,
            &mut || Ok(()),
        )
        .unwrap();
        f.write_all(b"!").unwrap();
        let (w, fd) = b.try_recv().unwrap().expect("a message waits");
        assert_eq!(w, [1, 0, 7, 8, 9, 10]);
        // The same open file: what was written after sending shows through the copy.
        let mut g = std::fs::File::from(fd);
        g.rewind().unwrap();
        let mut s = String::new();
        g.read_to_string(&mut s).unwrap();
        assert_eq!(s, "piece!");
        assert!(b.try_recv().unwrap().is_none(), "one message was sent");
    }

    #[test]
    fn a_full_receiver_is_a_named_timeout_and_drain_runs_meanwhile() {
        let prefix = format!("railcc-test-fdfull-{}", std::process::id());
        let a = FdPost::bind(&prefix, 0).unwrap();
        let _b = FdPost::bind(&prefix, 1).unwrap();
        let f = tempfile_with(b"x");
        let mut drains = 0;
        let mut last = Ok(());
        for _ in 0..10_000 {
            last = a.send(
                1,
                [0; WORDS],
                std::os::fd::AsFd::as_fd(&f),
                Instant::now() + Duration::from_millis(100),
                &|| None,
                &mut || {
                    drains += 1;
                    Ok(())
                },
            );
            if last.is_err() {
                break;
            }
        }
        let e = last.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
        assert!(e.to_string().contains("rank 1"), "{e}");
        assert!(drains > 0);
        // Nobody listens under this name: an error naming the rank, not a hang.
        let e = a
            .send(
                5,
                [0; WORDS],
                std::os::fd::AsFd::as_fd(&f),
                Instant::now(),
                &|| None,
                &mut || Ok(()),
            )
            .unwrap_err();
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
