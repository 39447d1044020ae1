//! One process driving several GPUs (like `ncclCommInitAll`, nccl-tests `-g N`).
//!
//! A call enqueues its kernel (two for a two-phase all-reduce) on every GPU's stream (each
//! rank's own stream, from its call)
//! and returns at once, so one thread starts a collective on every GPU without deadlock: group
//! semantics come for free. Peers' buffers are addressed directly (peer access is enabled
//! between every pair), which is all that differs from one process per GPU (`proc.rs`): the
//! kernel choice and launch are `plan`'s. With a timeout set, a peer that never arrives makes
//! the kernels stop at it ([`MultiGpu::async_error`] then says so) instead of hanging.

use crate::order::KernelOrder;
use crate::plan::{choose, clamp_blocks, enqueue, spec, Choice, Kernel, Launch, Peers};
use crate::Settings;
use railcc_core::call::{Call, P2pOp};
use railcc_core::{Error, ErrorKind, Result};
use railcc_cuda::driver;
use railcc_cuda::gpu::{
    copy_async, enable_peer_access, is_capturing, stream_of, stream_waits_for, GpuCtx, Stream,
};
use railcc_cuda::kernels::MAX_PEERS;
use railcc_cuda::launch::{p2p_step, P2pStep};
use std::time::{Duration, Instant};

/// The GPUs of this process, with peer access enabled between every pair.
pub struct MultiGpu {
    gpus: Vec<GpuCtx>,
    pub ordinals: Vec<usize>,
    timeout_ns: u64,
    /// How calls pick their kernel (`max_blocks`: the SMs a call occupies at most).
    choice: Choice,
    p2p_batch: bool,
    p2p_fused: bool,
    p2p_min_chunk: u64,
    /// Launches from several threads take turns (each enqueues on every GPU).
    turn: parking_lot::Mutex<()>,
    /// Per GPU, the order of its collective kernels across streams.
    orders: Vec<parking_lot::Mutex<KernelOrder>>,
}

impl MultiGpu {
    /// Opens `ordinals` (1 to 8 GPUs, every pair able to reach each other's memory; rank g on
    /// `ordinals[g]`).
    pub fn new(ordinals: &[usize], s: &Settings) -> Result<MultiGpu> {
        if ordinals.is_empty() || ordinals.len() > MAX_PEERS {
            return Err(Error::invalid(format!(
                "multi-GPU: {} GPUs requested, 1 to {MAX_PEERS} supported",
                ordinals.len()
            )));
        }
        let gpus = ordinals
            .iter()
            .map(|&o| s.open_gpu(o))
            .collect::<Result<Vec<_>>>()?;
        for (i, &a) in ordinals.iter().enumerate() {
            for (j, &b) in ordinals.iter().enumerate() {
                if i == j {
                    continue;
                }
                let (can, _) = driver::peer(a, b)?;
                if !can {
                    return Err(Error::new(
                        ErrorKind::Unsupported,
                        format!("GPU {a} cannot access GPU {b}'s memory (no P2P)"),
                    )
                    .transport(crate::NAME));
                }
                enable_peer_access(&gpus[i], &gpus[j])?;
            }
        }
        let max_blocks = clamp_blocks(&gpus, s.max_blocks)?;
        Ok(MultiGpu {
            gpus,
            ordinals: ordinals.to_vec(),
            timeout_ns: s.timeout_ns(),
            choice: Choice {
                ll_max_bytes: s.ll_max_bytes,
                wide: s.wide_loads,
                tma: s.tma,
                push_bytes: s.push_bytes,
                push_min_blocks: s.push_min_blocks,
                push_slot: s.push_slot,
                ag_copy_bytes: s.ag_copy_bytes,
                ar_copy_bytes: s.ar_copy_bytes,
                min_blocks: s.min_blocks.min(u32::MAX as usize) as u32,
                max_blocks,
            },
            p2p_batch: s.p2p_batch,
            p2p_fused: s.p2p_fused,
            p2p_min_chunk: s.p2p_min_chunk,
            turn: parking_lot::Mutex::new(()),
            orders: ordinals.iter().map(|_| Default::default()).collect(),
        })
    }

