//! ncclCommSplit's exchange: every parent rank's color and key, then each new communicator's
//! bootstrap id from its rank 0, both over the parent's bootstrap connections; ncclCommShrink,
//! which only the survivors call.

use super::*;
use crate::init::finish_init;

/// A color and key as they travel: little-endian i32 each.
fn encode(color: c_int, key: c_int) -> Vec<u8> {
    [color.to_le_bytes(), key.to_le_bytes()].concat()
}

fn decode(b: &[u8]) -> Option<(c_int, c_int)> {
    let c = c_int::from_le_bytes(b.get(..4)?.try_into().ok()?);
    let k = c_int::from_le_bytes(b.get(4..8)?.try_into().ok()?);
    Some((c, k))
}

/// The new rank and size of parent rank `me` among the ranks that passed `color`: ordered by
/// key, then by parent rank. None for NCCL_SPLIT_NOCOLOR. `all[r]` is rank r's (color, key).
pub(crate) fn place(all: &[(c_int, c_int)], me: usize) -> Option<(usize, Vec<usize>)> {
    let color = all.get(me)?.0;
    if color == super::init::SPLIT_NOCOLOR {
        return None;
    }
    let mut members: Vec<(c_int, usize)> = all
        .iter()
        .enumerate()
        .filter(|(_, ck)| ck.0 == color)
        .map(|(r, ck)| (ck.1, r))
        .collect();
    members.sort_unstable();
    let ranks: Vec<usize> = members.into_iter().map(|m| m.1).collect();
    let at = ranks.iter().position(|&r| r == me)?;
    Some((at, ranks))
}

fn broken(parent: &Comm, msg: String) -> NcclResult {
    fail(
        &Error::new(ErrorKind::InvalidArgument, msg)
            .rank(parent.rank)
            .op("ncclCommSplit"),
    )
}

/// The split itself; Ok(None) for a rank left out. Every rank takes part in both exchanges,
/// whatever it passed, so a bad color fails every rank at once instead of leaving the others
/// waiting.
pub(crate) fn split(
    parent: &Comm,
    color: c_int,
    key: c_int,
    config: crate::abi::CommConfig,
) -> Result<Option<*mut Comm>, NcclResult> {
    if parent.backend.get().is_none() {
        return Err(usage(
            "ncclCommSplit: the parent communicator's init has not completed (call ncclGroupEnd first)",
        ));
    }
    let Some(boot) = parent.boot.get() else {
        return Err(usage(
            "ncclCommSplit: the parent communicator has no bootstrap",
        ));
    };
    let wire = |e: Error| fail(&e.rank(parent.rank).op("ncclCommSplit"));
    let all = boot.oob_all_gather(&encode(color, key)).map_err(wire)?;
    let mut cks = Vec::with_capacity(all.len());
    for (r, b) in all.iter().enumerate() {
        let Some(ck) = decode(b) else {
            return Err(broken(
                parent,
                format!("rank {r} sent a malformed color and key"),
            ));
        };
        if ck.0 < 0 && ck.0 != super::init::SPLIT_NOCOLOR {
            return Err(broken(
                parent,
                format!(
                    "rank {r} passed color {}: a color is >= 0 or NCCL_SPLIT_NOCOLOR ({})",
                    ck.0,
                    super::init::SPLIT_NOCOLOR
                ),
            ));
        }
        cks.push(ck);
    }
    let placed = place(&cks, parent.rank);
    // The new rank 0 of each color serves its communicator's bootstrap root; its id travels
    // to the others over the parent (1 and the id, or 0 and why the root failed).
    let leads = placed.as_ref().is_some_and(|(at, _)| *at == 0);
    let mut payload = Vec::new();
    if leads {
        let ifname = crate::config().map(|c| c.socket_ifname).unwrap_or_default();
        match proc_backend::serve_root(timeout(), &ifname) {
            Ok(id) => {
                payload.push(1);
                payload.extend_from_slice(&id.to_bytes());
            }
            Err(e) => {
                payload.push(0);
                payload.extend_from_slice(e.to_string().as_bytes());
            }
        }
    }
    let ids = boot.oob_all_gather(&payload).map_err(wire)?;
    let Some((new_rank, ranks)) = placed else {
        return Ok(None);
    };
    let lead = ranks[0];
    let id = match ids.get(lead).map(|b| b.split_first()) {
        Some(Some((1, id))) => railcc_core::bootstrap::UniqueId::from_bytes(id).map_err(|_| {
            broken(parent, format!("parent rank {lead} sent a malformed bootstrap id"))
        })?,
        Some(Some((_, why))) => {
            return Err(broken(
                parent,
                format!(
                    "parent rank {lead} (rank 0 of color {color}) could not start the new communicator's bootstrap: {}",
                    String::from_utf8_lossy(why)
                ),
            ))
        }
        _ => return Err(broken(parent, format!("parent rank {lead} sent no bootstrap id"))),
    };
    join(
        parent,
        &format!(
            "ncclCommSplit: parent rank {} of {}, color {color} key {key}",
            parent.rank, parent.nranks
        ),
        (new_rank, &ranks),
        &id,
        config,
    )
    .map(Some)
}

