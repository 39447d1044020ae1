//! Host reduction kernels for every dtype and op. Each loop is a plain zip over two slices with
//! the operator chosen outside the loop, so the compiler vectorizes it. The narrow floats
//! are reduced in f32: bf16 converted inside the loop (a shift and a branch-free rounding);
//! f16 and fp8 (e4m3, e5m2; rounded back with CUDA's saturating conversion) a block at a
//! time, widened over a slice, reduced as f32, narrowed over a slice (`Wide`); f16 sums and
//! products of two inputs in one pass with F16C where the CPU has it (`reduce/f16c.rs`). Converted one
//! element at a time through `half` and `float8`, bf16 reduced at a quarter, f16 at a
//! thirtieth and fp8 at a hundredth of f32's bytes per second. A two-input step rounds its result to the storage type (as a
//! partial sum that travels between ranks must be); [`reduce_slots_raw`] reduces many inputs
//! in one step and, for the narrow floats, accumulates in f32 and rounds once.

use float8::{F8E4M3, F8E5M2};
use half::{bf16, f16, slice::HalfFloatSliceExt};
use railcc_core::{DataType, ReduceOp};

trait Arith: Copy {
    fn sum(self, o: Self) -> Self;
    fn prod(self, o: Self) -> Self;
    fn max(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
    /// `self / n`, the final step of `Avg`.
    fn div_n(self, n: usize) -> Self;
}

macro_rules! int_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn sum(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline(always)] fn prod(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[inline(always)] fn max(self, o: Self) -> Self { Ord::max(self, o) }
            #[inline(always)] fn min(self, o: Self) -> Self { Ord::min(self, o) }
            #[inline(always)] fn div_n(self, n: usize) -> Self { self / (n as $t) }
        }
    )*};
}
int_arith!(i8, u8, i32, u32, i64, u64);

macro_rules! float_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn sum(self, o: Self) -> Self { self + o }
            #[inline(always)] fn prod(self, o: Self) -> Self { self * o }
            #[inline(always)] fn max(self, o: Self) -> Self { if o > self { o } else { self } }
            #[inline(always)] fn min(self, o: Self) -> Self { if o < self { o } else { self } }
            #[inline(always)] fn div_n(self, n: usize) -> Self { self / (n as $t) }
        }
    )*};
}
float_arith!(f32, f64);

/// Floats narrower than f32, reduced in f32 a block at a time: the conversions run over
/// slices, where they vectorize (f16 with F16C, bf16 as bit shifts), not per element.
trait Wide: Copy {
    fn widen(src: &[Self], dst: &mut [f32]);
    /// Round to nearest even, as CUDA's conversions (fp8: saturating).
    fn narrow(src: &[f32], dst: &mut [Self]);
    /// The first elements of a two-input sum or product (`prod`) done in one pass where the
    /// CPU can (f16 with F16C: `reduce/f16c.rs`), with the block path's results (but for which
    /// NaN a sum of two NaNs keeps); returns how many (0: none).
    ///
    /// # Safety
    /// As [`reduce_typed`].
    unsafe fn pairwise_fast(
        _prod: bool,
        _dst: *mut Self,
        _a: *const Self,
        _b: *const Self,
        _n: usize,
    ) -> usize {
        0
    }
}

impl Wide for f16 {
    fn widen(src: &[f16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    fn narrow(src: &[f32], dst: &mut [f16]) {
        dst.convert_from_f32_slice(src);
    }
    unsafe fn pairwise_fast(
        prod: bool,
        dst: *mut f16,
        a: *const f16,
        b: *const f16,
        n: usize,
    ) -> usize {
        let (d, a, b) = (dst as *mut u16, a as *const u16, b as *const u16);
        // SAFETY: the caller's pointers; f16 is a u16 in memory.
        unsafe {
            match prod {
                true => f16c::pairwise::<true>(d, a, b, n),
                false => f16c::pairwise::<false>(d, a, b, n),
            }
        }
    }
}

impl Wide for bf16 {
    fn widen(src: &[bf16], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = f32_of(*s);
        }
    }
    fn narrow(src: &[f32], dst: &mut [bf16]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = bf16_of(*s);
        }
    }
}

