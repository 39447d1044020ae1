//! GPU buffers over a network transport through pinned (page-locked) host memory: copied out
//! of the GPU, moved by the host transport, copied back. GPUDirect RDMA (the NIC reading GPU
//! memory through dma-buf, [`crate::dmabuf`]) is not on the GPU path yet: [`gpu_net_path`] says
//! which path this machine could take and that railcc stages.

use crate::driver::{self, check};
use crate::gpu::GpuCtx;
use cudarc::driver::sys;
use railcc_core::{Error, Result};
use std::ffi::c_void;

/// Bytes of page-locked host memory this process holds through railcc (every
/// `cuMemHostAlloc` railcc makes goes through [`note_pinned`]), and the most it held.
static PINNED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static PINNED_PEAK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Counts `bytes` of pinned memory allocated (`freed` false) or freed.
pub fn note_pinned(bytes: usize, freed: bool) {
    use std::sync::atomic::Ordering::Relaxed;
    if freed {
        PINNED.fetch_sub(bytes, Relaxed);
    } else {
        let now = PINNED.fetch_add(bytes, Relaxed) + bytes;
        PINNED_PEAK.fetch_max(now, Relaxed);
    }
}

/// (now, peak) bytes of pinned host memory railcc holds in this process.
pub fn pinned_bytes() -> (usize, usize) {
    use std::sync::atomic::Ordering::Relaxed;
    (PINNED.load(Relaxed), PINNED_PEAK.load(Relaxed))
}

/// Page-locked host memory from `cuMemHostAlloc`: GPU copies run at full speed, and an RDMA
/// device can register it.
pub struct PinnedBuf {
    ptr: *mut u8,
    bytes: usize,
    ctx: sys::CUcontext,
}

// SAFETY: plain host memory owned by this value; the context handle is only used to free it.
unsafe impl Send for PinnedBuf {}

impl PinnedBuf {
    pub fn new(gpu: &GpuCtx, bytes: usize) -> Result<PinnedBuf> {
        gpu.bind()?;
        Self::in_current(gpu.ctx, bytes)
    }

    /// Pinned memory of the context `ctx`, which must be current on this thread.
    pub fn in_current(ctx: sys::CUcontext, bytes: usize) -> Result<PinnedBuf> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // DEVICEMAP: kernels may also reach it (the network staging kernel, `netcopy.rs`);
        // with unified addressing that is so anyway, this makes it explicit.
        // SAFETY: valid out-pointer in the bound context.
        check(
            unsafe { sys::cuMemHostAlloc(&mut p, bytes.max(1), sys::CU_MEMHOSTALLOC_DEVICEMAP) },
            "cuMemHostAlloc",
        )?;
        note_pinned(bytes.max(1), false);
        Ok(PinnedBuf {
            ptr: p as *mut u8,
            bytes,
            ctx,
        })
    }

    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// The address kernels reach this memory at (with unified addressing, the host's).
    pub fn dev_ptr(&self) -> Result<u64> {
        let mut d: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; `ptr` is this context's pinned allocation.
        check(
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, self.ptr as *mut c_void, 0) },
            "cuMemHostGetDevicePointer",
        )?;
        Ok(d)
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` holds `bytes` bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.bytes) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc in `ctx`, freed once.
        unsafe {
            let _ = sys::cuCtxSetCurrent(self.ctx);
            let _ = sys::cuMemFreeHost(self.ptr as *mut c_void);
        }
        note_pinned(self.bytes.max(1), true);
    }
}

/// Copies `n` bytes from device address `src` into `dst` on `stream`, then waits for it.
///
/// # Safety
/// `src..src+n` must be valid device memory of `gpu`'s context.
pub unsafe fn download_sync(
    gpu: &GpuCtx,
    stream: sys::CUstream,
    dst: &mut PinnedBuf,
    src: u64,
    n: usize,
) -> Result<()> {
    if n > dst.bytes {
        return Err(Error::invalid(
            "staging: copy larger than the pinned buffer",
        ));
    }
    gpu.bind()?;
    check(
        sys::cuMemcpyDtoHAsync_v2(dst.ptr as *mut c_void, src, n, stream),
        "cuMemcpyDtoHAsync",
    )?;
    check(sys::cuStreamSynchronize(stream), "cuStreamSynchronize")
}

/// Copies `n` bytes of `src` to device address `dst` on `stream`, then waits for it.
///
/// # Safety
/// `dst..dst+n` must be valid device memory of `gpu`'s context.
pub unsafe fn upload_sync(
    gpu: &GpuCtx,
    stream: sys::CUstream,
    dst: u64,
    src: &PinnedBuf,
    n: usize,
) -> Result<()> {
    if n > src.bytes {
        return Err(Error::invalid(
            "staging: copy larger than the pinned buffer",
        ));
    }
    gpu.bind()?;
    check(
        sys::cuMemcpyHtoDAsync_v2(dst, src.ptr as *const c_void, n, stream),
        "cuMemcpyHtoDAsync",
    )?;
    check(sys::cuStreamSynchronize(stream), "cuStreamSynchronize")
}

/// How GPU `ordinal`'s memory could reach an RDMA NIC here, and the path railcc takes, for
/// logs and `railcc topo`.
pub fn gpu_net_path(ordinal: usize) -> String {
    let peermem = std::path::Path::new("/sys/module/nvidia_peermem").exists();
    let dmabuf = driver::device(ordinal)
        .and_then(|d| {
            let mut v = 0;
            // SAFETY: valid out-pointer; the driver is initialised by `device`.
            check(
                unsafe {
                    sys::cuDeviceGetAttribute(
                        &mut v,
                        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
                        d,
                    )
                },
                "cuDeviceGetAttribute(DMA_BUF_SUPPORTED)",
            )?;
            Ok(v != 0)
        })
        .unwrap_or(false);
    let could = match (dmabuf, peermem) {
        (true, true) => "dma-buf and nvidia-peermem available",
        (true, false) => "dma-buf available",
        (false, true) => "nvidia-peermem loaded",
        (false, false) => "no GPUDirect RDMA (no dma-buf, no nvidia-peermem)",
    };
    format!("staged through pinned host memory ({could}; GPUDirect RDMA is not on railcc's GPU path yet)")
}

/// Waits until the work on `stream` is done (before the NIC touches its buffers).
///
/// # Safety
/// `stream` must be a live stream of `gpu`'s context.
pub unsafe fn wait_stream(gpu: &GpuCtx, stream: sys::CUstream) -> Result<()> {
    gpu.bind()?;
    check(sys::cuStreamSynchronize(stream), "cuStreamSynchronize")
}