    /// Why the GPUs' waits stopped, if they did: a kernel waited past the timeout for a peer
    /// GPU, or [`MultiGpu::abort`] was called (every rank of the process learns it, not only
    /// the one aborted). Results since are garbage.
    pub fn async_error(&self) -> Option<Error> {
        if let Some(g) = self.gpus.iter().find(|g| g.kernels_timed_out()) {
            return Some(
                Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "GPU {}: a kernel waited longer than the timeout (RAILCC_TIMEOUT_MS) for a peer GPU",
                        g.ordinal
                    ),
                )
                .transport(crate::NAME),
            );
        }
        self.gpus.iter().any(|g| g.kernels_stopped()).then(|| {
            Error::new(
                ErrorKind::Aborted,
                "the communicator was aborted (ncclCommAbort on one of its ranks)",
            )
            .transport(crate::NAME)
        })
    }

    /// Stops every kernel's waits now (results are garbage; [`MultiGpu::async_error`] says
    /// so from then on).
    pub fn abort(&self) {
        for g in &self.gpus {
            g.abort_kernels();
        }
    }

    /// Thread blocks per GPU a call takes at most.
    pub fn max_blocks(&self) -> u32 {
        self.choice.max_blocks
    }

    pub fn len(&self) -> usize {
        self.gpus.len()
    }

    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty()
    }

    pub fn gpu(&self, g: usize) -> &GpuCtx {
        &self.gpus[g]
    }

    /// GPU g's own stream (for callers without streams of their own, as the bench).
    pub fn stream(&self, g: usize) -> Stream {
        self.gpus[g].stream
    }

    pub fn synchronize(&self) -> Result<()> {
        self.gpus.iter().try_for_each(|g| g.synchronize())
    }

    /// Enqueues one collective, rank g's call `calls[g]` (buffers and stream of GPU g), and
    /// returns at once, with NCCL's buffer conventions (see `plan::spec`). Supported:
    /// all_reduce, reduce_scatter, all_gather, broadcast, reduce, sendrecv (out of place).
    /// Under stream capture the calls become graph nodes, which replay correctly (the call
    /// counter lives on the GPU).
    ///
    /// # Safety
    /// Each call's buffers are device memory of its GPU, of the size the collective implies,
    /// valid until its stream passes this call; its stream a live stream of that GPU.
    pub unsafe fn collective(&self, calls: &[Call]) -> Result<Launch> {
        let n = self.gpus.len();
        let Some(a) = calls.first().map(|c| c.args) else {
            return Err(Error::invalid("a collective with no calls"));
        };
        if calls.len() != n || a.nranks != n {
            return Err(Error::invalid(format!(
                "{}: {} calls of {} ranks for {n} GPUs",
                a.coll.name(),
                calls.len(),
                a.nranks
            )));
        }
        let ins: Vec<u64> = calls.iter().map(|c| c.send).collect();
        let outs: Vec<u64> = calls.iter().map(|c| c.recv).collect();
        let syncs: Vec<u64> = self.gpus.iter().map(|g| g.sync.ptr).collect();
        let k = choose(&a, &self.choice);
        if let Kernel::Bulk { .. } = k {
            // A bad argument launches nothing: what `spec` refuses (the collective, the root,
            // an in-place sendrecv) is the same for every GPU, so GPU 0's part checks it.
            spec(a.coll, 0, &ins, &outs, a.count, a.dtype, a.root)?;
        }
        let peers = Peers {
            ins: &ins,
            outs: &outs,
            syncs: &syncs,
        };
        let _t = self.turn.lock();
        let mut launched = None;
        for (g, gpu) in self.gpus.iter().enumerate() {
            // SAFETY: peer access is enabled between every pair, so GPU g addresses every
            // buffer and sync area; the caller vouches for the buffers and streams.
            let r = unsafe {
                self.orders[g].lock().run(gpu, calls[g].stream, || {
                    enqueue(
                        gpu,
                        stream_of(calls[g].stream),
                        g,
                        &a,
                        k,
                        &peers,
                        self.timeout_ns,
                    )
                })
            };
            match r {
                Ok(l) => launched = Some(l),
                Err(e) => {
                    // Kernels of this call on earlier GPUs' streams wait for peers that will
                    // never come: stop them, so no stream waits forever. A kernel of one
                    // launch that failed on GPU 0 launched nothing; the copy paths launch
                    // several steps, so their first GPU may have a barrier waiting.
                    if g > 0 || k.steps() > 1 {
                        self.abort();
                    }
                    return Err(e);
                }
            }
        }
        launched.ok_or_else(|| Error::invalid("no GPUs"))
    }

    /// A message from rank `src` (its send `s`, to `s.peer`) into the receive `r` of rank
    /// `s.peer`: the sender's stream marks the data ready, the receiver's stream waits for
    /// that, copies and marks it copied, and the sender's stream waits for the copy (so the
    /// send buffer is not reused early). The marks are one-thread kernels counting in the
    /// GPUs' sync areas (`railcc_cuda::launch::p2p_step`, as between processes), not events:
    /// each stream can then be captured into a CUDA graph of its own (nccl-tests `-G`), which
    /// an event recorded in one capture and waited on in another forbids, and the counts
    /// live on the GPU, so replays pair up. The counts pair the n-th send of a (sender,
    /// receiver) pair with the n-th receive in the order the GPUs run them: each side's
    /// messages of one pair on one stream, as libnccl's callers issue them (two streams per
    /// side could pair crosswise). The caller has paired them (libnccl's clique refuses sizes
    /// that differ).
    ///
    /// # Safety
    /// Both buffers are their GPU's device memory of `s.bytes`, each stream a live stream of
    /// its rank's GPU (or null), valid until the streams pass the copy.
    pub unsafe fn copy(&self, src: usize, s: &P2pOp, r: &P2pOp) -> Result<()> {
        let dst = s.peer;
        let (Some(gs), Some(gr)) = (self.gpus.get(src), self.gpus.get(dst)) else {
            return Err(Error::invalid(format!(
                "send/recv: rank {src} or {dst} out of range for {} ranks",
                self.gpus.len()
            )));
        };
        if s.bytes == 0 {
            return Ok(());
        }
        let (ss, rs) = (stream_of(s.stream), stream_of(r.stream));
        let (areas_s, areas_r) = ((gs.sync.ptr, gr.sync.ptr), (gr.sync.ptr, gs.sync.ptr));
        let _t = self.turn.lock();
        // SAFETY: the streams are the callers' streams of each GPU; peer access between the
        // GPUs is enabled (new), so the steps reach the peer's area and the receiver's copy
        // reads the sender's memory; both ranges are the callers' buffers of `bytes`; the
        // areas live as long as the GPUs.
        unsafe {
            gs.bind()?;
            p2p_step(
                gs,
                ss,
                (P2pStep::Ready, 0),
                areas_s,
                (src, dst),
                self.timeout_ns,
            )?;
            gr.bind()?;
            p2p_step(
                gr,
                rs,
                (P2pStep::WaitReady, 0),
                areas_r,
                (dst, src),
                self.timeout_ns,
            )?;
            copy_async(
                r.ptr,
                s.ptr,
                s.bytes,
                rs,
                "cuMemcpyAsync (send/recv between GPUs)",
            )?;
            p2p_step(
                gr,
                rs,
                (P2pStep::Copied, 0),
                areas_r,
                (dst, src),
                self.timeout_ns,
            )?;
            gs.bind()?;
            p2p_step(
                gs,
                ss,
                (P2pStep::WaitCopied, 0),
                areas_s,
                (src, dst),
                self.timeout_ns,
            )
        }
    }
}
impl MultiGpu {
    /// Whether a group's sends and receives go as batch kernels (`RAILCC_GPU_P2P_BATCH`).
    pub fn p2p_batch(&self) -> bool {
        self.p2p_batch
    }