/// bf16's conversions are a shift and a rounding without branches, so a two-input step
/// converts element by element inside the one loop, which vectorizes: the pairwise loops
/// take bf16 as they take f32 (one pass, not the three of a block's widen, reduce, narrow).
impl Arith for bf16 {
    #[inline(always)]
    fn sum(self, o: Self) -> Self {
        bf16_of(f32_of(self) + f32_of(o))
    }
    #[inline(always)]
    fn prod(self, o: Self) -> Self {
        bf16_of(f32_of(self) * f32_of(o))
    }
    #[inline(always)]
    fn max(self, o: Self) -> Self {
        if f32_of(o) > f32_of(self) {
            o
        } else {
            self
        }
    }
    #[inline(always)]
    fn min(self, o: Self) -> Self {
        if f32_of(o) < f32_of(self) {
            o
        } else {
            self
        }
    }
    #[inline(always)]
    fn div_n(self, n: usize) -> Self {
        bf16_of(f32_of(self) / n as f32)
    }
}

#[inline(always)]
fn f32_of(b: bf16) -> f32 {
    f32::from_bits(u32::from(b.to_bits()) << 16)
}

/// `bf16::from_f32` without branches, so a loop of it vectorizes (half's is scalar):
/// round to nearest even; a NaN stays a NaN, made quiet, as half does.
#[inline(always)]
fn bf16_of(f: f32) -> bf16 {
    let x = f.to_bits();
    let rounded = x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16;
    let quiet = (x >> 16) | 0x40;
    let nan = x & 0x7fff_ffff > 0x7f80_0000;
    bf16::from_bits(if nan { quiet } else { rounded } as u16)
}

mod f16c;
mod fp8;

macro_rules! fp8_wide {
    ($($t:ty, $lut:path);*) => {$(
        impl Wide for $t {
            fn widen(src: &[$t], dst: &mut [f32]) {
                let lut = $lut();
                for (d, s) in dst.iter_mut().zip(src) {
                    *d = lut.widen(s.to_bits());
                }
            }
            fn narrow(src: &[f32], dst: &mut [$t]) {
                let lut = $lut();
                for (d, s) in dst.iter_mut().zip(src) {
                    *d = <$t>::from_bits(lut.narrow(*s));
                }
            }
        }
    )*};
}
fp8_wide!(F8E4M3, fp8::e4m3; F8E5M2, fp8::e5m2);

/// Elements a narrow float's reduction converts at a time (two f32 blocks on the stack).
const BLOCK: usize = 512;

/// A binary operator as a type, so each (dtype, op) loop is monomorphized and vectorized.
trait Bin<T> {
    fn f(a: T, b: T) -> T;
}
struct SumOp;
struct ProdOp;
struct MaxOp;
struct MinOp;
impl<T: Arith> Bin<T> for SumOp {
    #[inline(always)]
    fn f(a: T, b: T) -> T {
        a.sum(b)
    }
}
impl<T: Arith> Bin<T> for ProdOp {
    #[inline(always)]
    fn f(a: T, b: T) -> T {
        a.prod(b)
    }
}
impl<T: Arith> Bin<T> for MaxOp {
    #[inline(always)]
    fn f(a: T, b: T) -> T {
        a.max(b)
    }
}
impl<T: Arith> Bin<T> for MinOp {
    #[inline(always)]
    fn f(a: T, b: T) -> T {
        a.min(b)
    }
}

#[inline(always)]
fn into3_loop<T: Arith, O: Bin<T>>(dst: &mut [T], a: &[T], b: &[T]) {
    for ((d, x), y) in dst.iter_mut().zip(a).zip(b) {
        *d = O::f(*x, *y);
    }
}

#[inline(always)]
fn inplace_loop<T: Arith, O: Bin<T>>(acc: &mut [T], b: &[T]) {
    for (d, y) in acc.iter_mut().zip(b) {
        *d = O::f(*d, *y);
    }
}

