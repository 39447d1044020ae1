//! The Communicator: one rank's handle on a job. `Send + Sync`; calls from several threads
//! are serialized. After any failure the communicator is broken: it closes its connections
//! (so peers learn of it at once) and every later call returns the same error.

use crate::conn::Connections;
use crate::cost::{HostEffects, Link, Machine};
use crate::exec::{Buffers, Compiled, Exec, RawBuf, Workspace};
use crate::plan::{build_ordered, group_plan, host_order, Algo, CollArgs, P2pKind, PlanOpts};
use crate::regions::{RegionId, Regions};
use parking_lot::Mutex;
use railcc_core::bootstrap::{unspecified_like, Bootstrap, RootServer, UniqueId};
use railcc_core::config::AlgoChoice;
use railcc_core::launch;
use railcc_core::net::{CollKind, MsgTag, NetTransport};
use railcc_core::{netif, Config, DataType, Element, Error, ErrorKind, ReduceOp, Result};
use railcc_transport_rdma::{RdmaTransport, RdmaTuning};
use railcc_transport_tcp::{TcpSettings, TcpTransport};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Compiled plans by call shape: a repeated call (the common case in training loops) skips
/// planning entirely.
type PlanKey = (CollArgs, Algo, usize, usize, bool);
const PLAN_CACHE_MAX: usize = 256;

struct State {
    conns: Connections,
    plans: HashMap<PlanKey, Arc<Compiled>>,
    ws: Workspace,
    bootstrap: Bootstrap,
    op_seq: u64,
    scratch: Vec<u64>,
    /// The scratch buffer's registration (re-made when the buffer grows).
    scratch_region: Option<RegionId>,
    regions: Regions,
    broken: Option<Error>,
}

pub struct Communicator {
    rank: usize,
    nranks: usize,
    cfg: Config,
    iface: String,
    /// What carries the data, for logs and bench headers ("tcp over lo", "rdma rxe0:1 ...").
    transport_desc: String,
    state: Mutex<State>,
    abort: Arc<AtomicBool>,
    spin: Duration,
    local_ranks: usize,
    /// Rings visit ranks in this order: each host's ranks together ([`host_order`]).
    ring_order: Vec<usize>,
    /// Hosts in the job, for the cost model.
    nodes: usize,
    /// The cost model's choice per size bucket.
    algo_cache: Mutex<HashMap<u32, Algo>>,
    _root: Option<RootServer>,
}

/// Identifies this host: the kernel's boot id, or the hostname where that is unreadable.
/// RDMA when every rank has a usable port (and config allows it), else TCP. Ranks agree over
/// the bootstrap, so a job never mixes transports.
fn choose_transport(
    cfg: &Config,
    id: &UniqueId,
    rank: usize,
    local_rank: usize,
    iface: &netif::Iface,
    bootstrap: &mut Bootstrap,
) -> Result<(Arc<dyn NetTransport>, String)> {
    let mut rdma = None;
    let mut why = String::from("RAILCC_TRANSPORT=tcp");
    let tuning = RdmaTuning {
        timeout: cfg.ib_timeout,
        retry_cnt: cfg.ib_retry_cnt,
        eager_bytes: cfg.ib_eager_bytes,
        qps_per_conn: cfg.ib_qps_per_conn,
    };
    if cfg.transport != "tcp" {
        match railcc_transport_rdma::choose(&cfg.ib_hca, local_rank) {
            None if cfg.ib_hca.is_empty() => why = "no active RDMA port".into(),
            None => why = format!("no active RDMA port matches RAILCC_IB_HCA={}", cfg.ib_hca),
            Some(p) => match RdmaTransport::open(&p, iface.ip, id.secret, rank, tuning) {
                Ok(t) => rdma = Some(t),
                Err(e) => why = format!("{}:{} unusable: {e}", p.device, p.port),
            },
        }
    }
    let mine = [u8::from(rdma.is_some())];
    let all = bootstrap.all_gather(&mine)?;
    let without: Vec<usize> = (0..all.len()).filter(|&r| all[r] != [1]).collect();
    if let (Some(t), true) = (rdma, without.is_empty()) {
        let desc = format!("rdma {}", t.describe());
        tracing::info!("rank {rank}: transport {desc}");
        return Ok((Arc::new(t), desc));
    }
    if cfg.transport == "rdma" {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "RAILCC_TRANSPORT=rdma, but rank(s) {without:?} have no usable RDMA port{}",
                if without.contains(&rank) {
                    format!(" (here: {why})")
                } else {
                    String::new()
                }
            ),
        )
        .transport(railcc_transport_rdma::NAME));
    }
    if cfg.transport == "auto" && rank == 0 {
        let here = if without.contains(&0) {
            format!(" (rank 0: {why})")
        } else {
            String::new()
        };
        tracing::info!(
            "transport TCP over {}: no usable RDMA port on rank(s) {without:?}{here}",
            iface.name
        );
    } else if without.contains(&rank) {
        tracing::debug!("rank {rank}: no RDMA: {why}");
    }
    let rails = crate::rails::tcp_rails(cfg, iface).map_err(|e| e.rank(rank))?;
    let desc = format!("tcp over {}", crate::rails::describe(&rails));
    let t = TcpTransport::with_rails(rails, id.secret, TcpSettings::from_config(cfg));
    Ok((Arc::new(t), desc))
}

