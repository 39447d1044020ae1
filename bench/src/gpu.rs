//! `railcc bench <collective> --device cuda`: buffers on the GPUs, time from CUDA events,
//! every size checked against the same reference as the TCP path, plus nccl-tests'
//! out-of-bounds check (bytes around each receive buffer must stay untouched).
//!
//! Two ways of running, as with NCCL:
//! - one process driving every local GPU (`--device cuda`, like nccl-tests `-g N`): [`run`];
//! - one process per GPU (`--device cuda --per-process`, or under torchrun/mpirun/srun):
//!   [`run_rank`], each rank on the GPU of its local rank, peers reached by CUDA IPC.
//!
//! `-G N` captures `iters` calls in a CUDA graph and launches it N times (nccl-tests `-G`).
//! `#wrong` then counts the first eager call and the results after the last graph launch
//! ([`check_graph`]). `--fill random` checks random inputs against an error bound
//! (`collectives::precision`).

use crate::args::{BenchArgs, CheckOn};
use crate::report::bus_factor;
use railcc_collectives::gpu::GpuComm;
use railcc_collectives::plan::CollArgs;
use railcc_collectives::precision::{count_wrong, fill_input, Fill};
use railcc_collectives::{CollKind, Communicator, DataType, ReduceOp};
use railcc_core::call::Call;
use railcc_cuda::gpu::{begin_capture, end_capture, DevBuf, GpuCtx, Graph, Stream};

const SEED: u64 = 0x5eed;
/// Bytes after each buffer that must stay untouched, and their value.
const GUARD: usize = 64;
const GUARD_BYTE: u8 = 0xC3;

pub(crate) fn err(e: railcc_core::Error) -> String {
    e.to_string()
}

/// What one (size, dtype, op, placement) measured.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Sample {
    pub(crate) secs: f64,
    pub(crate) wrong: u64,
    pub(crate) oob: u64,
    pub(crate) blocks: u32,
}

/// One GPU's buffers for one call: allocations with guard bytes around the data, and the
/// image each receive allocation must match outside the receive range.
pub(crate) struct Placed {
    pub(crate) send: DevBuf,
    pub(crate) recv: Option<DevBuf>,
    pub(crate) send_ptr: u64,
    pub(crate) recv_ptr: u64,
    /// The receive range inside the allocation that holds it, and that allocation's image.
    pub(crate) recv_at: std::ops::Range<usize>,
    pub(crate) image: Image,
}

/// What the allocation holding a receive buffer held before the call, to compare the bytes
/// around the receive range and to reset it: the bytes themselves, or (`--check-on gpu`)
/// guard bytes with the exact fill's input at `input`, which the GPU writes, so gigabytes of
/// input are never made on the host nor cross PCIe (issue 30).
pub(crate) enum Image {
    Host(Vec<u8>),
    Gpu { len: usize, input: Option<InputAt> },
}

/// Where a GPU-written input lies in an allocation: `rank`'s send elements of `args` from
/// byte `at`.
#[derive(Clone, Copy)]
pub(crate) struct InputAt {
    at: usize,
    args: CollArgs,
    rank: usize,
}

impl InputAt {
    /// Writes the input (the exact fill) on the GPU.
    fn write(&self, gpu: &GpuCtx, buf: &DevBuf) -> Result<(), String> {
        // SAFETY: `place` made `buf` with room for the send elements from `at`.
        unsafe {
            railcc_collectives::gpu_check::fill_on_gpu(
                gpu,
                &self.args,
                self.rank,
                buf.ptr + self.at as u64,
                SEED,
                0..self.args.send_elems(),
            )
        }
        .map_err(err)
    }
}

impl Image {
    pub(crate) fn len(&self) -> usize {
        match self {
            Image::Host(v) => v.len(),
            Image::Gpu { len, .. } => *len,
        }
    }