/// The loops again, compiled for AVX2: the crate builds for x86-64's baseline (SSE2), and
/// bf16's conversions in a loop nearly double at twice the width (6.3 -> 11.6 GB/s of output
/// on the developer machine's EPYC).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{inplace_loop, into3_loop, slots_wide_loop, Arith, Bin, Wide};
    use railcc_core::ReduceOp;

    pub fn here() -> bool {
        std::arch::is_x86_feature_detected!("avx2")
    }

    /// # Safety
    /// The CPU has AVX2 ([`here`]).
    #[target_feature(enable = "avx2")]
    pub unsafe fn into3<T: Arith, O: Bin<T>>(dst: &mut [T], a: &[T], b: &[T]) {
        into3_loop::<T, O>(dst, a, b)
    }

    /// # Safety
    /// The CPU has AVX2 ([`here`]).
    #[target_feature(enable = "avx2")]
    pub unsafe fn inplace<T: Arith, O: Bin<T>>(acc: &mut [T], b: &[T]) {
        inplace_loop::<T, O>(acc, b)
    }

    /// # Safety
    /// The CPU has AVX2 ([`here`]); as [`super::reduce_slots_raw`].
    #[target_feature(enable = "avx2")]
    pub unsafe fn slots_wide<T: Wide>(
        op: ReduceOp,
        dst: *mut u8,
        src: *const u8,
        n: usize,
        slots: usize,
    ) {
        // SAFETY: the caller's contract.
        unsafe { slots_wide_loop::<T>(op, dst, src, n, slots) }
    }
}

fn into3_op<T: Arith, O: Bin<T>>(dst: &mut [T], a: &[T], b: &[T]) {
    #[cfg(target_arch = "x86_64")]
    if avx2::here() {
        // SAFETY: the CPU has AVX2 (just checked; std caches the answer).
        return unsafe { avx2::into3::<T, O>(dst, a, b) };
    }
    into3_loop::<T, O>(dst, a, b)
}

fn inplace_op<T: Arith, O: Bin<T>>(acc: &mut [T], b: &[T]) {
    #[cfg(target_arch = "x86_64")]
    if avx2::here() {
        // SAFETY: as in `into3_op`.
        return unsafe { avx2::inplace::<T, O>(acc, b) };
    }
    inplace_loop::<T, O>(acc, b)
}

fn into3<T: Arith>(op: ReduceOp, dst: &mut [T], a: &[T], b: &[T]) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => into3_op::<T, SumOp>(dst, a, b),
        ReduceOp::Prod => into3_op::<T, ProdOp>(dst, a, b),
        ReduceOp::Max => into3_op::<T, MaxOp>(dst, a, b),
        ReduceOp::Min => into3_op::<T, MinOp>(dst, a, b),
    }
}

fn inplace<T: Arith>(op: ReduceOp, acc: &mut [T], b: &[T]) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => inplace_op::<T, SumOp>(acc, b),
        ReduceOp::Prod => inplace_op::<T, ProdOp>(acc, b),
        ReduceOp::Max => inplace_op::<T, MaxOp>(acc, b),
        ReduceOp::Min => inplace_op::<T, MinOp>(acc, b),
    }
}

/// Calls `$f::<T>` for the dtype's element type, `$w::<T>` for f16 and fp8, `$b::<bf16>`
/// for bf16.
macro_rules! dispatch {
    ($dt:expr, $f:ident, $w:ident, $b:ident, $($args:tt)*) => {
        match $dt {
            DataType::I8 => $f::<i8>($($args)*),
            DataType::U8 => $f::<u8>($($args)*),
            DataType::I32 => $f::<i32>($($args)*),
            DataType::U32 => $f::<u32>($($args)*),
            DataType::I64 => $f::<i64>($($args)*),
            DataType::U64 => $f::<u64>($($args)*),
            DataType::F32 => $f::<f32>($($args)*),
            DataType::F64 => $f::<f64>($($args)*),
            DataType::F16 => $w::<f16>($($args)*),
            DataType::Bf16 => $b::<bf16>($($args)*),
            DataType::F8E4M3 => $w::<F8E4M3>($($args)*),
            DataType::F8E5M2 => $w::<F8E5M2>($($args)*),
        }
    };
}

/// # Safety
/// Pointers valid for `n` elements of `T`, aligned; `dst` either equals `a` or overlaps neither.
unsafe fn reduce_typed<T: Arith>(op: ReduceOp, dst: *mut u8, a: *const u8, b: *const u8, n: usize) {
    let (dst, a, b) = (dst as *mut T, a as *const T, b as *const T);
    if std::ptr::eq(dst, b) && !std::ptr::eq(dst, a) {
        // Every operator is commutative: reduce into `b`'s place with `a`.
        inplace(
            op,
            std::slice::from_raw_parts_mut(dst, n),
            std::slice::from_raw_parts(a, n),
        );
    } else if std::ptr::eq(dst, a) {
        if std::ptr::eq(a, b) {
            let copy: Vec<T> = std::slice::from_raw_parts(b, n).to_vec();
            inplace(op, std::slice::from_raw_parts_mut(dst, n), &copy);
        } else {
            inplace(
                op,
                std::slice::from_raw_parts_mut(dst, n),
                std::slice::from_raw_parts(b, n),
            );
        }
    } else {
        into3(
            op,
            std::slice::from_raw_parts_mut(dst, n),
            std::slice::from_raw_parts(a, n),
            std::slice::from_raw_parts(b, n),
        );
    }
}