    /// Whether a batch goes in one launch where it fits (`RAILCC_GPU_P2P_BATCH=2`).
    pub fn p2p_fused(&self) -> bool {
        self.p2p_fused
    }

    /// Whether GPU g's `stream` is being captured into a CUDA graph.
    ///
    /// # Safety
    /// `stream` a live stream of GPU `g`.
    pub unsafe fn capturing(&self, g: usize, stream: usize) -> Result<bool> {
        let (gpu, _) = self.batch_gpu(g)?;
        // SAFETY: the caller's stream of this GPU.
        unsafe { is_capturing(gpu, stream_of(stream)) }
    }

    /// GPU g's whole batch on `stream` in one launch (`p2p_many::fused`): `ready[p]` sends to
    /// each rank p marked, `msgs` received, then every rank p with `copied[p] != 0` waited for.
    ///
    /// # Safety
    /// As for [`MultiGpu::recv_many`].
    pub unsafe fn fused(
        &self,
        g: usize,
        stream: usize,
        msgs: &[railcc_cuda::p2p_many::RecvMsg],
        (ready, copied): (&[u32], &[u32]),
    ) -> Result<u32> {
        // SAFETY: as in recv_many.
        unsafe {
            self.in_order(g, stream, |gpu, areas| {
                railcc_cuda::p2p_many::fused(
                    gpu,
                    stream_of(stream),
                    (areas[g], areas),
                    g,
                    msgs,
                    (ready, copied),
                    (&[], 0, false), // nothing staged: a peer reads the sender's buffer
                    (self.choice.max_blocks, self.p2p_min_chunk),
                    self.timeout_ns,
                )
            })
        }
    }

