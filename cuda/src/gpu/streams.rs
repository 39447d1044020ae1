//! Streams and the order of work on them: waits between streams, stream ids, copies, capture
//! checks, markers and `LaunchOrder` (a communicator's work in issue order whatever the
//! streams), timing events, CUDA graphs.

use super::{new_stream_current, GpuCtx, Stream};
use crate::driver::check;
use cudarc::driver::sys;
use railcc_core::Result;
use std::time::{Duration, Instant};

/// Makes stream `waiter` (of `waiter_gpu`) wait for the work enqueued so far on stream `on`
/// (of `on_gpu`), without blocking the host: an event recorded on `on` and waited on by
/// `waiter`, then destroyed (the driver frees it once it completes). The two may be streams of
/// different GPUs. Leaves `waiter_gpu`'s context current.
///
/// # Safety
/// Both streams must be live streams of their contexts, or null (the legacy stream).
pub unsafe fn stream_waits_for(
    waiter_gpu: &GpuCtx,
    waiter: Stream,
    on_gpu: &GpuCtx,
    on: Stream,
) -> Result<()> {
    on_gpu.bind()?;
    let mut ev: sys::CUevent = std::ptr::null_mut();
    let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
    check(sys::cuEventCreate(&mut ev, flags), "cuEventCreate")?;
    let r = check(sys::cuEventRecord(ev, on), "cuEventRecord")
        .and_then(|_| waiter_gpu.bind())
        .and_then(|_| check(sys::cuStreamWaitEvent(waiter, ev, 0), "cuStreamWaitEvent"));
    sys::cuEventDestroy_v2(ev);
    r
}

/// The caller's stream from its opaque handle (`railcc_core::call::Call::stream`; 0 is the
/// legacy default stream).
pub fn stream_of(handle: usize) -> Stream {
    handle as Stream
}

/// The driver's unique id of `stream` (CUDA 12.0 on; None where the driver lacks it, and for
/// the per-thread default stream's handle, which names another stream on every thread: its
/// id is not documented to follow the thread).
///
/// # Safety
/// `stream` is a live stream (or a special handle) of the current context.
pub unsafe fn stream_id(stream: Stream) -> Option<u64> {
    if stream as usize == 0x2 {
        // CU_STREAM_PER_THREAD.
        return None;
    }
    // cudarc loads a symbol on first use and panics where it is missing: ask for it only from
    // a driver that has it.
    static HAS_IT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let has_it = *HAS_IT.get_or_init(|| crate::compile::driver_version().is_ok_and(|v| v >= 12000));
    if !has_it {
        return None;
    }
    let mut id: std::ffi::c_ulonglong = 0;
    // SAFETY: the caller's live stream; a valid out-pointer.
    let rc = unsafe { sys::cuStreamGetId(stream, &mut id) };
    (rc == sys::CUresult::CUDA_SUCCESS).then_some(id)
}

/// Enqueues a copy of `bytes` from `src` to `dst` on `stream` (a copy engine; either side may
/// be a peer GPU's memory this context can address). `what` names the copy in errors.
///
/// # Safety
/// Both ranges hold `bytes` of memory this context addresses, live until the stream passes
/// the copy; `stream` is a live stream of the current context (or null).
pub unsafe fn copy_async(
    dst: u64,
    src: u64,
    bytes: usize,
    stream: Stream,
    what: &str,
) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: the caller's contract.
    check(unsafe { sys::cuMemcpyAsync(dst, src, bytes, stream) }, what)
}

