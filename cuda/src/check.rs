//! The bench's check of a result on the GPU that holds it: one kernel per dtype computes each
//! element's expected value from the exact fill (`railcc_collectives::reference`'s pattern:
//! small integers from a hash of rank and index, reduced exactly, rounded as the kernels
//! store them) and counts the elements that differ. Why: the host computes the reference
//! element by element, which at 1 GB on 4 GPUs took minutes where cores are few (issue 30),
//! and the result had to come back over PCIe first.
//!
//! The kernel mirrors `reference::expected_value` step for step; `railcc_collectives`'
//! GPU test compares the two counts on results with planted errors.

use crate::gpu::{DevBuf, GpuCtx};
use crate::launch::enqueue;
use railcc_core::{DataType, Error, Result};
use std::ffi::c_void;

/// What the check kernel needs of a call and the fill (the kernels' `CheckArgs`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CheckArgs {
    /// [`COLL_ALL_REDUCE`] and the rest below.
    pub coll: i32,
    /// [`OP_SUM`] and the rest below.
    pub op: i32,
    pub nranks: i32,
    pub rank: i32,
    pub root: i32,
    /// The fill pattern's choices (`reference::Pattern`): products, signed values, all ones
    /// (fp8 reductions), fp8, and `g` > 0 when only ranks with `rank % g == i % g` give a
    /// value.
    pub prod: i32,
    pub signed: i32,
    pub ones: i32,
    pub fp8: i32,
    pub g: i32,
    /// The call's per-rank count (NCCL's conventions).
    pub count: u64,
    pub seed: u64,
}

pub const COLL_ALL_REDUCE: i32 = 0;
pub const COLL_REDUCE: i32 = 1;
pub const COLL_REDUCE_SCATTER: i32 = 2;
pub const COLL_ALL_GATHER: i32 = 3;
pub const COLL_BROADCAST: i32 = 4;
pub const COLL_ALL_TO_ALL: i32 = 5;
pub const COLL_SEND_RECV: i32 = 6;
pub const OP_SUM: i32 = 0;
pub const OP_PROD: i32 = 1;
pub const OP_MAX: i32 = 2;
pub const OP_MIN: i32 = 3;
pub const OP_AVG: i32 = 4;

/// The check kernel of `dt`.
pub fn kernel_name(dt: DataType) -> String {
    format!("check_{}", dt.name())
}

/// The fill kernel of `dt`: writes the exact fill's input where the bench's buffers are, so
/// gigabytes of input are never made on the host and uploaded.
pub fn fill_kernel_name(dt: DataType) -> String {
    format!("fill_{}", dt.name())
}

/// `dt`'s store of a fill value `v` (a small integer, exact in every dtype).
fn store(dt: DataType) -> String {
    let (t, _, _, st) = crate::kernels::ctype(dt);
    match dt {
        DataType::F64 => "(v)".into(),
        DataType::F32 => "(float)(v)".into(),
        DataType::F16 | DataType::Bf16 | DataType::F8E4M3 | DataType::F8E5M2 => {
            format!("{st}((float)(v))")
        }
        _ => format!("({t})(long long)(v)"),
    }
}

/// The shared part: the arguments and the fill pattern (as `reference::Pattern::at`).
const COMMON: &str = r#"
struct CheckArgs { int coll; int op; int nranks; int rank; int root; int prod; int sign; int ones; int fp8; int g; unsigned long long count; unsigned long long seed; };
__device__ __forceinline__ double fill_at(const CheckArgs& a, unsigned long long rank, unsigned long long i) {
  if (a.g > 0 && (rank % (unsigned long long)a.g) != (i % (unsigned long long)a.g)) return 0.0;
  unsigned long long h = rank * 0x9e3779b9ull + i * 2654435761ull + a.seed;
  h = (h ^ (h >> 13)) * 0x5bd1e995ull;
  h = h ^ (h >> 15);
  double mag;
  if (a.prod) mag = ((h % 16ull) == 0 && (!a.fp8 || rank < 8)) ? 2.0 : 1.0;
  else if (a.ones) mag = 1.0;
  else mag = (double)(h % 4ull) + 1.0;
  return (a.sign && ((h >> 8) % 2ull) == 0) ? -mag : mag;
}
"#;

