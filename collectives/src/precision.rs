//! Precision mode (`railcc bench --fill random`): random inputs of every dtype, checked against
//! an exact reference with an error bound, instead of the small integers of
//! [`crate::reference`] that every reduction order sums exactly.
//!
//! Integers are random over their whole range and must match exactly: wrapping arithmetic is
//! exact modulo 2^bits whatever the order, so the reference reduces in i128 and wraps.
//!
//! Floats are random with mixed signs and magnitudes (sum, avg, min, max: |x| in [2^-8, 16);
//! prod: |x| in [0.875, 1.125), so 64 factors stay normal in f16). With `u` the unit roundoff of
//! the storage type (2^-11 f16, 2^-8 bf16, 2^-24 f32, 2^-53 f64, 2^-4 e4m3, 2^-3 e5m2), `n`
//! the rank count, `γ_k = (1 + u)^k - 1` (at most Higham's `k·u / (1 - k·u)`), and
//! `η = (n + 2)` times the storage type's smallest subnormal (for results that underflow), an
//! element is right when `|got - want| <= tol` with
//! - sum: `want = Σ x_i`, `tol = γ_n · Σ|x_i| + η`;
//! - avg: `want = Σ x_i / n`, `tol = γ_(n+2) · Σ|x_i| / n + η`;
//! - prod: `want = Π x_i`, `tol = γ_n · |Π x_i| + η`;
//! - min, max and every copy (all_gather, broadcast, all-to-all, send/recv): `tol = 0`.
//!
//! Why these: any order of `n - 1` pairwise operations, each rounded to the storage type (a
//! partial sum that crosses the network is stored as the dtype), errs by at most
//! `γ_(n-1) · Σ|x_i|` (Higham, Accuracy and Stability of Numerical Algorithms, 4.2); one more
//! rounding covers a wider accumulator rounded once at the end, two more cover avg's division
//! and its rounding. The reference itself sums in f64 with Neumaier's compensation; its own
//! error (`γ_n(2^-53)`) is added for f64 data. The bound is also met by plain bf16
//! accumulation, so it cannot show that f16/bf16 accumulate wider: the GPU kernel test
//! `wide_accumulation` and `tests/precision.rs` show that with sums whose digits plain bf16 loses.

use crate::plan::CollArgs;
use crate::reference;
use float8::{F8E4M3, F8E5M2};
use half::{bf16, f16};
use railcc_core::call::CollKind;
use railcc_core::{DataType, ReduceOp};

/// How a bench or test fills its inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fill {
    /// Small integers: every reduction order is exact, results compare bit for bit.
    #[default]
    Exact,
    /// Random values of each dtype, checked with the error bound above.
    Random,
}

impl Fill {
    pub fn name(self) -> &'static str {
        match self {
            Fill::Exact => "exact",
            Fill::Random => "random",
        }
    }
}

impl std::str::FromStr for Fill {
    type Err = String;
    fn from_str(s: &str) -> Result<Fill, String> {
        match s {
            "exact" | "int" => Ok(Fill::Exact),
            "random" | "rand" => Ok(Fill::Random),
            _ => Err(format!("fill '{s}': exact or random")),
        }
    }
}

