//! railcc behind NCCL's C API: `libnccl.so.2` for programs built against NCCL (nccl-tests,
//! PyTorch's ProcessGroupNCCL). Every rank of a communicator runs in this process, one GPU
//! each (ncclCommInitAll, or ncclCommInitRank from one thread in a group or from several
//! threads); collectives run on railcc's multi-GPU kernels (transport-nvlink), send/recv as
//! stream-ordered copies. What we do not implement returns ncclInvalidUsage with
//! ncclGetLastError saying why; nothing returns a false success.
//!
//! - `abi`: NCCL's numbering, the unique id and the config head;
//! - `clique`: the rendezvous of the ranks' separate calls into one launch;
//! - `gpus`: the launches and copies;
//! - `group`: ncclGroupStart/End.

pub mod abi;
mod clique;
mod gpus;
mod group;
mod proc_backend;

/// Where a communicator's ranks live.
enum Backend {
    /// All in this process: the clique's rendezvous and the multi-GPU kernels.
    Local(Arc<Clique>),
    /// One per process (torchrun style): railcc's per-process GPU path (CUDA IPC).
    Proc(Box<ProcRank>),
    /// One per process on several hosts: the stream-ordered network engine.
    Net(Box<NetRank>),
}

use abi::*;
use clique::{Call, Clique, Half, Ticket};
use cudarc::driver::sys;
use parking_lot::Mutex;
use proc_backend::{NetRank, ProcRank};
use railcc_core::net::CollKind;
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
    rank: usize,
    nranks: usize,
    device: i32,
    /// Collective calls made so far (the rendezvous slot of the next one).
    seq: AtomicU64,
    /// Messages so far per (peer, is_send).
    p2p_seq: Mutex<HashMap<(usize, bool), u64>>,
    /// A failure that leaves the ranks out of step (a timeout): every later call returns it.
    broken: Mutex<Option<Error>>,
}

static LAST_ERROR: Mutex<String> = Mutex::new(String::new());
thread_local! {
    static LAST_ERROR_C: std::cell::RefCell<CString> = std::cell::RefCell::new(CString::default());
}

/// Records `e` for ncclGetLastError (and stderr under NCCL_DEBUG) and returns its code.
fn fail(e: &Error) -> NcclResult {
    let msg = e.to_string();
    if std::env::var_os("NCCL_DEBUG").is_some() {
        eprintln!("NCCL WARN {msg}");
    }
    let code = result_of(e.kind, &msg);
    *LAST_ERROR.lock() = msg;
    code
}

fn usage(msg: impl Into<String>) -> NcclResult {
    let msg = Error::new(ErrorKind::Unsupported, msg.into()).to_string();
    if std::env::var_os("NCCL_DEBUG").is_some() {
        eprintln!("NCCL WARN {msg}");
    }
    *LAST_ERROR.lock() = msg;
    INVALID_USAGE
}

fn invalid(msg: impl Into<String>) -> NcclResult {
    fail(&Error::new(ErrorKind::InvalidArgument, msg.into()))
}

/// railcc's configuration from the RAILCC_* variables (`railcc config` lists them).
pub(crate) fn config() -> Result<railcc_core::Config, Error> {
    railcc_core::Config::default().apply_vars(|k| {
        std::env::var(k)
            .ok()
            .or_else(|| nccl_alias(k).and_then(|n| std::env::var(n).ok()))
    })
}

/// The NCCL variable a railcc setting falls back to when the RAILCC_ one is unset.
fn nccl_alias(railcc: &str) -> Option<&'static str> {
    Some(match railcc {
        "RAILCC_HOSTID" => "NCCL_HOSTID",
        "RAILCC_SOCKET_IFNAME" => "NCCL_SOCKET_IFNAME",
        "RAILCC_IB_HCA" => "NCCL_IB_HCA",
        _ => return None,
    })
}

/// The deadline of every wait (RAILCC_TIMEOUT_MS).
fn timeout() -> Duration {
    config().map_or(Duration::from_secs(60), |c| c.timeout())
}

/// The CUDA device current on this thread (cudaSetDevice makes its primary context current),
/// or 0 as cudaGetDevice says when none is; an error without a driver.
fn current_device() -> Result<i32, Error> {
    railcc_transport_nvlink::driver::available()?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the driver is initialized.
    unsafe { sys::cuCtxGetCurrent(&mut ctx) };
    if ctx.is_null() {
        return Ok(0);
    }
    let mut d: sys::CUdevice = 0;
    // SAFETY: a context is current; valid out-pointer.
    let r = unsafe { sys::cuCtxGetDevice(&mut d) };
    railcc_transport_nvlink::driver::check(r, "cuCtxGetDevice")?;
    Ok(d)
}

