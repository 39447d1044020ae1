//! The collectives' entry points: argument checks, then now or at ncclGroupEnd; user
//! reduction ops.

use super::*;

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
            "{name}: datatype {dtype} is not one railcc supports (int8..bfloat16; no fp8)"
        ));
    };
    let Some(op) = red_op(op) else {
        return usage(format!("{name}: reduction op {op} is not sum, prod, max, min or avg (premultiplied sums are not implemented)"));
    };
    let nranks = match with_comm(comm, name, |c| c.nranks) {
        Ok(n) => n,
        Err(code) => return code,
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
    let call = Call {
        coll,
        send: send as u64,
        recv: recv as u64,
        count,
        dtype: dt,
        op,
        root: root as usize,
        stream: stream as usize,
    };
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

/// Premultiplied sums are not implemented (we report NCCL 2.10, before them).
#[no_mangle]
pub extern "C" fn ncclRedOpCreatePreMulSum(
    _op: *mut c_int,
    _scalar: *mut c_void,
    _dtype: c_int,
    _residence: c_int,
    _comm: *mut Comm,
) -> NcclResult {
    usage("ncclRedOpCreatePreMulSum: premultiplied sums are not implemented in railcc's libnccl")
}

#[no_mangle]
pub extern "C" fn ncclRedOpDestroy(op: c_int, _comm: *mut Comm) -> NcclResult {
    if red_op(op).is_some() {
        return invalid(format!("ncclRedOpDestroy: op {op} is a built-in operation"));
    }
    usage("ncclRedOpDestroy: no user-defined ops exist in railcc's libnccl")
}
