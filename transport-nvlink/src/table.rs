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
/// Calls a rank may publish ahead of the last call it has read every peer's entry of, plus
/// one: how far a deferred launcher (`proc/defer.rs`) may lag behind its caller.
pub const CALL_DEPTH: u64 = 32;
/// Each rank's count of read calls, on its own cache line.
const READ_BYTES: usize = 64;

/// A sent message's buffer, for its receiver: the message number (written last), the size,
/// and whether the receiver has read the entry (so the sender may reuse it).
#[repr(C)]
struct Mail {
    seq: AtomicU64,
    taken: AtomicU64,
    bytes: u64,
    buf: BufDesc,
}

const MAIL_BYTES: usize = 128;
const _: () = assert!(std::mem::size_of::<Mail>() <= MAIL_BYTES);
/// Messages a sender may post to one receiver before that receiver's process has asked for
/// the first of them.
pub const MAIL_DEPTH: u64 = 64;

/// The first failure a rank of the host reports to the others: who (rank + 1, 0 while none;
/// the first writer wins), then its text, then the text's length (written last: nonzero once
/// the text is whole).
#[repr(C)]
struct Broken {
    by: AtomicU64,
    len: AtomicU64,
    text: [u8; BROKEN_TEXT],
}

const BROKEN_TEXT: usize = 1008;
const BROKEN_BYTES: usize = 1024;
const _: () = assert!(std::mem::size_of::<Broken>() <= BROKEN_BYTES);

