//! The simulator: runs the plans of all ranks in memory and returns every rank's output.
//!
//! It is stricter than a real transport: a send is read when the receiver consumes it, not
//! when it is posted, and it completes only then. A plan that overwrites a region while a send
//! from it is still pending therefore produces wrong data here, and the reference catches it.
//! Ranks are swept in a seeded order so property tests explore different interleavings.

use crate::plan::{Algo, Buf, CollArgs, Op, Plan, PlanOpts, Slice};
use crate::reduce::{divide_raw, reduce_raw, reduce_slots_raw};
use std::collections::{HashMap, VecDeque};

/// A byte buffer aligned for every dtype.
#[derive(Clone)]
pub struct Mem(Vec<u64>, usize);

impl Mem {
    pub fn zeroed(bytes: usize) -> Mem {
        Mem(vec![0u64; bytes.div_ceil(8)], bytes)
    }
    pub fn from_bytes(b: &[u8]) -> Mem {
        let mut m = Mem::zeroed(b.len());
        m.bytes_mut().copy_from_slice(b);
        m
    }
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.0)[..self.1]
    }
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.1;
        &mut bytemuck::cast_slice_mut(&mut self.0)[..n]
    }
}

struct RankMem {
    send: Mem,
    recv: Mem,
    scratch: Mem,
    in_place: Option<(usize, usize)>, // byte offsets of send and recv inside `recv`
}

impl RankMem {
    /// Byte range of a slice: (is_recv_backing, buffer, offset, length), bounds-checked.
    fn locate(&mut self, s: &Slice, es: usize) -> Result<(*mut u8, usize), String> {
        let (off, len) = (s.off * es, s.len * es);
        let (mem, base) = match (s.buf, self.in_place) {
            (Buf::Send, Some((so, _))) => (&mut self.recv, so),
            (Buf::Recv, Some((_, ro))) => (&mut self.recv, ro),
            (Buf::Send, None) => (&mut self.send, 0),
            (Buf::Recv, None) => (&mut self.recv, 0),
            (Buf::Scratch, _) => (&mut self.scratch, 0),
            (Buf::User(_), _) => return Err("simulator does not run grouped plans".into()),
        };
        let start = base + off;
        let bytes = mem.bytes_mut();
        if start + len > bytes.len() {
            return Err(format!(
                "slice {s:?} exceeds its buffer of {} bytes",
                bytes.len()
            ));
        }
        // SAFETY: `start + len` is within the buffer, checked above.
        Ok((unsafe { bytes.as_mut_ptr().add(start) }, len))
    }
}

#[derive(Clone, Copy, PartialEq)]
enum State {
    Waiting,
    Posted,
    Done,
}

/// Runs every rank's plan. `inputs[r]` fills rank r's send buffer; `prior[r]` its receive
/// buffer. Returns each rank's receive buffer afterwards.
pub fn run(
    a: &CollArgs,
    algo: Algo,
    o: &PlanOpts,
    inputs: &[Vec<u8>],
    prior: &[Vec<u8>],
    seed: u64,
) -> Result<Vec<Vec<u8>>, String> {
    let identity: Vec<usize> = (0..a.nranks).collect();
    run_ordered(a, algo, o, inputs, prior, seed, &identity)
}

