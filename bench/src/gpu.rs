//! `railcc bench all_reduce --device cuda`: one process drives the local GPUs (like
//! nccl-tests `-g N`). Buffers live on the GPUs, time comes from CUDA events on GPU 0's stream
//! (which waits for every GPU at the end of each call), and every size is checked on the host
//! against the same reference as the TCP path.

use crate::args::BenchArgs;
use crate::report::bus_factor;
use railcc_collectives::plan::CollArgs;
use railcc_collectives::reference::{count_wrong, fill_input};
use railcc_collectives::{CollKind, DataType, ReduceOp};
use railcc_transport_nvlink::multi::{DevBuf, MultiGpu};

const SEED: u64 = 0x5eed;

pub fn run(a: &BenchArgs) -> Result<(), String> {
    let coll = a.collective.kind();
    if coll == CollKind::AllToAll {
        return Err("--device cuda does not run alltoall yet (issue 3)".into());
    }
    let gpus = railcc_transport_nvlink::driver::devices().map_err(|e| e.to_string())?;
    let n = a.gpus.unwrap_or(gpus.len());
    if n == 0 || n > gpus.len() {
        return Err(format!(
            "--gpus {n}: this machine has {} GPU(s)",
            gpus.len()
        ));
    }
    let reduces = matches!(
        coll,
        CollKind::AllReduce | CollKind::ReduceScatter | CollKind::Reduce
    );
    let rooted = matches!(coll, CollKind::Broadcast | CollKind::Reduce);
    if rooted && a.root >= n {
        return Err(format!("-r {}: root out of range for {n} GPUs", a.root));
    }
    let ordinals: Vec<usize> = (0..n).collect();
    let cfg = railcc_core::Config::from_env().map_err(|e| e.to_string())?;
    let mut mg = MultiGpu::new(&ordinals).map_err(|e| e.to_string())?;
    mg.timeout_ns = cfg.timeout_ms.saturating_mul(1_000_000);
    let blocks = mg
        .set_max_blocks(cfg.gpu_max_blocks)
        .map_err(|e| e.to_string())?;
    println!("# railcc bench {} --device cuda: {n} GPU(s) in one process, kernels over peer access, up to {blocks} blocks per GPU", coll.name());
    for g in &gpus[..n] {
        println!(
            "#  GPU {} {} bus {} sm_{}{} ({} SMs)",
            g.ordinal, g.name, g.pci_bus_id, g.compute_capability.0, g.compute_capability.1, g.sms
        );
    }
    for i in 0..n {
        for j in 0..n {
            if i != j {
                let (can, rank) =
                    railcc_transport_nvlink::driver::peer(i, j).map_err(|e| e.to_string())?;
                println!("#  peer {i}->{j}: access {can}, performance rank {rank}");
            }
        }
    }
    println!("#");
    println!("#                                                              out-of-place                       in-place          ");
    println!("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong  blocks");
    println!("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)           ");
    let dts: Vec<DataType> = if a.dtype == "all" {
        DataType::ALL.to_vec()
    } else {
        a.dtype
            .split(',')
            .map(|x| x.parse())
            .collect::<Result<_, _>>()?
    };
    let ops: Vec<ReduceOp> = if !reduces {
        vec![ReduceOp::Sum]
    } else if a.op == "all" {
        ReduceOp::ALL.to_vec()
    } else {
        a.op.split(',')
            .map(|x| x.parse())
            .collect::<Result<_, _>>()?
    };
    let mut total_wrong = 0u64;
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
                let (t_o, w_o, blocks) = one(&mg, &args, a, false)?;
                let in_place = coll != CollKind::SendRecv;
                let (t_i, w_i, _) = if in_place {
                    one(&mg, &args, a, true)?
                } else {
                    (0.0, 0, 0)
                };
                total_wrong += w_o + w_i;
                let bytes = total_bytes as f64;
                let side = |t: f64, w: u64| {
                    let algbw = if t > 0.0 { bytes / t / 1e9 } else { 0.0 };
                    format!(
                        "  {:>7.2}  {:>6.2}  {:>6.2}  {:>5}",
                        t * 1e6,
                        algbw,
                        algbw * bus_factor(coll, n),
                        if a.check != 0 {
                            w.to_string()
                        } else {
                            "N/A".into()
                        }
                    )
                };
                let ip = if in_place {
                    side(t_i, w_i)
                } else {
                    format!("  {:>7}  {:>6}  {:>6}  {:>5}", "N/A", "N/A", "N/A", "N/A")
                };
                let redop = if reduces { op.name() } else { "none" };
                let root = if rooted { a.root as i64 } else { -1 };
                println!(
                    "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}{}{}  {:>6}",
                    total_bytes,
                    args.count,
                    dt.name(),
                    redop,
                    root,
                    side(t_o, w_o),
                    ip,
                    blocks
                );
                size = if let Some(i) = a.step_bytes {
                    size + i.max(1)
                } else {
                    size * a.step_factor.max(2)
                };
            }
        }
    }
    println!("# Out of bounds values : 0 OK");
    println!("#");
    if total_wrong > 0 {
        return Err(format!("{total_wrong} wrong values"));
    }
    Ok(())
}

