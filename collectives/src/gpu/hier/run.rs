//! [`HierGpu`]: runs the hierarchical plans on GPUs. Every step goes on the caller's stream:
//! local steps are the per-process NVLink kernels among the host's ranks, cross steps the
//! stream-ordered network engine among the ranks of this local index, copies are device
//! copies. So a call returns once its steps are enqueued (a local step first waits on the
//! host for the host's other ranks to make the same call, as every per-process call does).

use super::plan::{flat, plan, takes, At, Buf, Layout, Step};
use crate::comm::Communicator;
use crate::gpu::net::{GpuNet, NetOp};
use parking_lot::Mutex;
use railcc_core::call::{Call, CollArgs};
use railcc_core::{Error, ErrorKind, Result};
use railcc_cuda::gpu::{DevBuf, Stream};
use railcc_transport_nvlink::proc::ProcGpu;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Per stream, the scratch the plans use (reduce_scatter and all_gather reorder blocks in
/// it); outgrown buffers are kept until the end, since enqueued work may still use them.
#[derive(Default)]
struct Scratch {
    live: HashMap<usize, DevBuf>,
    retired: Vec<DevBuf>,
}

pub struct HierGpu {
    layout: Layout,
    rank: usize,
    host: usize,
    index: usize,
    /// The ranks of this local index's network engine, one per host in host order.
    group: Vec<usize>,
    local: Arc<ProcGpu>,
    cross: Arc<GpuNet>,
    /// All_reduces and broadcasts of at most this many bytes run whole (`plan`): rank 0's
    /// `RAILCC_GPU_HIER_SMALL_BYTES`, so every rank runs the same steps.
    small_bytes: usize,
    /// All_reduces of fewer bytes than this are not this path's (`takes`): the flat network
    /// engine runs them in one host step (rank 0's `RAILCC_GPU_FLAT_BELOW_BYTES`; 0: none).
    flat_below: usize,
    scratch: Mutex<Scratch>,
    /// Side streams by caller stream (addresses): `side_stream`.
    sides: Mutex<HashMap<usize, usize>>,
    /// The first failure of either part, in the communicator's numbering: what every later
    /// call and `async_error` report, and what the other part is aborted with.
    cause: Arc<Mutex<Option<Error>>>,
    desc: String,
    watcher: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
}

/// Whether every rank succeeded at a step of init; the first failure comes back everywhere
/// (`railcc_core::agree`, over every rank of `parent`).
fn agree<T>(parent: &Communicator, r: Result<T>) -> Result<T> {
    let mut ex = |b: &[u8]| parent.oob_all_gather(b);
    railcc_core::agree::agree(r, &mut ex, &|p| p, |_| Vec::new()).map(|(v, _)| v)
}

impl HierGpu {
    /// The layout of ranks whose host ids are `hosts` (one per rank) when a hierarchy helps:
    /// several hosts, several ranks on each (no more than the NVLink kernels take), the same
    /// number everywhere.
    pub fn layout(hosts: &[Vec<u8>]) -> Option<Layout> {
        // More ranks per host than the NVLink kernels take: the flat network path instead.
        let fits = |l: &Layout| l.local() <= railcc_cuda::kernels::MAX_PEERS;
        Layout::from_host_ids(hosts).filter(|l| l.nhosts() > 1 && l.local() > 1 && fits(l))
    }

    /// Opens the host's NVLink path and this local index's network engine, for this rank's
    /// GPU `ordinal`. Collective over every rank of `parent`, which `layout` describes.
    pub fn new(parent: &Communicator, layout: Layout, ordinal: usize) -> Result<HierGpu> {
        let rank = parent.rank();
        let even = layout.hosts.iter().all(|h| h.len() == layout.local());
        if !even || layout.nranks() != parent.nranks() || layout.local() == 0 {
            return Err(Error::invalid(format!(
                "hierarchical layout {:?} does not cover the communicator's {} ranks evenly",
                layout.hosts,
                parent.nranks()
            ))
            .rank(rank));
        }
        let (host, index) = layout.position(rank).ok_or_else(|| {
            Error::invalid(format!("rank {rank} is not in the hierarchical layout")).rank(rank)
        })?;
        let cfg = parent.config();
        let mates = layout.hosts[host].clone();
        let mut ex = |b: &[u8]| -> Result<Vec<Vec<u8>>> {
            let all = parent.oob_all_gather(b)?;
            // A rank of another host that failed this step fails it here too: every rank
            // then leaves the host-level setup at the same all-gather, and the ones after
            // it (`agree` below) pair up.
            let failed = (all.iter().enumerate())
                .filter(|(r, _)| !mates.contains(r))
                .find_map(|(r, p)| Some((r, railcc_core::agree::failed(p, 0)?)));
            if let Some((r, why)) = failed {
                let e = format!("rank {r} (another host) failed GPU setup: {why}");
                return Err(Error::new(ErrorKind::Io, e).peer(r));
            }
            mates
                .iter()
                .map(|&r| {
                    all.get(r)
                        .cloned()
                        .ok_or_else(|| Error::invalid("bootstrap all-gather too short"))
                })
                .collect()
        };
        let settings = crate::gpu::settings(cfg);
        let local = ProcGpu::new(
            ordinal,
            index,
            layout.local(),
            &settings,
            &mut ex,
            Some(&mates),
        );
        let local = agree(parent, local)
            .map_err(|e| e.rank(rank).op("hierarchical init: the host's GPUs"))?;
        let group: Vec<usize> = layout.hosts.iter().map(|rs| rs[index]).collect();
        let cross = agree(parent, GpuNet::among(parent, ordinal, &group)).map_err(|e| {
            e.rank(rank)
                .op("hierarchical init: the network between hosts")
        })?;
        // Every rank must cut and route a call the same way: rank 0's thresholds for all.
        let mine =
            [cfg.gpu_hier_small_bytes, cfg.gpu_flat_below_bytes].map(|v| (v as u64).to_le_bytes());
        let sizes = parent.oob_all_gather(&mine.concat())?;
        let [small_bytes, flat_below] = sizes
            .first()
            .and_then(|b| <[u8; 16]>::try_from(b.as_slice()).ok())
            .map(|b| {
                let word =
                    |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
                [word(0) as usize, word(8) as usize]
            })
            .ok_or_else(|| Error::invalid("hierarchical init: rank 0 sent no small-call sizes"))?;
        let desc = format!(
            "hierarchical: {} hosts x {} GPUs; inside a host the NVLink kernels, between hosts local index {index}'s engine ({})",
            layout.nhosts(),
            layout.local(),
            cross.describe()
        );
        let (local, cross) = (Arc::new(local), Arc::new(cross));
        let stop = Arc::new(AtomicBool::new(false));
        let cause = Arc::new(Mutex::new(None));
        let watcher = {
            let w = Watch {
                local: local.clone(),
                cross: cross.clone(),
                cause: cause.clone(),
                group: group.clone(),
                rank,
            };
            let s = stop.clone();
            std::thread::Builder::new()
                .name("railcc-hier-watch".into())
                .spawn(move || w.run(&s))
                .map_err(|e| Error::io("starting the hierarchical watcher", &e))?
        };
        Ok(HierGpu {
            layout,
            rank,
            host,
            index,
            group,
            local,
            cross,
            small_bytes,
            flat_below,
            scratch: Mutex::new(Scratch::default()),
            sides: Mutex::new(HashMap::new()),
            cause,
            desc,
            watcher: Some((stop, watcher)),
        })
    }

    pub fn describe(&self) -> &str {
        &self.desc
    }

    /// The cross engine's staging rings: the communicator's flat engine stages through them
    /// too (one pinned budget, not one an engine).
    pub fn cross_rings(&self) -> Arc<crate::gpu::net::Rings> {
        self.cross.rings()
    }

    /// Whether this path runs `a` (else the caller takes the flat network path).
    pub fn takes(&self, a: &CollArgs) -> bool {
        a.nranks == self.layout.nranks() && takes(a) && !flat(a, self.flat_below)
    }

    /// The error that broke either part, if any, naming ranks as the communicator does. The
    /// first time, both parts are stopped with it (as the watcher thread would within 10 ms):
    /// the host's other ranks and the other hosts hear it before this rank's caller can abort.
    pub fn async_error(&self) -> Option<Error> {
        if let Some(e) = self.cause.lock().clone() {
            return Some(e);
        }
        // The host's part names ranks as the communicator does (ProcGpu's names).
        let e = self.local.async_error().or_else(|| {
            self.cross
                .async_error()
                .map(|e| to_global(e, &self.group, self.rank))
        })?;
        self.abort_with(e.clone());
        self.cause.lock().clone().or(Some(e))
    }

    /// `rank`'s local index when it shares this rank's host.
    pub fn local_index(&self, rank: usize) -> Option<usize> {
        self.layout.hosts[self.host].iter().position(|&r| r == rank)
    }

    /// Sends and receives with ranks of this host (peers as local indices) by peer access.
    ///
    /// # Safety
    /// As for `ProcGpu::p2p`.
    pub unsafe fn p2p_local(&self, ops: &[railcc_transport_nvlink::proc::P2p]) -> Result<()> {
        if let Some(e) = self.async_error() {
            return Err(e);
        }
        // SAFETY: the caller's contract.
        unsafe { self.local.p2p(ops) }.map_err(|e| self.async_error().unwrap_or(e))
    }

    /// This GPU's side stream for work forked from the caller's `stream` (made on first use,
    /// one per caller stream, kept until the end).
    pub fn side_stream(&self, stream: Stream) -> Result<Stream> {
        let mut sides = self.sides.lock();
        if let Some(&s) = sides.get(&(stream as usize)) {
            return Ok(s as Stream);
        }
        let s = railcc_cuda::gpu::create_stream(&self.local.gpu)?;
        sides.insert(stream as usize, s as usize);
        Ok(s)
    }

    /// Makes `waiter` wait for what is on `on` now (both this GPU's streams).
    ///
    /// # Safety
    /// Both are live streams of this GPU.
    pub unsafe fn stream_waits_for(&self, waiter: Stream, on: Stream) -> Result<()> {
        let g = &self.local.gpu;
        // SAFETY: the caller's contract.
        unsafe { railcc_cuda::gpu::stream_waits_for(g, waiter, g, on) }
    }

    /// A device copy of `bytes` on `stream`.
    ///
    /// # Safety
    /// `dst` and `src` are this GPU's memory of `bytes`, `stream` a live stream of it.
    pub unsafe fn copy(&self, dst: u64, src: u64, bytes: usize, stream: Stream) -> Result<()> {
        if bytes == 0 || dst == src {
            return Ok(());
        }
        self.local.gpu.bind()?;
        // SAFETY: the caller's contract.
        unsafe { railcc_cuda::gpu::copy_async(dst, src, bytes, stream, "cuMemcpyAsync") }
    }

    pub fn abort(&self) {
        self.local.abort();
        self.cross.abort();
    }

    /// Stops both parts with `why` as the cause this rank reports and the other hosts hear.
    pub fn abort_with(&self, why: Error) {
        self.cause.lock().get_or_insert(why.clone());
        self.local.abort_with(why.clone());
        self.cross.abort_with(why);
    }

    /// Enqueues `a` on `stream` (send and receive buffers at device addresses `send`, `recv`).
    ///
    /// # Safety
    /// `stream` is a live stream of this rank's GPU; `send` and `recv` are device memory of
    /// this GPU from cudaMalloc/cuMemAlloc (CUDA IPC exports them), sized as `a` implies, valid
    /// until the stream passes the call.
    pub unsafe fn enqueue(&self, a: &CollArgs, send: u64, recv: u64, stream: Stream) -> Result<()> {
        if !self.takes(a) {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("{}: no hierarchical schedule for {a:?}", a.coll.name()),
            )
            .rank(self.rank));
        }
        if a.root >= a.nranks {
            return Err(Error::invalid(format!(
                "{}: root {} out of range for {} ranks",
                a.coll.name(),
                a.root,
                a.nranks
            ))
            .rank(self.rank));
        }
        if let Some(e) = self.async_error() {
            return Err(Error::earlier(&e).rank(self.rank));
        }
        let es = a.dtype.size();
        let p = plan(a, &self.layout, self.rank, self.small_bytes);
        // A scratch this rank cannot get fails the call here alone: its mates and the other
        // hosts would wait for its steps, so it aborts them as a failed step does.
        let r = self.scratch(stream, p.scratch * es).and_then(|scratch| {
            let addr = |at: At| {
                let base = match at.buf {
                    Buf::Send => send,
                    Buf::Recv => recv,
                    Buf::Scratch => scratch,
                };
                base + (at.off * es) as u64
            };
            // SAFETY: the caller's contract covers `send`, `recv` and `stream`; the scratch
            // is this GPU's and sized for the plan.
            p.steps
                .iter()
                .try_for_each(|s| unsafe { self.step(s, a, &addr, stream) })
        });
        if let Err(e) = &r {
            // Part of the call may be enqueued and peers may wait on the rest: stop them all,
            // with this error as the reason the other hosts hear.
            tracing::warn!("rank {}: hierarchical {}: {e}", self.rank, a.coll.name());
            self.abort_with(e.clone());
        }
        r
    }

    /// # Safety
    /// As [`HierGpu::enqueue`], for the addresses `addr` gives.
    unsafe fn step(
        &self,
        s: &Step,
        a: &CollArgs,
        addr: &dyn Fn(At) -> u64,
        stream: Stream,
    ) -> Result<()> {
        match *s {
            Step::Local { c, hosts } if hosts.has(self.host) => {
                let call = Call {
                    args: CollArgs {
                        coll: c.coll,
                        nranks: self.layout.local(),
                        count: c.count,
                        dtype: a.dtype,
                        op: c.op,
                        root: c.root,
                    },
                    send: addr(c.send),
                    recv: addr(c.recv),
                    stream: stream as usize,
                };
                // SAFETY: the caller's buffers, stream and scratch (see enqueue).
                unsafe { self.local.collective(&call) }
                    .map(|_| ())
                    .map_err(|e| {
                        self.async_error().unwrap_or(e).op(format!(
                            "hierarchical {}: {} inside the host",
                            a.coll.name(),
                            c.coll.name()
                        ))
                    })
            }
            Step::Cross { c, group: only } if only.is_none_or(|g| g == self.index) => {
                let sub = CollArgs {
                    coll: c.coll,
                    nranks: self.layout.nhosts(),
                    count: c.count,
                    dtype: a.dtype,
                    op: c.op,
                    root: c.root,
                };
                let op = NetOp::Coll {
                    a: sub,
                    send: addr(c.send),
                    recv: addr(c.recv),
                };
                // SAFETY: as above.
                unsafe { self.cross.enqueue(op, stream) }.map_err(|e| {
                    self.async_error()
                        .unwrap_or_else(|| to_global(e, &self.group, self.rank))
                        .op(format!(
                            "hierarchical {}: {} between hosts (ranks {:?})",
                            a.coll.name(),
                            c.coll.name(),
                            self.group
                        ))
                })
            }
            // SAFETY: both ranges lie in this GPU's buffers of the call (see enqueue).
            Step::Copy { src, dst, count } => unsafe {
                self.copy(addr(dst), addr(src), count * a.dtype.size(), stream)
            },
            _ => Ok(()),
        }
    }

    /// This stream's scratch of at least `bytes` (0 when none is needed).
    fn scratch(&self, stream: Stream, bytes: usize) -> Result<u64> {
        if bytes == 0 {
            return Ok(0);
        }
        let mut s = self.scratch.lock();
        let key = stream as usize;
        if let Some(b) = s.live.get(&key).filter(|b| b.bytes >= bytes) {
            return Ok(b.ptr);
        }
        let gpu = &self.local.gpu;
        gpu.bind()?;
        // SAFETY: the caller's live stream in this GPU's context.
        if unsafe { railcc_cuda::hostsync::capturing(stream)? } {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "a hierarchical call needs {bytes} bytes of scratch while the stream is captured into a CUDA graph (memory cannot be allocated then); run the call once before capturing"
                ),
            )
            .rank(self.rank));
        }
        let old = s.live.get(&key).map_or(0, |b| b.bytes);
        let buf = gpu.alloc(bytes.max(2 * old))?;
        let p = buf.ptr;
        if let Some(o) = s.live.insert(key, buf) {
            s.retired.push(o);
        }
        Ok(p)
    }
}