// ---------------------------------------------------------------- version, errors, ids

/// # Safety
/// `version` must be NULL or point to an int.
#[no_mangle]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> NcclResult {
    // SAFETY: the caller passes NULL or a valid pointer.
    match unsafe { version.as_mut() } {
        Some(v) => {
            *v = VERSION_CODE;
            SUCCESS
        }
        None => invalid("ncclGetVersion: version is NULL"),
    }
}

#[no_mangle]
pub extern "C" fn ncclGetErrorString(result: NcclResult) -> *const c_char {
    error_string(result).as_ptr()
}

/// The last error's details. The string stays valid until this thread calls it again.
#[no_mangle]
pub extern "C" fn ncclGetLastError(_comm: *mut Comm) -> *const c_char {
    let msg = LAST_ERROR.lock().clone();
    LAST_ERROR_C.with(|c| {
        *c.borrow_mut() = CString::new(msg.replace('\0', " ")).unwrap_or_default();
        c.borrow().as_ptr()
    })
}

/// Starts the bootstrap root (on loopback: a communicator's ranks share this host) and
/// returns its address and secret as the id, as NCCL's does.
///
/// # Safety
/// `id` must be NULL or point to 128 writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ncclGetUniqueId(id: *mut UniqueId) -> NcclResult {
    // SAFETY: the caller passes NULL or a valid pointer.
    let Some(id) = (unsafe { id.as_mut() }) else {
        return invalid("ncclGetUniqueId: uniqueId is NULL");
    };
    let ifname = config().map(|c| c.socket_ifname).unwrap_or_default();
    match proc_backend::serve_root(timeout(), &ifname) {
        Ok(boot) => {
            *id = UniqueId {
                internal: boot.to_bytes(),
            };
            SUCCESS
        }
        Err(e) => fail(&e),
    }
}

// ---------------------------------------------------------------- communicators

fn init_rank(
    out: *mut *mut Comm,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
    _max_ctas: Option<usize>,
) -> NcclResult {
    if out.is_null() {
        return invalid("ncclCommInitRank: comm is NULL");
    }
    let boot_id = match railcc_core::bootstrap::UniqueId::from_bytes(&id.internal) {
        Ok(b) => b,
        Err(_) => {
            return invalid("ncclCommInitRank: this ncclUniqueId was not made by ncclGetUniqueId")
        }
    };
    if nranks < 1 || rank < 0 || rank >= nranks {
        return invalid(format!(
            "ncclCommInitRank: rank {rank} of {nranks} ranks is out of range"
        ));
    }
    let device = match current_device() {
        Ok(d) => d,
        Err(e) => return fail(&e),
    };
    // config.maxCTAs is not applied: blocks per GPU are one setting for the whole
    // communicator (RAILCC_GPU_MAX_BLOCKS), since every rank's kernel waits for the others'.
    let comm = Box::into_raw(Box::new(Comm::new(rank as usize, nranks as usize, device)));
    // SAFETY: checked non-NULL; NCCL hands the handle back even before init completes.
    unsafe { *out = comm };
    if group::in_group() {
        group::defer(group::Pending::Init(comm, boot_id));
        return SUCCESS;
    }
    finish_init(comm, &boot_id)
}

impl Comm {
    fn new(rank: usize, nranks: usize, device: i32) -> Comm {
        Comm {
            backend: OnceLock::new(),
            rank,
            nranks,
            device,
            seq: AtomicU64::new(0),
            p2p_seq: Mutex::new(HashMap::new()),
            broken: Mutex::new(None),
        }
    }
}

