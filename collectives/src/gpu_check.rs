//! A GPU result checked where it lies (`railcc_cuda::check`): the exact fill's pattern and the
//! call handed to the check kernel, which counts what differs from
//! [`reference::expected_value`] without the result crossing PCIe or the host computing
//! billions of reference values (issue 30: minutes at 1 GB on 4 GPUs).

use crate::reference::Pattern;
use railcc_core::call::CollArgs;
use railcc_core::Result;
use railcc_cuda::check::{coll_code, count_wrong, op_code, CheckArgs};
use railcc_cuda::gpu::GpuCtx;

/// The check kernel's arguments for `rank`'s result of call `a` filled with `seed`.
pub fn check_args(a: &CollArgs, rank: usize, seed: u64) -> Result<CheckArgs> {
    let p = Pattern::new(a, seed);
    Ok(CheckArgs {
        coll: coll_code(a.coll)?,
        op: op_code(a.op),
        nranks: a.nranks as i32,
        rank: rank as i32,
        root: a.root as i32,
        prod: i32::from(p.prod),
        signed: i32::from(p.signed),
        ones: i32::from(p.ones),
        fp8: i32::from(p.fp8),
        g: p.sparse.map_or(0, |g| g as i32),
        count: a.count as u64,
        seed: p.seed,
    })
}

/// How many elements of `rank`'s receive buffer at `out` (on `gpu`, `a.recv_elems()` long)
/// differ from the exact fill's expected result, counted on the GPU.
///
/// # Safety
/// `out` is device memory of `gpu` holding the call's receive buffer; the call is done.
pub unsafe fn count_wrong_on_gpu(
    gpu: &GpuCtx,
    a: &CollArgs,
    rank: usize,
    out: u64,
    seed: u64,
) -> Result<u64> {
    let args = check_args(a, rank, seed)?;
    // SAFETY: the caller's contract.
    unsafe { count_wrong(gpu, a.dtype, out, a.recv_elems() as u64, &args) }
}

/// Writes elements `elems` of `rank`'s exact-fill input for call `a` (as
/// [`reference::fill_input`] makes them) at `out` on `gpu`, and waits for it.
///
/// # Safety
/// `out` is device memory of `gpu` with room for `elems.len()` elements of `a.dtype`.
pub unsafe fn fill_on_gpu(
    gpu: &GpuCtx,
    a: &CollArgs,
    rank: usize,
    out: u64,
    seed: u64,
    elems: std::ops::Range<usize>,
) -> Result<()> {
    let args = check_args(a, rank, seed)?;
    // SAFETY: the caller's contract.
    unsafe {
        railcc_cuda::check::fill(
            gpu,
            a.dtype,
            out,
            elems.len() as u64,
            elems.start as u64,
            &args,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference;
    use railcc_core::call::CollKind;
    use railcc_core::{DataType, ReduceOp};

    /// On a GPU: for every collective, dtype and op (4 ranks, and 12 for fp8's sparse
    /// pattern), a correct result with 5 planted errors: the GPU counts what the host counts,
    /// the planted ones; and the GPU's fill of the inputs is the host's, byte for byte.
    /// Without a driver: a skip line.
    #[test]
    fn the_gpu_counts_what_the_host_counts() {
        let Some(gpus) = railcc_cuda::driver::gpus_or_skip("the GPU check of results") else {
            return;
        };
        let gpu = GpuCtx::new(gpus[0].ordinal, None).expect("context");
        let seed = 99;
        let mut cases = 0;
        let mut disagree = Vec::new();
        for coll in [
            CollKind::AllReduce,
            CollKind::Reduce,
            CollKind::ReduceScatter,
            CollKind::AllGather,
            CollKind::Broadcast,
            CollKind::AllToAll,
            CollKind::SendRecv,
        ] {
            let reduces = matches!(
                coll,
                CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
            );
            let ops: &[ReduceOp] = if reduces {
                &ReduceOp::ALL
            } else {
                &[ReduceOp::Sum]
            };
            for dt in DataType::ALL {
                for &op in ops {
                    for nranks in [4usize, 12] {
                        let a = CollArgs {
                            coll,
                            nranks,
                            count: 1003,
                            dtype: dt,
                            op,
                            root: 1,
                        };
                        let rank = 1; // the root: a reduce's result is checked
                        let es = dt.size();
                        let n = a.recv_elems();
                        let mut host = vec![0u8; n * es];
                        for (i, slot) in host.chunks_exact_mut(es).enumerate() {
                            let v = reference::expected_value(&a, rank, i, seed).unwrap_or(0.0);
                            reference::encode_one(dt, v, slot);
                        }
                        for k in 0..5 {
                            host[(k * 397 % n) * es] ^= 1;
                        }
                        let want = reference::count_wrong(&a, rank, &host, seed);
                        let buf = gpu.alloc(host.len()).expect("alloc");
                        gpu.upload(&buf, 0, &host).expect("upload");
                        // SAFETY: `buf` holds the receive buffer's `n` elements.
                        let got = unsafe { count_wrong_on_gpu(&gpu, &a, rank, buf.ptr, seed) }
                            .expect("GPU check");
                        cases += 1;
                        // The fill kernel writes what the host's fill makes (a part from
                        // element 7, as the bench writes an in-place call's send range).
                        let elems = 7..a.send_elems();
                        let host_in = reference::fill_part(&a, rank, seed, elems.clone());
                        let full = reference::fill_input(&a, rank, seed);
                        assert_eq!(host_in, full[7 * es..], "fill_part {dt}");
                        let fbuf = gpu.alloc(host_in.len()).expect("alloc");
                        // SAFETY: `fbuf` holds the part's elements.
                        unsafe { fill_on_gpu(&gpu, &a, rank, fbuf.ptr, seed, elems) }
                            .expect("GPU fill");
                        let mut back = vec![0u8; host_in.len()];
                        gpu.download(&fbuf, 0, &mut back).expect("download");
                        if back != host_in {
                            disagree.push(format!(
                                "{} {dt} {op:?} {nranks} ranks: the GPU's fill differs from the host's",
                                coll.name()
                            ));
                        }
                        if got != want || want != 5 {
                            disagree.push(format!(
                                "{} {dt} {op:?} {nranks} ranks: GPU {got}, host {want}, planted 5",
                                coll.name()
                            ));
                        }
                    }
                }
            }
        }
        println!(
            "GPU check of results: {cases} cases, {} disagree with the host",
            disagree.len()
        );
        assert!(disagree.is_empty(), "{}", disagree.join("\n"));
    }
}
