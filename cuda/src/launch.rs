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
    /// The bulk kernel's wide loop: every input's data of two vectors loaded at once
    /// (`RAILCC_GPU_WIDE_LOADS`).
    pub wide: bool,
    /// Reductions whose addresses allow it move their inputs (1; 2: and their outputs) by bulk
    /// async copies, on GPUs that have them (`crate::tma`, `RAILCC_GPU_WIDE_LOADS=2`, `=3`).
    pub tma: u8,
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
    // The TMA form (tma.rs) where it was asked for and the GPU and the addresses allow it: the
    // same first eleven parameters, then its tile and whether it stores by bulk copies.
    let stores = shape.tma >= 2;
    let tma = shape.tma > 0 && gpu.has_tma() && crate::tma::usable(s, shape.dt, stores);
    // A single input is a copy: use the plain sum kernel so avg does not divide it.
    let kop = if s.ins.len() == 1 {
        ReduceOp::Sum
    } else {
        shape.op
    };
    let f = if tma {
        gpu.tma_func(shape.dt, kop)?
    } else {
        gpu.func(shape.dt, kop)?
    };
    let (mut pin, mut pout, mut psync) = (ptrs(&s.ins), ptrs(&s.outs), ptrs(shape.syncs));
    let (mut n_in, mut n_out) = (s.ins.len() as i32, s.outs.len() as i32);
    let (mut b, mut e) = s.range;
    let mut avg_n = shape.avg_n;
    let mut n_gpus = shape.syncs.len() as i32;
    let mut me_i = me as i32;
    let mut timeout = shape.timeout_ns;
    let mut wide = i32::from(shape.wide);
    let mut tile = crate::tma::tile_bytes(s.ins.len(), stores);
    let mut bulk_out = i32::from(stores);
    // Twelve parameters, thirteen for the TMA form; a fixed array (this runs for every bulk
    // launch: no allocation).
    let mut params: [*mut c_void; 13] = [
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
        &mut wide as *mut i32 as *mut c_void,
        std::ptr::null_mut(),
    ];
    let (used, smem) = if tma {
        params[11] = &mut tile as *mut u64 as *mut c_void;
        params[12] = &mut bulk_out as *mut i32 as *mut c_void;
        (13, crate::tma::smem_bytes(s.ins.len(), stores))
    } else {
        (12, 0)
    };
    // SAFETY: the parameters match the kernel's signature (kernels.rs, tma.rs) and live
    // across the call; a TMA kernel's dynamic shared memory limit was raised to
    // tma::SMEM_BYTES at load (gpu.rs); the caller vouches for the pointers.
    unsafe {
        enqueue_smem(
            f,
            shape.blocks,
            THREADS,
            smem,
            stream,
            &mut params[..used],
            "cuLaunchKernel",
        )
    }
}

/// Enqueues GPU `me`'s bulk kernel in its late form (late.rs) on `stream`: its `n_in` inputs,
/// outputs and range are read from `slot` once the launcher has filled it.
///
/// # Safety
/// `slot.host` a host slot of mapped pinned memory and `slot.dev` a device slot of this GPU's
/// sync area, both live until the stream passes the kernel; what the launcher will write
/// obeys [`launch`]'s contract; `shape.syncs` as for [`launch`].
pub unsafe fn launch_late(
    gpu: &GpuCtx,
    stream: sys::CUstream,
    me: usize,
    n_in: usize,
    slot: crate::late::LateSlot,
    shape: &CallShape<'_>,
) -> Result<()> {
    gpu.bind()?;
    // A single input is a copy: the plain sum kernel, as `launch` takes.
    let kop = if n_in == 1 { ReduceOp::Sum } else { shape.op };
    let f = gpu.late_func(shape.dt, kop)?;
    let (mut host, mut dev, mut tok, mut psync) =
        (slot.host, slot.dev, slot.token, ptrs(shape.syncs));
    let mut avg_n = shape.avg_n;
    let mut n_gpus = shape.syncs.len() as i32;
    let mut me_i = me as i32;
    let mut timeout = shape.timeout_ns;
    let mut wide = i32::from(shape.wide);
    let mut params: [*mut c_void; 9] = [
        &mut host as *mut u64 as *mut c_void,
        &mut dev as *mut u64 as *mut c_void,
        &mut tok as *mut u32 as *mut c_void,
        &mut avg_n as *mut i32 as *mut c_void,
        &mut psync as *mut Ptrs as *mut c_void,
        &mut n_gpus as *mut i32 as *mut c_void,
        &mut me_i as *mut i32 as *mut c_void,
        &mut timeout as *mut u64 as *mut c_void,
        &mut wide as *mut i32 as *mut c_void,
    ];
    // SAFETY: the parameters match the late kernel's signature (kernels.rs) and live across
    // the call; the caller vouches for the slot and the pointers it will hold.
    unsafe {
        enqueue(
            f,
            shape.blocks,
            THREADS,
            stream,
            &mut params,
            "cuLaunchKernel (late arguments)",
        )
    }
}