/// Joins the ranks over railcc's bootstrap (TCP, as NCCL's), learns where they live, and
/// opens the GPU path that fits: the clique when every rank is in this process, the
/// per-process path when each has its own.
fn finish_init(comm: *const Comm, id: &railcc_core::bootstrap::UniqueId) -> NcclResult {
    // SAFETY: `comm` came from Box::into_raw in init_rank and is not destroyed before init
    // returns (NCCL's contract).
    let c = unsafe { &*comm };
    let r = proc_backend::connect(id, c.rank, c.nranks, c.device, timeout());
    match r {
        Ok(b) => {
            if std::env::var("NCCL_DEBUG").is_ok_and(|v| v.eq_ignore_ascii_case("INFO")) {
                let path = match &b {
                    Backend::Local(_) => "every rank in this process, multi-GPU kernels",
                    Backend::Proc(_) => "one rank per process, peers by CUDA IPC",
                    Backend::Net(n) => n.net.describe(),
                };
                eprintln!(
                    "NCCL INFO railcc libnccl {VERSION_STRING}: rank {} of {} on CUDA device {}: {path}",
                    c.rank, c.nranks, c.device
                );
            }
            let _ = c.backend.set(b);
            SUCCESS
        }
        Err(e) => {
            let e = e.rank(c.rank).op("ncclCommInitRank");
            *c.broken.lock() = Some(e.clone());
            fail(&e)
        }
    }
}

/// # Safety
/// `comm` must be NULL or point to a writable ncclComm_t.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut *mut Comm,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
) -> NcclResult {
    init_rank(comm, nranks, id, rank, None)
}

/// # Safety
/// `comm` must be NULL or point to a writable ncclComm_t; `config` NULL or an ncclConfig_t
/// made with NCCL_CONFIG_INITIALIZER.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    comm: *mut *mut Comm,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
    config: *const ConfigHead,
) -> NcclResult {
    // SAFETY: the caller passes NULL or a valid config; only its head is read, after its size
    // says the head is there.
    let max_ctas = match unsafe { config.as_ref() } {
        None => None,
        Some(c) if c.magic != CONFIG_MAGIC => {
            return invalid(
                "ncclCommInitRankConfig: config was not made with NCCL_CONFIG_INITIALIZER",
            );
        }
        Some(c) if c.size >= std::mem::size_of::<ConfigHead>() && c.max_ctas > 0 => {
            Some(c.max_ctas as usize)
        }
        Some(_) => None,
    };
    // Non-blocking configs (blocking = 0) are served blocking: calls return ncclSuccess once
    // done, which such callers accept as well as ncclInProgress.
    init_rank(comm, nranks, id, rank, max_ctas)
}

/// # Safety
/// `comms` must hold `ndev` writable handles; `devlist` NULL or `ndev` ints.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitAll(
    comms: *mut *mut Comm,
    ndev: c_int,
    devlist: *const c_int,
) -> NcclResult {
    if comms.is_null() || ndev < 1 {
        return invalid(format!("ncclCommInitAll: comms NULL or ndev {ndev} < 1"));
    }
    let mut key = [0u8; 16];
    if let Err(e) = getrandom::getrandom(&mut key) {
        return fail(&Error::new(
            ErrorKind::Io,
            format!("ncclCommInitAll: no randomness: {e}"),
        ));
    }
    if let Err(e) = railcc_transport_nvlink::driver::available() {
        return fail(&e);
    }
    let clique = match Clique::get(key, ndev as usize, timeout()) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    for r in 0..ndev as usize {
        // SAFETY: devlist is NULL or holds ndev ints (the caller's contract).
        let dev = if devlist.is_null() {
            r as i32
        } else {
            unsafe { *devlist.add(r) }
        };
        if let Err(e) = clique.join(r, dev) {
            return fail(&e);
        }
    }
    if let Err(e) = clique.ready() {
        Clique::unregister(&key);
        return fail(&e);
    }
    Clique::unregister(&key);
    for r in 0..ndev as usize {
        let device = if devlist.is_null() {
            r as i32
        } else {
            // SAFETY: as above.
            unsafe { *devlist.add(r) }
        };
        let comm = Comm::new(r, ndev as usize, device);
        let _ = comm.backend.set(Backend::Local(clique.clone()));
        let c = Box::into_raw(Box::new(comm));
        // SAFETY: comms holds ndev handles.
        unsafe { *comms.add(r) = c };
    }
    SUCCESS
}

/// # Safety
/// `comm` must be NULL or a live communicator, not used again after this.
#[no_mangle]
pub unsafe extern "C" fn ncclCommDestroy(comm: *mut Comm) -> NcclResult {
    if comm.is_null() {
        return invalid("ncclCommDestroy: comm is NULL");
    }
    // SAFETY: made by Box::into_raw; the caller gives it up.
    drop(unsafe { Box::from_raw(comm) });
    SUCCESS
}

