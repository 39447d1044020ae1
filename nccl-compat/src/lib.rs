//! railcc behind NCCL's C API: `libnccl.so.2` for programs built against NCCL (nccl-tests,
//! PyTorch's ProcessGroupNCCL). Every GPU buffer goes through railcc's one GPU communicator
//! (`railcc_collectives::gpu::GpuComm`), whose `Placement::choose` picks the path: every rank
//! in this process (the clique below drives them all), one per process on one host (CUDA IPC),
//! or across hosts (the network engine, the hierarchy). What we do not implement returns ncclInvalidUsage
//! with ncclGetLastError saying why; nothing returns a false success.
//!
//! - `abi`: NCCL's numbering, the unique id and the config head;
//! - `clique`: the rendezvous of the ranks' separate calls into one launch;
//! - `group`: the calls held between ncclGroupStart and End;
//! - `proc_backend`: joining over the bootstrap and choosing the path;
//! - `premul`: premultiplied sums (a scale kernel, then a plain sum);
//! - the entry points by concern: `init` (ids, init, split, destroy), `coll` (collectives),
//!   `p2p` (groups, send/recv, all-to-all), `memory`, `errors` (versions, errors, what is not
//!   implemented). This file holds the communicator and error reporting (the dispatch of a
//!   call to its backend is `coll`'s `submit`).

pub mod abi;
mod clique;
mod coll;
mod errors;
mod group;
mod init;
mod memory;
mod p2p;
mod premul;
mod proc_backend;
mod split;

/// Where a communicator's ranks live.
enum Backend {
    /// All in this process: the clique's rendezvous, then one launch for every rank.
    Local(Arc<Clique>),
    /// One per process (torchrun style): railcc's GPU communicator (peer access by CUDA IPC
    /// on one host; the network, or a hierarchy of both, across hosts).
    Gpu(Box<GpuRank>),
}

use abi::*;
use clique::{Call, Clique, Ticket};
use parking_lot::Mutex;
use proc_backend::GpuRank;
use railcc_core::call::CollKind;
use railcc_core::{Error, ErrorKind};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// An ncclComm_t.
pub struct Comm {
    /// Set once init completes (at once, or at ncclGroupEnd).
    backend: OnceLock<Backend>,
    /// The bootstrap's connections, open for the communicator's life (dropped after the
    /// backend): ncclCommSplit exchanges colors and ids over them.
    boot: OnceLock<railcc_collectives::Communicator>,
    rank: usize,
    nranks: usize,
    device: i32,
    /// Collective calls made so far (the rendezvous slot of the next one).
    seq: AtomicU64,
    /// Messages so far per (peer, is_send).
    p2p_seq: Mutex<HashMap<(usize, bool), u64>>,
    /// A failure that leaves the ranks out of step (a timeout): every later call returns it.
    broken: Mutex<Option<Error>>,
    /// Premultiplied-sum ops made on this communicator, and their scratch.
    user_ops: premul::UserOps,
    /// A non-blocking init (`config.blocking = 0`) still joining on its own thread.
    joining: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// What its ncclConfig_t asked for (defaults without one).
    config: abi::CommConfig,
}

impl Comm {
    /// Whether a non-blocking init is still joining the ranks.
    fn init_in_progress(&self) -> bool {
        self.joining
            .lock()
            .as_ref()
            .is_some_and(|h| !h.is_finished())
    }

    /// The number of the next message to (send) or from `peer`, from 0; both ends count alike.
    fn next_p2p_seq(&self, peer: usize, send: bool) -> u64 {
        let mut m = self.p2p_seq.lock();
        let s = m.entry((peer, send)).or_insert(0);
        *s += 1;
        *s - 1
    }

    /// `e` naming this communicator (config.commName) when it has a name, as NCCL's log lines.
    fn named(&self, e: Error) -> Error {
        match &self.config.comm_name {
            Some(n) => Error {
                message: format!("[{n}] {}", e.message),
                ..e
            },
            None => e,
        }
    }

    /// Waits for a non-blocking init to end (calls made before it did wait here).
    fn wait_init(&self) {
        let h = self.joining.lock().take();
        if let Some(h) = h {
            let _ = h.join();
        }
    }
}

static LAST_ERROR: Mutex<String> = Mutex::new(String::new());
thread_local! {
    static LAST_ERROR_C: std::cell::RefCell<CString> = std::cell::RefCell::new(CString::default());
}

/// libnccl's message level (NCCL_DEBUG or RAILCC_DEBUG), read once: errors may be frequent.
pub(crate) fn debug() -> railcc_core::config::DebugLevel {
    static LEVEL: std::sync::OnceLock<railcc_core::config::DebugLevel> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(railcc_core::Config::debug_level)
}

