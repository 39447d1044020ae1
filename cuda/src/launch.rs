//! The bulk kernel's arguments for one GPU's part of a call (its inputs, outputs and element
//! range, and what every GPU of the call shares), and the launch itself. Which part each GPU
//! gets in each collective is the peer-to-peer transport's choice
//! (`railcc_transport_nvlink::plan`).

use crate::driver::check;
use crate::gpu::GpuCtx;
use crate::kernels::MAX_PEERS;
use cudarc::driver::sys;
use railcc_core::{DataType, ReduceOp, Result};
use std::ffi::c_void;

/// Threads per block of the bulk kernel (its `__launch_bounds__`, kernels.rs).
pub const THREADS: u32 = 512;

/// One GPU's part of a call: its inputs, its outputs, and the element range `[begin, end)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub ins: Vec<u64>,
    pub outs: Vec<u64>,
    pub range: (u64, u64),
}

/// The kernels' `Ptrs` argument (kernels.rs): up to MAX_PEERS device addresses.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Ptrs {
    p: [u64; MAX_PEERS],
}

pub(crate) fn ptrs(v: &[u64]) -> Ptrs {
    let mut p = Ptrs { p: [0; MAX_PEERS] };
    p.p[..v.len()].copy_from_slice(v);
    p
}

/// What every GPU of a call shares.
pub struct CallShape<'a> {
    pub dt: DataType,
    pub op: ReduceOp,
    /// Each GPU's sync area, as the launching GPU addresses it.
    pub syncs: &'a [u64],
    /// Reductions divide by this for avg (the GPU count).
    pub avg_n: i32,
    pub blocks: u32,
    pub timeout_ns: u64,
}

/// Enqueues GPU `me`'s kernel on `stream`.
///
/// # Safety
/// Every pointer in `s` and `shape.syncs` must be device memory that GPU `me` can address,
/// live until the stream passes this kernel, with `s.range` elements in bounds.
pub unsafe fn launch(
    gpu: &GpuCtx,
    stream: sys::CUstream,
    me: usize,
    s: &Spec,
    shape: &CallShape<'_>,
) -> Result<()> {
    gpu.bind()?;
    // A single input is a copy: use the plain sum kernel so avg does not divide it.
    let kop = if s.ins.len() == 1 {
        ReduceOp::Sum
    } else {
        shape.op
    };
    let f = gpu.func(shape.dt, kop)?;
    let (mut pin, mut pout, mut psync) = (ptrs(&s.ins), ptrs(&s.outs), ptrs(shape.syncs));
    let (mut n_in, mut n_out) = (s.ins.len() as i32, s.outs.len() as i32);
    let (mut b, mut e) = s.range;
    let mut avg_n = shape.avg_n;
    let mut n_gpus = shape.syncs.len() as i32;
    let mut me_i = me as i32;
    let mut timeout = shape.timeout_ns;
    let mut params: [*mut c_void; 11] = [
        &mut pin as *mut Ptrs as *mut c_void,
        &mut n_in as *mut i32 as *mut c_void,
        &mut pout as *mut Ptrs as *mut c_void,
        &mut n_out as *mut i32 as *mut c_void,
        &mut b as *mut u64 as *mut c_void,
        &mut e as *mut u64 as *mut c_void,
        &mut avg_n as *mut i32 as *mut c_void,
        &mut psync as *mut Ptrs as *mut c_void,
        &mut n_gpus as *mut i32 as *mut c_void,
        &mut me_i as *mut i32 as *mut c_void,
        &mut timeout as *mut u64 as *mut c_void,
    ];
    // SAFETY: the parameters match the kernel's signature (kernels.rs) and live across the
    // call; the caller vouches for the pointers.
    unsafe {
        enqueue(
            f,
            shape.blocks,
            THREADS,
            stream,
            &mut params,
            "cuLaunchKernel",
        )
    }
}

