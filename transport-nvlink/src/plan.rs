//! From a collective to kernel launches, the same for one process driving every GPU and for
//! one process per GPU (they differ only in where the peers' addresses come from):
//! - [`choose`]: the one place that picks the kernel (low-latency, push, bulk, or the copy
//!   engines between barrier kernels) and its thread blocks per GPU for a call;
//! - [`spec`]: which inputs, outputs and element range GPU g's bulk kernel gets;
//! - [`enqueue`]: GPU g's launch on the caller's stream. The kernels themselves are the CUDA
//!   layer's (`railcc_cuda::launch`, `railcc_cuda::ll`, `railcc_cuda::push`,
//!   `railcc_cuda::copies`).

use railcc_core::call::{CollArgs, CollKind};
use railcc_core::{DataType, Error, ErrorKind, Result};
use railcc_cuda::gpu::{GpuCtx, Stream};
use railcc_cuda::kernels::{MAX_BLOCKS, MAX_PEERS};
use railcc_cuda::launch::{launch, CallShape, Spec, THREADS};
use railcc_cuda::{ll, push};

/// What one call launched.
#[derive(Debug, Clone, Copy)]
pub struct Launch {
    pub blocks_per_gpu: u32,
    pub threads_per_block: u32,
}

/// Which kernel runs a call, with its thread blocks per GPU (every GPU of a call launches the
/// same count: the barriers count the peers' blocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// The low-latency all-reduce: flagged lines pushed into every peer's scratch, one
    /// exchange, no barrier.
    Ll { blocks: u32 },
    /// The bulk kernel: "ready" barrier, each GPU's part over peer memory, "done" barrier;
    /// `wide`: its loop that loads every input at once; `tma` (1, 2): its inputs (and 2: its
    /// outputs) moved by bulk async copies where the GPU and the addresses allow
    /// (`railcc_cuda::tma`).
    Bulk { blocks: u32, wide: bool, tma: u8 },
    /// The push all-reduce (`railcc_cuda::push`): NVLink writes only, through `slot`-byte
    /// scratch slots.
    Push { blocks: u32, slot: usize },
    /// The all-gather on the copy engines (`railcc_cuda::copies`): one block for the
    /// barriers around the copies.
    CopyGather,
    /// The all-reduce as the bulk kernel into each GPU's own output (its segment), then that
    /// segment spread to the peers' outputs on the copy engines.
    CopyAllReduce { blocks: u32, wide: bool, tma: u8 },
}

impl Kernel {
    pub fn blocks(self) -> u32 {
        match self {
            Kernel::Ll { blocks }
            | Kernel::Bulk { blocks, .. }
            | Kernel::Push { blocks, .. }
            | Kernel::CopyAllReduce { blocks, .. } => blocks,
            Kernel::CopyGather => railcc_cuda::copies::BARRIER_BLOCKS,
        }
    }

    /// What a GPU's part launches: its blocks and their threads.
    pub fn launch(self) -> Launch {
        let threads_per_block = match self {
            Kernel::Ll { .. } => ll::THREADS,
            Kernel::CopyGather => railcc_cuda::copies::BARRIER_THREADS,
            Kernel::Bulk { .. } | Kernel::Push { .. } | Kernel::CopyAllReduce { .. } => THREADS,
        };
        Launch {
            blocks_per_gpu: self.blocks(),
            threads_per_block,
        }
    }

    /// How many separate launches and copies a GPU's part enqueues: a failure after the
    /// first leaves work on the stream that waits for peers.
    pub fn steps(self) -> u32 {
        match self {
            Kernel::Ll { .. } | Kernel::Bulk { .. } | Kernel::Push { .. } => 1,
            Kernel::CopyGather | Kernel::CopyAllReduce { .. } => 2,
        }
    }
}