/// Writes one of libnccl's messages (`NCCL WARN ...`, `NCCL INFO ...`) where NCCL_DEBUG_FILE
/// (RAILCC_DEBUG_FILE) says, %h the host name and %p the process id, else to stderr.
pub(crate) fn log_line(msg: &str) {
    use std::io::Write;
    static FILE: OnceLock<Option<Mutex<std::fs::File>>> = OnceLock::new();
    let file = FILE.get_or_init(|| {
        let path = railcc_core::Config::debug_file_path()?;
        match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            Ok(f) => Some(Mutex::new(f)),
            Err(e) => {
                eprintln!("NCCL WARN railcc: cannot open NCCL_DEBUG_FILE {path}: {e}");
                None
            }
        }
    });
    match file {
        Some(f) => {
            let _ = writeln!(f.lock(), "{msg}");
        }
        None => eprintln!("{msg}"),
    }
}

/// At NCCL_DEBUG=INFO, routes railcc's own info and warning events (the way each buffer
/// reaches peers, bounce buffers, dead peers) into libnccl's messages; once per process, and
/// only where the program has no tracing subscriber of its own. `RAILCC_LOG` (a tracing
/// filter, as for the `railcc` binary) instead writes the events it selects to stderr,
/// timestamped, whatever NCCL_DEBUG says: for debugging railcc under a program.
pub(crate) fn route_events() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = railcc_core::config::log_filter()
            .and_then(|f| tracing_subscriber::EnvFilter::try_new(f).ok());
        if let Some(f) = filter {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(f)
                .with_ansi(false)
                .with_writer(std::io::stderr)
                .try_init();
        } else if debug().informs() {
            let _ = tracing_subscriber::fmt()
                .with_max_level(tracing::Level::INFO)
                .without_time()
                .with_target(false)
                .with_level(false)
                .with_ansi(false)
                .with_writer(|| EventLines(Vec::new()))
                .try_init();
        }
    });
}

/// One formatted event, written out as NCCL INFO lines when dropped.
struct EventLines(Vec<u8>);

impl std::io::Write for EventLines {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for EventLines {
    fn drop(&mut self) {
        for line in String::from_utf8_lossy(&self.0).lines() {
            let line = line.trim();
            if !line.is_empty() {
                log_line(&format!("NCCL INFO railcc: {line}"));
            }
        }
    }
}

/// Records `e` for ncclGetLastError (and stderr at NCCL_DEBUG=WARN and above) and returns its
/// code.
fn fail(e: &Error) -> NcclResult {
    let msg = e.to_string();
    if debug().warns() {
        log_line(&format!("NCCL WARN {msg}"));
    }
    let code = result_of(e.kind, &msg);
    *LAST_ERROR.lock() = msg;
    code
}

/// As [`fail`] for an asynchronous error (ncclCommGetAsyncError, polled in a loop): recorded
/// and warned once, not on every poll.
fn fail_async(e: &Error) -> NcclResult {
    let msg = e.to_string();
    let mut last = LAST_ERROR.lock();
    if *last != msg {
        if debug().warns() {
            log_line(&format!("NCCL WARN {msg}"));
        }
        *last = msg.clone();
    }
    result_of(e.kind, &msg)
}

fn usage(msg: impl Into<String>) -> NcclResult {
    let msg = Error::new(ErrorKind::Unsupported, msg.into()).to_string();
    if debug().warns() {
        log_line(&format!("NCCL WARN {msg}"));
    }
    *LAST_ERROR.lock() = msg;
    INVALID_USAGE
}

fn invalid(msg: impl Into<String>) -> NcclResult {
    fail(&Error::new(ErrorKind::InvalidArgument, msg.into()))
}

/// railcc's configuration from the RAILCC_* variables, or the NCCL ones that map to them
/// (`railcc_core::nccl_env`; `railcc config` lists both). Waits have no deadline unless
/// RAILCC_TIMEOUT_MS is set, as NCCL's (`Config::from_env_waiting`).
pub(crate) fn config() -> Result<railcc_core::Config, Error> {
    railcc_core::Config::from_env_waiting()
}

/// The deadline of every wait: none unless RAILCC_TIMEOUT_MS is set.
fn timeout() -> Duration {
    config().map_or(
        Duration::from_millis(railcc_core::config::NO_DEADLINE_MS),
        |c| c.timeout(),
    )
}

/// The CUDA device current on this thread (cudaSetDevice makes its primary context current),
/// or 0 as cudaGetDevice says when none is; an error without a driver.
fn current_device() -> Result<i32, Error> {
    railcc_cuda::driver::current_device()
}

fn with_comm<T>(
    comm: *const Comm,
    what: &str,
    f: impl FnOnce(&Comm) -> T,
) -> Result<T, NcclResult> {
    // SAFETY: NCCL's contract: a handle from an init call, not yet destroyed (or NULL).
    match unsafe { comm.as_ref() } {
        Some(c) => Ok(f(c)),
        None => Err(invalid(format!("{what}: comm is NULL"))),
    }
}