/// As [`reduce_typed`] for a narrow float: each block of `a` and `b` widened, reduced in f32
/// and rounded into `dst` (read before written, so `dst` may be `a` or `b`). Max and min
/// compare the widened values and keep the chosen element as it was (rounding it back would
/// turn fp8 e5m2's infinities into its largest finite value and quiet NaNs).
///
/// # Safety
/// As [`reduce_typed`].
unsafe fn reduce_wide<T: Wide>(op: ReduceOp, dst: *mut u8, a: *const u8, b: *const u8, n: usize) {
    let (dst, mut a, mut b) = (dst as *mut T, a as *const T, b as *const T);
    if std::ptr::eq(dst, b) && !std::ptr::eq(dst, a) {
        // The first operand is the one reduced into, as `reduce_typed`'s loops take it (it
        // decides which of two equal values, +0 and -0, a max or min keeps).
        std::mem::swap(&mut a, &mut b);
    }
    let (mut x, mut y) = ([0f32; BLOCK], [0f32; BLOCK]);
    let mut i = match op {
        ReduceOp::Sum | ReduceOp::Avg => T::pairwise_fast(false, dst, a, b, n),
        ReduceOp::Prod => T::pairwise_fast(true, dst, a, b, n),
        ReduceOp::Max | ReduceOp::Min => 0,
    };
    while i < n {
        let m = BLOCK.min(n - i);
        T::widen(std::slice::from_raw_parts(a.add(i), m), &mut x[..m]);
        T::widen(std::slice::from_raw_parts(b.add(i), m), &mut y[..m]);
        match op {
            ReduceOp::Max | ReduceOp::Min => {
                let max = op == ReduceOp::Max;
                for (k, (fx, fy)) in x[..m].iter().zip(&y[..m]).enumerate() {
                    let take_b = if max { fy > fx } else { fy < fx };
                    // Both read before the one write at the same index.
                    let v = if take_b { *b.add(i + k) } else { *a.add(i + k) };
                    *dst.add(i + k) = v;
                }
            }
            _ => {
                inplace::<f32>(op, &mut x[..m], &y[..m]);
                T::narrow(&x[..m], std::slice::from_raw_parts_mut(dst.add(i), m));
            }
        }
        i += m;
    }
}

/// `dst[i] = a[i] op b[i]` for `n` elements (`Avg` reduces as a sum).
///
/// # Safety
/// All three must be valid and aligned for `n` elements of `dt`; `dst` may be exactly `a` or
/// exactly `b`, and must not partially overlap either.
pub unsafe fn reduce_raw(
    dt: DataType,
    op: ReduceOp,
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    n: usize,
) {
    dispatch!(
        dt,
        reduce_typed,
        reduce_wide,
        reduce_typed,
        op,
        dst,
        a,
        b,
        n
    )
}

/// # Safety
/// As [`reduce_slots_raw`].
unsafe fn slots_typed<T: Arith>(
    op: ReduceOp,
    dst: *mut u8,
    src: *const u8,
    n: usize,
    slots: usize,
) {
    let (dst, src) = (dst as *mut T, src as *const T);
    let d = std::slice::from_raw_parts_mut(dst, n);
    d.copy_from_slice(std::slice::from_raw_parts(src, n));
    for j in 1..slots {
        inplace(op, d, std::slice::from_raw_parts(src.add(j * n), n));
    }
}

/// Narrow floats: accumulate in f32 (a block at a time, on the stack) and round once.
///
/// # Safety
/// As [`reduce_slots_raw`].
unsafe fn slots_wide<T: Wide>(op: ReduceOp, dst: *mut u8, src: *const u8, n: usize, slots: usize) {
    #[cfg(target_arch = "x86_64")]
    if avx2::here() {
        // SAFETY: the CPU has AVX2; the caller's contract.
        return unsafe { avx2::slots_wide::<T>(op, dst, src, n, slots) };
    }
    // SAFETY: the caller's contract.
    unsafe { slots_wide_loop::<T>(op, dst, src, n, slots) }
}

