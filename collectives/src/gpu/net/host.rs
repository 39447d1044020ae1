//! A piece's host call on staged bytes.

use super::pieces::HostCall;
use crate::comm::{Bufs, Communicator, P2p};
use crate::plan::P2pKind;
use railcc_core::{Error, Result};

/// Runs `call` on the communicator: a collective from `send` to `recv`, or sends from `send`
/// and receives into `recv` at their stage offsets (receives laid end to end, in order).
pub fn run_host(comm: &Communicator, call: &HostCall, send: &[u8], recv: &mut [u8]) -> Result<()> {
    match call {
        HostCall::Coll(a) => {
            let es = a.dtype.size();
            let (sb, rb) = (a.send_elems() * es, a.recv_elems() * es);
            let (Some(s), Some(r)) = (send.get(..sb), recv.get_mut(..rb)) else {
                return Err(Error::invalid(format!(
                    "gpu net: stage of {}+{} bytes for a piece of {sb}+{rb}",
                    send.len(),
                    recv.len()
                )));
            };
            comm.collective(*a, Bufs::OutOfPlace { send: s, recv: r })
        }
        HostCall::P2p(list) => {
            let mut ops: Vec<P2p<'_, u8>> = Vec::with_capacity(list.len());
            let mut rest: &mut [u8] = recv;
            let mut at = 0usize;
            for &(kind, peer, stage, bytes) in list {
                match kind {
                    P2pKind::Send => {
                        let buf = send
                            .get(stage..stage + bytes)
                            .ok_or_else(|| Error::invalid("gpu net: send piece past its stage"))?;
                        ops.push(P2p::Send { peer, buf });
                    }
                    P2pKind::Recv => {
                        if stage != at || bytes > rest.len() {
                            return Err(Error::invalid(
                                "gpu net: receive pieces not laid end to end in their stage",
                            ));
                        }
                        let (buf, tail) = std::mem::take(&mut rest).split_at_mut(bytes);
                        rest = tail;
                        at += bytes;
                        ops.push(P2p::Recv { peer, buf });
                    }
                }
            }
            comm.group_any(&mut ops)
        }
    }
}