    /// The image's bytes in `range`.
    fn bytes(&self, range: std::ops::Range<usize>) -> Vec<u8> {
        let input = match self {
            Image::Host(v) => return v[range].to_vec(),
            Image::Gpu { input, .. } => input,
        };
        let mut out = vec![GUARD_BYTE; range.len()];
        if let Some(i) = input {
            let es = i.args.dtype.size();
            let end = i.at + i.args.send_elems() * es;
            let (lo, hi) = (range.start.max(i.at), range.end.min(end));
            if lo < hi {
                let elems = (lo - i.at) / es..(hi - i.at).div_ceil(es);
                let part =
                    railcc_collectives::reference::fill_part(&i.args, i.rank, SEED, elems.clone());
                let skip = lo - (i.at + elems.start * es);
                out[lo - range.start..hi - range.start]
                    .copy_from_slice(&part[skip..skip + (hi - lo)]);
            }
        }
        out
    }

    /// Puts the image back into `buf`, the allocation it describes.
    pub(crate) fn restore(&self, gpu: &GpuCtx, buf: &DevBuf) -> Result<(), String> {
        match self {
            Image::Host(v) => gpu.upload(buf, 0, v).map_err(err),
            Image::Gpu { len, input } => {
                gpu.memset(buf, 0, *len, GUARD_BYTE).map_err(err)?;
                input.map_or(Ok(()), |i| i.write(gpu, buf))
            }
        }
    }
}

/// Allocates and fills one GPU's buffers for a call: the exact fill's input written by the
/// GPU (`--check-on gpu`, buffers at whole elements) or any fill made on the host and
/// uploaded, with guard bytes around every receive range.
pub(crate) fn place(
    gpu: &GpuCtx,
    args: &CollArgs,
    rank: usize,
    in_place: bool,
    a: &BenchArgs,
) -> Result<Placed, String> {
    let (offset, es) = (a.offset, args.dtype.size());
    // The kernels take whole elements: a buffer offset off its element size is made on the host.
    let on_gpu = CheckHow::of(a).on_gpu && offset.is_multiple_of(es);
    let framed = |body: &[u8]| {
        let mut v = vec![GUARD_BYTE; offset];
        v.extend_from_slice(body);
        v.extend(std::iter::repeat_n(GUARD_BYTE, GUARD));
        v
    };
    let input_at = |at: usize| {
        Some(InputAt {
            at,
            args: *args,
            rank,
        })
    };
    if in_place {
        let (send, recv, total) = args.in_place_ranges(rank);
        let image = if on_gpu {
            Image::Gpu {
                len: offset + total + GUARD,
                input: input_at(offset + send.start),
            }
        } else {
            let input = fill_input(a.fill, args, rank, SEED);
            let prior = vec![GUARD_BYTE; recv.len()];
            Image::Host(framed(&args.in_place_backing(rank, &input, &prior)))
        };
        debug_assert_eq!(image.len(), offset + total + GUARD);
        let b = gpu.alloc(image.len()).map_err(err)?;
        image.restore(gpu, &b)?;
        return Ok(Placed {
            send_ptr: b.ptr + (offset + send.start) as u64,
            recv_ptr: b.ptr + (offset + recv.start) as u64,
            recv_at: offset + recv.start..offset + recv.end,
            send: b,
            recv: None,
            image,
        });
    }
    let (send_image, image) = if on_gpu {
        (
            Image::Gpu {
                len: offset + args.send_elems() * es + GUARD,
                input: input_at(offset),
            },
            Image::Gpu {
                len: offset + args.recv_elems() * es + GUARD,
                input: None,
            },
        )
    } else {
        (
            Image::Host(framed(&fill_input(a.fill, args, rank, SEED))),
            Image::Host(framed(&vec![GUARD_BYTE; args.recv_elems() * es])),
        )
    };
    let s = gpu.alloc(send_image.len()).map_err(err)?;
    let r = gpu.alloc(image.len()).map_err(err)?;
    send_image.restore(gpu, &s)?;
    image.restore(gpu, &r)?;
    Ok(Placed {
        send_ptr: s.ptr + offset as u64,
        recv_ptr: r.ptr + offset as u64,
        recv_at: offset..offset + args.recv_elems() * es,
        send: s,
        recv: Some(r),
        image,
    })
}

