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

use super::late::LateSlots;
use super::{copy_out_of_bounce, meet_peers, read_peers, stop_gpu_work, Share};
use crate::plan::{enqueue, spec, Kernel, Peers};
use crate::table::{wait_until, ShmTable, CALL_DEPTH};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use parking_lot::Mutex;
use railcc_core::call::CollArgs;
use railcc_core::{Error, ErrorKind, Result};
use railcc_cuda::gpu::{create_stream, destroy_stream, GpuCtx, Marker, Stream};
use railcc_cuda::hostsync::Flags;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the launcher polls for the next call before it sleeps: a call enqueued within
/// it is taken without a futex wake.
const SPIN: Duration = Duration::from_micros(200);
/// How often an idle launcher looks for a release to write on its stream.
const IDLE: Duration = Duration::from_millis(20);

/// What the word holds once the launcher failed: far past any waiting call (the waits
/// compare cyclically, and at most CALL_DEPTH calls wait at once).
const RELEASE_AHEAD: u32 = 1 << 30;
const _: () = assert!(CALL_DEPTH < RELEASE_AHEAD as u64);

/// The error of a call handed to a launcher that has stopped.
fn stopped() -> Error {
    Error::new(ErrorKind::Aborted, "the GPU call launcher has stopped").transport(crate::NAME)
}

/// One call for the launcher.
struct Job {
    call: u64,
    shape: [u64; 5],
    deadline: Instant,
    work: Work,
}

/// What the launcher does with a call once its peers' entries are there.
enum Work {
    /// Only checks them against its shape: a call launched without a meeting (`stage.rs`).
    Check,
    /// Meets the peers and launches the kernel (`RAILCC_GPU_DEFER`).
    Launch(LaunchJob),
    /// Meets the peers and writes the kernel's arguments into the call's slot, where its
    /// kernel, already enqueued, finds them (`late.rs`).
    Late(LateJob),
}

/// A call whose kernel waits for its arguments (`late.rs`).
pub(super) struct LateJob {
    pub args: CollArgs,
    /// This rank's send and receive buffers (or its bounce buffer's parts).
    pub bufs: (u64, u64),
}

struct LaunchJob {
    args: CollArgs,
    /// This rank's send and receive buffers (or its bounce buffer's parts).
    bufs: (u64, u64),
    kernel: Kernel,
    /// The caller's stream's work before the call (the inputs are ready after it).
    inputs: Marker,
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
    /// Calls are deferred and launched here (`RAILCC_GPU_DEFER`), or their kernels wait for
    /// arguments written here (`RAILCC_GPU_LATE_ARGS`), not only checked (the fixed stage's
    /// calls): only then is the stack limit raised at start.
    pub launches: bool,
    /// The slots of late arguments (`RAILCC_GPU_LATE_ARGS`).
    pub late: Option<Arc<LateSlots>>,
}

/// The word the callers' streams wait on, and how to let them all go once the communicator
/// breaks (whoever sees the break first: the launcher, the peer watcher, an abort).
pub(super) struct Release {
    /// Word 0: the last call whose kernel the launcher's stream has passed, or, for late
    /// calls, the last one the launcher is done with (`Deferred::gate`).
    done: Arc<Flags>,
    /// The last call handed to the launcher.
    last: AtomicU64,
    released: AtomicBool,
    /// Whether the launcher is on a job, since when ([`Release::stuck`]).
    busy: Busy,
}

/// Since when the launcher has been on its job (`None`: between jobs), and how long a job
/// may take before the launcher counts as stuck (`None`: never).
struct Busy {
    since: Mutex<Option<Instant>>,
    after: Option<Duration>,
}

impl Busy {
    fn new(after: Option<Duration>) -> Busy {
        Busy {
            since: Mutex::new(None),
            after,
        }
    }

    fn set(&self, on: bool) {
        *self.since.lock() = on.then(Instant::now);
    }

    /// How long the current job has taken, once past `after`.
    fn stuck(&self) -> Option<Duration> {
        let on = (*self.since.lock())?.elapsed();
        (on > self.after?).then_some(on)
    }
}

