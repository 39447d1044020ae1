//! The low-latency all-reduce for small messages: one exchange, no barriers.
//!
//! Each GPU pushes its input to every peer's scratch as 16-byte lines of {4 data bytes, flag,
//! 4 data bytes, flag} (NCCL's LL format): a store of 8 bytes is seen whole, so a reader that
//! sees the call's flag next to data knows the data is there without any fence or barrier. Each
//! GPU then reduces its own input with the peers' lines in rank order (so every GPU computes
//! bit-identical results) and writes its output. One NVLink latency per call instead of the two
//! barriers of the bulk kernel; this is what makes an 8-byte all-reduce a few microseconds.
//!
//! Scratch is double-buffered by call parity: a GPU can only start call k+2 after every peer
//! has pushed its data for call k+1, which a peer does after finishing call k, so nobody
//! overwrites lines a peer is still reading. Flags come from the call counter in device memory
//! (see kernels.rs), so CUDA graphs replay correctly.

use crate::gpu::GpuCtx;
use crate::kernels::{avg_step, ctype, op_expr, MAX_PEERS, SCRATCH_OFFSET};
use crate::launch::{enqueue, ptrs, Ptrs};
use cudarc::driver::sys;
use railcc_core::{DataType, ReduceOp, Result};
use std::ffi::c_void;

/// Largest all-reduce (bytes per rank) the low-latency kernel can take: its scratch is 16 MiB
/// of each GPU's area. `RAILCC_GPU_LL_MAX_BYTES` picks the crossover below it (the scratch
/// holds more than the default takes, so the crossover can be measured without a rebuild).
pub const MAX_BYTES: usize = 512 * 1024;
/// One source's lines for one parity: two bytes of scratch per byte of data.
const SLOT_BYTES: usize = 2 * MAX_BYTES;
pub const SCRATCH_BYTES: usize = 2 * MAX_PEERS * SLOT_BYTES;
pub const THREADS: u32 = 256;

pub fn kernel_name(dt: DataType, op: ReduceOp) -> String {
    format!("ll_{}_{}", dt.name(), op.name())
}

/// CUDA source of the low-latency kernel for one dtype and op (uses kernels.rs's helpers).
pub fn kernel_source(dt: DataType, op: ReduceOp) -> String {
    let (t, acc, ld, st) = ctype(dt);
    let expr = op_expr(op, dt);
    let avg = avg_step(dt, op);
    let name = kernel_name(dt, op);
    format!(
        r#"
extern "C" __global__ void __launch_bounds__({THREADS}) {name}(const unsigned char* in, unsigned char* out, unsigned long long nbytes, Ptrs areas, int n, int me, int avg_n, unsigned long long timeout_ns) {{
  typedef {t} T;
  const int E = 8 / sizeof(T);
  const unsigned long long area = areas.p[me];
  const unsigned long long epoch = call_epoch(area);
  const unsigned int flag = 1u + (unsigned int)((epoch - 1) % 0xfffffffeull);
  const unsigned long long slot0 = {SCRATCH_OFFSET}ull + (epoch & 1ull) * {MAX_PEERS}ull * {SLOT_BYTES}ull;
  const unsigned long long lines = (nbytes + 7) / 8;
  const unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  const bool in8 = ((unsigned long long)in % 8) == 0, out8 = ((unsigned long long)out % 8) == 0;
  // Push: my input, line by line, to every peer's slot for me.
  for (unsigned long long l = tid; l < lines; l += stride) {{
    uint2 v = make_uint2(0, 0);
    if (in8 && l * 8 + 8 <= nbytes) v = *(const uint2*)(in + l * 8);
    else for (int k = 0; k < 8 && l * 8 + k < nbytes; k++) ((unsigned char*)&v)[k] = in[l * 8 + k];
    for (int p = 0; p < n; p++) {{
      if (p == me) continue;
      volatile uint4* dst = (volatile uint4*)(areas.p[p] + slot0 + me * {SLOT_BYTES}ull) + l;
      asm volatile("st.volatile.global.v4.u32 [%0], {{%1,%2,%3,%4}};" :: "l"(dst), "r"(v.x), "r"(flag), "r"(v.y), "r"(flag) : "memory");
    }}
  }}
  // Reduce in rank order: my input for me, the peers' lines for them.
  unsigned long long t0 = now_ns();
  for (unsigned long long l = tid; l < lines; l += stride) {{
    {acc} accs[E];
    for (int p = 0; p < n; p++) {{
      uint2 v = make_uint2(0, 0);
      if (p == me) {{
        if (in8 && l * 8 + 8 <= nbytes) v = *(const uint2*)(in + l * 8);
        else for (int k = 0; k < 8 && l * 8 + k < nbytes; k++) ((unsigned char*)&v)[k] = in[l * 8 + k];
      }} else {{
        const uint4* src = (const uint4*)(area + slot0 + p * {SLOT_BYTES}ull) + l;
        unsigned int a, f1, b, f2, spins = 0;
        do {{
          asm volatile("ld.volatile.global.v4.u32 {{%0,%1,%2,%3}}, [%4];" : "=r"(a), "=r"(f1), "=r"(b), "=r"(f2) : "l"(src) : "memory");
          if (now_ns() - t0 > timeout_ns) {{ timed_out((unsigned long long)area); break; }} // a peer never came
          if ((++spins & 1023u) == 0 && aborted((unsigned long long)area)) break; // kernels.rs: SYNC_ABORT
        }} while (f1 != flag || f2 != flag);
        v = make_uint2(a, b);
      }}
      const T* x = (const T*)&v;
      for (int k = 0; k < E; k++) {{
        if (p == 0) accs[k] = {ld}(x[k]);
        else {{ {acc} a = accs[k], b = {ld}(x[k]); accs[k] = {expr}; }}
      }}
    }}
    uint2 r;
    T* y = (T*)&r;
    for (int k = 0; k < E; k++) {{ {acc} acc = accs[k]; {avg} y[k] = {st}(acc); }}
    if (out8 && l * 8 + 8 <= nbytes) *(uint2*)(out + l * 8) = r;
    else for (int k = 0; k < 8 && l * 8 + k < nbytes; k++) out[l * 8 + k] = ((unsigned char*)&r)[k];
  }}
  // The last block to finish advances the call counter (every block has read it by then).
  __syncthreads();
  if (threadIdx.x == 0) {{
    __threadfence();
    unsigned int* finished = (unsigned int*)(area + (SYNC_EPOCH + 1) * 8);
    if (atomicAdd(finished, 1u) == gridDim.x - 1) {{
      *finished = 0;
      __threadfence();
      ((volatile unsigned long long*)area)[SYNC_EPOCH] = epoch;
    }}
  }}
}}
"#
    )
}