/// Checks once, warms up, times `iters` calls with CUDA events; returns (seconds per call,
/// wrong elements over all GPUs, blocks per GPU).
fn one(
    mg: &MultiGpu,
    args: &CollArgs,
    a: &BenchArgs,
    in_place: bool,
) -> Result<(f64, u64, u32), String> {
    let n = mg.len();
    let es = args.dtype.size();
    let (send_b, recv_b) = (args.send_elems() * es, args.recv_elems() * es);
    let e = |x: railcc_core::Error| x.to_string();
    let inputs: Vec<Vec<u8>> = (0..n).map(|g| fill_input(args, g, SEED)).collect();
    // Out of place: separate send and receive buffers. In place: one backing buffer per GPU
    // with send and receive at NCCL's in-place offsets.
    let mut bufs: Vec<(DevBuf, Option<DevBuf>)> = Vec::with_capacity(n);
    let (mut ip, mut op) = (Vec::new(), Vec::new());
    for (g, input) in inputs.iter().enumerate() {
        if in_place {
            let (send, recv, total) = args.in_place_ranges(g);
            let b = mg.alloc(g, total).map_err(e)?;
            mg.upload(g, &b, &args.in_place_backing(g, input, &[]))
                .map_err(e)?;
            ip.push(b.ptr + send.start as u64);
            op.push(b.ptr + recv.start as u64);
            bufs.push((b, None));
        } else {
            let s = mg.alloc(g, send_b).map_err(e)?;
            let r = mg.alloc(g, recv_b).map_err(e)?;
            mg.upload(g, &s, input).map_err(e)?;
            ip.push(s.ptr);
            op.push(r.ptr);
            bufs.push((s, Some(r)));
        }
    }
    let mut wrong = 0;
    let launch_once = || {
        // SAFETY: every pointer lies in a live allocation of the size the collective implies,
        // kept until this function synchronizes (download and the timer wait on the streams).
        unsafe {
            mg.collective(
                args.coll, &ip, &op, args.count, args.dtype, args.op, args.root,
            )
        }
        .map_err(e)
    };
    let launch = launch_once()?;
    if a.check != 0 {
        for (g, (b, r)) in bufs.iter().enumerate() {
            let (src, off) = match r {
                Some(r) => (r, 0),
                None => (b, (op[g] - b.ptr) as usize),
            };
            let mut host = vec![0u8; off + recv_b];
            mg.download(g, src, &mut host).map_err(e)?;
            wrong += count_wrong(args, g, &host[off..], SEED);
        }
    }
    for _ in 0..a.warmup {
        launch_once()?;
    }
    let t0 = mg.record_timer(0).map_err(e)?;
    for _ in 0..a.iters {
        launch_once()?;
    }
    let t1 = mg.record_timer(0).map_err(e)?;
    let ms = t0.elapsed_ms(&t1).map_err(e)?;
    mg.synchronize().map_err(e)?;
    Ok((
        ms as f64 / 1e3 / a.iters.max(1) as f64,
        wrong,
        launch.blocks_per_gpu,
    ))
}