/// Makes the child communicator: rank `new_rank` of `ranks` (parent ranks), joining the
/// bootstrap `id`; `what` heads the NCCL_DEBUG=INFO line.
fn join(
    parent: &Comm,
    what: &str,
    (new_rank, ranks): (usize, &[usize]),
    id: &railcc_core::bootstrap::UniqueId,
    config: crate::abi::CommConfig,
) -> Result<*mut Comm, NcclResult> {
    if crate::debug().informs() {
        crate::log_line(&format!(
            "NCCL INFO railcc libnccl {what}: rank {new_rank} of {} (parent ranks {ranks:?})",
            ranks.len()
        ));
    }
    let mut comm = Comm::new(new_rank, ranks.len(), parent.device);
    comm.config = config;
    let c = Box::into_raw(Box::new(comm));
    let code = finish_init(c, id);
    if code != SUCCESS {
        // SAFETY: made by Box::into_raw above and never handed out.
        drop(unsafe { Box::from_raw(c) });
        return Err(code);
    }
    Ok(c)
}

/// NCCL_SHRINK_ABORT: the parent had an error; its outstanding operations are abandoned.
const SHRINK_ABORT: c_int = 1;
/// What the new rank 0 tells each survivor: a status byte, then the id or why not.
const SHRINK_MSG_BYTES: usize = 1 + 512;

/// The survivors of a shrink, in parent rank order: every rank not in `exclude`. Errors name
/// an excluded rank out of range, twice, or the caller itself.
pub(crate) fn survivors(nranks: usize, me: usize, exclude: &[c_int]) -> Result<Vec<usize>, String> {
    let mut out = vec![true; nranks];
    for &x in exclude {
        let r = usize::try_from(x)
            .ok()
            .filter(|&r| r < nranks)
            .ok_or_else(|| format!("excluded rank {x} is not a rank of {nranks}"))?;
        if !out[r] {
            return Err(format!("rank {x} is excluded twice"));
        }
        out[r] = false;
    }
    if !out[me] {
        return Err(format!(
            "rank {me} is in its own exclude list (excluded ranks do not call ncclCommShrink)"
        ));
    }
    Ok((0..nranks).filter(|&r| out[r]).collect())
}