/// `cuLaunchKernel` of a 1-D grid with no dynamic shared memory.
///
/// # Safety
/// `params` must match `f`'s signature, and every pointer they carry must be valid for the
/// kernel until `stream` passes it (the driver copies the parameter values themselves).
pub(crate) unsafe fn enqueue(
    f: sys::CUfunction,
    blocks: u32,
    threads: u32,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
    what: &str,
) -> Result<()> {
    // SAFETY: forwarded from the caller.
    check(
        unsafe {
            sys::cuLaunchKernel(
                f,
                blocks,
                1,
                1,
                threads,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        },
        what,
    )
}

#[cfg(test)]
mod gpu_tests {
    use super::*;
    use half::{bf16, f16};

    /// On a GPU: one kernel reducing 8 f16/bf16 inputs accumulates in f32 and rounds once.
    /// 256 + 7 x 1 in bf16 (2048 + 7 x 1 in f16) loses every 1 when each partial sum is
    /// rounded to the storage type (256 + 1 rounds back to 256), and comes out as 263 rounded
    /// once (264) when accumulated wider. Without a driver: a skip line.
    #[test]
    fn wide_accumulation() {
        let gpus = match crate::driver::devices() {
            Ok(g) if !g.is_empty() => g,
            Ok(_) | Err(_) => {
                println!("SKIP wide accumulation on the GPU: no CUDA driver or GPU");
                return;
            }
        };
        let gpu = GpuCtx::new(gpus[0].ordinal, None).expect("context");
        let count = 4099usize;
        for (dt, big) in [(DataType::Bf16, 256.0f32), (DataType::F16, 2048.0)] {
            let enc = |v: f32| match dt {
                DataType::Bf16 => bf16::from_f32(v).to_le_bytes(),
                _ => f16::from_f32(v).to_le_bytes(),
            };
            let dec = |b: [u8; 2]| match dt {
                DataType::Bf16 => bf16::from_le_bytes(b).to_f32(),
                _ => f16::from_le_bytes(b).to_f32(),
            };
            let narrow = (0..7).fold(big, |acc, _| dec(enc(acc + 1.0)));
            let wide = dec(enc(big + 7.0));
            assert_eq!((narrow, wide), (big, big + 8.0), "{dt}: the test's premise");
            let bufs: Vec<_> = (0..8)
                .map(|i| {
                    let b = gpu.alloc(count * 2).expect("alloc");
                    let v = enc(if i == 0 { big } else { 1.0 });
                    let host: Vec<u8> = (0..count).flat_map(|_| v).collect();
                    gpu.upload(&b, 0, &host).expect("upload");
                    b
                })
                .collect();
            let out = gpu.alloc(count * 2).expect("alloc");
            let s = Spec {
                ins: bufs.iter().map(|b| b.ptr).collect(),
                outs: vec![out.ptr],
                range: (0, count as u64),
            };
            let shape = CallShape {
                dt,
                op: ReduceOp::Sum,
                syncs: &[gpu.sync.ptr],
                avg_n: 8,
                blocks: 4,
                timeout_ns: 10_000_000_000,
            };
            // SAFETY: every pointer is a live allocation of `count` elements on this GPU,
            // kept until the synchronize below.
            unsafe { launch(&gpu, gpu.stream, 0, &s, &shape) }.expect("launch");
            gpu.synchronize().expect("kernel ran");
            let mut host = vec![0u8; count * 2];
            gpu.download(&out, 0, &mut host).expect("download");
            let got: Vec<f32> = host.chunks_exact(2).map(|b| dec([b[0], b[1]])).collect();
            let bad = got.iter().filter(|&&v| v != wide).count();
            println!(
                "wide accumulation {dt}: {big} + 7 x 1 on the GPU = {} in every element ({bad} differ); storage-type accumulation gives {narrow}",
                got[0]
            );
            assert_eq!(bad, 0, "{dt}: first {}, want {wide}", got[0]);
        }
    }
}
