//! The listening side. Handshakes run on short-lived threads so that a stranger who connects
//! and stalls cannot hold up real peers; streams are grouped by (rank, channel) until every
//! stream of a connection has arrived.

use crate::recv::TcpRecvComm;
use crate::sock::{tune, StreamHello, HELLO_BYTES};
use crate::{TcpSettings, NAME};
use railcc_core::auth::{verify_server, Secret};
use railcc_core::handshake::HandshakeListener;
use railcc_core::net::{ConnIdent, ConnectHandle, NetListener, NetRecvComm};
use railcc_core::wire::read_exact_by;
use railcc_core::{Error, Result};
use socket2::Socket;
use std::collections::HashMap;
use std::net::{IpAddr, TcpStream};
use std::time::{Duration, Instant};

const HANDSHAKE_LIMIT: Duration = Duration::from_secs(5);

/// One listener per rail; a connection's streams may arrive on any of them.
pub struct TcpListenerComm {
    hs: Vec<HandshakeListener<(StreamHello, TcpStream)>>,
    secret: Secret,
    settings: TcpSettings,
    partial: HashMap<ConnIdent, Vec<Option<(Socket, u32)>>>,
}

impl TcpListenerComm {
    pub fn bind(ips: &[IpAddr], secret: Secret, settings: TcpSettings) -> Result<TcpListenerComm> {
        Ok(TcpListenerComm {
            hs: ips
                .iter()
                .map(|&ip| HandshakeListener::bind(ip, NAME))
                .collect::<Result<_>>()?,
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
        group[hello.stream as usize] = Some((sock, hello.weight));
        if !group.iter().all(Option::is_some) {
            return Ok(None);
        }
        let (socks, weights): (Vec<Socket>, Vec<u32>) = self
            .partial
            .remove(&hello.who)
            .into_iter()
            .flatten()
            .flatten()
            .unzip();
        Ok(Some((
            hello.who,
            Box::new(TcpRecvComm::new(socks, weights, self.settings.clone())),
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
                    if let Some(c) = self.add_stream(hello, stream)? {
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
