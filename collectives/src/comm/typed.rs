//! The typed API: one method per collective over slices of `Element`s, and grouped
//! point-to-point.

use super::*;

impl Communicator {
    fn args<T: Element>(
        &self,
        coll: CollKind,
        count: usize,
        op: ReduceOp,
        root: usize,
    ) -> CollArgs {
        CollArgs {
            coll,
            nranks: self.nranks,
            count,
            dtype: T::DTYPE,
            op,
            root,
        }
    }

    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        let a = self.args::<T>(CollKind::AllReduce, send.len(), op, 0);
        self.collective(
            a,
            Bufs::OutOfPlace {
                send: bytemuck::cast_slice(send),
                recv: bytemuck::cast_slice_mut(recv),
            },
        )
    }

    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let a = self.args::<T>(CollKind::AllReduce, buf.len(), op, 0);
        self.collective(a, Bufs::InPlace(bytemuck::cast_slice_mut(buf)))
    }

    /// `recv` receives every rank's `send`, in rank order (`recv.len() >= send.len() * nranks`).
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let a = self.args::<T>(CollKind::AllGather, send.len(), ReduceOp::Sum, 0);
        self.collective(
            a,
            Bufs::OutOfPlace {
                send: bytemuck::cast_slice(send),
                recv: bytemuck::cast_slice_mut(recv),
            },
        )
    }

    /// In place: this rank's contribution sits at `buf[rank * n..]` with `n = buf.len() / nranks`.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let count = self.per_rank(buf.len(), "all_gather")?;
        let a = self.args::<T>(CollKind::AllGather, count, ReduceOp::Sum, 0);
        self.collective(a, Bufs::InPlace(bytemuck::cast_slice_mut(buf)))
    }

    /// `recv` (n elements) gets block `rank` of the reduction of every rank's `send` (n * nranks).
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let a = self.args::<T>(CollKind::ReduceScatter, recv.len(), op, 0);
        self.collective(
            a,
            Bufs::OutOfPlace {
                send: bytemuck::cast_slice(send),
                recv: bytemuck::cast_slice_mut(recv),
            },
        )
    }

    /// In place: the result lands at `buf[rank * n..(rank + 1) * n]`.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let count = self.per_rank(buf.len(), "reduce_scatter")?;
        let a = self.args::<T>(CollKind::ReduceScatter, count, op, 0);
        self.collective(a, Bufs::InPlace(bytemuck::cast_slice_mut(buf)))
    }

    /// `recv` gets the root's `send`; non-roots may pass an empty `send`.
    pub fn broadcast<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        let a = self.args::<T>(CollKind::Broadcast, recv.len(), ReduceOp::Sum, root);
        self.collective(
            a,
            Bufs::OutOfPlace {
                send: bytemuck::cast_slice(send),
                recv: bytemuck::cast_slice_mut(recv),
            },
        )
    }

    pub fn broadcast_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let a = self.args::<T>(CollKind::Broadcast, buf.len(), ReduceOp::Sum, root);
        self.collective(a, Bufs::InPlace(bytemuck::cast_slice_mut(buf)))
    }

    /// The root's `recv` gets the reduction; non-roots may pass an empty `recv`.
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let a = self.args::<T>(CollKind::Reduce, send.len(), op, root);
        self.collective(
            a,
            Bufs::OutOfPlace {
                send: bytemuck::cast_slice(send),
                recv: bytemuck::cast_slice_mut(recv),
            },
        )
    }

    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let a = self.args::<T>(CollKind::Reduce, buf.len(), op, root);
        self.collective(a, Bufs::InPlace(bytemuck::cast_slice_mut(buf)))
    }

    /// Block j of `send` goes to rank j; block j of `recv` comes from rank j.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let count = self.per_rank(send.len(), "all_to_all")?;
        let a = self.args::<T>(CollKind::AllToAll, count, ReduceOp::Sum, 0);
        self.collective(
            a,
            Bufs::OutOfPlace {
                send: bytemuck::cast_slice(send),
                recv: bytemuck::cast_slice_mut(recv),
            },
        )
    }

    pub fn barrier(&self) -> Result<()> {
        let a = self.args::<u8>(CollKind::Barrier, 0, ReduceOp::Sum, 0);
        self.collective(
            a,
            Bufs::OutOfPlace {
                send: &[],
                recv: &mut [],
            },
        )
    }

    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        self.group(&mut [P2p::Send { peer, buf }])
    }

    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        self.group(&mut [P2p::Recv { peer, buf }])
    }

    /// Runs several sends and receives together, so that pairs of ranks that send to each other
    /// (or an all-to-all written as sends and receives) cannot deadlock. A send to self needs a
    /// matching receive from self in the same group.
    pub fn group<T: Element>(&self, ops: &mut [P2p<'_, T>]) -> Result<()> {
        self.group_tagged(ops, false)
    }

    /// [`Communicator::group`] whose messages carry no element count in their tag, so the two
    /// ends of a message may sit in groups of different sizes (the GPU network engine cuts
    /// messages into pieces that share groups); each message's length is still checked.
    pub fn group_any(&self, ops: &mut [P2p<'_, u8>]) -> Result<()> {
        self.group_tagged(ops, true)
    }

    fn group_tagged<T: Element>(&self, ops: &mut [P2p<'_, T>], any: bool) -> Result<()> {
        let mut desc = Vec::with_capacity(ops.len());
        let mut user = Vec::with_capacity(ops.len());
        for o in ops.iter_mut() {
            match o {
                P2p::Send { peer, buf } => {
                    desc.push((P2pKind::Send, *peer, buf.len()));
                    user.push(RawBuf {
                        ptr: buf.as_ptr() as *mut u8,
                        bytes: std::mem::size_of_val(*buf),
                        writable: false,
                    });
                }
                P2p::Recv { peer, buf } => {
                    desc.push((P2pKind::Recv, *peer, buf.len()));
                    user.push(RawBuf {
                        ptr: buf.as_mut_ptr() as *mut u8,
                        bytes: std::mem::size_of_val(*buf),
                        writable: true,
                    });
                }
            }
        }
        if let Some((_, peer, _)) = desc.iter().find(|d| d.1 >= self.nranks) {
            return Err(Error::invalid(format!(
                "send/recv: peer {peer} out of range for {} ranks",
                self.nranks
            ))
            .rank(self.rank));
        }
        let plan = group_plan(self.rank, &desc)
            .map_err(|m| Error::invalid(format!("send/recv: {m}")).rank(self.rank))?;
        let mut st = self.state.lock();
        self.check_usable(&st)?;
        // Point-to-point calls are not collective, so they do not advance the call sequence;
        // the tag still carries dtype and count so mismatched pairs are caught.
        let count = desc.first().map_or(0, |d| d.2 as u64);
        let tag = MsgTag::new(0, CollKind::SendRecv, T::DTYPE, None, None, count);
        // One tag serves every message of a group, so for a group of several operations the
        // count field is zero; each message's byte length is still checked by the transport.
        let tag = if desc.len() > 1 || any {
            MsgTag { count: 0, ..tag }
        } else {
            tag
        };
        let plan = Compiled::new(plan, self.nranks);
        self.execute(
            &mut st,
            &plan,
            T::DTYPE,
            ReduceOp::Sum,
            tag,
            "send/recv",
            RawBuf::EMPTY,
            RawBuf::EMPTY,
            user,
        )
    }
}