/// A step of a send or receive between processes (kernels::P2P_KERNELS, in order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum P2pStep {
    /// Sender: the data is written; tell the receiver.
    Ready = 0,
    /// Receiver: wait until the sender's data is ready.
    WaitReady = 1,
    /// Receiver: the copy is done; tell the sender.
    Copied = 2,
    /// Sender: wait until the receiver has copied.
    WaitCopied = 3,
}

/// Enqueues one p2p step (a one-thread kernel) on `stream`: `mine` is this GPU's area,
/// `theirs` the peer's as this GPU addresses it. `lag` (WaitCopied only): how many of this
/// rank's latest messages to the peer may still be uncopied.
///
/// # Safety
/// Both areas must be live for the communicator's life (the peer's mapped by IPC).
pub unsafe fn p2p_step(
    gpu: &GpuCtx,
    stream: sys::CUstream,
    (step, lag): (P2pStep, u64),
    (mine, theirs): (u64, u64),
    (me, peer): (usize, usize),
    timeout_ns: u64,
) -> Result<()> {
    let f = gpu.p2p_func(step as usize)?;
    let (mut a, mut b, mut m, mut p, mut t, mut l) =
        (mine, theirs, me as i32, peer as i32, timeout_ns, lag);
    let mut params: [*mut c_void; 6] = [
        &mut a as *mut u64 as *mut c_void,
        &mut b as *mut u64 as *mut c_void,
        &mut m as *mut i32 as *mut c_void,
        &mut p as *mut i32 as *mut c_void,
        &mut t as *mut u64 as *mut c_void,
        &mut l as *mut u64 as *mut c_void,
    ];
    // SAFETY: the parameters match the p2p kernels' common signature (kernels.rs); the
    // caller vouches for the areas.
    unsafe { enqueue(f, 1, 1, stream, &mut params, "cuLaunchKernel(p2p)") }
}

/// Where a premultiplied sum's scalar lives (NCCL's ncclScalarResidence_t).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scalar {
    /// Device memory, read when the kernel runs.
    Device(u64),
    /// The value's bytes, little-endian in the low bytes (read at op creation).
    Host(u64),
}