/// # Safety
/// As for ncclCommDestroy.
#[no_mangle]
pub unsafe extern "C" fn ncclCommAbort(comm: *mut Comm) -> NcclResult {
    // SAFETY: NULL or a live communicator (NCCL's contract).
    if let Some(Backend::Net(n)) = unsafe { comm.as_ref() }.and_then(|c| c.backend.get()) {
        // Streams waiting on the network are let go at once instead of at the deadline.
        n.net.abort();
    }
    // SAFETY: forwarded.
    unsafe { ncclCommDestroy(comm) }
}

/// Nothing is held back between calls, so there is nothing to flush.
#[no_mangle]
pub extern "C" fn ncclCommFinalize(comm: *mut Comm) -> NcclResult {
    if comm.is_null() {
        return invalid("ncclCommFinalize: comm is NULL");
    }
    SUCCESS
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

/// # Safety
/// `comm` a live communicator or NULL; `out` NULL or a writable int.
#[no_mangle]
pub unsafe extern "C" fn ncclCommGetAsyncError(
    comm: *mut Comm,
    out: *mut NcclResult,
) -> NcclResult {
    let r = match with_comm(comm, "ncclCommGetAsyncError", |c| {
        c.broken.lock().clone().or_else(|| match c.backend.get() {
            Some(Backend::Net(n)) => n.net.async_error(),
            _ => None,
        })
    }) {
        Ok(b) => b.map_or(SUCCESS, |e| result_of(e.kind, &e.to_string())),
        Err(code) => return code,
    };
    // SAFETY: NULL or writable.
    match unsafe { out.as_mut() } {
        Some(o) => {
            *o = r;
            SUCCESS
        }
        None => invalid("ncclCommGetAsyncError: asyncError is NULL"),
    }
}

macro_rules! comm_getter {
    ($name:ident, $field:expr) => {
        /// # Safety
        /// `comm` a live communicator or NULL; `out` NULL or a writable int.
        #[no_mangle]
        pub unsafe extern "C" fn $name(comm: *const Comm, out: *mut c_int) -> NcclResult {
            let v = match with_comm(comm, stringify!($name), $field) {
                Ok(v) => v,
                Err(code) => return code,
            };
            // SAFETY: NULL or writable.
            match unsafe { out.as_mut() } {
                Some(o) => {
                    *o = v;
                    SUCCESS
                }
                None => invalid(concat!(stringify!($name), ": output is NULL")),
            }
        }
    };
}
comm_getter!(ncclCommCount, |c: &Comm| c.nranks as c_int);
comm_getter!(ncclCommCuDevice, |c: &Comm| c.device);
comm_getter!(ncclCommUserRank, |c: &Comm| c.rank as c_int);

/// NCCL_SPLIT_NOCOLOR leaves the rank out (newcomm NULL); real splits are not implemented.
///
/// # Safety
/// `newcomm` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclCommSplit(
    comm: *mut Comm,
    color: c_int,
    _key: c_int,
    newcomm: *mut *mut Comm,
    _config: *const ConfigHead,
) -> NcclResult {
    if comm.is_null() || newcomm.is_null() {
        return invalid("ncclCommSplit: comm or newcomm is NULL");
    }
    if color == -1 {
        // SAFETY: checked non-NULL.
        unsafe { *newcomm = std::ptr::null_mut() };
        return SUCCESS;
    }
    usage("ncclCommSplit: splitting a communicator is not implemented in railcc's libnccl")
}

// ---------------------------------------------------------------- memory

/// Device memory on the current device (cuMemAlloc; NCCL uses cuMem* for the same purpose).
///
/// # Safety
/// `ptr` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> NcclResult {
    if ptr.is_null() {
        return invalid("ncclMemAlloc: ptr is NULL");
    }
    if let Err(e) = current_device() {
        return fail(&e);
    }
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: valid out-pointer; the current context (cudaSetDevice's primary context) owns it.
    let r = unsafe { sys::cuMemAlloc_v2(&mut p, size.max(1)) };
    if let Err(e) = railcc_transport_nvlink::driver::check(r, "cuMemAlloc") {
        return fail(&e);
    }
    // SAFETY: checked non-NULL.
    unsafe { *ptr = p as *mut c_void };
    SUCCESS
}

/// # Safety
/// `ptr` from ncclMemAlloc.
#[no_mangle]
pub unsafe extern "C" fn ncclMemFree(ptr: *mut c_void) -> NcclResult {
    if ptr.is_null() {
        return SUCCESS;
    }
    // SAFETY: the caller passes memory from ncclMemAlloc.
    let r = unsafe { sys::cuMemFree_v2(ptr as sys::CUdeviceptr) };
    match railcc_transport_nvlink::driver::check(r, "cuMemFree") {
        Ok(()) => SUCCESS,
        Err(e) => fail(&e),
    }
}