/// `dt`'s rounding of an exact value into storage and back (`reference::wrap`), and its
/// average's last step (`reference::avg_like_kernel`), as CUDA expressions of `v`/`w`, `n`.
fn rounding(dt: DataType) -> (String, &'static str) {
    let (t, _, ld, st) = crate::kernels::ctype(dt);
    match dt {
        DataType::F64 => ("(v)".into(), "(w / (double)n)"),
        DataType::F32 => ("(double)(float)(v)".into(), "(double)((float)w / (float)n)"),
        DataType::F16 | DataType::Bf16 | DataType::F8E4M3 | DataType::F8E5M2 => (
            format!("(double){ld}({st}((float)(v)))"),
            "(double)((float)w / (float)n)",
        ),
        _ => (
            format!("(double)({t})(long long)(v)"),
            "(double)((long long)w / (long long)n)",
        ),
    }
}

/// The check kernels' source, appended to the program.
pub fn source() -> String {
    let mut s = String::from(COMMON);
    for dt in DataType::ALL {
        let (t, _, ld, _) = crate::kernels::ctype(dt);
        let name = kernel_name(dt);
        let (wrap, avg) = rounding(dt);
        s.push_str(&format!(
            r#"
__device__ __forceinline__ double wrap_{name}(double v) {{ return {wrap}; }}
__device__ double reduced_{name}(const CheckArgs& a, unsigned long long j) {{
  double acc = fill_at(a, 0, j);
  for (int r = 1; r < a.nranks; r++) {{
    double x = fill_at(a, (unsigned long long)r, j);
    switch (a.op) {{
      case 1: acc = acc * x; break;
      case 2: acc = fmax(acc, x); break;
      case 3: acc = fmin(acc, x); break;
      default: acc = acc + x;
    }}
  }}
  if (a.op == 4) {{ double w = wrap_{name}(acc); int n = a.nranks; return {avg}; }}
  return wrap_{name}(acc);
}}
extern "C" __global__ void __launch_bounds__(512) {name}(const {t}* out, unsigned long long n, CheckArgs a, unsigned long long* wrong) {{
  const unsigned long long c = a.count ? a.count : 1ull;
  const unsigned long long p = (unsigned long long)a.nranks, me = (unsigned long long)a.rank;
  unsigned long long bad = 0;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x) {{
    double e;
    switch (a.coll) {{
      case 0: e = reduced_{name}(a, i); break;
      case 1: if (a.rank != a.root) continue; e = reduced_{name}(a, i); break;
      case 2: e = reduced_{name}(a, me * a.count + i); break;
      case 3: e = fill_at(a, i / c, i % c); break;
      case 4: e = fill_at(a, (unsigned long long)a.root, i); break;
      case 5: e = fill_at(a, i / c, me * a.count + i % c); break;
      case 6: e = fill_at(a, (me + p - 1) % p, i); break;
      default: continue;
    }}
    e = wrap_{name}(e);
    if ((double){ld}(out[i]) != e) bad++;
  }}
  if (bad) atomicAdd(wrong, bad);
}}
extern "C" __global__ void __launch_bounds__(512) {fill}({t}* out, unsigned long long n, CheckArgs a, unsigned long long first) {{
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n; i += (unsigned long long)gridDim.x * blockDim.x) {{
    double v = fill_at(a, (unsigned long long)a.rank, first + i);
    out[i] = {store};
  }}
}}
"#,
            fill = fill_kernel_name(dt),
            store = store(dt),
        ));
    }
    s
}