/// # Safety
/// As [`reduce_slots_raw`].
#[inline(always)]
unsafe fn slots_wide_loop<T: Wide>(
    op: ReduceOp,
    dst: *mut u8,
    src: *const u8,
    n: usize,
    slots: usize,
) {
    let (dst, src) = (dst as *mut T, src as *const T);
    let (mut acc, mut x) = ([0f32; BLOCK], [0f32; BLOCK]);
    let mut i = 0;
    while i < n {
        let m = BLOCK.min(n - i);
        T::widen(std::slice::from_raw_parts(src.add(i), m), &mut acc[..m]);
        for j in 1..slots {
            T::widen(
                std::slice::from_raw_parts(src.add(j * n + i), m),
                &mut x[..m],
            );
            inplace::<f32>(op, &mut acc[..m], &x[..m]);
        }
        T::narrow(&acc[..m], std::slice::from_raw_parts_mut(dst.add(i), m));
        i += m;
    }
}

/// `dst[i] = s_0[i] op s_1[i] op ... op s_(slots-1)[i]` in that order, where `s_j` starts
/// `j * n` elements after `src` (`Avg` reduces as a sum). f16, bf16 and fp8 accumulate in f32
/// and round once; other types reduce in their own type (integers wrap), as pairwise steps would.
///
/// # Safety
/// `src` valid and aligned for `slots * n` elements of `dt`, `dst` for `n`, not overlapping;
/// `slots >= 1`.
pub unsafe fn reduce_slots_raw(
    dt: DataType,
    op: ReduceOp,
    dst: *mut u8,
    src: *const u8,
    n: usize,
    slots: usize,
) {
    dispatch!(
        dt,
        slots_typed,
        slots_wide,
        slots_wide,
        op,
        dst,
        src,
        n,
        slots
    )
}

/// # Safety
/// As [`divide_raw`].
unsafe fn divide_typed<T: Arith>(buf: *mut u8, n: usize, ranks: usize) {
    for x in std::slice::from_raw_parts_mut(buf as *mut T, n) {
        *x = x.div_n(ranks);
    }
}

/// # Safety
/// As [`divide_raw`].
unsafe fn divide_wide<T: Wide>(buf: *mut u8, n: usize, ranks: usize) {
    let buf = buf as *mut T;
    let mut x = [0f32; BLOCK];
    let mut i = 0;
    while i < n {
        let m = BLOCK.min(n - i);
        T::widen(std::slice::from_raw_parts(buf.add(i), m), &mut x[..m]);
        for v in &mut x[..m] {
            *v /= ranks as f32;
        }
        T::narrow(&x[..m], std::slice::from_raw_parts_mut(buf.add(i), m));
        i += m;
    }
}

/// The final division of `Avg`: `buf[i] /= ranks`.
///
/// # Safety
/// `buf` valid and aligned for `n` elements of `dt`.
pub unsafe fn divide_raw(dt: DataType, buf: *mut u8, n: usize, ranks: usize) {
    dispatch!(dt, divide_typed, divide_wide, divide_typed, buf, n, ranks)
}