/// Registration is a hint: railcc's GPU kernels reach peers' buffers without it. The handle is
/// the buffer's address.
///
/// # Safety
/// `handle` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclCommRegister(
    comm: *const Comm,
    buff: *mut c_void,
    _size: usize,
    handle: *mut *mut c_void,
) -> NcclResult {
    if comm.is_null() || handle.is_null() {
        return invalid("ncclCommRegister: comm or handle is NULL");
    }
    // SAFETY: checked non-NULL.
    unsafe { *handle = buff };
    SUCCESS
}

#[no_mangle]
pub extern "C" fn ncclCommDeregister(comm: *const Comm, _handle: *mut c_void) -> NcclResult {
    if comm.is_null() {
        return invalid("ncclCommDeregister: comm is NULL");
    }
    SUCCESS
}

/// Premultiplied sums are not implemented (we report NCCL 2.10, before them).
#[no_mangle]
pub extern "C" fn ncclRedOpCreatePreMulSum(
    _op: *mut c_int,
    _scalar: *mut c_void,
    _dtype: c_int,
    _residence: c_int,
    _comm: *mut Comm,
) -> NcclResult {
    usage("ncclRedOpCreatePreMulSum: premultiplied sums are not implemented in railcc's libnccl")
}

#[no_mangle]
pub extern "C" fn ncclRedOpDestroy(op: c_int, _comm: *mut Comm) -> NcclResult {
    if red_op(op).is_some() {
        return invalid(format!("ncclRedOpDestroy: op {op} is a built-in operation"));
    }
    usage("ncclRedOpDestroy: no user-defined ops exist in railcc's libnccl")
}

// ---------------------------------------------------------------- groups

#[no_mangle]
pub extern "C" fn ncclGroupStart() -> NcclResult {
    group::start();
    SUCCESS
}

#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> NcclResult {
    let pending = match group::end() {
        Ok(Some(p)) => p,
        Ok(None) => return SUCCESS,
        Err(()) => return usage("ncclGroupEnd without ncclGroupStart"),
    };
    let mut first = SUCCESS;
    let mut note = |r: NcclResult| {
        if first == SUCCESS {
            first = r;
        }
    };
    // Inits first, all at once: each blocks in the bootstrap until every rank arrives, and
    // this thread may hold several ranks.
    let inits: Vec<(usize, railcc_core::bootstrap::UniqueId)> = pending
        .iter()
        .filter_map(|p| match p {
            group::Pending::Init(c, id) => Some((*c as usize, *id)),
            _ => None,
        })
        .collect();
    let results: Vec<NcclResult> = std::thread::scope(|s| {
        let hs: Vec<_> = inits
            .iter()
            // The handle crosses as an address: it stays valid (NCCL's contract) and only
            // finish_init reads it.
            .map(|(c, id)| s.spawn(move || finish_init(*c as *const Comm, id)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or(INTERNAL_ERROR))
            .collect()
    });
    for r in results {
        note(r);
    }
    let mut tickets: Vec<(*const Comm, Ticket)> = Vec::new();
    let mut p2ps = Vec::new();
    for p in pending {
        match p {
            group::Pending::Init(..) => {}
            group::Pending::Coll(c, call) => match submit(c, call) {
                Ok(t) => tickets.push((c, t)),
                Err(r) => note(r),
            },
            group::Pending::P2p(c, peer, send, h) => p2ps.push((c, peer, send, h)),
        }
    }
    // Sends and receives after the collectives. On the per-process path each runs as a
    // broadcast rooted at the sender, so every rank must take them in the same order: by
    // sending rank (program order kept among one sender's messages); a rank's messages to
    // itself are copies.
    p2ps.sort_by_key(|&(c, peer, send, _)| {
        // SAFETY: handles in a group are live (NCCL's contract).
        let me = unsafe { (*c).rank };
        if send {
            me
        } else {
            peer
        }
    });
    let mut self_sends: HashMap<usize, std::collections::VecDeque<Half>> = HashMap::new();
    let mut self_recvs: Vec<(*const Comm, Half)> = Vec::new();
    // Across hosts a communicator's sends and receives of the group are one engine call.
    let mut net_groups: Vec<(*const Comm, Vec<NetP2p>)> = Vec::new();
    for (c, peer, send, h) in p2ps {
        // SAFETY: handles in a group are live (NCCL's contract).
        if matches!(unsafe { (*c).backend.get() }, Some(Backend::Net(_))) {
            match net_groups.iter_mut().find(|g| std::ptr::eq(g.0, c)) {
                Some(g) => g.1.push((peer, send, h)),
                None => net_groups.push((c, vec![(peer, send, h)])),
            }
            continue;
        }
        // SAFETY: as above.
        let (me, proc_path) = unsafe {
            (
                (*c).rank,
                matches!((*c).backend.get(), Some(Backend::Proc(_))),
            )
        };
        if proc_path && peer == me {
            if send {
                self_sends.entry(c as usize).or_default().push_back(h);
            } else {
                self_recvs.push((c, h));
            }
            continue;
        }
        match submit_p2p(c, peer, send, h) {
            Ok(t) => tickets.push((c, t)),
            Err(r) => note(r),
        }
    }
    for (c, ops) in net_groups {
        // SAFETY: as above.
        let res = match unsafe { (*c).backend.get() } {
            Some(Backend::Net(n)) => n.p2p(&ops),
            _ => Err(Error::new(
                ErrorKind::Aborted,
                "communicator not initialized",
            )),
        };
        tickets.push((c, Ticket::Done(res)));
    }
    for (c, r) in self_recvs {
        let s = self_sends
            .get_mut(&(c as usize))
            .and_then(|q| q.pop_front());
        // SAFETY: handles in a group are live (NCCL's contract).
        let backend = unsafe { (*c).backend.get() };
        let res = match (s, backend) {
            (Some(s), Some(Backend::Proc(p))) => p.self_copy(s, r),
            _ => Err(Error::new(
                ErrorKind::InvalidArgument,
                "a receive from this rank itself without its send in the same group",
            )),
        };
        tickets.push((c, Ticket::Done(res)));
    }
    if self_sends.values().any(|q| !q.is_empty()) {
        note(invalid(
            "a send to this rank itself without its receive in the same group",
        ));
    }
    for (c, t) in tickets {
        note(wait(c, t));
    }
    first
}

