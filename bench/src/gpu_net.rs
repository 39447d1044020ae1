//! `railcc bench <collective> --device cuda --per-process --gpu-net`: GPU buffers across the
//! network transport through the stream-ordered engine (`railcc_collectives::gpu::net::GpuNet`, through `GpuComm::over_network`), one
//! process per GPU, checked and timed as the NVLink path is (`-G` included). Each row is
//! preceded by the times calls took to return to the caller: on an idle stream (median of 5),
//! and in the timed loop (median, slowest), where a full stream pushes back.

use crate::args::BenchArgs;
use crate::gpu::{
    agree, check, check_graph, describe_gpus, err, graph_note, place, sweep, time_calls, Calls,
    CheckHow, Runner, Sample,
};
use railcc_collectives::gpu::GpuComm;
use railcc_collectives::plan::CollArgs;
use railcc_collectives::Communicator;
use railcc_cuda::gpu::GpuCtx;
use std::cell::RefCell;
use std::time::Instant;

struct NetAsync<'a> {
    gpu: GpuCtx,
    net: GpuComm,
    comm: &'a Communicator,
}

impl NetAsync<'_> {
    fn broken(&self) -> Result<(), String> {
        match self.net.async_error() {
            Some(e) => Err(e.to_string()),
            None => Ok(()),
        }
    }
}

impl Runner for NetAsync<'_> {
    fn all_to_all(&self) -> bool {
        true
    }
    fn ranks(&self) -> usize {
        self.comm.nranks()
    }
    fn prints(&self) -> bool {
        self.comm.rank() == 0
    }
    fn one(&self, args: &CollArgs, a: &BenchArgs, in_place: bool) -> Result<Sample, String> {
        let (gpu, me) = (&self.gpu, self.comm.rank());
        let p = place(gpu, args, me, in_place, a)?;
        let stream = gpu.stream;
        let returns = RefCell::new(Vec::new());
        let launch = || -> Result<u32, String> {
            let t = Instant::now();
            let call = railcc_core::call::Call {
                args: *args,
                send: p.send_ptr,
                recv: p.recv_ptr,
                stream: stream as usize,
            };
            // SAFETY: the buffers are live allocations of the implied size (`place`), kept
            // until this function has synchronized the stream.
            let blocks = unsafe { self.net.collective(&[call]) }.map_err(err)?;
            returns.borrow_mut().push(t.elapsed().as_secs_f64());
            // The staging kernel's blocks (0 with copies on the stream).
            Ok(blocks)
        };
        let mut s = Sample {
            blocks: launch()?,
            ..Sample::default()
        };
        gpu.synchronize().map_err(err)?;
        self.broken()?;
        if a.check != 0 {
            (s.wrong, s.oob) = check(gpu, &p, args, me, CheckHow::of(a))?;
        }
        // How long a call takes to return when the stream is idle (nothing queued ahead of
        // it): the timed loop below measures back-pressure once the stream is full.
        let mut idle = Vec::new();
        if a.graph_launches == 0 {
            for _ in 0..5 {
                gpu.synchronize().map_err(err)?;
                self.comm.barrier().map_err(err)?;
                let spin = std::time::Instant::now();
                while spin.elapsed().as_micros() < u128::from(a.idle_spin_us) {
                    std::hint::spin_loop();
                }
                returns.borrow_mut().clear();
                launch()?;
                idle.extend(returns.borrow().iter().copied());
            }
            gpu.synchronize().map_err(err)?;
            self.broken()?;
            idle.sort_by(f64::total_cmp);
        }
        self.comm.barrier().map_err(err)?;
        returns.borrow_mut().clear();
        let streams = [(gpu, stream)];
        s.secs = time_calls(a, gpu, &launch, &streams)?;
        let mut returned = returns.borrow().clone();
        returned.sort_by(f64::total_cmp);
        gpu.synchronize().map_err(err)?;
        self.broken()?;
        if a.check != 0 && a.graph_launches == 0 {
            // A call made after the timed ones, on the same buffers, reset to the first
            // image, is checked too: reuse of stages and flag slots must not show in it.
            self.comm.barrier().map_err(err)?;
            p.image.restore(gpu, p.recv.as_ref().unwrap_or(&p.send))?;
            self.comm.barrier().map_err(err)?;
            launch()?;
            gpu.synchronize().map_err(err)?;
            self.broken()?;
            let (w, o) = check(gpu, &p, args, me, CheckHow::of(a))?;
            s.wrong += w;
            s.oob += o;
        }
        if a.check != 0 && a.graph_launches > 0 {
            let calls = Calls {
                launch: &launch,
                streams: &streams,
                sync: &|| {
                    gpu.synchronize().map_err(err)?;
                    self.broken()
                },
                together: &|| self.comm.barrier().map_err(err),
            };
            let (w, o) = check_graph(args, CheckHow::of(a), in_place, &[(gpu, &p, me)], &calls)?;
            s.wrong += w;
            s.oob += o;
        }
        self.comm.barrier().map_err(err)?;
        if me == 0 && a.graph_launches == 0 {
            let at = |q: f64| returned.get(((returned.len() as f64 - 1.0) * q) as usize);
            if let (Some(mid), Some(max)) = (at(0.5), at(1.0)) {
                let idle_mid = idle.get(idle.len() / 2).copied().unwrap_or(f64::NAN);
                println!(
                    "#  {} B {}: a call on an idle stream returned after {:.1} us (median of {}{}); the timed calls after {:.1} us (median), {:.1} us (slowest)",
                    args.count * args.dtype.size(),
                    if in_place { "in place" } else { "out of place" },
                    idle_mid * 1e6,
                    idle.len(),
                    match a.idle_spin_us {
                        0 => String::new(),
                        us => format!(", the caller busy {us} us before each"),
                    },
                    mid * 1e6,
                    max * 1e6
                );
            }
        }
        agree(self.comm, s)
    }
}

/// One rank of a job whose GPU data crosses the network.
pub fn run_rank(
    comm: &Communicator,
    a: &BenchArgs,
    ordinal: usize,
    gpus: &[railcc_cuda::driver::GpuInfo],
) -> Result<(), String> {
    let cache = comm.config().kernel_cache_dir();
    let gpu = GpuCtx::new(ordinal, cache.as_deref()).map_err(err)?;
    let net = GpuComm::over_network(comm, ordinal).map_err(err)?;
    if comm.rank() == 0 {
        println!(
            "# railcc bench {} --device cuda --per-process --gpu-net: {} ranks, one GPU each, {}{}",
            a.collective.kind().name(),
            comm.nranks(),
            net.describe(),
            graph_note(a)
        );
        describe_gpus(gpus)?;
    }
    let rank = comm.rank();
    sweep(&NetAsync { gpu, net, comm }, a)?;
    if rank == 0 {
        // Every cuMemHostAlloc railcc made in this process, the bench's own buffers included.
        let (now, peak) = railcc_cuda::staging::pinned_bytes();
        println!(
            "# pinned host memory of rank 0's process: at most {:.1} MiB ({:.1} MiB after the runs)",
            peak as f64 / 1048576.0,
            now as f64 / 1048576.0
        );
    }
    Ok(())
}
