//! Collectives that return before their peers arrive (`RAILCC_GPU_DEFER=1`), as NCCL's do.
//!
//! Why: a collective of one process per GPU needs its peers' buffers mapped before its kernel
//! can be launched, and without this the caller's thread waits on the host until every peer
//! has published them. A rank whose Python runs late then holds every other rank's CPU
//! thread: FSDP's next matrix products are enqueued late, and the GPU idles (the sixteenth
//! session's trace: a 2 x 2 HSDP step's NVLink calls waited 0.6-0.75 ms at p90, up to 138 ms).
//!
//! How: the caller publishes its entry, marks its stream's work so far (the inputs are
//! ready), enqueues a wait for this call's word on its stream, and returns. A launcher
//! thread reads the peers' entries, maps their buffers, makes its own stream wait for the
//! caller's mark, launches the kernel there, and then writes the call's number into the word.
//! The caller's stream goes on only after the kernel, as if it had run there; the
//! communicator's kernel order (`order.rs`) sees the call on the caller's stream. Calls meet
//! their peers in order: once one is deferred, later ones are too until the launcher has
//! caught up (the table's slots are freed in call order, `ShmTable::finished`).
//!
//! On a failure the launcher breaks the communicator (as `ProcGpu::abort_with`) and releases
//! every waiting stream: the calls' outputs are undefined, and the error comes back from the
//! next call and from `ncclCommGetAsyncError`, as NCCL's asynchronous errors do.

use super::{meet_peers, Share};
use crate::plan::{enqueue, Kernel, Peers};
use crate::table::{ShmTable, CALL_DEPTH};
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use parking_lot::Mutex;
use railcc_core::call::CollArgs;
use railcc_core::{Error, ErrorKind, Result};
use railcc_cuda::gpu::{copy_async, create_stream, destroy_stream, GpuCtx, Marker, Stream};
use railcc_cuda::hostsync::Flags;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the launcher polls for the next call before it sleeps: a call enqueued within
/// it is taken without a futex wake.
const SPIN: Duration = Duration::from_micros(200);

/// What the word holds once the launcher failed: far past any waiting call (the waits
/// compare cyclically, and at most CALL_DEPTH calls wait at once).
const RELEASE_AHEAD: u32 = 1 << 30;

/// One call for the launcher.
struct Job {
    call: u64,
    args: CollArgs,
    shape: [u64; 5],
    /// This rank's send and receive buffers (or its bounce buffer's parts).
    bufs: (u64, u64),
    kernel: Kernel,
    /// The caller's stream's work before the call (the inputs are ready after it).
    inputs: Marker,
    deadline: Instant,
}

/// What the launcher thread works with: the communicator's shared parts.
pub(super) struct Parts {
    pub gpu: Arc<GpuCtx>,
    pub table: Arc<ShmTable>,
    pub share: Arc<Mutex<Share>>,
    pub broken: Arc<Mutex<Option<Error>>>,
    pub rank: usize,
    pub nranks: usize,
    /// This rank as the communicator numbers it, for errors.
    pub own_name: usize,
    pub syncs: Vec<u64>,
    pub timeout_ns: u64,
}

/// The launcher of one communicator's deferred calls.
pub(super) struct Deferred {
    tx: Option<Sender<Job>>,
    /// Calls handed to the launcher whose peers it has not met yet.
    pending: Arc<AtomicU64>,
    /// Word 0: the last call whose kernel the launcher's stream has passed.
    done: Arc<Flags>,
    /// The launcher's stream (as an address: a stream handle is not `Send`).
    stream: usize,
    thread: Option<JoinHandle<()>>,
}

impl Deferred {
    /// Starts the launcher (its stream and word made in `parts.gpu`'s context).
    pub fn start(parts: Parts) -> Result<Deferred> {
        let stream = create_stream(&parts.gpu)?;
        let done = match Flags::new_current(1) {
            Ok(f) => Arc::new(f),
            Err(e) => {
                // SAFETY: made above, nothing enqueued on it.
                let _ = unsafe { destroy_stream(&parts.gpu, stream) };
                return Err(e);
            }
        };
        let (tx, rx) = crossbeam_channel::unbounded();
        let pending = Arc::new(AtomicU64::new(0));
        let launcher = Launcher {
            parts,
            pending: pending.clone(),
            done: done.clone(),
            stream: stream as usize,
        };
        let thread = std::thread::Builder::new()
            .name("railcc-gpu-defer".into())
            .spawn(move || launcher.run(&rx))
            .map_err(|e| Error::io("starting the GPU call launcher", &e))?;
        Ok(Deferred {
            tx: Some(tx),
            pending,
            done,
            stream: stream as usize,
            thread: Some(thread),
        })
    }

    /// Whether the launcher has met the peers of every call handed to it.
    pub fn idle(&self) -> bool {
        self.pending.load(Ordering::Acquire) == 0
    }

    /// Waits (to the deadline) until the launcher is [`Deferred::idle`]: before a call meets
    /// its peers on the caller's thread (calls meet their peers in order).
    pub fn wait_idle(&self, deadline: Instant, broken: &dyn Fn() -> Option<Error>) -> Result<()> {
        while !self.idle() {
            if let Some(e) = broken() {
                return Err(e);
            }
            if Instant::now() > deadline {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    "the GPU call launcher did not meet its calls' peers in time",
                )
                .transport(crate::NAME));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        Ok(())
    }

