//! Collectives whose data moves on the copy engines: no thread block touches it.
//!
//! Why: on 4 x H100 (2026-11-27, `bench/experiments/ce_allreduce.cu`), each GPU copying its
//! block into every peer's output with `cuMemcpyAsync`, one copy after another on one stream,
//! read 302, 360 and 384 GB/s all-gather busbw at 64 MB, 256 MB and 1 GB, against NCCL's
//! all_gather 258-304-324 at 24 channels and railcc's kernel's 275-304-310 at 24 blocks. The
//! copies on three streams at once read less (196-228). Below 64 MB the copies' fixed cost
//! loses to the kernel.
//!
//! An all-gather is then a one-block "ready" barrier kernel (every peer has reached the call:
//! its output may be written), the copies, and a one-block "done" barrier kernel (every peer's
//! copies into this GPU's output have ended, and nobody reads this GPU's input any more). The
//! barriers are the bulk kernel's (kernels.rs `arrive_ready`, `arrive_done`) on the same call
//! counter in the sync area, so these calls interleave with kernel calls and replay in CUDA
//! graphs; a copy's writes are complete before the next kernel on its stream starts.

use crate::gpu::{copy_async, is_capturing, stream_waits_for, GpuCtx};
use crate::launch::{enqueue, ptrs, Ptrs};
use cudarc::driver::sys;
use railcc_core::{Error, Result};
use std::ffi::c_void;

/// The barrier kernels, in [`GpuCtx::barrier_func`]'s order.
pub const BARRIER_KERNELS: [&str; 2] = ["barrier_ready", "barrier_done"];
const READY: usize = 0;
const DONE: usize = 1;
/// Threads of a barrier kernel's one block: one per peer at most (kernels.rs `MAX_PEERS`).
pub const BARRIER_THREADS: u32 = 32;
/// Blocks of a barrier kernel: the only thread blocks a copy-engine all-gather takes.
pub const BARRIER_BLOCKS: u32 = 1;

/// CUDA source of the barrier kernels (in the common module, after kernels.rs' helpers).
pub const SOURCE: &str = r#"
// One block: this call's ready barrier alone, or its done barrier alone (which advances the
// call counter), around work that is not a kernel.
extern "C" __global__ void barrier_ready(Ptrs syncs, int n, int me, unsigned long long timeout_ns) {
  arrive_ready(syncs, n, me, call_epoch(syncs.p[me]), timeout_ns);
}
extern "C" __global__ void barrier_done(Ptrs syncs, int n, int me, unsigned long long timeout_ns) {
  arrive_done(syncs, n, me, call_epoch(syncs.p[me]), timeout_ns);
}
"#;

/// One GPU's block and where it goes: `bytes` from `src` into every GPU's output at `offset`
/// (`outs[h] + offset`; none where that is `src` itself).
pub struct Spread<'a> {
    pub src: u64,
    pub outs: &'a [u64],
    pub offset: u64,
    pub bytes: usize,
}

/// Enqueues GPU `me`'s part of an all-gather of `bytes` per GPU on the copy engines: its
/// `input` into block `me` of every GPU's output (`outs[h]`, GPU h's, as `gpu` addresses it)
/// between the ready and done barriers. Returns the thread blocks it takes: one, the
/// barriers'.
///
/// # Safety
/// `input` holds `bytes` and every `outs[h]` `bytes * outs.len()` of device memory `gpu` can
/// address; `syncs[h]` is GPU h's area (kernels.rs `AREA_BYTES`) as `gpu` addresses it; all
/// live until the stream passes the call; every GPU of the call enqueues its part.
#[allow(clippy::too_many_arguments)]
pub unsafe fn all_gather(
    gpu: &GpuCtx,
    stream: sys::CUstream,
    me: usize,
    input: u64,
    outs: &[u64],
    bytes: usize,
    syncs: &[u64],
    timeout_ns: u64,
) -> Result<u32> {
    let s = Spread {
        src: input,
        outs,
        offset: (me * bytes) as u64,
        bytes,
    };
    // SAFETY: the caller's contract.
    unsafe { spread(gpu, stream, me, &s, syncs, timeout_ns, true) }?;
    Ok(BARRIER_BLOCKS)
}

