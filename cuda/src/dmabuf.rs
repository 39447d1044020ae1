//! GPU memory exported as a Linux dma-buf, so an RDMA NIC can register it and move it without
//! a copy through host memory (GPUDirect RDMA; `ibv_reg_dmabuf_mr` on the other side). The
//! export is tested on a GPU; registration with a NIC is not: no machine here has both.

use crate::driver::check;
use crate::gpu::GpuCtx;
use cudarc::driver::sys;
use railcc_core::Result;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `len` bytes of device memory at `addr`, exported; the descriptor closes on drop.
pub struct DmaBuf {
    fd: OwnedFd,
    /// Where `addr` lies in the exported range (it starts on a host page boundary).
    pub offset: u64,
    pub addr: u64,
    pub len: usize,
}

impl DmaBuf {
    /// Exports the host pages covering `addr..addr+len` of memory allocated in `gpu`'s
    /// context (cuMemGetHandleForAddressRange needs page-aligned ranges).
    pub fn export(gpu: &GpuCtx, addr: u64, len: usize) -> Result<DmaBuf> {
        gpu.bind()?;
        // SAFETY: sysconf has no preconditions.
        let page = (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as u64;
        let base = addr & !(page - 1);
        let end = (addr + len.max(1) as u64).next_multiple_of(page);
        let mut fd: i32 = -1;
        // SAFETY: `fd` is a valid out-pointer for the int the driver writes for a dma-buf
        // handle; the range is checked by the driver against the context's allocations.
        check(
            unsafe {
                sys::cuMemGetHandleForAddressRange(
                    &mut fd as *mut i32 as *mut std::ffi::c_void,
                    base,
                    (end - base) as usize,
                    sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                    0,
                )
            },
            "cuMemGetHandleForAddressRange(dma-buf)",
        )?;
        // SAFETY: on success the driver handed us a new descriptor that nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(DmaBuf {
            fd,
            offset: addr - base,
            addr,
            len,
        })
    }

    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    /// On a GPU: device memory exports as a dma-buf (the kernel lists an exporter for the
    /// descriptor), at an offset inside the page-aligned range. Without a driver: a skip line.
    #[test]
    fn device_memory_exports_as_a_dma_buf() {
        let Some(gpus) = crate::driver::gpus_or_skip("dma-buf export") else {
            return;
        };
        let gpu = crate::gpu::GpuCtx::new(gpus[0].ordinal, None).expect("context");
        let buf = gpu.alloc(1 << 20).expect("alloc");
        let addr = buf.ptr + 4096 + 8;
        let d = match super::DmaBuf::export(&gpu, addr, 1000) {
            Ok(d) => d,
            Err(e) => {
                // Drivers without dma-buf support (closed kernel modules) refuse cleanly.
                println!("SKIP dma-buf export unsupported by this driver: {e}");
                return;
            }
        };
        assert!(d.fd() >= 0);
        assert!(
            d.offset < 4096 && (addr - d.offset).is_multiple_of(4096),
            "offset {}",
            d.offset
        );
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", d.fd())).unwrap();
        assert!(info.contains("exp_name"), "not a dma-buf: {info}");
        println!(
            "dma-buf export of GPU {} memory: fd {}, offset {}, {}",
            gpus[0].ordinal,
            d.fd(),
            d.offset,
            info.lines()
                .find(|l| l.starts_with("exp_name"))
                .unwrap_or_default()
        );
    }
}