/// Whether `stream` (of `gpu`) is being captured into a CUDA graph: nothing may be allocated
/// then, and captured work replays later.
///
/// # Safety
/// `stream` is a live stream of `gpu`'s context, or null.
pub unsafe fn is_capturing(gpu: &GpuCtx, stream: Stream) -> Result<bool> {
    gpu.bind()?;
    let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: a live stream of the caller's (or null) and a valid out-pointer.
    check(
        unsafe { sys::cuStreamIsCapturing(stream, &mut st) },
        "cuStreamIsCapturing",
    )?;
    Ok(st != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// A non-blocking stream of `gpu`'s context (destroy it with [`destroy_stream`]).
pub fn create_stream(gpu: &GpuCtx) -> Result<Stream> {
    gpu.bind()?;
    new_stream_current()
}

/// Destroys a stream made by [`create_stream`].
///
/// # Safety
/// `s` came from [`create_stream`] on `gpu` and is destroyed once, with no work of ours
/// still to be enqueued on it.
pub unsafe fn destroy_stream(gpu: &GpuCtx, s: Stream) -> Result<()> {
    gpu.bind()?;
    // SAFETY: the caller's contract.
    check(unsafe { sys::cuStreamDestroy_v2(s) }, "cuStreamDestroy")
}

/// Lets `from`'s kernels and copies address `to`'s memory (peer access); enabling it twice
/// is not an error.
pub fn enable_peer_access(from: &GpuCtx, to: &GpuCtx) -> Result<()> {
    from.bind()?;
    // SAFETY: both contexts are live.
    let r = unsafe { sys::cuCtxEnablePeerAccess(to.ctx, 0) };
    if r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        return Ok(());
    }
    check(r, "cuCtxEnablePeerAccess")
}

/// A point in one stream's work that other streams can wait for: an event without timing,
/// recorded again for each new point (a wait takes the point recorded at the time it is
/// enqueued), destroyed on drop.
pub struct Marker {
    ev: sys::CUevent,
}

// SAFETY: a CUevent is a driver handle usable from any thread with its context current.
unsafe impl Send for Marker {}

impl Marker {
    /// Made in the current context (the caller bound it).
    pub fn in_current() -> Result<Marker> {
        let mut ev: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: valid out-pointer; a context is current (the caller's contract).
        check(
            unsafe { sys::cuEventCreate(&mut ev, flags) },
            "cuEventCreate",
        )?;
        Ok(Marker { ev })
    }

    /// Marks the work enqueued so far on `stream`.
    ///
    /// # Safety
    /// `stream` a live stream of the marker's context, which is current.
    pub unsafe fn record(&self, stream: Stream) -> Result<()> {
        // SAFETY: the caller's contract; the event is ours.
        check(
            unsafe { sys::cuEventRecord(self.ev, stream) },
            "cuEventRecord",
        )
    }

    /// Makes `stream` wait for the last marked point.
    ///
    /// # Safety
    /// `stream` a live stream of the marker's context, which is current.
    pub unsafe fn wait(&self, stream: Stream) -> Result<()> {
        // SAFETY: the caller's contract; the event is ours.
        check(
            unsafe { sys::cuStreamWaitEvent(stream, self.ev, 0) },
            "cuStreamWaitEvent",
        )
    }

    /// Whether the GPU has passed the last marked point (true if none was marked).
    pub fn reached(&self) -> Result<bool> {
        // SAFETY: the event is ours; a query enqueues nothing.
        match unsafe { sys::cuEventQuery(self.ev) } {
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => check(r, "cuEventQuery").map(|()| true),
        }
    }
}

impl Drop for Marker {
    fn drop(&mut self) {
        // SAFETY: the event was created by us and is destroyed once (the driver keeps it
        // until pending waits are done).
        unsafe {
            let _ = sys::cuEventDestroy_v2(self.ev);
        }
    }
}

/// The order of one communicator's GPU work on one context, as NCCL orders a communicator's
/// launches whatever streams they go on: each piece of work waits for the previous one (a
/// marker recorded after it), so no two run at once. Every wait points to an earlier call in
/// the host's order, so no cycle can form. Work on a stream being captured neither waits nor
/// is waited for: its graph's launches are the caller's to order.
pub struct LaunchOrder {
    last: Option<usize>,
    /// The driver's id of the last work's stream (unique in the process, unlike an address):
    /// work on the same stream needs no wait, whatever `wait_on_same_stream` says.
    last_id: Option<u64>,
    marker: Option<Marker>,
    /// Whether work on the last work's stream (by address) waits too: an address can be a
    /// destroyed stream's reused, and the per-thread default stream has one address on every
    /// thread. The wait costs the host about a microsecond, the GPU nothing.
    wait_on_same_stream: bool,
}

impl LaunchOrder {
    /// An order that trusts the stream order for work on the last work's stream address.
    pub fn by_stream() -> LaunchOrder {
        LaunchOrder {
            last: None,
            last_id: None,
            marker: None,
            wait_on_same_stream: false,
        }
    }

    /// An order that waits for the last work on every stream.
    pub fn always() -> LaunchOrder {
        LaunchOrder {
            wait_on_same_stream: true,
            ..LaunchOrder::by_stream()
        }
    }

    /// Runs `enqueue` (which puts work on `stream`) after the previous work, and marks the
    /// point after it. `bind` makes the order's context current (`enqueue` may change it).
    ///
    /// # Safety
    /// `stream` a live stream of the order's context, not being captured.
    pub unsafe fn run_eager<T>(
        &mut self,
        bind: impl Fn() -> Result<()>,
        stream: usize,
        enqueue: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let s = stream_of(stream);
        bind()?;
        let marker = match &mut self.marker {
            Some(m) => m,
            m => m.insert(Marker::in_current()?),
        };
        // SAFETY: the caller's live stream.
        let id = unsafe { stream_id(s) };
        // Ids decide where both are known; else the address (and `wait_on_same_stream`).
        let wait = match (id, self.last_id) {
            (Some(now), Some(last)) => now != last,
            _ => self
                .last
                .is_some_and(|l| self.wait_on_same_stream || l != stream),
        };
        if wait {
            // SAFETY: the caller's live stream; the marker is of this context, current.
            unsafe { marker.wait(s) }?;
        }
        // Marked after a failed enqueue too: part of it may be on the stream, reading memory
        // a close must not free before the GPU has passed it (`settled`).
        let r = enqueue();
        // SAFETY: as above.
        let marked = bind().and_then(|()| unsafe { marker.record(s) });
        self.last = Some(stream);
        self.last_id = id;
        // The enqueue's own error first: a failure to mark after it is its consequence.
        let r = r?;
        marked?;
        Ok(r)
    }

    /// Waits up to `within` (no limit if it overflows an `Instant`) for the GPU to finish the
    /// last work run through this order (so memory that work reads can be freed); true once
    /// it has, or when nothing was run or the context is gone (an error: nothing of it runs
    /// any more), false at the deadline.
    pub fn settled(&self, bind: impl Fn() -> Result<()>, within: Duration) -> bool {
        let Some(marker) = &self.marker else {
            return true;
        };
        if let Err(e) = bind() {
            tracing::debug!("launch order: no context to wait in ({e}): nothing runs");
            return true;
        }
        // No deadline past what an Instant holds (a communicator without a timeout).
        let deadline = Instant::now().checked_add(within);
        loop {
            match marker.reached() {
                Ok(true) => return true,
                Err(e) => {
                    // A context that failed or is gone runs nothing any more.
                    tracing::debug!("launch order: {e}: taken as settled");
                    return true;
                }
                Ok(false) if deadline.is_some_and(|d| Instant::now() >= d) => return false,
                Ok(false) => std::thread::sleep(Duration::from_micros(200)),
            }
        }
    }

    /// Destroys the marker (with its context current).
    pub fn release(&mut self) {
        self.marker.take();
    }
}

pub struct Timer {
    pub(super) ev: sys::CUevent,
}

impl Timer {
    /// Milliseconds from `self` to `end` (waits for `end`).
    pub fn elapsed_ms(&self, end: &Timer) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: both events were recorded; valid out-pointer.
        unsafe {
            check(sys::cuEventSynchronize(end.ev), "cuEventSynchronize")?;
            check(
                sys::cuEventElapsedTime_v2(&mut ms, self.ev, end.ev),
                "cuEventElapsedTime",
            )?;
        }
        Ok(ms)
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        // SAFETY: the event was created by us and is destroyed once.
        unsafe {
            let _ = sys::cuEventDestroy_v2(self.ev);
        }
    }
}

/// A CUDA graph captured from one stream, replayed with `launch`.
pub struct Graph {
    exec: sys::CUgraphExec,
    graph: sys::CUgraph,
}

// SAFETY: graph handles are plain driver handles, used from one thread at a time.
unsafe impl Send for Graph {}

/// Starts capturing `stream` (relaxed mode, so other threads' CUDA calls are unaffected).
///
/// # Safety
/// `stream` must be a live stream of `g`, not already being captured.
pub unsafe fn begin_capture(g: &GpuCtx, stream: sys::CUstream) -> Result<()> {
    g.bind()?;
    // SAFETY: the stream is live and not being captured.
    check(
        unsafe {
            sys::cuStreamBeginCapture_v2(
                stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        },
        "cuStreamBeginCapture",
    )
}

/// Ends the capture started by `begin_capture` and instantiates the graph.
///
/// # Safety
/// `stream` must be a live stream of `g` being captured.
pub unsafe fn end_capture(g: &GpuCtx, stream: sys::CUstream) -> Result<Graph> {
    g.bind()?;
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    let mut exec: sys::CUgraphExec = std::ptr::null_mut();
    // SAFETY: valid out-pointers; the stream is being captured.
    unsafe {
        check(
            sys::cuStreamEndCapture(stream, &mut graph),
            "cuStreamEndCapture",
        )?;
        check(
            sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0),
            "cuGraphInstantiate",
        )?;
    }
    Ok(Graph { exec, graph })
}

impl Graph {
    /// # Safety
    /// `stream` must be a live stream of `g`.
    pub unsafe fn launch(&self, g: &GpuCtx, stream: sys::CUstream) -> Result<()> {
        g.bind()?;
        // SAFETY: an instantiated graph on a live stream.
        check(
            unsafe { sys::cuGraphLaunch(self.exec, stream) },
            "cuGraphLaunch",
        )
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: created by end_capture, destroyed once.
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.exec);
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}