/// Enqueues GPU `me`'s block `s` into every output on the copy engines, the peers' in turn
/// (each GPU starting after itself, so the GPUs spread over the links), its own (if not
/// `src`) on the side stream at the same time, then the done barrier; with `ready`, the
/// ready barrier before the peers' copies (without: the caller's kernel before it on the
/// stream passed one in this call, so every peer's output may be written).
///
/// # Safety
/// As [`all_gather`]: `s.src` and every `s.outs[h] + s.offset` hold `s.bytes` that `gpu`
/// addresses, `syncs` are the call's sync areas; every GPU of the call enqueues its part.
pub unsafe fn spread(
    gpu: &GpuCtx,
    stream: sys::CUstream,
    me: usize,
    s: &Spread<'_>,
    syncs: &[u64],
    timeout_ns: u64,
    ready: bool,
) -> Result<()> {
    let n = s.outs.len();
    if n != syncs.len() || me >= n || n > crate::kernels::MAX_PEERS {
        return Err(Error::invalid(format!(
            "copy-engine collective: GPU {me} of {n} outputs and {} sync areas",
            syncs.len()
        )));
    }
    gpu.bind()?;
    // Out of place, this GPU's own block goes on the side stream, beside the barrier and the
    // peers' copies (after them it added 5% to a 1 GB all-gather on 4 GPUs), and joins
    // before the done barrier. It needs only this stream's order: no peer writes this block.
    // Under capture it stays on the stream: the side stream would join the capture and could
    // not serve this communicator's eager calls on other streams until the capture ends.
    let own = s.outs[me] + s.offset;
    // SAFETY: `stream` is a live stream of this context.
    let fork = own != s.src && s.bytes > 0 && !unsafe { is_capturing(gpu, stream) }?;
    let side = if fork {
        let side = gpu.side_stream()?;
        // SAFETY: both streams are live streams of this context; the copy's ranges are the
        // caller's.
        unsafe {
            stream_waits_for(gpu, side, gpu, stream)?;
            copy_async(own, s.src, s.bytes, side, WHAT)?;
        }
        Some(side)
    } else {
        None
    };
    // The rest before the join: the ready barrier (with `ready`), the peers' copies, and the
    // own block unless it went on the side stream.
    let r = (|| {
        // SAFETY: the caller's contract, as above.
        unsafe {
            if ready {
                barrier(gpu, stream, READY, me, syncs, timeout_ns)?;
            }
            for q in 1..n {
                copy_async(
                    s.outs[(me + q) % n] + s.offset,
                    s.src,
                    s.bytes,
                    stream,
                    WHAT,
                )?;
            }
            if !fork && own != s.src {
                copy_async(own, s.src, s.bytes, stream, WHAT)?;
            }
        }
        Ok(())
    })();
    // Joined on failure too: a stream left forked would hide the first error.
    // SAFETY: as above.
    let joined = side.map_or(Ok(()), |side| unsafe {
        stream_waits_for(gpu, stream, gpu, side)
    });
    r?;
    joined?;
    // SAFETY: as above.
    unsafe { barrier(gpu, stream, DONE, me, syncs, timeout_ns) }
}

const WHAT: &str = "cuMemcpyAsync (copy-engine collective)";

/// Enqueues barrier kernel `which` ([`BARRIER_KERNELS`]) of GPU `me` over `syncs`.
///
/// # Safety
/// `syncs` are the call's sync areas as `gpu` addresses them; `stream` is a live stream of
/// `gpu`'s context, which is current.
unsafe fn barrier(
    gpu: &GpuCtx,
    stream: sys::CUstream,
    which: usize,
    me: usize,
    syncs: &[u64],
    timeout_ns: u64,
) -> Result<()> {
    let f = gpu.barrier_func(which)?;
    let mut pa: Ptrs = ptrs(syncs);
    let (mut n, mut me_i, mut timeout) = (syncs.len() as i32, me as i32, timeout_ns);
    let mut params: [*mut c_void; 4] = [
        &mut pa as *mut Ptrs as *mut c_void,
        &mut n as *mut i32 as *mut c_void,
        &mut me_i as *mut i32 as *mut c_void,
        &mut timeout as *mut u64 as *mut c_void,
    ];
    // SAFETY: the parameters match the kernel's signature and live across the call.
    unsafe {
        enqueue(
            f,
            1,
            BARRIER_THREADS,
            stream,
            &mut params,
            "cuLaunchKernel (barrier)",
        )
    }
}
