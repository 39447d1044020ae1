//! The ranks of one communicator, all in this process (threads, or one thread with groups), and
//! the rendezvous that turns their separate NCCL calls into one railcc launch.
//!
//! NCCL's API hands each rank's call over separately; railcc's GPU communicator for every
//! rank of one process (`GpuComm::in_process`) needs every rank's buffers and streams at
//! once. So the n-th
//! collective call of every rank lands in slot n; the call that completes a slot checks that
//! the ranks agree and launches for all of them, and the others wait for its result (bounded
//! by the deadline). Send and receive pair up the same way per (sender, receiver, n-th
//! message) and become a copy between the two streams, ordered by events.

use parking_lot::{Condvar, Mutex};
use railcc_collectives::gpu::GpuComm;
pub use railcc_core::call::Call;
use railcc_core::call::P2pOp;
use railcc_core::{Error, ErrorKind, Result};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Slot {
    calls: Vec<Option<Call>>,
    result: Option<std::result::Result<(), Error>>,
    collected: usize,
}

#[derive(Default)]
struct Pair {
    send: Option<P2pOp>,
    recv: Option<P2pOp>,
    result: Option<std::result::Result<(), Error>>,
    collected: usize,
}

/// Where a submitted call waits for its launch.
#[derive(Debug, Clone)]
pub enum Ticket {
    Coll(u64),
    P2p(usize, usize, u64),
    /// Already ran (the per-process path returns once every rank made the call).
    Done(std::result::Result<(), Error>),
}

pub struct Clique {
    pub nranks: usize,
    /// Each rank's CUDA device, as ranks join.
    devices: Mutex<Vec<Option<i32>>>,
    joined: Condvar,
    gpus: OnceLock<std::result::Result<GpuComm, Error>>,
    slots: Mutex<HashMap<u64, Slot>>,
    pairs: Mutex<HashMap<(usize, usize, u64), Pair>>,
    done: Condvar,
    /// Batched sends posted for their receivers, by (sender, receiver, message number).
    posted: Mutex<HashMap<(usize, usize, u64), P2pOp>>,
    posted_cv: Condvar,
    pub timeout: Duration,
}

fn registry() -> &'static Mutex<HashMap<[u8; 16], Arc<Clique>>> {
    static R: OnceLock<Mutex<HashMap<[u8; 16], Arc<Clique>>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

fn invalid(msg: String) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg)
}

impl Clique {
    /// The communicator named `key`, created by its first rank.
    pub fn get(key: [u8; 16], nranks: usize, timeout: Duration) -> Result<Arc<Clique>> {
        let mut r = registry().lock();
        let c = r.entry(key).or_insert_with(|| {
            Arc::new(Clique {
                nranks,
                devices: Mutex::new(vec![None; nranks]),
                joined: Condvar::new(),
                gpus: OnceLock::new(),
                slots: Mutex::new(HashMap::new()),
                pairs: Mutex::new(HashMap::new()),
                done: Condvar::new(),
                posted: Mutex::new(HashMap::new()),
                posted_cv: Condvar::new(),
                timeout,
            })
        });
        if c.nranks != nranks {
            return Err(invalid(format!(
                "ncclCommInitRank: nranks {nranks}, but another rank of this id said {}",
                c.nranks
            )));
        }
        Ok(c.clone())
    }

    /// Forgets the id (after every rank joined: a later init with it starts a new clique).
    pub fn unregister(key: &[u8; 16]) {
        registry().lock().remove(key);
    }

    pub fn join(&self, rank: usize, device: i32) -> Result<()> {
        let mut d = self.devices.lock();
        match d.get_mut(rank) {
            None => Err(invalid(format!(
                "ncclCommInitRank: rank {rank} out of range for {} ranks",
                self.nranks
            ))),
            Some(Some(_)) => Err(invalid(format!(
                "ncclCommInitRank: rank {rank} joined twice"
            ))),
            Some(slot) => {
                *slot = Some(device);
                self.joined.notify_all();
                Ok(())
            }
        }
    }