/// A POSIX shared-memory table of [`CALL_DEPTH`] slots per rank (call k in slot k mod
/// CALL_DEPTH), each rank's count of the calls it has read every peer's entry of (so a rank
/// publishes call k only once every peer has read call k - CALL_DEPTH: a slot is never
/// overwritten while a peer still reads it, however far a rank's publishing runs ahead of its
/// reading, `proc/defer.rs`), then a mailbox of MAIL_DEPTH entries per (sender, receiver) for
/// send/recv, then the host's first failure (so a rank that breaks for a reason its peers
/// cannot see, a lost network peer or a kernel past its deadline, stops them too instead of
/// leaving them waiting without a deadline).
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
        let bytes = CALL_DEPTH as usize * nranks * SLOT_BYTES
            + nranks * READ_BYTES
            + nranks * nranks * MAIL_DEPTH as usize * MAIL_BYTES
            + BROKEN_BYTES;
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
        let i = (call % CALL_DEPTH) as usize * self.nranks + rank;
        // SAFETY: i < CALL_DEPTH * nranks, so the slot lies inside the mapping.
        unsafe { self.base.add(i * SLOT_BYTES) as *mut Slot }
    }

    /// `rank`'s count of the calls it has read every peer's entry of.
    fn read_count(&self, rank: usize) -> &AtomicU64 {
        let at = CALL_DEPTH as usize * self.nranks * SLOT_BYTES + rank * READ_BYTES;
        // SAFETY: rank < nranks, so the word lies inside the mapping (zeroed by ftruncate),
        // 8-byte aligned, and only ever accessed atomically.
        unsafe { &*(self.base.add(at) as *const AtomicU64) }
    }

    /// Records that `rank` has read every peer's entry of `call` (calls are read in order).
    pub fn finished(&self, call: u64, rank: usize) {
        self.read_count(rank).fetch_max(call, Ordering::Release);
    }

    /// Whether `rank` may publish `call` now: every peer has read the call its slot held.
    pub fn free_for(&self, call: u64, rank: usize) -> bool {
        let old = call.saturating_sub(CALL_DEPTH);
        (0..self.nranks)
            .filter(|&p| p != rank)
            .all(|p| self.read_count(p).load(Ordering::Acquire) >= old)
    }

    /// Waits (to the deadline) until `rank` may publish `call` ([`ShmTable::free_for`]); at
    /// once unless this rank's publishing runs CALL_DEPTH calls ahead of a peer's reading.
    pub fn wait_free(
        &self,
        call: u64,
        rank: usize,
        deadline: Instant,
        broken: &dyn Fn() -> Option<Error>,
    ) -> Result<()> {
        wait_until(deadline, broken, || self.free_for(call, rank)).map_err(|e| {
            e.unwrap_or_else(|| {
                let slow = (0..self.nranks)
                    .filter(|&p| p != rank)
                    .min_by_key(|&p| self.read_count(p).load(Ordering::Acquire))
                    .unwrap_or(rank);
                Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "rank {slow} did not read GPU call {} in time (rank {rank} is at call {call})",
                        call.saturating_sub(CALL_DEPTH)
                    ),
                )
                .peer(slow)
                .transport(crate::NAME)
            })
        })
    }

    /// Whether `peer` has published `call` (its entry can be read without waiting).
    pub fn published(&self, call: u64, peer: usize) -> bool {
        let s = self.slot(call, peer);
        // SAFETY: the slot lies in the mapping; `seq` is only accessed atomically.
        unsafe { (*s).seq.load(Ordering::Acquire) == call }
    }

    /// Publishes this rank's shape and buffers for `call`.
    pub fn publish(&self, call: u64, rank: usize, shape: [u64; 5], bufs: [BufDesc; 2]) {
        let s = self.slot(call, rank);
        // SAFETY: our own slot; no peer reads it until `seq` says `call`, and every peer has
        // read the call it held (the caller's `free_for`/`wait_free`).
        unsafe {
            std::ptr::addr_of_mut!((*s).shape).write_volatile(shape);
            std::ptr::addr_of_mut!((*s).bufs).write_volatile(bufs);
            (*s).seq.store(call, Ordering::Release);
        }
    }

    fn mail(&self, src: usize, dst: usize, seq: u64) -> *mut Mail {
        let i = (src * self.nranks + dst) * MAIL_DEPTH as usize + (seq % MAIL_DEPTH) as usize;
        let mails = CALL_DEPTH as usize * self.nranks * SLOT_BYTES + self.nranks * READ_BYTES;
        // SAFETY: src, dst < nranks, so the entry lies inside the mapping.
        unsafe { self.base.add(mails + i * MAIL_BYTES) as *mut Mail }
    }

    fn broken_record(&self) -> *mut Broken {
        // SAFETY: the record is the last BROKEN_BYTES of the mapping.
        unsafe { self.base.add(self.bytes - BROKEN_BYTES) as *mut Broken }
    }

    /// Reports `rank`'s failure to the host's other ranks, unless one was reported before
    /// (then false). `text` is cut to fit, at a character boundary.
    pub fn report_broken(&self, rank: usize, text: &str) -> bool {
        let b = self.broken_record();
        // SAFETY: the record lies in the mapping; `by` and `len` are only accessed atomically,
        // and only the rank that wins `by` writes `text`, before it stores `len`.
        unsafe {
            if (*b)
                .by
                .compare_exchange(0, rank as u64 + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return false;
            }
            let mut n = text.len().min(BROKEN_TEXT);
            while !text.is_char_boundary(n) {
                n -= 1;
            }
            let dst = std::ptr::addr_of_mut!((*b).text) as *mut u8;
            std::ptr::copy_nonoverlapping(text.as_ptr(), dst, n);
            (*b).len.store(n as u64 + 1, Ordering::Release);
        }
        true
    }

    /// The rank that claimed the failure record, even before its text is whole (a reporter
    /// that died in between never completes it).
    pub fn claimed(&self) -> Option<usize> {
        let b = self.broken_record();
        // SAFETY: `by` lies in the mapping and is only accessed atomically.
        let by = unsafe { (*b).by.load(Ordering::Acquire) };
        by.checked_sub(1).map(|r| r as usize)
    }

    /// The failure a rank of the host reported, once its text is whole: (rank, text).
    pub fn broken(&self) -> Option<(usize, String)> {
        let b = self.broken_record();
        // SAFETY: as in report_broken; the text is complete once `len` is nonzero (Acquire).
        unsafe {
            let by = (*b).by.load(Ordering::Acquire);
            let len = (*b).len.load(Ordering::Acquire);
            if by == 0 || len == 0 {
                return None;
            }
            let n = (len - 1).min(BROKEN_TEXT as u64) as usize;
            let src = std::ptr::addr_of!((*b).text) as *const u8;
            let bytes = std::slice::from_raw_parts(src, n);
            Some((by as usize - 1, String::from_utf8_lossy(bytes).into_owned()))
        }
    }

    /// Posts message `seq` (1, 2, ...) from `src` to `dst`: its buffer and size. Waits (to
    /// the deadline) while the entry still holds message `seq - MAIL_DEPTH` not yet read.
    pub fn post(
        &self,
        src: usize,
        dst: usize,
        seq: u64,
        (bytes, buf): (u64, BufDesc),
        deadline: Instant,
        broken: &dyn Fn() -> Option<Error>,
    ) -> Result<()> {
        let m = self.mail(src, dst, seq);
        let prev = seq.saturating_sub(MAIL_DEPTH);
        // SAFETY: the entry lies in the mapping; its counters are only accessed atomically.
        wait_until(
            deadline,
            broken,
            || unsafe { (*m).taken.load(Ordering::Acquire) } >= prev,
        )
        .map_err(|e| {
            e.unwrap_or_else(|| {
                Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "rank {dst} did not take {MAIL_DEPTH} messages from rank {src} in time"
                    ),
                )
                .peer(dst)
                .transport(crate::NAME)
            })
        })?;
        // SAFETY: the receiver is done with the entry (taken >= prev) and reads it again only
        // once `seq` says so.
        unsafe {
            std::ptr::addr_of_mut!((*m).bytes).write_volatile(bytes);
            std::ptr::addr_of_mut!((*m).buf).write_volatile(buf);
            (*m).seq.store(seq, Ordering::Release);
        }
        Ok(())
    }

    /// Waits until `src` has posted message `seq` to `dst`, then reads it (size, buffer) and
    /// marks it taken.
    pub fn take(
        &self,
        src: usize,
        dst: usize,
        seq: u64,
        deadline: Instant,
        broken: &dyn Fn() -> Option<Error>,
    ) -> Result<(u64, BufDesc)> {
        let m = self.mail(src, dst, seq);
        // SAFETY: as in post.
        wait_until(
            deadline,
            broken,
            || unsafe { (*m).seq.load(Ordering::Acquire) } == seq,
        )
        .map_err(|e| {
            e.unwrap_or_else(|| {
                Error::new(
                    ErrorKind::Timeout,
                    format!("rank {src} did not send message {seq} to rank {dst} in time"),
                )
                .peer(src)
                .transport(crate::NAME)
            })
        })?;
        // SAFETY: posted (Acquire above); the sender rewrites it only after `taken` moves.
        let got = unsafe {
            (
                std::ptr::addr_of!((*m).bytes).read_volatile(),
                std::ptr::addr_of!((*m).buf).read_volatile(),
            )
        };
        // SAFETY: as above.
        unsafe { (*m).taken.store(seq, Ordering::Release) };
        Ok(got)
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
        // Busy-wait first (wait_until): peers normally publish within microseconds, and a
        // sleeping host falls behind the GPU it feeds.
        // SAFETY: the slot lies in the mapping; `seq` is only accessed atomically.
        wait_until(
            deadline,
            broken,
            || unsafe { (*s).seq.load(Ordering::Acquire) } == call,
        )
        .map_err(|e| {
            e.unwrap_or_else(|| {
                Error::new(
                    ErrorKind::Timeout,
                    format!("rank {peer} did not reach GPU call {call} in time"),
                )
                .peer(peer)
                .transport(crate::NAME)
            })
        })?;
        // SAFETY: published (Acquire above) and not rewritten until we record (`finished`)
        // that we read it.
        unsafe {
            Ok((
                std::ptr::addr_of!((*s).shape).read_volatile(),
                std::ptr::addr_of!((*s).bufs).read_volatile(),
            ))
        }
    }
}