/// `e` from the network engine of the ranks `members` (its ranks number them from 0), with
/// its rank and peer as the communicator's.
fn to_global(mut e: Error, members: &[usize], rank: usize) -> Error {
    if e.rank.is_some() {
        e.rank = Some(rank);
    }
    if let Some((p, g)) = e.peer.and_then(|p| members.get(p).map(|&g| (p, g))) {
        if p != g {
            e.message = format!(
                "{} (its rank {p} is rank {g} of the communicator)",
                e.message
            );
        }
        e.peer = Some(g);
    }
    e
}

/// Either part breaking breaks the other with the same cause, so a peer that died on the host
/// (the NVLink path sees its process go) also stops the network engine's streams and is
/// named to the other hosts (the engine's abort carries the cause to its peers), and the
/// reverse.
struct Watch {
    local: Arc<ProcGpu>,
    cross: Arc<GpuNet>,
    cause: Arc<Mutex<Option<Error>>>,
    group: Vec<usize>,
    rank: usize,
}

impl Watch {
    fn run(&self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            if let Some(e) = self.local.async_error() {
                tracing::warn!(
                    "hierarchical: the host's GPUs broke ({e}); stopping the network engine"
                );
                self.cause.lock().get_or_insert(e.clone());
                self.cross.abort_with(e);
                return;
            }
            if let Some(e) = self.cross.async_error() {
                let e = to_global(e, &self.group, self.rank);
                tracing::warn!(
                    "hierarchical: the network engine broke ({e}); stopping the host's GPUs"
                );
                self.cause.lock().get_or_insert(e.clone());
                self.local.abort_with(e);
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for HierGpu {
    fn drop(&mut self) {
        for (_, s) in self.sides.lock().drain() {
            // SAFETY: made by side_stream, destroyed once; the communicator's work is done.
            let _ = unsafe { railcc_cuda::gpu::destroy_stream(&self.local.gpu, s as Stream) };
        }
        if let Some((stop, h)) = self.watcher.take() {
            stop.store(true, Ordering::Relaxed);
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HierGpu;

    #[test]
    fn the_hierarchy_takes_hosts_of_up_to_the_kernels_peers() {
        let ids = |nh: usize, nl: usize| -> Vec<Vec<u8>> {
            (0..nh * nl).map(|r| vec![(r / nl) as u8]).collect()
        };
        let max = railcc_cuda::kernels::MAX_PEERS;
        assert!(HierGpu::layout(&ids(2, max)).is_some());
        // One rank per host, one host, or more ranks per host than the kernels take.
        assert!(HierGpu::layout(&ids(2, 1)).is_none());
        assert!(HierGpu::layout(&ids(1, 4)).is_none());
        assert!(HierGpu::layout(&ids(2, max + 1)).is_none());
    }
}
