//! One process driving several GPUs (like `ncclCommInitAll`).
//!
//! A call enqueues one kernel on every GPU's stream (the caller's streams, or ours) and returns
//! at once, so one thread starts a collective on every GPU without deadlock: group semantics
//! come for free. The kernels meet at two barriers made of flags in each GPU's memory, written
//! by peers over NVLink: "my inputs are ready" at the start and "I am done with your memory" at
//! the end, so a kernel ends only when no peer still reads its inputs or writes its outputs.
//! Between them each GPU does its part (plan.rs), reading peers' inputs and writing peers'
//! outputs directly. A peer that never arrives makes the kernel trap after `timeout_ns` (the
//! call then fails) instead of hanging.

use crate::plan::{blocks, spec, Launch};
use cudarc::driver::sys;
use railcc_core::call::CollKind;
use railcc_core::{DataType, Error, ErrorKind, ReduceOp, Result};
use railcc_cuda::driver::{self, check};
use railcc_cuda::gpu::{DevBuf, GpuCtx, Timer};
use railcc_cuda::kernels::{MAX_BLOCKS, MAX_PEERS};
use railcc_cuda::launch::{launch, CallShape, THREADS};
use railcc_cuda::ll;
use std::path::Path;

/// The GPUs of this process, with peer access enabled between every pair.
pub struct MultiGpu {
    gpus: Vec<GpuCtx>,
    /// How long a kernel spins for a peer before it traps (and the call fails).
    pub timeout_ns: u64,
    pub ordinals: Vec<usize>,
    /// Thread blocks per GPU per call (the SMs a call occupies), capped by work.
    pub max_blocks: u32,
    /// All-reduces up to this many bytes use the low-latency kernel (`railcc_cuda::ll`).
    pub ll_max_bytes: usize,
}

