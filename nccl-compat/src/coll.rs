//! The collectives' entry points: argument checks, then now or at ncclGroupEnd; user
//! reduction ops (premultiplied sums, premul.rs).

use super::*;
use railcc_core::ReduceOp;
use railcc_cuda::launch::Scalar;

/// Checks a call's arguments and runs it now, or holds it for ncclGroupEnd.
#[allow(clippy::too_many_arguments)]
fn collective(
    name: &str,
    coll: CollKind,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    root: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    let Some(dt) = abi::dtype(dtype) else {
        return invalid(format!(
            "{name}: datatype {dtype} is not one railcc supports (int8..bfloat16, f8e4m3, f8e5m2)"
        ));
    };
    let (nranks, premul) = match with_comm(comm, name, |c| (c.nranks, c.user_ops.get(op))) {
        Ok(n) => n,
        Err(code) => return code,
    };
    let reduces = matches!(
        coll,
        CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
    );
    let red = match (red_op(op), premul) {
        (Some(o), _) => o,
        (None, Some(_)) => ReduceOp::Sum,
        (None, None) if !reduces => ReduceOp::Sum,
        (None, None) => {
            return invalid(format!(
                "{name}: reduction op {op} is neither built in (sum, prod, max, min, avg) nor a premultiplied sum made on this communicator"
            ))
        }
    };
    if root < 0 || root as usize >= nranks {
        return invalid(format!(
            "{name}: root {root} out of range for {nranks} ranks"
        ));
    }
    // Broadcast reads the send buffer on the root only, reduce writes the receive buffer on
    // the root only (NCCL lets the others pass NULL); the kernels never touch those.
    if count > 0
        && ((send.is_null() && coll != CollKind::Broadcast)
            || (recv.is_null() && coll != CollKind::Reduce))
    {
        return invalid(format!("{name}: NULL buffer with count {count}"));
    }
    let mut call = Call {
        args: railcc_core::call::CollArgs {
            coll,
            nranks,
            count,
            dtype: dt,
            op: red,
            root: root as usize,
        },
        send: send as u64,
        recv: recv as u64,
        stream: stream as usize,
    };
    if let (Some(p), true) = (premul, reduces) {
        // SAFETY: checked non-NULL by with_comm above; a live handle (NCCL's contract).
        let c = unsafe { &*comm };
        if let Err(e) = c.user_ops.prepare(c, &mut call, p) {
            return fail(&e.rank(c.rank).op(name));
        }
    }
    if group::in_group() {
        group::defer(group::Pending::Coll(comm, call));
        return SUCCESS;
    }
    match submit(comm, call) {
        Ok(t) => wait(comm, t),
        Err(code) => code,
    }
}

const NO_OP: c_int = 0;

#[no_mangle]
pub extern "C" fn ncclAllReduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    collective(
        "ncclAllReduce",
        CollKind::AllReduce,
        send,
        recv,
        count,
        dtype,
        op,
        0,
        comm,
        stream,
    )
}

#[no_mangle]
pub extern "C" fn ncclBroadcast(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    root: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    collective(
        "ncclBroadcast",
        CollKind::Broadcast,
        send,
        recv,
        count,
        dtype,
        NO_OP,
        root,
        comm,
        stream,
    )
}

#[no_mangle]
pub extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    dtype: c_int,
    root: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    collective(
        "ncclBcast",
        CollKind::Broadcast,
        buff,
        buff,
        count,
        dtype,
        NO_OP,
        root,
        comm,
        stream,
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn ncclReduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    root: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    collective(
        "ncclReduce",
        CollKind::Reduce,
        send,
        recv,
        count,
        dtype,
        op,
        root,
        comm,
        stream,
    )
}

#[no_mangle]
pub extern "C" fn ncclAllGather(
    send: *const c_void,
    recv: *mut c_void,
    sendcount: usize,
    dtype: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    collective(
        "ncclAllGather",
        CollKind::AllGather,
        send,
        recv,
        sendcount,
        dtype,
        NO_OP,
        0,
        comm,
        stream,
    )
}

#[no_mangle]
pub extern "C" fn ncclReduceScatter(
    send: *const c_void,
    recv: *mut c_void,
    recvcount: usize,
    dtype: c_int,
    op: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    collective(
        "ncclReduceScatter",
        CollKind::ReduceScatter,
        send,
        recv,
        recvcount,
        dtype,
        op,
        0,
        comm,
        stream,
    )
}

