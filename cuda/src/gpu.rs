//! One GPU as the kernels see it: its context, a stream, the kernels loaded for its
//! architecture, and the synchronization area that peers write (see kernels.rs).

use crate::compile;
use crate::driver::{available, check, device, nvrtc_available};
use crate::hostsync::Flags;
use crate::kernels::{
    kernel_name, late_kernel_name, scale_name, Family, AREA_BYTES, SYNC_ABORT_OFFSET,
};
use cudarc::driver::sys;
use railcc_core::{DataType, Error, ErrorKind, ReduceOp, Result};
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::path::Path;

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

// SAFETY: a device address and its context handle; the driver API takes both from any
// thread, and drop binds the context before freeing.
unsafe impl Send for DevBuf {}
// SAFETY: as above; shared references only read the fields.
unsafe impl Sync for DevBuf {}

/// A new non-blocking stream in the context bound to this thread (the caller destroys it).
pub fn new_stream_current() -> Result<sys::CUstream> {
    let mut stream: sys::CUstream = std::ptr::null_mut();
    // SAFETY: valid out-pointer in the current context.
    check(
        unsafe {
            sys::cuStreamCreate(
                &mut stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            )
        },
        "cuStreamCreate",
    )?;
    Ok(stream)
}

/// A CUDA stream handle (the caller's, or ours).
pub type Stream = sys::CUstream;

pub struct GpuCtx {
    pub ordinal: usize,
    pub ctx: sys::CUcontext,
    /// The area peers reach: flags, call counter and low-latency scratch; zeroed at creation.
    pub sync: DevBuf,
    pub stream: sys::CUstream,
    funcs: HashMap<(DataType, ReduceOp), sys::CUfunction>,
    /// The bulk kernel's late form (late.rs).
    late_funcs: HashMap<(DataType, ReduceOp), sys::CUfunction>,
    ll_funcs: HashMap<(DataType, ReduceOp), sys::CUfunction>,
    push_funcs: HashMap<(DataType, ReduceOp), sys::CUfunction>,
    /// The push kernel's late form (push.rs, late.rs).
    push_late_funcs: HashMap<(DataType, ReduceOp), sys::CUfunction>,
    /// The TMA bulk kernels (tma.rs), once [`GpuCtx::load_tma`] loaded them; else empty.
    tma_funcs: HashMap<(DataType, ReduceOp), sys::CUfunction>,
    /// Whether the GPU can run them: compute capability 9.0 or later and `tma::SMEM_BYTES` of
    /// shared memory a block.
    tma_ok: bool,
    /// Compute capability: what the kernels are compiled for.
    cc: (i32, i32),
    scale_funcs: HashMap<DataType, sys::CUfunction>,
    /// The p2p kernels, in kernels::P2P_KERNELS' order.
    p2p_funcs: Vec<sys::CUfunction>,
    /// The barrier kernels, in copies::BARRIER_KERNELS' order.
    barrier_funcs: Vec<sys::CUfunction>,
    /// A second stream for work beside a call's on the caller's stream (copies.rs), made on
    /// first use (as a `usize`: the handle is not `Send`).
    side: std::sync::Mutex<Option<usize>>,
    /// The bench's result check per dtype (check.rs).
    /// Per dtype: the bench's check kernel and its fill kernel (`check.rs`).
    check_funcs: HashMap<DataType, (sys::CUfunction, sys::CUfunction)>,
    pub sms: i32,
    /// The word this context's kernels poll while they wait for peers (kernels.rs:
    /// `SYNC_ABORT`): set, they stop waiting and end.
    abort: Flags,
}

impl Drop for GpuCtx {
    /// Destroys the side stream if one was made (the driver frees it once its work is done).
    /// The main stream stays: callers hand it out as a communicator's default stream.
    fn drop(&mut self) {
        let side = self
            .side
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(s) = side {
            // SAFETY: made by side_stream on this context, destroyed once; nothing of ours is
            // enqueued on it after the context's owner let it go.
            let _ = unsafe { destroy_stream(self, s as Stream) };
        }
    }
}

// SAFETY: the raw handles are only used after binding the context; the driver API is
// thread-safe.
unsafe impl Send for GpuCtx {}
unsafe impl Sync for GpuCtx {}

