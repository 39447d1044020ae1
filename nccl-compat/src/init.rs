//! Communicators: the unique id, init (one rank, several at once, from several ids), destroy,
//! abort, finalize, the async error, the getters, split.

use super::*;

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

fn init_rank(
    out: *mut *mut Comm,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
    config: CommConfig,
) -> NcclResult {
    let blocking = !config.nonblocking;
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
    let mut c = Comm::new(rank as usize, nranks as usize, device);
    c.config = config;
    let comm = Box::into_raw(Box::new(c));
    // SAFETY: checked non-NULL; NCCL hands the handle back even before init completes.
    unsafe { *out = comm };
    if group::in_group() {
        group::defer(group::Pending::Init(comm, boot_id));
        return SUCCESS;
    }
    if blocking {
        return finish_init(comm, &boot_id);
    }
    // Non-blocking (NCCL's config.blocking = 0): join on a thread and return ncclInProgress;
    // ncclCommGetAsyncError says ncclInProgress until the join ends, then its result. Calls
    // made earlier wait for it; destroy and abort wait for it (the join ends within the
    // deadline, RAILCC_TIMEOUT_MS).
    let addr = comm as usize;
    let ctx = current_context();
    let spawned = std::thread::Builder::new()
        .name(format!("railcc-init-{rank}"))
        .spawn(move || {
            if let Some(ctx) = ctx {
                // SAFETY: the caller's context, retained by CUDA for the process (primary).
                let _ = unsafe { railcc_cuda::driver::set_current_context(ctx) };
            }
            // finish_init records a failure in the communicator (ncclCommGetAsyncError).
            let _ = finish_init(addr as *const Comm, &boot_id);
        });
    match spawned {
        Ok(h) => {
            // SAFETY: made above, not yet handed to anyone who could destroy it.
            *unsafe { &*comm }.joining.lock() = Some(h);
            IN_PROGRESS
        }
        Err(e) => fail(&Error::new(
            ErrorKind::Io,
            format!("ncclCommInitRankConfig: no thread for the non-blocking init: {e}"),
        )),
    }
}

/// The CUDA context current on this thread (cudaSetDevice's), for a thread acting for it.
fn current_context() -> Option<usize> {
    railcc_cuda::driver::current_context().ok().flatten()
}

impl Comm {
    pub(crate) fn new(rank: usize, nranks: usize, device: i32) -> Comm {
        Comm {
            backend: OnceLock::new(),
            boot: OnceLock::new(),
            rank,
            nranks,
            device,
            seq: AtomicU64::new(0),
            p2p_seq: Mutex::new(HashMap::new()),
            broken: Mutex::new(None),
            user_ops: premul::UserOps::default(),
            config: abi::CommConfig::default(),
            joining: Mutex::new(None),
        }
    }
}