/// Safe wrapper over byte slices: `acc[i] = acc[i] op other[i]` for the common length.
pub fn reduce_bytes(
    dt: DataType,
    op: ReduceOp,
    acc: &mut [u8],
    other: &[u8],
) -> railcc_core::Result<()> {
    let n = acc.len().min(other.len()) / dt.size();
    for p in [acc.as_ptr(), other.as_ptr()] {
        if !(p as usize).is_multiple_of(dt.size()) {
            return Err(railcc_core::Error::invalid(format!(
                "reduce: buffer at {p:p} is not aligned for {dt}"
            )));
        }
    }
    // SAFETY: lengths bounded by both slices; alignment checked; `acc` and `other` are distinct
    // borrows so they cannot overlap.
    unsafe { reduce_raw(dt, op, acc.as_mut_ptr(), acc.as_ptr(), other.as_ptr(), n) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_and_op() {
        let a: Vec<f32> = vec![1.0, -2.0, 3.0, 4.0];
        let b: Vec<f32> = vec![2.0, 2.0, -1.0, 4.0];
        let expect = |op: ReduceOp| -> Vec<f64> {
            a.iter()
                .zip(&b)
                .map(|(x, y)| {
                    let (x, y) = (*x as f64, *y as f64);
                    match op {
                        ReduceOp::Sum | ReduceOp::Avg => x + y,
                        ReduceOp::Prod => x * y,
                        ReduceOp::Max => x.max(y),
                        ReduceOp::Min => x.min(y),
                    }
                })
                .collect()
        };
        for dt in [
            DataType::I8,
            DataType::I32,
            DataType::I64,
            DataType::F16,
            DataType::Bf16,
            DataType::F32,
            DataType::F64,
            DataType::F8E4M3,
            DataType::F8E5M2,
        ] {
            for op in ReduceOp::ALL {
                let enc = |v: &[f32]| {
                    crate::reference::encode(dt, &v.iter().map(|x| *x as f64).collect::<Vec<_>>())
                };
                let mut acc = enc(&a);
                reduce_bytes(dt, op, &mut acc, &enc(&b)).unwrap();
                assert_eq!(crate::reference::decode(dt, &acc), expect(op), "{dt} {op}");
            }
        }
    }

    #[test]
    fn unsigned_wraps() {
        let mut acc = vec![250u8, 3];
        reduce_bytes(DataType::U8, ReduceOp::Sum, &mut acc, &[10, 4]).unwrap();
        assert_eq!(acc, vec![4, 7]);
        let mut x = vec![9u8, 200];
        // SAFETY: valid u8 buffer of 2 elements.
        unsafe { divide_raw(DataType::U8, x.as_mut_ptr(), 2, 4) };
        assert_eq!(x, vec![2, 50]);
    }

    #[test]
    fn bf16_rounding_matches_half_bit_for_bit() {
        // Specials, the rounding boundaries (ties to even both ways, carries into the
        // exponent and into infinity), NaNs of both signs, then a stride through every u32.
        let mut xs: Vec<u32> = vec![
            0,
            0x8000_0000,
            0x7f80_0000,
            0xff80_0000,
            0x7f7f_ffff,
            0xff7f_ffff,
            0x7fc0_0000,
            0x7f80_0001,
            0xffff_ffff,
            0x7fff_ffff,
            0xff80_0001,
            0x0000_8000,
            0x0001_8000,
            0x0000_8001,
            0x3f80_8000,
            0x3f81_8000,
            0x3f80_7fff,
            0x7f7f_8000,
            0x0000_0001,
        ];
        xs.extend((0..=u32::MAX).step_by(4099));
        for x in xs {
            let f = f32::from_bits(x);
            assert_eq!(
                bf16_of(f).to_bits(),
                bf16::from_f32(f).to_bits(),
                "{x:#010x}"
            );
        }
    }

    /// Every element of `a` and `b` as the per-element conversions would reduce it.
    fn pairwise_expect<T: Copy>(
        op: ReduceOp,
        a: &[T],
        b: &[T],
        to: fn(T) -> f32,
        from: fn(f32) -> T,
    ) -> Vec<T> {
        a.iter()
            .zip(b)
            .map(|(x, y)| {
                let (fx, fy) = (to(*x), to(*y));
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => from(fx + fy),
                    ReduceOp::Prod => from(fx * fy),
                    ReduceOp::Max => {
                        if fy > fx {
                            *y
                        } else {
                            *x
                        }
                    }
                    ReduceOp::Min => {
                        if fy < fx {
                            *y
                        } else {
                            *x
                        }
                    }
                }
            })
            .collect()
    }

    fn bits<T: bytemuck::Pod>(v: &[T]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    /// One narrow float type's inputs for `narrow_floats_reduce_...`: `n` elements of `a` and
    /// `b` (special values first: zeros, infinities, NaNs with payloads, the largest finite
    /// values, subnormals; then values of every magnitude, so sums and products round and
    /// overflow) and what each aliasing of a two-input step must give, as the element by
    /// element conversions give it with the reduced-into input first.
    fn pairwise_case<T: bytemuck::Pod>(
        op: ReduceOp,
        n: usize,
        k: f32,
        specials: &[T],
        to: fn(T) -> f32,
        from: fn(f32) -> T,
    ) -> [Vec<u8>; 4] {
        let val = |i: usize, k: f32| ((i * 37 % 101) as f32 - 50.0) * k * (1.0 + i as f32 / 7.0);
        let at = |i: usize, shift: usize, k: f32| match specials.get(i) {
            Some(_) => specials[(i * 5 + shift) % specials.len()],
            None => from(val(i + shift, k)),
        };
        let mut a: Vec<T> = (0..n).map(|i| at(i, 0, k)).collect();
        let mut b: Vec<T> = (0..n).map(|i| at(i, 3, k / 3.0)).collect();
        // Then every pair of two NaNs and of two zeros (+0 and -0 compare equal: max and min
        // keep the first operand's).
        let of = |f: fn(f32) -> bool| -> Vec<T> {
            specials.iter().copied().filter(|x| f(to(*x))).collect()
        };
        let (nans, zeros) = (of(f32::is_nan), of(|x| x == 0.0));
        let all = |v: &Vec<T>| -> Vec<(T, T)> {
            v.iter()
                .flat_map(|p| v.iter().map(move |q| (*p, *q)))
                .collect()
        };
        let pairs = all(&nans).into_iter().chain(all(&zeros));
        for (j, (p, q)) in (specials.len()..n).zip(pairs) {
            (a[j], b[j]) = (p, q);
        }
        let into_a = pairwise_expect(op, &a, &b, to, from);
        let into_b = pairwise_expect(op, &b, &a, to, from);
        [bits(&a), bits(&b), bits(&into_a), bits(&into_b)]
    }

    /// `got` equals `want` bit for bit, except that where both inputs (`a`, `b`) are NaNs a
    /// sum or product may be either NaN: which input's payload survives is the compiler's
    /// choice (LLVM may swap an addition's operands once the loop is vectorized), and IEEE 754
    /// leaves it open (CUDA returns its canonical NaN). One NaN input, inf - inf, 0 x inf and
    /// max and min stay exact.
    fn same(
        dt: DataType,
        op: ReduceOp,
        (a, b): (&[u8], &[u8]),
        got: &[u8],
        want: &[u8],
        what: &str,
    ) {
        let nan = |e: &[u8]| match dt {
            DataType::Bf16 => bf16::from_le_bytes([e[0], e[1]]).is_nan(),
            DataType::F16 => f16::from_le_bytes([e[0], e[1]]).is_nan(),
            DataType::F8E4M3 => F8E4M3::from_bits(e[0]).is_nan(),
            _ => F8E5M2::from_bits(e[0]).is_nan(),
        };
        let w = dt.size();
        let loose = matches!(op, ReduceOp::Sum | ReduceOp::Avg | ReduceOp::Prod);
        assert_eq!(got.len(), want.len(), "{dt} {op} {what}");
        let two_nans = |i: usize| nan(&a[i * w..][..w]) && nan(&b[i * w..][..w]);
        for (i, (g, e)) in got.chunks(w).zip(want.chunks(w)).enumerate() {
            let ok = g == e || (loose && two_nans(i) && nan(g) && nan(e));
            assert!(
                ok,
                "{dt} {op} {what}: element {i} is {g:02x?}, not {e:02x?}"
            );
        }
    }

    #[test]
    fn narrow_floats_reduce_as_element_by_element_in_every_aliasing() {
        // Lengths past a block and not a multiple of the vector width.
        let n = 3 * BLOCK + 13;
        let f32s = [
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::MAX,
            -f32::MAX,
            1e-40,
            65504.0,
            57344.0,
            448.0,
            1.0,
            -1.0,
        ];
        let bf: Vec<bf16> = (f32s.iter().map(|x| bf16::from_f32(*x)))
            .chain([0x7fc1, 0xffa0, 0x7f81, 0x0001].map(bf16::from_bits))
            .collect();
        let hf: Vec<f16> = (f32s.iter().map(|x| f16::from_f32(*x)))
            .chain([0x7e01, 0xfd00, 0x7c01, 0x0001].map(f16::from_bits))
            .collect();
        let e4: Vec<F8E4M3> = (f32s.iter().map(|x| F8E4M3::from_f32(*x)))
            .chain([0x7f, 0xff, 0x7e, 0x01].map(F8E4M3::from_bits))
            .collect();
        let e5: Vec<F8E5M2> = (f32s.iter().map(|x| F8E5M2::from_f32(*x)))
            .chain([0x7c, 0xfc, 0x7d, 0xfe, 0x7b, 0x01].map(F8E5M2::from_bits))
            .collect();
        for dt in [
            DataType::Bf16,
            DataType::F16,
            DataType::F8E4M3,
            DataType::F8E5M2,
        ] {
            for op in ReduceOp::ALL {
                let [a, b, into_a, into_b] = match dt {
                    DataType::Bf16 => {
                        pairwise_case(op, n, 3.3e36, &bf, bf16::to_f32, bf16::from_f32)
                    }
                    DataType::F16 => pairwise_case(op, n, 1.7e2, &hf, f16::to_f32, f16::from_f32),
                    DataType::F8E4M3 => {
                        pairwise_case(op, n, 3.0, &e4, |x| x.to_f32(), F8E4M3::from_f32)
                    }
                    _ => pairwise_case(op, n, 300.0, &e5, |x| x.to_f32(), F8E5M2::from_f32),
                };
                // Into a third buffer, into `a`'s place, into `b`'s place.
                let mut d = vec![0u8; a.len()];
                // A byte vector's allocation is aligned for 2-byte elements in practice:
                // asserted, so the unsafe calls below meet their contract.
                let aligned = |p: *const u8| (p as usize).is_multiple_of(2);
                assert!(aligned(a.as_ptr()) && aligned(b.as_ptr()) && aligned(d.as_ptr()));
                // SAFETY: three buffers of n aligned elements, not overlapping.
                unsafe { reduce_raw(dt, op, d.as_mut_ptr(), a.as_ptr(), b.as_ptr(), n) };
                same(dt, op, (&a, &b), &d, &into_a, "into a third buffer");
                let mut x = a.clone();
                reduce_bytes(dt, op, &mut x, &b).unwrap();
                same(dt, op, (&a, &b), &x, &into_a, "into a");
                let mut y = b.clone();
                // SAFETY: `y` is `b`'s copy, reduced in place with `a` as the other input.
                unsafe { reduce_raw(dt, op, y.as_mut_ptr(), a.as_ptr(), y.as_ptr(), n) };
                same(dt, op, (&a, &b), &y, &into_b, "into b");
            }
        }
    }

    /// `slots` inputs of `n` elements of `dt` (values of `src` rounded by `from`) summed by
    /// `reduce_slots_raw` equal their f32 sum rounded once; the inputs are returned.
    fn slots_sum_rounds_once<T: bytemuck::Pod + PartialEq + std::fmt::Debug>(
        dt: DataType,
        src: &[f32],
        (n, slots): (usize, usize),
        to: fn(T) -> f32,
        from: fn(f32) -> T,
    ) -> Vec<T> {
        let x: Vec<T> = src.iter().map(|v| from(*v)).collect();
        let mut out = vec![from(0.0); n];
        // SAFETY: `x` holds slots * n elements, `out` n.
        unsafe {
            reduce_slots_raw(
                dt,
                ReduceOp::Sum,
                out.as_mut_ptr() as *mut u8,
                x.as_ptr() as *const u8,
                n,
                slots,
            )
        };
        for (i, o) in out.iter().enumerate() {
            let want = from((0..slots).map(|j| to(x[j * n + i])).sum());
            assert_eq!(bits(&[*o]), bits(&[want]), "{dt} element {i}");
        }
        x
    }

    #[test]
    fn narrow_floats_accumulate_many_inputs_in_f32_and_round_once() {
        let (n, slots) = (BLOCK + 9, 5);
        let src: Vec<f32> = (0..n * slots)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 64.0)
            .collect();
        let b = slots_sum_rounds_once(
            DataType::Bf16,
            &src,
            (n, slots),
            bf16::to_f32,
            bf16::from_f32,
        );
        slots_sum_rounds_once(DataType::F16, &src, (n, slots), f16::to_f32, f16::from_f32);
        // Avg's last step: each element divided, rounded once.
        let mut d = b[..n].to_vec();
        // SAFETY: `d` holds n bf16 elements.
        unsafe { divide_raw(DataType::Bf16, d.as_mut_ptr() as *mut u8, n, 3) };
        for (x, y) in d.iter().zip(&b) {
            assert_eq!(x.to_bits(), bf16::from_f32(y.to_f32() / 3.0).to_bits());
        }
    }
}
