//! Versions and errors: ncclGetVersion, ncclGetErrorString, ncclGetLastError, and the
//! entry points newer headers declare that railcc does not implement (each fails loudly).

use super::*;

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
not_implemented!(ncclDevCommCreate, "the device API is not implemented",
    comm: *mut Comm, reqs: *const c_void, out: *mut c_void);
not_implemented!(ncclDevCommDestroy, "the device API is not implemented",
    comm: *mut Comm, dev_comm: *const c_void);
not_implemented!(ncclGroupSimulateEnd, "group simulation is not implemented",
    sim_info: *mut c_void);
