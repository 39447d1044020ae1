//! The accepting side every socket-based transport shares: a non-blocking listener whose
//! handshakes (authentication, hello, transport setup) each run on a short-lived thread, so a
//! stranger who connects and stalls delays no real peer. Finished handshakes come back over a
//! channel; failed ones are logged and dropped.

use crate::{Error, ErrorKind, Result};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{channel, Receiver, Sender};

pub struct HandshakeListener<T> {
    listener: TcpListener,
    addr: SocketAddr,
    transport: &'static str,
    tx: Sender<T>,
    rx: Receiver<T>,
}

impl<T: Send + 'static> HandshakeListener<T> {
    /// Listens on an ephemeral port of `ip`; `transport` names it in errors and logs.
    pub fn bind(ip: IpAddr, transport: &'static str) -> Result<HandshakeListener<T>> {
        let io = |what: &str, e: std::io::Error| {
            Error::io(format!("{transport}: {what}"), &e).transport(transport)
        };
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))
            .map_err(|e| io(&format!("listen on {ip}"), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| io("listener", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| io("listener address", e))?;
        let (tx, rx) = channel();
        Ok(HandshakeListener {
            listener,
            addr,
            transport,
            tx,
            rx,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Starts a `shake` thread for every pending connection, then returns one finished
    /// handshake if there is one. Never blocks.
    pub fn poll<F>(&mut self, shake: &F) -> Option<T>
    where
        F: Fn(TcpStream) -> Result<T> + Clone + Send + 'static,
    {
        let t = self.transport;
        loop {
            match self.listener.accept() {
                Ok((stream, from)) => {
                    let (tx, shake) = (self.tx.clone(), shake.clone());
                    let spawned = std::thread::Builder::new()
                        .name(format!("railcc-{t}-accept"))
                        .spawn(move || match shake(stream) {
                            Ok(c) => {
                                let _ = tx.send(c);
                            }
                            // Ranks probe a peer's port to see it is alive (and close at once).
                            Err(e) if e.kind == ErrorKind::PeerClosed => {
                                tracing::debug!(
                                    "{t}: connection from {from} closed before its handshake: {e}"
                                )
                            }
                            Err(e) => tracing::warn!("{t}: refused connection from {from}: {e}"),
                        });
                    if let Err(e) = spawned {
                        tracing::warn!("{t}: could not spawn a handshake thread: {e}");
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::warn!("{t}: accept failed: {e}");
                    break;
                }
            }
        }
        self.rx.try_recv().ok()
    }
}
