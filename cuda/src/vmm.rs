//! Buffers that legacy CUDA IPC (`ipc.rs`) cannot share: memory mapped through the virtual
//! memory API (cuMemCreate), as PyTorch's expandable segments and ncclMemAlloc give. Such a
//! buffer is a run of mapped pieces (PyTorch maps 2 or 20 MiB at a time), each an allocation
//! whose handle can be exported as a POSIX file descriptor when it was made to allow that.
//!
//! The owner names each piece by its base and the driver's buffer id (a new allocation mapped
//! at the same address gets a new id) and passes the descriptor of each piece once; the other
//! process imports it and maps the pieces of a buffer side by side into one view, cached
//! until one of its pieces is replaced. Memory no process can share (stream-ordered pools
//! such as `cudaMallocAsync`'s default pool, VMM memory without a shareable handle) is
//! [`Sharing::None`]: the caller moves its data through memory of its own.

use crate::driver::check;
use cudarc::driver::sys;
use railcc_core::{Error, ErrorKind, Result};
use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// How other processes can reach a device buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// cudaMalloc/cuMemAlloc memory: a legacy IPC handle (`ipc::export`).
    Legacy,
    /// cuMemCreate memory that allows POSIX file-descriptor handles ([`pieces`], [`export_fd`]).
    Fd,
    /// Nothing another process can map.
    None,
}

impl Sharing {
    pub fn name(self) -> &'static str {
        match self {
            Sharing::Legacy => "legacy CUDA IPC",
            Sharing::Fd => "VMM file-descriptor handles",
            Sharing::None => "no handle (staged through the communicator's buffer)",
        }
    }
}

/// What the driver knows of an address: how its memory can be shared, and the mapped range
/// (allocation or piece) holding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtrInfo {
    pub sharing: Sharing,
    pub piece: Piece,
}

/// [`PtrInfo`] of `ptr`, in two driver calls (this runs for every buffer of every call). An
/// address that is not device memory is an error.
pub fn info(ptr: u64) -> Result<PtrInfo> {
    use sys::CUpointer_attribute as A;
    let mut attrs = [
        A::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
        A::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
        A::CU_POINTER_ATTRIBUTE_BUFFER_ID,
    ];
    // Each attribute is at most 8 bytes (the legacy flag a bool or int: its low bytes).
    let mut v = [0u64; 3];
    let mut data: Vec<*mut c_void> = v.iter_mut().map(|x| x as *mut u64 as *mut c_void).collect();
    // SAFETY: three attributes, three 8-byte outputs, all live for the call.
    check(
        unsafe {
            sys::cuPointerGetAttributes(
                attrs.len() as u32,
                attrs.as_mut_ptr(),
                data.as_mut_ptr(),
                ptr,
            )
        },
        "cuPointerGetAttributes",
    )?;
    let [legacy, types, id] = v;
    // The mapping holding `ptr` (for VMM memory one piece, where the range attributes would
    // give the whole reservation); an error for an address that is not device memory.
    let (mut base, mut size) = (0u64, 0usize);
    // SAFETY: valid out-pointers; the driver validates `ptr`.
    check(
        unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) },
        "cuMemGetAddressRange (is the buffer device memory?)",
    )?;
    let fd = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0 as u64;
    let sharing = if legacy as u32 & 0xff != 0 {
        Sharing::Legacy
    } else if types & fd != 0 {
        Sharing::Fd
    } else {
        Sharing::None
    };
    Ok(PtrInfo {
        sharing,
        piece: Piece {
            base,
            size: size as u64,
            id,
        },
    })
}

/// How `ptr`'s memory can be shared.
pub fn sharing_of(ptr: u64) -> Result<Sharing> {
    Ok(info(ptr)?.sharing)
}

/// One mapped piece of a VMM buffer, in its owner's address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub base: u64,
    pub size: u64,
    /// The driver's buffer id: another allocation mapped at `base` later has another.
    pub id: u64,
}

impl Piece {
    pub fn end(&self) -> u64 {
        self.base + self.size
    }
}

/// The pieces that hold `[ptr, ptr + len)` (one when `len` is 0), from `first`, the piece
/// holding `ptr`.
pub fn pieces(first: Piece, ptr: u64, len: u64) -> Result<Vec<Piece>> {
    let mut out = vec![first];
    let mut at = first.end();
    while at < ptr + len.max(1) {
        let p = info(at)?.piece;
        if p.end() <= at {
            return Err(Error::new(
                ErrorKind::Io,
                format!("the driver gave an empty range for 0x{at:x}"),
            )
            .transport(crate::NAME));
        }
        out.push(p);
        at = p.end();
    }
    Ok(out)
}