/// Whether a call takes this kernel: all-reduces up to `max_bytes` (the config's limit) and
/// never more than the scratch holds.
pub fn takes(coll: railcc_core::call::CollKind, nbytes: usize, max_bytes: usize) -> bool {
    coll == railcc_core::call::CollKind::AllReduce && nbytes <= max_bytes.min(MAX_BYTES)
}

/// Thread blocks for `nbytes`: one 8-byte line per thread, at most `max_blocks` (all resident,
/// so every block pushes before any waits).
pub fn blocks(nbytes: usize, max_blocks: u32) -> u32 {
    (nbytes.div_ceil(8) as u64)
        .div_ceil(THREADS as u64)
        .clamp(1, max_blocks.max(1) as u64) as u32
}

/// Enqueues GPU `me`'s low-latency all-reduce of `nbytes` (at most [`MAX_BYTES`]).
///
/// # Safety
/// `input` and `output` must be device memory of `gpu` holding `nbytes`; `areas[h]` must be
/// GPU h's area (kernels.rs `AREA_BYTES`) as `gpu` addresses it; all live until the stream
/// passes this kernel.
#[allow(clippy::too_many_arguments)]
pub unsafe fn launch(
    gpu: &GpuCtx,
    stream: sys::CUstream,
    me: usize,
    input: u64,
    output: u64,
    nbytes: usize,
    dt: DataType,
    op: ReduceOp,
    areas: &[u64],
    blocks: u32,
    timeout_ns: u64,
) -> Result<()> {
    debug_assert!(nbytes <= MAX_BYTES && areas.len() <= MAX_PEERS);
    gpu.bind()?;
    let f = gpu.ll_func(dt, op)?;
    let mut p = ptrs(areas);
    let (mut i, mut o, mut nb) = (input, output, nbytes as u64);
    let (mut n, mut me_i, mut avg_n) = (areas.len() as i32, me as i32, areas.len() as i32);
    let mut timeout = timeout_ns;
    let mut params: [*mut c_void; 8] = [
        &mut i as *mut u64 as *mut c_void,
        &mut o as *mut u64 as *mut c_void,
        &mut nb as *mut u64 as *mut c_void,
        &mut p as *mut Ptrs as *mut c_void,
        &mut n as *mut i32 as *mut c_void,
        &mut me_i as *mut i32 as *mut c_void,
        &mut avg_n as *mut i32 as *mut c_void,
        &mut timeout as *mut u64 as *mut c_void,
    ];
    // SAFETY: parameters match the kernel's signature and live across the call; the caller
    // vouches for the pointers.
    unsafe {
        enqueue(
            f,
            blocks,
            THREADS,
            stream,
            &mut params,
            "cuLaunchKernel (low-latency all-reduce)",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_kernel_per_dtype_and_op_and_blocks_cover_the_lines() {
        let s = crate::kernels::source();
        for dt in DataType::ALL {
            for op in ReduceOp::ALL {
                assert!(s.contains(&format!(
                    "void __launch_bounds__({THREADS}) {}(",
                    kernel_name(dt, op)
                )));
            }
        }
        assert_eq!(blocks(8, 132), 1);
        assert_eq!(blocks(64 * 1024, 132), 32);
        assert_eq!(blocks(MAX_BYTES, 132), 132);
        assert_eq!(blocks(MAX_BYTES, 4), 4);
    }
}
