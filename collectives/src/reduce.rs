//! Host reduction kernels for every dtype and op. Each loop is a plain zip over two slices with
//! the operator chosen outside the loop, so the compiler vectorizes it; f16 and bf16 are
//! widened to f32 for the arithmetic, as are fp8 (e4m3, e5m2; rounded back with CUDA's
//! saturating conversion). A two-input step rounds its result to the storage type
//! (as a partial sum that travels between ranks must be); [`reduce_slots_raw`] reduces many
//! inputs in one step and, for f16/bf16/fp8, accumulates in f32 and rounds once.

use float8::{F8E4M3, F8E5M2};
use half::{bf16, f16};
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

macro_rules! half_arith {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn sum(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() + o.to_f32()) }
            #[inline(always)] fn prod(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() * o.to_f32()) }
            #[inline(always)] fn max(self, o: Self) -> Self { if o.to_f32() > self.to_f32() { o } else { self } }
            #[inline(always)] fn min(self, o: Self) -> Self { if o.to_f32() < self.to_f32() { o } else { self } }
            #[inline(always)] fn div_n(self, n: usize) -> Self { <$t>::from_f32(self.to_f32() / n as f32) }
        }
    )*};
}
half_arith!(f16, bf16, F8E4M3, F8E5M2);

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

fn into3_op<T: Arith, O: Bin<T>>(dst: &mut [T], a: &[T], b: &[T]) {
    for ((d, x), y) in dst.iter_mut().zip(a).zip(b) {
        *d = O::f(*x, *y);
    }
}

fn inplace_op<T: Arith, O: Bin<T>>(acc: &mut [T], b: &[T]) {
    for (d, y) in acc.iter_mut().zip(b) {
        *d = O::f(*d, *y);
    }
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

macro_rules! dispatch {
    ($dt:expr, $f:ident, $($args:tt)*) => {
        match $dt {
            DataType::I8 => $f::<i8>($($args)*),
            DataType::U8 => $f::<u8>($($args)*),
            DataType::I32 => $f::<i32>($($args)*),
            DataType::U32 => $f::<u32>($($args)*),
            DataType::I64 => $f::<i64>($($args)*),
            DataType::U64 => $f::<u64>($($args)*),
            DataType::F16 => $f::<f16>($($args)*),
            DataType::Bf16 => $f::<bf16>($($args)*),
            DataType::F32 => $f::<f32>($($args)*),
            DataType::F64 => $f::<f64>($($args)*),
            DataType::F8E4M3 => $f::<F8E4M3>($($args)*),
            DataType::F8E5M2 => $f::<F8E5M2>($($args)*),
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
    dispatch!(dt, reduce_typed, op, dst, a, b, n)
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

/// Widening to f32 and rounding back, for one 16-bit float type.
type Widen<T> = (fn(T) -> f32, fn(f32) -> T);

/// f16/bf16: accumulate in f32 (a block at a time, on the stack) and round once.
///
/// # Safety
/// As [`reduce_slots_raw`].
unsafe fn slots_wide<T: Copy>(
    op: ReduceOp,
    dst: *mut u8,
    src: *const u8,
    n: usize,
    slots: usize,
    (to, from): Widen<T>,
) {
    const B: usize = 512;
    let (dst, src) = (dst as *mut T, src as *const T);
    let (mut acc, mut x) = ([0f32; B], [0f32; B]);
    let mut i = 0;
    while i < n {
        let m = B.min(n - i);
        for (k, a) in acc[..m].iter_mut().enumerate() {
            *a = to(*src.add(i + k));
        }
        for j in 1..slots {
            let s = std::slice::from_raw_parts(src.add(j * n + i), m);
            for (v, e) in x[..m].iter_mut().zip(s) {
                *v = to(*e);
            }
            inplace::<f32>(op, &mut acc[..m], &x[..m]);
        }
        for (k, a) in acc[..m].iter().enumerate() {
            *dst.add(i + k) = from(*a);
        }
        i += m;
    }
}

/// `dst[i] = s_0[i] op s_1[i] op ... op s_(slots-1)[i]` in that order, where `s_j` starts
/// `j * n` elements after `src` (`Avg` reduces as a sum). f16 and bf16 accumulate in f32 and
/// round once; other types reduce in their own type (integers wrap), as pairwise steps would.
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
    match dt {
        DataType::F16 => slots_wide::<f16>(op, dst, src, n, slots, (f16::to_f32, f16::from_f32)),
        DataType::Bf16 => {
            slots_wide::<bf16>(op, dst, src, n, slots, (bf16::to_f32, bf16::from_f32))
        }
        DataType::F8E4M3 => {
            slots_wide::<F8E4M3>(op, dst, src, n, slots, (|x| x.to_f32(), F8E4M3::from_f32))
        }
        DataType::F8E5M2 => {
            slots_wide::<F8E5M2>(op, dst, src, n, slots, (|x| x.to_f32(), F8E5M2::from_f32))
        }
        _ => dispatch!(dt, slots_typed, op, dst, src, n, slots),
    }
}

/// # Safety
/// As [`divide_raw`].
unsafe fn divide_typed<T: Arith>(buf: *mut u8, n: usize, ranks: usize) {
    for x in std::slice::from_raw_parts_mut(buf as *mut T, n) {
        *x = x.div_n(ranks);
    }
}

/// The final division of `Avg`: `buf[i] /= ranks`.
///
/// # Safety
/// `buf` valid and aligned for `n` elements of `dt`.
pub unsafe fn divide_raw(dt: DataType, buf: *mut u8, n: usize, ranks: usize) {
    dispatch!(dt, divide_typed, buf, n, ranks)
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
}
