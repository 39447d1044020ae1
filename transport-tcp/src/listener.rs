//! The listening side. Handshakes run on short-lived threads so that a stranger who connects
//! and stalls cannot hold up real peers; streams are grouped by (rank, channel) until every
//! stream of a connection has arrived.

use crate::recv::TcpRecvComm;
use crate::sock::{tune, StreamHello, HELLO_BYTES};
use crate::{TcpSettings, NAME};
use railcc_core::auth::{verify_server, Secret};
use railcc_core::net::{ConnIdent, ConnectHandle, NetListener, NetRecvComm};
use railcc_core::wire::read_exact_by;
use railcc_core::{Error, Result};
use socket2::Socket;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::{Duration, Instant};

const HANDSHAKE_LIMIT: Duration = Duration::from_secs(5);

pub struct TcpListenerComm {
    listener: TcpListener,
    addr: SocketAddr,
    secret: Secret,
    settings: TcpSettings,
    tx: Sender<(StreamHello, TcpStream)>,
    rx: Receiver<(StreamHello, TcpStream)>,
    partial: HashMap<ConnIdent, Vec<Option<Socket>>>,
}

impl TcpListenerComm {
    pub fn bind(ip: IpAddr, secret: Secret, settings: TcpSettings) -> Result<TcpListenerComm> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))
            .map_err(|e| Error::io(format!("tcp: listen on {ip}"), &e).transport(NAME))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("tcp: listener", &e).transport(NAME))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("tcp: listener address", &e).transport(NAME))?;
        let (tx, rx) = channel();
        Ok(TcpListenerComm {
            listener,
            addr,
            secret,
            settings,
            tx,
            rx,
            partial: HashMap::new(),
        })
    }

    fn take_handshakes(&mut self) -> Result<Option<(ConnIdent, Box<dyn NetRecvComm>)>> {
        while let Ok((hello, stream)) = self.rx.try_recv() {
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
                continue;
            }
            let sock = Socket::from(stream);
            tune(&sock, self.settings.socket_buffer_bytes)?;
            group[hello.stream as usize] = Some(sock);
            if group.iter().all(Option::is_some) {
                let socks: Vec<Socket> = self
                    .partial
                    .remove(&hello.who)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .collect();
                return Ok(Some((
                    hello.who,
                    Box::new(TcpRecvComm::new(socks, self.settings.clone())),
                )));
            }
        }
        Ok(None)
    }
}

impl NetListener for TcpListenerComm {
    fn handle(&self) -> ConnectHandle {
        ConnectHandle::from_addr(self.addr)
    }

    fn accept(&mut self, deadline: Instant) -> Result<Option<(ConnIdent, Box<dyn NetRecvComm>)>> {
        loop {
            match self.listener.accept() {
                Ok((stream, from)) => {
                    let (tx, secret) = (self.tx.clone(), self.secret);
                    let spawned = std::thread::Builder::new()
                        .name("railcc-tcp-auth".into())
                        .spawn(move || match handshake(stream, &secret) {
                            Ok((hello, s)) => {
                                let _ = tx.send((hello, s));
                            }
                            Err(e) => tracing::warn!("tcp: refused connection from {from}: {e}"),
                        });
                    if let Err(e) = spawned {
                        tracing::warn!("tcp: could not spawn a handshake thread: {e}");
                    }
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => tracing::warn!("tcp: accept failed: {e}"),
            }
            if let Some(c) = self.take_handshakes()? {
                return Ok(Some(c));
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