/// How a communicator's calls pick their kernel: each setting must be the same on every
/// rank (one process per GPU agrees on the least at init), as the kernels count each
/// other's launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Choice {
    /// All-reduces up to this many bytes per rank take the low-latency kernel.
    pub ll_max_bytes: usize,
    /// The bulk kernel's wide loop.
    pub wide: bool,
    /// ... and its TMA form, 0-2 (the same barriers and parts, so ranks need not agree on it).
    pub tma: u8,
    /// All-reduces of at least this many bytes per rank take the push kernel (0: never).
    pub push_bytes: usize,
    /// ... where the communicator may use at least this many blocks ([`PUSH_MIN_BLOCKS`] by
    /// default), in tiles of at most `push_slot` bytes.
    pub push_min_blocks: u32,
    pub push_slot: usize,
    /// All-gathers of at least this many bytes per rank on the copy engines (0: never).
    pub ag_copy_bytes: usize,
    /// All-reduces of at least this many bytes per rank spread on the copy engines (0: never).
    pub ar_copy_bytes: usize,
    /// Thread blocks per GPU: at least (NCCL's minCTAs), at most (fixed at init).
    pub min_blocks: u32,
    pub max_blocks: u32,
}

impl Choice {
    /// This choice for calls with late arguments (`proc/late.rs`): only kernels that can take
    /// their peers' addresses after they are enqueued, the bulk kernel and, with `push` (every
    /// rank's `RAILCC_GPU_LATE_ARGS=2`), the push kernel; not the copy engines or the TMA
    /// form. Every rank derives the same from the same agreed inputs.
    pub fn for_late_args(self, push: bool) -> Choice {
        Choice {
            tma: 0,
            push_bytes: if push { self.push_bytes } else { 0 },
            ag_copy_bytes: 0,
            ar_copy_bytes: 0,
            ..self
        }
    }
}

/// The kernel and block count for call `a`: the low-latency kernel for all-reduces up to
/// `ll_max_bytes` per rank (`RAILCC_GPU_LL_MAX_BYTES`, at most what its scratch holds), else
/// the copy engines for all-gathers of at least `ag_copy_bytes` per rank, else
/// the push kernel for all-reduces of at least `push_bytes` per rank on at least
/// [`PUSH_MIN_GPUS`] GPUs where the communicator has at least `push_min_blocks` (it takes at
/// most `railcc_cuda::push::MAX_BLOCKS`), else (fewer blocks) the bulk kernel into each GPU's
/// own output and the copy engines for all-reduces of at least `ar_copy_bytes` on as many
/// GPUs, else the bulk kernel; blocks by the work (the all-gather on the copy engines: one, for
/// its barriers), at least
/// `min_blocks` (NCCL's minCTAs) and at most `max_blocks` (the communicator's, fixed at init
/// from `RAILCC_GPU_MAX_BLOCKS` or maxCTAs and what stays resident). It depends only on the
/// call's shape, so every rank chooses the same.
pub fn choose(a: &CollArgs, c: &Choice) -> Kernel {
    let Choice {
        ll_max_bytes,
        wide,
        tma,
        min_blocks,
        max_blocks,
        ..
    } = *c;
    let nbytes = a.count * a.dtype.size();
    let floor = |b: u32| b.max(min_blocks.min(max_blocks));
    if ll::takes(a.coll, nbytes, ll_max_bytes) {
        Kernel::Ll {
            blocks: floor(ll::blocks(nbytes, max_blocks)),
        }
    } else if a.coll == CollKind::AllGather
        && a.nranks > 1
        && c.ag_copy_bytes > 0
        && nbytes >= c.ag_copy_bytes
    {
        Kernel::CopyGather
    } else if pushed(a, c) {
        let most = max_blocks.min(push::MAX_BLOCKS);
        let (b, slot) = push::shape(a.nranks, a.count, a.dtype, most, c.push_slot);
        Kernel::Push {
            blocks: b.max(min_blocks.min(most)),
            slot,
        }
    } else {
        let blocks = floor(blocks(a.coll, a.nranks, a.count, a.dtype, max_blocks));
        if spread_on_copies(a, c) {
            Kernel::CopyAllReduce { blocks, wide, tma }
        } else {
            Kernel::Bulk { blocks, wide, tma }
        }
    }
}

/// Whether all-reduce `a` (not pushed) takes the bulk kernel into each GPU's own output and
/// the copy engines: where the push kernel may not run for want of blocks.
fn spread_on_copies(a: &CollArgs, c: &Choice) -> bool {
    a.coll == CollKind::AllReduce
        && a.nranks >= PUSH_MIN_GPUS
        && c.max_blocks < c.push_min_blocks
        && c.ar_copy_bytes > 0
        && a.count * a.dtype.size() >= c.ar_copy_bytes
}

