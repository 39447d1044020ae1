//! Running a checked call: the plan (cached per call shape), the scratch buffer and its
//! registration, the executor, and what a failure does to the communicator.

use super::*;

impl Communicator {
    /// `collective` once the buffers are checked.
    pub(super) fn run_collective(
        &self,
        a: CollArgs,
        send: RawBuf,
        recv: RawBuf,
        in_place: bool,
    ) -> Result<()> {
        let name = a.coll.name();
        let es = a.dtype.size();
        self.aligned(&a, "send", send.ptr, send.bytes)?;
        self.aligned(&a, "receive", recv.ptr, recv.bytes)?;
        let algo = self.algo_for(&a);
        let opts = PlanOpts {
            chunk_elems: (self.cfg.chunk_bytes / es).max(1),
            window: self.cfg.max_inflight_chunks,
            in_place,
        };
        let mut st = self.state.lock();
        self.check_usable(&st)?;
        st.op_seq += 1;
        let seq = st.op_seq;
        if a.count == 0 && a.coll != CollKind::Barrier {
            return Ok(());
        }
        let key = (a, algo, opts.chunk_elems, opts.window, in_place);
        let plan = match st.plans.get(&key) {
            Some(p) => p.clone(),
            None => {
                if st.plans.len() >= PLAN_CACHE_MAX {
                    st.plans.clear();
                }
                let p = Arc::new(Compiled::new(
                    build_ordered(&a, self.rank, algo, &opts, &self.ring_order),
                    self.nranks,
                ));
                st.plans.insert(key, p.clone());
                p
            }
        };
        let redop = a.reduces().then_some(a.op);
        let root = matches!(a.coll, CollKind::Broadcast | CollKind::Reduce).then_some(a.root);
        let tag = MsgTag::new(seq, a.coll, a.dtype, redop, root, a.count as u64);
        self.execute(
            &mut st,
            &plan,
            a.dtype,
            a.op,
            tag,
            name,
            send,
            recv,
            Vec::new(),
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn execute(
        &self,
        st: &mut State,
        plan: &Compiled,
        dtype: DataType,
        op: ReduceOp,
        tag: MsgTag,
        label: &str,
        send: RawBuf,
        recv: RawBuf,
        user: Vec<RawBuf>,
    ) -> Result<()> {
        let scratch_bytes = plan.plan.scratch_elems * dtype.size();
        if st.scratch.len() * 8 < scratch_bytes {
            if let Some(id) = st.scratch_region.take() {
                st.regions.remove(id, &mut st.conns)?;
            }
            st.scratch = vec![0u64; scratch_bytes.div_ceil(8)];
            // The communicator owns the scratch buffer and drops its region before the buffer.
            let (addr, len) = (st.scratch.as_ptr() as usize, st.scratch.len() * 8);
            st.scratch_region = Some(st.regions.add(addr, len, self.nranks)?);
        }
        let scratch = RawBuf {
            ptr: st.scratch.as_mut_ptr() as *mut u8,
            bytes: scratch_bytes,
            writable: true,
        };
        let ex = Exec {
            rank: self.rank,
            nranks: self.nranks,
            dtype,
            op,
            tag,
            name: label,
            seq: tag.op_seq,
            timeout: self.cfg.timeout(),
            spin: self.spin,
            abort: &self.abort,
        };
        let State {
            conns, ws, regions, ..
        } = st;
        let r = ex.run(
            plan,
            &Buffers {
                send,
                recv,
                scratch,
                user,
            },
            conns,
            regions,
            ws,
        );
        // An abort with a reason fails the call with that reason, which the peers then hear.
        let r = match r {
            Err(e) if e.kind == ErrorKind::Aborted => {
                Err(self.abort_why.lock().clone().unwrap_or(e))
            }
            r => r,
        };
        if let Err(e) = &r {
            tracing::error!("{e}");
            st.broken = Some(e.clone());
            st.conns.abort_all(&e.to_string());
            st.regions.forget_connections();
        }
        r
    }
}