impl Release {
    /// Lets every stream waiting for a call handed to the launcher go on (their outputs are
    /// undefined: the communicator is broken). The launcher writes the word once more on its
    /// stream too, after its earlier writes, which would otherwise lower it again.
    pub fn all(&self) {
        self.released.store(true, Ordering::SeqCst);
        // As in `pass`: the flag before the word, for `pass`'s load to see it.
        std::sync::atomic::fence(Ordering::SeqCst);
        self.store_ahead();
    }

    fn ahead(&self) -> u32 {
        (self.last.load(Ordering::Acquire) as u32).wrapping_add(RELEASE_AHEAD)
    }

    fn store_ahead(&self) {
        self.done.store(0, self.ahead());
    }

    /// How long the launcher has been on its job, where that is longer than any job can
    /// take unless the launcher is stuck (in a driver call): its peers' wait ends at the
    /// call's deadline and its wait for a slot's acknowledgement one timeout later, so twice
    /// the communicator's timeout and a second. Never without a timeout. The peer watcher
    /// breaks the communicator then, which lets every waiting stream go: a stream waiting
    /// for late arguments (`Deferred::gate`) has no deadline of its own.
    pub fn stuck(&self) -> Option<Duration> {
        self.busy.stuck()
    }

    /// The launcher is done with late call `call` (its slot filled or failed): a stream
    /// waiting for it (`Deferred::gate`) goes on. Calls come in order, so the word only
    /// grows; one released stays ahead of every call.
    fn pass(&self, call: u64) {
        self.done.store(0, call as u32);
        // The store before the load: else a release between them could be lowered again.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.released.load(Ordering::SeqCst) {
            self.store_ahead();
        }
    }
}

/// The launcher of one communicator's deferred calls.
pub(super) struct Deferred {
    tx: Option<Sender<Job>>,
    /// Calls handed to the launcher whose peers it has not met yet.
    pending: Arc<AtomicU64>,
    release: Arc<Release>,
    /// The launcher's stream (as an address: a stream handle is not `Send`).
    stream: usize,
    thread: Option<JoinHandle<()>>,
    /// How long a close waits for the launcher (the communicator's timeout).
    timeout: Duration,
    /// The launcher did not stop within `timeout`: what it uses stays allocated.
    stuck: bool,
}

impl Deferred {
    /// Starts the launcher (its stream and word made in `parts.gpu`'s context).
    pub fn start(parts: Parts) -> Result<Deferred> {
        if parts.launches {
            let (local, limit) = parts.gpu.reserve_stack()?;
            tracing::debug!(
                "rank {}: the kernels use at most {local} local bytes a thread; the stack limit was {limit}",
                parts.rank
            );
        }
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
        let timeout = Duration::from_nanos(parts.timeout_ns);
        let release = Arc::new(Release {
            done,
            last: AtomicU64::new(0),
            released: AtomicBool::new(false),
            busy: Busy::new(
                timeout
                    .checked_mul(2)
                    .and_then(|t| t.checked_add(Duration::from_secs(1))),
            ),
        });
        let launcher = Launcher {
            parts,
            pending: pending.clone(),
            release: release.clone(),
            stream: stream as usize,
            stream_released: false,
        };
        let thread = std::thread::Builder::new()
            .name("railcc-gpu-defer".into())
            .spawn(move || launcher.run(&rx))
            .map_err(|e| Error::io("starting the GPU call launcher", &e))?;
        Ok(Deferred {
            tx: Some(tx),
            pending,
            release,
            stream: stream as usize,
            thread: Some(thread),
            timeout,
            stuck: false,
        })
    }

    /// What lets the waiting streams go when the communicator breaks.
    pub fn release(&self) -> &Arc<Release> {
        &self.release
    }

    /// Whether the launcher has met the peers of every call handed to it.
    pub fn idle(&self) -> bool {
        self.pending.load(Ordering::Acquire) == 0
    }