/// Whether call `a` (above the low-latency kernel) takes the push all-reduce.
fn pushed(a: &CollArgs, c: &Choice) -> bool {
    a.coll == CollKind::AllReduce
        && a.nranks >= PUSH_MIN_GPUS
        && c.push_bytes > 0
        && a.count * a.dtype.size() >= c.push_bytes
        && c.max_blocks >= c.push_min_blocks
}

/// The push kernel by default only where the communicator may use this many blocks per GPU
/// (`RAILCC_GPU_PUSH_MIN_BLOCKS`): measured on
/// 4 x H100 (bench/results, 2026-11-27), at 128 blocks it read 1.01-1.05x NCCL at 16-256 MB
/// against the bulk kernel's 0.93-0.96x, at NCCL's 24 channels 0.88-0.96x against the bulk
/// kernel's 0.92-1.05x. (A variant whose blocks split into a sending and a reducing half, to
/// push at 24 blocks, read 0.74-0.77x: removed.)
pub const PUSH_MIN_BLOCKS: u32 = 128;
/// ... and only on this many GPUs or more: measured on 4; on 2, where the bulk kernel reads
/// 1.03-1.2x NCCL (README), not yet.
pub const PUSH_MIN_GPUS: usize = 4;

/// Which buffers of the other ranks GPU `g`'s part of a `coll` call with kernel `k` reaches:
/// (their inputs, their outputs). A rank's buffer no peer reaches may stay the caller's own
/// where peers cannot map it (the fixed stage copies only the others: `proc/stage.rs`).
/// Read off [`enqueue`] and [`spec`]: the low-latency kernel sends through the sync areas'
/// scratch; the push kernel and the all-gathers read only their own input; the bulk
/// reduce-scatter writes only its own output.
pub fn reach(k: Kernel, coll: CollKind) -> (bool, bool) {
    match k {
        Kernel::Ll { .. } => (false, false),
        Kernel::Push { .. } | Kernel::CopyGather => (false, true),
        Kernel::CopyAllReduce { .. } => (true, true),
        Kernel::Bulk { .. } => match coll {
            CollKind::ReduceScatter => (true, false),
            CollKind::AllGather => (false, true),
            _ => (true, true),
        },
    }
}

/// Every rank's buffers and sync area of one call, as the launching GPU addresses them: the
/// same addresses under peer access (one process), mappings of CUDA IPC handles (one process
/// per GPU).
pub struct Peers<'a> {
    pub ins: &'a [u64],
    pub outs: &'a [u64],
    pub syncs: &'a [u64],
}

/// Enqueues GPU `g`'s part of call `a` with kernel `k` on `stream` and returns.
///
/// # Safety
/// Every address in `p` is device memory GPU `g` can address, of the size `a` implies (sync
/// areas: `railcc_cuda::kernels::AREA_BYTES`), live until the stream passes the call;
/// `stream` is a live stream of GPU `g`'s context.
pub unsafe fn enqueue(
    gpu: &GpuCtx,
    stream: Stream,
    g: usize,
    a: &CollArgs,
    k: Kernel,
    p: &Peers<'_>,
    timeout_ns: u64,
) -> Result<Launch> {
    match k {
        Kernel::Ll { blocks } => {
            let nbytes = a.count * a.dtype.size();
            // SAFETY: the caller's contract.
            unsafe {
                ll::launch(
                    gpu, stream, g, p.ins[g], p.outs[g], nbytes, a.dtype, a.op, p.syncs, blocks,
                    timeout_ns,
                )
            }?;
        }
        Kernel::Push { blocks, slot } => {
            // SAFETY: the caller's contract.
            unsafe {
                push::launch(
                    gpu,
                    stream,
                    g,
                    p.ins[g],
                    push::Outs::Now(p.outs),
                    a.count,
                    a.dtype,
                    a.op,
                    p.syncs,
                    (blocks, slot),
                    timeout_ns,
                )
            }?;
        }
        Kernel::CopyGather => {
            // SAFETY: the caller's contract.
            unsafe {
                railcc_cuda::copies::all_gather(
                    gpu,
                    stream,
                    g,
                    p.ins[g],
                    p.outs,
                    a.count * a.dtype.size(),
                    p.syncs,
                    timeout_ns,
                )
            }?;
        }
        Kernel::CopyAllReduce { blocks, wide, tma } => {
            let shape = bulk_shape(a, p, (blocks, wide, tma), timeout_ns);
            let mut s = spec(a.coll, g, p.ins, p.outs, a.count, a.dtype, a.root)?;
            s.outs = vec![p.outs[g]];
            let es = a.dtype.size() as u64;
            let (b, e) = s.range;
            // SAFETY: the caller's contract; the kernel writes only this GPU's output.
            unsafe { launch(gpu, stream, g, &s, &shape) }?;
            let seg = railcc_cuda::copies::Spread {
                src: p.outs[g] + b * es,
                outs: p.outs,
                offset: b * es,
                bytes: ((e - b) * es) as usize,
            };
            // SAFETY: the caller's contract; the kernel before it passed this call's ready
            // barrier.
            unsafe {
                railcc_cuda::copies::spread(gpu, stream, g, &seg, p.syncs, timeout_ns, false)
            }?;
        }
        Kernel::Bulk { blocks, wide, tma } => {
            let shape = bulk_shape(a, p, (blocks, wide, tma), timeout_ns);
            let s = spec(a.coll, g, p.ins, p.outs, a.count, a.dtype, a.root)?;
            // SAFETY: the caller's contract.
            unsafe { launch(gpu, stream, g, &s, &shape) }?;
        }
    }
    Ok(k.launch())
}

