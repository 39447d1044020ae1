//! How a call's pieces reach the staging ring on the caller's stream: launches of the
//! staging kernel (`railcc_cuda::netcopy`, the default) or copies and flag operations.

use super::{Call, GpuNet};
use crate::gpu::net::slots::{Slots, CAPTURED_TOKEN};
use crate::gpu::net::tables::Lease;
use railcc_core::{Error, Result};
use railcc_cuda::gpu::Stream;
use railcc_cuda::hostsync::{d2h, h2d};
use railcc_cuda::netcopy::{self, NetKernel};
use std::time::Instant;

impl GpuNet {
    /// `call` on `stream` as launches of the staging kernel (`netcopy.rs`), as many pieces
    /// each as its parameter holds (77 of two segments), or a table where the call holds
    /// some (`RAILCC_GPU_NET_TABLE`: 1006 of two segments, a launch per table):
    /// the same copies and flags as [`GpuNet::stream_ops`], done by the SMs.
    pub(super) unsafe fn kernel_ops(
        &self,
        call: &Call,
        stream: Stream,
        k: &NetKernel,
        blocks: u32,
    ) -> Result<()> {
        let ring = &call.ring;
        let mut header = netcopy::Header {
            flags: self.slots.flags.dev_ptr(0)?,
            depth: ring.depth as u32,
            captured: call.captured as u32,
            slot_words: Slots::start(1) as u32,
            done_word: Slots::done(0) as u32,
            ..Default::default()
        };
        for i in 0..ring.depth.min(netcopy::MAX_DEPTH) {
            header.send[i] = ring.send_dev[i];
            header.recv[i] = ring.recv_dev[i];
        }
        // Each launch takes the call's next table while it has one, else the parameter.
        let mut tables = call.tables.iter();
        let mut table = tables.next();
        let mut p = netcopy::Launch::new(header, k.limits());
        p.use_table(table.is_some());
        let segs = call
            .runs
            .iter()
            .map(|r| r.piece.down.len() + r.piece.up.len());
        p.reserve(call.runs.len(), segs.sum());
        let timed = self.shared.trace.on();
        let t_ops = timed.then(Instant::now);
        let mut in_launch = std::time::Duration::ZERO;
        let stamps = self.stamps.as_ref();
        let mut launch = |p: &mut netcopy::Launch, table: Option<&Lease>| -> Result<()> {
            if let Some((f, n)) = stamps {
                // This launch's entry of the table: launches one after another, neighbours.
                let entry =
                    n.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % netcopy::STAMP_CALLS;
                p.header.stamps = f.dev_ptr(entry * netcopy::STAMP_WORDS)?;
            }
            let t = timed.then(Instant::now);
            // SAFETY: the caller's stream and buffers; the ring and flags live in the engine;
            // the table is the call's until the progress thread drops it.
            let r = match table.filter(|_| p.in_table()) {
                Some(t) => unsafe {
                    k.launch_table(stream, p, blocks, t.dev_ptr()?, |w| t.write(w))
                },
                None => unsafe { k.launch(stream, p, blocks) },
            };
            if let Some(t) = t {
                in_launch += t.elapsed();
            }
            r
        };
        for (i, r) in call.runs.iter().enumerate() {
            let piece = netcopy::Piece {
                token: r.token,
                slot: r.slot as u16,
                ring: (i % ring.depth) as u8,
            };
            let (down, up) = (&r.piece.down, &r.piece.up);
            if p.push(piece, kernel_segs(down), kernel_segs(up)) {
                continue;
            }
            launch(&mut p, table)?;
            p.clear();
            table = tables.next();
            p.use_table(table.is_some());
            if !p.push(piece, kernel_segs(down), kernel_segs(up)) {
                return Err(Error::invalid(format!(
                    "gpu net: a piece of {} segments does not fit the staging kernel",
                    down.len() + up.len()
                )));
            }
        }
        if p.npieces() > 0 {
            launch(&mut p, table)?;
        }
        self.shared.trace.launched(in_launch);
        if let Some(t) = t_ops {
            // Of the stream ops: the rest is the call's place in the launch order (an event
            // recorded, one waited for when the stream changed).
            self.shared.trace.step("kernel ops", t.elapsed());
        }
        Ok(())
    }

    /// The copies and flag operations of `call` on `stream`.
    pub(super) unsafe fn stream_ops(&self, call: &Call, stream: Stream) -> Result<()> {
        let flags = &self.slots.flags;
        let ring = &call.ring;
        let copy_in = |k: usize| -> Result<()> {
            let r = &call.runs[k];
            for s in &r.piece.down {
                // SAFETY: the stage range lies in ring slot k (stage_need sized it); the device
                // range is the caller's.
                unsafe { d2h(stream, ring.send_ptr(k).add(s.stage), s.dev, s.bytes) }?;
            }
            // SAFETY: the slot's words are this piece's until it is given back.
            unsafe { flags.write_on(stream, Slots::start(r.slot), r.token) }
        };
        let n = call.runs.len();
        let depth = ring.depth;
        for k in 0..n.min(depth) {
            copy_in(k)?;
        }
        for (k, r) in call.runs.iter().enumerate() {
            // SAFETY: as above.
            unsafe {
                if call.captured {
                    flags.wait_on(stream, Slots::done(r.slot), CAPTURED_TOKEN)?;
                    flags.write_on(stream, Slots::done(r.slot), 0)?;
                } else {
                    flags.wait_geq_on(stream, Slots::done(r.slot), r.token)?;
                }
            }
            for s in &r.piece.up {
                // SAFETY: as for the copies in, the other way.
                unsafe { h2d(stream, s.dev, ring.recv_ptr(k).add(s.stage), s.bytes) }?;
            }
            if k + depth < n {
                copy_in(k + depth)?;
            }
        }
        Ok(())
    }
}

/// A piece's segments as the kernel takes them (`kernel_fits` checked they fit 32 bits),
/// pushed straight into the launch.
fn kernel_segs(
    v: &[crate::gpu::net::pieces::Seg],
) -> impl ExactSizeIterator<Item = netcopy::Seg> + '_ {
    v.iter().map(|s| netcopy::Seg {
        dev: s.dev,
        stage: s.stage as u32,
        bytes: s.bytes as u32,
    })
}

/// Whether the staging kernel can take `call`: every piece's segments fit one launch and its
/// offsets and sizes 32 bits, and the ring is within the kernel's depth.
pub(super) fn kernel_fits(call: &Call) -> bool {
    call.ring.depth <= netcopy::MAX_DEPTH
        && call.runs.iter().all(|r| r.slot <= u16::MAX as usize)
        && call.runs.iter().all(|r| {
            let p = &r.piece;
            p.down.len() + p.up.len() <= netcopy::MAX_SEGS
                && p.down
                    .iter()
                    .chain(&p.up)
                    .all(|s| u32::try_from(s.stage + s.bytes).is_ok())
        })
}
