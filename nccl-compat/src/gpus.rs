//! The GPUs of one communicator: railcc's multi-GPU executor, and stream-ordered copies for
//! send/recv.

use crate::clique::{Call, Half};
use cudarc::driver::sys;
use railcc_core::{Error, Result};
use railcc_cuda::driver::check;
use railcc_cuda::gpu::stream_waits_for;
use railcc_transport_nvlink::multi::MultiGpu;

pub struct Gpus {
    multi: MultiGpu,
    /// Launches from several threads take turns (the executor's call counters are per call).
    turn: parking_lot::Mutex<()>,
}

// SAFETY: MultiGpu holds driver handles (contexts, streams, device pointers) that the CUDA
// driver lets any thread use; every launch and copy goes through `turn`, one at a time.
unsafe impl Send for Gpus {}
// SAFETY: as above; shared references only launch work under `turn`.
unsafe impl Sync for Gpus {}

fn stream(s: usize) -> sys::CUstream {
    s as sys::CUstream
}

impl Gpus {
    pub fn open(devices: &[i32]) -> std::result::Result<Gpus, Error> {
        let ordinals: Vec<usize> = devices.iter().map(|&d| d.max(0) as usize).collect();
        let cfg = crate::config()?;
        let cache = std::env::var_os("RAILCC_CACHE_DIR").map(std::path::PathBuf::from);
        let mut multi = MultiGpu::new(&ordinals, cache.as_deref())?;
        multi.set_max_blocks(cfg.gpu_max_blocks)?;
        multi.ll_max_bytes = cfg.gpu_ll_max_bytes;
        Ok(Gpus {
            multi,
            turn: parking_lot::Mutex::new(()),
        })
    }

    /// One collective, every rank's call given (they agree: checked by the clique).
    pub fn collective(&self, calls: &[Call]) -> Result<()> {
        let c = calls[0];
        let ins: Vec<u64> = calls.iter().map(|c| c.send).collect();
        let outs: Vec<u64> = calls.iter().map(|c| c.recv).collect();
        let streams: Vec<sys::CUstream> = calls.iter().map(|c| stream(c.stream)).collect();
        let _t = self.turn.lock();
        if c.count == 0 {
            return Ok(());
        }
        // SAFETY: the buffers and streams are the callers' (NCCL's contract: device memory of
        // each rank's GPU, large enough for the call, live until the streams pass it).
        unsafe {
            self.multi.collective_on(
                &streams, c.coll, &ins, &outs, c.count, c.dtype, c.op, c.root,
            )
        }
        .map(|_| ())
    }

    /// Copies `s` (rank `src`'s send) into `r` (rank `dst`'s receive): the receiver's stream
    /// waits for the sender's stream to reach the send, copies, and the sender's stream waits
    /// for the copy (so the send buffer is not reused early).
    pub fn copy(&self, src: usize, s: Half, dst: usize, r: Half) -> Result<()> {
        let _t = self.turn.lock();
        if s.bytes == 0 {
            return Ok(());
        }
        let (gs, gr) = (self.multi.gpu(src), self.multi.gpu(dst));
        let (ss, rs) = (stream(s.stream), stream(r.stream));
        // SAFETY: the streams are the callers' streams of each GPU (or the NULL stream); peer
        // access between the GPUs is enabled (MultiGpu::new), so the receiver's copy may read
        // the sender's memory; both ranges are the callers' buffers of `bytes`.
        unsafe {
            stream_waits_for(gr, rs, gs, ss)?;
            check(
                sys::cuMemcpyAsync(r.ptr, s.ptr, s.bytes, rs),
                "cuMemcpyAsync",
            )?;
            stream_waits_for(gs, ss, gr, rs)
        }
    }
}
