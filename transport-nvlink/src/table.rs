//! The shared-memory table through which the ranks of one host publish each call's buffers
//! (the per-process GPU path, proc.rs).
//!
//! Why a per-call table rather than registration: NCCL users pass arbitrary buffers (PyTorch's
//! caching allocator hands out pieces of large segments), so each call publishes the allocation
//! (as an IPC handle, `railcc_cuda::ipc`) and offset of its buffers; a peer opens each
//! allocation once and reuses the mapping while the handle stays the same. Publishing is a few
//! atomic stores and loads in shared memory, about a microsecond, where a round trip over the
//! bootstrap sockets would cost tens. The table doubles as a mismatch check: each entry carries
//! the call's shape.

use railcc_core::{Error, ErrorKind, Result};
use railcc_cuda::ipc::BufDesc;
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What a rank publishes for one call: the call number (written last), the call's shape, and
/// its send and receive buffers.
#[repr(C)]
struct Slot {
    seq: AtomicU64,
    shape: [u64; 5],
    bufs: [BufDesc; 2],
}

const SLOT_BYTES: usize = 256;
const _: () = assert!(std::mem::size_of::<Slot>() <= SLOT_BYTES);

/// A POSIX shared-memory table of two slots per rank (alternating by call parity: a rank can
/// only reach call k+2 once every peer has published call k+1, which it does after reading
/// call k, so a slot is never overwritten while a peer still reads it).
pub struct ShmTable {
    base: *mut u8,
    bytes: usize,
    nranks: usize,
}

// SAFETY: the mapping is shared memory accessed through atomics and the parity protocol.
unsafe impl Send for ShmTable {}
unsafe impl Sync for ShmTable {}

impl ShmTable {
    /// Creates (`create`) or opens the segment `name` (like "/railcc-..."), sized for `nranks`.
    pub fn open(name: &str, nranks: usize, create: bool) -> Result<ShmTable> {
        let bytes = 2 * nranks * SLOT_BYTES;
        let cname = CString::new(name).map_err(|_| Error::invalid("shm name has a NUL byte"))?;
        let flags = if create {
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL
        } else {
            libc::O_RDWR
        };
        let io = |what: &str| {
            Error::new(
                ErrorKind::Io,
                format!("{what} {name}: {}", std::io::Error::last_os_error()),
            )
            .transport(crate::NAME)
        };
        // SAFETY: plain libc calls on a NUL-terminated name; the fd is closed below and the
        // mapping unmapped on drop.
        unsafe {
            let fd = libc::shm_open(cname.as_ptr(), flags, 0o600);
            if fd < 0 {
                return Err(io("shm_open"));
            }
            if create && libc::ftruncate(fd, bytes as libc::off_t) != 0 {
                libc::close(fd);
                return Err(io("ftruncate"));
            }
            let p = libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            libc::close(fd);
            if p == libc::MAP_FAILED {
                return Err(io("mmap"));
            }
            Ok(ShmTable {
                base: p as *mut u8,
                bytes,
                nranks,
            })
        }
    }

    /// Removes the name (the mapping stays valid in every process that has it).
    pub fn unlink(name: &str) {
        if let Ok(c) = CString::new(name) {
            // SAFETY: NUL-terminated name.
            unsafe {
                libc::shm_unlink(c.as_ptr());
            }
        }
    }

    fn slot(&self, call: u64, rank: usize) -> *mut Slot {
        let i = (call % 2) as usize * self.nranks + rank;
        // SAFETY: i < 2 * nranks, so the slot lies inside the mapping.
        unsafe { self.base.add(i * SLOT_BYTES) as *mut Slot }
    }

    /// Publishes this rank's shape and buffers for `call`.
    pub fn publish(&self, call: u64, rank: usize, shape: [u64; 5], bufs: [BufDesc; 2]) {
        let s = self.slot(call, rank);
        // SAFETY: our own slot; no peer reads it until `seq` says `call` (parity protocol).
        unsafe {
            std::ptr::addr_of_mut!((*s).shape).write_volatile(shape);
            std::ptr::addr_of_mut!((*s).bufs).write_volatile(bufs);
            (*s).seq.store(call, Ordering::Release);
        }
    }

    /// Waits until `peer` has published `call`, then reads its entry. `abort` is polled.
    pub fn read(
        &self,
        call: u64,
        peer: usize,
        deadline: Instant,
        broken: &dyn Fn() -> Option<Error>,
    ) -> Result<([u64; 5], [BufDesc; 2])> {
        let s = self.slot(call, peer);
        // Busy-wait first: peers normally publish within microseconds, and a sleeping host
        // falls behind the GPU it feeds. Sleep only once a peer is clearly late.
        let spin_until = Instant::now() + Duration::from_micros(500);
        let mut spins = 0u32;
        // SAFETY: the slot lies in the mapping; `seq` is only accessed atomically.
        while unsafe { (*s).seq.load(Ordering::Acquire) } != call {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && Instant::now() > spin_until {
                if let Some(e) = broken() {
                    return Err(e);
                }
                if Instant::now() > deadline {
                    return Err(Error::new(
                        ErrorKind::Timeout,
                        format!("rank {peer} did not reach GPU call {call} in time"),
                    )
                    .peer(peer)
                    .transport(crate::NAME));
                }
                std::thread::sleep(Duration::from_micros(20));
            } else {
                std::hint::spin_loop();
            }
        }
        // SAFETY: published (Acquire above) and not rewritten until we publish call + 1.
        unsafe {
            Ok((
                std::ptr::addr_of!((*s).shape).read_volatile(),
                std::ptr::addr_of!((*s).bufs).read_volatile(),
            ))
        }
    }
}

impl Drop for ShmTable {
    fn drop(&mut self) {
        // SAFETY: the mapping came from mmap with this length.
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use railcc_cuda::ipc::HANDLE_BYTES;

    fn desc(b: u8) -> BufDesc {
        BufDesc {
            handle: [b; HANDLE_BYTES],
            base: b as u64,
            offset: 0,
            size: 1,
        }
    }

    #[test]
    fn table_passes_entries_between_mappings() {
        let name = format!("/railcc-test-{}", std::process::id());
        let a = ShmTable::open(&name, 2, true).unwrap();
        let b = ShmTable::open(&name, 2, false).unwrap();
        ShmTable::unlink(&name);
        let deadline = Instant::now() + Duration::from_secs(5);
        for call in 1..=5u64 {
            a.publish(call, 0, [call; 5], [desc(1), desc(2)]);
            b.publish(call, 1, [call + 100; 5], [desc(3), desc(4)]);
            let (shape, bufs) = b.read(call, 0, deadline, &|| None).unwrap();
            assert_eq!(shape, [call; 5]);
            assert_eq!(bufs, [desc(1), desc(2)]);
            assert_eq!(
                a.read(call, 1, deadline, &|| None).unwrap().0,
                [call + 100; 5]
            );
        }
        // Nobody publishes call 6: a clear timeout, not a hang.
        let e = a
            .read(6, 1, Instant::now() + Duration::from_millis(50), &|| None)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Timeout);
        assert!(e.to_string().contains("rank 1"), "{e}");
        assert!(
            ShmTable::open(&name, 2, false).is_err(),
            "name was unlinked"
        );
    }
}