/// (peer, is_send, buffer) of one send or receive across hosts.
type NetP2p = (usize, bool, Half);

// ---------------------------------------------------------------- calls

fn submit(comm: *const Comm, call: Call) -> Result<Ticket, NcclResult> {
    with_comm(comm, call.coll.name(), |c| {
        if let Some(e) = c.broken.lock().clone() {
            return Err(fail(&e));
        }
        match c.backend.get() {
            Some(Backend::Local(clique)) => {
                let seq = c.seq.fetch_add(1, Ordering::Relaxed);
                Ok(clique.submit(c.rank, seq, call))
            }
            Some(Backend::Proc(p)) => Ok(Ticket::Done(p.collective(&call))),
            Some(Backend::Net(n)) => Ok(Ticket::Done(n.collective(&call))),
            None => Err(usage(format!(
                "{}: communicator not initialized",
                call.coll.name()
            ))),
        }
    })?
}

fn submit_p2p(comm: *const Comm, peer: usize, send: bool, h: Half) -> Result<Ticket, NcclResult> {
    with_comm(comm, if send { "ncclSend" } else { "ncclRecv" }, |c| {
        if let Some(e) = c.broken.lock().clone() {
            return Err(fail(&e));
        }
        let seq = {
            let mut m = c.p2p_seq.lock();
            let s = m.entry((peer, send)).or_insert(0);
            *s += 1;
            *s - 1
        };
        let (src, dst) = if send { (c.rank, peer) } else { (peer, c.rank) };
        match c.backend.get() {
            Some(Backend::Local(clique)) => Ok(clique.submit_p2p(src, dst, seq, send, h)),
            Some(Backend::Proc(p)) => Ok(Ticket::Done(p.p2p(src, h))),
            Some(Backend::Net(n)) => Ok(Ticket::Done(n.p2p(&[(peer, send, h)]))),
            None => Err(usage("send/recv: communicator not initialized")),
        }
    })?
}

fn wait(comm: *const Comm, t: Ticket) -> NcclResult {
    // SAFETY: a live handle (it was submitted in this call).
    let c = unsafe { &*comm };
    let r = match (t, c.backend.get()) {
        (Ticket::Done(r), _) => r,
        (t, Some(Backend::Local(clique))) => clique.wait(t),
        (_, _) => Err(Error::new(
            ErrorKind::Aborted,
            "communicator not initialized",
        )),
    };
    match r {
        Ok(()) => SUCCESS,
        Err(e) => {
            if e.kind == ErrorKind::Timeout {
                // The ranks are out of step now: every later call fails the same way.
                *c.broken.lock() = Some(e.clone());
            }
            fail(&e)
        }
    }
}