    /// Waits until every rank joined, then opens the GPUs once (the first waiter does) with
    /// `cfg`: railcc's configuration (`RAILCC_*` and the NCCL variables that map to it) with
    /// the communicator's ncclConfig_t applied.
    pub fn open(&self, cfg: &railcc_core::Config) -> Result<&GpuComm> {
        let deadline = Instant::now() + self.timeout;
        let devices: Vec<i32> = {
            let mut d = self.devices.lock();
            while d.iter().any(Option::is_none) {
                if self.joined.wait_until(&mut d, deadline).timed_out() {
                    let missing: Vec<usize> =
                        (0..self.nranks).filter(|&r| d[r].is_none()).collect();
                    return Err(Error::new(
                        ErrorKind::Timeout,
                        format!(
                            "ncclCommInitRank: ranks {missing:?} never joined in this process within {:?} (railcc's libnccl runs every rank of a communicator in one process)",
                            self.timeout
                        ),
                    ));
                }
            }
            d.iter().flatten().copied().collect()
        };
        let open = || {
            let ordinals: Vec<usize> = devices.iter().map(|&d| d.max(0) as usize).collect();
            GpuComm::in_process(cfg, &ordinals)
        };
        match self.gpus.get_or_init(open) {
            Ok(g) => Ok(g),
            Err(e) => Err(e.clone()),
        }
    }

    /// The GPUs once opened.
    pub fn ready(&self) -> Result<&GpuComm> {
        match self.gpus.get() {
            Some(Ok(g)) => Ok(g),
            Some(Err(e)) => Err(e.clone()),
            None => Err(Error::new(
                ErrorKind::Aborted,
                "communicator not initialized",
            )),
        }
    }

    /// Rank `rank`'s `seq`-th collective call. The call that completes the slot launches.
    pub fn submit(&self, rank: usize, seq: u64, call: Call) -> Ticket {
        let mut slots = self.slots.lock();
        let slot = slots.entry(seq).or_default();
        if slot.calls.is_empty() {
            slot.calls = vec![None; self.nranks];
        }
        slot.calls[rank] = Some(call);
        if slot.calls.iter().all(Option::is_some) {
            let calls: Vec<Call> = slot.calls.iter().flatten().copied().collect();
            slot.result = Some(self.launch(&calls));
            self.done.notify_all();
        }
        Ticket::Coll(seq)
    }

    /// One side of the `seq`-th message from `src` to `dst` (`op.send`: which side); the side
    /// that completes the pair enqueues the copy.
    pub fn submit_p2p(&self, src: usize, dst: usize, seq: u64, op: P2pOp) -> Ticket {
        let mut pairs = self.pairs.lock();
        let p = pairs.entry((src, dst, seq)).or_default();
        if op.send {
            p.send = Some(op);
        } else {
            p.recv = Some(op);
        }
        if let (Some(s), Some(r)) = (p.send, p.recv) {
            p.result = Some(if s.bytes != r.bytes {
                Err(Error::new(
                    ErrorKind::Mismatch,
                    format!(
                        "send from rank {src} has {} bytes, the receive on rank {dst} expects {}",
                        s.bytes, r.bytes
                    ),
                ))
            } else {
                // SAFETY: NCCL's contract: device buffers of each rank's GPU with `bytes`, on
                // that rank's streams, live until the streams pass the message.
                self.ready().and_then(|g| unsafe { g.copy(src, &s, &r) })
            });
            self.done.notify_all();
        }
        Ticket::P2p(src, dst, seq)
    }

    /// Whether sends and receives go as batch kernels (`RAILCC_GPU_P2P_BATCH`; the GPUs are
    /// open).
    pub fn batches_p2p(&self) -> bool {
        self.ready()
            .ok()
            .and_then(|g| g.in_process_gpus())
            .is_some_and(|m| m.p2p_batch())
    }

