//! A channel's thread: its own connections (a Communicator), its own copy streams and
//! double-buffered pinned staging. For each piece: the copy off the GPU of the next piece runs
//! while this one crosses the network, and the copy back of this one while the next crosses.

use super::host::run_host;
use super::pieces::{stage_need, Piece, Seg};
use super::slots::SmallStage;
use crate::comm::Communicator;
use crate::regions::RegionId;
use crossbeam_channel::{Receiver, Sender};
use railcc_core::{Error, Result};
use railcc_transport_nvlink::hostsync::{d2h, h2d, CopyStream, Ctx};
use railcc_transport_nvlink::staging::PinnedBuf;
use std::sync::Arc;

pub enum Work {
    /// Pieces whose copies this channel makes.
    Pieces(Vec<Piece>),
    /// One piece whose copies the caller's stream made into `stage`.
    Small {
        piece: Piece,
        stage: Arc<SmallStage>,
    },
}

pub struct Job {
    pub op: u64,
    pub work: Work,
}

pub struct Finished {
    pub op: u64,
    pub result: Result<()>,
}

/// Runs a small call's host part on its stage.
pub fn run_small(comm: &Communicator, piece: &Piece, stage: &SmallStage) -> Result<()> {
    // SAFETY: a slot's stage is used by one call at a time: the caller's stream filled `send`
    // before it set `start`, and reads `recv` only after `done`, which is set after this.
    let (send, recv) = unsafe {
        (
            std::slice::from_raw_parts(stage.send.as_ptr(), stage.send.len()),
            std::slice::from_raw_parts_mut(stage.recv.as_ptr() as *mut u8, stage.recv.len()),
        )
    };
    run_host(comm, &piece.call, send, recv)
}

struct Staged {
    buf: PinnedBuf,
    region: RegionId,
}

struct Channel {
    comm: Arc<Communicator>,
    ctx: Arc<Ctx>,
    down: CopyStream,
    up: CopyStream,
    send: [Option<Staged>; 2],
    recv: [Option<Staged>; 2],
    /// Stages outgrown, kept until the channel ends: freeing pinned memory waits for the whole
    /// GPU, which may be waiting for this very call (a deadlock).
    retired: Vec<PinnedBuf>,
}

pub fn spawn(
    ch: usize,
    comm: Arc<Communicator>,
    ctx: Arc<Ctx>,
    jobs: Receiver<Job>,
    done: Sender<(usize, Finished)>,
    stage_bytes: usize,
) -> Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("railcc-net{ch}"))
        .spawn(move || {
            let chan = ctx.bind().and_then(|_| {
                Ok(Channel {
                    down: CopyStream::new(&ctx, 2)?,
                    up: CopyStream::new(&ctx, 2)?,
                    comm,
                    ctx: ctx.clone(),
                    send: [None, None],
                    recv: [None, None],
                    retired: Vec::new(),
                })
            });
            // Stages for a whole chunk up front, so growing is rare.
            let chan = chan.and_then(|mut c| c.ensure(stage_bytes, stage_bytes).map(|_| c));
            let mut chan = match chan {
                Ok(c) => Ok(c),
                Err(e) => Err(e.op(format!("gpu net channel {ch}"))),
            };
            for job in jobs.iter() {
                let result = match &mut chan {
                    Ok(c) => c.run(&job.work),
                    Err(e) => Err(e.clone()),
                };
                if done.send((ch, Finished { op: job.op, result })).is_err() {
                    break;
                }
            }
            if let Ok(c) = chan {
                c.release();
            }
        })
        .map_err(|e| Error::io(format!("gpu net: starting channel {ch}'s thread"), &e))
}

impl Channel {
    fn run(&mut self, w: &Work) -> Result<()> {
        match w {
            Work::Small { piece, stage } => run_small(&self.comm, piece, stage),
            Work::Pieces(ps) => {
                self.ctx.bind()?;
                let r = self.pipeline(ps);
                // Nothing may still be copying into or out of the stages when the next job
                // starts (or when an error leaves this one).
                let a = self.down.synchronize();
                let b = self.up.synchronize();
                r.and(a).and(b)
            }
        }
    }

