//! The host and a GPU handing work to each other without either blocking: flags in mapped
//! pinned memory that a stream writes and waits on (stream memory operations, which CUDA
//! graphs capture as nodes), and the copies between pinned and device memory. The network engine
//! (`railcc_collectives::gpu_net`) is built on these; nothing here knows about networks.

use crate::driver::{available, check, device};
use cudarc::driver::sys;
use railcc_core::{Error, ErrorKind, Result};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// One GPU's primary context, retained for the life of this value (no kernels, no NVRTC).
pub struct Ctx {
    pub ordinal: usize,
    pub ctx: sys::CUcontext,
    dev: sys::CUdevice,
}

// SAFETY: a context handle may be made current on any thread; the driver API is thread safe.
unsafe impl Send for Ctx {}
// SAFETY: as above.
unsafe impl Sync for Ctx {}

impl Ctx {
    pub fn new(ordinal: usize) -> Result<Ctx> {
        available()?;
        let dev = device(ordinal)?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; released in Drop.
        check(
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) },
            "cuDevicePrimaryCtxRetain",
        )?;
        Ok(Ctx { ordinal, ctx, dev })
    }

    /// Makes the context current on this thread (every thread that calls CUDA must).
    pub fn bind(&self) -> Result<()> {
        // SAFETY: the context is retained while self lives.
        check(unsafe { sys::cuCtxSetCurrent(self.ctx) }, "cuCtxSetCurrent")
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: retained in new, released once.
        unsafe {
            let _ = sys::cuDevicePrimaryCtxRelease_v2(self.dev);
        }
    }
}

/// 32-bit words in page-locked host memory mapped into the GPU's address space: the host
/// reads and writes them directly, a stream writes them and waits on them.
pub struct Flags {
    host: *mut u32,
    dev: u64,
    words: usize,
}

// SAFETY: plain host memory owned by this value; every access is a volatile word access.
unsafe impl Send for Flags {}
// SAFETY: as above.
unsafe impl Sync for Flags {}

impl Flags {
    pub fn new(ctx: &Ctx, words: usize) -> Result<Flags> {
        ctx.bind()?;
        Flags::new_current(words)
    }

