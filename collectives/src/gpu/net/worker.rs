//! A channel's thread: its own connections (a Communicator) running the host part of the
//! pieces given to it, in order, on stages the caller's stream fills and drains.

use super::host::run_host;
use super::pieces::HostCall;
use super::ring::Ring;
use crate::comm::Communicator;
use crossbeam_channel::{Receiver, Sender};
use railcc_core::{Error, ErrorKind, Result};
use std::sync::Arc;

/// One piece's host part: its call and the ring slot holding its stages.
pub struct Job {
    pub op: u64,
    pub call: HostCall,
    pub ring: Arc<Ring>,
    pub k: usize,
}

pub struct Finished {
    pub op: u64,
    pub result: Result<()>,
}

/// Runs a piece's host call on its ring slot; a panic in it becomes the piece's error (the
/// stream waiting on the piece is let go and the engine breaks, instead of waiting forever).
pub fn run_piece(comm: &Communicator, call: &HostCall, ring: &Ring, k: usize) -> Result<()> {
    let run = std::panic::AssertUnwindSafe(|| run_piece_inner(comm, call, ring, k));
    std::panic::catch_unwind(run).unwrap_or_else(|p| {
        let what = (p.downcast_ref::<&str>().map(|s| s.to_string()))
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(Error::new(
            ErrorKind::Aborted,
            format!("gpu net: a piece's host part panicked: {what}"),
        ))
    })
}

fn run_piece_inner(comm: &Communicator, call: &HostCall, ring: &Ring, k: usize) -> Result<()> {
    let n = ring.slot_bytes;
    // SAFETY: between the piece's `start` and `done` the host owns its ring slot: the stream
    // filled the send stage before `start` and reads the receive stage only after `done`,
    // which is set after this returns; no other piece uses the slot meanwhile (piece k+depth
    // is copied in only after this one's `done`).
    let (send, recv) = unsafe {
        (
            std::slice::from_raw_parts(ring.send_ptr(k) as *const u8, n),
            std::slice::from_raw_parts_mut(ring.recv_ptr(k), n),
        )
    };
    run_host(comm, call, send, recv)
}

pub fn spawn(
    ch: usize,
    comm: Arc<Communicator>,
    jobs: Receiver<Job>,
    done: Sender<(usize, Finished)>,
) -> Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("railcc-net{ch}"))
        .spawn(move || {
            for job in jobs.iter() {
                let result = run_piece(&comm, &job.call, &job.ring, job.k);
                if done.send((ch, Finished { op: job.op, result })).is_err() {
                    break;
                }
            }
        })
        .map_err(|e| Error::io(format!("gpu net: starting channel {ch}'s thread"), &e))
}