impl MultiGpu {
    /// Opens `ordinals` (1 to 8 GPUs, every pair able to reach each other's memory); kernels are
    /// compiled once and cached in `cache`.
    pub fn new(ordinals: &[usize], cache: Option<&Path>) -> Result<MultiGpu> {
        if ordinals.is_empty() || ordinals.len() > MAX_PEERS {
            return Err(Error::invalid(format!(
                "multi-GPU: {} GPUs requested, 1 to {MAX_PEERS} supported",
                ordinals.len()
            )));
        }
        let gpus = ordinals
            .iter()
            .map(|&o| GpuCtx::new(o, cache))
            .collect::<Result<Vec<_>>>()?;
        for (i, &a) in ordinals.iter().enumerate() {
            for (j, &b) in ordinals.iter().enumerate() {
                if i == j {
                    continue;
                }
                let (can, _) = driver::peer(a, b)?;
                if !can {
                    return Err(Error::new(
                        ErrorKind::Unsupported,
                        format!("GPU {a} cannot access GPU {b}'s memory (no P2P)"),
                    )
                    .transport(crate::NAME));
                }
                gpus[i].bind()?;
                // SAFETY: both contexts are live; enabling twice reports ALREADY_ENABLED.
                let r = unsafe { sys::cuCtxEnablePeerAccess(gpus[j].ctx, 0) };
                if r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
                    check(r, "cuCtxEnablePeerAccess")?;
                }
            }
        }
        let mut mg = MultiGpu {
            gpus,
            timeout_ns: 30_000_000_000,
            ordinals: ordinals.to_vec(),
            max_blocks: 1,
            ll_max_bytes: ll::MAX_BYTES,
        };
        mg.set_max_blocks(0)?;
        Ok(mg)
    }

    /// Sets the blocks per GPU (0: one per SM), clamped to what stays resident at once: every
    /// block of every GPU waits for the others, so none may wait for a free SM.
    pub fn set_max_blocks(&mut self, want: usize) -> Result<u32> {
        self.max_blocks = clamp_blocks(&self.gpus, want)?;
        Ok(self.max_blocks)
    }

    pub fn len(&self) -> usize {
        self.gpus.len()
    }

    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty()
    }

    pub fn gpu(&self, g: usize) -> &GpuCtx {
        &self.gpus[g]
    }

    pub fn stream(&self, g: usize) -> sys::CUstream {
        self.gpus[g].stream
    }

    pub fn alloc(&self, g: usize, bytes: usize) -> Result<DevBuf> {
        self.gpus[g].alloc(bytes)
    }

    pub fn upload(&self, g: usize, dst: &DevBuf, offset: usize, data: &[u8]) -> Result<()> {
        self.gpus[g].upload(dst, offset, data)
    }

    /// Waits for every GPU (peers write into GPU g's outputs), then copies.
    pub fn download(&self, g: usize, src: &DevBuf, offset: usize, out: &mut [u8]) -> Result<()> {
        self.synchronize()?;
        self.gpus[g].download(src, offset, out)
    }

    pub fn synchronize(&self) -> Result<()> {
        self.gpus.iter().try_for_each(|g| g.synchronize())
    }

    pub fn record_timer(&self, g: usize) -> Result<Timer> {
        self.gpus[g].record_timer()
    }

    /// Enqueues an all-reduce of `count` elements on our streams: `outs[g]` on every GPU gets
    /// the reduction of every `ins[g]`; in place when `ins[g] == outs[g]`.
    ///
    /// # Safety
    /// As for [`MultiGpu::collective_on`].
    pub unsafe fn all_reduce(
        &self,
        ins: &[u64],
        outs: &[u64],
        count: usize,
        dt: DataType,
        op: ReduceOp,
    ) -> Result<Launch> {
        // SAFETY: forwarded from the caller.
        unsafe { self.collective(CollKind::AllReduce, ins, outs, count, dt, op, 0) }
    }

    /// [`MultiGpu::collective_on`] on our own streams.
    ///
    /// # Safety
    /// As for [`MultiGpu::collective_on`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn collective(
        &self,
        coll: CollKind,
        ins: &[u64],
        outs: &[u64],
        count: usize,
        dt: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<Launch> {
        let streams: Vec<_> = self.gpus.iter().map(|g| g.stream).collect();
        // SAFETY: forwarded from the caller.
        unsafe { self.collective_on(&streams, coll, ins, outs, count, dt, op, root) }
    }

    /// Enqueues one collective on `streams[g]` for each GPU g and returns at once, with NCCL's
    /// buffer conventions (see `plan::spec`). Supported: all_reduce, reduce_scatter,
    /// all_gather, broadcast, reduce, sendrecv (out of place). Under stream capture the calls
    /// become graph nodes, which replay correctly (the call counter lives on the GPU).
    ///
    /// # Safety
    /// Each buffer must be device memory of its GPU, of the size the collective implies, valid
    /// until the streams pass this call; `streams[g]` must be a live stream of GPU g.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn collective_on(
        &self,
        streams: &[sys::CUstream],
        coll: CollKind,
        ins: &[u64],
        outs: &[u64],
        count: usize,
        dt: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<Launch> {
        let n = self.gpus.len();
        if streams.len() != n {
            return Err(Error::invalid(format!(
                "{}: {} streams for {n} GPUs",
                coll.name(),
                streams.len()
            )));
        }
        let nbytes = count * dt.size();
        if ll::takes(coll, nbytes, self.ll_max_bytes) {
            let areas: Vec<u64> = self.gpus.iter().map(|g| g.sync.ptr).collect();
            let blocks = ll::blocks(nbytes, self.max_blocks);
            for (g, gpu) in self.gpus.iter().enumerate() {
                // SAFETY: peer access is enabled between every pair, so GPU g reaches every
                // area; the caller vouches for the buffers.
                unsafe {
                    ll::launch(
                        gpu,
                        streams[g],
                        g,
                        ins[g],
                        outs[g],
                        nbytes,
                        dt,
                        op,
                        &areas,
                        blocks,
                        self.timeout_ns,
                    )?
                };
            }
            return Ok(Launch {
                blocks_per_gpu: blocks,
                threads_per_block: ll::THREADS,
            });
        }
        // Every spec first, so a bad argument launches nothing.
        let specs = (0..n)
            .map(|g| spec(coll, g, ins, outs, count, dt, root))
            .collect::<Result<Vec<_>>>()?;
        let syncs: Vec<u64> = self.gpus.iter().map(|g| g.sync.ptr).collect();
        let shape = CallShape {
            dt,
            op,
            syncs: &syncs,
            avg_n: n as i32,
            blocks: blocks(coll, n, count, dt, self.max_blocks),
            timeout_ns: self.timeout_ns,
        };
        for (g, s) in specs.iter().enumerate() {
            // SAFETY: peer access is enabled between every pair, so GPU g addresses every
            // buffer and sync area; the caller vouches for the buffers.
            unsafe { launch(&self.gpus[g], streams[g], g, s, &shape)? };
        }
        Ok(Launch {
            blocks_per_gpu: shape.blocks,
            threads_per_block: THREADS,
        })
    }
}

/// Blocks per GPU: `want` (0: one per SM), at most what every GPU keeps resident at once.
pub fn clamp_blocks(gpus: &[GpuCtx], want: usize) -> Result<u32> {
    let sms = gpus.iter().map(|g| g.sms).min().unwrap_or(1).max(1) as u32;
    let per_sm = match gpus.first() {
        Some(g) => g.blocks_per_sm(THREADS)?,
        None => 1,
    };
    let resident = sms * per_sm;
    let want = if want == 0 { sms } else { want as u32 };
    Ok(want.clamp(1, resident.min(MAX_BLOCKS as u32)))
}
