//! Argument checks of every collective: rank count, root, buffer sizes and alignment; a bad
//! call is an `InvalidArgument` naming what was wrong, before any byte moves.

use super::*;

impl Communicator {
    /// Runs one collective on byte buffers. This is the entry point every typed call goes
    /// through, and the one the bench uses for run-time dtypes.
    pub fn collective(&self, a: CollArgs, bufs: Bufs<'_>) -> Result<()> {
        let name = a.coll.name();
        let fail = |m: String| Err(Error::invalid(format!("{name}: {m}")).rank(self.rank));
        if a.nranks != self.nranks {
            return fail(format!(
                "nranks {} differs from the communicator's {}",
                a.nranks, self.nranks
            ));
        }
        if matches!(a.coll, CollKind::Broadcast | CollKind::Reduce) && a.root >= self.nranks {
            return fail(format!(
                "root {} out of range for {} ranks",
                a.root, self.nranks
            ));
        }
        let es = a.dtype.size();
        let need = |elems: usize| {
            elems.checked_mul(es).ok_or_else(|| {
                Error::invalid(format!("{name}: count {} overflows", a.count)).rank(self.rank)
            })
        };
        let (send_need, recv_need) = (need(a.send_elems())?, need(a.recv_elems())?);
        let root_only_recv = a.coll == CollKind::Reduce && self.rank != a.root;
        let root_only_send = a.coll == CollKind::Broadcast && self.rank != a.root;
        // The host kernels read elements in place: each buffer must be aligned for its type.
        match &bufs {
            Bufs::OutOfPlace { send, recv } => {
                self.aligned(&a, "send", send.as_ptr(), send.len())?;
                self.aligned(&a, "receive", recv.as_ptr(), recv.len())?;
            }
            Bufs::InPlace(buf) => self.aligned(&a, "in-place", buf.as_ptr(), buf.len())?,
        }
        let (send, recv, in_place) = match bufs {
            Bufs::OutOfPlace { send, recv } => {
                if !root_only_send && send.len() < send_need {
                    return fail(format!(
                        "send buffer holds {} bytes, {} elements of {} need {send_need}",
                        send.len(),
                        a.send_elems(),
                        a.dtype
                    ));
                }
                if !root_only_recv && recv.len() < recv_need {
                    return fail(format!(
                        "receive buffer holds {} bytes, {} elements of {} need {recv_need}",
                        recv.len(),
                        a.recv_elems(),
                        a.dtype
                    ));
                }
                let (sl, rl) = (
                    if root_only_send { 0 } else { send_need },
                    if root_only_recv { 0 } else { recv_need },
                );
                let s = RawBuf {
                    ptr: send.as_ptr() as *mut u8,
                    bytes: sl.min(send.len()),
                    writable: false,
                };
                let r = RawBuf {
                    ptr: recv.as_mut_ptr(),
                    bytes: rl.min(recv.len()),
                    writable: true,
                };
                (s, r, false)
            }
            Bufs::InPlace(buf) => {
                let (so, ro, total) = a.in_place_layout(self.rank);
                let total = need(total)?;
                if buf.len() < total {
                    return fail(format!(
                        "in-place buffer holds {} bytes, needs {total}",
                        buf.len()
                    ));
                }
                // SAFETY: so*es + send_need and ro*es + recv_need are within `total` bytes of
                // the buffer (in_place_layout's contract), checked against buf.len() above.
                let (s, r) =
                    unsafe { (buf.as_mut_ptr().add(so * es), buf.as_mut_ptr().add(ro * es)) };
                (
                    RawBuf {
                        ptr: s,
                        bytes: send_need,
                        writable: false,
                    },
                    RawBuf {
                        ptr: r,
                        bytes: recv_need,
                        writable: true,
                    },
                    true,
                )
            }
        };
        self.run_collective(a, send, recv, in_place)
    }

    /// An error unless `bytes` at `p` are aligned for `a`'s element type.
    pub(super) fn aligned(
        &self,
        a: &CollArgs,
        what: &str,
        p: *const u8,
        bytes: usize,
    ) -> Result<()> {
        let es = a.dtype.size();
        if bytes == 0 || (p as usize).is_multiple_of(es) {
            return Ok(());
        }
        Err(Error::invalid(format!(
            "{}: {what} buffer at {p:p} is not aligned for {} ({es} bytes)",
            a.coll.name(),
            a.dtype
        ))
        .rank(self.rank))
    }

    pub(super) fn per_rank(&self, len: usize, name: &str) -> Result<usize> {
        if !len.is_multiple_of(self.nranks) {
            return Err(Error::invalid(format!(
                "{name}: buffer of {len} elements does not divide among {} ranks",
                self.nranks
            ))
            .rank(self.rank));
        }
        Ok(len / self.nranks)
    }
}
