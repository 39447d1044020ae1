//! Groups and point-to-point: ncclGroupStart/End (inits, collectives, then sends and
//! receives), ncclSend/Recv and all-to-all as a group of them.

use super::*;
use crate::coll::{submit, wait};
use crate::init::finish_init;
use railcc_core::call::P2pOp;

#[no_mangle]
pub extern "C" fn ncclGroupStart() -> NcclResult {
    group::start();
    SUCCESS
}

#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> NcclResult {
    // The whole call's host time, for RAILCC_GPU_HOST_TRACE beside its inner phases.
    let entry = std::time::Instant::now();
    let pending = match group::end() {
        Ok(Some(p)) => p,
        Ok(None) => return SUCCESS,
        Err(()) => return usage("ncclGroupEnd without ncclGroupStart"),
    };
    let mut first = SUCCESS;
    let mut note = |r: NcclResult| {
        if first == SUCCESS {
            first = r;
        }
    };
    // Inits first, all at once: each blocks in the bootstrap until every rank arrives, and
    // this thread may hold several ranks.
    let inits: Vec<(usize, railcc_core::bootstrap::UniqueId)> = pending
        .iter()
        .filter_map(|p| match p {
            group::Pending::Init(c, id) => Some((*c as usize, *id)),
            _ => None,
        })
        .collect();
    let results: Vec<NcclResult> = std::thread::scope(|s| {
        let hs: Vec<_> = inits
            .iter()
            // The handle crosses as an address: it stays valid (NCCL's contract) and only
            // finish_init reads it.
            .map(|(c, id)| s.spawn(move || finish_init(*c as *const Comm, id)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or(INTERNAL_ERROR))
            .collect()
    });
    for r in results {
        note(r);
    }
    let mut tickets: Vec<(*const Comm, Ticket)> = Vec::new();
    let mut p2ps = Vec::new();
    for p in pending {
        match p {
            group::Pending::Init(..) => {}
            group::Pending::Coll(c, call) => match submit(c, call) {
                Ok(t) => tickets.push((c, t)),
                Err(r) => note(r),
            },
            group::Pending::P2p(c, op) => p2ps.push((c, op)),
        }
    }
    // Sends and receives after the collectives, in program order. On the per-process and
    // network paths a communicator's sends and receives of the group are one batch (which
    // orders them so that no two ranks wait on each other; a rank's messages to itself are
    // copies there, `railcc_transport_nvlink::selfcopy` on one host); in one process, the
    // clique pairs them.
    let mut batches: Vec<(*const Comm, Vec<P2pOp>)> = Vec::new();
    let mut local_batches: Vec<LocalBatch> = Vec::new();
    for (c, op) in p2ps {
        // SAFETY: handles in a group are live (NCCL's contract).
        let cr = unsafe { &*c };
        let Some(Backend::Gpu(_)) = cr.backend.get() else {
            match local_batch_entry(c, op) {
                Ok(Some((clique, _))) => {
                    match local_batches
                        .iter_mut()
                        .find(|b| Arc::ptr_eq(&b.1, &clique))
                    {
                        Some(b) => b.2.push((c, op)),
                        None => local_batches.push((c, clique, vec![(c, op)])),
                    }
                }
                Ok(None) => match submit_p2p(c, op) {
                    Ok(t) => tickets.push((c, t)),
                    Err(r) => note(r),
                },
                Err(r) => note(r),
            }
            continue;
        };
        match batches.iter_mut().find(|g| std::ptr::eq(g.0, c)) {
            Some(g) => g.1.push(op),
            None => batches.push((c, vec![op])),
        }
    }
    for (c, clique, ops) in local_batches {
        tickets.push((c, Ticket::Done(run_local_batch(&clique, &ops))));
    }
    for (c, ops) in batches {
        // SAFETY: as above.
        let res = match unsafe { (*c).backend.get() } {
            Some(Backend::Gpu(g)) => {
                let r = g.p2p(&ops);
                if let Some(t) = g.comm.host_trace() {
                    t.since(entry, "libnccl group end (whole)");
                }
                r
            }
            _ => Err(Error::new(
                ErrorKind::Aborted,
                "communicator not initialized",
            )),
        };
        tickets.push((c, Ticket::Done(res)));
    }
    for (c, t) in tickets {
        note(wait(c, t));
    }
    first
}