/// 64 well-mixed bits for (rank, element, seed) (splitmix64's finaliser).
fn bits(rank: usize, i: usize, seed: u64) -> u64 {
    let mut z = seed
        ^ (rank as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (i as u64)
            .wrapping_mul(0xbf58_476d_1ce4_e5b9)
            .rotate_left(17);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn bits_of(dt: DataType) -> u32 {
    dt.size() as u32 * 8
}

fn signed(dt: DataType) -> bool {
    matches!(dt, DataType::I8 | DataType::I32 | DataType::I64)
}

/// `v` modulo 2^bits of `dt`, as `dt`'s own representative (signed types signed).
pub fn wrap_int(dt: DataType, v: i128) -> i128 {
    let b = bits_of(dt);
    let m = v & ((1i128 << b) - 1);
    if signed(dt) && m >= 1i128 << (b - 1) {
        m - (1i128 << b)
    } else {
        m
    }
}

/// Element `i` of `rank`'s random input for an integer dtype.
fn random_int(dt: DataType, rank: usize, i: usize, seed: u64) -> i128 {
    wrap_int(dt, bits(rank, i, seed) as i128)
}

/// Element `i` of `rank`'s random input for a float dtype, already representable in `dt`.
fn random_float(dt: DataType, op: ReduceOp, rank: usize, i: usize, seed: u64) -> f64 {
    let h = bits(rank, i, seed);
    let frac = (h >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
    let sign = if h & 1 == 0 { 1.0 } else { -1.0 };
    let mag = match op {
        ReduceOp::Prod => 0.875 + 0.25 * frac,
        _ => {
            let e = ((h >> 1) % 12) as i32 - 8; // 2^-8 .. 2^3
            (1.0 + frac) * 2f64.powi(e)
        }
    };
    round_to(dt, sign * mag)
}

fn round_to(dt: DataType, v: f64) -> f64 {
    match dt {
        DataType::F16 => f16::from_f64(v).to_f64(),
        DataType::Bf16 => bf16::from_f64(v).to_f64(),
        DataType::F32 => v as f32 as f64,
        DataType::F8E4M3 => F8E4M3::from_f64(v).to_f64(),
        DataType::F8E5M2 => F8E5M2::from_f64(v).to_f64(),
        _ => v,
    }
}

/// Little-endian bytes of an integer element.
#[cfg(test)]
fn encode_int(dt: DataType, v: i128, out: &mut Vec<u8>) {
    out.extend_from_slice(&(v as u128).to_le_bytes()[..dt.size()]);
}

fn decode_int(dt: DataType, b: &[u8], i: usize) -> i128 {
    let es = dt.size();
    let mut w = [0u8; 16];
    w[..es].copy_from_slice(&b[i * es..(i + 1) * es]);
    wrap_int(dt, u128::from_le_bytes(w) as i128)
}

fn decode_float(dt: DataType, b: &[u8], i: usize) -> f64 {
    let es = dt.size();
    reference::decode(dt, &b[i * es..(i + 1) * es])
        .first()
        .copied()
        .unwrap_or(f64::NAN)
}

/// Every rank's input buffer for a call.
pub fn fill_input(fill: Fill, a: &CollArgs, rank: usize, seed: u64) -> Vec<u8> {
    if fill == Fill::Exact {
        return reference::fill_input(a, rank, seed);
    }
    let (dt, es) = (a.dtype, a.dtype.size());
    let mut out = vec![0u8; a.send_elems() * es];
    if dt.is_float() {
        reference::fill_in_parallel(&mut out, es, &|i, slot| {
            reference::encode_one(dt, random_float(dt, a.op, rank, i, seed), slot)
        });
    } else {
        reference::fill_in_parallel(&mut out, es, &|i, slot| {
            slot.copy_from_slice(&(random_int(dt, rank, i, seed) as u128).to_le_bytes()[..es])
        });
    }
    out
}

/// What one element of a receive buffer must hold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Want {
    Int(i128),
    /// `|got - value| <= tol`.
    Float {
        value: f64,
        tol: f64,
    },
}

impl Want {
    /// Whether element `i` of `out` (in `dt`) meets this; NaN never does.
    pub fn met(self, dt: DataType, out: &[u8], i: usize) -> bool {
        match self {
            Want::Int(v) => decode_int(dt, out, i) == v,
            Want::Float { value, tol } => (decode_float(dt, out, i) - value).abs() <= tol,
        }
    }
}

/// Unit roundoff of the storage type.
pub fn unit_roundoff(dt: DataType) -> f64 {
    match dt {
        DataType::F16 => 2f64.powi(-11),
        DataType::Bf16 => 2f64.powi(-8),
        DataType::F32 => 2f64.powi(-24),
        DataType::F8E4M3 => 2f64.powi(-4),
        DataType::F8E5M2 => 2f64.powi(-3),
        _ => 2f64.powi(-53),
    }
}

fn smallest_subnormal(dt: DataType) -> f64 {
    match dt {
        DataType::F16 => 2f64.powi(-24),
        DataType::Bf16 => 2f64.powi(-133),
        DataType::F32 => 2f64.powi(-149),
        DataType::F8E4M3 => 2f64.powi(-9),
        DataType::F8E5M2 => 2f64.powi(-16),
        _ => f64::from_bits(1),
    }
}

/// The bound on `k` roundings: `(1 + u)^k - 1`, which Higham's `γ_k = k·u / (1 - k·u)` bounds
/// from above while `k·u < 1`; this form stays finite where fp8's `k·u` reaches 1 (16 ranks
/// of e4m3).
fn gamma(k: usize, u: f64) -> f64 {
    (k as f64 * u.ln_1p()).exp_m1()
}

/// The reduction of `xs` (one value per rank) and the bound the module comment derives.
pub fn reduce_float(dt: DataType, op: ReduceOp, xs: &[f64]) -> Want {
    let n = xs.len().max(1);
    let u = unit_roundoff(dt);
    let eta = (n + 2) as f64 * smallest_subnormal(dt);
    let abs: f64 = xs.iter().map(|x| x.abs()).sum();
    let ref_err = gamma(n, 2f64.powi(-53));
    let (value, tol) = match op {
        ReduceOp::Sum => (neumaier(xs), (gamma(n, u) + ref_err) * abs + eta),
        ReduceOp::Avg => (
            neumaier(xs) / n as f64,
            (gamma(n + 2, u) + ref_err) * abs / n as f64 + eta,
        ),
        ReduceOp::Prod => {
            let p: f64 = xs.iter().product();
            (p, (gamma(n, u) + ref_err) * p.abs() + eta)
        }
        ReduceOp::Max => (xs.iter().copied().fold(f64::NEG_INFINITY, f64::max), 0.0),
        ReduceOp::Min => (xs.iter().copied().fold(f64::INFINITY, f64::min), 0.0),
    };
    Want::Float { value, tol }
}

/// Sum with Neumaier's compensation: error about 2^-53 of the result, not of Σ|x|.
fn neumaier(xs: &[f64]) -> f64 {
    let (mut s, mut c) = (0.0f64, 0.0f64);
    for &x in xs {
        let t = s + x;
        c += if s.abs() >= x.abs() {
            (s - t) + x
        } else {
            (x - t) + s
        };
        s = t;
    }
    s + c
}

/// The exact wrapped reduction, as the kernels compute it (avg: wrapped sum, then truncating
/// division in the dtype).
pub fn reduce_int(dt: DataType, op: ReduceOp, xs: &[i128]) -> i128 {
    let mut it = xs.iter().copied();
    let first = it.next().unwrap_or(0);
    let acc = it.fold(first, |a, x| match op {
        ReduceOp::Sum | ReduceOp::Avg => wrap_int(dt, a.wrapping_add(x)),
        ReduceOp::Prod => wrap_int(dt, a.wrapping_mul(x)),
        ReduceOp::Max => a.max(x),
        ReduceOp::Min => a.min(x),
    });
    if op == ReduceOp::Avg {
        acc / xs.len().max(1) as i128
    } else {
        acc
    }
}

/// What element `i` of `rank`'s receive buffer must hold after a call whose inputs came from
/// [`fill_input`] with `fill` and `seed`; `None` where it is unspecified (a rooted reduce's
/// non-root buffer).
pub fn want(fill: Fill, a: &CollArgs, rank: usize, i: usize, seed: u64) -> Option<Want> {
    let (dt, op, p, c) = (a.dtype, a.op, a.nranks, a.count.max(1));
    if fill == Fill::Exact {
        return reference::expected_value(a, rank, i, seed)
            .map(|value| Want::Float { value, tol: 0.0 })
            .map(|w| exact_as_int(dt, w));
    }
    let one = |r: usize, j: usize| {
        if dt.is_float() {
            Want::Float {
                value: random_float(dt, op, r, j, seed),
                tol: 0.0,
            }
        } else {
            Want::Int(random_int(dt, r, j, seed))
        }
    };
    let reduced = |j: usize| {
        if dt.is_float() {
            let xs: Vec<f64> = (0..p).map(|r| random_float(dt, op, r, j, seed)).collect();
            reduce_float(dt, op, &xs)
        } else {
            let xs: Vec<i128> = (0..p).map(|r| random_int(dt, r, j, seed)).collect();
            Want::Int(reduce_int(dt, op, &xs))
        }
    };
    Some(match a.coll {
        CollKind::AllReduce => reduced(i),
        CollKind::Reduce if rank == a.root => reduced(i),
        CollKind::ReduceScatter => reduced(rank * c + i),
        CollKind::AllGather => one(i / c, i % c),
        CollKind::Broadcast => one(a.root, i),
        CollKind::AllToAll => one(i / c, rank * c + i % c),
        CollKind::SendRecv => one((rank + p - 1) % p, i),
        CollKind::Reduce | CollKind::Barrier => return None,
    })
}

/// The exact reference's value as an integer where the dtype is one (an f64 holds it exactly).
fn exact_as_int(dt: DataType, w: Want) -> Want {
    match w {
        Want::Float { value, .. } if !dt.is_float() => Want::Int(value as i128),
        w => w,
    }
}

/// Elements of `out` (`rank`'s receive buffer) that miss [`want`].
pub fn count_wrong(fill: Fill, a: &CollArgs, rank: usize, out: &[u8], seed: u64) -> u64 {
    if fill == Fill::Exact {
        return reference::count_wrong(a, rank, out, seed);
    }
    let n = out.len() / a.dtype.size();
    reference::count_in_parallel(n, &|i| {
        want(fill, a, rank, i, seed).is_some_and(|w| !w.met(a.dtype, out, i))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(coll: CollKind, nranks: usize, dt: DataType, op: ReduceOp) -> CollArgs {
        CollArgs {
            coll,
            nranks,
            count: 257,
            dtype: dt,
            op,
            root: 1,
        }
    }

    #[test]
    fn integers_wrap_exactly() {
        assert_eq!(wrap_int(DataType::I8, 200), -56);
        assert_eq!(wrap_int(DataType::U8, -1), 255);
        assert_eq!(wrap_int(DataType::I64, 1i128 << 63), i64::MIN as i128);
        assert_eq!(wrap_int(DataType::U64, -1), u64::MAX as i128);
        let xs = [i64::MAX as i128, 1, 1];
        assert_eq!(
            reduce_int(DataType::I64, ReduceOp::Sum, &xs),
            i64::MIN as i128 + 1
        );
        assert_eq!(reduce_int(DataType::I32, ReduceOp::Avg, &[-7, 0]), -3);
    }

    #[test]
    fn random_inputs_cover_every_dtype_and_decode_to_what_was_drawn() {
        for dt in DataType::ALL {
            for op in ReduceOp::ALL {
                let a = args(CollKind::AllReduce, 3, dt, op);
                let buf = fill_input(Fill::Random, &a, 2, 9);
                assert_eq!(buf.len(), 257 * dt.size());
                for i in 0..257 {
                    let w = want(Fill::Random, &args(CollKind::SendRecv, 3, dt, op), 0, i, 9);
                    assert!(
                        w.is_some_and(|w| w.met(dt, &buf, i)),
                        "{dt} {op} element {i}"
                    );
                }
                let distinct: std::collections::HashSet<&[u8]> =
                    buf.chunks_exact(dt.size()).collect();
                // fp8 holds few values in prod's [0.875, 1.125): e5m2 only +-0.875 and +-1.
                let fp8 = matches!(dt, DataType::F8E4M3 | DataType::F8E5M2);
                let enough = if fp8 && op == ReduceOp::Prod { 3 } else { 50 };
                assert!(
                    distinct.len() > enough,
                    "{dt} {op}: {} distinct",
                    distinct.len()
                );
            }
        }
    }

    /// The check must be able to fail: a value off by more than the bound is counted, one
    /// inside it is not, and min/max/copies must be exact.
    #[test]
    fn the_bound_rejects_what_it_should() {
        for dt in [DataType::F16, DataType::Bf16, DataType::F32, DataType::F64] {
            let xs = [1.5, -0.25, 3.0, 0.125];
            let Want::Float { value, tol } = reduce_float(dt, ReduceOp::Sum, &xs) else {
                panic!("float")
            };
            assert_eq!(value, 4.375);
            let bound = gamma(4, unit_roundoff(dt)) * 4.875;
            // f64 data also carries the f64 reference's own error: twice the bound.
            assert!(tol >= bound && tol < 2.01 * bound, "{dt}: {tol}");
            let Want::Float { tol, .. } = reduce_float(dt, ReduceOp::Max, &xs) else {
                panic!("float")
            };
            assert_eq!(tol, 0.0);
        }
        let a = args(CollKind::AllReduce, 4, DataType::Bf16, ReduceOp::Sum);
        let mut out = Vec::new();
        for i in 0..a.count {
            let Some(Want::Float { value, .. }) = want(Fill::Random, &a, 0, i, 3) else {
                panic!("float")
            };
            out.extend_from_slice(&bf16::from_f64(value).to_le_bytes());
        }
        assert_eq!(count_wrong(Fill::Random, &a, 0, &out, 3), 0);
        // Element 5 moved by 3 times its bound: wrong.
        let Some(Want::Float { value, tol }) = want(Fill::Random, &a, 0, 5, 3) else {
            panic!("float")
        };
        let off = bf16::from_f64(value + 3.0 * tol + value.abs() * 2f64.powi(-7));
        out[10..12].copy_from_slice(&off.to_le_bytes());
        assert_eq!(count_wrong(Fill::Random, &a, 0, &out, 3), 1);
        // Integers: one bit off is wrong.
        let a = args(CollKind::AllReduce, 3, DataType::U64, ReduceOp::Prod);
        let mut out = Vec::new();
        for i in 0..a.count {
            let Some(Want::Int(v)) = want(Fill::Random, &a, 0, i, 3) else {
                panic!("int")
            };
            encode_int(DataType::U64, v, &mut out);
        }
        assert_eq!(count_wrong(Fill::Random, &a, 0, &out, 3), 0);
        out[8] ^= 1;
        assert_eq!(count_wrong(Fill::Random, &a, 0, &out, 3), 1);
    }
}
