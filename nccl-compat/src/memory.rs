//! Memory: ncclMemAlloc/Free and buffer registration.

use super::*;

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
    // The current context (cudaSetDevice's primary context) owns it.
    let p = match railcc_cuda::driver::mem_alloc(size) {
        Ok(p) => p,
        Err(e) => return fail(&e),
    };
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
    match unsafe { railcc_cuda::driver::mem_free(ptr as u64) } {
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