    fn ensure(&mut self, send: usize, recv: usize) -> Result<()> {
        let comm = &self.comm;
        let ctx = &self.ctx;
        let retired = &mut self.retired;
        let mut grow = |slot: &mut Option<Staged>, bytes: usize| -> Result<()> {
            if slot.as_ref().is_some_and(|s| s.buf.len() >= bytes) {
                return Ok(());
            }
            if let Some(old) = slot.take() {
                comm.deregister(old.region)?;
                retired.push(old.buf);
            }
            let buf = PinnedBuf::in_current(ctx.ctx, bytes.max(1).next_power_of_two())?;
            // SAFETY: the buffer stays in `slot` until it is deregistered (here or in release).
            let region = unsafe { comm.register(buf.as_ptr(), buf.len()) }?;
            *slot = Some(Staged { buf, region });
            Ok(())
        };
        for s in self.send.iter_mut() {
            grow(s, send)?;
        }
        for r in self.recv.iter_mut() {
            grow(r, recv)?;
        }
        Ok(())
    }

    fn pipeline(&mut self, ps: &[Piece]) -> Result<()> {
        let (sn, rn) = stage_need(ps);
        self.ensure(sn, rn)?;
        if ps.is_empty() {
            return Ok(());
        }
        self.down_copies(&ps[0], 0)?;
        self.down.record(0)?;
        for (i, p) in ps.iter().enumerate() {
            let b = i % 2;
            if let Some(next) = ps.get(i + 1) {
                // The stage it fills was last read by the host call before this one, which
                // has returned.
                self.down_copies(next, 1 - b)?;
                self.down.record(1 - b)?;
            }
            self.down.wait(b)?;
            // The copy back that last read this receive stage (two pieces ago) must be done.
            self.up.wait(b)?;
            let (Some(s), Some(r)) = (&self.send[b], &mut self.recv[b]) else {
                return Err(Error::invalid("gpu net: stages missing"));
            };
            run_host(&self.comm, &p.call, s.buf.as_slice(), r.buf.as_mut_slice())?;
            self.up_copies(p, b)?;
            self.up.record(b)?;
        }
        Ok(())
    }

    fn down_copies(&mut self, p: &Piece, b: usize) -> Result<()> {
        let Some(s) = &mut self.send[b] else {
            return Err(Error::invalid("gpu net: send stage missing"));
        };
        let base = s.buf.as_mut_ptr();
        for &Seg { dev, stage, bytes } in &p.down {
            check_fits(stage, bytes, s.buf.len())?;
            // SAFETY: `dev` is the caller's device memory for this call (NCCL's contract: valid
            // until the stream passes the call, which waits for us); the stage range fits.
            unsafe { d2h(self.down.stream, base.add(stage), dev, bytes) }?;
        }
        Ok(())
    }

    fn up_copies(&mut self, p: &Piece, b: usize) -> Result<()> {
        let Some(r) = &self.recv[b] else {
            return Err(Error::invalid("gpu net: receive stage missing"));
        };
        let base = r.buf.as_ptr();
        for &Seg { dev, stage, bytes } in &p.up {
            check_fits(stage, bytes, r.buf.len())?;
            // SAFETY: as in down_copies, the other way round.
            unsafe { h2d(self.up.stream, dev, base.add(stage), bytes) }?;
        }
        Ok(())
    }

    fn release(mut self) {
        let _ = self.down.synchronize();
        let _ = self.up.synchronize();
        for s in self.send.iter_mut().chain(self.recv.iter_mut()) {
            if let Some(s) = s.take() {
                if let Err(e) = self.comm.deregister(s.region) {
                    tracing::debug!("gpu net: deregister stage: {e}");
                }
            }
        }
    }
}

fn check_fits(at: usize, bytes: usize, len: usize) -> Result<()> {
    if at.checked_add(bytes).is_none_or(|end| end > len) {
        return Err(Error::invalid(format!(
            "gpu net: stage range {at}+{bytes} past its {len} bytes"
        )));
    }
    Ok(())
}
