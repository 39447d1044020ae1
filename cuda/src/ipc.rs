//! Reaching another process's GPU memory: the CUDA IPC handle of the allocation holding a
//! buffer ([`export`]), and a cache of peers' handles opened in this process ([`Imports`]).
//! How the handles travel between processes is the caller's business (the per-process GPU
//! path publishes them each call in a shared-memory table: `railcc_transport_nvlink::table`).

use crate::driver::check;
use cudarc::driver::sys;
use railcc_core::{Error, ErrorKind, Result};
use std::collections::HashMap;

pub const HANDLE_BYTES: usize = 64;

/// [`BufDesc::kind`] of a legacy IPC handle.
pub const KIND_LEGACY: u64 = 0;
/// [`BufDesc::kind`] of a buffer of VMM pieces (`vmm.rs`): `handle` holds, as a little-endian
/// u64, how many pieces the owner had posted once this buffer's were; `base` is the buffer's
/// address in the owner and `size` its length.
pub const KIND_VMM: u64 = 1;

/// One buffer as its owner exports it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufDesc {
    pub kind: u64,
    pub handle: [u8; HANDLE_BYTES],
    /// The allocation's base in the owner's address space (the cache key) and our offset in it.
    pub base: u64,
    pub offset: u64,
    pub size: u64,
}

impl BufDesc {
    /// No buffer (an entry that carries none).
    pub const EMPTY: BufDesc = BufDesc {
        kind: KIND_LEGACY,
        handle: [0; HANDLE_BYTES],
        base: 0,
        offset: 0,
        size: 0,
    };
}

/// The IPC handle of the allocation holding `ptr`, and `ptr`'s offset in it.
pub fn export(ptr: u64) -> Result<BufDesc> {
    let (mut base, mut size) = (0u64, 0usize);
    // SAFETY: valid out-pointers; the driver validates `ptr`.
    check(
        unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) },
        "cuMemGetAddressRange (is the buffer device memory from cudaMalloc?)",
    )?;
    export_in(ptr, base, size as u64)
}

/// As [`export`], where the allocation holding `ptr` is known to be `[base, base + size)`.
pub fn export_in(ptr: u64, base: u64, size: u64) -> Result<BufDesc> {
    let mut h = sys::CUipcMemHandle {
        reserved: [0; HANDLE_BYTES],
    };
    // SAFETY: valid out-pointer; the driver validates `base`.
    check(
        unsafe { sys::cuIpcGetMemHandle(&mut h, base) },
        "cuIpcGetMemHandle (buffers must come from cudaMalloc/cuMemAlloc to be shared)",
    )?;
    Ok(BufDesc {
        kind: KIND_LEGACY,
        handle: h.reserved.map(|c| c as u8),
        base,
        offset: ptr - base,
        size,
    })
}

/// Peers' allocations opened in this process, keyed by (peer rank, base in the peer). A new
/// handle overlapping a mapped range of the same peer means the peer freed that allocation
/// and made another: the old mapping is closed first (IPC maps at the exporter's address, so
/// the stale one would be in the way: CUDA_ERROR_ALREADY_MAPPED).
#[derive(Default)]
pub struct Imports {
    open: HashMap<(usize, u64), ([u8; HANDLE_BYTES], u64, u64)>,
}

impl Imports {
    /// `d` (exported by `peer`) as an address in the current context. `may_close`: a stale
    /// mapping in the way may be closed here. cuIpcCloseMemHandle waits for the device, so a
    /// thread that work on this device waits for (the deferred launcher) must pass false:
    /// it gets an error instead of a deadlock (its peers never publish such buffers then).
    pub fn map(&mut self, peer: usize, d: &BufDesc, may_close: bool) -> Result<u64> {
        if let Some((h, mapped, _)) = self.open.get(&(peer, d.base)) {
            if *h == d.handle {
                return Ok(mapped + d.offset);
            }
        }
        let stale: Vec<(usize, u64)> = self
            .open
            .iter()
            .filter(|((p, b), (_, _, size))| {
                *p == peer && *b < d.base + d.size.max(1) && d.base < b + (*size).max(1)
            })
            .map(|(k, _)| *k)
            .collect();
        if !stale.is_empty() && !may_close {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!(
                    "rank {peer} published an allocation at 0x{:x} over one of its own mapped here before; closing that mapping would wait for the device",
                    d.base
                ),
            )
            .peer(peer));
        }
        for k in stale {
            if let Some((_, old, _)) = self.open.remove(&k) {
                // SAFETY: `old` came from `open` and is closed once; the caller (may_close)
                // vouches that nothing it waits for still reads it.
                unsafe { close(old) };
            }
        }
        let mapped = open(&d.handle).map_err(|e| e.peer(peer))?;
        self.open.insert((peer, d.base), (d.handle, mapped, d.size));
        Ok(mapped + d.offset)
    }
}

impl Drop for Imports {
    fn drop(&mut self) {
        for (_, (_, p, _)) in self.open.drain() {
            // SAFETY: each mapping came from `open` and is closed once.
            unsafe { close(p) };
        }
    }
}

/// Opens a peer's IPC handle in the current context (peer access enabled lazily).
pub fn open(handle: &[u8; HANDLE_BYTES]) -> Result<u64> {
    let h = sys::CUipcMemHandle {
        reserved: handle.map(|b| b as std::ffi::c_char),
    };
    let mut p = 0u64;
    // SAFETY: valid out-pointer; the driver validates the handle.
    check(
        unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut p,
                h,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        },
        "cuIpcOpenMemHandle",
    )?;
    Ok(p)
}

/// Closes a mapping [`open`] returned (in the current context).
///
/// # Safety
/// `mapped` came from [`open`], is closed once, and no work still reads it.
pub unsafe fn close(mapped: u64) {
    // SAFETY: the caller's contract.
    unsafe {
        let _ = sys::cuIpcCloseMemHandle(mapped);
    }
}