/// How results are checked: the fill they came from, and whether on the GPU that holds
/// them (`--check-on gpu`, exact fill only).
#[derive(Clone, Copy)]
pub(crate) struct CheckHow {
    fill: Fill,
    on_gpu: bool,
}

impl CheckHow {
    pub(crate) fn of(a: &BenchArgs) -> CheckHow {
        CheckHow {
            fill: a.fill,
            on_gpu: a.check_on == CheckOn::Gpu && a.fill == Fill::Exact,
        }
    }
}

/// (wrong elements, out-of-bounds bytes) after a call (the stream must be synchronized).
pub(crate) fn check(
    gpu: &GpuCtx,
    p: &Placed,
    args: &CollArgs,
    rank: usize,
    how: CheckHow,
) -> Result<(u64, u64), String> {
    let buf = p.recv.as_ref().unwrap_or(&p.send);
    let (at, end) = (p.recv_at.start, p.recv_at.end.min(p.image.len()));
    let differ = |x: &[u8], y: &[u8]| x.iter().zip(y).filter(|(a, b)| a != b).count() as u64;
    if how.on_gpu && (buf.ptr + at as u64).is_multiple_of(args.dtype.size() as u64) {
        // The receive range is counted where it lies; only the bytes around it (guards, and
        // an in-place call's other parts) come back to be compared.
        // SAFETY: the receive range is `buf`'s memory on this GPU; the call is synchronized.
        let wrong = unsafe {
            railcc_collectives::gpu_check::count_wrong_on_gpu(
                gpu,
                args,
                rank,
                buf.ptr + at as u64,
                SEED,
            )
        }
        .map_err(err)?;
        let len = p.image.len();
        let (mut head, mut tail) = (vec![0u8; at], vec![0u8; len - end]);
        gpu.download(buf, 0, &mut head).map_err(err)?;
        gpu.download(buf, end, &mut tail).map_err(err)?;
        let oob = differ(&head, &p.image.bytes(0..at)) + differ(&tail, &p.image.bytes(end..len));
        return Ok((wrong, oob));
    }
    let mut host = vec![0u8; p.image.len()];
    gpu.download(buf, 0, &mut host).map_err(err)?;
    let wrong = count_wrong(how.fill, args, rank, &host[p.recv_at.clone()], SEED);
    // Bytes outside the receive range that changed (guards, and an in-place call's other
    // parts), compared slice by slice rather than byte by byte over the whole allocation.
    let len = p.image.len();
    let oob =
        differ(&host[..at], &p.image.bytes(0..at)) + differ(&host[end..], &p.image.bytes(end..len));
    Ok((wrong, oob))
}

/// Times `a.iters` calls of `launch` (eagerly, or captured once and replayed `-G` times),
/// after `a.warmup` untimed ones, with events on `timer_gpu`'s stream. `capture` brackets a
/// capture on every stream involved.
pub(crate) fn time_calls(
    a: &BenchArgs,
    timer_gpu: &GpuCtx,
    launch: &dyn Fn() -> Result<u32, String>,
    streams: &[(&GpuCtx, Stream)],
) -> Result<f64, String> {
    for _ in 0..a.warmup {
        launch()?;
    }
    if a.graph_launches == 0 {
        let t0 = timer_gpu.record_timer().map_err(err)?;
        for _ in 0..a.iters {
            launch()?;
        }
        let t1 = timer_gpu.record_timer().map_err(err)?;
        let ms = t0.elapsed_ms(&t1).map_err(err)?;
        return Ok(ms as f64 / 1e3 / a.iters.max(1) as f64);
    }
    let graphs = capture(launch, a.iters, streams)?;
    let replay = || replay(&graphs, streams);
    replay()?; // warm-up launch (uploads the graph)
    let t0 = timer_gpu.record_timer().map_err(err)?;
    for _ in 0..a.graph_launches {
        replay()?;
    }
    let t1 = timer_gpu.record_timer().map_err(err)?;
    let ms = t0.elapsed_ms(&t1).map_err(err)?;
    Ok(ms as f64 / 1e3 / (a.iters.max(1) as f64 * a.graph_launches as f64))
}

