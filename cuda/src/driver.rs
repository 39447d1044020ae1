//! Loading the CUDA driver without panicking, and what it tells us about the GPUs.
//!
//! cudarc's dynamic loading panics on the first call when libcuda.so is absent, so every entry
//! point here first asks [`available`], which only tries to open the library.

use cudarc::driver::sys;
use railcc_core::{Error, ErrorKind, Result};
use std::ffi::CStr;

/// Turns a driver status into our error, naming the call.
pub fn check(r: sys::CUresult, what: &str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(Error::new(ErrorKind::Io, format!("CUDA {what} failed: {r:?}")).transport(crate::NAME))
}

/// Ok when libcuda can be loaded and initialized; an `Unsupported` error otherwise.
pub fn available() -> Result<()> {
    // SAFETY: is_culib_present only tries to dlopen the library and drops it.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::new(
            ErrorKind::Unsupported,
            "no CUDA driver on this machine (libcuda.so not found)",
        )
        .transport(crate::NAME));
    }
    // SAFETY: the library is present, so the lazily loaded symbol table resolves.
    check(unsafe { sys::cuInit(0) }, "cuInit")
}

/// Ok when NVRTC can be loaded (needed to compile the kernels).
pub fn nvrtc_available() -> Result<()> {
    // SAFETY: only tries to dlopen the library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::new(
            ErrorKind::Unsupported,
            "NVRTC (libnvrtc.so) not found; put CUDA's lib directory on LD_LIBRARY_PATH",
        )
        .transport(crate::NAME));
    }
    Ok(())
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    pub pci_bus_id: String,
    pub compute_capability: (i32, i32),
    pub sms: i32,
}

/// One attribute of device `dev` (the driver initialized).
pub fn attr(dev: sys::CUdevice, a: sys::CUdevice_attribute) -> Result<i32> {
    let mut v = 0;
    // SAFETY: `v` is a valid out-pointer; the driver was initialized by `available`.
    check(
        unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) },
        "cuDeviceGetAttribute",
    )?;
    Ok(v)
}

pub fn device(ordinal: usize) -> Result<sys::CUdevice> {
    let mut d: sys::CUdevice = 0;
    // SAFETY: valid out-pointer; driver initialized.
    check(
        unsafe { sys::cuDeviceGet(&mut d, ordinal as i32) },
        "cuDeviceGet",
    )?;
    Ok(d)
}

/// For tests that need a GPU: every GPU the driver sees, or `None` after printing the skip
/// line "SKIP {what}: no CUDA driver or GPU" (test-gpu.sh counts a skip on a GPU machine as a
/// failure).
pub fn gpus_or_skip(what: &str) -> Option<Vec<GpuInfo>> {
    match devices() {
        Ok(g) if !g.is_empty() => Some(g),
        Ok(_) | Err(_) => {
            println!("SKIP {what}: no CUDA driver or GPU");
            None
        }
    }
}

/// Every GPU the driver sees.
pub fn devices() -> Result<Vec<GpuInfo>> {
    available()?;
    let mut n = 0;
    // SAFETY: valid out-pointer; driver initialized.
    check(unsafe { sys::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
    let mut out = Vec::new();
    for ordinal in 0..n.max(0) as usize {
        let d = device(ordinal)?;
        let mut name = [0 as std::ffi::c_char; 256];
        let mut bus = [0 as std::ffi::c_char; 64];
        // SAFETY: buffers are valid for the lengths passed.
        unsafe {
            check(
                sys::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, d),
                "cuDeviceGetName",
            )?;
            check(
                sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, d),
                "cuDeviceGetPCIBusId",
            )?;
        }
        // SAFETY: the driver NUL-terminates both strings within the buffers.
        let (name, bus) = unsafe { (CStr::from_ptr(name.as_ptr()), CStr::from_ptr(bus.as_ptr())) };
        use sys::CUdevice_attribute as A;
        out.push(GpuInfo {
            ordinal,
            name: name.to_string_lossy().into_owned(),
            pci_bus_id: bus.to_string_lossy().into_owned(),
            compute_capability: (
                attr(d, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attr(d, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            sms: attr(d, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        });
    }
    Ok(out)
}

/// Whether GPU `a` can access GPU `b`'s memory, and the driver's performance rank of that link
/// (lower is better; NVLink ranks above PCIe).
pub fn peer(a: usize, b: usize) -> Result<(bool, i32)> {
    available()?;
    let (da, db) = (device(a)?, device(b)?);
    let mut can = 0;
    let mut rank = 0;
    // SAFETY: valid out-pointers; driver initialized.
    unsafe {
        check(
            sys::cuDeviceCanAccessPeer(&mut can, da, db),
            "cuDeviceCanAccessPeer",
        )?;
        if can != 0 {
            check(
                sys::cuDeviceGetP2PAttribute(
                    &mut rank,
                    sys::CUdevice_P2PAttribute::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK,
                    da,
                    db,
                ),
                "cuDeviceGetP2PAttribute",
            )?;
        }
    }
    Ok((can != 0, rank))
}

/// The CUDA device current on this thread (cudaSetDevice makes its primary context current),
/// or 0, as cudaGetDevice says, when no context is current; an error without a driver.
pub fn current_device() -> Result<i32> {
    available()?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the driver is initialized.
    check(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")?;
    if ctx.is_null() {
        return Ok(0);
    }
    let mut d: sys::CUdevice = 0;
    // SAFETY: a context is current; valid out-pointer.
    check(unsafe { sys::cuCtxGetDevice(&mut d) }, "cuCtxGetDevice")?;
    Ok(d)
}

/// The CUDA context current on this thread, as an opaque handle (for a thread that acts for
/// this one: [`set_current_context`]); None when none is.
pub fn current_context() -> Result<Option<usize>> {
    available()?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the driver is initialized.
    check(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")?;
    Ok((!ctx.is_null()).then_some(ctx as usize))
}

/// Makes a context from [`current_context`] current on this thread.
///
/// # Safety
/// `ctx` is a live context (a primary context stays live for the process).
pub unsafe fn set_current_context(ctx: usize) -> Result<()> {
    // SAFETY: the caller's contract.
    check(
        unsafe { sys::cuCtxSetCurrent(ctx as sys::CUcontext) },
        "cuCtxSetCurrent",
    )
}

/// `bytes` (at least 1) of device memory in the current context (cuMemAlloc), freed only by
/// [`mem_free`].
pub fn mem_alloc(bytes: usize) -> Result<u64> {
    available()?;
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: valid out-pointer; the current context owns the memory.
    check(
        unsafe { sys::cuMemAlloc_v2(&mut p, bytes.max(1)) },
        "cuMemAlloc",
    )?;
    Ok(p)
}

/// Frees memory from [`mem_alloc`].
///
/// # Safety
/// `ptr` came from [`mem_alloc`] and is freed once, with no work still using it.
pub unsafe fn mem_free(ptr: u64) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::cuMemFree_v2(ptr) }, "cuMemFree")
}

#[cfg(test)]
mod tests {
    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        match super::devices() {
            Ok(gpus) => println!("CUDA driver present: {} GPU(s)", gpus.len()),
            Err(e) => {
                println!("SKIP GPU discovery: {e}");
                assert_eq!(e.kind, railcc_core::ErrorKind::Unsupported, "{e}");
            }
        }
    }
}
