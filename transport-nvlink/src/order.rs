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
use railcc_cuda::gpu::{is_capturing, stream_of, GpuCtx, LaunchOrder};
use std::time::Duration;

/// How long a closing communicator's kernels, stopped because they had not finished within
/// its timeout, get to see the stop before what they read is left allocated.
pub const STOP_GRACE: Duration = Duration::from_millis(100);

/// The last collective kernel enqueued outside a capture: its stream, and a marker after it.
pub struct KernelOrder(LaunchOrder);

impl Default for KernelOrder {
    fn default() -> KernelOrder {
        KernelOrder(LaunchOrder::by_stream())
    }
}

impl KernelOrder {
    /// Runs `enqueue` (which puts a call's kernels on `stream`) after the previous call's, and marks
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
        // SAFETY: the caller's stream of this GPU.
        if unsafe { is_capturing(gpu, stream_of(stream)) }? {
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
        // SAFETY: the caller's contract.
        unsafe { self.0.run_eager(|| gpu.bind(), stream, enqueue) }
    }

    /// Waits for the last call's kernels before a close frees what they read: up to
    /// `within`, or [`STOP_GRACE`] once they were stopped (an abort or a failure: as NCCL's
    /// abort, the close returns); then stops them and waits [`STOP_GRACE`] more. False:
    /// they still run, and what they read must stay allocated.
    pub fn drained(&self, gpu: &GpuCtx, within: Duration) -> bool {
        let within = if gpu.kernels_stopped() {
            STOP_GRACE
        } else {
            within
        };
        self.0.settled(|| gpu.bind(), within) || {
            gpu.abort_kernels();
            self.0.settled(|| gpu.bind(), STOP_GRACE)
        }
    }

    /// Destroys the marker (with its GPU's context current).
    pub fn release(&mut self) {
        self.0.release();
    }
}
