//! The order of one GPU's collective kernels of one communicator, as NCCL orders a
//! communicator's launches whatever streams they go on.
//!
//! Why: the kernels number their calls by a counter in the GPU's sync area (read at the start,
//! advanced at the end), so two kernels of one communicator running at once on two streams
//! (FSDP's all-gather and reduce-scatter streams) would take the same number and meet the
//! wrong call of their peers: a hang or wrong data. Each kernel therefore waits for the
//! previous one when that went on another stream (a marker recorded after it); on one stream
//! the stream's order suffices. Every wait points to an earlier call in the host's order, so
//! no cycle can form.

use railcc_core::Result;
use railcc_cuda::gpu::{is_capturing, stream_of, GpuCtx, Marker};

/// The last collective kernel enqueued outside a capture: its stream, and a marker after it.
#[derive(Default)]
pub struct KernelOrder {
    last: Option<usize>,
    marker: Option<Marker>,
}

impl KernelOrder {
    /// Runs `enqueue` (which puts one kernel on `stream`) after the previous kernel, and marks
    /// the point after it. A stream under capture neither waits on an eager kernel (a capture
    /// cannot wait on an outside event) nor becomes the last one (its graph replays later,
    /// unseen; work inside a capture is ordered by the capture's own streams).
    ///
    /// # Safety
    /// `stream` a live stream of `gpu`.
    pub unsafe fn run<T>(
        &mut self,
        gpu: &GpuCtx,
        stream: usize,
        enqueue: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let s = stream_of(stream);
        // SAFETY: the caller's stream of this GPU.
        if unsafe { is_capturing(gpu, s) }? {
            return enqueue();
        }
        // SAFETY: the caller's contract; not capturing (asked above).
        unsafe { self.run_eager(gpu, stream, enqueue) }
    }

    /// As [`KernelOrder::run`] for a stream the caller knows is not being captured (one
    /// driver call less: small calls under `mpirun` are bound by the host's time).
    ///
    /// # Safety
    /// `stream` a live stream of `gpu`, not being captured.
    pub unsafe fn run_eager<T>(
        &mut self,
        gpu: &GpuCtx,
        stream: usize,
        enqueue: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let s = stream_of(stream);
        let marker = match &mut self.marker {
            Some(m) => m,
            m => m.insert(Marker::new(gpu)?),
        };
        gpu.bind()?;
        if self.last.is_some_and(|l| l != stream) {
            // SAFETY: the caller's live stream; the marker is of this GPU's context, current.
            unsafe { marker.wait(s) }?;
        }
        let r = enqueue()?;
        gpu.bind()?;
        // SAFETY: as above.
        unsafe { marker.record(s) }?;
        self.last = Some(stream);
        Ok(r)
    }

    /// Destroys the marker (with its GPU's context current).
    pub fn release(&mut self) {
        self.marker.take();
    }
}
