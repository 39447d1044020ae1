//! GPU buffers over the communicator's network transport (TCP or RDMA), for ranks whose peers
//! CUDA IPC cannot reach (other machines). Each call waits for the caller's stream, copies the
//! input into pinned host memory, runs the host collective, and copies the result back: it
//! returns when the result is on the GPU (synchronous, unlike the NVLink path's stream-ordered
//! kernels). The pinned buffers are registered with the communicator once, so RDMA moves
//! them without a registration per call.
//!
//! GPUDirect RDMA, small on purpose and untested (no machine here has a GPU and an RDMA NIC
//! together): with `RAILCC_GPU_DIRECT=1` on an RDMA communicator, buffers the caller registers
//! with [`GpuOverNet::register_device`] are exported as dma-buf and registered with the NIC,
//! and a send/recv whose buffers lie in them skips the staging: the NIC reads and writes GPU
//! memory. Collectives that copy or reduce on the host stay staged.

use crate::comm::{Bufs, Communicator};
use crate::plan::CollArgs;
use crate::regions::RegionId;
use railcc_core::call::CollKind;
use railcc_core::{Error, Result};
use railcc_cuda::dmabuf::DmaBuf;
use railcc_cuda::gpu::{GpuCtx, Stream};
use railcc_cuda::staging::{download_sync, gpu_net_path, upload_sync, wait_stream, PinnedBuf};

/// One pinned buffer and its registration.
struct Staged {
    buf: PinnedBuf,
    region: RegionId,
}

/// A caller's device buffer registered for GPUDirect RDMA, and its dma-buf export.
struct Direct {
    buf: DmaBuf,
    region: RegionId,
}

pub struct GpuOverNet<'c> {
    comm: &'c Communicator,
    send: Option<Staged>,
    recv: Option<Staged>,
    path: String,
    /// RAILCC_GPU_DIRECT=1 on an RDMA communicator.
    direct_ok: bool,
    direct: Vec<Direct>,
}

impl<'c> GpuOverNet<'c> {
    /// For ranks on GPU `ordinal`.
    pub fn new(comm: &'c Communicator, ordinal: usize) -> GpuOverNet<'c> {
        let direct_ok = comm.config().gpu_direct == 1 && comm.transport().starts_with("rdma");
        let path = gpu_net_path(ordinal, direct_ok);
        tracing::info!("rank {}: GPU {ordinal} data {path}", comm.rank());
        GpuOverNet {
            comm,
            send: None,
            recv: None,
            path,
            direct_ok,
            direct: Vec::new(),
        }
    }

    /// Offers `len` bytes of device memory at `addr` for GPUDirect RDMA (like
    /// `ncclCommRegister`). Returns whether it was taken: false when GPUDirect is off, the
    /// transport is not RDMA, or the driver cannot export it (logged); such buffers are staged.
    ///
    /// # Safety
    /// `addr..addr+len` must be memory of `gpu`'s context that stays allocated until
    /// [`GpuOverNet::deregister_device`] or this value is dropped.
    pub unsafe fn register_device(&mut self, gpu: &GpuCtx, addr: u64, len: usize) -> Result<bool> {
        if !self.direct_ok || len == 0 {
            return Ok(false);
        }
        let buf = match DmaBuf::export(gpu, addr, len) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(
                    "rank {}: GPUDirect RDMA off for this buffer: {e}",
                    self.comm.rank()
                );
                return Ok(false);
            }
        };
        let region = self.comm.register_dmabuf(addr, len, buf.fd(), buf.offset)?;
        self.direct.push(Direct { buf, region });
        Ok(true)
    }

    /// Drops the GPUDirect registrations of buffers that start at `addr`.
    pub fn deregister_device(&mut self, addr: u64) -> Result<()> {
        let mut first = Ok(());
        for d in self.direct.extract_if(.., |d| d.buf.addr == addr) {
            first = first.and(self.comm.deregister(d.region));
        }
        first
    }

    fn registered(&self, addr: u64, len: usize) -> bool {
        self.direct
            .iter()
            .any(|d| addr >= d.buf.addr && addr + len as u64 <= d.buf.addr + d.buf.len as u64)
    }

    /// How GPU data reaches the network here (for logs and bench headers).
    pub fn path(&self) -> &str {
        &self.path
    }

    fn ensure(
        comm: &Communicator,
        gpu: &GpuCtx,
        slot: &mut Option<Staged>,
        bytes: usize,
    ) -> Result<()> {
        if slot.as_ref().is_some_and(|s| s.buf.len() >= bytes) {
            return Ok(());
        }
        if let Some(old) = slot.take() {
            comm.deregister(old.region)?;
        }
        // Grow by doubling so a sweep of sizes reallocates a few times, not every call.
        let want = bytes.max(1).next_power_of_two();
        let buf = PinnedBuf::new(gpu, want)?;
        // SAFETY: the pinned buffer lives in `slot` until after its region is deregistered
        // (above, or in Drop).
        let region = unsafe { comm.register(buf.as_slice().as_ptr(), buf.len()) }?;
        *slot = Some(Staged { buf, region });
        Ok(())
    }

    /// Runs collective `a` on device buffers `send` and `recv` (device addresses in `gpu`'s
    /// context), after the work already on `stream`.
    ///
    /// # Safety
    /// `send` and `recv` must be valid device memory of the sizes `a` implies
    /// (`send_elems`, `recv_elems`), laid out as for the host API (in place: `send` inside
    /// `recv` where NCCL puts it).
    pub unsafe fn collective(
        &mut self,
        gpu: &GpuCtx,
        a: CollArgs,
        send: u64,
        recv: u64,
        stream: Stream,
    ) -> Result<()> {
        let es = a.dtype.size();
        let (sb, rb) = (a.send_elems() * es, a.recv_elems() * es);
        let comm = self.comm;
        if a.coll == CollKind::SendRecv
            && comm.nranks() > 1
            && self.registered(send, sb)
            && self.registered(recv, rb)
        {
            // GPUDirect: the NIC reads `send` and writes `recv` once the stream's work is done.
            wait_stream(gpu, stream)?;
            return comm.collective_device(a, send, recv);
        }
        Self::ensure(comm, gpu, &mut self.send, sb)?;
        Self::ensure(comm, gpu, &mut self.recv, rb)?;
        let (Some(s), Some(r)) = (self.send.as_mut(), self.recv.as_mut()) else {
            return Err(Error::invalid("gpu over net: staging buffers missing"));
        };
        if sb > 0 {
            download_sync(gpu, stream, &mut s.buf, send, sb)?;
        }
        comm.collective(
            a,
            Bufs::OutOfPlace {
                send: &s.buf.as_slice()[..sb],
                recv: &mut r.buf.as_mut_slice()[..rb],
            },
        )?;
        // A reduce leaves the receive buffers of ranks other than the root as they were.
        let writes = !(a.coll == CollKind::Reduce && comm.rank() != a.root);
        if writes && rb > 0 {
            upload_sync(gpu, stream, recv, &r.buf, rb)?;
        }
        Ok(())
    }
}

impl Drop for GpuOverNet<'_> {
    fn drop(&mut self) {
        for d in self.direct.drain(..) {
            if let Err(e) = self.comm.deregister(d.region) {
                tracing::warn!("gpu over net: deregister device buffer: {e}");
            }
        }
        for s in [self.send.take(), self.recv.take()].into_iter().flatten() {
            if let Err(e) = self.comm.deregister(s.region) {
                tracing::warn!("gpu over net: deregister: {e}");
            }
        }
    }
}