impl GpuCtx {
    /// Retains the primary context of GPU `ordinal`, creates a stream and the sync area, and
    /// loads the kernels (compiled once per process; cached on disk in `cache`).
    pub fn new(ordinal: usize, cache: Option<&Path>) -> Result<GpuCtx> {
        available()?;
        nvrtc_available()?;
        let d = device(ordinal)?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the primary context stays retained for the process.
        unsafe {
            check(
                sys::cuDevicePrimaryCtxRetain(&mut ctx, d),
                "cuDevicePrimaryCtxRetain",
            )?;
            check(sys::cuCtxSetCurrent(ctx), "cuCtxSetCurrent")?;
        }
        use sys::CUdevice_attribute as A;
        let attr = |a| -> Result<i32> {
            let mut v = 0;
            // SAFETY: valid out-pointer; driver initialized.
            check(
                unsafe { sys::cuDeviceGetAttribute(&mut v, a, d) },
                "cuDeviceGetAttribute",
            )?;
            Ok(v)
        };
        let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let sms = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        // Room for the kernel's few static bytes (its barriers) beside the tiles.
        let tma_ok = major >= 9
            && attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
                >= crate::tma::SMEM_BYTES as i32 + 1024;
        let minor = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let stream = new_stream_current()?;
        let abort = Flags::new_current(1)?;
        let mut g = GpuCtx {
            ordinal,
            ctx,
            sync: DevBuf {
                ptr: 0,
                bytes: 0,
                ctx,
            },
            stream,
            funcs: HashMap::new(),
            late_funcs: HashMap::new(),
            ll_funcs: HashMap::new(),
            push_funcs: HashMap::new(),
            push_late_funcs: HashMap::new(),
            tma_funcs: HashMap::new(),
            tma_ok,
            cc: (major, minor),
            scale_funcs: HashMap::new(),
            p2p_funcs: Vec::new(),
            barrier_funcs: Vec::new(),
            side: std::sync::Mutex::new(None),
            check_funcs: HashMap::new(),
            sms,
            abort,
        };
        g.sync = g.alloc(AREA_BYTES)?;
        // SAFETY: the allocation holds AREA_BYTES; zeroed before any kernel reads it (zero is
        // never a valid flag).
        check(
            unsafe { sys::cuMemsetD8_v2(g.sync.ptr, 0, AREA_BYTES) },
            "cuMemsetD8",
        )?;
        // The kernels find the abort word through the area (kernels.rs: SYNC_ABORT).
        let word = g.abort.dev_ptr(0)?;
        // SAFETY: the area holds AREA_BYTES > SYNC_ABORT_OFFSET + 8; the source is a live u64.
        check(
            unsafe {
                sys::cuMemcpyHtoD_v2(
                    g.sync.ptr + SYNC_ABORT_OFFSET as u64,
                    &word as *const u64 as *const c_void,
                    8,
                )
            },
            "cuMemcpyHtoD(abort word address)",
        )?;
        g.load_modules(&crate::kernels::modules(), cache)?;
        Ok(g)
    }

    /// Compiles (or takes from `cache`) and loads the TMA bulk kernels (tma.rs), where a
    /// communicator asks for them (`RAILCC_GPU_WIDE_LOADS` 2 or 3); nothing on a GPU that
    /// cannot run them ([`GpuCtx::has_tma`] stays false there).
    pub fn load_tma(&mut self, cache: Option<&Path>) -> Result<()> {
        if self.tma_ok && !self.has_tma() {
            self.load_modules(&crate::kernels::tma_modules(), cache)?;
        }
        Ok(())
    }