/// Enqueues `dst[i] = src[i] * scalar` for `n` elements of `dt` on `stream` (`dst` may be
/// `src`).
///
/// # Safety
/// `src` and `dst` must be device memory of this GPU valid for `n` elements, and a
/// `Scalar::Device` address valid for one element, until the stream passes the kernel.
pub unsafe fn scale(
    gpu: &GpuCtx,
    stream: sys::CUstream,
    dt: DataType,
    src: u64,
    dst: u64,
    n: u64,
    scalar: Scalar,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    gpu.bind()?;
    let f = gpu.scale_func(dt)?;
    let (mut sp, mut bits) = match scalar {
        Scalar::Device(p) => (p, 0u64),
        Scalar::Host(b) => (0u64, b),
    };
    let (mut src, mut dst, mut n_) = (src, dst, n);
    let blocks = n
        .div_ceil(THREADS as u64 * 8)
        .clamp(1, gpu.sms.max(1) as u64 * 4) as u32;
    let mut params: [*mut c_void; 5] = [
        &mut src as *mut u64 as *mut c_void,
        &mut dst as *mut u64 as *mut c_void,
        &mut n_ as *mut u64 as *mut c_void,
        &mut sp as *mut u64 as *mut c_void,
        &mut bits as *mut u64 as *mut c_void,
    ];
    // SAFETY: the parameters match the scale kernel's signature (kernels.rs `scale_source`);
    // the caller vouches for the pointers.
    unsafe {
        enqueue(
            f,
            blocks,
            THREADS,
            stream,
            &mut params,
            "cuLaunchKernel(scale)",
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
    unsafe { enqueue_smem(f, blocks, threads, 0, stream, params, what) }
}

/// As [`enqueue`], with `smem` bytes of dynamic shared memory per block.
///
/// # Safety
/// As [`enqueue`]; `f` must allow `smem` bytes of dynamic shared memory.
pub(crate) unsafe fn enqueue_smem(
    f: sys::CUfunction,
    blocks: u32,
    threads: u32,
    smem: u32,
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
                smem,
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
        let Some(gpus) = crate::driver::gpus_or_skip("wide accumulation on the GPU") else {
            return;
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
            // Both loops of the bulk kernel: one input at a time, and every input at once.
            for loads in [false, true] {
                let shape = CallShape {
                    dt,
                    op: ReduceOp::Sum,
                    syncs: &[gpu.sync.ptr],
                    avg_n: 8,
                    blocks: 4,
                    timeout_ns: 10_000_000_000,
                    wide: loads,
                    tma: 0,
                };
                gpu.upload(&out, 0, &vec![0u8; count * 2]).expect("clear");
                // SAFETY: every pointer is a live allocation of `count` elements on this
                // GPU, kept until the synchronize below.
                unsafe { launch(&gpu, gpu.stream, 0, &s, &shape) }.expect("launch");
                gpu.synchronize().expect("kernel ran");
                let mut host = vec![0u8; count * 2];
                gpu.download(&out, 0, &mut host).expect("download");
                let got: Vec<f32> = host.chunks_exact(2).map(|b| dec([b[0], b[1]])).collect();
                let bad = got.iter().filter(|&&v| v != wide).count();
                println!(
                    "wide accumulation {dt}: {big} + 7 x 1 on the GPU = {} in every element ({bad} differ); storage-type accumulation gives {narrow} (8 inputs loaded at once: {loads})",
                    got[0]
                );
                assert_eq!(
                    bad, 0,
                    "{dt} (wide loads {loads}): first {}, want {wide}",
                    got[0]
                );
            }
        }
    }

    /// On a GPU: the scale kernel (premultiplied sums) with a host scalar, a device scalar
    /// and in place, for f32, i32 (wrapping) and fp8 (rounded). Without a driver: a skip line.
    #[test]
    fn scale_by_host_and_device_scalars() {
        let Some(gpus) = crate::driver::gpus_or_skip("scale kernel on the GPU") else {
            return;
        };
        let gpu = GpuCtx::new(gpus[0].ordinal, None).expect("context");
        let n = 1000usize;
        let run = |dt: DataType, src: &[u8], scalar: Scalar, in_place: bool| -> Vec<u8> {
            let a = gpu.alloc(src.len()).expect("alloc");
            let b = gpu.alloc(src.len()).expect("alloc");
            gpu.upload(&a, 0, src).expect("upload");
            let dst = if in_place { a.ptr } else { b.ptr };
            // SAFETY: both allocations hold n elements and live until the synchronize.
            unsafe { scale(&gpu, gpu.stream, dt, a.ptr, dst, n as u64, scalar) }.expect("scale");
            gpu.synchronize().expect("kernel ran");
            let mut out = vec![0u8; src.len()];
            gpu.download(if in_place { &a } else { &b }, 0, &mut out)
                .expect("download");
            out
        };
        let f: Vec<f32> = (0..n).map(|i| i as f32 - 300.0).collect();
        let fb: Vec<u8> = f.iter().flat_map(|v| v.to_le_bytes()).collect();
        let host = run(
            DataType::F32,
            &fb,
            Scalar::Host(2.5f32.to_bits() as u64),
            false,
        );
        let s3 = gpu.alloc(4).expect("alloc");
        gpu.upload(&s3, 0, &3.0f32.to_le_bytes()).expect("upload");
        let dev = run(DataType::F32, &fb, Scalar::Device(s3.ptr), true);
        let dec = |b: &[u8]| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        assert_eq!(dec(&host), f.iter().map(|v| v * 2.5).collect::<Vec<_>>());
        assert_eq!(dec(&dev), f.iter().map(|v| v * 3.0).collect::<Vec<_>>());
        let i: Vec<u8> = (0..n as i32)
            .flat_map(|v| (v * 5_000_000).to_le_bytes())
            .collect();
        let got = run(DataType::I32, &i, Scalar::Host(1000), false);
        let want: Vec<u8> = (0..n as i32)
            .flat_map(|v| (v * 5_000_000).wrapping_mul(1000).to_le_bytes())
            .collect();
        assert_eq!(got, want, "i32 wraps");
        let e: Vec<u8> = (0..n).map(|k| (k % 120) as u8).collect();
        let two = float8::F8E4M3::from_f32(2.0).to_bits() as u64;
        let got = run(DataType::F8E4M3, &e, Scalar::Host(two), false);
        let want: Vec<u8> = e
            .iter()
            .map(|&x| {
                float8::F8E4M3::from_f32(float8::F8E4M3::from_bits(x).to_f32() * 2.0).to_bits()
            })
            .collect();
        assert_eq!(got, want, "e4m3 times 2");
        println!("scale kernel: f32 host and device scalars, i32 wrapping, e4m3 rounding: ok");
    }

    /// On a GPU: the sum kernel over every pair of fp8 values (65,536 pairs, NaN inputs left
    /// out) equals the host's float8 rounding of the f32 sum (nearest even, saturating; any
    /// NaN matches any NaN), and prod and max likewise. Without a driver: a skip line.
    #[test]
    fn fp8_matches_the_host_rounding() {
        use float8::{F8E4M3, F8E5M2};
        let Some(gpus) = crate::driver::gpus_or_skip("fp8 rounding on the GPU") else {
            return;
        };
        let gpu = GpuCtx::new(gpus[0].ordinal, None).expect("context");
        let a: Vec<u8> = (0..65536u32).map(|i| (i >> 8) as u8).collect();
        let b: Vec<u8> = (0..65536u32).map(|i| i as u8).collect();
        let (da, db, out) = (
            gpu.alloc(a.len()).expect("alloc"),
            gpu.alloc(b.len()).expect("alloc"),
            gpu.alloc(a.len()).expect("alloc"),
        );
        gpu.upload(&da, 0, &a).expect("upload");
        gpu.upload(&db, 0, &b).expect("upload");
        for dt in [DataType::F8E4M3, DataType::F8E5M2] {
            let to = |x: u8| match dt {
                DataType::F8E4M3 => F8E4M3::from_bits(x).to_f32(),
                _ => F8E5M2::from_bits(x).to_f32(),
            };
            let from = |v: f32| match dt {
                DataType::F8E4M3 => F8E4M3::from_f32(v).to_bits(),
                _ => F8E5M2::from_f32(v).to_bits(),
            };
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max] {
                let s = Spec {
                    ins: vec![da.ptr, db.ptr],
                    outs: vec![out.ptr],
                    range: (0, a.len() as u64),
                };
                let shape = CallShape {
                    dt,
                    op,
                    syncs: &[gpu.sync.ptr],
                    avg_n: 2,
                    blocks: 8,
                    timeout_ns: 10_000_000_000,
                    wide: op == ReduceOp::Max,
                    tma: 0,
                };
                // SAFETY: three live allocations of 65,536 bytes on this GPU, kept until the
                // synchronize below.
                unsafe { launch(&gpu, gpu.stream, 0, &s, &shape) }.expect("launch");
                gpu.synchronize().expect("kernel ran");
                let mut got = vec![0u8; a.len()];
                gpu.download(&out, 0, &mut got).expect("download");
                let mut bad = 0;
                for i in 0..a.len() {
                    let (x, y) = (to(a[i]), to(b[i]));
                    if x.is_nan() || y.is_nan() {
                        continue;
                    }
                    let want = match op {
                        ReduceOp::Sum => from(x + y),
                        ReduceOp::Prod => from(x * y),
                        _ => from(if y > x { y } else { x }),
                    };
                    // inf + -inf: both sides give a NaN, encoded with different signs.
                    if got[i] != want && !(to(got[i]).is_nan() && to(want).is_nan()) {
                        if bad < 5 {
                            println!("{dt} {op}: {x} . {y} = {:#04x} on the GPU, {want:#04x} on the host", got[i]);
                        }
                        bad += 1;
                    }
                }
                println!("fp8 {dt} {op}: {bad} of 65536 pairs differ from the host");
                assert_eq!(bad, 0, "{dt} {op}");
            }
        }
    }
}