    /// Waits (to the deadline) until the launcher is [`Deferred::idle`]: before a call meets
    /// its peers on the caller's thread (calls meet their peers in order).
    pub fn wait_idle(&self, deadline: Instant, broken: &dyn Fn() -> Option<Error>) -> Result<()> {
        wait_until(deadline, broken, || self.idle()).map_err(|e| {
            e.unwrap_or_else(|| {
                Error::new(
                    ErrorKind::Timeout,
                    "the GPU call launcher did not meet its calls' peers in time",
                )
                .transport(crate::NAME)
            })
        })
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
        if self.tx.is_none() {
            return Err(stopped());
        }
        let inputs = Marker::in_current()?;
        // SAFETY: the caller's stream; the marker is of this context.
        unsafe { inputs.record(stream) }?;
        // From here the stream may wait for this call: any failure releases it.
        self.release.last.fetch_max(call, Ordering::AcqRel);
        // SAFETY: the caller's stream; the word is of this context; the bounce buffer and
        // the receive buffer hold `len` bytes (the caller's contract).
        let queued = unsafe {
            self.release
                .done
                .wait_geq_on(stream, 0, call as u32)
                .and_then(|()| copy_out_of_bounce(copy_out, stream))
        };
        if let Err(e) = queued {
            self.release.all();
            return Err(e);
        }
        let launch = LaunchJob {
            args,
            bufs,
            kernel,
            inputs,
        };
        self.hand(call, shape, deadline, Work::Launch(launch))
            .inspect_err(|_| {
                // The wait is on the stream already: release it (the communicator breaks).
                self.release.all();
            })
    }

    /// Hands call `call`, launched through the fixed stage, to the launcher, which reads its
    /// peers' entries in call order and breaks the communicator if one differs from `shape`
    /// (the call's error then comes back asynchronously, as NCCL's do).
    pub fn check(&self, call: u64, shape: [u64; 5], deadline: Instant) -> Result<()> {
        self.hand(call, shape, deadline, Work::Check)
    }

    /// Hands call `call`, whose kernel is enqueued and waits for its arguments in its slot
    /// (`late.rs`), to the launcher, which meets its peers in call order and writes them.
    pub fn late(&self, call: u64, shape: [u64; 5], deadline: Instant, job: LateJob) -> Result<()> {
        self.release.last.fetch_max(call, Ordering::AcqRel);
        self.hand(call, shape, deadline, Work::Late(job))
    }

    /// Enqueues on `stream` a wait until the launcher is done with late call `call`, handed
    /// to it before (`RAILCC_GPU_LATE_GATE`): the stream, not the kernel's blocks on their
    /// SMs, waits for the peers. The word is the deferred calls' (a communicator has one
    /// kind or the other): the launcher passes every late call it takes, filled or failed,
    /// and any break lets every waiting stream go (`Release::all`), so the wait ends. (A wait
    /// on the call's slot would not: a broken communicator fails later calls at once, and
    /// one may take the slot before the stream saw the earlier call's token.)
    ///
    /// # Safety
    /// `stream` a live stream of this communicator's context.
    pub unsafe fn gate(&self, stream: Stream, call: u64) -> Result<()> {
        // SAFETY: the caller's stream; the word is of this context and lives as long as the
        // launcher, which a close stops only after the streams passed their calls.
        unsafe { self.release.done.wait_geq_on(stream, 0, call as u32) }
    }

    /// Counts call `call` as pending and sends it to the launcher.
    fn hand(&self, call: u64, shape: [u64; 5], deadline: Instant, work: Work) -> Result<()> {
        let tx = self.tx.as_ref().ok_or_else(stopped)?;
        self.pending.fetch_add(1, Ordering::AcqRel);
        let job = Job {
            call,
            shape,
            deadline,
            work,
        };
        tx.send(job).map_err(|_| {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            stopped()
        })
    }

