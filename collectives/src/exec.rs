//! The host executor: runs one rank's plan over the network transport, on the calling thread.
//!
//! Sends and receives are posted as soon as their dependencies are met (in plan order per
//! peer), many at a time, so transfers of later chunks overlap the reduction of earlier ones.
//! When nothing moves it spins briefly, then sleeps in poll(2) on the connections' sockets.
//! Every wait has a deadline: an expired one names the step, the peer and the transport.
//!
//! It runs on the caller's thread rather than a progress thread: a small all-reduce then costs
//! no thread hand-off (a futex wake-up is several microseconds, comparable to the whole call).

use crate::conn::Connections;
use crate::plan::{Buf, Op, Plan, Slice};
use crate::reduce::{divide_raw, reduce_raw, reduce_slots_raw};
use crate::regions::{Dir, Regions};
use railcc_core::net::{MsgTag, ReqId, WaitFd};
use railcc_core::{DataType, Error, ErrorKind, ReduceOp, Result};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A caller or scratch buffer as the executor sees it.
#[derive(Clone, Copy, Debug)]
pub struct RawBuf {
    pub ptr: *mut u8,
    pub bytes: usize,
    pub writable: bool,
}

impl RawBuf {
    pub const EMPTY: RawBuf = RawBuf {
        ptr: std::ptr::NonNull::<u64>::dangling().as_ptr() as *mut u8,
        bytes: 0,
        writable: false,
    };
}

pub struct Buffers {
    pub send: RawBuf,
    pub recv: RawBuf,
    pub scratch: RawBuf,
    pub user: Vec<RawBuf>,
}

pub struct Exec<'a> {
    pub rank: usize,
    pub nranks: usize,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub tag: MsgTag,
    pub name: &'a str,
    /// Call sequence number, for error messages.
    pub seq: u64,
    pub timeout: Duration,
    pub spin: Duration,
    pub abort: &'a AtomicBool,
}

impl Buffers {
    fn get(&self, b: Buf) -> Option<&RawBuf> {
        match b {
            Buf::Send => Some(&self.send),
            Buf::Recv => Some(&self.recv),
            Buf::Scratch => Some(&self.scratch),
            Buf::User(i) => self.user.get(i as usize),
        }
    }

    /// Pointer and byte length of a slice, bounds-checked against its buffer.
    fn at(&self, s: &Slice, es: usize, write: bool) -> Result<(*mut u8, usize)> {
        let bad = |why: &str| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("internal plan error: {why} for {s:?}"),
            )
        };
        let b = self.get(s.buf).ok_or_else(|| bad("no such buffer"))?;
        let off = s
            .off
            .checked_mul(es)
            .ok_or_else(|| bad("offset overflow"))?;
        let len = s
            .len
            .checked_mul(es)
            .ok_or_else(|| bad("length overflow"))?;
        if off.checked_add(len).is_none_or(|end| end > b.bytes) {
            return Err(bad("slice outside its buffer"));
        }
        if write && !b.writable && len > 0 {
            return Err(bad("write to a read-only buffer"));
        }
        // SAFETY: off + len <= b.bytes, checked above, so the result stays inside the buffer.
        Ok((unsafe { b.ptr.add(off) }, len))
    }
}

/// A plan with its dependency graph and per-peer queues precomputed, cached per call shape.
pub struct Compiled {
    pub plan: Plan,
    init_missing: Vec<u32>,
    dep_off: Vec<u32>,
    dep_list: Vec<u32>,
    send_q: Vec<Vec<usize>>,
    recv_q: Vec<Vec<usize>>,
    peers: Vec<usize>,
    init_ready: Vec<usize>,
}