/// ncclCommShrink: a communicator of the parent's ranks less `exclude`, in parent rank order,
/// made by the survivors only (the excluded may be dead). The new rank 0 serves its bootstrap
/// and sends the id to each survivor over the parent's bootstrap connections, which never
/// touch an excluded rank. With NCCL_SHRINK_ABORT the parent's outstanding work is abandoned
/// first (its GPU waits end), as after a failure.
pub(crate) fn shrink(
    parent: &Comm,
    exclude: &[c_int],
    flags: c_int,
    config: crate::abi::CommConfig,
) -> Result<*mut Comm, NcclResult> {
    const OP: &str = "ncclCommShrink";
    let Some(boot) = parent.boot.get() else {
        return Err(usage(format!(
            "{OP}: the parent communicator has no bootstrap (made by ncclCommInitAll?)"
        )));
    };
    let ranks = survivors(parent.nranks, parent.rank, exclude)
        .map_err(|m| broken(parent, format!("{OP}: {m}")))?;
    if flags & SHRINK_ABORT != 0 {
        if let Some(Backend::Gpu(g)) = parent.backend.get() {
            g.comm.abort();
        }
    }
    let wire = |e: Error| fail(&e.rank(parent.rank).op(OP));
    let new_rank = ranks.iter().position(|&r| r == parent.rank).unwrap_or(0);
    let lead = ranks[0];
    let id = if new_rank == 0 {
        let ifname = crate::config().map(|c| c.socket_ifname).unwrap_or_default();
        let served = proc_backend::serve_root(timeout(), &ifname);
        let mut msg = vec![0u8; SHRINK_MSG_BYTES];
        match &served {
            Ok(id) => {
                msg[0] = 1;
                msg[1..129].copy_from_slice(&id.to_bytes());
            }
            Err(e) => {
                let why = e.to_string();
                let n = why.len().min(SHRINK_MSG_BYTES - 1);
                msg[1..1 + n].copy_from_slice(&why.as_bytes()[..n]);
            }
        }
        for &r in &ranks[1..] {
            boot.send(&msg, r).map_err(wire)?;
        }
        served.map_err(wire)?
    } else {
        let mut msg = vec![0u8; SHRINK_MSG_BYTES];
        boot.recv(&mut msg, lead).map_err(wire)?;
        if msg[0] != 1 {
            let why = String::from_utf8_lossy(&msg[1..])
                .trim_end_matches('\0')
                .to_string();
            return Err(broken(
                parent,
                format!("{OP}: parent rank {lead} could not start the new communicator's bootstrap: {why}"),
            ));
        }
        railcc_core::bootstrap::UniqueId::from_bytes(&msg[1..129]).map_err(|_| {
            broken(
                parent,
                format!("{OP}: parent rank {lead} sent a malformed bootstrap id"),
            )
        })?
    };
    let what = format!(
        "ncclCommShrink: parent rank {} of {}",
        parent.rank, parent.nranks
    );
    join(parent, &what, (new_rank, &ranks), &id, config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_follow_key_then_parent_rank() {
        // Parent ranks 0..6: colors 0 1 0 1 -1 0, keys 5 0 5 1 0 -1.
        let all = [(0, 5), (1, 0), (0, 5), (1, 1), (-1, 0), (0, -1)];
        assert_eq!(place(&all, 0), Some((1, vec![5, 0, 2])));
        assert_eq!(place(&all, 2), Some((2, vec![5, 0, 2])));
        assert_eq!(place(&all, 5), Some((0, vec![5, 0, 2])));
        assert_eq!(place(&all, 3), Some((1, vec![1, 3])));
        assert_eq!(place(&all, 4), None);
        // A color of its own: a one-rank communicator.
        let all = [(7, 0), (0, 0)];
        assert_eq!(place(&all, 0), Some((0, vec![0])));
    }

    #[test]
    fn shrink_keeps_the_others_in_order_and_names_bad_lists() {
        assert_eq!(survivors(5, 0, &[3, 1]), Ok(vec![0, 2, 4]));
        assert_eq!(survivors(3, 2, &[]), Ok(vec![0, 1, 2]));
        assert!(survivors(3, 0, &[3])
            .unwrap_err()
            .contains("excluded rank 3 is not a rank of 3"));
        assert!(survivors(3, 0, &[-1])
            .unwrap_err()
            .contains("excluded rank -1"));
        assert!(survivors(3, 0, &[1, 1])
            .unwrap_err()
            .contains("excluded twice"));
        assert!(survivors(3, 1, &[1])
            .unwrap_err()
            .contains("its own exclude list"));
    }

    #[test]
    fn color_and_key_survive_the_wire() {
        assert_eq!(decode(&encode(-1, i32::MIN)), Some((-1, i32::MIN)));
        assert_eq!(decode(&[1, 2, 3]), None);
    }
}
