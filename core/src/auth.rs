//! The handshake that proves both ends of a connection know the job's 128-bit secret.
//!
//! Challenge-response with BLAKE3 in keyed mode, so the secret never crosses the wire:
//! ```text
//! client -> server  MAGIC | client_nonce(16)
//! server -> client  server_nonce(16) | mac("server", cn, sn)
//! client -> server  mac("client", cn, sn)
//! ```
//! A peer that fails gets `Unauthorized`; the caller drops the connection and carries on.
//! blake3 is used instead of a hand-written MAC: it is a well-kept crate with a keyed mode.

use crate::error::{Error, ErrorKind, Result};
use crate::wire::{read_exact_by, write_all_by};
use std::net::TcpStream;
use std::time::Instant;

const MAGIC: &[u8; 8] = b"RAILCC01";

/// The job secret, as carried by the unique id.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Secret(pub [u8; 16]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    pub fn random() -> Result<Secret> {
        let mut s = [0u8; 16];
        fill_random(&mut s)?;
        Ok(Secret(s))
    }

    fn mac(&self, role: &[u8], cn: &[u8; 16], sn: &[u8; 16]) -> blake3::Hash {
        let key = blake3::derive_key("railcc 2026 connection secret", &self.0);
        let mut h = blake3::Hasher::new_keyed(&key);
        h.update(role);
        h.update(cn);
        h.update(sn);
        h.finalize()
    }
}

pub fn fill_random(buf: &mut [u8]) -> Result<()> {
    getrandom::getrandom(buf)
        .map_err(|e| Error::new(ErrorKind::Io, format!("no randomness from the OS: {e}")))
}

/// Client side: run right after `connect`.
pub fn prove_client(s: &mut TcpStream, secret: &Secret, deadline: Instant) -> Result<()> {
    let mut cn = [0u8; 16];
    fill_random(&mut cn)?;
    let mut hello = Vec::with_capacity(24);
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&cn);
    write_all_by(s, &hello, deadline, "auth hello")?;
    let mut reply = [0u8; 48];
    read_exact_by(s, &mut reply, deadline, "auth challenge")?;
    let mut sn = [0u8; 16];
    sn.copy_from_slice(&reply[..16]);
    let mut got = [0u8; 32];
    got.copy_from_slice(&reply[16..]);
    if secret.mac(b"server", &cn, &sn) != blake3::Hash::from(got) {
        return Err(Error::new(
            ErrorKind::Unauthorized,
            "the server does not know this job's secret (wrong unique id?)",
        ));
    }
    write_all_by(
        s,
        secret.mac(b"client", &cn, &sn).as_bytes(),
        deadline,
        "auth response",
    )
}

/// Server side: run right after `accept`. Fails with `Unauthorized` for a stranger.
pub fn verify_server(s: &mut TcpStream, secret: &Secret, deadline: Instant) -> Result<()> {
    let mut hello = [0u8; 24];
    read_exact_by(s, &mut hello, deadline, "auth hello")?;
    if &hello[..8] != MAGIC {
        return Err(Error::new(
            ErrorKind::Unauthorized,
            "connection did not start with the railcc handshake",
        ));
    }
    let mut cn = [0u8; 16];
    cn.copy_from_slice(&hello[8..]);
    let mut sn = [0u8; 16];
    fill_random(&mut sn)?;
    let mut reply = Vec::with_capacity(48);
    reply.extend_from_slice(&sn);
    reply.extend_from_slice(secret.mac(b"server", &cn, &sn).as_bytes());
    write_all_by(s, &reply, deadline, "auth challenge")?;
    let mut got = [0u8; 32];
    read_exact_by(s, &mut got, deadline, "auth response")?;
    if secret.mac(b"client", &cn, &sn) != blake3::Hash::from(got) {
        return Err(Error::new(
            ErrorKind::Unauthorized,
            "peer failed to prove the job secret",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::time::Duration;

    fn pair(client_secret: Secret, server_secret: Secret) -> (Result<()>, Result<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let t = std::thread::spawn(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            prove_client(&mut c, &client_secret, deadline)
        });
        let (mut s, _) = l.accept().unwrap();
        let server = verify_server(&mut s, &server_secret, deadline);
        drop(s);
        (t.join().unwrap(), server)
    }

    #[test]
    fn same_secret_passes_both_ways() {
        let s = Secret::random().unwrap();
        let (c, v) = pair(s, s);
        c.unwrap();
        v.unwrap();
    }

    #[test]
    fn wrong_secret_is_refused() {
        let (c, v) = pair(Secret::random().unwrap(), Secret::random().unwrap());
        assert_eq!(c.unwrap_err().kind, ErrorKind::Unauthorized);
        assert!(v.is_err());
    }

    /// A stranger that answers the challenge with a guess (a client with the wrong secret
    /// hangs up before it answers, so `wrong_secret_is_refused` never reaches this check).
    #[test]
    fn a_guessed_response_is_refused() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            use std::io::{Read, Write};
            let mut c = TcpStream::connect(addr).unwrap();
            let mut hello = MAGIC.to_vec();
            hello.extend_from_slice(&[7u8; 16]);
            c.write_all(&hello).unwrap();
            let mut challenge = [0u8; 48];
            c.read_exact(&mut challenge).unwrap();
            c.write_all(&[0x5a; 32]).unwrap();
            let mut rest = Vec::new();
            let _ = c.read_to_end(&mut rest); // the server hangs up
        });
        let (mut s, _) = l.accept().unwrap();
        let e = verify_server(
            &mut s,
            &Secret::random().unwrap(),
            Instant::now() + Duration::from_secs(5),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unauthorized);
        assert!(e.message.contains("failed to prove"), "{e}");
        drop(s);
        t.join().unwrap();
    }

    #[test]
    fn garbage_is_refused_without_hanging() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            use std::io::Write;
            c.write_all(b"GET / HTTP/1.1\r\nHost: example\r\n\r\n")
                .unwrap();
            std::thread::sleep(Duration::from_millis(300));
        });
        let (mut s, _) = l.accept().unwrap();
        let e = verify_server(
            &mut s,
            &Secret::random().unwrap(),
            Instant::now() + Duration::from_secs(5),
        )
        .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unauthorized);
        t.join().unwrap();
    }
}