impl Compiled {
    pub fn new(plan: Plan, nranks: usize) -> Compiled {
        let n = plan.steps.len();
        let mut counts = vec![0u32; n + 1];
        for s in &plan.steps {
            for d in &s.deps {
                counts[*d + 1] += 1;
            }
        }
        for i in 0..n {
            counts[i + 1] += counts[i];
        }
        let dep_off = counts.clone();
        let mut fill = counts;
        let mut dep_list = vec![0u32; dep_off[n] as usize];
        let mut send_q = vec![Vec::new(); nranks];
        let mut recv_q = vec![Vec::new(); nranks];
        let mut init_ready = Vec::new();
        for (i, s) in plan.steps.iter().enumerate() {
            for d in &s.deps {
                dep_list[fill[*d] as usize] = i as u32;
                fill[*d] += 1;
            }
            match s.op {
                Op::Send { peer, .. } if peer < nranks => send_q[peer].push(i),
                Op::Recv { peer, .. } if peer < nranks => recv_q[peer].push(i),
                Op::Send { .. } | Op::Recv { .. } => {}
                _ if s.deps.is_empty() => init_ready.push(i),
                _ => {}
            }
        }
        let peers = (0..nranks)
            .filter(|q| !send_q[*q].is_empty() || !recv_q[*q].is_empty())
            .collect();
        let init_missing = plan.steps.iter().map(|s| s.deps.len() as u32).collect();
        Compiled {
            plan,
            init_missing,
            dep_off,
            dep_list,
            send_q,
            recv_q,
            peers,
            init_ready,
        }
    }

    fn dependents(&self, i: usize) -> &[u32] {
        &self.dep_list[self.dep_off[i] as usize..self.dep_off[i + 1] as usize]
    }
}

/// Per-call mutable state of the executor, kept between calls to avoid allocation.
#[derive(Default)]
pub struct Workspace {
    state: Vec<St>,
    missing: Vec<u32>,
    ready: VecDeque<usize>,
    send_cur: Vec<usize>,
    recv_cur: Vec<usize>,
    posted_s: Vec<VecDeque<(usize, ReqId)>>,
    posted_r: Vec<VecDeque<(usize, ReqId)>>,
    fds: Vec<WaitFd>,
}

impl Workspace {
    fn reset(&mut self, cp: &Compiled, p: usize) {
        self.state.clear();
        self.state.resize(cp.plan.steps.len(), St::Waiting);
        self.missing.clear();
        self.missing.extend_from_slice(&cp.init_missing);
        self.ready.clear();
        self.ready.extend(cp.init_ready.iter().copied());
        self.send_cur.clear();
        self.send_cur.resize(p, 0);
        self.recv_cur.clear();
        self.recv_cur.resize(p, 0);
        self.posted_s.resize_with(p, VecDeque::new);
        self.posted_r.resize_with(p, VecDeque::new);
        for q in self.posted_s.iter_mut().chain(self.posted_r.iter_mut()) {
            q.clear();
        }
    }
}

#[derive(Clone, Copy, PartialEq, Default)]
enum St {
    #[default]
    Waiting,
    Posted,
    Done,
}