/// A premultiplied sum: each rank's input times `scalar`, summed (see premul.rs). The handle
/// is valid for calls on `comm` with `datatype` until ncclRedOpDestroy.
///
/// # Safety
/// `op` must be NULL or point to an ncclRedOp_t; `scalar` NULL or an element of `datatype` in
/// host memory (ncclScalarHostImmediate) or device memory of the communicator's GPU
/// (ncclScalarDevice), the latter valid while calls using the op run.
#[no_mangle]
pub unsafe extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut c_int,
    scalar: *mut c_void,
    dtype: c_int,
    residence: c_int,
    comm: *mut Comm,
) -> NcclResult {
    const NAME: &str = "ncclRedOpCreatePreMulSum";
    let Some(dt) = abi::dtype(dtype) else {
        return invalid(format!(
            "{NAME}: datatype {dtype} is not one railcc supports"
        ));
    };
    if op.is_null() || scalar.is_null() {
        return invalid(format!("{NAME}: op or scalar is NULL"));
    }
    let scalar = match residence {
        0 => Scalar::Device(scalar as u64),
        1 => {
            let mut b = [0u8; 8];
            // SAFETY: the caller passes an element of `dt` (at most 8 bytes) in host memory.
            unsafe {
                std::ptr::copy_nonoverlapping(scalar as *const u8, b.as_mut_ptr(), dt.size())
            };
            Scalar::Host(u64::from_le_bytes(b))
        }
        r => {
            return invalid(format!(
            "{NAME}: residence {r} is neither ncclScalarDevice (0) nor ncclScalarHostImmediate (1)"
        ))
        }
    };
    let made = with_comm(comm, NAME, |c| {
        c.user_ops
            .create(c.device, premul::PreMul { dtype: dt, scalar })
            .map_err(|e| fail(&e.rank(c.rank).op(NAME)))
    });
    match made {
        Ok(Ok(h)) => {
            // SAFETY: checked non-NULL above; the caller's out-pointer.
            unsafe { *op = h };
            SUCCESS
        }
        Ok(Err(code)) | Err(code) => code,
    }
}

#[no_mangle]
pub extern "C" fn ncclRedOpDestroy(op: c_int, comm: *mut Comm) -> NcclResult {
    if red_op(op).is_some() {
        return invalid(format!("ncclRedOpDestroy: op {op} is a built-in operation"));
    }
    match with_comm(comm, "ncclRedOpDestroy", |c| c.user_ops.destroy(op)) {
        Ok(true) => SUCCESS,
        Ok(false) => invalid(format!(
            "ncclRedOpDestroy: op {op} was not made on this communicator (or is destroyed already)"
        )),
        Err(code) => code,
    }
}

/// Hands a collective to its communicator: the clique (every rank in this process: the
/// call that completes a slot launches for all) or this rank's GpuComm, which enqueues it
/// on the call's stream.
pub(crate) fn submit(comm: *const Comm, call: Call) -> Result<Ticket, NcclResult> {
    with_comm(comm, call.args.coll.name(), |c| {
        c.wait_init();
        if let Some(e) = c.broken.lock().clone() {
            return Err(fail(&e));
        }
        match c.backend.get() {
            Some(Backend::Local(clique)) => {
                let seq = c.seq.fetch_add(1, Ordering::Relaxed);
                Ok(clique.submit(c.rank, seq, call))
            }
            // SAFETY: NCCL's contract: device buffers of this rank's GPU (cudaMalloc/
            // cuMemAlloc, so CUDA IPC can export them), sized for the call, live until the
            // stream passes it.
            Some(Backend::Gpu(g)) => {
                let t0 = std::time::Instant::now();
                // SAFETY: as above.
                let r = unsafe { g.comm.collective(std::slice::from_ref(&call)) }.map(|_| ());
                slow_call(c.rank, &call, t0.elapsed());
                if let Some(t) = g.comm.host_trace() {
                    t.since(t0, "libnccl collective (whole)");
                }
                Ok(Ticket::Done(r))
            }
            None => Err(usage(format!(
                "{}: communicator not initialized",
                call.args.coll.name()
            ))),
        }
    })?
}

/// At NCCL_DEBUG=INFO, a call that held the caller's thread for more than a millisecond (a
/// stream-ordered call should return in microseconds: a longer one delays whatever the caller
/// launches next, such as an overlapped step's matrix products).
fn slow_call(rank: usize, call: &Call, took: std::time::Duration) {
    if took >= std::time::Duration::from_millis(1) && crate::debug().informs() {
        crate::log_line(&format!(
            "NCCL INFO railcc: rank {rank}: {} of {} elements took {:.2} ms to enqueue",
            call.args.coll.name(),
            call.args.count,
            took.as_secs_f64() * 1e3
        ));
    }
}

/// A submitted call's result (the clique's after every rank made it).
pub(crate) fn wait(comm: *const Comm, t: Ticket) -> NcclResult {
    // SAFETY: a live handle (it was submitted in this call).
    let c = unsafe { &*comm };
    let r = match (t, c.backend.get()) {
        (Ticket::Done(r), _) => r,
        (t, Some(Backend::Local(clique))) => clique.wait(t),
        (_, _) => Err(Error::new(
            ErrorKind::Aborted,
            "communicator not initialized",
        )),
    };
    match r {
        Ok(()) => SUCCESS,
        Err(e) => {
            if e.kind == ErrorKind::Timeout {
                // The ranks are out of step now: every later call fails the same way.
                *c.broken.lock() = Some(e.clone());
            }
            fail(&e)
        }
    }
}