/// Checks a call's arguments and runs it now, or holds it for ncclGroupEnd.
#[allow(clippy::too_many_arguments)]
fn collective(
    name: &str,
    coll: CollKind,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    root: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    let Some(dt) = abi::dtype(dtype) else {
        return invalid(format!(
            "{name}: datatype {dtype} is not one railcc supports (int8..bfloat16; no fp8)"
        ));
    };
    let Some(op) = red_op(op) else {
        return usage(format!("{name}: reduction op {op} is not sum, prod, max, min or avg (premultiplied sums are not implemented)"));
    };
    let nranks = match with_comm(comm, name, |c| c.nranks) {
        Ok(n) => n,
        Err(code) => return code,
    };
    if root < 0 || root as usize >= nranks {
        return invalid(format!(
            "{name}: root {root} out of range for {nranks} ranks"
        ));
    }
    // Broadcast reads the send buffer on the root only, reduce writes the receive buffer on
    // the root only (NCCL lets the others pass NULL); the kernels never touch those.
    if count > 0
        && ((send.is_null() && coll != CollKind::Broadcast)
            || (recv.is_null() && coll != CollKind::Reduce))
    {
        return invalid(format!("{name}: NULL buffer with count {count}"));
    }
    let call = Call {
        coll,
        send: send as u64,
        recv: recv as u64,
        count,
        dtype: dt,
        op,
        root: root as usize,
        stream: stream as usize,
    };
    if group::in_group() {
        group::defer(group::Pending::Coll(comm, call));
        return SUCCESS;
    }
    match submit(comm, call) {
        Ok(t) => wait(comm, t),
        Err(code) => code,
    }
}

const NO_OP: c_int = 0;

#[no_mangle]
pub extern "C" fn ncclAllReduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    collective(
        "ncclAllReduce",
        CollKind::AllReduce,
        send,
        recv,
        count,
        dtype,
        op,
        0,
        comm,
        stream,
    )
}

#[no_mangle]
pub extern "C" fn ncclBroadcast(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    root: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    collective(
        "ncclBroadcast",
        CollKind::Broadcast,
        send,
        recv,
        count,
        dtype,
        NO_OP,
        root,
        comm,
        stream,
    )
}

#[no_mangle]
pub extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    dtype: c_int,
    root: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    collective(
        "ncclBcast",
        CollKind::Broadcast,
        buff,
        buff,
        count,
        dtype,
        NO_OP,
        root,
        comm,
        stream,
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn ncclReduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    root: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    collective(
        "ncclReduce",
        CollKind::Reduce,
        send,
        recv,
        count,
        dtype,
        op,
        root,
        comm,
        stream,
    )
}

#[no_mangle]
pub extern "C" fn ncclAllGather(
    send: *const c_void,
    recv: *mut c_void,
    sendcount: usize,
    dtype: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    collective(
        "ncclAllGather",
        CollKind::AllGather,
        send,
        recv,
        sendcount,
        dtype,
        NO_OP,
        0,
        comm,
        stream,
    )
}

#[no_mangle]
pub extern "C" fn ncclReduceScatter(
    send: *const c_void,
    recv: *mut c_void,
    recvcount: usize,
    dtype: c_int,
    op: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    collective(
        "ncclReduceScatter",
        CollKind::ReduceScatter,
        send,
        recv,
        recvcount,
        dtype,
        op,
        0,
        comm,
        stream,
    )
}

#[allow(clippy::too_many_arguments)]
fn p2p(
    name: &str,
    buf: *mut c_void,
    count: usize,
    dtype: c_int,
    peer: c_int,
    comm: *const Comm,
    stream: *mut c_void,
    send: bool,
) -> NcclResult {
    let Some(dt) = abi::dtype(dtype) else {
        return invalid(format!(
            "{name}: datatype {dtype} is not one railcc supports"
        ));
    };
    let nranks = match with_comm(comm, name, |c| c.nranks) {
        Ok(n) => n,
        Err(code) => return code,
    };
    if peer < 0 || peer as usize >= nranks {
        return invalid(format!(
            "{name}: peer {peer} out of range for {nranks} ranks"
        ));
    }
    if buf.is_null() && count > 0 {
        return invalid(format!("{name}: NULL buffer with count {count}"));
    }
    let h = Half {
        ptr: buf as u64,
        bytes: count * dt.size(),
        stream: stream as usize,
    };
    if group::in_group() {
        group::defer(group::Pending::P2p(comm, peer as usize, send, h));
        return SUCCESS;
    }
    match submit_p2p(comm, peer as usize, send, h) {
        Ok(t) => wait(comm, t),
        Err(code) => code,
    }
}