    /// Enqueues call `call`'s side on the caller's `stream` (its inputs marked, a wait for its
    /// kernel, then `copy_out` of the bounce buffer if any) and hands the call to the
    /// launcher. Run inside the communicator's kernel order, on a stream not being captured.
    ///
    /// # Safety
    /// `stream` a live stream of this GPU's context, which is current; the buffers as for
    /// `ProcGpu::collective`, live until the stream passes the call.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn submit(
        &self,
        stream: Stream,
        call: u64,
        args: CollArgs,
        shape: [u64; 5],
        bufs: (u64, u64),
        kernel: Kernel,
        copy_out: Option<(u64, u64, usize)>,
        deadline: Instant,
    ) -> Result<()> {
        let inputs = Marker::in_current()?;
        // SAFETY: the caller's stream; the marker and word are of this context.
        unsafe {
            inputs.record(stream)?;
            self.done.wait_geq_on(stream, 0, call as u32)?;
            if let Some((dst, src, len)) = copy_out {
                copy_async(
                    dst,
                    src,
                    len,
                    stream,
                    "cuMemcpyAsync (out of the bounce buffer)",
                )?;
            }
        }
        let tx = self.tx.as_ref().ok_or_else(|| {
            Error::new(ErrorKind::Aborted, "the GPU call launcher has stopped")
                .transport(crate::NAME)
        })?;
        self.pending.fetch_add(1, Ordering::AcqRel);
        let job = Job {
            call,
            args,
            shape,
            bufs,
            kernel,
            inputs,
            deadline,
        };
        tx.send(job).map_err(|_| {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            // The wait is on the stream already: release it (the communicator breaks).
            self.done
                .store(0, (call as u32).wrapping_add(RELEASE_AHEAD));
            Error::new(ErrorKind::Aborted, "the GPU call launcher has stopped")
                .transport(crate::NAME)
        })
    }

    /// Stops the launcher once it has launched (or failed) every call handed to it: a
    /// close's first step (the calls' peers are waited for to their deadlines, as the
    /// caller's thread would have; an aborted communicator fails them at once).
    pub fn stop(&mut self) {
        self.tx.take();
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
    }

    /// Frees the stream and the word, once the GPU has passed every call (`settled`), or
    /// leaves them allocated.
    pub fn release(mut self, gpu: &GpuCtx, settled: bool) {
        self.stop();
        if settled {
            // SAFETY: made by create_stream on this GPU; the launcher, its one user, has
            // stopped.
            let _ = unsafe { destroy_stream(gpu, self.stream as Stream) };
        } else {
            std::mem::forget(self.done.clone());
        }
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Launcher {
    parts: Parts,
    pending: Arc<AtomicU64>,
    done: Arc<Flags>,
    stream: usize,
}

impl Launcher {
    fn run(self, rx: &Receiver<Job>) {
        if let Err(e) = self.parts.gpu.bind() {
            self.fail(e, 0);
        }
        while let Some(job) = next(rx) {
            let call = job.call;
            tracing::debug!("rank {}: launcher took call {call}", self.parts.rank);
            if let Err(e) = self.launch(job) {
                tracing::debug!("rank {}: launcher failed call {call}: {e}", self.parts.rank);
                self.fail(e, call);
            }
            self.pending.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Meets `job`'s peers and launches its kernel on the launcher's stream, after the
    /// caller's inputs; then marks the call done there.
    fn launch(&self, job: Job) -> Result<()> {
        let p = &self.parts;
        if let Some(e) = p.broken.lock().clone() {
            return Err(e);
        }
        let broken = || p.broken.lock().clone();
        let (ins, outs) = meet_peers(
            &p.table,
            &p.share,
            (p.rank, p.nranks),
            job.call,
            job.shape,
            job.bufs,
            job.deadline,
            &broken,
        )?;
        p.table.finished(job.call, p.rank);
        tracing::debug!("rank {}: launcher met call {}'s peers", p.rank, job.call);
        let peers = Peers {
            ins: &ins,
            outs: &outs,
            syncs: &p.syncs,
        };
        let stream = self.stream as Stream;
        // SAFETY: our stream of this context (bound in run); the peers' buffers are mapped
        // (meet_peers) and the caller vouched for its own until its stream passes the call,
        // which waits for the word written after the kernel.
        unsafe {
            job.inputs.wait(stream)?;
            enqueue(
                &p.gpu,
                stream,
                p.rank,
                &job.args,
                job.kernel,
                &peers,
                p.timeout_ns,
            )?;
            self.done.write_on(stream, 0, job.call as u32)?;
        }
        tracing::debug!("rank {}: launcher enqueued call {}", p.rank, job.call);
        Ok(())
    }

    /// Breaks the communicator with `why` (the host's other ranks hear it) and releases every
    /// stream waiting for a call up to CALL_DEPTH past `call`.
    fn fail(&self, why: Error, call: u64) {
        let p = &self.parts;
        let first = p
            .broken
            .lock()
            .get_or_insert_with(|| why.rank(p.own_name))
            .clone();
        p.gpu.abort_kernels();
        p.table.report_broken(p.rank, &first.to_string());
        let ahead = (call as u32).wrapping_add(RELEASE_AHEAD);
        self.done.store(0, ahead);
        // After the stream's earlier writes too, which would otherwise lower it again.
        // SAFETY: our stream of this context.
        let _ = unsafe { self.done.write_on(self.stream as Stream, 0, ahead) };
        const _: () = assert!(CALL_DEPTH < RELEASE_AHEAD as u64);
    }
}

/// The next job: polled for [`SPIN`], then waited for; None once the sender is gone.
fn next(rx: &Receiver<Job>) -> Option<Job> {
    let until = Instant::now() + SPIN;
    loop {
        match rx.try_recv() {
            Ok(j) => return Some(j),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) if Instant::now() < until => std::hint::spin_loop(),
            Err(TryRecvError::Empty) => return rx.recv().ok(),
        }
    }
}