#[allow(clippy::too_many_arguments)]
fn p2p(
    name: &str,
    buf: *mut c_void,
    count: usize,
    dtype: c_int,
    peer: c_int,
    comm: *const Comm,
    stream: *mut c_void,
    send: bool,
) -> NcclResult {
    let Some(dt) = abi::dtype(dtype) else {
        return invalid(format!(
            "{name}: datatype {dtype} is not one railcc supports"
        ));
    };
    let nranks = match with_comm(comm, name, |c| c.nranks) {
        Ok(n) => n,
        Err(code) => return code,
    };
    if peer < 0 || peer as usize >= nranks {
        return invalid(format!(
            "{name}: peer {peer} out of range for {nranks} ranks"
        ));
    }
    if buf.is_null() && count > 0 {
        return invalid(format!("{name}: NULL buffer with count {count}"));
    }
    let op = P2pOp {
        peer: peer as usize,
        send,
        ptr: buf as u64,
        bytes: count * dt.size(),
        stream: stream as usize,
    };
    if group::in_group() {
        group::defer(group::Pending::P2p(comm, op));
        return SUCCESS;
    }
    match submit_p2p(comm, op) {
        Ok(t) => wait(comm, t),
        Err(code) => code,
    }
}

#[no_mangle]
pub extern "C" fn ncclSend(
    send: *const c_void,
    count: usize,
    dtype: c_int,
    peer: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    p2p(
        "ncclSend",
        send as *mut c_void,
        count,
        dtype,
        peer,
        comm,
        stream,
        true,
    )
}

#[no_mangle]
pub extern "C" fn ncclRecv(
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    peer: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    p2p("ncclRecv", recv, count, dtype, peer, comm, stream, false)
}

/// All-to-all as NCCL's own fallback does it: a group of a send and a receive per peer.
#[no_mangle]
pub extern "C" fn ncclAlltoAll(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    let Some(dt) = abi::dtype(dtype) else {
        return invalid(format!(
            "ncclAlltoAll: datatype {dtype} is not one railcc supports"
        ));
    };
    let nranks = match with_comm(comm, "ncclAlltoAll", |c| c.nranks) {
        Ok(n) => n,
        Err(code) => return code,
    };
    let block = count * dt.size();
    grouped(|note| {
        for r in 0..nranks {
            note(ncclSend(
                (send as *const u8).wrapping_add(r * block) as *const c_void,
                count,
                dtype,
                r as c_int,
                comm,
                stream,
            ));
            note(ncclRecv(
                (recv as *mut u8).wrapping_add(r * block) as *mut c_void,
                count,
                dtype,
                r as c_int,
                comm,
                stream,
            ));
        }
    })
}

/// Runs `calls` as one group of its own: `note` keeps the first failure among the calls it
/// makes, which is returned in place of ncclGroupEnd's result.
fn grouped(calls: impl FnOnce(&mut dyn FnMut(NcclResult))) -> NcclResult {
    group::start();
    let mut first = SUCCESS;
    calls(&mut |x| {
        if first == SUCCESS {
            first = x;
        }
    });
    let e = ncclGroupEnd();
    if first == SUCCESS {
        e
    } else {
        first
    }
}

/// A rooted exchange as a group of sends and receives: the root moves one block per rank
/// (`gather`: into its receive buffer, `scatter`: out of its send buffer) and every rank,
/// the root included, sends (`gather`) or receives (`scatter`) one block.
#[allow(clippy::too_many_arguments)]
fn rooted(
    what: &str,
    gather: bool,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    root: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    let Some(dt) = abi::dtype(dtype) else {
        return invalid(format!(
            "{what}: datatype {dtype} is not one railcc supports"
        ));
    };
    let (nranks, me) = match with_comm(comm, what, |c| (c.nranks, c.rank)) {
        Ok(v) => v,
        Err(code) => return code,
    };
    if root < 0 || root as usize >= nranks {
        return invalid(format!(
            "{what}: root {root} is not a rank of this {nranks}-rank communicator"
        ));
    }
    let block = count * dt.size();
    grouped(|note| {
        if me == root as usize {
            for r in 0..nranks {
                note(if gather {
                    ncclRecv(
                        (recv as *mut u8).wrapping_add(r * block) as *mut c_void,
                        count,
                        dtype,
                        r as c_int,
                        comm,
                        stream,
                    )
                } else {
                    ncclSend(
                        (send as *const u8).wrapping_add(r * block) as *const c_void,
                        count,
                        dtype,
                        r as c_int,
                        comm,
                        stream,
                    )
                });
            }
        }
        note(if gather {
            ncclSend(send, count, dtype, root, comm, stream)
        } else {
            ncclRecv(recv, count, dtype, root, comm, stream)
        });
    })
}