#[no_mangle]
pub extern "C" fn ncclSend(
    send: *const c_void,
    count: usize,
    dtype: c_int,
    peer: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    p2p(
        "ncclSend",
        send as *mut c_void,
        count,
        dtype,
        peer,
        comm,
        stream,
        true,
    )
}

#[no_mangle]
pub extern "C" fn ncclRecv(
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    peer: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    p2p("ncclRecv", recv, count, dtype, peer, comm, stream, false)
}

/// All-to-all as NCCL's own fallback does it: a group of a send and a receive per peer.
#[no_mangle]
pub extern "C" fn ncclAlltoAll(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    let Some(dt) = abi::dtype(dtype) else {
        return invalid(format!(
            "ncclAlltoAll: datatype {dtype} is not one railcc supports"
        ));
    };
    let nranks = match with_comm(comm, "ncclAlltoAll", |c| c.nranks) {
        Ok(n) => n,
        Err(code) => return code,
    };
    let block = count * dt.size();
    group::start();
    let mut first = SUCCESS;
    for r in 0..nranks {
        let s = ncclSend(
            (send as *const u8).wrapping_add(r * block) as *const c_void,
            count,
            dtype,
            r as c_int,
            comm,
            stream,
        );
        let v = ncclRecv(
            (recv as *mut u8).wrapping_add(r * block) as *mut c_void,
            count,
            dtype,
            r as c_int,
            comm,
            stream,
        );
        for x in [s, v] {
            if first == SUCCESS {
                first = x;
            }
        }
    }
    let e = ncclGroupEnd();
    if first == SUCCESS {
        e
    } else {
        first
    }
}

// ---------------------------------------------------------------- newer entry points

/// NCCL 2.23's init from several ids (for scale); one id is all railcc's bootstrap needs.
///
/// # Safety
/// `comm` NULL or writable; `ids` NULL or `n_ids` ids; `config` as for ncclCommInitRankConfig.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankScalable(
    comm: *mut *mut Comm,
    nranks: c_int,
    rank: c_int,
    n_ids: c_int,
    ids: *const UniqueId,
    config: *const ConfigHead,
) -> NcclResult {
    if ids.is_null() || n_ids < 1 {
        return invalid("ncclCommInitRankScalable: no ids");
    }
    // SAFETY: ids holds n_ids >= 1 ids (the caller's contract); config is forwarded.
    unsafe { ncclCommInitRankConfig(comm, nranks, *ids, rank, config) }
}

macro_rules! not_implemented {
    ($name:ident, $why:literal, $($arg:ident: $ty:ty),*) => {
        /// Not implemented in railcc's libnccl: ncclInvalidUsage, with the reason in
        /// ncclGetLastError. Exported because programs built against newer NCCL import it.
        #[no_mangle]
        pub extern "C" fn $name($($arg: $ty),*) -> NcclResult {
            $(let _ = $arg;)*
            usage(concat!(stringify!($name), ": ", $why))
        }
    };
}
not_implemented!(ncclCommShrink, "shrinking a communicator is not implemented",
    comm: *mut Comm, exclude: *mut c_int, n: c_int, newcomm: *mut *mut Comm, config: *const ConfigHead, flags: c_int);
not_implemented!(ncclCommWindowRegister, "symmetric windows are not implemented (NCCL 2.27 API; railcc reports 2.10)",
    comm: *mut Comm, buff: *mut c_void, size: usize, win: *mut *mut c_void, flags: c_int);
not_implemented!(ncclCommWindowDeregister, "symmetric windows are not implemented",
    comm: *mut Comm, win: *mut c_void);
not_implemented!(ncclDevCommCreate, "the device API is not implemented",
    comm: *mut Comm, reqs: *const c_void, out: *mut c_void);
not_implemented!(ncclDevCommDestroy, "the device API is not implemented",
    comm: *mut Comm, dev_comm: *const c_void);
not_implemented!(ncclGroupSimulateEnd, "group simulation is not implemented",
    sim_info: *mut c_void);