/// `calls` calls of `launch` captured as one CUDA graph per stream.
fn capture(
    launch: &dyn Fn() -> Result<u32, String>,
    calls: u32,
    streams: &[(&GpuCtx, Stream)],
) -> Result<Vec<Graph>, String> {
    for (g, s) in streams {
        // SAFETY: each stream belongs to its GPU and is idle on the host side.
        unsafe { begin_capture(g, *s) }.map_err(err)?;
    }
    let mut captured = Ok(());
    for _ in 0..calls {
        if let Err(e) = launch() {
            captured = Err(e);
            break;
        }
    }
    // End every capture, even after a failure, so the streams are usable again.
    let graphs: Vec<Result<Graph, String>> = streams
        .iter()
        // SAFETY: each stream was put in capture mode above.
        .map(|(g, s)| unsafe { end_capture(g, *s) }.map_err(err))
        .collect();
    captured?;
    graphs.into_iter().collect()
}

fn replay(graphs: &[Graph], streams: &[(&GpuCtx, Stream)]) -> Result<(), String> {
    for (gr, (g, s)) in graphs.iter().zip(streams) {
        // SAFETY: each graph was captured from this stream of this GPU.
        unsafe { gr.launch(g, *s) }.map_err(err)?;
    }
    Ok(())
}

/// Whether back-to-back calls leave what one call leaves, so the buffers can be checked as
/// the last graph launch left them: out-of-place calls, copies, and in-place min and max.
fn repeat_stable(args: &CollArgs, in_place: bool) -> bool {
    if !in_place {
        return true;
    }
    match args.coll {
        // A reduction in place feeds on its own output (min and max excepted), and an
        // all-to-all in place moves its own output again (for 2 ranks, every second call
        // undoes the one before).
        CollKind::AllReduce | CollKind::ReduceScatter | CollKind::Reduce => {
            matches!(args.op, ReduceOp::Max | ReduceOp::Min)
        }
        CollKind::AllToAll => false,
        _ => true,
    }
}

/// This process's buffers in a graph check: (GPU, buffers, rank).
type Mine<'a> = [(&'a GpuCtx, &'a Placed, usize)];

/// How this process launches a call and waits for it.
pub(crate) struct Calls<'a> {
    pub(crate) launch: &'a dyn Fn() -> Result<u32, String>,
    pub(crate) streams: &'a [(&'a GpuCtx, Stream)],
    /// Waits until this process's GPUs have finished.
    pub(crate) sync: &'a dyn Fn() -> Result<(), String>,
    /// Waits until every rank got here (a barrier per process; nothing in one process).
    pub(crate) together: &'a dyn Fn() -> Result<(), String>,
}

/// (wrong, out of bounds) of the results the graph launches left. Calls that repeat stably
/// are checked as the last launch of the timed graph left them. An in-place reduction feeds
/// on its own output, so there every buffer is reset to its first image (after `sync`, then
/// `together` so no peer launches before all reset), and a graph of one call is captured,
/// launched and checked, as nccl-tests checks under `-G`.
pub(crate) fn check_graph(
    args: &CollArgs,
    how: CheckHow,
    in_place: bool,
    mine: &Mine<'_>,
    c: &Calls<'_>,
) -> Result<(u64, u64), String> {
    (c.sync)()?;
    if !repeat_stable(args, in_place) {
        (c.together)()?;
        for (gpu, p, _) in mine {
            p.image.restore(gpu, p.recv.as_ref().unwrap_or(&p.send))?;
        }
        (c.together)()?;
        let graphs = capture(c.launch, 1, c.streams)?;
        replay(&graphs, c.streams)?;
        (c.sync)()?;
    }
    let (mut wrong, mut oob) = (0, 0);
    for (gpu, p, rank) in mine {
        let (w, o) = check(gpu, p, args, *rank, how)?;
        wrong += w;
        oob += o;
    }
    Ok((wrong, oob))
}