    /// As [`Flags::new`], in the context current on this thread.
    pub fn new_current(words: usize) -> Result<Flags> {
        let bytes = words.max(1) * 4;
        let mut p: *mut c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: valid out-pointer in the bound context.
        check(
            unsafe { sys::cuMemHostAlloc(&mut p, bytes, flags) },
            "cuMemHostAlloc(DEVICEMAP)",
        )?;
        // SAFETY: `p` holds `bytes` bytes we own; zeroed before any GPU can see it.
        unsafe { std::ptr::write_bytes(p as *mut u8, 0, bytes) };
        let mut dev = 0;
        // SAFETY: `p` is mapped pinned memory of the bound context; valid out-pointer.
        let r = check(
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, p, 0) },
            "cuMemHostGetDevicePointer",
        );
        if let Err(e) = r {
            // SAFETY: allocated above, freed once.
            unsafe { sys::cuMemFreeHost(p) };
            return Err(e);
        }
        crate::staging::note_pinned(bytes, false);
        Ok(Flags {
            host: p as *mut u32,
            dev,
            words,
        })
    }

    /// How many words there are.
    pub fn words(&self) -> usize {
        self.words
    }

    /// Word `i`'s address as the GPU sees it.
    pub fn dev_ptr(&self, i: usize) -> Result<u64> {
        self.at(i)?;
        Ok(self.dev + 4 * i as u64)
    }

    fn at(&self, i: usize) -> Result<*mut u32> {
        if i >= self.words {
            return Err(Error::invalid(format!(
                "flag {i} past the {} flags allocated",
                self.words
            )));
        }
        // SAFETY: in bounds (checked above).
        Ok(unsafe { self.host.add(i) })
    }

    /// The word as the host sees it now; later reads of data the GPU wrote before it are
    /// ordered after this one.
    pub fn load(&self, i: usize) -> u32 {
        match self.at(i) {
            // SAFETY: a valid aligned word of our allocation for the life of self; the GPU
            // writes it at any time, so every host access is atomic (an acquire load pairs
            // with the GPU's system-scope release).
            Ok(p) => unsafe { AtomicU32::from_ptr(p) }.load(Ordering::Acquire),
            Err(_) => 0,
        }
    }

    /// Writes `words` at word `from` on; visible to the GPU before any later store or launch
    /// (a release fence after them).
    ///
    /// # Safety
    /// The GPU does not read these words until a later launch or flag store tells it to.
    pub unsafe fn write(&self, from: usize, words: &[u32]) -> Result<()> {
        let end = from
            .checked_add(words.len())
            .filter(|&e| e <= self.words)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "{} words from flag {from} past the {} flags allocated",
                    words.len(),
                    self.words
                ))
            })?;
        if from < end {
            let dst = self.at(from)?;
            // SAFETY: `from..end` is within the allocation (checked above); the caller
            // vouches that the GPU is not reading it now, so plain writes do not race.
            unsafe { std::ptr::copy_nonoverlapping(words.as_ptr(), dst, words.len()) };
        }
        std::sync::atomic::fence(Ordering::Release);
        Ok(())
    }

    /// Writes the word; earlier host writes are visible to the GPU before it.
    pub fn store(&self, i: usize, v: u32) {
        if let Ok(p) = self.at(i) {
            // SAFETY: as in load.
            unsafe { AtomicU32::from_ptr(p) }.store(v, Ordering::Release);
        }
    }

    /// Writes words `i` (low half) and `i + 1` (high half) as one 8-byte store, so a GPU that
    /// reads them as one u64 never sees one without the other; earlier host writes are
    /// visible to the GPU before it. `i` must be even (the pair 8-byte aligned).
    pub fn store_u64(&self, i: usize, v: u64) -> Result<()> {
        if !i.is_multiple_of(2) || i + 1 >= self.words {
            return Err(Error::invalid(format!(
                "flag pair {i} of {}: not an aligned pair inside the allocation",
                self.words
            )));
        }
        let p = self.at(i)? as *mut u64;
        // SAFETY: words i and i + 1 lie in our allocation (checked), which is page-aligned
        // pinned memory, so an even word index is 8-byte aligned; the GPU reads it at any
        // time, so the store is atomic.
        unsafe { AtomicU64::from_ptr(p) }.store(v, Ordering::Release);
        Ok(())
    }

    /// Enqueues "word i = v" on `stream`, after the work before it.
    ///
    /// # Safety
    /// `stream` must be a live stream of the context these flags were made in, or null.
    pub unsafe fn write_on(&self, stream: sys::CUstream, i: usize, v: u32) -> Result<()> {
        self.at(i)?;
        let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        check(
            sys::cuStreamWriteValue32_v2(stream, self.dev + 4 * i as u64, v, flags),
            "cuStreamWriteValue32",
        )
    }

    /// Enqueues "wait until word i == v" on `stream`: later work starts only then.
    ///
    /// # Safety
    /// As for [`Flags::write_on`].
    pub unsafe fn wait_on(&self, stream: sys::CUstream, i: usize, v: u32) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe {
            self.wait(
                stream,
                i,
                v,
                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ,
            )
        }
    }

    /// Enqueues "wait until word i >= v" on `stream`, compared cyclically
    /// (`(i32)(word - v) >= 0`), so counters may wrap.
    ///
    /// # Safety
    /// As for [`Flags::write_on`].
    pub unsafe fn wait_geq_on(&self, stream: sys::CUstream, i: usize, v: u32) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe {
            self.wait(
                stream,
                i,
                v,
                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ,
            )
        }
    }

    unsafe fn wait(
        &self,
        stream: sys::CUstream,
        i: usize,
        v: u32,
        how: sys::CUstreamWaitValue_flags,
    ) -> Result<()> {
        self.at(i)?;
        check(
            // SAFETY: a word of our mapped allocation (checked); the stream is the caller's.
            unsafe { sys::cuStreamWaitValue32_v2(stream, self.dev + 4 * i as u64, v, how as u32) },
            "cuStreamWaitValue32",
        )
    }
}