    /// Compiles (or takes from `cache`) `modules` and loads them into this context.
    fn load_modules(
        &mut self,
        modules: &[crate::kernels::Module],
        cache: Option<&Path>,
    ) -> Result<()> {
        let ordinal = self.ordinal;
        let parts: Vec<(&str, &str)> = modules
            .iter()
            .map(|m| (m.tag.as_str(), m.src.as_str()))
            .collect();
        // Cubins (no JIT), else PTX. A cached image the driver rejects (truncated, or from
        // another toolkit) is compiled afresh; fresh cubins it rejects mark the cache so later
        // processes go straight to PTX (`compile::refuse_cubin`).
        let cc = self.cc;
        let t0 = std::time::Instant::now();
        let mut last = None;
        let mut attempts = Vec::new();
        if !compile::cubin_refused(cache, cc) {
            attempts.extend([(compile::Form::Cubin, true), (compile::Form::Cubin, false)]);
        }
        attempts.extend([(compile::Form::Ptx, true), (compile::Form::Ptx, false)]);
        let mut skip_cubin = false;
        for (form, use_cache) in attempts {
            if form == compile::Form::Cubin && skip_cubin {
                continue;
            }
            let fresh0 = compile::fresh_compiles();
            let r = compile::module_images(&parts, cc, cache, use_cache, form)
                .and_then(|images| self.load(modules, &images));
            match r {
                Ok(()) => {
                    tracing::info!(
                        "GPU {ordinal}: {} kernel modules as {form:?} in {:?}",
                        modules.len(),
                        t0.elapsed()
                    );
                    return Ok(());
                }
                Err(e) => {
                    tracing::warn!("GPU {ordinal}: kernels as {form:?} (cache {use_cache}): {e}");
                    // Every image compiled just now and still refused: no retry helps.
                    let all_fresh = compile::fresh_compiles() - fresh0 >= modules.len();
                    if form == compile::Form::Cubin && (all_fresh || !use_cache) {
                        skip_cubin = true;
                        compile::refuse_cubin(cache, cc);
                    }
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| Error::new(ErrorKind::Io, "no kernel image loaded")))
    }

    /// Loads `images` (of `modules`, in order) into this context and finds every kernel; on
    /// failure unloads what it loaded.
    fn load(
        &mut self,
        modules: &[crate::kernels::Module],
        images: &[compile::Image],
    ) -> Result<()> {
        if images.len() != modules.len() {
            return Err(Error::new(
                ErrorKind::Io,
                "fewer kernel images than modules",
            ));
        }
        self.bind()?;
        let mut loaded = Vec::with_capacity(modules.len());
        let r = modules
            .iter()
            .zip(images)
            .try_for_each(|(m, image)| self.load_one(m, image, &mut loaded));
        if r.is_err() {
            for m in loaded {
                // SAFETY: a module this call loaded; no kernel of it was launched.
                unsafe { sys::cuModuleUnload(m) };
            }
        }
        r
    }

    fn load_one(
        &mut self,
        m: &crate::kernels::Module,
        image: &[u8],
        loaded: &mut Vec<sys::CUmodule>,
    ) -> Result<()> {
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `image` is a cubin whose ELF headers lie inside it or NUL-terminated PTX
        // (compile.rs checks both when it reads them back); the context is bound.
        check(
            unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr() as *const c_void) },
            "cuModuleLoadData",
        )?;
        loaded.push(module);
        let get = |name: String| -> Result<sys::CUfunction> {
            let name = CString::new(name).map_err(|_| Error::invalid("kernel name"))?;
            let mut f: sys::CUfunction = std::ptr::null_mut();
            // SAFETY: module loaded above; `name` is NUL-terminated.
            check(
                unsafe { sys::cuModuleGetFunction(&mut f, module, name.as_ptr()) },
                "cuModuleGetFunction",
            )?;
            Ok(f)
        };
        match m.dtype {
            Some((dt, fam)) => {
                for &op in &m.ops {
                    match fam {
                        Family::Bulk => {
                            self.late_funcs
                                .insert((dt, op), get(late_kernel_name(dt, op))?);
                            self.funcs.insert((dt, op), get(kernel_name(dt, op))?)
                        }
                        Family::Ll => self
                            .ll_funcs
                            .insert((dt, op), get(crate::ll::kernel_name(dt, op))?),
                        Family::Push => {
                            self.push_late_funcs
                                .insert((dt, op), get(crate::push::late_kernel_name(dt, op))?);
                            self.push_funcs
                                .insert((dt, op), get(crate::push::kernel_name(dt, op))?)
                        }
                        Family::Tma => {
                            let f = get(crate::tma::kernel_name(dt, op))?;
                            use sys::CUfunction_attribute as F;
                            // SAFETY: a function of the module loaded above.
                            check(
                                unsafe {
                                    sys::cuFuncSetAttribute(
                                        f,
                                        F::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                        crate::tma::SMEM_BYTES as i32,
                                    )
                                },
                                "cuFuncSetAttribute (TMA kernel's shared memory)",
                            )?;
                            self.tma_funcs.insert((dt, op), f)
                        }
                    };
                }
                if fam == Family::Bulk && m.ops.contains(&ReduceOp::Sum) {
                    self.scale_funcs.insert(dt, get(scale_name(dt))?);
                }
            }
            None => {
                for dt in DataType::ALL {
                    self.check_funcs.insert(
                        dt,
                        (
                            get(crate::check::kernel_name(dt))?,
                            get(crate::check::fill_kernel_name(dt))?,
                        ),
                    );
                }
                self.p2p_funcs = crate::kernels::P2P_KERNELS
                    .iter()
                    .map(|n| get(n.to_string()))
                    .collect::<Result<_>>()?;
                self.barrier_funcs = crate::copies::BARRIER_KERNELS
                    .iter()
                    .map(|n| get(n.to_string()))
                    .collect::<Result<_>>()?;
            }
        }
        Ok(())
    }

    /// Makes this context's kernels stop waiting for peers (a peer died, or the communicator
    /// was aborted); they end at once with garbage results.
    pub fn abort_kernels(&self) {
        self.abort.store(0, 1);
    }

    /// Whether a kernel of this context waited past its deadline for a peer (kernels.rs:
    /// `ABORT_TIMED_OUT`); every wait of the context has stopped since.
    pub fn kernels_timed_out(&self) -> bool {
        self.abort.load(0) == crate::kernels::ABORT_TIMED_OUT
    }

    /// Where a low-latency receive (p2p_ll.rs) found another byte count than its own: the
    /// sender (this context's rank numbering) and its count, up to 2^24 - 1. Every wait of the
    /// context has stopped since.
    pub fn kernels_size_mismatch(&self) -> Option<(usize, u64)> {
        let v = self.abort.load(0);
        (v & 15 == crate::p2p_ll::ABORT_P2P_SIZE)
            .then_some((((v >> 4) & 15) as usize, u64::from(v >> 8)))
    }

    /// Whether this context's kernels were told to stop waiting ([`GpuCtx::abort_kernels`])
    /// or stopped on their own at a deadline.
    pub fn kernels_stopped(&self) -> bool {
        self.abort.load(0) != 0
    }

    pub fn ll_func(&self, dt: DataType, op: ReduceOp) -> Result<sys::CUfunction> {
        self.ll_funcs
            .get(&(dt, op))
            .copied()
            .ok_or_else(|| Error::new(ErrorKind::Unsupported, "no low-latency kernel for dtype/op"))
    }

    /// Whether this GPU runs the TMA bulk kernel (tma.rs) for every dtype and op.
    pub fn has_tma(&self) -> bool {
        self.tma_funcs.len() == DataType::ALL.len() * ReduceOp::ALL.len()
    }

    pub fn tma_func(&self, dt: DataType, op: ReduceOp) -> Result<sys::CUfunction> {
        self.tma_funcs.get(&(dt, op)).copied().ok_or_else(|| {
            Error::new(
                ErrorKind::Unsupported,
                "no TMA bulk kernel for dtype/op on this GPU",
            )
        })
    }

    pub fn push_func(&self, dt: DataType, op: ReduceOp) -> Result<sys::CUfunction> {
        self.push_funcs.get(&(dt, op)).copied().ok_or_else(|| {
            Error::new(
                ErrorKind::Unsupported,
                "no push all-reduce kernel for dtype/op",
            )
        })
    }

    /// The bulk kernel's late form (late.rs).
    pub fn late_func(&self, dt: DataType, op: ReduceOp) -> Result<sys::CUfunction> {
        self.late_funcs.get(&(dt, op)).copied().ok_or_else(|| {
            Error::new(
                ErrorKind::Unsupported,
                "no late-argument bulk kernel for dtype/op",
            )
        })
    }

    /// The push kernel's late form (`RAILCC_GPU_LATE_ARGS=2`).
    pub fn push_late_func(&self, dt: DataType, op: ReduceOp) -> Result<sys::CUfunction> {
        self.push_late_funcs.get(&(dt, op)).copied().ok_or_else(|| {
            Error::new(
                ErrorKind::Unsupported,
                "no late-argument push all-reduce kernel for dtype/op",
            )
        })
    }

    /// p2p kernel `i` of kernels::P2P_KERNELS.
    pub fn p2p_func(&self, i: usize) -> Result<sys::CUfunction> {
        self.p2p_funcs
            .get(i)
            .copied()
            .ok_or_else(|| Error::new(ErrorKind::Unsupported, "no p2p kernel"))
    }

    /// This context's side stream (made on first use, kept for the context's life): work
    /// forked from a call's stream and joined back (`stream_waits_for` both ways).
    pub fn side_stream(&self) -> Result<Stream> {
        // A panic elsewhere with the lock held leaves the handle as valid as before.
        let mut side = self.side.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = *side {
            return Ok(s as Stream);
        }
        self.bind()?;
        let s = new_stream_current()?;
        *side = Some(s as usize);
        Ok(s)
    }

    /// Barrier kernel `i` of copies::BARRIER_KERNELS.
    pub fn barrier_func(&self, i: usize) -> Result<sys::CUfunction> {
        self.barrier_funcs
            .get(i)
            .copied()
            .ok_or_else(|| Error::new(ErrorKind::Unsupported, "no barrier kernel"))
    }

    pub fn check_func(&self, dt: DataType) -> Result<sys::CUfunction> {
        self.check_funcs
            .get(&dt)
            .map(|f| f.0)
            .ok_or_else(|| Error::new(ErrorKind::Unsupported, "no check kernel for dtype"))
    }

    pub fn fill_func(&self, dt: DataType) -> Result<sys::CUfunction> {
        self.check_funcs
            .get(&dt)
            .map(|f| f.1)
            .ok_or_else(|| Error::new(ErrorKind::Unsupported, "no fill kernel for dtype"))
    }

    pub fn scale_func(&self, dt: DataType) -> Result<sys::CUfunction> {
        self.scale_funcs
            .get(&dt)
            .copied()
            .ok_or_else(|| Error::new(ErrorKind::Unsupported, "no scale kernel for dtype"))
    }

    pub fn func(&self, dt: DataType, op: ReduceOp) -> Result<sys::CUfunction> {
        self.funcs
            .get(&(dt, op))
            .copied()
            .ok_or_else(|| Error::new(ErrorKind::Unsupported, "no kernel for dtype/op"))
    }

    /// Blocks of `threads` threads that one SM keeps resident for every one of our bulk and
    /// push kernels (the least of them: every block of a call must be resident, as blocks
    /// wait for the peers' blocks).
    pub fn blocks_per_sm(&self, threads: u32) -> Result<u32> {
        self.bind()?;
        let mut least = i32::MAX;
        let all = self
            .funcs
            .values()
            .chain(self.late_funcs.values())
            .chain(self.push_funcs.values())
            .chain(self.push_late_funcs.values());
        for &f in all {
            let mut per_sm = 1;
            // SAFETY: valid out-pointer and a loaded function.
            check(
                unsafe {
                    sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                        &mut per_sm,
                        f,
                        threads as i32,
                        0,
                    )
                },
                "cuOccupancyMaxActiveBlocksPerMultiprocessor",
            )?;
            least = least.min(per_sm);
        }
        Ok(least.clamp(1, i32::MAX) as u32)
    }

    /// Raises the context's per-thread stack limit to what the collective kernels use
    /// (their local memory), so no later launch has to grow it: a launch that grows the
    /// stack waits for the device's earlier work, which must never happen while a stream
    /// waits for the launching thread (`RAILCC_GPU_DEFER`). NCCL does the same at init
    /// (`NCCL_SET_STACK_SIZE`). Returns (the kernels' most local bytes, the limit before).
    pub fn reserve_stack(&self) -> Result<(usize, usize)> {
        self.bind()?;
        let mut most = 0usize;
        let all = self
            .funcs
            .values()
            .chain(self.ll_funcs.values())
            .chain(self.push_funcs.values())
            .chain(self.tma_funcs.values())
            .chain(self.p2p_funcs.iter())
            .chain(self.barrier_funcs.iter())
            .chain(self.late_funcs.values())
            .chain(self.push_late_funcs.values());
        for &f in all {
            let mut local = 0i32;
            // SAFETY: valid out-pointer and a loaded function of this context.
            check(
                unsafe {
                    sys::cuFuncGetAttribute(
                        &mut local,
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                        f,
                    )
                },
                "cuFuncGetAttribute(LOCAL_SIZE_BYTES)",
            )?;
            most = most.max(local.max(0) as usize);
        }
        let mut limit = 0usize;
        // SAFETY: valid out-pointer; the context is current.
        check(
            unsafe { sys::cuCtxGetLimit(&mut limit, sys::CUlimit::CU_LIMIT_STACK_SIZE) },
            "cuCtxGetLimit(STACK_SIZE)",
        )?;
        if most > limit {
            // SAFETY: a plain setting of the current context.
            check(
                unsafe { sys::cuCtxSetLimit(sys::CUlimit::CU_LIMIT_STACK_SIZE, most) },
                "cuCtxSetLimit(STACK_SIZE)",
            )?;
        }
        Ok((most, limit))
    }

    pub fn bind(&self) -> Result<()> {
        // SAFETY: the context is retained for the lifetime of self.
        check(unsafe { sys::cuCtxSetCurrent(self.ctx) }, "cuCtxSetCurrent")
    }

    pub fn alloc(&self, bytes: usize) -> Result<DevBuf> {
        self.bind()?;
        let mut ptr = 0;
        // SAFETY: valid out-pointer in the bound context.
        check(
            unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes.max(1)) },
            "cuMemAlloc",
        )?;
        Ok(DevBuf {
            ptr,
            bytes,
            ctx: self.ctx,
        })
    }

    /// Copies `data` to `dst + offset` and waits for it to land.
    pub fn upload(&self, dst: &DevBuf, offset: usize, data: &[u8]) -> Result<()> {
        if offset + data.len() > dst.bytes {
            return Err(Error::invalid("upload larger than the device buffer"));
        }
        self.bind()?;
        // SAFETY: the range lies in `dst` (checked); `data` is valid host memory.
        check(
            unsafe {
                sys::cuMemcpyHtoD_v2(
                    dst.ptr + offset as u64,
                    data.as_ptr() as *const c_void,
                    data.len(),
                )
            },
            "cuMemcpyHtoD",
        )?;
        // From pageable memory the copy may return before its DMA lands, and our streams do not
        // wait for the legacy stream: wait here so later kernels see the data.
        // SAFETY: the bound context is live.
        check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
    }

    /// Sets `len` bytes of `dst` from `offset` to `byte` and waits for it.
    pub fn memset(&self, dst: &DevBuf, offset: usize, len: usize, byte: u8) -> Result<()> {
        if offset + len > dst.bytes {
            return Err(Error::invalid("memset larger than the device buffer"));
        }
        self.bind()?;
        // SAFETY: the range lies in `dst` (checked).
        check(
            unsafe { sys::cuMemsetD8Async(dst.ptr + offset as u64, byte, len, self.stream) },
            "cuMemsetD8Async",
        )?;
        self.synchronize()
    }

    /// Copies `src + offset` into `out` after the stream has finished its work.
    pub fn download(&self, src: &DevBuf, offset: usize, out: &mut [u8]) -> Result<()> {
        if offset + out.len() > src.bytes {
            return Err(Error::invalid("download larger than the device buffer"));
        }
        self.synchronize()?;
        // SAFETY: the range lies in `src` (checked); `out` is valid host memory.
        check(
            unsafe {
                sys::cuMemcpyDtoH_v2(
                    out.as_mut_ptr() as *mut c_void,
                    src.ptr + offset as u64,
                    out.len(),
                )
            },
            "cuMemcpyDtoH",
        )
    }

    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: the stream is live.
        check(
            unsafe { sys::cuStreamSynchronize(self.stream) },
            "cuStreamSynchronize",
        )
    }

    /// A timing event recorded on this GPU's stream.
    pub fn record_timer(&self) -> Result<Timer> {
        self.bind()?;
        let mut ev: sys::CUevent = std::ptr::null_mut();
        // SAFETY: valid out-pointer; stream live.
        unsafe {
            check(sys::cuEventCreate(&mut ev, 0), "cuEventCreate")?;
            check(sys::cuEventRecord(ev, self.stream), "cuEventRecord")?;
        }
        Ok(Timer { ev })
    }
}

mod streams;
pub use streams::*;