/// What every GPU's bulk kernel of call `a` shares: `blocks` and its loop (`wide`, `tma`).
fn bulk_shape<'a>(
    a: &CollArgs,
    p: &Peers<'a>,
    (blocks, wide, tma): (u32, bool, u8),
    timeout_ns: u64,
) -> CallShape<'a> {
    CallShape {
        dt: a.dtype,
        op: a.op,
        syncs: p.syncs,
        avg_n: p.ins.len() as i32,
        blocks,
        timeout_ns,
        wide,
        tma,
    }
}

/// The part of GPU `g` (of `ins.len()`) in a collective, with NCCL's buffer conventions:
/// `count` is the per-rank count (all_gather: send count; reduce_scatter: receive count), and
/// `ins[h]`/`outs[h]` are GPU h's send and receive buffers as GPU `g` addresses them.
pub fn spec(
    coll: CollKind,
    g: usize,
    ins: &[u64],
    outs: &[u64],
    count: usize,
    dt: DataType,
    root: usize,
) -> Result<Spec> {
    let n = ins.len();
    if outs.len() != n || n == 0 || n > MAX_PEERS {
        return Err(Error::invalid(format!(
            "{}: {} inputs and {} outputs (1 to {MAX_PEERS} GPUs)",
            coll.name(),
            ins.len(),
            outs.len()
        )));
    }
    if root >= n || g >= n {
        return Err(Error::invalid(format!(
            "{}: root {root} or GPU {g} out of range for {n} GPUs",
            coll.name()
        )));
    }
    let es = dt.size() as u64;
    let at = |p: u64, elems: usize| p + elems as u64 * es;
    let full = (0u64, count as u64);
    let (ins, outs, range) = match coll {
        // Each GPU reduces its segment from every input into every output.
        CollKind::AllReduce => (ins.to_vec(), outs.to_vec(), segment(count, dt, n, g)),
        // Each GPU reduces block g of every input into its own output.
        CollKind::ReduceScatter => (
            ins.iter().map(|&p| at(p, g * count)).collect(),
            vec![outs[g]],
            full,
        ),
        // Each GPU writes its input into block g of every output.
        CollKind::AllGather => (
            vec![ins[g]],
            outs.iter().map(|&p| at(p, g * count)).collect(),
            full,
        ),
        // Each GPU pulls the root's buffer.
        CollKind::Broadcast => (vec![ins[root]], vec![outs[g]], full),
        // Each GPU reduces its segment into the root's output only.
        CollKind::Reduce => (ins.to_vec(), vec![outs[root]], segment(count, dt, n, g)),
        // Each GPU pushes its buffer to the next GPU.
        CollKind::SendRecv => {
            if ins.iter().zip(outs).any(|(a, b)| a == b) {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    "in-place sendrecv is not on the GPU path",
                )
                .transport(crate::NAME));
            }
            (vec![ins[g]], vec![outs[(g + 1) % n]], full)
        }
        other => {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("{} is not on the GPU path yet", other.name()),
            )
            .transport(crate::NAME))
        }
    };
    Ok(Spec { ins, outs, range })
}