    /// Runs `launch` (one batch kernel on GPU g's `stream`, given the GPU and every GPU's
    /// area) in the GPU's kernel order, this thread's turn held: two at once on two streams
    /// would share the area's count of finished blocks.
    ///
    /// # Safety
    /// `stream` a live stream of GPU `g`; `launch` as safe as the kernel it enqueues.
    unsafe fn in_order<T>(
        &self,
        g: usize,
        stream: usize,
        launch: impl FnOnce(&GpuCtx, &[u64]) -> Result<T>,
    ) -> Result<T> {
        let (gpu, areas) = self.batch_gpu(g)?;
        let _t = self.turn.lock();
        // SAFETY: the caller's stream of this GPU.
        unsafe {
            self.orders[g]
                .lock()
                .run(gpu, stream, || launch(gpu, &areas))
        }
    }

    /// Makes GPU `g`'s stream `waiter` wait for what its stream `on` has queued so far.
    ///
    /// # Safety
    /// Both are live streams of GPU `g`.
    pub unsafe fn join(&self, g: usize, waiter: usize, on: usize) -> Result<()> {
        let (gpu, _) = self.batch_gpu(g)?;
        // SAFETY: the caller's streams of this GPU.
        unsafe { stream_waits_for(gpu, stream_of(waiter), gpu, stream_of(on)) }
    }

    fn batch_gpu(&self, g: usize) -> Result<(&GpuCtx, Vec<u64>)> {
        let gpu = self.gpus.get(g).ok_or_else(|| {
            Error::invalid(format!(
                "send/recv: rank {g} out of range for {} ranks",
                self.gpus.len()
            ))
        })?;
        Ok((gpu, self.gpus.iter().map(|x| x.sync.ptr).collect()))
    }

