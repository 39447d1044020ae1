//! The sweep: for each dtype, op and size, check once, warm up, time `iters` calls, for the
//! out-of-place and in-place forms; average times and sum `#wrong` over ranks.

use crate::args::BenchArgs;
use crate::report::{Report, Row, Timing};
use railcc_collectives::plan::CollArgs;
use railcc_collectives::precision::{count_wrong, fill_input};
use railcc_collectives::sim::Mem;
use railcc_collectives::{Bufs, CollKind, Communicator, DataType, ReduceOp, RegionId};
use std::time::Instant;

const SEED: u64 = 0x5eed;
/// Bytes past each receive buffer that must stay untouched (nccl-tests' out-of-bounds check).
const GUARD: usize = 64;
const GUARD_BYTE: u8 = 0xC3;

fn dtypes(s: &str) -> Result<Vec<DataType>, String> {
    if s == "all" {
        return Ok(DataType::ALL.to_vec());
    }
    s.split(',').map(|x| x.parse::<DataType>()).collect()
}

fn ops(s: &str, coll: CollKind) -> Result<Vec<ReduceOp>, String> {
    if !matches!(
        coll,
        CollKind::AllReduce | CollKind::ReduceScatter | CollKind::Reduce
    ) {
        return Ok(vec![ReduceOp::Sum]);
    }
    if s == "all" {
        return Ok(ReduceOp::ALL.to_vec());
    }
    s.split(',').map(|x| x.parse::<ReduceOp>()).collect()
}

fn sizes(a: &BenchArgs) -> Result<Vec<u64>, String> {
    if a.min_bytes > a.max_bytes {
        return Err(format!(
            "-b {} is larger than -e {}",
            a.min_bytes, a.max_bytes
        ));
    }
    let mut v = Vec::new();
    let mut s = a.min_bytes;
    loop {
        v.push(s);
        let next = match a.step_bytes {
            Some(i) if i > 0 => s.saturating_add(i),
            Some(_) => return Err("-i must be positive".into()),
            None if a.step_factor > 1 => s.saturating_mul(a.step_factor),
            None => return Err("-f must be at least 2".into()),
        };
        if next > a.max_bytes || next == s || v.len() > 4096 {
            break;
        }
        s = next.max(1);
    }
    Ok(v)
}

/// Per-rank element count (NCCL's `count` argument) and total bytes for a requested size.
pub fn shape(coll: CollKind, size: u64, es: usize, p: usize) -> (usize, u64) {
    let elems = (size as usize) / es;
    match coll {
        CollKind::AllGather | CollKind::ReduceScatter | CollKind::AllToAll => {
            let c = elems / p;
            (c, (c * p * es) as u64)
        }
        _ => (elems, (elems * es) as u64),
    }
}

pub fn run_rank(comm: &Communicator, a: &BenchArgs) -> Result<(), String> {
    if a.device == "cuda" {
        return crate::gpu::run_rank(comm, a);
    }
    let coll = a.collective.kind();
    let p = comm.nranks();
    if a.root >= p && matches!(coll, CollKind::Broadcast | CollKind::Reduce) {
        return Err(format!("-r {}: root out of range for {p} ranks", a.root));
    }
    let dts = dtypes(&a.dtype)?;
    let opl = ops(&a.op, coll)?;
    let szs = sizes(a)?;
    let mut report = Report::new(comm, a, coll);
    report.header();
    let total = (dts.len() * opl.len() * szs.len()) as u64;
    report.start_progress(total);
    for &dt in &dts {
        for &op in &opl {
            for &size in &szs {
                let (count, bytes) = shape(coll, size, dt.size(), p);
                let args = CollArgs {
                    coll,
                    nranks: p,
                    count,
                    dtype: dt,
                    op,
                    root: a.root,
                };
                let oop = measure(comm, &args, a, false).map_err(|e| e.to_string())?;
                let ip = measure(comm, &args, a, true).map_err(|e| e.to_string())?;
                report.row(Row {
                    bytes,
                    args,
                    algo: comm.algo_for(&args).name(),
                    oop,
                    ip,
                })?;
            }
        }
    }
    report.finish()
}

/// One form (out-of-place or in-place) of one size: check, warm up, time, then agree across
/// ranks on the average time, the wrong count and the out-of-bounds count.
fn measure(
    comm: &Communicator,
    a: &CollArgs,
    b: &BenchArgs,
    in_place: bool,
) -> railcc_collectives::Result<Timing> {
    let es = a.dtype.size();
    let rank = comm.rank();
    let input = fill_input(b.fill, a, rank, SEED);
    let recv_bytes = a.recv_elems() * es;
    // Receive memory starts as a pattern (so unwritten output shows) followed by a guard.
    let body = if in_place {
        a.in_place_backing(rank, &input, &vec![0x5A; recv_bytes])
    } else {
        vec![0x5A; recv_bytes]
    };
    let send = Mem::from_bytes(if in_place { &[] } else { &input });
    let mut recv = Mem::zeroed(body.len() + GUARD);
    recv.bytes_mut()[..body.len()].copy_from_slice(&body);
    recv.bytes_mut()[body.len()..].fill(GUARD_BYTE);
    let _regs = Registered::new(comm, b.register != 0, &[send.bytes(), recv.bytes()])?;
    let call = |send: &Mem, recv: &mut Mem| {
        let n = recv.bytes().len() - GUARD;
        let r = &mut recv.bytes_mut()[..n];
        let bufs = if in_place {
            Bufs::InPlace(r)
        } else {
            Bufs::OutOfPlace {
                send: send.bytes(),
                recv: r,
            }
        };
        comm.collective(*a, bufs)
    };
    let mut wrong = 0u64;
    if b.check != 0 {
        call(&send, &mut recv)?;
        let out = &recv.bytes()[a.recv_range(rank, in_place)];
        wrong = count_wrong(b.fill, a, rank, out, SEED);
    }
    let n = recv.bytes().len();
    let oob = recv.bytes()[n - GUARD..]
        .iter()
        .filter(|x| **x != GUARD_BYTE)
        .count() as u64;
    for _ in 0..b.warmup {
        call(&send, &mut recv)?;
    }
    comm.barrier()?;
    let t0 = Instant::now();
    for _ in 0..b.iters {
        call(&send, &mut recv)?;
    }
    let secs = t0.elapsed().as_secs_f64() / b.iters.max(1) as f64;
    let mine = [secs, wrong as f64, oob as f64];
    let mut sum = [0f64; 3];
    comm.all_reduce(&mine, &mut sum, ReduceOp::Sum)?;
    Ok(Timing {
        secs: sum[0] / comm.nranks() as f64,
        wrong: (b.check != 0).then_some(sum[1] as u64),
        oob: sum[2] as u64,
    })
}

/// The bench's buffers registered with the communicator for one measurement.
struct Registered<'c> {
    comm: &'c Communicator,
    ids: Vec<RegionId>,
}

impl<'c> Registered<'c> {
    fn new(
        comm: &'c Communicator,
        on: bool,
        bufs: &[&[u8]],
    ) -> railcc_collectives::Result<Registered<'c>> {
        let mut r = Registered {
            comm,
            ids: Vec::new(),
        };
        for b in bufs.iter().filter(|b| on && !b.is_empty()) {
            // SAFETY: `measure` drops this guard, deregistering, before it frees the buffers
            // (it is declared after them), and never reallocates them in between.
            r.ids.push(unsafe { comm.register(b.as_ptr(), b.len()) }?);
        }
        Ok(r)
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            if let Err(e) = self.comm.deregister(id) {
                tracing::warn!("bench: deregister: {e}");
            }
        }
    }
}