/// GPU g's segment of `count` elements split over `n`, in multiples of 16 bytes so every GPU's
/// vector loop covers its whole share.
fn segment(count: usize, dt: DataType, n: usize, g: usize) -> (u64, u64) {
    let v = 16 / dt.size();
    let per = count.div_ceil(v).div_ceil(n) * v;
    (
        (g * per).min(count) as u64,
        ((g + 1) * per).min(count) as u64,
    )
}

/// Thread blocks per GPU: enough for the largest share, at most `max_blocks`. Every GPU of a
/// call must launch the same number (the done barrier counts the peers' blocks), and this
/// depends only on the collective's shape, so every rank computes the same.
fn blocks(coll: CollKind, n: usize, count: usize, dt: DataType, max_blocks: u32) -> u32 {
    let v = 16 / dt.size();
    let most = match coll {
        CollKind::AllReduce | CollKind::Reduce => {
            let (b, e) = segment(count, dt, n, 0);
            (e - b) as usize
        }
        _ => count,
    };
    (most.div_ceil(v) as u64)
        .div_ceil(THREADS as u64)
        .clamp(1, max_blocks.max(1) as u64) as u32
}

/// A communicator's most blocks per GPU, fixed at init: `want` (`RAILCC_GPU_MAX_BLOCKS`, 0:
/// one per SM), at most what every GPU keeps resident at once: every block of every GPU
/// waits for the others, so none may wait for a free SM. [`choose`] stays under it per call.
pub fn clamp_blocks(gpus: &[GpuCtx], want: usize) -> Result<u32> {
    let sms = gpus.iter().map(|g| g.sms).min().unwrap_or(1).max(1) as u32;
    let per_sm = match gpus.first() {
        Some(g) => g.blocks_per_sm(THREADS)?,
        None => 1,
    };
    let resident = sms * per_sm;
    let want = if want == 0 { sms } else { want as u32 };
    Ok(want.clamp(1, resident.min(MAX_BLOCKS as u32)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_reduce_segments_cover_the_buffer_in_16_byte_pieces() {
        for n in 1..=8 {
            for count in [0usize, 1, 3, 4, 5, 1000, 1 << 20] {
                let mut next = 0;
                for g in 0..n {
                    let (b, e) = segment(count, DataType::F32, n, g);
                    assert_eq!(b, next);
                    assert!(b % 4 == 0 || b == count as u64);
                    next = e;
                }
                assert_eq!(next, count as u64);
            }
        }
    }

    #[test]
    fn reach_says_what_the_bulk_kernel_touches_on_peers() {
        // Rank h's input at h << 20, its output at (h + 8) << 20: which rank a spec's
        // address belongs to is its high bits.
        let (ins, outs): (Vec<u64>, Vec<u64>) = (0..4u64).map(|h| (h << 20, (h + 8) << 20)).unzip();
        let owner = |p: u64| (p >> 20) as usize % 8;
        let bulk = Kernel::Bulk {
            blocks: 1,
            wide: false,
            tma: 0,
        };
        for coll in [
            CollKind::AllReduce,
            CollKind::ReduceScatter,
            CollKind::AllGather,
        ] {
            for g in 0..4 {
                let s = spec(coll, g, &ins, &outs, 64, DataType::F32, 0).unwrap();
                let peer_ins = s.ins.iter().any(|&p| owner(p) != g);
                let peer_outs = s.outs.iter().any(|&p| owner(p) != g);
                assert_eq!(
                    reach(bulk, coll),
                    (peer_ins, peer_outs),
                    "{coll:?} on GPU {g}"
                );
            }
        }
        assert_eq!(
            reach(Kernel::Ll { blocks: 1 }, CollKind::AllReduce),
            (false, false)
        );
    }

    #[test]
    fn every_gpu_gets_its_part() {
        let (ins, outs) = ([100u64, 200], [300u64, 400]);
        let ag = spec(CollKind::AllGather, 1, &ins, &outs, 10, DataType::F32, 0).unwrap();
        assert_eq!(ag.ins, vec![200]);
        assert_eq!(ag.outs, vec![340, 440]);
        let rs = spec(
            CollKind::ReduceScatter,
            1,
            &ins,
            &outs,
            10,
            DataType::F32,
            0,
        )
        .unwrap();
        assert_eq!(rs.ins, vec![140, 240]);
        assert_eq!(rs.outs, vec![400]);
        let sr = spec(CollKind::SendRecv, 1, &ins, &outs, 10, DataType::F32, 0).unwrap();
        assert_eq!(sr.outs, vec![300]);
        assert!(spec(CollKind::SendRecv, 0, &ins, &ins, 10, DataType::F32, 0).is_err());
        assert!(spec(CollKind::Broadcast, 0, &ins, &outs, 10, DataType::F32, 2).is_err());
        assert!(spec(CollKind::AllToAll, 0, &ins, &outs, 10, DataType::F32, 0).is_err());
    }

    fn ar(count: usize) -> CollArgs {
        CollArgs {
            coll: CollKind::AllReduce,
            nranks: 4,
            count,
            dtype: DataType::F32,
            op: railcc_core::ReduceOp::Sum,
            root: 0,
        }
    }

    fn choice(ll: usize, wide: bool, (min_blocks, max_blocks): (u32, u32)) -> Choice {
        Choice {
            ll_max_bytes: ll,
            wide,
            tma: 0,
            push_bytes: 0,
            push_min_blocks: PUSH_MIN_BLOCKS,
            push_slot: push::DEFAULT_SLOT,
            ag_copy_bytes: 0,
            ar_copy_bytes: 0,
            min_blocks,
            max_blocks,
        }
    }

    #[test]
    fn the_least_and_most_blocks_bound_every_kernel() {
        let bulk = |blocks, wide| Kernel::Bulk {
            blocks,
            wide,
            tma: 0,
        };
        // 8 B: the low-latency kernel, one block by the work; minCTAs 4 makes it 4.
        assert_eq!(
            choose(&ar(2), &choice(65536, false, (0, 132))),
            Kernel::Ll { blocks: 1 }
        );
        assert_eq!(
            choose(&ar(2), &choice(65536, false, (4, 132))),
            Kernel::Ll { blocks: 4 }
        );
        // Large: the bulk kernel, every block it may have; maxCTAs 8 bounds it.
        assert_eq!(
            choose(&ar(1 << 28), &choice(65536, false, (0, 132))),
            bulk(132, false)
        );
        assert_eq!(
            choose(&ar(1 << 28), &choice(65536, true, (0, 8))),
            bulk(8, true)
        );
        // A floor above the ceiling gives the ceiling.
        assert_eq!(choose(&ar(2), &choice(0, false, (16, 8))), bulk(8, false));
    }

    #[test]
    fn late_arguments_take_only_the_bulk_kernel_and_with_push_the_push_kernel() {
        let c = Choice {
            push_bytes: 16 << 20,
            ag_copy_bytes: 16 << 20,
            ar_copy_bytes: 16 << 20,
            tma: 2,
            ..choice(65536, true, (0, 132))
        };
        let ag = CollArgs {
            coll: CollKind::AllGather,
            ..ar(1 << 24)
        };
        assert_eq!(choose(&ag, &c), Kernel::CopyGather);
        assert!(matches!(choose(&ar(1 << 24), &c), Kernel::Push { .. }));
        let late = c.for_late_args(false);
        assert!(matches!(choose(&ag, &late), Kernel::Bulk { tma: 0, .. }));
        assert!(matches!(
            choose(&ar(1 << 24), &late),
            Kernel::Bulk { tma: 0, .. }
        ));
        let late_push = c.for_late_args(true);
        assert!(matches!(
            choose(&ar(1 << 24), &late_push),
            Kernel::Push { .. }
        ));
        assert!(matches!(
            choose(&ag, &late_push),
            Kernel::Bulk { tma: 0, .. }
        ));
        // Where the push kernel may not run (24 blocks), no copy-engine spread either.
        let c24 = Choice {
            max_blocks: 24,
            ..late_push
        };
        assert!(matches!(choose(&ar(1 << 24), &c24), Kernel::Bulk { .. }));
        // The low-latency kernel is unchanged.
        assert!(matches!(choose(&ar(16), &late), Kernel::Ll { .. }));
    }

    #[test]
    fn push_only_for_all_reduces_from_the_threshold_within_its_blocks() {
        let c = Choice {
            push_bytes: 16 << 20,
            ..choice(65536, true, (0, 132))
        };
        let pushed = |a: &CollArgs| matches!(choose(a, &c), Kernel::Push { .. });
        assert!(pushed(&ar(4 << 20))); // 16 MiB of f32
        assert!(!pushed(&ar((4 << 20) - 1)));
        assert!(!pushed(&CollArgs {
            coll: CollKind::ReduceScatter,
            ..ar(4 << 20)
        }));
        assert!(!pushed(&CollArgs {
            nranks: 2,
            ..ar(4 << 20)
        }));
        assert!(pushed(&CollArgs {
            nranks: 8,
            ..ar(4 << 20)
        }));
        // 0: never.
        assert!(!matches!(
            choose(&ar(1 << 28), &choice(65536, true, (0, 132))),
            Kernel::Push { .. }
        ));
        // Its blocks: at most its table's 128 of the 132 allowed; under 128 allowed (maxCTAs
        // 24, NCCL's channels) the bulk kernel, faster there.
        assert_eq!(choose(&ar(1 << 28), &c).blocks(), push::MAX_BLOCKS);
        let c24 = Choice {
            max_blocks: 24,
            ..c
        };
        assert_eq!(
            choose(&ar(1 << 28), &c24),
            Kernel::Bulk {
                blocks: 24,
                wide: true,
                tma: 0
            }
        );
        // RAILCC_GPU_PUSH_MIN_BLOCKS=24 and larger tiles: the push kernel at 24 blocks, in
        // tiles as large as its scratch holds (168 KiB on 4 GPUs).
        let c24p = Choice {
            push_min_blocks: 24,
            push_slot: 1 << 20,
            ..c24
        };
        assert_eq!(
            choose(&ar(1 << 28), &c24p),
            Kernel::Push {
                blocks: 24,
                slot: 168 * 1024
            }
        );
    }

    #[test]
    fn all_gathers_from_the_threshold_on_the_copy_engines() {
        let c = Choice {
            ag_copy_bytes: 16 << 20,
            ..choice(65536, true, (0, 132))
        };
        let ag = |count, nranks| CollArgs {
            coll: CollKind::AllGather,
            nranks,
            ..ar(count)
        };
        assert_eq!(choose(&ag(4 << 20, 4), &c), Kernel::CopyGather);
        assert_eq!(choose(&ag(4 << 20, 4), &c).blocks(), 1);
        assert!(matches!(
            choose(&ag((4 << 20) - 1, 4), &c),
            Kernel::Bulk { .. }
        ));
        // One GPU, other collectives, and 0 (never): not on the copy engines.
        assert!(matches!(choose(&ag(4 << 20, 1), &c), Kernel::Bulk { .. }));
        assert!(matches!(choose(&ar(4 << 20), &c), Kernel::Bulk { .. }));
        let never = Choice {
            ag_copy_bytes: 0,
            ..c
        };
        assert!(matches!(
            choose(&ag(1 << 28, 4), &never),
            Kernel::Bulk { .. }
        ));
        // All-reduces from theirs on 4 GPUs or more where the push kernel may not run (fewer
        // than its 128 blocks, as NCCL's 24): the bulk kernel's blocks, then the copies.
        let r = Choice {
            ar_copy_bytes: 16 << 20,
            max_blocks: 24,
            ..c
        };
        assert_eq!(
            choose(&ar(4 << 20), &r),
            Kernel::CopyAllReduce {
                blocks: 24,
                wide: true,
                tma: 0
            }
        );
        assert_eq!(choose(&ar(4 << 20), &r).steps(), 2);
        assert!(matches!(
            choose(&ar((4 << 20) - 1), &r),
            Kernel::Bulk { .. }
        ));
        let two = CollArgs {
            nranks: 2,
            ..ar(4 << 20)
        };
        assert!(matches!(choose(&two, &r), Kernel::Bulk { .. }));
        // 128 blocks allowed: the push kernel from its threshold, the bulk kernel without it.
        let wide = Choice {
            max_blocks: 132,
            ..r
        };
        assert!(matches!(choose(&ar(4 << 20), &wide), Kernel::Bulk { .. }));
        let push = Choice {
            push_bytes: 16 << 20,
            ..wide
        };
        assert!(matches!(choose(&ar(4 << 20), &push), Kernel::Push { .. }));
    }

    #[test]
    fn every_rank_computes_the_same_block_count() {
        assert_eq!(blocks(CollKind::AllReduce, 2, 2, DataType::F32, 132), 1);
        assert_eq!(
            blocks(CollKind::AllReduce, 2, 1 << 28, DataType::F32, 132),
            132
        );
        assert_eq!(blocks(CollKind::AllGather, 2, 4096, DataType::F32, 132), 2);
    }
}
