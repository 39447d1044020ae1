//! Premultiplied sums (ncclRedOpCreatePreMulSum): every rank's input times that rank's own
//! scalar, then summed.
//!
//! railcc scales the input on the caller's stream (a small kernel, `railcc_cuda::launch::
//! scale`) and runs a plain sum over the result, so every path (the multi-GPU kernels, CUDA
//! IPC, the network engine) supports it unchanged. An all-reduce scales into its receive
//! buffer; a reduce or reduce-scatter, whose receive buffer is too small (or absent off the
//! root), scales into a scratch buffer of the communicator.
//!
//! Scratch is kept per stream, because calls on one stream run in order: the next call's
//! scale waits for the last call's sum. Within one ncclGroupStart/End, several calls share the
//! stream's scratch side by side (their sums run after every scale). Chunks grow (doubling) and
//! are freed only with the communicator: freeing device memory waits for the whole GPU, which
//! may be running the very collective that waits on this thread's peers. Scratch cannot grow
//! while a CUDA graph is being captured; such a call fails naming that, and running the call
//! once before capture sizes the scratch.

use crate::{config, group, Comm};
use parking_lot::Mutex;
use railcc_core::call::Call;
use railcc_core::call::CollKind;
use railcc_core::{DataType, Error, ErrorKind, ReduceOp, Result};
use railcc_cuda::gpu::{DevBuf, GpuCtx};
use railcc_cuda::launch::{scale, Scalar};
use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::OnceLock;

/// The first handle of a user op, as NCCL numbers them (ncclNumOps, then up).
pub const FIRST_USER_OP: c_int = 5;

#[derive(Debug, Clone, Copy)]
pub struct PreMul {
    pub dtype: DataType,
    pub scalar: Scalar,
}

/// One stream's scratch.
#[derive(Default)]
struct Arena {
    /// (buffer, bytes handed out in the current batch)
    chunks: Vec<(DevBuf, usize)>,
    /// The group the current batch belongs to (None: an eager call).
    group: Option<u64>,
}

/// A communicator's user ops and what running them needs.
#[derive(Default)]
pub struct UserOps {
    ops: Mutex<Vec<Option<PreMul>>>,
    /// A context with the scale kernels loaded, made at the first op's creation.
    gpu: OnceLock<GpuCtx>,
    scratch: Mutex<HashMap<usize, Arena>>,
}

impl UserOps {
    /// Registers an op; its handle is FIRST_USER_OP + its slot (slots are reused).
    pub fn create(&self, device: i32, op: PreMul) -> Result<c_int> {
        if self.gpu.get().is_none() {
            let cache = config()?.kernel_cache_dir();
            let g = GpuCtx::new(device.max(0) as usize, cache.as_deref())?;
            let _ = self.gpu.set(g);
        }
        let mut ops = self.ops.lock();
        let slot = match ops.iter().position(Option::is_none) {
            Some(i) => {
                ops[i] = Some(op);
                i
            }
            None => {
                ops.push(Some(op));
                ops.len() - 1
            }
        };
        c_int::try_from(slot)
            .ok()
            .and_then(|s| s.checked_add(FIRST_USER_OP))
            .ok_or_else(|| Error::invalid("too many reduction ops on one communicator"))
    }

    pub fn get(&self, handle: c_int) -> Option<PreMul> {
        let slot = usize::try_from(handle.checked_sub(FIRST_USER_OP)?).ok()?;
        self.ops.lock().get(slot).copied().flatten()
    }

    /// Forgets an op; false when the handle names none.
    pub fn destroy(&self, handle: c_int) -> bool {
        let Some(slot) = handle
            .checked_sub(FIRST_USER_OP)
            .and_then(|s| usize::try_from(s).ok())
        else {
            return false;
        };
        let mut ops = self.ops.lock();
        match ops.get_mut(slot) {
            Some(o @ Some(_)) => {
                *o = None;
                true
            }
            _ => false,
        }
    }

    /// Scales `call`'s input on its stream and turns it into a plain sum of the scaled data.
    pub fn prepare(&self, comm: &Comm, call: &mut Call, op: PreMul) -> Result<()> {
        let what = call.args.coll.name();
        if op.dtype != call.args.dtype {
            return Err(Error::invalid(format!(
                "{what}: the premultiplied-sum op was made for {}, the call is {}",
                op.dtype, call.args.dtype
            )));
        }
        let elems = match call.args.coll {
            CollKind::AllReduce | CollKind::Reduce => call.args.count,
            CollKind::ReduceScatter => call.args.count * comm.nranks,
            _ => return Ok(()),
        };
        call.args.op = ReduceOp::Sum;
        if elems == 0 {
            return Ok(());
        }
        let gpu = self
            .gpu
            .get()
            .ok_or_else(|| Error::new(ErrorKind::Aborted, "premultiplied sum without a GPU"))?;
        let stream = railcc_cuda::gpu::stream_of(call.stream);
        let dst = if call.args.coll == CollKind::AllReduce {
            call.recv
        } else {
            self.scratch(gpu, call.stream, elems * call.args.dtype.size())?
        };
        // SAFETY: NCCL's contract: the send buffer holds `elems` elements of this GPU's memory
        // until the stream passes the call; `dst` is the receive buffer (as large, for
        // all-reduce) or scratch we hold until the communicator is destroyed; a device scalar
        // stays valid until the call completes (NCCL's rule for ncclScalarDevice).
        unsafe {
            scale(
                gpu,
                stream,
                call.args.dtype,
                call.send,
                dst,
                elems as u64,
                op.scalar,
            )
        }?;
        call.send = dst;
        Ok(())
    }

    /// `bytes` of this stream's scratch not handed out yet in the current batch.
    fn scratch(&self, gpu: &GpuCtx, stream: usize, bytes: usize) -> Result<u64> {
        const ALIGN: usize = 256;
        let mut all = self.scratch.lock();
        let arena = all.entry(stream).or_default();
        let batch = group::in_group().then(group::generation);
        if batch.is_none() || arena.group != batch {
            arena.chunks.iter_mut().for_each(|c| c.1 = 0);
            arena.group = batch;
        }
        if let Some((buf, used)) = arena
            .chunks
            .iter_mut()
            .find(|(b, used)| b.bytes - *used >= bytes)
        {
            let p = buf.ptr + *used as u64;
            *used += bytes.div_ceil(ALIGN) * ALIGN;
            return Ok(p);
        }
        // SAFETY: the caller's stream of this GPU (NCCL's contract).
        if unsafe { railcc_cuda::gpu::is_capturing(gpu, railcc_cuda::gpu::stream_of(stream)) }? {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "a premultiplied sum needs {bytes} more bytes of scratch while the stream is captured into a CUDA graph (memory cannot be allocated then); run the call once before capturing"
                ),
            ));
        }
        let largest = arena.chunks.iter().map(|c| c.0.bytes).max().unwrap_or(0);
        let buf = gpu.alloc(bytes.max(2 * largest).div_ceil(ALIGN) * ALIGN)?;
        let p = buf.ptr;
        arena.chunks.push((buf, bytes.div_ceil(ALIGN) * ALIGN));
        Ok(p)
    }
}