    /// The sends and receives `ops` (rank, message number of its direction, op) of one
    /// thread's group, as batch kernels (`railcc_cuda::p2p_many`): every send posted here for
    /// its receiver; then, round by round (`p2p_rounds`), the round's sends marked ready per
    /// rank and stream and its receives pulled from their senders' buffers once posted
    /// (another thread's group may post them: waited for to the deadline); then every send
    /// waited for. With `RAILCC_GPU_P2P_BATCH=2`, a group of one round with at most MAX_MSGS
    /// receives per rank goes in one launch per rank and stream (`MultiGpu::fused`).
    /// A rank's ops on several streams run on its first stream, joined with the others
    /// before and after (the batch counts a rank's messages in order on one stream). A size
    /// that differs between the two sides breaks the communicator: the sender's mark is
    /// counted.
    pub fn batch_p2p(&self, ops: &[(usize, u64, P2pOp)]) -> Result<()> {
        let g = self.ready()?;
        let m = g
            .in_process_gpus()
            .ok_or_else(|| Error::new(ErrorKind::Unsupported, "send/recv batch without GPUs"))?;
        // A rank's ops on several streams run on its first one: it waits for the others
        // first, and they wait for it after (NCCL joins a group's streams too).
        let mut ops: Vec<(usize, u64, P2pOp)> = ops.to_vec();
        let mut joined: Vec<(usize, usize, usize)> = Vec::new(); // (rank, first, other)
        for i in 0..ops.len() {
            let (r, st) = (ops[i].0, ops[i].2.stream);
            let first = ops.iter().find(|o| o.0 == r).map_or(st, |o| o.2.stream);
            if st != first {
                if !joined.contains(&(r, first, st)) {
                    // SAFETY: both are the rank's streams (NCCL's contract).
                    unsafe { m.join(r, first, st) }?;
                    joined.push((r, first, st));
                }
                ops[i].2.stream = first;
            }
        }
        let ops = &ops[..];
        // Any failure leaves the two sides' counts apart (numbers taken, sends posted or
        // marked): the communicator breaks rather than pair later messages wrongly.
        // Per rank, a send of bytes an earlier receive of the group writes starts a round
        // (`p2p_rounds`); rounds run one after another on each rank's stream.
        let mut round = vec![0usize; ops.len()];
        let mut ranks: Vec<usize> = ops.iter().map(|o| o.0).collect();
        ranks.sort_unstable();
        ranks.dedup();
        for r in ranks {
            // A receive from the rank itself counts as written right after its send (the
            // k-th of each) and takes its round: in an earlier round it would wait for a send
            // its stream has not reached (an in-place gather's root receives its own block
            // before it sends it).
            let self_recv = |i: usize| ops[i].0 == r && ops[i].2.peer == r && !ops[i].2.send;
            let is_self_send = |i: usize| ops[i].0 == r && ops[i].2.peer == r && ops[i].2.send;
            let mut recvs = (0..ops.len()).filter(|&i| self_recv(i));
            let mut order: Vec<usize> = Vec::new();
            for i in (0..ops.len()).filter(|&i| ops[i].0 == r && !self_recv(i)) {
                order.push(i);
                if is_self_send(i) {
                    order.extend(recvs.next());
                }
            }
            order.extend(recvs); // receives from itself without a send: refused when paired
            let of_rank = railcc_core::call::p2p_rounds(
                order
                    .iter()
                    .map(|&i| (ops[i].2.send, ops[i].2.ptr, ops[i].2.bytes)),
            );
            for (&i, k) in order.iter().zip(of_rank) {
                round[i] = k;
            }
        }
        let rounds = round.iter().max().map_or(0, |&k| k + 1);
        type PerPeer = [u32; railcc_cuda::kernels::MAX_PEERS];
        let count_in = |v: &mut Vec<(usize, usize, PerPeer)>, r: usize, op: &P2pOp| match v
            .iter_mut()
            .find(|x| x.0 == r && x.1 == op.stream)
        {
            Some(x) => x.2[op.peer] += 1,
            None => {
                let mut c = [0; railcc_cuda::kernels::MAX_PEERS];
                c[op.peer] = 1;
                v.push((r, op.stream, c));
            }
        };
        let run = || -> Result<()> {
            // Every send posted first, whatever its round: a receive of this or another
            // thread's group only needs the sender's buffer on the host side.
            let mut sends: Vec<(usize, usize, PerPeer)> = Vec::new();
            {
                let mut posted = self.posted.lock();
                for (r, seq, op) in ops.iter().filter(|o| o.2.send) {
                    if op.peer >= self.nranks {
                        return Err(invalid(format!(
                            "ncclSend: peer {} out of range for {} ranks",
                            op.peer, self.nranks
                        )));
                    }
                    posted.insert((*r, op.peer, *seq), *op);
                    count_in(&mut sends, *r, op);
                }
                self.posted_cv.notify_all();
            }
            let deadline = Instant::now() + self.timeout;
            for k in 0..rounds {
                let mut ready: Vec<(usize, usize, PerPeer)> = Vec::new();
                for (i, (r, _, op)) in ops.iter().enumerate() {
                    if op.send && round[i] == k {
                        count_in(&mut ready, *r, op);
                    }
                }
                let mut recvs: Vec<(usize, usize, Vec<railcc_cuda::p2p_many::RecvMsg>)> =
                    Vec::new();
                for (i, (r, seq, op)) in ops.iter().enumerate() {
                    if op.send || round[i] != k {
                        continue;
                    }
                    let msg = self.posted_send(*r, *seq, op, deadline)?;
                    match recvs.iter_mut().find(|x| x.0 == *r && x.1 == op.stream) {
                        Some(x) => x.2.push(msg),
                        None => recvs.push((*r, op.stream, vec![msg])),
                    }
                }
                // RAILCC_GPU_P2P_BATCH=2: a group of one round, at most MAX_MSGS receives per
                // rank, outside capture, goes in one launch per rank and stream (marks,
                // receives, waits; the launch counts its blocks in the area, which a graph
                // replayed beside another launch would share).
                let fits = |v: &Vec<railcc_cuda::p2p_many::RecvMsg>| {
                    v.len() <= railcc_cuda::p2p_many::MAX_MSGS
                };
                if rounds == 1 && m.p2p_fused() && recvs.iter().all(|x| fits(&x.2)) {
                    // After the joins each rank has one stream: the keys are the group's ranks.
                    let mut keys: Vec<(usize, usize)> =
                        ops.iter().map(|o| (o.0, o.2.stream)).collect();
                    keys.sort_unstable();
                    keys.dedup();
                    let mut capturing = false;
                    for &(r, st) in &keys {
                        // SAFETY: the rank's stream (NCCL's contract).
                        capturing |= unsafe { m.capturing(r, st) }?;
                    }
                    if !capturing {
                        for (r, st) in keys {
                            let c = sends
                                .iter()
                                .find(|x| x.0 == r && x.1 == st)
                                .map_or([0; railcc_cuda::kernels::MAX_PEERS], |x| x.2);
                            let msgs = recvs
                                .iter()
                                .find(|x| x.0 == r && x.1 == st)
                                .map_or(&[][..], |x| &x.2[..]);
                            // SAFETY: as for ready_many and recv_many below.
                            unsafe { m.fused(r, st, msgs, (&c, &c)) }?;
                        }
                        return Ok(());
                    }
                }
                for (r, st, c) in &ready {
                    // SAFETY: NCCL's contract: the rank's stream, its send buffers written
                    // before it (or by this group's earlier rounds).
                    unsafe { m.ready_many(*r, *st, c) }?;
                }
                for (r, st, msgs) in &recvs {
                    // SAFETY: NCCL's contract: both sides' buffers are device memory of their
                    // GPUs, live until the streams pass the messages; peer access is enabled.
                    unsafe { m.recv_many(*r, *st, msgs) }?;
                }
            }
            for (r, st, c) in &sends {
                // SAFETY: the rank's stream.
                unsafe { m.wait_copied_many(*r, *st, c) }?;
            }
            Ok(())
        };
        run().inspect_err(|_| m.abort())?;
        for &(r, first, other) in &joined {
            // SAFETY: as above.
            unsafe { m.join(r, other, first) }?;
        }
        Ok(())
    }