/// As [`run`], with rings through ranks in `order` ([`crate::plan::build_ordered`]).
pub fn run_ordered(
    a: &CollArgs,
    algo: Algo,
    o: &PlanOpts,
    inputs: &[Vec<u8>],
    prior: &[Vec<u8>],
    seed: u64,
    order: &[usize],
) -> Result<Vec<Vec<u8>>, String> {
    let p = a.nranks;
    let es = a.dtype.size();
    let plans: Vec<Plan> = (0..p)
        .map(|r| crate::plan::build_ordered(a, r, algo, o, order))
        .collect();
    let mut mems: Vec<RankMem> = (0..p)
        .map(|r| {
            let scratch = Mem::zeroed(plans[r].scratch_elems * es);
            if o.in_place {
                let (send, recv, _) = a.in_place_ranges(r);
                RankMem {
                    send: Mem::zeroed(0),
                    recv: Mem::from_bytes(&a.in_place_backing(r, &inputs[r], &prior[r])),
                    scratch,
                    in_place: Some((send.start, recv.start)),
                }
            } else {
                RankMem {
                    send: Mem::from_bytes(&inputs[r]),
                    recv: Mem::from_bytes(&prior[r]),
                    scratch,
                    in_place: None,
                }
            }
        })
        .collect();
    let mut state: Vec<Vec<State>> = plans
        .iter()
        .map(|pl| vec![State::Waiting; pl.steps.len()])
        .collect();
    // Per (rank, peer): index into the plan of the next send/recv allowed to proceed.
    let mut order_send: Vec<HashMap<usize, VecDeque<usize>>> = Vec::new();
    let mut order_recv: Vec<HashMap<usize, VecDeque<usize>>> = Vec::new();
    for pl in &plans {
        let (mut s, mut r) = (
            HashMap::<usize, VecDeque<usize>>::new(),
            HashMap::<usize, VecDeque<usize>>::new(),
        );
        for (i, st) in pl.steps.iter().enumerate() {
            match st.op {
                Op::Send { peer, .. } => s.entry(peer).or_default().push_back(i),
                Op::Recv { peer, .. } => r.entry(peer).or_default().push_back(i),
                _ => {}
            }
        }
        order_send.push(s);
        order_recv.push(r);
    }
    let mut wires: HashMap<(usize, usize), VecDeque<(usize, usize)>> = HashMap::new(); // (from,to) -> (step, seq)
    let mut order: Vec<usize> = (0..p).collect();
    let mut rng = seed | 1;
    let mut lo = vec![0usize; p]; // first step of each rank not yet done
    let mut remaining: usize = plans.iter().map(|pl| pl.steps.len()).sum();
    while remaining > 0 {
        let mut progressed = false;
        // xorshift shuffle of the sweep order
        for i in (1..p).rev() {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            order.swap(i, (rng % (i as u64 + 1)) as usize);
        }
        for &r in &order {
            while lo[r] < state[r].len() && state[r][lo[r]] == State::Done {
                lo[r] += 1;
            }
            for i in lo[r]..plans[r].steps.len() {
                if state[r][i] != State::Waiting {
                    continue;
                }
                let step = &plans[r].steps[i];
                if !step.deps.iter().all(|d| state[r][*d] == State::Done) {
                    continue;
                }
                match &step.op {
                    Op::Send { peer, src } => {
                        if order_send[r].get(peer).and_then(|q| q.front()) != Some(&i) {
                            continue;
                        }
                        if *peer >= p || *peer == r {
                            return Err(format!("rank {r} step {i}: bad peer {peer}"));
                        }
                        mems[r].locate(src, es)?;
                        order_send[r].get_mut(peer).map(|q| q.pop_front());
                        wires.entry((r, *peer)).or_default().push_back((i, 0));
                        state[r][i] = State::Posted;
                    }
                    Op::Recv { peer, dst } => {
                        if order_recv[r].get(peer).and_then(|q| q.front()) != Some(&i) {
                            continue;
                        }
                        let Some(&(si, _)) = wires.get(&(*peer, r)).and_then(|w| w.front()) else {
                            continue;
                        };
                        let Op::Send { src, .. } = &plans[*peer].steps[si].op else {
                            return Err("wire holds a non-send".into());
                        };
                        if src.len != dst.len {
                            return Err(format!("rank {r} step {i}: receives {} elements, rank {peer} step {si} sends {}", dst.len, src.len));
                        }
                        let (sp, n) = mems[*peer].locate(src, es)?;
                        let data = {
                            // SAFETY: locate() bounds-checked `sp..sp+n` inside the peer's memory.
                            unsafe { std::slice::from_raw_parts(sp, n) }.to_vec()
                        };
                        let (dp, _) = mems[r].locate(dst, es)?;
                        // SAFETY: locate() bounds-checked the destination; `data` is a private copy.
                        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dp, n) };
                        wires.get_mut(&(*peer, r)).map(|w| w.pop_front());
                        order_recv[r].get_mut(peer).map(|q| q.pop_front());
                        state[*peer][si] = State::Done;
                        state[r][i] = State::Done;
                        remaining -= 2;
                    }
                    Op::Reduce { dst, a: x, b: y } => {
                        let (d, n) = mems[r].locate(dst, es)?;
                        let (xp, xn) = mems[r].locate(x, es)?;
                        let (yp, yn) = mems[r].locate(y, es)?;
                        if xn != n || yn != n {
                            return Err(format!("rank {r} step {i}: reduce of unequal slices"));
                        }
                        for (q, qn) in [(xp, xn), (yp, yn)] {
                            let overlap =
                                (d as usize) < q as usize + qn && (q as usize) < d as usize + n;
                            if overlap && d != q {
                                return Err(format!(
                                    "rank {r} step {i}: reduce output partially overlaps an input"
                                ));
                            }
                        }
                        // SAFETY: all three bounds-checked; overlap is exact or none (checked).
                        unsafe { reduce_raw(a.dtype, a.op, d, xp, yp, n / es) };
                        state[r][i] = State::Done;
                        remaining -= 1;
                    }
                    Op::ReduceSlots { dst, src, slots } => {
                        let (d, n) = mems[r].locate(dst, es)?;
                        let (s, sn) = mems[r].locate(&src.spanning(*slots), es)?;
                        let overlap =
                            (d as usize) < s as usize + sn && (s as usize) < d as usize + n;
                        if *slots == 0 || sn != n * slots || overlap {
                            return Err(format!(
                                "rank {r} step {i}: reduce of {slots} slots of {sn} bytes into {n} bytes, or overlapping it"
                            ));
                        }
                        // SAFETY: both bounds-checked, no overlap (checked).
                        unsafe { reduce_slots_raw(a.dtype, a.op, d, s, n / es, *slots) };
                        state[r][i] = State::Done;
                        remaining -= 1;
                    }
                    Op::Copy { dst, src } => {
                        let (d, n) = mems[r].locate(dst, es)?;
                        let (s, sn) = mems[r].locate(src, es)?;
                        if sn != n {
                            return Err(format!("rank {r} step {i}: copy of unequal slices"));
                        }
                        // SAFETY: both bounds-checked; `copy` tolerates overlap.
                        unsafe { std::ptr::copy(s, d, n) };
                        state[r][i] = State::Done;
                        remaining -= 1;
                    }
                    Op::Divide { buf } => {
                        let (d, n) = mems[r].locate(buf, es)?;
                        // SAFETY: bounds-checked above.
                        unsafe { divide_raw(a.dtype, d, n / es, p) };
                        state[r][i] = State::Done;
                        remaining -= 1;
                    }
                }
                progressed = true;
            }
        }
        if !progressed {
            let stuck: Vec<String> = (0..p)
                .filter_map(|r| {
                    state[r]
                        .iter()
                        .position(|s| *s != State::Done)
                        .map(|i| format!("rank {r} at step {i} {:?}", plans[r].steps[i].op))
                })
                .collect();
            return Err(format!("plans deadlock: {}", stuck.join("; ")));
        }
    }
    if wires.values().any(|w| !w.is_empty()) {
        return Err("messages left unreceived".into());
    }
    let recv_bytes = a.recv_elems() * es;
    Ok(mems
        .into_iter()
        .map(|m| match m.in_place {
            Some((_, ro)) => m.recv.bytes()[ro..ro + recv_bytes].to_vec(),
            None => m.recv.bytes().to_vec(),
        })
        .collect())
}
