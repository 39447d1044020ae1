//! One error type for the whole runtime. Every error says what kind of failure it is and, where
//! known, which rank saw it, which peer was involved, which operation and which transport.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The caller passed something unusable (short buffer, bad rank, bad root, bad config).
    InvalidArgument,
    /// Ranks disagree about a call: different collective, count, dtype, op or root.
    Mismatch,
    /// A wait passed its deadline.
    Timeout,
    /// A peer closed its connection or died.
    PeerClosed,
    /// A peer sent bytes that break the wire protocol.
    Protocol,
    /// A connection failed to prove it knows the job's secret.
    Unauthorized,
    /// An operating-system call failed.
    Io,
    /// The communicator was aborted, by the user or after an earlier error.
    Aborted,
    /// The feature or device is not available here.
    Unsupported,
}

impl ErrorKind {
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::Mismatch => "mismatch across ranks",
            ErrorKind::Timeout => "timeout",
            ErrorKind::PeerClosed => "peer closed",
            ErrorKind::Protocol => "protocol error",
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::Io => "I/O error",
            ErrorKind::Aborted => "aborted",
            ErrorKind::Unsupported => "unsupported",
        }
    }
}

/// The error. Context fields are filled in as the error travels up through the layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
    pub rank: Option<usize>,
    pub peer: Option<usize>,
    pub op: Option<String>,
    pub transport: Option<&'static str>,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
            rank: None,
            peer: None,
            op: None,
            transport: None,
        }
    }

    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidArgument, message)
    }

    /// A call refused because `cause` broke the communicator earlier (same kind).
    pub fn earlier(cause: &Error) -> Error {
        Error::new(
            cause.kind,
            format!("communicator is broken by an earlier error: {cause}"),
        )
    }

    pub fn io(what: impl fmt::Display, e: &std::io::Error) -> Error {
        let kind = match e.kind() {
            std::io::ErrorKind::UnexpectedEof
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::BrokenPipe => ErrorKind::PeerClosed,
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => ErrorKind::Timeout,
            _ => ErrorKind::Io,
        };
        Error::new(kind, format!("{what}: {e}"))
    }

    /// Sets the rank unless an inner layer already did.
    pub fn rank(mut self, rank: usize) -> Error {
        self.rank.get_or_insert(rank);
        self
    }

    pub fn peer(mut self, peer: usize) -> Error {
        self.peer.get_or_insert(peer);
        self
    }

    pub fn op(mut self, op: impl Into<String>) -> Error {
        if self.op.is_none() {
            self.op = Some(op.into());
        }
        self
    }

    pub fn transport(mut self, t: &'static str) -> Error {
        self.transport.get_or_insert(t);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "railcc {}", self.kind.name())?;
        let mut ctx = Vec::new();
        if let Some(r) = self.rank {
            ctx.push(format!("rank {r}"));
        }
        if let Some(p) = self.peer {
            ctx.push(format!("peer {p}"));
        }
        if let Some(o) = &self.op {
            ctx.push(format!("op {o}"));
        }
        if let Some(t) = self.transport {
            ctx.push(format!("transport {t}"));
        }
        if !ctx.is_empty() {
            write!(f, " ({})", ctx.join(", "))?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_carries_context() {
        let e = Error::new(ErrorKind::Timeout, "no data for 5 s")
            .rank(1)
            .peer(3)
            .op("all_reduce#7 step 2")
            .transport("tcp")
            .rank(9);
        assert_eq!(
            e.to_string(),
            "railcc timeout (rank 1, peer 3, op all_reduce#7 step 2, transport tcp): no data for 5 s"
        );
    }

    #[test]
    fn eof_is_peer_closed() {
        let io = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
        assert_eq!(Error::io("read", &io).kind, ErrorKind::PeerClosed);
    }
}