    /// The receive `op` of rank `r` (message `seq` from its peer) as a batch message: the
    /// sender's posted buffer, waited for to `deadline` (another thread's group may post it).
    fn posted_send(
        &self,
        r: usize,
        seq: u64,
        op: &P2pOp,
        deadline: Instant,
    ) -> Result<railcc_cuda::p2p_many::RecvMsg> {
        let from = op.peer;
        let sent = {
            let mut posted = self.posted.lock();
            loop {
                if let Some(s) = posted.remove(&(from, r, seq)) {
                    break s;
                }
                if self.posted_cv.wait_until(&mut posted, deadline).timed_out() {
                    return Err(Error::new(
                        ErrorKind::Timeout,
                        format!(
                            "message {seq} from rank {from} to rank {r}: the send was not posted within {:?}",
                            self.timeout
                        ),
                    ));
                }
            }
        };
        if sent.bytes != op.bytes {
            return Err(Error::new(
                ErrorKind::Mismatch,
                format!(
                    "send from rank {from} has {} bytes, the receive on rank {r} expects {}",
                    sent.bytes, op.bytes
                ),
            ));
        }
        Ok(railcc_cuda::p2p_many::RecvMsg {
            src: sent.ptr,
            dst: op.ptr,
            bytes: op.bytes as u64,
            peer: from,
        })
    }