fn host_id(cfg: &Config) -> String {
    if !cfg.hostid.is_empty() {
        return cfg.hostid.clone();
    }
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .or_else(|_| std::fs::read_to_string("/etc/hostname").map(|s| s.trim().to_string()))
        .unwrap_or_default()
}

/// Buffers of one call, as bytes: separate, or one buffer for an in-place call.
pub enum Bufs<'a> {
    OutOfPlace { send: &'a [u8], recv: &'a mut [u8] },
    InPlace(&'a mut [u8]),
}

/// One operation of a grouped send/recv (see [`Communicator::group`]).
pub enum P2p<'a, T> {
    Send { peer: usize, buf: &'a [T] },
    Recv { peer: usize, buf: &'a mut [T] },
}

impl Communicator {
    /// Joins the job described by `id` as `rank` of `nranks`.
    pub fn init(cfg: Config, id: &UniqueId, rank: usize, nranks: usize) -> Result<Communicator> {
        Communicator::init_inner(cfg, id, rank, nranks, None)
    }

    /// Joins the job described by launcher variables (torchrun, Open MPI, Slurm, PMI, or
    /// `RAILCC_RANK`/`RAILCC_NRANKS`). Rank 0 serves the rendezvous unless a unique id was given.
    pub fn from_env(cfg: Config) -> Result<Communicator> {
        let info = launch::discover(|k| std::env::var(k).ok())?.ok_or_else(|| {
            Error::invalid("no launcher variables found (RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, SLURM_*, PMI_*, or RAILCC_RANK/RAILCC_NRANKS)")
        })?;
        let serve_root = std::env::var("RAILCC_UNIQUE_ID").is_err();
        Communicator::from_launch(cfg, &info, serve_root)
    }

    /// Joins the job `info` describes; rank 0 serves the rendezvous when `serve_root` is set
    /// (that is, when no separate process created the unique id).
    pub fn from_launch(
        cfg: Config,
        info: &launch::LaunchInfo,
        serve_root: bool,
    ) -> Result<Communicator> {
        if info.weak_secret {
            tracing::warn!("no RAILCC_UNIQUE_ID or RAILCC_SECRET: the job secret is derived from job ids, which anyone who sees the environment knows");
        }
        let root = if info.rank == 0 && serve_root {
            let bind = SocketAddr::new(unspecified_like(info.id.root.ip()), info.id.root.port());
            Some(RootServer::start_with_secret(
                bind,
                info.id.secret,
                cfg.timeout(),
            )?)
        } else {
            None
        };
        Communicator::init_inner(cfg, &info.id, info.rank, info.nranks, root)
    }

    fn init_inner(
        cfg: Config,
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        root: Option<RootServer>,
    ) -> Result<Communicator> {
        cfg.validate()?;
        let ctx = |e: Error| e.rank(rank).op("init");
        let ifaces = netif::list().map_err(ctx)?;
        let iface = netif::choose(&ifaces, &cfg.socket_ifname, Some(id.root.ip())).map_err(ctx)?;
        let mut bootstrap = Bootstrap::init(id, rank, nranks, iface.ip, cfg.timeout())?;
        // Ranks on the same host (same boot id), and this rank's place among them.
        let host = host_id(&cfg);
        let hosts = bootstrap.all_gather(host.as_bytes())?;
        let local_rank = hosts[..rank]
            .iter()
            .filter(|h| h.as_slice() == host.as_bytes())
            .count();
        let (transport, transport_desc) =
            choose_transport(&cfg, id, rank, local_rank, &iface, &mut bootstrap).map_err(ctx)?;
        let listener = transport.listen(0).map_err(ctx)?;
        let handles = bootstrap.all_gather(&listener.handle().0)?;
        let handles = handles
            .into_iter()
            .map(railcc_core::net::ConnectHandle)
            .collect();
        let conns = Connections::new(rank, nranks, transport, listener, handles).map_err(ctx)?;
        // When ranks on this host outnumber the cores, waiting ranks sleep in poll(2) at once
        // instead of spinning, so the rank with work gets the core.
        let local_ranks = hosts
            .iter()
            .filter(|h| h.as_slice() == host.as_bytes())
            .count();
        let cores = host_cores();
        let spin = if local_ranks > cores {
            Duration::ZERO
        } else {
            Duration::from_micros(cfg.spin_us)
        };
        bootstrap.barrier()?;
        tracing::debug!(
            "rank {rank}/{nranks} ready on {} ({})",
            iface.name,
            iface.ip
        );
        Ok(Communicator {
            rank,
            nranks,
            iface: iface.name,
            transport_desc,
            cfg,
            state: Mutex::new(State {
                conns,
                plans: HashMap::new(),
                ws: Workspace::default(),
                bootstrap,
                op_seq: 0,
                scratch: Vec::new(),
                scratch_region: None,
                regions: Regions::default(),
                broken: None,
            }),
            abort: Arc::new(AtomicBool::new(false)),
            spin,
            local_ranks,
            ring_order: host_order(&hosts),
            nodes: {
                let mut distinct: Vec<&Vec<u8>> = hosts.iter().collect();
                distinct.sort();
                distinct.dedup();
                distinct.len()
            },
            algo_cache: Mutex::new(HashMap::new()),
            _root: root,
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn nranks(&self) -> usize {
        self.nranks
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// How many ranks of this job run on this host.
    pub fn local_ranks(&self) -> usize {
        self.local_ranks
    }

    /// The interface the sockets use.
    pub fn interface(&self) -> &str {
        &self.iface
    }

    /// The transport in use and its device, e.g. `rdma rxe0:1 Ethernet GID[1] ...`.
    pub fn transport(&self) -> &str {
        &self.transport_desc
    }

    /// Unblocks every waiter within milliseconds and breaks the communicator. Callable from any
    /// thread, even while another thread is inside a collective.
    pub fn abort(&self) {
        self.abort.store(true, Ordering::Relaxed);
    }

    /// The error that broke this communicator, if any (like `ncclCommGetAsyncError`).
    pub fn async_error(&self) -> Option<Error> {
        if self.abort.load(Ordering::Relaxed) {
            return Some(Error::new(ErrorKind::Aborted, "communicator aborted").rank(self.rank));
        }
        self.state.lock().broken.clone()
    }

    /// Registers `len` bytes at `ptr` for every transfer into or out of them, like
    /// `ncclCommRegister`: over RDMA such transfers go zero-copy without pinning pages per
    /// call. Registration with each peer's connection happens on the first transfer there.
    ///
    /// # Safety
    /// The memory must stay allocated and mapped until [`Communicator::deregister`] returns or
    /// the communicator is dropped: freed and reused pages would receive data meant for the
    /// old ones.
    pub unsafe fn register(&self, ptr: *const u8, len: usize) -> Result<RegionId> {
        let mut st = self.state.lock();
        self.check_usable(&st)?;
        st.regions
            .add(ptr as usize, len, self.nranks)
            .map_err(|e| e.rank(self.rank))
    }

    /// Registers GPU memory exported as a dma-buf (`ptr` at `offset` in `fd`) for GPUDirect
    /// RDMA. Only an RDMA communicator takes it; the caller keeps the memory and the
    /// descriptor alive until [`Communicator::deregister`].
    ///
    /// # Safety
    /// `ptr..ptr+len` must be device memory that stays allocated while registered.
    pub unsafe fn register_dmabuf(
        &self,
        ptr: u64,
        len: usize,
        fd: i32,
        offset: u64,
    ) -> Result<RegionId> {
        if !self.transport_desc.starts_with("rdma") {
            return Err(Error::invalid(format!(
                "GPU memory can be registered only over RDMA; this communicator uses {}",
                self.transport_desc
            ))
            .rank(self.rank));
        }
        let mut st = self.state.lock();
        self.check_usable(&st)?;
        st.regions
            .add_dmabuf(ptr as usize, len, self.nranks, fd, offset)
            .map_err(|e| e.rank(self.rank))
    }

    /// Runs collective `a` on device memory the network moves directly (GPUDirect RDMA): only
    /// a send/recv across ranks (no copy or reduction touches the buffers on the host), with
    /// both buffers inside regions from [`Communicator::register_dmabuf`]; anything else is
    /// refused, since the host would read device memory.
    ///
    /// # Safety
    /// `send` and `recv` must be device memory of `a`'s sizes, not touched by the GPU until
    /// this returns.
    pub unsafe fn collective_device(&self, a: CollArgs, send: u64, recv: u64) -> Result<()> {
        let es = a.dtype.size();
        let (sb, rb) = (a.send_elems() * es, a.recv_elems() * es);
        let direct = a.coll == CollKind::SendRecv && self.nranks > 1 && a.nranks == self.nranks;
        let covered = {
            let st = self.state.lock();
            st.regions.covered_by_device(send as usize, sb)
                && st.regions.covered_by_device(recv as usize, rb)
        };
        if !direct || !covered {
            return Err(Error::invalid(format!(
                "{}: GPUDirect RDMA runs send/recv across ranks on registered GPU buffers only",
                a.coll.name()
            ))
            .rank(self.rank));
        }
        let s = RawBuf {
            ptr: send as *mut u8,
            bytes: sb,
            writable: false,
        };
        let r = RawBuf {
            ptr: recv as *mut u8,
            bytes: rb,
            writable: true,
        };
        self.run_collective(a, s, r, false)
    }

    /// Drops a registration made by [`Communicator::register`].
    pub fn deregister(&self, id: RegionId) -> Result<()> {
        let mut st = self.state.lock();
        let State { conns, regions, .. } = &mut *st;
        regions.remove(id, conns).map_err(|e| e.rank(self.rank))
    }

    /// The cost model's all-reduce algorithm for `bytes` per rank, cached per power-of-two
    /// size bucket ([`crate::cost`]; links from `RAILCC_LOCAL_*` and `RAILCC_NET_*`).
    fn model_choice(&self, bytes: usize) -> Algo {
        let bucket = usize::BITS - bytes.leading_zeros();
        if let Some(&a) = self.algo_cache.lock().get(&bucket) {
            return a;
        }
        let link = |lat_us: u64, mbps: u64| Link {
            bytes_per_s: mbps.max(1) as f64 * 1e6,
            latency_s: lat_us as f64 * 1e-6,
        };
        let m = Machine {
            nodes: self.nodes,
            per_node: self.nranks.div_ceil(self.nodes.max(1)),
            intra: link(self.cfg.local_lat_us, self.cfg.local_mbytes_per_s),
            inter: link(self.cfg.net_lat_us, self.cfg.net_mbytes_per_s),
            chunk_bytes: self.cfg.chunk_bytes as f64,
            reduce_bytes_per_s: self.cfg.reduce_mbytes_per_s as f64 * 1e6,
            host: Some(HostEffects::fitted(
                self.local_ranks as f64 / host_cores().max(1) as f64,
            )),
        };
        // The bucket's smallest size stands for it: it is the size itself when sizes are
        // powers of two, as they usually are.
        let at = if bucket == 0 {
            0.0
        } else {
            (1u64 << (bucket - 1)) as f64
        };
        let a = m.rank_all_reduce(at).first().map_or(Algo::Ring, |x| x.0);
        self.algo_cache.lock().insert(bucket, a);
        a
    }

    /// The algorithm a call would use.
    pub fn algo_for(&self, a: &CollArgs) -> Algo {
        match a.coll {
            CollKind::AllReduce => {
                let bytes = a.count * a.dtype.size();
                match self.cfg.algo {
                    AlgoChoice::Ring => Algo::Ring,
                    AlgoChoice::Direct => Algo::Direct,
                    AlgoChoice::RecursiveDoubling => Algo::RecursiveDoubling,
                    AlgoChoice::Tree => Algo::Tree,
                    AlgoChoice::Auto => self.model_choice(bytes),
                }
            }
            CollKind::Broadcast | CollKind::Reduce => Algo::Chain,
            CollKind::AllToAll | CollKind::SendRecv => Algo::PointToPoint,
            CollKind::Barrier => Algo::Dissemination,
            CollKind::AllGather | CollKind::ReduceScatter => Algo::Ring,
        }
    }

    /// Runs one collective on byte buffers. This is the entry point every typed call goes
    /// through, and the one the bench uses for run-time dtypes.
    pub fn collective(&self, a: CollArgs, bufs: Bufs<'_>) -> Result<()> {
        let name = a.coll.name();
        let fail = |m: String| Err(Error::invalid(format!("{name}: {m}")).rank(self.rank));
        if a.nranks != self.nranks {
            return fail(format!(
                "nranks {} differs from the communicator's {}",
                a.nranks, self.nranks
            ));
        }
        if matches!(a.coll, CollKind::Broadcast | CollKind::Reduce) && a.root >= self.nranks {
            return fail(format!(
                "root {} out of range for {} ranks",
                a.root, self.nranks
            ));
        }
        let es = a.dtype.size();
        let need = |elems: usize| {
            elems.checked_mul(es).ok_or_else(|| {
                Error::invalid(format!("{name}: count {} overflows", a.count)).rank(self.rank)
            })
        };
        let (send_need, recv_need) = (need(a.send_elems())?, need(a.recv_elems())?);
        let root_only_recv = a.coll == CollKind::Reduce && self.rank != a.root;
        let root_only_send = a.coll == CollKind::Broadcast && self.rank != a.root;
        // The host kernels read elements in place: each buffer must be aligned for its type.
        match &bufs {
            Bufs::OutOfPlace { send, recv } => {
                self.aligned(&a, "send", send.as_ptr(), send.len())?;
                self.aligned(&a, "receive", recv.as_ptr(), recv.len())?;
            }
            Bufs::InPlace(buf) => self.aligned(&a, "in-place", buf.as_ptr(), buf.len())?,
        }
        let (send, recv, in_place) = match bufs {
            Bufs::OutOfPlace { send, recv } => {
                if !root_only_send && send.len() < send_need {
                    return fail(format!(
                        "send buffer holds {} bytes, {} elements of {} need {send_need}",
                        send.len(),
                        a.send_elems(),
                        a.dtype
                    ));
                }
                if !root_only_recv && recv.len() < recv_need {
                    return fail(format!(
                        "receive buffer holds {} bytes, {} elements of {} need {recv_need}",
                        recv.len(),
                        a.recv_elems(),
                        a.dtype
                    ));
                }
                let (sl, rl) = (
                    if root_only_send { 0 } else { send_need },
                    if root_only_recv { 0 } else { recv_need },
                );
                let s = RawBuf {
                    ptr: send.as_ptr() as *mut u8,
                    bytes: sl.min(send.len()),
                    writable: false,
                };
                let r = RawBuf {
                    ptr: recv.as_mut_ptr(),
                    bytes: rl.min(recv.len()),
                    writable: true,
                };
                (s, r, false)
            }
            Bufs::InPlace(buf) => {
                let (so, ro, total) = a.in_place_layout(self.rank);
                let total = need(total)?;
                if buf.len() < total {
                    return fail(format!(
                        "in-place buffer holds {} bytes, needs {total}",
                        buf.len()
                    ));
                }
                // SAFETY: so*es + send_need and ro*es + recv_need are within `total` bytes of
                // the buffer (in_place_layout's contract), checked against buf.len() above.
                let (s, r) =
                    unsafe { (buf.as_mut_ptr().add(so * es), buf.as_mut_ptr().add(ro * es)) };
                (
                    RawBuf {
                        ptr: s,
                        bytes: send_need,
                        writable: false,
                    },
                    RawBuf {
                        ptr: r,
                        bytes: recv_need,
                        writable: true,
                    },
                    true,
                )
            }
        };
        self.run_collective(a, send, recv, in_place)
    }

    /// An error unless `bytes` at `p` are aligned for `a`'s element type.
    fn aligned(&self, a: &CollArgs, what: &str, p: *const u8, bytes: usize) -> Result<()> {
        let es = a.dtype.size();
        if bytes == 0 || (p as usize).is_multiple_of(es) {
            return Ok(());
        }
        Err(Error::invalid(format!(
            "{}: {what} buffer at {p:p} is not aligned for {} ({es} bytes)",
            a.coll.name(),
            a.dtype
        ))
        .rank(self.rank))
    }

    /// `collective` once the buffers are checked.
    fn run_collective(
        &self,
        a: CollArgs,
        send: RawBuf,
        recv: RawBuf,
        in_place: bool,
    ) -> Result<()> {
        let name = a.coll.name();
        let es = a.dtype.size();
        self.aligned(&a, "send", send.ptr, send.bytes)?;
        self.aligned(&a, "receive", recv.ptr, recv.bytes)?;
        let algo = self.algo_for(&a);
        let opts = PlanOpts {
            chunk_elems: (self.cfg.chunk_bytes / es).max(1),
            window: self.cfg.max_inflight_chunks,
            in_place,
        };
        let mut st = self.state.lock();
        self.check_usable(&st)?;
        st.op_seq += 1;
        let seq = st.op_seq;
        if a.count == 0 && a.coll != CollKind::Barrier {
            return Ok(());
        }
        let key = (a, algo, opts.chunk_elems, opts.window, in_place);
        let plan = match st.plans.get(&key) {
            Some(p) => p.clone(),
            None => {
                if st.plans.len() >= PLAN_CACHE_MAX {
                    st.plans.clear();
                }
                let p = Arc::new(Compiled::new(
                    build_ordered(&a, self.rank, algo, &opts, &self.ring_order),
                    self.nranks,
                ));
                st.plans.insert(key, p.clone());
                p
            }
        };
        let redop = a.reduces().then_some(a.op);
        let root = matches!(a.coll, CollKind::Broadcast | CollKind::Reduce).then_some(a.root);
        let tag = MsgTag::new(seq, a.coll, a.dtype, redop, root, a.count as u64);
        self.execute(
            &mut st,
            &plan,
            a.dtype,
            a.op,
            tag,
            name,
            send,
            recv,
            Vec::new(),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn execute(
        &self,
        st: &mut State,
        plan: &Compiled,
        dtype: DataType,
        op: ReduceOp,
        tag: MsgTag,
        label: &str,
        send: RawBuf,
        recv: RawBuf,
        user: Vec<RawBuf>,
    ) -> Result<()> {
        let scratch_bytes = plan.plan.scratch_elems * dtype.size();
        if st.scratch.len() * 8 < scratch_bytes {
            if let Some(id) = st.scratch_region.take() {
                st.regions.remove(id, &mut st.conns)?;
            }
            st.scratch = vec![0u64; scratch_bytes.div_ceil(8)];
            // The communicator owns the scratch buffer and drops its region before the buffer.
            let (addr, len) = (st.scratch.as_ptr() as usize, st.scratch.len() * 8);
            st.scratch_region = Some(st.regions.add(addr, len, self.nranks)?);
        }
        let scratch = RawBuf {
            ptr: st.scratch.as_mut_ptr() as *mut u8,
            bytes: scratch_bytes,
            writable: true,
        };
        let ex = Exec {
            rank: self.rank,
            nranks: self.nranks,
            dtype,
            op,
            tag,
            name: label,
            seq: tag.op_seq,
            timeout: self.cfg.timeout(),
            spin: self.spin,
            abort: &self.abort,
        };
        let State {
            conns, ws, regions, ..
        } = st;
        let r = ex.run(
            plan,
            &Buffers {
                send,
                recv,
                scratch,
                user,
            },
            conns,
            regions,
            ws,
        );
        if let Err(e) = &r {
            tracing::error!("{e}");
            st.broken = Some(e.clone());
            st.conns.abort_all(&e.to_string());
            st.regions.forget_connections();
        }
        r
    }

    fn check_usable(&self, st: &State) -> Result<()> {
        if self.abort.load(Ordering::Relaxed) {
            return Err(Error::new(ErrorKind::Aborted, "communicator was aborted").rank(self.rank));
        }
        if let Some(e) = &st.broken {
            return Err(Error::new(
                ErrorKind::Aborted,
                format!("communicator is broken by an earlier error: {e}"),
            )
            .rank(self.rank));
        }
        Ok(())
    }

    fn args<T: Element>(
        &self,
        coll: CollKind,
        count: usize,
        op: ReduceOp,
        root: usize,
    ) -> CollArgs {
        CollArgs {
            coll,
            nranks: self.nranks,
            count,
            dtype: T::DTYPE,
            op,
            root,
        }
    }

    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        let a = self.args::<T>(CollKind::AllReduce, send.len(), op, 0);
        self.collective(
            a,
            Bufs::OutOfPlace {
                send: bytemuck::cast_slice(send),
                recv: bytemuck::cast_slice_mut(recv),
            },
        )
    }

    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let a = self.args::<T>(CollKind::AllReduce, buf.len(), op, 0);
        self.collective(a, Bufs::InPlace(bytemuck::cast_slice_mut(buf)))
    }

    /// `recv` receives every rank's `send`, in rank order (`recv.len() >= send.len() * nranks`).
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let a = self.args::<T>(CollKind::AllGather, send.len(), ReduceOp::Sum, 0);
        self.collective(
            a,
            Bufs::OutOfPlace {
                send: bytemuck::cast_slice(send),
                recv: bytemuck::cast_slice_mut(recv),
            },
        )
    }

    /// In place: this rank's contribution sits at `buf[rank * n..]` with `n = buf.len() / nranks`.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let count = self.per_rank(buf.len(), "all_gather")?;
        let a = self.args::<T>(CollKind::AllGather, count, ReduceOp::Sum, 0);
        self.collective(a, Bufs::InPlace(bytemuck::cast_slice_mut(buf)))
    }

    /// `recv` (n elements) gets block `rank` of the reduction of every rank's `send` (n * nranks).
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let a = self.args::<T>(CollKind::ReduceScatter, recv.len(), op, 0);
        self.collective(
            a,
            Bufs::OutOfPlace {
                send: bytemuck::cast_slice(send),
                recv: bytemuck::cast_slice_mut(recv),
            },
        )
    }

    /// In place: the result lands at `buf[rank * n..(rank + 1) * n]`.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let count = self.per_rank(buf.len(), "reduce_scatter")?;
        let a = self.args::<T>(CollKind::ReduceScatter, count, op, 0);
        self.collective(a, Bufs::InPlace(bytemuck::cast_slice_mut(buf)))
    }

    /// `recv` gets the root's `send`; non-roots may pass an empty `send`.
    pub fn broadcast<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        let a = self.args::<T>(CollKind::Broadcast, recv.len(), ReduceOp::Sum, root);
        self.collective(
            a,
            Bufs::OutOfPlace {
                send: bytemuck::cast_slice(send),
                recv: bytemuck::cast_slice_mut(recv),
            },
        )
    }

    pub fn broadcast_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let a = self.args::<T>(CollKind::Broadcast, buf.len(), ReduceOp::Sum, root);
        self.collective(a, Bufs::InPlace(bytemuck::cast_slice_mut(buf)))
    }

    /// The root's `recv` gets the reduction; non-roots may pass an empty `recv`.
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let a = self.args::<T>(CollKind::Reduce, send.len(), op, root);
        self.collective(
            a,
            Bufs::OutOfPlace {
                send: bytemuck::cast_slice(send),
                recv: bytemuck::cast_slice_mut(recv),
            },
        )
    }

    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let a = self.args::<T>(CollKind::Reduce, buf.len(), op, root);
        self.collective(a, Bufs::InPlace(bytemuck::cast_slice_mut(buf)))
    }

    /// Block j of `send` goes to rank j; block j of `recv` comes from rank j.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let count = self.per_rank(send.len(), "all_to_all")?;
        let a = self.args::<T>(CollKind::AllToAll, count, ReduceOp::Sum, 0);
        self.collective(
            a,
            Bufs::OutOfPlace {
                send: bytemuck::cast_slice(send),
                recv: bytemuck::cast_slice_mut(recv),
            },
        )
    }

    pub fn barrier(&self) -> Result<()> {
        let a = self.args::<u8>(CollKind::Barrier, 0, ReduceOp::Sum, 0);
        self.collective(
            a,
            Bufs::OutOfPlace {
                send: &[],
                recv: &mut [],
            },
        )
    }

    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        self.group(&mut [P2p::Send { peer, buf }])
    }

    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        self.group(&mut [P2p::Recv { peer, buf }])
    }

    /// Runs several sends and receives together, so that pairs of ranks that send to each other
    /// (or an all-to-all written as sends and receives) cannot deadlock. A send to self needs a
    /// matching receive from self in the same group.
    pub fn group<T: Element>(&self, ops: &mut [P2p<'_, T>]) -> Result<()> {
        let mut desc = Vec::with_capacity(ops.len());
        let mut user = Vec::with_capacity(ops.len());
        for o in ops.iter_mut() {
            match o {
                P2p::Send { peer, buf } => {
                    desc.push((P2pKind::Send, *peer, buf.len()));
                    user.push(RawBuf {
                        ptr: buf.as_ptr() as *mut u8,
                        bytes: std::mem::size_of_val(*buf),
                        writable: false,
                    });
                }
                P2p::Recv { peer, buf } => {
                    desc.push((P2pKind::Recv, *peer, buf.len()));
                    user.push(RawBuf {
                        ptr: buf.as_mut_ptr() as *mut u8,
                        bytes: std::mem::size_of_val(*buf),
                        writable: true,
                    });
                }
            }
        }
        if let Some((_, peer, _)) = desc.iter().find(|d| d.1 >= self.nranks) {
            return Err(Error::invalid(format!(
                "send/recv: peer {peer} out of range for {} ranks",
                self.nranks
            ))
            .rank(self.rank));
        }
        let plan = group_plan(self.rank, &desc)
            .map_err(|m| Error::invalid(format!("send/recv: {m}")).rank(self.rank))?;
        let mut st = self.state.lock();
        self.check_usable(&st)?;
        // Point-to-point calls are not collective, so they do not advance the call sequence;
        // the tag still carries dtype and count so mismatched pairs are caught.
        let count = desc.first().map_or(0, |d| d.2 as u64);
        let tag = MsgTag::new(0, CollKind::SendRecv, T::DTYPE, None, None, count);
        // One tag serves every message of a group, so for a group of several operations the
        // count field is zero; each message's byte length is still checked by the transport.
        let tag = if desc.len() > 1 {
            MsgTag { count: 0, ..tag }
        } else {
            tag
        };
        let plan = Compiled::new(plan, self.nranks);
        self.execute(
            &mut st,
            &plan,
            T::DTYPE,
            ReduceOp::Sum,
            tag,
            "send/recv",
            RawBuf::EMPTY,
            RawBuf::EMPTY,
            user,
        )
    }

    fn per_rank(&self, len: usize, name: &str) -> Result<usize> {
        if !len.is_multiple_of(self.nranks) {
            return Err(Error::invalid(format!(
                "{name}: buffer of {len} elements does not divide among {} ranks",
                self.nranks
            ))
            .rank(self.rank));
        }
        Ok(len / self.nranks)
    }

    /// Out-of-band all-gather over the bootstrap ring (setup-time data, not bulk data).
    pub fn oob_all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.state.lock().bootstrap.all_gather(mine)
    }
}

// The raw pointers inside the state are only used while the mutex is held, during a call.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Communicator>();
};

/// Cores this process may run on (1 when unknown).
fn host_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