/// Counts the elements of `n` of `dt` at `out` (this GPU's memory) that differ from the exact
/// fill's expected result. Runs on the GPU's own stream and waits for it; the caller has
/// synchronized the call that wrote `out`.
///
/// # Safety
/// `out` is device memory of `gpu` holding `n` elements of `dt`.
pub unsafe fn count_wrong(
    gpu: &GpuCtx,
    dt: DataType,
    out: u64,
    n: u64,
    args: &CheckArgs,
) -> Result<u64> {
    if n == 0 {
        return Ok(0);
    }
    let f = gpu.check_func(dt)?;
    let counter: DevBuf = gpu.alloc(8)?;
    gpu.upload(&counter, 0, &[0u8; 8])?;
    let (mut o, mut n_, mut a, mut w) = (out, n, *args, counter.ptr);
    let mut params: [*mut c_void; 4] = [
        &mut o as *mut u64 as *mut c_void,
        &mut n_ as *mut u64 as *mut c_void,
        &mut a as *mut CheckArgs as *mut c_void,
        &mut w as *mut u64 as *mut c_void,
    ];
    // SAFETY: the parameters match the check kernel's signature; the caller vouches for
    // `out`; the counter lives until the download below, after the stream is done.
    unsafe { launch_over(gpu, f, n, &mut params, "cuLaunchKernel(check)") }?;
    let mut got = [0u8; 8];
    gpu.download(&counter, 0, &mut got)?;
    Ok(u64::from_le_bytes(got))
}

/// Writes elements `first..first + n` of `args.rank`'s exact-fill input (as
/// `reference::fill_input` makes them) at `out`, on the GPU's own stream, and waits for it.
///
/// # Safety
/// `out` is device memory of `gpu` with room for `n` elements of `dt`.
pub unsafe fn fill(
    gpu: &GpuCtx,
    dt: DataType,
    out: u64,
    n: u64,
    first: u64,
    args: &CheckArgs,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let f = gpu.fill_func(dt)?;
    let (mut o, mut n_, mut a, mut f0) = (out, n, *args, first);
    let mut params: [*mut c_void; 4] = [
        &mut o as *mut u64 as *mut c_void,
        &mut n_ as *mut u64 as *mut c_void,
        &mut a as *mut CheckArgs as *mut c_void,
        &mut f0 as *mut u64 as *mut c_void,
    ];
    // SAFETY: the parameters match the fill kernel's signature; the caller vouches for `out`.
    unsafe { launch_over(gpu, f, n, &mut params, "cuLaunchKernel(fill)") }?;
    gpu.synchronize()
}

/// Launches `f`, a check or fill kernel (512 threads a block, a grid-stride loop over `n`
/// elements), on the GPU's own stream: about 16 elements a thread, at most 4 blocks an SM.
///
/// # Safety
/// `params` match `f`'s signature and point at live values; the buffers they name hold `n`
/// elements.
unsafe fn launch_over(
    gpu: &GpuCtx,
    f: cudarc::driver::sys::CUfunction,
    n: u64,
    params: &mut [*mut c_void],
    what: &str,
) -> Result<()> {
    let blocks = n.div_ceil(512 * 16).clamp(1, gpu.sms.max(1) as u64 * 4) as u32;
    gpu.bind()?;
    // SAFETY: the caller's contract.
    unsafe { enqueue(f, blocks, 512, gpu.stream, params, what) }
}

/// The kernels' op code of `op`.
pub fn op_code(op: railcc_core::ReduceOp) -> i32 {
    use railcc_core::ReduceOp::*;
    match op {
        Sum => OP_SUM,
        Prod => OP_PROD,
        Max => OP_MAX,
        Min => OP_MIN,
        Avg => OP_AVG,
    }
}

/// The kernels' collective code, or an error for one the check does not take.
pub fn coll_code(c: railcc_core::call::CollKind) -> Result<i32> {
    use railcc_core::call::CollKind::*;
    Ok(match c {
        AllReduce => COLL_ALL_REDUCE,
        Reduce => COLL_REDUCE,
        ReduceScatter => COLL_REDUCE_SCATTER,
        AllGather => COLL_ALL_GATHER,
        Broadcast => COLL_BROADCAST,
        AllToAll => COLL_ALL_TO_ALL,
        SendRecv => COLL_SEND_RECV,
        Barrier => {
            return Err(Error::invalid(
                "the GPU check has nothing to check for a barrier",
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_argument_layout_matches_the_source() {
        // Ten ints, then two u64 at offset 40.
        assert_eq!(std::mem::size_of::<CheckArgs>(), 56);
        assert!(COMMON.contains("int g; unsigned long long count; unsigned long long seed;"));
        let s = source();
        for dt in DataType::ALL {
            assert!(s.contains(&format!("void __launch_bounds__(512) {}(", kernel_name(dt))));
            assert!(s.contains(&format!(
                "void __launch_bounds__(512) {}(",
                fill_kernel_name(dt)
            )));
        }
    }
}