/// Joins the ranks over railcc's bootstrap (TCP, as NCCL's), learns where they live, and
/// opens the GPU path that fits: the clique when every rank is in this process, the
/// per-process path when each has its own.
pub(crate) fn finish_init(comm: *const Comm, id: &railcc_core::bootstrap::UniqueId) -> NcclResult {
    // SAFETY: `comm` came from Box::into_raw in init_rank and is not destroyed before init
    // returns (NCCL's contract).
    let c = unsafe { &*comm };
    let r = proc_backend::connect(id, c.rank, c.nranks, c.device, timeout(), &c.config);
    match r {
        Ok((b, boot)) => {
            let _ = c.boot.set(boot);
            crate::route_events();
            if crate::debug().informs() {
                let path = match &b {
                    Backend::Local(clique) => clique.ready().map_or_else(
                        |e| e.to_string(),
                        |g| format!("every rank in this process: {}", g.describe()),
                    ),
                    Backend::Gpu(g) => g.comm.describe().to_string(),
                };
                let name = c
                    .config
                    .comm_name
                    .as_deref()
                    .map_or(String::new(), |n| format!("[{n}] "));
                crate::log_line(&format!(
                    "NCCL INFO {name}railcc libnccl {VERSION_STRING}: rank {} of {} on CUDA device {}: {path}",
                    c.rank, c.nranks, c.device
                ));
            }
            let _ = c.backend.set(b);
            SUCCESS
        }
        Err(e) => {
            let e = c.named(e.rank(c.rank).op("ncclCommInitRank"));
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
    init_rank(comm, nranks, id, rank, CommConfig::default())
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
    // SAFETY: the caller passes NULL or an ncclConfig_t (NCCL's contract); read_config reads
    // only the fields its size covers.
    let config = match unsafe { read_config(config) } {
        Ok(c) => c,
        Err(e) => return invalid(format!("ncclCommInitRankConfig: {e}")),
    };
    init_rank(comm, nranks, id, rank, config)
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
    if let Err(e) = railcc_cuda::driver::available() {
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
    if let Err(e) = config().and_then(|cfg| clique.open(&cfg)) {
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
    // SAFETY: a live communicator (NCCL's contract); its init thread uses it until joined.
    unsafe { &*comm }.wait_init();
    // SAFETY: made by Box::into_raw; the caller gives it up.
    drop(unsafe { Box::from_raw(comm) });
    if crate::debug().informs() {
        // Every cuMemHostAlloc railcc makes is counted (`railcc_cuda::staging::pinned_bytes`).
        let (now, peak) = railcc_cuda::staging::pinned_bytes();
        crate::log_line(&format!(
            "NCCL INFO railcc: pinned host memory of this process: {:.1} MiB after ncclCommDestroy, at most {:.1} MiB",
            now as f64 / 1048576.0,
            peak as f64 / 1048576.0
        ));
    }
    SUCCESS
}

/// # Safety
/// As for ncclCommDestroy.
#[no_mangle]
pub unsafe extern "C" fn ncclCommAbort(comm: *mut Comm) -> NcclResult {
    // SAFETY: NULL or a live communicator (NCCL's contract).
    // Kernels waiting on peers stop, and streams waiting on the network are let go, at once
    // instead of at the deadline.
    match unsafe { comm.as_ref() }.and_then(|c| c.backend.get()) {
        Some(Backend::Gpu(g)) => g.comm.abort(),
        Some(Backend::Local(clique)) => {
            if let Ok(g) = clique.ready() {
                g.abort();
            }
        }
        None => {}
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

/// # Safety
/// `comm` a live communicator or NULL; `out` NULL or a writable int.
#[no_mangle]
pub unsafe extern "C" fn ncclCommGetAsyncError(
    comm: *mut Comm,
    out: *mut NcclResult,
) -> NcclResult {
    let r = match with_comm(comm, "ncclCommGetAsyncError", |c| {
        if c.init_in_progress() {
            return Err(IN_PROGRESS);
        }
        Ok(c.broken.lock().clone().or_else(|| match c.backend.get() {
            Some(Backend::Gpu(g)) => g.comm.async_error(),
            Some(Backend::Local(clique)) => clique.ready().ok().and_then(|g| g.async_error()),
            None => None,
        }))
    }) {
        Ok(Ok(b)) => b.map_or(SUCCESS, |e| fail_async(&e)),
        Ok(Err(in_progress)) => in_progress,
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

/// NCCL_SPLIT_NOCOLOR: the rank takes part but gets no communicator.
pub(crate) const SPLIT_NOCOLOR: c_int = -1;

/// Splits `comm` as NCCL does: the ranks that pass the same color form a communicator, ranked
/// by key and then by parent rank; NCCL_SPLIT_NOCOLOR leaves a rank out (`newcomm` NULL).
/// Collective over `comm`. The new communicator runs on the parent's device and opens the
/// GPU path that fits its own ranks (one process, one per process, or across hosts).
/// `config` NULL: the parent's config; `splitShare` is accepted, a split communicator opens its
/// own connections either way.
///
/// # Safety
/// `comm` a live handle (or NULL); `newcomm` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclCommSplit(
    comm: *mut Comm,
    color: c_int,
    key: c_int,
    newcomm: *mut *mut Comm,
    config: *const ConfigHead,
) -> NcclResult {
    if comm.is_null() || newcomm.is_null() {
        return invalid("ncclCommSplit: comm or newcomm is NULL");
    }
    // SAFETY: checked non-NULL; writable by the caller's contract.
    unsafe { *newcomm = std::ptr::null_mut() };
    // SAFETY: a handle from an init call, not yet destroyed (NCCL's contract).
    let parent = unsafe { &*comm };
    let config = match child_config(parent, config) {
        Ok(c) => c,
        Err(e) => return invalid(format!("ncclCommSplit: {e}")),
    };
    match split::split(parent, color, key, config) {
        Ok(Some(c)) => {
            // SAFETY: as above.
            unsafe { *newcomm = c };
            SUCCESS
        }
        Ok(None) => SUCCESS,
        Err(code) => code,
    }
}

/// Shrinks `comm` to its ranks less `exclude` (NCCL 2.27): only the survivors call it; the
/// new communicator keeps their parent order. `flags` NCCL_SHRINK_ABORT (1) abandons the
/// parent's outstanding work first (after a failure); the parent stays to be destroyed.
///
/// # Safety
/// `comm` a live handle (or NULL); `exclude` NULL or `n` ints; `newcomm` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclCommShrink(
    comm: *mut Comm,
    exclude: *mut c_int,
    n: c_int,
    newcomm: *mut *mut Comm,
    config: *const ConfigHead,
    flags: c_int,
) -> NcclResult {
    if comm.is_null() || newcomm.is_null() || n < 0 || (n > 0 && exclude.is_null()) {
        return invalid("ncclCommShrink: comm or newcomm is NULL, or the exclude list is missing");
    }
    // SAFETY: checked non-NULL; writable by the caller's contract.
    unsafe { *newcomm = std::ptr::null_mut() };
    let list: &[c_int] = if n == 0 {
        &[]
    } else {
        // SAFETY: `exclude` holds `n` ints (the caller's contract).
        unsafe { std::slice::from_raw_parts(exclude, n as usize) }
    };
    // SAFETY: a handle from an init call, not yet destroyed (NCCL's contract).
    let parent = unsafe { &*comm };
    let config = match child_config(parent, config) {
        Ok(c) => c,
        Err(e) => return invalid(format!("ncclCommShrink: {e}")),
    };
    parent.wait_init();
    match split::shrink(parent, list, flags, config) {
        Ok(c) => {
            // SAFETY: as above.
            unsafe { *newcomm = c };
            SUCCESS
        }
        Err(code) => code,
    }
}

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

/// The config of a communicator split or shrunk from `parent`: `config`, or the parent's when
/// NULL (NCCL's rule).
///
/// # Safety
/// `config` NULL or an ncclConfig_t.
unsafe fn child_config(parent: &Comm, config: *const ConfigHead) -> Result<CommConfig, String> {
    if config.is_null() {
        return Ok(parent.config.clone());
    }
    // SAFETY: the caller's contract.
    unsafe { read_config(config) }
}