    /// Stops the launcher once it has launched (or failed) every call handed to it: a
    /// close's first step (the calls' peers are waited for to their deadlines, as the
    /// caller's thread would have; an aborted communicator fails them at once).
    /// If it is still busy after the communicator's timeout (stuck in a driver call), it is
    /// left running and what it uses stays allocated.
    pub fn stop(&mut self) {
        self.tx.take();
        let Some(h) = self.thread.take() else { return };
        let deadline = Instant::now().checked_add(self.timeout);
        while !h.is_finished() {
            if deadline.is_some_and(|d| Instant::now() > d) {
                tracing::warn!(
                    "the GPU call launcher did not stop within {:?}: left running, with what it uses",
                    self.timeout
                );
                self.release.all();
                self.stuck = true;
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = h.join();
    }

    /// Frees the stream and the word, once the GPU has passed every call (`settled`), or
    /// leaves them allocated.
    pub fn free(mut self, gpu: &GpuCtx, settled: bool) {
        self.stop();
        if settled && !self.stuck {
            // SAFETY: made by create_stream on this GPU; the launcher, its one user, has
            // stopped.
            let _ = unsafe { destroy_stream(gpu, self.stream as Stream) };
        } else {
            std::mem::forget(self.release.clone());
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
    release: Arc<Release>,
    stream: usize,
    /// Whether the released word was written on the launcher's stream too.
    stream_released: bool,
}

impl Launcher {
    fn run(mut self, rx: &Receiver<Job>) {
        // A launcher that panics lets every waiting stream go (as a break does), so no
        // stream waits on a word nobody will raise.
        let _on_panic = ReleaseOnPanic(self.release.clone());
        if let Err(e) = self.parts.gpu.bind() {
            self.fail(e);
        }
        loop {
            let job = match next(rx) {
                Next::Job(j) => j,
                Next::Idle => {
                    self.release_on_stream();
                    continue;
                }
                Next::Gone => break,
            };
            let call = job.call;
            tracing::debug!("rank {}: launcher took call {call}", self.parts.rank);
            self.release.busy.set(true);
            let r = match job.work {
                Work::Late(l) => self.late(call, job.shape, job.deadline, l),
                work => self.launch(Job { work, ..job }),
            };
            if let Err(e) = r {
                tracing::debug!("rank {}: launcher failed call {call}: {e}", self.parts.rank);
                self.fail(e);
            }
            self.release.busy.set(false);
            self.release_on_stream();
            self.pending.fetch_sub(1, Ordering::AcqRel);
        }
        self.release_on_stream();
    }

    /// Once released (`Release::all`), writes the word on this stream after its earlier
    /// writes, once, and stores it again.
    fn release_on_stream(&mut self) {
        if self.stream_released || !self.release.released.load(Ordering::Acquire) {
            return;
        }
        self.stream_released = true;
        let ahead = self.release.ahead();
        // SAFETY: our stream of this context.
        let _ = unsafe { self.release.done.write_on(self.stream as Stream, 0, ahead) };
        self.release.store_ahead();
    }

    /// Meets `job`'s peers and launches its kernel on the launcher's stream, after the
    /// caller's inputs; then marks the call done there.
    fn launch(&self, job: Job) -> Result<()> {
        let p = &self.parts;
        if let Some(e) = p.broken.lock().clone() {
            return Err(e);
        }
        let broken = || p.broken.lock().clone();
        let Work::Launch(l) = job.work else {
            read_peers(
                &p.table,
                (p.rank, p.nranks),
                job.call,
                job.shape,
                job.deadline,
                &broken,
            )?;
            p.table.finished(job.call, p.rank);
            tracing::debug!("rank {}: launcher checked call {}", p.rank, job.call);
            return Ok(());
        };
        let (ins, outs) = meet_peers(
            &p.table,
            &p.share,
            (p.rank, p.nranks),
            job.call,
            job.shape,
            l.bufs,
            false,
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
            l.inputs.wait(stream)?;
            enqueue(
                &p.gpu,
                stream,
                p.rank,
                &l.args,
                l.kernel,
                &peers,
                p.timeout_ns,
            )?;
            self.release.done.write_on(stream, 0, job.call as u32)?;
        }
        tracing::debug!("rank {}: launcher enqueued call {}", p.rank, job.call);
        Ok(())
    }

    /// Meets a late call's peers and writes its kernel's arguments into its slot; on a
    /// failure, marks the slot failed (the communicator breaks: `run` calls `fail`).
    fn late(&self, call: u64, shape: [u64; 5], deadline: Instant, l: LateJob) -> Result<()> {
        let p = &self.parts;
        let Some(slots) = &p.late else {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "a call with late arguments on a communicator without their slots",
            )
            .transport(crate::NAME));
        };
        let broken = || p.broken.lock().clone();
        let met = (|| {
            if let Some(e) = broken() {
                return Err(e);
            }
            let (ins, outs) = meet_peers(
                &p.table,
                &p.share,
                (p.rank, p.nranks),
                call,
                shape,
                l.bufs,
                false,
                deadline,
                &broken,
            )?;
            p.table.finished(call, p.rank);
            let a = &l.args;
            spec(a.coll, p.rank, &ins, &outs, a.count, a.dtype, a.root)
        })();
        let filled = match &met {
            // The wait for the GPU to take the slot's previous call gets the communicator's
            // timeout from now, not what is left of this call's: the GPU may be running
            // up to CALL_DEPTH calls behind the host.
            Ok(s) => {
                let ack_by = Instant::now()
                    .checked_add(Duration::from_nanos(p.timeout_ns))
                    .unwrap_or(deadline);
                slots.fill(call, s, ack_by, &broken)
            }
            Err(_) => Ok(()),
        };
        if met.is_err() || filled.is_err() {
            let _ = slots.fail(call);
        }
        self.release.pass(call);
        met?;
        filled?;
        tracing::debug!("rank {}: launcher wrote call {call}'s arguments", p.rank);
        Ok(())
    }

    /// Breaks the communicator with `why` (the host's other ranks hear it) and releases every
    /// waiting stream.
    /// A communicator already broken is not reported again: an abort (`ProcGpu::abort`, as
    /// NCCL's) does not tell the peers, and the launcher's pending calls failing behind it
    /// must not either.
    fn fail(&self, why: Error) {
        let p = &self.parts;
        let (first, was_broken) = {
            let mut b = p.broken.lock();
            let was = b.is_some();
            (b.get_or_insert_with(|| why.rank(p.own_name)).clone(), was)
        };
        stop_gpu_work(&p.gpu, Some(&self.release));
        if !was_broken {
            p.table.report_broken(p.rank, &first.to_string());
        }
    }
}

struct ReleaseOnPanic(Arc<Release>);

impl Drop for ReleaseOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.all();
        }
    }
}