/// A descriptor another process can import for the allocation mapped at `base` (a piece's).
pub fn export_fd(base: u64) -> Result<OwnedFd> {
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: valid out-pointer; the driver checks that `base` is mapped VMM memory.
    check(
        unsafe { sys::cuMemRetainAllocationHandle(&mut h, base as *mut c_void) },
        "cuMemRetainAllocationHandle",
    )?;
    let mut fd: i32 = -1;
    // SAFETY: for POSIX descriptors the driver writes an int; `h` is retained above and
    // released once below.
    let r = unsafe {
        let r = sys::cuMemExportToShareableHandle(
            &mut fd as *mut i32 as *mut c_void,
            h,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        );
        let _ = sys::cuMemRelease(h);
        r
    };
    check(r, "cuMemExportToShareableHandle (POSIX file descriptor)")?;
    // SAFETY: a fresh descriptor the driver made for us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An imported piece of a peer's buffer.
struct Imported {
    size: u64,
    id: u64,
    handle: sys::CUmemGenericAllocationHandle,
}

/// Pieces side by side in this process's address space.
struct View {
    va: u64,
    size: u64,
    /// Each piece's (base, id) in the peer, as the view was made.
    parts: Vec<(u64, u64)>,
    /// The mapped ranges: (offset in the view, size).
    mapped: Vec<(u64, u64)>,
}

/// Peers' VMM pieces imported into this process, and the views that join them.
#[derive(Default)]
pub struct VmmImports {
    /// Per peer, its pieces by base.
    pieces: HashMap<usize, BTreeMap<u64, Imported>>,
    /// By (peer, first piece's base, last piece's end).
    views: HashMap<(usize, u64, u64), View>,
}

// SAFETY: plain numbers; the driver's handles may be used from any thread.
unsafe impl Send for VmmImports {}

impl VmmImports {
    /// Takes in `peer`'s piece `p`, whose allocation `fd` names, replacing any piece of that
    /// peer it overlaps (and the views made of those).
    pub fn add(&mut self, peer: usize, p: Piece, fd: OwnedFd) -> Result<()> {
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: for POSIX descriptors the driver takes the int's value as the pointer; the
        // descriptor stays ours (closed when `fd` drops).
        check(
            unsafe {
                sys::cuMemImportFromShareableHandle(
                    &mut h,
                    fd.as_raw_fd() as usize as *mut c_void,
                    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                )
            },
            "cuMemImportFromShareableHandle",
        )
        .map_err(|e| e.peer(peer))?;
        let mine = self.pieces.entry(peer).or_default();
        let stale: Vec<u64> = mine
            .range(..p.end())
            .filter(|(b, x)| **b + x.size > p.base)
            .map(|(b, _)| *b)
            .collect();
        for b in stale {
            if let Some(old) = mine.remove(&b) {
                // SAFETY: imported once, released once; views mapping it are dropped below.
                unsafe {
                    let _ = sys::cuMemRelease(old.handle);
                }
            }
        }
        mine.insert(
            p.base,
            Imported {
                size: p.size,
                id: p.id,
                handle: h,
            },
        );
        let old: Vec<(usize, u64, u64)> = self
            .views
            .keys()
            .filter(|(q, s, e)| *q == peer && *s < p.end() && p.base < *e)
            .copied()
            .collect();
        for k in old {
            if let Some(v) = self.views.remove(&k) {
                unmap(&v);
            }
        }
        Ok(())
    }

    /// `peer`'s buffer `[ptr, ptr + len)` as an address in the current context (device
    /// `device`), from the pieces taken in so far.
    pub fn view(&mut self, peer: usize, ptr: u64, len: u64, device: i32) -> Result<u64> {
        let missing = || {
            Error::new(
                ErrorKind::Protocol,
                format!("rank {peer}'s buffer 0x{ptr:x} (+{len} bytes) was not shared with this process"),
            )
            .peer(peer)
            .transport(crate::NAME)
        };
        let mine = self.pieces.get(&peer).ok_or_else(missing)?;
        let mut parts = Vec::new();
        let mut at = ptr;
        let (mut first, mut end) = (None, 0u64);
        while at < ptr + len.max(1) {
            let (b, x) = mine.range(..=at).next_back().ok_or_else(missing)?;
            if b + x.size <= at {
                return Err(missing());
            }
            first.get_or_insert(*b);
            parts.push((*b, x.id));
            end = b + x.size;
            at = end;
        }
        let first = first.ok_or_else(missing)?;
        let key = (peer, first, end);
        if let Some(v) = self.views.get(&key) {
            if v.parts == parts {
                return Ok(v.va + (ptr - first));
            }
        }
        if let Some(v) = self.views.remove(&key) {
            unmap(&v);
        }
        let size = end - first;
        let mut va = 0u64;
        // SAFETY: valid out-pointer; reserves address space only. 2 MiB: the pieces'
        // granularity, so each lands at an aligned offset.
        check(
            unsafe { sys::cuMemAddressReserve(&mut va, size as usize, 2 << 20, 0, 0) },
            "cuMemAddressReserve",
        )?;
        let mut v = View {
            va,
            size,
            parts: parts.clone(),
            mapped: Vec::new(),
        };
        for (b, _) in &parts {
            let x = &mine[b];
            // SAFETY: inside the reservation; the handle is imported and live.
            let r = unsafe { sys::cuMemMap(va + (b - first), x.size as usize, 0, x.handle, 0) };
            if let Err(e) = check(r, "cuMemMap (a peer's piece)") {
                unmap(&v);
                return Err(e.peer(peer));
            }
            v.mapped.push((b - first, x.size));
        }
        let access = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: device,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the whole reservation is mapped above.
        if let Err(e) = check(
            unsafe { sys::cuMemSetAccess(va, size as usize, &access, 1) },
            "cuMemSetAccess (a peer's buffer)",
        ) {
            unmap(&v);
            return Err(e.peer(peer));
        }
        let at = v.va + (ptr - first);
        self.views.insert(key, v);
        Ok(at)
    }
}

/// Unmaps a view's pieces and frees its address range.
fn unmap(v: &View) {
    for (off, size) in &v.mapped {
        // SAFETY: a range we mapped in our reservation, unmapped once.
        unsafe {
            let _ = sys::cuMemUnmap(v.va + off, *size as usize);
        }
    }
    // SAFETY: reserved by us with this size, freed once.
    unsafe {
        let _ = sys::cuMemAddressFree(v.va, v.size as usize);
    }
}

impl Drop for VmmImports {
    fn drop(&mut self) {
        for (_, v) in self.views.drain() {
            unmap(&v);
        }
        for (_, m) in self.pieces.drain() {
            for (_, x) in m {
                // SAFETY: imported once, released once, after every view is unmapped.
                unsafe {
                    let _ = sys::cuMemRelease(x.handle);
                }
            }
        }
    }
}

/// Device memory made with the virtual memory API, mapped for this device and every device
/// that can reach it, and shareable with other processes by descriptor: ncclMemAlloc's.
pub struct VmmAlloc {
    pub ptr: u64,
    pub size: usize,
    handle: sys::CUmemGenericAllocationHandle,
}

impl VmmAlloc {
    /// `bytes` (rounded up to the granularity) on device `device` (the current context's).
    pub fn new(bytes: usize, device: i32, peers: &[i32]) -> Result<VmmAlloc> {
        let mut prop: sys::CUmemAllocationProp = unsafe_zeroed_prop();
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location = sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        };
        prop.requestedHandleTypes =
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        let mut gran = 0usize;
        // SAFETY: valid pointers.
        check(
            unsafe {
                sys::cuMemGetAllocationGranularity(
                    &mut gran,
                    &prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
                )
            },
            "cuMemGetAllocationGranularity",
        )?;
        let gran = gran.max(1);
        let size = bytes.max(1).div_ceil(gran) * gran;
        let mut handle = 0;
        // SAFETY: valid pointers; released on every path below.
        check(
            unsafe { sys::cuMemCreate(&mut handle, size, &prop, 0) },
            "cuMemCreate",
        )?;
        let mut a = VmmAlloc {
            ptr: 0,
            size,
            handle,
        };
        // SAFETY: reserving address space only.
        check(
            unsafe { sys::cuMemAddressReserve(&mut a.ptr, size, gran, 0, 0) },
            "cuMemAddressReserve",
        )?;
        // SAFETY: the reservation holds `size`; the handle is live.
        check(
            unsafe { sys::cuMemMap(a.ptr, size, 0, handle, 0) },
            "cuMemMap",
        )?;
        let descs: Vec<sys::CUmemAccessDesc> = std::iter::once(device)
            .chain(peers.iter().copied().filter(|&p| p != device))
            .map(|id| sys::CUmemAccessDesc {
                location: sys::CUmemLocation {
                    type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id,
                },
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
            .collect();
        // SAFETY: mapped above; `descs` outlives the call.
        check(
            unsafe { sys::cuMemSetAccess(a.ptr, size, descs.as_ptr(), descs.len()) },
            "cuMemSetAccess",
        )?;
        Ok(a)
    }
}

fn unsafe_zeroed_prop() -> sys::CUmemAllocationProp {
    // SAFETY: a plain C struct of integers, enums whose zero is a valid value, and pointers;
    // all zero is the documented starting point.
    unsafe { std::mem::zeroed() }
}

impl Drop for VmmAlloc {
    fn drop(&mut self) {
        // SAFETY: each step undoes one of `new`'s, once; a failed step left zeros behind.
        unsafe {
            if self.ptr != 0 {
                let _ = sys::cuMemUnmap(self.ptr, self.size);
                let _ = sys::cuMemAddressFree(self.ptr, self.size);
            }
            let _ = sys::cuMemRelease(self.handle);
        }
    }
}