/// The part that differs between the two ways of running.
pub(crate) trait Runner {
    /// Whether it runs all-to-all (the network engine does; the NVLink kernels not yet).
    fn all_to_all(&self) -> bool {
        false
    }
    fn ranks(&self) -> usize;
    fn prints(&self) -> bool;
    fn one(&self, args: &CollArgs, a: &BenchArgs, in_place: bool) -> Result<Sample, String>;
}

/// Every GPU driven from this process: `GpuComm::in_process`, as libnccl's `-g N`.
struct Single(GpuComm);

impl Runner for Single {
    fn ranks(&self) -> usize {
        self.0.nranks()
    }
    fn prints(&self) -> bool {
        true
    }
    fn one(&self, args: &CollArgs, a: &BenchArgs, in_place: bool) -> Result<Sample, String> {
        let mg = self
            .0
            .in_process_gpus()
            .ok_or_else(|| "not a communicator of one process".to_string())?;
        let n = mg.len();
        let placed = (0..n)
            .map(|g| place(mg.gpu(g), args, g, in_place, a))
            .collect::<Result<Vec<_>, _>>()?;
        let calls: Vec<Call> = (0..n)
            .map(|g| Call {
                args: *args,
                send: placed[g].send_ptr,
                recv: placed[g].recv_ptr,
                stream: mg.stream(g) as usize,
            })
            .collect();
        let launch = || -> Result<u32, String> {
            // SAFETY: every pointer lies in a live allocation of the size the collective
            // implies (`place`), kept until this function has synchronized; each stream is
            // its GPU's own.
            unsafe { self.0.collective(&calls) }.map_err(err)
        };
        let mut s = Sample {
            blocks: launch()?,
            ..Sample::default()
        };
        mg.synchronize().map_err(err)?;
        if a.check != 0 {
            for (g, p) in placed.iter().enumerate() {
                let (w, o) = check(mg.gpu(g), p, args, g, CheckHow::of(a))?;
                s.wrong += w;
                s.oob += o;
            }
        }
        let streams: Vec<_> = (0..n).map(|g| (mg.gpu(g), mg.stream(g))).collect();
        s.secs = time_calls(a, mg.gpu(0), &launch, &streams)?;
        mg.synchronize().map_err(err)?;
        if a.check != 0 && a.graph_launches > 0 {
            let mine: Vec<_> = (0..n).map(|g| (mg.gpu(g), &placed[g], g)).collect();
            let calls = Calls {
                launch: &launch,
                streams: &streams,
                sync: &|| mg.synchronize().map_err(err),
                together: &|| Ok(()),
            };
            let (w, o) = check_graph(args, CheckHow::of(a), in_place, &mine, &calls)?;
            s.wrong += w;
            s.oob += o;
        }
        Ok(s)
    }
}

struct PerProcess<'a> {
    gpu: GpuComm,
    /// This rank's GPU when the path has no kernels of its own (the network).
    own: Option<GpuCtx>,
    comm: &'a Communicator,
}

impl PerProcess<'_> {
    fn ctx(&self) -> Result<&GpuCtx, String> {
        self.gpu
            .peer_gpu()
            .or(self.own.as_ref())
            .ok_or_else(|| "no GPU context".to_string())
    }
}