enum Next {
    Job(Job),
    /// Nothing for a while: a chance to see a release.
    Idle,
    Gone,
}

/// The next job: polled for [`SPIN`], then waited for up to [`IDLE`].
fn next(rx: &Receiver<Job>) -> Next {
    let until = Instant::now() + SPIN;
    loop {
        match rx.try_recv() {
            Ok(j) => return Next::Job(j),
            Err(TryRecvError::Disconnected) => return Next::Gone,
            Err(TryRecvError::Empty) if Instant::now() < until => std::hint::spin_loop(),
            Err(TryRecvError::Empty) => {
                return match rx.recv_timeout(IDLE) {
                    Ok(j) => Next::Job(j),
                    Err(RecvTimeoutError::Timeout) => Next::Idle,
                    Err(RecvTimeoutError::Disconnected) => Next::Gone,
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Busy;
    use std::time::Duration;

    #[test]
    fn a_launcher_counts_as_stuck_only_on_a_job_past_its_limit() {
        let b = Busy::new(Some(Duration::from_millis(20)));
        assert_eq!(b.stuck(), None, "between jobs");
        b.set(true);
        assert_eq!(b.stuck(), None, "a job just taken");
        std::thread::sleep(Duration::from_millis(40));
        let d = b.stuck().expect("40 ms on a job with a 20 ms limit");
        assert!(d >= Duration::from_millis(40), "{d:?}");
        b.set(false);
        assert_eq!(b.stuck(), None, "the job ended");
        let never = Busy::new(None);
        never.set(true);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(never.stuck(), None, "no timeout: never stuck");
    }
}
