//! Registered memory: host buffers (like `ncclCommRegister`), GPU buffers exported as dma-buf
//! for GPUDirect RDMA, and the one collective that runs on the latter.

use super::*;

impl Communicator {
    /// Registers `len` bytes at `ptr` for every transfer into or out of them, like
    /// `ncclCommRegister`: over RDMA such transfers go zero-copy without pinning pages per
    /// call. Registration with each peer's connection happens on the first transfer there.
    ///
    /// # Safety
    /// The memory must stay allocated and mapped until [`Communicator::deregister`] returns or
    /// the communicator is dropped: freed and reused pages would receive data meant for the
    /// old ones.
    pub unsafe fn register(&self, ptr: *const u8, len: usize) -> Result<RegionId> {
        let mut st = self.state.lock();
        self.check_usable(&st)?;
        st.regions
            .add(ptr as usize, len, self.nranks)
            .map_err(|e| e.rank(self.rank))
    }

    /// Registers GPU memory exported as a dma-buf (`ptr` at `offset` in `fd`) for GPUDirect
    /// RDMA. Only an RDMA communicator takes it; the caller keeps the memory and the
    /// descriptor alive until [`Communicator::deregister`].
    ///
    /// # Safety
    /// `ptr..ptr+len` must be device memory that stays allocated while registered.
    pub unsafe fn register_dmabuf(
        &self,
        ptr: u64,
        len: usize,
        fd: i32,
        offset: u64,
    ) -> Result<RegionId> {
        if !self.transport_desc.starts_with("rdma") {
            return Err(Error::invalid(format!(
                "GPU memory can be registered only over RDMA; this communicator uses {}",
                self.transport_desc
            ))
            .rank(self.rank));
        }
        let mut st = self.state.lock();
        self.check_usable(&st)?;
        st.regions
            .add_dmabuf(ptr as usize, len, self.nranks, fd, offset)
            .map_err(|e| e.rank(self.rank))
    }

    /// Runs collective `a` on device memory the network moves directly (GPUDirect RDMA): only
    /// a send/recv across ranks (no copy or reduction touches the buffers on the host), with
    /// both buffers inside regions from [`Communicator::register_dmabuf`]; anything else is
    /// refused, since the host would read device memory.
    ///
    /// # Safety
    /// `send` and `recv` must be device memory of `a`'s sizes, not touched by the GPU until
    /// this returns.
    pub unsafe fn collective_device(&self, a: CollArgs, send: u64, recv: u64) -> Result<()> {
        let es = a.dtype.size();
        let (sb, rb) = (a.send_elems() * es, a.recv_elems() * es);
        let direct = a.coll == CollKind::SendRecv && self.nranks > 1 && a.nranks == self.nranks;
        let covered = {
            let st = self.state.lock();
            st.regions.covered_by_device(send as usize, sb)
                && st.regions.covered_by_device(recv as usize, rb)
        };
        if !direct || !covered {
            return Err(Error::invalid(format!(
                "{}: GPUDirect RDMA runs send/recv across ranks on registered GPU buffers only",
                a.coll.name()
            ))
            .rank(self.rank));
        }
        let s = RawBuf {
            ptr: send as *mut u8,
            bytes: sb,
            writable: false,
        };
        let r = RawBuf {
            ptr: recv as *mut u8,
            bytes: rb,
            writable: true,
        };
        self.run_collective(a, s, r, false)
    }

    /// Drops a registration made by [`Communicator::register`].
    pub fn deregister(&self, id: RegionId) -> Result<()> {
        let mut st = self.state.lock();
        let State { conns, regions, .. } = &mut *st;
        regions.remove(id, conns).map_err(|e| e.rank(self.rank))
    }
}