impl Drop for Flags {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc, freed once.
        unsafe {
            let _ = sys::cuMemFreeHost(self.host as *mut c_void);
        }
        crate::staging::note_pinned(self.words.max(1) * 4, true);
    }
}

/// Enqueues a copy of `n` bytes from device address `src` to pinned host memory `dst`.
///
/// # Safety
/// `src..src+n` device memory of the current context, `dst..dst+n` pinned host memory that
/// stays allocated until the copy is done; `stream` live (or null) in the current context.
pub unsafe fn d2h(stream: sys::CUstream, dst: *mut u8, src: u64, n: usize) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    check(
        sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, n, stream),
        "cuMemcpyDtoHAsync",
    )
}

/// Enqueues a copy of `n` bytes from pinned host memory `src` to device address `dst`.
///
/// # Safety
/// As for [`d2h`], the other way round.
pub unsafe fn h2d(stream: sys::CUstream, dst: u64, src: *const u8, n: usize) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    check(
        sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, n, stream),
        "cuMemcpyHtoDAsync",
    )
}

/// Whether `stream` is being captured into a CUDA graph (work enqueued now runs at each
/// launch of the graph, not now).
///
/// # Safety
/// `stream` live (or null) in the current context.
pub unsafe fn capturing(stream: sys::CUstream) -> Result<bool> {
    let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    check(
        sys::cuStreamIsCapturing(stream, &mut st),
        "cuStreamIsCapturing",
    )?;
    match st {
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => Ok(false),
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => Ok(true),
        _ => Err(Error::new(
            ErrorKind::InvalidArgument,
            "the stream's graph capture was invalidated by an earlier error",
        )),
    }
}

/// What a graph runs when it is destroyed.
type OnDestroy = Box<dyn FnOnce() + Send>;

/// Runs `f` once the CUDA graph that `stream` is being captured into is destroyed, with every
/// instance made from it, so what a captured call holds (its flags, its staging) can be
/// freed then. `f` runs on a driver thread and must not call CUDA.
///
/// # Safety
/// `stream` live in the current context and being captured.
pub unsafe fn on_graph_destroy(stream: sys::CUstream, f: OnDestroy) -> Result<()> {
    let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id = 0;
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    let mut deps: *const sys::CUgraphNode = std::ptr::null();
    let mut edges: *const sys::CUgraphEdgeData = std::ptr::null();
    let mut n = 0usize;
    check(
        sys::cuStreamGetCaptureInfo_v3(
            stream, &mut st, &mut id, &mut graph, &mut deps, &mut edges, &mut n,
        ),
        "cuStreamGetCaptureInfo",
    )?;
    if st != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE || graph.is_null() {
        return Err(Error::invalid("the stream is not being captured"));
    }
    let data = Box::into_raw(Box::new(f)) as *mut c_void;
    let mut obj: sys::CUuserObject = std::ptr::null_mut();
    let flags = sys::CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC as u32;
    if let Err(e) = check(
        sys::cuUserObjectCreate(&mut obj, data, Some(run_on_destroy), 1, flags),
        "cuUserObjectCreate",
    ) {
        // The driver did not take it: free it here, without running it.
        drop(Box::from_raw(data as *mut OnDestroy));
        return Err(e);
    }
    let mv = sys::CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE as u32;
    let r = check(
        sys::cuGraphRetainUserObject(graph, obj, 1, mv),
        "cuGraphRetainUserObject",
    );
    if r.is_err() {
        // Our reference was not moved: dropping it runs `f` now.
        let _ = sys::cuUserObjectRelease(obj, 1);
    }
    r
}

unsafe extern "C" fn run_on_destroy(p: *mut c_void) {
    // SAFETY: `p` is the box made in on_graph_destroy; the driver calls this once.
    let f = unsafe { Box::from_raw(p as *mut OnDestroy) };
    f();
}