impl Runner for PerProcess<'_> {
    fn all_to_all(&self) -> bool {
        self.gpu.peer_gpu().is_none()
    }
    fn ranks(&self) -> usize {
        self.gpu.nranks()
    }
    fn prints(&self) -> bool {
        self.gpu.rank() == 0
    }
    fn one(&self, args: &CollArgs, a: &BenchArgs, in_place: bool) -> Result<Sample, String> {
        let (pg, me) = (&self.gpu, self.gpu.rank());
        let gpu = self.ctx()?;
        let p = place(gpu, args, me, in_place, a)?;
        let stream = gpu.stream;
        let launch = || -> Result<u32, String> {
            let call = Call {
                args: *args,
                send: p.send_ptr,
                recv: p.recv_ptr,
                stream: stream as usize,
            };
            // SAFETY: the buffers are live cuMemAlloc allocations of the implied size (`place`),
            // kept until this function has synchronized.
            unsafe { pg.collective(&[call]) }.map_err(err)
        };
        let mut s = Sample {
            blocks: launch()?,
            ..Sample::default()
        };
        gpu.synchronize().map_err(err)?;
        // A peer that died stops the kernels early: its error, not wrong values.
        if let Some(e) = pg.async_error() {
            return Err(err(e));
        }
        if a.check != 0 {
            (s.wrong, s.oob) = check(gpu, &p, args, me, CheckHow::of(a))?;
        }
        // Peers write into our receive buffer: nobody reuses buffers until all have checked.
        self.comm.barrier().map_err(err)?;
        let streams = [(gpu, stream)];
        s.secs = time_calls(a, gpu, &launch, &streams)?;
        gpu.synchronize().map_err(err)?;
        if let Some(e) = pg.async_error() {
            return Err(err(e));
        }
        if a.check != 0 && a.graph_launches > 0 {
            let calls = Calls {
                launch: &launch,
                streams: &streams,
                sync: &|| gpu.synchronize().map_err(err),
                together: &|| self.comm.barrier().map_err(err),
            };
            let (w, o) = check_graph(args, CheckHow::of(a), in_place, &[(gpu, &p, me)], &calls)?;
            s.wrong += w;
            s.oob += o;
            // Every rank has checked before anyone frees what peers write into.
            self.comm.barrier().map_err(err)?;
        }
        // Rank 0 reports the slowest rank's time and everyone's errors.
        agree(self.comm, s)
    }
}

/// One process driving the local GPUs.
pub fn run(a: &BenchArgs) -> Result<(), String> {
    let gpus = railcc_cuda::driver::devices().map_err(err)?;
    let n = a.gpus.unwrap_or(gpus.len());
    if n == 0 || n > gpus.len() {
        return Err(format!(
            "--gpus {n}: this machine has {} GPU(s)",
            gpus.len()
        ));
    }
    let cfg = railcc_core::Config::from_env().map_err(err)?;
    let ordinals: Vec<usize> = (0..n).collect();
    let gc = GpuComm::in_process(&cfg, &ordinals).map_err(err)?;
    println!(
        "# railcc bench {} --device cuda: {}{}",
        a.collective.kind().name(),
        gc.describe(),
        graph_note(a)
    );
    describe_gpus(&gpus[..n])?;
    sweep(&Single(gc), a)
}

/// Every rank's sample made one: the slowest rank's time, everyone's errors.
pub(crate) fn agree(comm: &Communicator, mut s: Sample) -> Result<Sample, String> {
    let mine = [
        s.secs.to_le_bytes(),
        s.wrong.to_le_bytes(),
        s.oob.to_le_bytes(),
    ]
    .concat();
    let all = comm.oob_all_gather(&mine).map_err(err)?;
    let field = |b: &[u8], i: usize| {
        b.get(i * 8..i * 8 + 8)
            .and_then(|x| <[u8; 8]>::try_from(x).ok())
            .unwrap_or_default()
    };
    s.secs = all
        .iter()
        .map(|b| f64::from_le_bytes(field(b, 0)))
        .fold(0.0, f64::max);
    s.wrong = all.iter().map(|b| u64::from_le_bytes(field(b, 1))).sum();
    s.oob = all.iter().map(|b| u64::from_le_bytes(field(b, 2))).sum();
    Ok(s)
}

