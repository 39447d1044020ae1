//! Bounded encoding helpers for small control messages (bootstrap, connection setup).
//! Every decoder checks lengths before it allocates, so a hostile peer cannot make us allocate
//! more than the caller's bound or read past the end of its message.

use crate::error::{Error, ErrorKind, Result};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Instant;

/// Appends little-endian fields to a byte vector.
#[derive(Default)]
pub struct Writer {
    pub buf: Vec<u8>,
}

impl Writer {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A u32 length followed by the bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32);
        self.buf.extend_from_slice(v);
        self
    }
}

/// Reads little-endian fields, failing with a protocol error on truncation.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8], what: &'static str) -> Reader<'a> {
        Reader { buf, pos: 0, what }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.buf.len());
        match end {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(Error::new(
                ErrorKind::Protocol,
                format!(
                    "{}: message truncated ({} bytes, needed {} more at offset {})",
                    self.what,
                    self.buf.len(),
                    n,
                    self.pos
                ),
            )),
        }
    }

    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }
    pub fn u64(&mut self) -> Result<u64> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        b.copy_from_slice(self.take(N)?);
        Ok(b)
    }
    /// A u32-length-prefixed byte string of at most `max` bytes.
    pub fn bytes(&mut self, max: usize) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!(
                    "{}: field of {n} bytes exceeds the bound of {max}",
                    self.what
                ),
            ));
        }
        self.take(n)
    }
    pub fn finish(&self) -> Result<()> {
        if self.pos != self.buf.len() {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!(
                    "{}: {} unexpected trailing bytes",
                    self.what,
                    self.buf.len() - self.pos
                ),
            ));
        }
        Ok(())
    }
}

fn remaining(deadline: Instant, what: &str) -> Result<std::time::Duration> {
    let now = Instant::now();
    if now >= deadline {
        return Err(Error::new(
            ErrorKind::Timeout,
            format!("{what}: deadline passed"),
        ));
    }
    Ok((deadline - now).max(std::time::Duration::from_millis(1)))
}

/// Writes all of `buf` on a blocking socket before `deadline`.
pub fn write_all_by(s: &mut TcpStream, buf: &[u8], deadline: Instant, what: &str) -> Result<()> {
    let mut off = 0;
    while off < buf.len() {
        s.set_write_timeout(Some(remaining(deadline, what)?))
            .map_err(|e| Error::io(what, &e))?;
        match s.write(&buf[off..]) {
            Ok(0) => {
                return Err(Error::new(
                    ErrorKind::PeerClosed,
                    format!("{what}: connection closed"),
                ))
            }
            Ok(n) => off += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io(what, &e)),
        }
    }
    Ok(())
}

/// Fills `buf` from a blocking socket before `deadline`.
pub fn read_exact_by(
    s: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
    what: &str,
) -> Result<()> {
    let mut off = 0;
    while off < buf.len() {
        s.set_read_timeout(Some(remaining(deadline, what)?))
            .map_err(|e| Error::io(what, &e))?;
        match s.read(&mut buf[off..]) {
            Ok(0) => {
                return Err(Error::new(
                    ErrorKind::PeerClosed,
                    format!(
                        "{what}: connection closed after {off} of {} bytes",
                        buf.len()
                    ),
                ))
            }
            Ok(n) => off += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io(what, &e)),
        }
    }
    Ok(())
}

/// Sends one frame: u32 length, then the payload.
pub fn send_frame(s: &mut TcpStream, payload: &[u8], deadline: Instant, what: &str) -> Result<()> {
    let len = u32::try_from(payload.len()).map_err(|_| {
        Error::invalid(format!(
            "{what}: frame of {} bytes too large",
            payload.len()
        ))
    })?;
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(payload);
    write_all_by(s, &buf, deadline, what)
}

/// Receives one frame of at most `max` bytes; a larger announced length is a protocol error,
/// checked before anything is allocated.
pub fn recv_frame(s: &mut TcpStream, max: usize, deadline: Instant, what: &str) -> Result<Vec<u8>> {
    let mut len = [0u8; 4];
    read_exact_by(s, &mut len, deadline, what)?;
    recv_frame_body(s, u32::from_le_bytes(len) as usize, max, deadline, what)
}

/// The payload of a frame whose length `len` was read already (at most `max` bytes).
pub fn recv_frame_body(
    s: &mut TcpStream,
    len: usize,
    max: usize,
    deadline: Instant,
    what: &str,
) -> Result<Vec<u8>> {
    if len > max {
        return Err(Error::new(
            ErrorKind::Protocol,
            format!("{what}: peer announced a {len}-byte frame, bound is {max}"),
        ));
    }
    let mut buf = vec![0u8; len];
    read_exact_by(s, &mut buf, deadline, what)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn reader_never_panics(data in proptest::collection::vec(any::<u8>(), 0..64), max in 0usize..32) {
            let mut r = Reader::new(&data, "fuzz");
            let _ = r.u8();
            let _ = r.bytes(max);
            let _ = r.u64();
            let _ = r.array::<16>();
            let _ = r.finish();
        }
    }

    #[test]
    fn bounded_bytes() {
        let mut w = Writer::default();
        w.bytes(&[1, 2, 3]);
        assert!(Reader::new(&w.buf, "t").bytes(2).is_err());
        assert_eq!(Reader::new(&w.buf, "t").bytes(3).unwrap(), &[1, 2, 3]);
    }
}
