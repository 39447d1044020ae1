//! The listening side. Handshakes run on short-lived threads so that a stranger who connects
//! and stalls cannot hold up real peers; streams are grouped by (rank, channel) until every
//! stream of a connection has arrived.

use crate::recv::TcpRecvComm;
use crate::sock::{tune, StreamHello, HELLO_BYTES, HELLO_FAILOVER};
use crate::{TcpRail, TcpSettings, NAME};
use railcc_core::auth::{verify_server, Secret};
use railcc_core::handshake::HandshakeListener;
use railcc_core::net::{ConnIdent, ConnectHandle, NetListener, NetRecvComm};
use railcc_core::wire::read_exact_by;
use railcc_core::{Error, Result};
use socket2::Socket;
use std::collections::HashMap;
use std::net::TcpStream;
use std::time::{Duration, Instant};

const HANDSHAKE_LIMIT: Duration = Duration::from_secs(5);

/// A stream that arrived: its socket, its hello, and the rail (listener) it came in on.
type Arrived = (Socket, StreamHello, usize);

/// One listener per rail; a connection's streams may arrive on any of them.
pub struct TcpListenerComm {
    hs: Vec<HandshakeListener<(StreamHello, TcpStream)>>,
    /// The rail each listener serves, by index.
    rails: Vec<String>,
    secret: Secret,
    settings: TcpSettings,
    partial: HashMap<ConnIdent, Vec<Option<Arrived>>>,
}

impl TcpListenerComm {
    pub fn bind(
        rails: &[TcpRail],
        secret: Secret,
        settings: TcpSettings,
    ) -> Result<TcpListenerComm> {
        Ok(TcpListenerComm {
            hs: rails
                .iter()
                .map(|r| HandshakeListener::bind(r.ip, NAME))
                .collect::<Result<_>>()?,
            rails: rails.iter().map(|r| r.name.clone()).collect(),
            secret,
            settings,
            partial: HashMap::new(),
        })
    }

    /// Files one authenticated stream with its connection; returns the connection once every
    /// stream of it has arrived.
    fn add_stream(
        &mut self,
        hello: StreamHello,
        stream: TcpStream,
        rail: usize,
    ) -> Result<Option<(ConnIdent, Box<dyn NetRecvComm>)>> {
        let n = hello.nstreams as usize;
        let group = self
            .partial
            .entry(hello.who)
            .or_insert_with(|| (0..n).map(|_| None).collect());
        if group.len() != n || group[hello.stream as usize].is_some() {
            tracing::warn!(
                "tcp: rank {} sent an inconsistent stream hello {hello:?}; dropped",
                hello.who.rank
            );
            return Ok(None);
        }
        let sock = Socket::from(stream);
        tune(&sock, self.settings.socket_buffer_bytes)?;
        group[hello.stream as usize] = Some((sock, hello, rail));
        if !group.iter().all(Option::is_some) {
            return Ok(None);
        }
        let group: Vec<Arrived> = self
            .partial
            .remove(&hello.who)
            .into_iter()
            .flatten()
            .flatten()
            .collect();
        let weights = group.iter().map(|g| g.1.weight).collect();
        let failover = group.iter().any(|g| g.1.flags & HELLO_FAILOVER != 0);
        let rails = group.iter().map(|g| self.rails[g.2].clone()).collect();
        let socks = group.into_iter().map(|g| g.0).collect();
        Ok(Some((
            hello.who,
            Box::new(TcpRecvComm::new(
                socks,
                weights,
                rails,
                failover,
                self.settings.clone(),
            )),
        )))
    }
}

impl NetListener for TcpListenerComm {
    fn handle(&self) -> ConnectHandle {
        let addrs: Vec<_> = self.hs.iter().map(|h| h.addr()).collect();
        ConnectHandle::from_addrs(&addrs)
    }

    fn accept(&mut self, deadline: Instant) -> Result<Option<(ConnIdent, Box<dyn NetRecvComm>)>> {
        let secret = self.secret;
        let shake = move |s: TcpStream| handshake(s, &secret);
        loop {
            for i in 0..self.hs.len() {
                while let Some((hello, stream)) = self.hs[i].poll(&shake) {
                    if let Some(c) = self.add_stream(hello, stream, i)? {
                        return Ok(Some(c));
                    }
                }
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }
}

fn handshake(mut s: TcpStream, secret: &Secret) -> Result<(StreamHello, TcpStream)> {
    s.set_nonblocking(false).map_err(|e| Error::io("tcp", &e))?;
    let deadline = Instant::now() + HANDSHAKE_LIMIT;
    verify_server(&mut s, secret, deadline)?;
    let mut b = [0u8; HELLO_BYTES];
    read_exact_by(&mut s, &mut b, deadline, "tcp stream hello")?;
    Ok((StreamHello::decode(&b)?, s))
}