/// NCCL 2.24's gather: `count` elements from every rank into the root's receive buffer, in
/// rank order.
#[no_mangle]
pub extern "C" fn ncclGather(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    root: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    rooted(
        "ncclGather",
        true,
        send,
        recv,
        count,
        dtype,
        root,
        comm,
        stream,
    )
}

/// NCCL 2.24's scatter: block r of the root's send buffer (`count` elements) to rank r.
#[no_mangle]
pub extern "C" fn ncclScatter(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    root: c_int,
    comm: *const Comm,
    stream: *mut c_void,
) -> NcclResult {
    rooted(
        "ncclScatter",
        false,
        send,
        recv,
        count,
        dtype,
        root,
        comm,
        stream,
    )
}

/// One clique's sends and receives of a group: a handle of it, the clique, and each op with
/// its rank's handle.
type LocalBatch = (*const Comm, Arc<Clique>, Vec<(*const Comm, P2pOp)>);

/// For a communicator of this process whose sends and receives go as batch kernels (once its
/// init is done): its clique and rank; None for every other communicator.
fn local_batch_entry(
    comm: *const Comm,
    op: P2pOp,
) -> Result<Option<(Arc<Clique>, usize)>, NcclResult> {
    with_comm(comm, if op.send { "ncclSend" } else { "ncclRecv" }, |c| {
        c.wait_init();
        let Some(Backend::Local(clique)) = c.backend.get() else {
            return Ok(None);
        };
        if !clique.batches_p2p() {
            return Ok(None);
        }
        if let Some(e) = c.broken.lock().clone() {
            return Err(fail(&e));
        }
        Ok(Some((clique.clone(), c.rank)))
    })?
}

/// One thread's sends and receives of a group on a batching clique: each gets its number (as
/// `submit_p2p` would count it) and the clique runs them (a rank's several streams joined
/// into its first).
fn run_local_batch(clique: &Clique, ops: &[(*const Comm, P2pOp)]) -> railcc_core::Result<()> {
    let mut numbered = Vec::with_capacity(ops.len());
    for &(c, op) in ops {
        // SAFETY: handles in a group are live (NCCL's contract).
        let cr = unsafe { &*c };
        numbered.push((cr.rank, cr.next_p2p_seq(op.peer, op.send), op));
    }
    clique.batch_p2p(&numbered)
}

/// Hands one send or receive to its communicator.
fn submit_p2p(comm: *const Comm, op: P2pOp) -> Result<Ticket, NcclResult> {
    if let Some((clique, _)) = local_batch_entry(comm, op)? {
        return Ok(Ticket::Done(run_local_batch(&clique, &[(comm, op)])));
    }
    let (peer, send) = (op.peer, op.send);
    with_comm(comm, if send { "ncclSend" } else { "ncclRecv" }, |c| {
        c.wait_init();
        if let Some(e) = c.broken.lock().clone() {
            return Err(fail(&e));
        }
        let seq = c.next_p2p_seq(peer, send);
        let (src, dst) = if send { (c.rank, peer) } else { (peer, c.rank) };
        match c.backend.get() {
            Some(Backend::Local(clique)) => Ok(clique.submit_p2p(src, dst, seq, op)),
            Some(Backend::Gpu(g)) => Ok(Ticket::Done(g.p2p(&[op]))),
            None => Err(usage("send/recv: communicator not initialized")),
        }
    })?
}