    /// Waits for a submitted call's launch and returns its result (each participant collects it
    /// once; the last one frees the slot).
    pub fn wait(&self, t: Ticket) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        match t {
            Ticket::Coll(seq) => {
                let mut slots = self.slots.lock();
                loop {
                    let slot = slots.entry(seq).or_default();
                    if let Some(r) = slot.result.clone() {
                        slot.collected += 1;
                        if slot.collected == self.nranks {
                            slots.remove(&seq);
                        }
                        return r;
                    }
                    if self.done.wait_until(&mut slots, deadline).timed_out() {
                        let missing = slots.get(&seq).map_or(Vec::new(), |s| {
                            (0..self.nranks)
                                .filter(|&r| s.calls.get(r).is_none_or(Option::is_none))
                                .collect()
                        });
                        return Err(Error::new(
                            ErrorKind::Timeout,
                            format!(
                                "collective call {seq}: ranks {missing:?} did not make it within {:?} (several ranks driven from one thread need ncclGroupStart/End)",
                                self.timeout
                            ),
                        ));
                    }
                }
            }
            Ticket::P2p(src, dst, seq) => {
                let mut pairs = self.pairs.lock();
                loop {
                    let p = pairs.entry((src, dst, seq)).or_default();
                    if let Some(r) = p.result.clone() {
                        p.collected += 1;
                        if p.collected == 2 {
                            pairs.remove(&(src, dst, seq));
                        }
                        return r;
                    }
                    if self.done.wait_until(&mut pairs, deadline).timed_out() {
                        return Err(Error::new(
                            ErrorKind::Timeout,
                            format!(
                                "message {seq} from rank {src} to rank {dst}: the other side was not posted within {:?}",
                                self.timeout
                            ),
                        ));
                    }
                }
            }
            Ticket::Done(r) => r,
        }
    }

    fn launch(&self, calls: &[Call]) -> Result<()> {
        let c0 = calls[0].args;
        for (r, c) in calls.iter().enumerate().map(|(r, c)| (r, c.args)) {
            if c != c0 {
                return Err(Error::new(
                    ErrorKind::Mismatch,
                    format!(
                        "rank 0 called {} of {} x {:?} (op {:?}, root {}), rank {r} called {} of {} x {:?} (op {:?}, root {})",
                        c0.coll.name(), c0.count, c0.dtype, c0.op, c0.root,
                        c.coll.name(), c.count, c.dtype, c.op, c.root
                    ),
                ));
            }
        }
        // SAFETY: the buffers and streams are the callers' (NCCL's contract: device memory of
        // each rank's GPU, large enough for the call, live until the streams pass it).
        unsafe { self.ready()?.collective(calls) }.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use railcc_core::call::{CollArgs, CollKind};
    use railcc_core::{DataType, ReduceOp};

    fn call(count: usize) -> Call {
        Call {
            args: CollArgs {
                coll: CollKind::AllReduce,
                nranks: 2,
                count,
                dtype: DataType::F32,
                op: ReduceOp::Sum,
                root: 0,
            },
            send: 0x1000,
            recv: 0x2000,
            stream: 0,
        }
    }

    #[test]
    fn ranks_that_disagree_all_get_the_mismatch() {
        let c = Clique::get([1; 16], 2, Duration::from_secs(5)).unwrap();
        let t0 = c.submit(0, 0, call(10));
        let t1 = c.submit(1, 0, call(11));
        for t in [t0, t1] {
            let e = c.wait(t).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Mismatch);
            assert!(
                e.to_string().contains("rank 1 called all_reduce of 11"),
                "{e}"
            );
        }
        Clique::unregister(&[1; 16]);
    }

    #[test]
    fn a_rank_that_never_calls_is_named_after_the_deadline() {
        let c = Clique::get([2; 16], 3, Duration::from_millis(100)).unwrap();
        let t = c.submit(0, 0, call(4));
        let _ = c.submit(2, 0, call(4));
        let e = c.wait(t).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Timeout);
        assert!(e.to_string().contains("ranks [1]"), "{e}");
        Clique::unregister(&[2; 16]);
    }

    #[test]
    fn joining_checks_ranks_and_counts() {
        let c = Clique::get([3; 16], 2, Duration::from_millis(50)).unwrap();
        assert!(Clique::get([3; 16], 3, Duration::from_millis(50)).is_err());
        c.join(0, 0).unwrap();
        assert!(c.join(0, 1).is_err());
        assert!(c.join(2, 0).is_err());
        // Rank 1 never joins: ready names it.
        let e = c.open(&railcc_core::Config::default()).err().unwrap();
        assert!(e.to_string().contains("ranks [1] never joined"), "{e}");
        Clique::unregister(&[3; 16]);
    }

    #[test]
    fn sends_and_receives_of_different_sizes_are_refused_on_both_sides() {
        let c = Clique::get([4; 16], 2, Duration::from_secs(5)).unwrap();
        let h = |send, bytes| P2pOp {
            peer: if send { 1 } else { 0 },
            send,
            ptr: 0x1000,
            bytes,
            stream: 0,
        };
        let s = c.submit_p2p(0, 1, 0, h(true, 8));
        let r = c.submit_p2p(0, 1, 0, h(false, 16));
        for t in [s, r] {
            assert_eq!(c.wait(t).unwrap_err().kind, ErrorKind::Mismatch);
        }
        Clique::unregister(&[4; 16]);
    }
}