/// One rank of a job with one process per GPU.
pub fn run_rank(comm: &Communicator, a: &BenchArgs) -> Result<(), String> {
    let gpus = railcc_cuda::driver::devices().map_err(err)?;
    if gpus.is_empty() {
        return Err("--device cuda: no GPU on this machine".into());
    }
    let local = railcc_core::config::local_rank().unwrap_or(comm.rank());
    let ordinal = local % gpus.len();
    let cfg = comm.config();
    let cache = cfg.kernel_cache_dir();
    if a.gpu_net {
        return crate::gpu_net::run_rank(comm, a, ordinal, &gpus);
    }
    // railcc's GPU communicator: peer access on one host; across hosts (RAILCC_HOSTID) the
    // network, as a hierarchy with several GPUs on every host.
    let pg = GpuComm::new(comm, ordinal).map_err(err)?;
    let own = match pg.peer_gpu() {
        Some(_) => None,
        None => Some(GpuCtx::new(ordinal, cache.as_deref()).map_err(err)?),
    };
    if comm.rank() == 0 {
        println!(
            "# railcc bench {} --device cuda --per-process: {} ranks, one GPU each, {}{}",
            a.collective.kind().name(),
            comm.nranks(),
            pg.describe(),
            graph_note(a)
        );
        describe_gpus(&gpus)?;
    }
    sweep(&PerProcess { gpu: pg, own, comm }, a)
}

pub(crate) fn graph_note(a: &BenchArgs) -> String {
    let fill = crate::report::fill_note(a);
    if a.graph_launches > 0 {
        format!(
            ", CUDA graph of {} calls launched {} times (#wrong: the first eager call and the results after the last launch){fill}",
            a.iters, a.graph_launches
        )
    } else {
        fill.to_string()
    }
}

pub(crate) fn describe_gpus(gpus: &[railcc_cuda::driver::GpuInfo]) -> Result<(), String> {
    for g in gpus {
        println!(
            "#  GPU {} {} bus {} sm_{}{} ({} SMs)",
            g.ordinal, g.name, g.pci_bus_id, g.compute_capability.0, g.compute_capability.1, g.sms
        );
    }
    for i in 0..gpus.len() {
        for j in 0..gpus.len() {
            if i != j {
                let (can, rank) = railcc_cuda::driver::peer(i, j).map_err(err)?;
                println!("#  peer {i}->{j}: access {can}, performance rank {rank}");
            }
        }
    }
    Ok(())
}

fn list<T: std::str::FromStr<Err = String> + Copy>(s: &str, all: &[T]) -> Result<Vec<T>, String> {
    if s == "all" {
        return Ok(all.to_vec());
    }
    s.split(',').map(|x| x.parse()).collect()
}