impl Exec<'_> {
    /// Checks every slice of the plan before any memory is touched.
    fn validate(&self, plan: &Plan, bufs: &Buffers) -> Result<()> {
        let es = self.dtype.size();
        for st in &plan.steps {
            match &st.op {
                Op::Send { peer, src } => {
                    self.peer_ok(*peer)?;
                    bufs.at(src, es, false)?;
                }
                Op::Recv { peer, dst } => {
                    self.peer_ok(*peer)?;
                    bufs.at(dst, es, true)?;
                }
                Op::Reduce { dst, a, b } => {
                    let (d, n) = bufs.at(dst, es, true)?;
                    for s in [a, b] {
                        let (q, qn) = bufs.at(s, es, false)?;
                        let overlap =
                            (d as usize) < q as usize + qn && (q as usize) < d as usize + n;
                        if qn != n || (overlap && q != d) {
                            return Err(Error::invalid("internal plan error: reduce operands differ in length or overlap partly"));
                        }
                    }
                }
                Op::ReduceSlots { dst, src, slots } => {
                    let (d, n) = bufs.at(dst, es, true)?;
                    let (q, qn) = bufs.at(&src.spanning(*slots), es, false)?;
                    let overlap = (d as usize) < q as usize + qn && (q as usize) < d as usize + n;
                    if *slots == 0 || src.len * es != n || overlap {
                        return Err(Error::invalid("internal plan error: reduce of slots differing in length from, or overlapping, the output"));
                    }
                }
                Op::Copy { dst, src } => {
                    let (_, n) = bufs.at(dst, es, true)?;
                    if bufs.at(src, es, false)?.1 != n {
                        return Err(Error::invalid(
                            "internal plan error: copy of unequal slices",
                        ));
                    }
                }
                Op::Divide { buf } => {
                    bufs.at(buf, es, true)?;
                }
            }
        }
        Ok(())
    }

    fn peer_ok(&self, peer: usize) -> Result<()> {
        if peer >= self.nranks || peer == self.rank {
            return Err(Error::invalid(format!(
                "internal plan error: bad peer {peer}"
            )));
        }
        Ok(())
    }

    fn ctx(&self, e: Error, step: usize, peer: Option<usize>, transport: &'static str) -> Error {
        let e = e
            .rank(self.rank)
            .op(format!("{} step {step}", self.name))
            .transport(transport);
        match peer {
            Some(p) => e.peer(p),
            None => e,
        }
    }

    /// Runs `plan` to completion, or fails with an error that names the step and peer.
    /// `ws` is reused between calls so that a small collective allocates nothing.
    pub fn run(
        &self,
        cp: &Compiled,
        bufs: &Buffers,
        conns: &mut Connections,
        regions: &mut Regions,
        ws: &mut Workspace,
    ) -> Result<()> {
        let tname = conns.transport_name();
        let plan = &cp.plan;
        self.validate(plan, bufs)
            .map_err(|e| self.ctx(e, 0, None, tname))?;
        let es = self.dtype.size();
        let n = plan.steps.len();
        let p = self.nranks;
        ws.reset(cp, p);
        let setup_deadline = Instant::now() + self.timeout;
        for &q in &cp.peers {
            if !cp.send_q[q].is_empty() {
                conns
                    .ensure_send(q, setup_deadline)
                    .map_err(|e| self.ctx(e, 0, Some(q), tname))?;
            }
        }
        for &q in &cp.peers {
            if !cp.recv_q[q].is_empty() {
                conns
                    .ensure_recv(q, setup_deadline, self.abort)
                    .map_err(|e| self.ctx(e, 0, Some(q), tname))?;
            }
        }
        let mut done = 0usize;
        let mut last_progress = Instant::now();
        let mut idle_spins: u32 = 0;
        let mut idle_since: Option<Instant> = None;

        macro_rules! complete {
            ($i:expr) => {{
                let i: usize = $i;
                ws.state[i] = St::Done;
                done += 1;
                for &d in cp.dependents(i) {
                    let d = d as usize;
                    ws.missing[d] -= 1;
                    if ws.missing[d] == 0
                        && !matches!(plan.steps[d].op, Op::Send { .. } | Op::Recv { .. })
                    {
                        ws.ready.push_back(d);
                    }
                }
            }};
        }

        while done < n {
            let mut progressed = false;
            while let Some(i) = ws.ready.pop_front() {
                // SAFETY: validate() bounds-checked every slice, checked writability, and
                // checked that reduce outputs overlap inputs exactly or not at all.
                unsafe {
                    match &plan.steps[i].op {
                        Op::Reduce { dst, a, b } => {
                            let (d, len) = bufs.at(dst, es, true)?;
                            let (x, _) = bufs.at(a, es, false)?;
                            let (y, _) = bufs.at(b, es, false)?;
                            reduce_raw(self.dtype, self.op, d, x, y, len / es);
                        }
                        Op::ReduceSlots { dst, src, slots } => {
                            let (d, len) = bufs.at(dst, es, true)?;
                            let (x, _) = bufs.at(&src.spanning(*slots), es, false)?;
                            reduce_slots_raw(self.dtype, self.op, d, x, len / es, *slots);
                        }
                        Op::Copy { dst, src } => {
                            let (d, len) = bufs.at(dst, es, true)?;
                            let (s, _) = bufs.at(src, es, false)?;
                            if !std::ptr::eq(d, s) {
                                std::ptr::copy(s, d, len);
                            }
                        }
                        Op::Divide { buf } => {
                            let (d, len) = bufs.at(buf, es, true)?;
                            divide_raw(self.dtype, d, len / es, p);
                        }
                        Op::Send { .. } | Op::Recv { .. } => {}
                    }
                }
                complete!(i);
                progressed = true;
            }
            for &q in &cp.peers {
                while let Some(&i) = cp.send_q[q].get(ws.send_cur[q]) {
                    if ws.missing[i] > 0 {
                        break;
                    }
                    let Op::Send { src, .. } = &plan.steps[i].op else {
                        break;
                    };
                    let (ptr, len) = bufs.at(src, es, false)?;
                    let tag = self.tag.with_index(ws.send_cur[q] as u64);
                    let mr = regions
                        .lookup(conns, q, Dir::Send, ptr as usize, len)
                        .map_err(|e| self.ctx(e, i, Some(q), tname))?;
                    let c = conns.sends[q].as_mut().ok_or_else(|| {
                        self.ctx(Error::invalid("no send connection"), i, Some(q), tname)
                    })?;
                    // SAFETY: the slice was validated; the caller's borrow of the buffers lasts
                    // until run() returns, and run() does not return before the request completes
                    // (or fails, after which the communicator closes the connection).
                    let req = unsafe { c.isend(ptr, len, tag, mr.as_ref()) }
                        .map_err(|e| self.ctx(e, i, Some(q), tname))?;
                    ws.state[i] = St::Posted;
                    ws.posted_s[q].push_back((i, req));
                    ws.send_cur[q] += 1;
                    progressed = true;
                }
                while let Some(&i) = cp.recv_q[q].get(ws.recv_cur[q]) {
                    if ws.missing[i] > 0 {
                        break;
                    }
                    let Op::Recv { dst, .. } = &plan.steps[i].op else {
                        break;
                    };
                    let (ptr, len) = bufs.at(dst, es, true)?;
                    let tag = self.tag.with_index(ws.recv_cur[q] as u64);
                    let mr = regions
                        .lookup(conns, q, Dir::Recv, ptr as usize, len)
                        .map_err(|e| self.ctx(e, i, Some(q), tname))?;
                    let c = conns.recvs[q].as_mut().ok_or_else(|| {
                        self.ctx(Error::invalid("no receive connection"), i, Some(q), tname)
                    })?;
                    // SAFETY: as for isend; no other step touches this slice until it completes
                    // (the plan's dependencies guarantee it).
                    let req = unsafe { c.irecv(ptr, len, tag, mr.as_ref()) }
                        .map_err(|e| self.ctx(e, i, Some(q), tname))?;
                    ws.state[i] = St::Posted;
                    ws.posted_r[q].push_back((i, req));
                    ws.recv_cur[q] += 1;
                    progressed = true;
                }
                while let Some(&(i, req)) = ws.posted_r[q].front() {
                    let c = conns.recvs[q].as_mut().ok_or_else(|| {
                        self.ctx(Error::invalid("no receive connection"), i, Some(q), tname)
                    })?;
                    match c.test(req).map_err(|e| self.ctx(e, i, Some(q), tname))? {
                        Some(_) => {
                            ws.posted_r[q].pop_front();
                            complete!(i);
                            progressed = true;
                        }
                        None => break,
                    }
                }
                while let Some(&(i, req)) = ws.posted_s[q].front() {
                    let c = conns.sends[q].as_mut().ok_or_else(|| {
                        self.ctx(Error::invalid("no send connection"), i, Some(q), tname)
                    })?;
                    match c.test(req).map_err(|e| self.ctx(e, i, Some(q), tname))? {
                        Some(_) => {
                            ws.posted_s[q].pop_front();
                            complete!(i);
                            progressed = true;
                        }
                        None => break,
                    }
                }
            }
            if progressed {
                idle_spins = 0;
                idle_since = None;
                continue;
            }
            if done == n {
                break;
            }
            // Idle: spin, reading the clock only every 64 turns (each turn costs a few
            // syscalls, so with spinning off a rank goes straight to poll).
            idle_spins += 1;
            if !self.spin.is_zero() && !idle_spins.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            let since = *idle_since.get_or_insert(now);
            if since == now {
                last_progress = now;
            }
            if self.abort.load(Ordering::Relaxed) {
                return Err(Error::new(ErrorKind::Aborted, "communicator aborted")
                    .rank(self.rank)
                    .op(format!("{}#{}", self.name, self.seq)));
            }
            if now.duration_since(last_progress) >= self.timeout {
                return Err(self.stall_error(plan, &ws.state, conns, tname));
            }
            if now.duration_since(since) < self.spin {
                // Let a co-scheduled rank run when there are more ranks than cores.
                std::thread::yield_now();
                continue;
            }
            ws.fds.clear();
            for &q in &cp.peers {
                if let Some(c) = conns.sends[q].as_ref() {
                    c.wait_fds(&mut ws.fds);
                }
                if let Some(c) = conns.recvs[q].as_ref() {
                    c.wait_fds(&mut ws.fds);
                }
            }
            poll_fds(&ws.fds, 1);
        }
        Ok(())
    }

    fn stall_error(
        &self,
        plan: &Plan,
        state: &[St],
        conns: &Connections,
        tname: &'static str,
    ) -> Error {
        let secs = self.timeout.as_secs_f64();
        for (i, s) in plan.steps.iter().enumerate() {
            if state[i] == St::Done {
                continue;
            }
            let (what, peer) = match &s.op {
                Op::Recv { peer, dst } => (
                    format!(
                        "no data from rank {peer} for {secs:.1} s (receive of {} elements){}",
                        dst.len,
                        conns.recvs[*peer]
                            .as_ref()
                            .map(|c| state_note(c.state()))
                            .unwrap_or_default()
                    ),
                    Some(*peer),
                ),
                Op::Send { peer, src } => (
                    format!(
                        "rank {peer} has not taken our data for {secs:.1} s (send of {} elements){}",
                        src.len,
                        conns.sends[*peer]
                            .as_ref()
                            .map(|c| state_note(c.state()))
                            .unwrap_or_default()
                    ),
                    Some(*peer),
                ),
                _ => continue,
            };
            return self.ctx(Error::new(ErrorKind::Timeout, what), i, peer, tname);
        }
        self.ctx(
            Error::new(ErrorKind::Timeout, format!("no progress for {secs:.1} s")),
            0,
            None,
            tname,
        )
    }
}

fn state_note(s: String) -> String {
    if s.is_empty() {
        s
    } else {
        format!("; connection: {s}")
    }
}

/// Sleeps until one of `fds` is ready or `ms` milliseconds pass.
fn poll_fds(fds: &[WaitFd], ms: i32) {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|f| libc::pollfd {
            fd: f.fd,
            events: if f.write { libc::POLLOUT } else { libc::POLLIN },
            revents: 0,
        })
        .collect();
    if pfds.is_empty() {
        std::thread::sleep(Duration::from_millis(ms as u64));
        return;
    }
    // SAFETY: `pfds` is a valid array of pollfd for the duration of the call.
    unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
}