    /// Rank `g`'s sends of a group on `stream`, `per_peer[p]` of them to rank p, marked ready
    /// (`railcc_cuda::p2p_many::ready_many`).
    ///
    /// # Safety
    /// `stream` a live stream of GPU `g`, after the sends' data is written.
    pub unsafe fn ready_many(&self, g: usize, stream: usize, per_peer: &[u32]) -> Result<()> {
        let (gpu, areas) = self.batch_gpu(g)?;
        let _t = self.turn.lock();
        // SAFETY: the caller's stream; the sync areas live as long as the GPUs.
        unsafe {
            railcc_cuda::p2p_many::ready_many(
                gpu,
                stream_of(stream),
                (areas[g], &areas),
                g,
                per_peer,
            )
        }
    }

    /// Rank `g`'s receives of a group on `stream`, pulled from the senders' buffers by
    /// thread blocks (at most the communicator's per call), each once its sender marked it.
    ///
    /// # Safety
    /// Every `src` the peer's device memory and every `dst` GPU g's, of `bytes`, live until
    /// the stream passes the copy; `stream` a live stream of GPU g.
    pub unsafe fn recv_many(
        &self,
        g: usize,
        stream: usize,
        msgs: &[railcc_cuda::p2p_many::RecvMsg],
    ) -> Result<u32> {
        // SAFETY: peer access is enabled between every pair, so GPU g reads every sender's
        // buffer; the caller vouches for the buffers and stream.
        unsafe {
            self.in_order(g, stream, |gpu, areas| {
                railcc_cuda::p2p_many::recv_many(
                    gpu,
                    stream_of(stream),
                    (areas[g], areas),
                    g,
                    msgs,
                    (self.choice.max_blocks, self.p2p_min_chunk),
                    self.timeout_ns,
                )
            })
        }
    }

    /// Waits on `stream` until every rank p with `per_peer[p] != 0` has copied rank g's sends.
    ///
    /// # Safety
    /// `stream` a live stream of GPU `g`.
    pub unsafe fn wait_copied_many(&self, g: usize, stream: usize, per_peer: &[u32]) -> Result<()> {
        let (gpu, areas) = self.batch_gpu(g)?;
        let _t = self.turn.lock();
        // SAFETY: as in ready_many.
        unsafe {
            railcc_cuda::p2p_many::wait_copied_many(
                gpu,
                stream_of(stream),
                areas[g],
                per_peer,
                self.timeout_ns,
                0,
            )
        }
    }
}

impl Drop for MultiGpu {
    fn drop(&mut self) {
        // The markers go before their GPUs' contexts (the `gpus` field drops first), once the
        // last call's kernels are done with the buffers freed after, up to the timeout for
        // all GPUs together (as `ProcGpu`'s close; the grace alone once kernels were
        // stopped); kernels still running then are stopped, and if any outlive that, every
        // GPU's memory stays.
        let stopped = self.gpus.iter().any(|g| g.kernels_stopped());
        let timeout = match stopped {
            true => crate::order::STOP_GRACE,
            false => Duration::from_nanos(self.timeout_ns),
        };
        let deadline = Instant::now().checked_add(timeout);
        let mut keep = vec![false; self.gpus.len()];
        for ((gpu, o), keep) in self.gpus.iter().zip(&self.orders).zip(&mut keep) {
            if gpu.bind().is_ok() {
                let mut o = o.lock();
                let left =
                    deadline.map_or(timeout, |d| d.saturating_duration_since(Instant::now()));
                *keep = !o.drained(gpu, left);
                if *keep {
                    tracing::warn!(
                        "GPU {}: the last call's kernels had not finished {timeout:?} after the close: every GPU's memory stays",
                        gpu.ordinal
                    );
                }
                o.release();
            }
        }
        // Every GPU's kernels use every GPU's sync area: one kept keeps them all.
        if keep.contains(&true) {
            std::mem::forget(std::mem::take(&mut self.gpus));
        }
    }
}
