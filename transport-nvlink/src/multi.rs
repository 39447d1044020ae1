//! One process driving several GPUs (like `ncclCommInitAll`): a stream-ordered all-reduce.
//!
//! A call enqueues one kernel on every GPU's stream and returns at once. The kernels meet at two
//! barriers made of flags in each GPU's memory, written by peers over NVLink: "my inputs are
//! ready" at the start and "I am done with your memory" at the end, so a kernel ends only when
//! no peer still reads its inputs or writes its outputs. Between them, each GPU reduces its
//! segment by reading every peer's input and writes the result to every peer's output, so each
//! link direction carries the data once. A peer that never arrives makes the kernel trap after
//! `timeout_ns` (the call then fails) instead of hanging.

use crate::driver::{available, check, device, nvrtc_available};
use crate::kernels::{kernel_name, source, MAX_BLOCKS, MAX_PEERS, SYNC_BYTES};
use cudarc::driver::sys;
use railcc_core::net::CollKind;
use railcc_core::{DataType, Error, ErrorKind, ReduceOp, Result};
use std::collections::HashMap;
use std::ffi::{c_void, CString};

/// Device memory on one GPU, freed on drop.
pub struct DevBuf {
    pub ptr: u64,
    pub bytes: usize,
    ctx: sys::CUcontext,
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from cuMemAlloc in `ctx` and is freed once.
        unsafe {
            let _ = sys::cuCtxSetCurrent(self.ctx);
            let _ = sys::cuMemFree_v2(self.ptr);
        }
    }
}

struct Gpu {
    ctx: sys::CUcontext,
    /// Flags that peers write (see kernels.rs); zeroed at creation.
    sync: u64,
    stream: sys::CUstream,
    funcs: HashMap<(DataType, ReduceOp), sys::CUfunction>,
    sms: i32,
}

/// The GPUs of this process, with peer access enabled between every pair.
pub struct MultiGpu {
    gpus: Vec<Gpu>,
    /// Call counter shared by every GPU's kernels; flags compare against it.
    epoch: std::sync::atomic::AtomicU64,
    /// How long a kernel spins for a peer before it traps (and the call fails).
    pub timeout_ns: u64,
    pub ordinals: Vec<usize>,
    /// Thread blocks per GPU per call (the SMs a call occupies), capped by work.
    pub max_blocks: u32,
}

// SAFETY: the raw CUDA handles are only used through &self/&mut self methods that bind the
// right context first; the driver API is thread-safe.
unsafe impl Send for MultiGpu {}

#[repr(C)]
#[derive(Clone, Copy)]
struct Ptrs {
    p: [u64; MAX_PEERS],
}

/// One GPU's part of a call: its inputs, its outputs, and the element range.
type LaunchSpec = (Vec<u64>, Vec<u64>, (u64, u64));

/// What one call launched.
#[derive(Debug, Clone, Copy)]
pub struct Launch {
    pub blocks_per_gpu: u32,
    pub threads_per_block: u32,
}

const THREADS: u32 = 512;

