//! Memory: ncclMemAlloc/Free and buffer registration.

use super::*;
use railcc_cuda::vmm::VmmAlloc;

/// Allocations of ncclMemAlloc, by address, until ncclMemFree.
static ALLOCS: Mutex<Option<HashMap<u64, VmmAlloc>>> = Mutex::new(None);

/// Device memory on the current device, as NCCL's: made with the virtual memory API, readable
/// and writable by every GPU that can reach this one, and shareable with other processes by
/// file descriptor, so peers map it without copies in any way of running.
///
/// # Safety
/// `ptr` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> NcclResult {
    if ptr.is_null() {
        return invalid("ncclMemAlloc: ptr is NULL");
    }
    let dev = match current_device() {
        Ok(d) => d,
        Err(e) => return fail(&e),
    };
    let peers: Vec<i32> = railcc_cuda::driver::devices()
        .map(|all| {
            all.iter()
                .filter(|g| {
                    g.ordinal as i32 != dev
                        && railcc_cuda::driver::peer(g.ordinal, dev as usize)
                            .is_ok_and(|(can, _)| can)
                })
                .map(|g| g.ordinal as i32)
                .collect()
        })
        .unwrap_or_default();
    let a = match VmmAlloc::new(size, dev, &peers) {
        Ok(a) => a,
        Err(e) => return fail(&e.op("ncclMemAlloc")),
    };
    // SAFETY: checked non-NULL.
    unsafe { *ptr = a.ptr as *mut c_void };
    ALLOCS
        .lock()
        .get_or_insert_with(HashMap::new)
        .insert(a.ptr, a);
    SUCCESS
}

/// # Safety
/// `ptr` from ncclMemAlloc, no longer used by any stream.
#[no_mangle]
pub unsafe extern "C" fn ncclMemFree(ptr: *mut c_void) -> NcclResult {
    if ptr.is_null() {
        return SUCCESS;
    }
    match ALLOCS.lock().as_mut().and_then(|m| m.remove(&(ptr as u64))) {
        Some(a) => {
            drop(a);
            SUCCESS
        }
        None => invalid(format!(
            "ncclMemFree: {ptr:?} was not returned by ncclMemAlloc (or was freed already)"
        )),
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

/// A window of symmetric memory (ncclCommWindowRegister): what was registered. railcc's
/// kernels reach peers' buffers without it, so it is a record, not a mapping.
pub struct Window {
    pub ptr: u64,
    pub size: usize,
}

/// Accepted as a hint, as ncclCommRegister: every rank calls it (a collective call in NCCL),
/// and collectives on the window's memory run as on any buffer (VMM memory from ncclMemAlloc
/// is mapped by peers without copies).
///
/// # Safety
/// `comm` a live communicator or NULL; `win` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclCommWindowRegister(
    comm: *mut Comm,
    buff: *mut c_void,
    size: usize,
    win: *mut *mut Window,
    _flags: c_int,
) -> NcclResult {
    if comm.is_null() || win.is_null() {
        return invalid("ncclCommWindowRegister: comm or win is NULL");
    }
    if buff.is_null() && size > 0 {
        return invalid(format!(
            "ncclCommWindowRegister: NULL buffer of {size} bytes"
        ));
    }
    let w = Box::new(Window {
        ptr: buff as u64,
        size,
    });
    if debug().informs() {
        let how = railcc_cuda::vmm::sharing_of(w.ptr)
            .map_or_else(|e| e.to_string(), |h| h.name().to_string());
        log_line(&format!(
            "NCCL INFO railcc: window 0x{:x} ({} bytes) registered; peers reach it by {how}",
            w.ptr, w.size
        ));
    }
    // SAFETY: checked non-NULL; the caller gives it back through ncclCommWindowDeregister.
    unsafe { *win = Box::into_raw(w) };
    SUCCESS
}

/// # Safety
/// `win` NULL or from ncclCommWindowRegister, deregistered once.
#[no_mangle]
pub unsafe extern "C" fn ncclCommWindowDeregister(comm: *mut Comm, win: *mut Window) -> NcclResult {
    if comm.is_null() {
        return invalid("ncclCommWindowDeregister: comm is NULL");
    }
    if !win.is_null() {
        // SAFETY: made by Box::into_raw in ncclCommWindowRegister (the caller's contract).
        let w = unsafe { Box::from_raw(win) };
        if debug().informs() {
            log_line(&format!(
                "NCCL INFO railcc: window 0x{:x} ({} bytes) deregistered",
                w.ptr, w.size
            ));
        }
    }
    SUCCESS
}