/// Spins, then sleeps, until `ready()`; Err(Some(e)) when `broken` says so, Err(None) at the
/// deadline.
pub(crate) fn wait_until(
    deadline: Instant,
    broken: &dyn Fn() -> Option<Error>,
    ready: impl Fn() -> bool,
) -> std::result::Result<(), Option<Error>> {
    let spin_until = Instant::now() + Duration::from_micros(500);
    let mut spins = 0u32;
    while !ready() {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(256) && Instant::now() > spin_until {
            if let Some(e) = broken() {
                return Err(Some(e));
            }
            if Instant::now() > deadline {
                return Err(None);
            }
            std::thread::sleep(Duration::from_micros(20));
        } else {
            std::hint::spin_loop();
        }
    }
    Ok(())
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

    /// A new table for `nranks` and a second mapping of it, as two ranks' processes have
    /// them; its name (unlinked: only these mappings reach it).
    fn two_mappings(tag: &str, nranks: usize) -> (ShmTable, ShmTable, String) {
        let name = format!("/railcc-test-{tag}{}", std::process::id());
        let a = ShmTable::open(&name, nranks, true).unwrap();
        let b = ShmTable::open(&name, nranks, false).unwrap();
        ShmTable::unlink(&name);
        (a, b, name)
    }

    fn desc(b: u8) -> BufDesc {
        BufDesc {
            kind: 0,
            handle: [b; HANDLE_BYTES],
            base: b as u64,
            offset: 0,
            size: 1,
        }
    }

    #[test]
    fn the_first_failure_reported_reaches_every_mapping_and_later_ones_do_not() {
        let (a, b, _) = two_mappings("broken-", 3);
        assert_eq!((b.broken(), b.claimed()), (None, None));
        let long = format!("rank 3 exited: {}é", "x".repeat(BROKEN_TEXT));
        assert!(a.report_broken(1, &long));
        assert!(!b.report_broken(2, "a later failure"));
        let (by, text) = b.broken().unwrap();
        assert_eq!((by, b.claimed()), (1, Some(1)));
        assert!(text.starts_with("rank 3 exited: xxx"), "{text}");
        assert!(text.len() <= BROKEN_TEXT && long.starts_with(&text));
        assert_eq!(a.broken(), Some((by, text)));
    }

    #[test]
    fn table_passes_entries_between_mappings() {
        let (a, b, name) = two_mappings("", 2);
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

    #[test]
    fn a_rank_publishes_at_most_call_depth_calls_ahead_of_a_peers_reading() {
        let (a, b, _) = two_mappings("depth-", 2);
        let soon = || Instant::now() + Duration::from_millis(50);
        // Rank 0 publishes CALL_DEPTH calls that rank 1 has not read: each its own slot.
        for call in 1..=CALL_DEPTH {
            a.wait_free(call, 0, soon(), &|| None).unwrap();
            a.publish(call, 0, [call; 5], [desc(1), desc(2)]);
        }
        assert!(b.published(1, 0) && b.published(CALL_DEPTH, 0));
        assert!(!b.published(CALL_DEPTH + 1, 0));
        // The next would overwrite call 1's slot, which rank 1 has not read: a named timeout.
        assert!(!a.free_for(CALL_DEPTH + 1, 0));
        let e = a
            .wait_free(CALL_DEPTH + 1, 0, soon(), &|| None)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Timeout);
        assert!(
            e.to_string().contains("rank 1 did not read GPU call 1"),
            "{e}"
        );
        // Rank 1 reads the calls in order, from the oldest: each frees one slot.
        for call in 1..=CALL_DEPTH {
            assert_eq!(b.read(call, 0, soon(), &|| None).unwrap().0, [call; 5]);
            b.finished(call, 1);
            assert!(a.free_for(call + CALL_DEPTH, 0));
            assert!(!a.free_for(call + CALL_DEPTH + 1, 0));
        }
        // A rank's own count does not free its own slots; a broken host stops the wait.
        a.finished(2 * CALL_DEPTH, 0);
        let e = a
            .wait_free(2 * CALL_DEPTH + 1, 0, later_secs(5), &|| {
                Some(Error::new(ErrorKind::Aborted, "stop"))
            })
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Aborted);
    }

    fn later_secs(s: u64) -> Instant {
        Instant::now() + Duration::from_secs(s)
    }

    #[test]
    fn mailbox_passes_messages_in_order_and_bounds_the_backlog() {
        let (a, b, _) = two_mappings("mail-", 3);
        let later = || Instant::now() + Duration::from_secs(5);
        for k in 1..=MAIL_DEPTH {
            a.post(2, 1, k, (k * 10, desc(k as u8)), later(), &|| None)
                .unwrap();
        }
        // The backlog is full: message DEPTH + 1 waits for the receiver, here to a deadline.
        let e = a
            .post(
                2,
                1,
                MAIL_DEPTH + 1,
                (1, desc(0)),
                Instant::now() + Duration::from_millis(50),
                &|| None,
            )
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Timeout);
        assert!(e.to_string().contains("rank 1 did not take"), "{e}");
        for k in 1..=3 {
            assert_eq!(
                b.take(2, 1, k, later(), &|| None).unwrap(),
                (k * 10, desc(k as u8))
            );
        }
        a.post(2, 1, MAIL_DEPTH + 1, (7, desc(9)), later(), &|| None)
            .unwrap();
        // Another pair's entries are apart; an unsent message is a named timeout.
        let e = b
            .take(0, 1, 1, Instant::now() + Duration::from_millis(50), &|| {
                None
            })
            .unwrap_err();
        assert!(
            e.to_string().contains("rank 0 did not send message 1"),
            "{e}"
        );
        let gone = || Some(Error::new(ErrorKind::PeerClosed, "rank 0 died"));
        let e = b.take(0, 1, 1, later(), &gone).unwrap_err();
        assert_eq!(e.kind, ErrorKind::PeerClosed);
    }
}