pub(crate) fn sweep(r: &dyn Runner, a: &BenchArgs) -> Result<(), String> {
    let coll = a.collective.kind();
    if coll == CollKind::AllToAll && !r.all_to_all() {
        return Err("--device cuda runs alltoall only with --gpu-net".into());
    }
    let n = r.ranks();
    let reduces = matches!(
        coll,
        CollKind::AllReduce | CollKind::ReduceScatter | CollKind::Reduce
    );
    let rooted = matches!(coll, CollKind::Broadcast | CollKind::Reduce);
    if rooted && a.root >= n {
        return Err(format!("-r {}: root out of range for {n} GPUs", a.root));
    }
    let dts: Vec<DataType> = list(&a.dtype, &DataType::ALL)?;
    let ops: Vec<ReduceOp> = if reduces {
        list(&a.op, &ReduceOp::ALL)?
    } else {
        vec![ReduceOp::Sum]
    };
    for dt in &dts {
        if !a.offset.is_multiple_of(dt.size()) {
            return Err(format!(
                "--offset {}: not a multiple of {}'s {} bytes",
                a.offset,
                dt.name(),
                dt.size()
            ));
        }
    }
    let p = r.prints();
    if p {
        if a.offset > 0 {
            println!("# buffers start {} bytes past their allocation", a.offset);
        }
        println!("#");
        println!("#                                                              out-of-place                       in-place          ");
        println!("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong  blocks");
        println!("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)           ");
    }
    let (mut total_wrong, mut total_oob) = (0u64, 0u64);
    for &dt in &dts {
        for &op in &ops {
            let mut size = a.min_bytes;
            while size <= a.max_bytes {
                let (count, total_bytes) = crate::measure::shape(coll, size, dt.size(), n);
                let args = CollArgs {
                    coll,
                    nranks: n,
                    count,
                    dtype: dt,
                    op,
                    root: a.root,
                };
                let o = r.one(&args, a, false)?;
                let in_place = coll != CollKind::SendRecv;
                let i = if in_place {
                    r.one(&args, a, true)?
                } else {
                    Sample::default()
                };
                total_wrong += o.wrong + i.wrong;
                total_oob += o.oob + i.oob;
                if p {
                    print_row(
                        a,
                        &args,
                        total_bytes,
                        &o,
                        in_place.then_some(&i),
                        reduces,
                        rooted,
                    );
                }
                size = match a.step_bytes {
                    Some(i) => size + i.max(1),
                    None => size * a.step_factor.max(2),
                };
            }
        }
    }
    if p {
        println!(
            "# Out of bounds values : {total_oob} {}",
            if total_oob == 0 { "OK" } else { "FAILED" }
        );
        println!("#");
    }
    if total_wrong > 0 || total_oob > 0 {
        return Err(format!(
            "{total_wrong} wrong values, {total_oob} out-of-bounds bytes"
        ));
    }
    Ok(())
}

fn print_row(
    a: &BenchArgs,
    args: &CollArgs,
    total_bytes: u64,
    o: &Sample,
    i: Option<&Sample>,
    reduces: bool,
    rooted: bool,
) {
    let bytes = total_bytes as f64;
    let side = |s: &Sample| {
        let algbw = if s.secs > 0.0 {
            bytes / s.secs / 1e9
        } else {
            0.0
        };
        format!(
            "  {:>7.2}  {:>6.2}  {:>6.2}  {:>5}",
            s.secs * 1e6,
            algbw,
            algbw * bus_factor(args.coll, args.nranks),
            if a.check != 0 {
                s.wrong.to_string()
            } else {
                "N/A".into()
            }
        )
    };
    let ip = match i {
        Some(i) => side(i),
        None => format!("  {:>7}  {:>6}  {:>6}  {:>5}", "N/A", "N/A", "N/A", "N/A"),
    };
    println!(
        "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}{}{}  {:>6}",
        total_bytes,
        args.count,
        args.dtype.name(),
        if reduces { args.op.name() } else { "none" },
        if rooted { args.root as i64 } else { -1 },
        side(o),
        ip,
        o.blocks
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_place_calls_that_move_their_own_output_are_not_repeat_stable() {
        let a = |coll, op| CollArgs {
            coll,
            nranks: 2,
            count: 4,
            dtype: DataType::F32,
            op,
            root: 0,
        };
        assert!(!repeat_stable(&a(CollKind::AllToAll, ReduceOp::Sum), true));
        assert!(repeat_stable(&a(CollKind::AllToAll, ReduceOp::Sum), false));
        assert!(!repeat_stable(&a(CollKind::AllReduce, ReduceOp::Sum), true));
        assert!(repeat_stable(&a(CollKind::AllReduce, ReduceOp::Max), true));
        assert!(repeat_stable(&a(CollKind::AllGather, ReduceOp::Sum), true));
    }
}