impl MultiGpu {
    pub fn new(ordinals: &[usize]) -> Result<MultiGpu> {
        available()?;
        nvrtc_available()?;
        if ordinals.is_empty() || ordinals.len() > MAX_PEERS {
            return Err(Error::invalid(format!(
                "multi-GPU: {} GPUs requested, 1 to {MAX_PEERS} supported",
                ordinals.len()
            )));
        }
        let mut gpus = Vec::new();
        let mut arch_major = 0;
        for &o in ordinals {
            let d = device(o)?;
            let mut ctx: sys::CUcontext = std::ptr::null_mut();
            let (mut maj, mut sms) = (0, 0);
            // SAFETY: valid out-pointers; the primary context is retained for the process.
            unsafe {
                check(
                    sys::cuDevicePrimaryCtxRetain(&mut ctx, d),
                    "cuDevicePrimaryCtxRetain",
                )?;
                check(sys::cuCtxSetCurrent(ctx), "cuCtxSetCurrent")?;
                check(
                    sys::cuDeviceGetAttribute(
                        &mut maj,
                        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                        d,
                    ),
                    "cuDeviceGetAttribute",
                )?;
                check(
                    sys::cuDeviceGetAttribute(
                        &mut sms,
                        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                        d,
                    ),
                    "cuDeviceGetAttribute",
                )?;
            }
            arch_major = maj;
            let mut stream: sys::CUstream = std::ptr::null_mut();
            // SAFETY: valid out-pointers in the current context.
            unsafe {
                check(
                    sys::cuStreamCreate(
                        &mut stream,
                        sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                    ),
                    "cuStreamCreate",
                )?;
            }
            let mut sync = 0;
            // SAFETY: valid out-pointer; the allocation is zeroed before any kernel reads it.
            unsafe {
                check(sys::cuMemAlloc_v2(&mut sync, SYNC_BYTES), "cuMemAlloc")?;
                check(sys::cuMemsetD8_v2(sync, 0, SYNC_BYTES), "cuMemsetD8")?;
            }
            gpus.push(Gpu {
                ctx,
                sync,
                stream,
                funcs: HashMap::new(),
                sms,
            });
        }
        // Peer access between every pair.
        for (i, &a) in ordinals.iter().enumerate() {
            for (j, &b) in ordinals.iter().enumerate() {
                if i == j {
                    continue;
                }
                let (can, _) = crate::driver::peer(a, b)?;
                if !can {
                    return Err(Error::new(
                        ErrorKind::Unsupported,
                        format!("GPU {a} cannot access GPU {b}'s memory (no P2P)"),
                    )
                    .transport(crate::NAME));
                }
                // SAFETY: both contexts are live; enabling twice reports ALREADY_ENABLED.
                let r = unsafe {
                    check(sys::cuCtxSetCurrent(gpus[i].ctx), "cuCtxSetCurrent")?;
                    sys::cuCtxEnablePeerAccess(gpus[j].ctx, 0)
                };
                if r != sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
                    check(r, "cuCtxEnablePeerAccess")?;
                }
            }
        }
        // Compile once for the architecture, load into every context.
        let arch: &'static str = match arch_major {
            9 => "compute_90",
            10 => "compute_100",
            8 => "compute_80",
            _ => "compute_70",
        };
        let t0 = std::time::Instant::now();
        let opts = cudarc::nvrtc::CompileOptions {
            arch: Some(arch),
            ..Default::default()
        };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(source(), opts).map_err(|e| {
            Error::new(ErrorKind::Io, format!("NVRTC compile failed: {e:?}")).transport(crate::NAME)
        })?;
        tracing::info!(
            "NVRTC compiled the kernels for {arch} in {:?}",
            t0.elapsed()
        );
        let image = CString::new(ptx.to_src())
            .map_err(|_| Error::new(ErrorKind::Io, "PTX contains a NUL byte"))?;
        for g in gpus.iter_mut() {
            let mut module: sys::CUmodule = std::ptr::null_mut();
            // SAFETY: `image` is NUL-terminated PTX; the context is live.
            unsafe {
                check(sys::cuCtxSetCurrent(g.ctx), "cuCtxSetCurrent")?;
                check(
                    sys::cuModuleLoadData(&mut module, image.as_ptr() as *const c_void),
                    "cuModuleLoadData",
                )?;
            }
            for dt in DataType::ALL {
                for op in ReduceOp::ALL {
                    let name = CString::new(kernel_name(dt, op))
                        .map_err(|_| Error::invalid("kernel name"))?;
                    let mut f: sys::CUfunction = std::ptr::null_mut();
                    // SAFETY: module loaded above; `name` is NUL-terminated.
                    check(
                        unsafe { sys::cuModuleGetFunction(&mut f, module, name.as_ptr()) },
                        "cuModuleGetFunction",
                    )?;
                    g.funcs.insert((dt, op), f);
                }
            }
        }
        // Every block of every GPU must be resident at once (they wait for each other), so
        // use at most one block per SM.
        let max_blocks = gpus
            .iter()
            .map(|g| g.sms as u32)
            .min()
            .unwrap_or(1)
            .min(MAX_BLOCKS as u32);
        Ok(MultiGpu {
            gpus,
            epoch: std::sync::atomic::AtomicU64::new(0),
            timeout_ns: 30_000_000_000,
            ordinals: ordinals.to_vec(),
            max_blocks,
        })
    }

    /// Sets the blocks per GPU (0: one per SM), clamped to what stays resident at once.
    pub fn set_max_blocks(&mut self, want: usize) -> Result<u32> {
        let sms = self.gpus.iter().map(|g| g.sms).min().unwrap_or(1).max(1) as u32;
        let mut per_sm = 1;
        if let Some(f) = self.gpus.first().and_then(|g| g.funcs.values().next()) {
            self.bind(0)?;
            // SAFETY: valid out-pointer and a loaded function.
            check(
                unsafe {
                    sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                        &mut per_sm,
                        *f,
                        THREADS as i32,
                        0,
                    )
                },
                "cuOccupancyMaxActiveBlocksPerMultiprocessor",
            )?;
        }
        let resident = sms * per_sm.max(1) as u32;
        let want = if want == 0 { sms } else { want as u32 };
        self.max_blocks = want.clamp(1, resident.min(MAX_BLOCKS as u32));
        Ok(self.max_blocks)
    }

    pub fn len(&self) -> usize {
        self.gpus.len()
    }

    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty()
    }

    pub fn stream(&self, g: usize) -> sys::CUstream {
        self.gpus[g].stream
    }

    fn bind(&self, g: usize) -> Result<()> {
        // SAFETY: the context is live for the lifetime of self.
        check(
            unsafe { sys::cuCtxSetCurrent(self.gpus[g].ctx) },
            "cuCtxSetCurrent",
        )
    }

    pub fn alloc(&self, g: usize, bytes: usize) -> Result<DevBuf> {
        self.bind(g)?;
        let mut ptr = 0;
        // SAFETY: valid out-pointer in the bound context.
        check(
            unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes.max(1)) },
            "cuMemAlloc",
        )?;
        Ok(DevBuf {
            ptr,
            bytes,
            ctx: self.gpus[g].ctx,
        })
    }

    pub fn upload(&self, g: usize, dst: &DevBuf, data: &[u8]) -> Result<()> {
        if data.len() > dst.bytes {
            return Err(Error::invalid("upload larger than the device buffer"));
        }
        self.bind(g)?;
        // SAFETY: `dst` holds at least data.len() bytes (checked); `data` is valid host memory.
        check(
            unsafe { sys::cuMemcpyHtoD_v2(dst.ptr, data.as_ptr() as *const c_void, data.len()) },
            "cuMemcpyHtoD",
        )?;
        // From pageable memory the copy may return before its DMA lands, and our streams do not
        // wait for the legacy stream: wait here so later kernels see the data.
        // SAFETY: the bound context is live.
        check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
    }

    pub fn download(&self, g: usize, src: &DevBuf, out: &mut [u8]) -> Result<()> {
        if out.len() > src.bytes {
            return Err(Error::invalid("download larger than the device buffer"));
        }
        self.synchronize()?;
        self.bind(g)?;
        // SAFETY: `src` holds at least out.len() bytes (checked); `out` is valid host memory.
        check(
            unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr() as *mut c_void, src.ptr, out.len()) },
            "cuMemcpyDtoH",
        )
    }

    pub fn synchronize(&self) -> Result<()> {
        for (g, gpu) in self.gpus.iter().enumerate() {
            self.bind(g)?;
            // SAFETY: the stream is live.
            check(
                unsafe { sys::cuStreamSynchronize(gpu.stream) },
                "cuStreamSynchronize",
            )?;
        }
        Ok(())
    }

    /// Enqueues an all-reduce of `count` elements: `outs[g]` on every GPU gets the reduction of
    /// every `ins[g]`. In place when `ins[g] == outs[g]`. Returns at once (stream-ordered).
    ///
    /// # Safety
    /// Each `ins[g]`/`outs[g]` must be device memory of GPU g holding `count` elements of `dt`,
    /// valid until the streams pass this call.
    pub unsafe fn all_reduce(
        &self,
        ins: &[u64],
        outs: &[u64],
        count: usize,
        dt: DataType,
        op: ReduceOp,
    ) -> Result<Launch> {
        self.collective(CollKind::AllReduce, ins, outs, count, dt, op, 0)
    }

    /// Enqueues one collective, with NCCL's buffer conventions: `count` is the per-rank count
    /// (all_gather: send count; reduce_scatter: receive count), `ins[g]`/`outs[g]` are GPU g's
    /// send and receive buffers. Supported: all_reduce, reduce_scatter, all_gather, broadcast,
    /// reduce, sendrecv (out of place only).
    ///
    /// # Safety
    /// Each buffer must be device memory of its GPU, of the size the collective implies, valid
    /// until the streams pass this call.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn collective(
        &self,
        coll: CollKind,
        ins: &[u64],
        outs: &[u64],
        count: usize,
        dt: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<Launch> {
        let n = self.gpus.len();
        if ins.len() != n || outs.len() != n {
            return Err(Error::invalid(format!(
                "{}: {} inputs and {} outputs for {n} GPUs",
                coll.name(),
                ins.len(),
                outs.len()
            )));
        }
        if root >= n {
            return Err(Error::invalid(format!(
                "{}: root {root} out of range for {n} GPUs",
                coll.name()
            )));
        }
        let es = dt.size() as u64;
        let at = |p: u64, elems: usize| p + elems as u64 * es;
        // Segments in multiples of 16 bytes so every GPU's vector loop covers its whole share.
        let v = 16 / dt.size();
        let seg = |g: usize| {
            let per = count.div_ceil(v).div_ceil(n) * v;
            (
                (g * per).min(count) as u64,
                ((g + 1) * per).min(count) as u64,
            )
        };
        let full = (0u64, count as u64);
        let mut specs: Vec<LaunchSpec> = Vec::with_capacity(n);
        for g in 0..n {
            specs.push(match coll {
                // Each GPU reduces its segment from every input into every output.
                CollKind::AllReduce => (ins.to_vec(), outs.to_vec(), seg(g)),
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
                CollKind::Reduce => (ins.to_vec(), vec![outs[root]], seg(g)),
                // Each GPU pushes its buffer to the next GPU.
                CollKind::SendRecv => (vec![ins[g]], vec![outs[(g + 1) % n]], full),
                other => {
                    return Err(Error::new(
                        ErrorKind::Unsupported,
                        format!("{} is not on the GPU path yet", other.name()),
                    )
                    .transport(crate::NAME))
                }
            });
        }
        if coll == CollKind::SendRecv && ins.iter().zip(outs).any(|(a, b)| a == b) {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "in-place sendrecv is not on the GPU path yet",
            )
            .transport(crate::NAME));
        }
        let most = specs
            .iter()
            .map(|s| (s.2 .1 - s.2 .0) as usize)
            .max()
            .unwrap_or(0);
        let blocks = (most.div_ceil(v) as u64)
            .div_ceil(THREADS as u64)
            .clamp(1, self.max_blocks as u64) as u32;
        let mut syncs = Ptrs { p: [0; MAX_PEERS] };
        for (g, gpu) in self.gpus.iter().enumerate() {
            syncs.p[g] = gpu.sync;
        }
        let mut epoch = self
            .epoch
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let mut timeout = self.timeout_ns;
        let mut n_gpus = n as i32;
        let mut avg_n = n as i32;
        for (g, (gi, go, (b0, e0))) in specs.into_iter().enumerate() {
            self.bind(g)?;
            let me = &self.gpus[g];
            let mut pin = Ptrs { p: [0; MAX_PEERS] };
            let mut pout = Ptrs { p: [0; MAX_PEERS] };
            pin.p[..gi.len()].copy_from_slice(&gi);
            pout.p[..go.len()].copy_from_slice(&go);
            let (mut n_in, mut n_out) = (gi.len() as i32, go.len() as i32);
            let (mut b, mut e) = (b0, e0);
            let mut me_i = g as i32;
            // A single input is a copy: use the plain sum kernel so avg does not divide it.
            let kop = if gi.len() == 1 { ReduceOp::Sum } else { op };
            let f = *me
                .funcs
                .get(&(dt, kop))
                .ok_or_else(|| Error::invalid("no kernel for dtype/op"))?;
            let mut params: [*mut c_void; 12] = [
                &mut pin as *mut Ptrs as *mut c_void,
                &mut n_in as *mut i32 as *mut c_void,
                &mut pout as *mut Ptrs as *mut c_void,
                &mut n_out as *mut i32 as *mut c_void,
                &mut b as *mut u64 as *mut c_void,
                &mut e as *mut u64 as *mut c_void,
                &mut avg_n as *mut i32 as *mut c_void,
                &mut syncs as *mut Ptrs as *mut c_void,
                &mut n_gpus as *mut i32 as *mut c_void,
                &mut me_i as *mut i32 as *mut c_void,
                &mut epoch as *mut u64 as *mut c_void,
                &mut timeout as *mut u64 as *mut c_void,
            ];
            check(
                sys::cuLaunchKernel(
                    f,
                    blocks,
                    1,
                    1,
                    THREADS,
                    1,
                    1,
                    0,
                    me.stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                ),
                "cuLaunchKernel",
            )?;
        }
        Ok(Launch {
            blocks_per_gpu: blocks,
            threads_per_block: THREADS,
        })
    }

    /// A timing event recorded on GPU `g`'s stream.
    pub fn record_timer(&self, g: usize) -> Result<Timer> {
        self.bind(g)?;
        let mut ev: sys::CUevent = std::ptr::null_mut();
        // SAFETY: valid out-pointer; stream live.
        unsafe {
            check(sys::cuEventCreate(&mut ev, 0), "cuEventCreate")?;
            check(sys::cuEventRecord(ev, self.gpus[g].stream), "cuEventRecord")?;
        }
        Ok(Timer { ev })
    }
}

/// A CUDA event for timing.
pub struct Timer {
    ev: sys::CUevent,
}

impl Timer {
    /// Milliseconds from `self` to `end` (waits for `end`).
    pub fn elapsed_ms(&self, end: &Timer) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: both events were recorded; valid out-pointer.
        unsafe {
            check(sys::cuEventSynchronize(end.ev), "cuEventSynchronize")?;
            check(
                sys::cuEventElapsedTime_v2(&mut ms, self.ev, end.ev),
                "cuEventElapsedTime",
            )?;
        }
        Ok(ms)
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        // SAFETY: the event was created by us and is destroyed once.
        unsafe {
            let _ = sys::cuEventDestroy_v2(self.ev);
        }
    }
}
