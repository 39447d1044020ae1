//! The oracle: what each rank's output must be, computed straight from every rank's input
//! with exact arithmetic (i128 and f64), independent of the kernels in [`crate::reduce`].
//! Tests fill inputs with small integers ([`fill_value`]) so that every dtype holds every
//! intermediate exactly and results compare bit for bit whatever the reduction order.

use crate::plan::CollArgs;
use float8::{F8E4M3, F8E5M2};
use half::{bf16, f16};
use railcc_core::call::CollKind;
use railcc_core::{DataType, ReduceOp};

/// Decodes a byte buffer to f64 values (integers are exact below 2^53).
pub fn decode(dt: DataType, b: &[u8]) -> Vec<f64> {
    let c = b.chunks_exact(dt.size());
    match dt {
        DataType::I8 => c.map(|x| x[0] as i8 as f64).collect(),
        DataType::U8 => c.map(|x| x[0] as f64).collect(),
        DataType::I32 => c
            .map(|x| i32::from_le_bytes([x[0], x[1], x[2], x[3]]) as f64)
            .collect(),
        DataType::U32 => c
            .map(|x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]) as f64)
            .collect(),
        DataType::I64 => c.map(|x| i64::from_le_bytes(arr8(x)) as f64).collect(),
        DataType::U64 => c.map(|x| u64::from_le_bytes(arr8(x)) as f64).collect(),
        DataType::F16 => c
            .map(|x| f16::from_le_bytes([x[0], x[1]]).to_f64())
            .collect(),
        DataType::Bf16 => c
            .map(|x| bf16::from_le_bytes([x[0], x[1]]).to_f64())
            .collect(),
        DataType::F32 => c
            .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]) as f64)
            .collect(),
        DataType::F64 => c.map(|x| f64::from_le_bytes(arr8(x))).collect(),
        DataType::F8E4M3 => c.map(|x| F8E4M3::from_bits(x[0]).to_f64()).collect(),
        DataType::F8E5M2 => c.map(|x| F8E5M2::from_bits(x[0]).to_f64()).collect(),
    }
}

fn arr8(x: &[u8]) -> [u8; 8] {
    let mut a = [0u8; 8];
    a.copy_from_slice(x);
    a
}

/// Encodes f64 values; integers wrap modulo 2^bits like the kernels' wrapping arithmetic.
pub fn encode(dt: DataType, v: &[f64]) -> Vec<u8> {
    let mut out = vec![0u8; v.len() * dt.size()];
    for (x, slot) in v.iter().zip(out.chunks_exact_mut(dt.size())) {
        encode_one(dt, *x, slot);
    }
    out
}

/// `x` as one element of `dt` in `slot` (exactly `dt.size()` bytes).
pub(crate) fn encode_one(dt: DataType, x: f64, slot: &mut [u8]) {
    let i = x as i128;
    match dt {
        DataType::I8 | DataType::U8 => slot[0] = i as u8,
        DataType::I32 | DataType::U32 => slot.copy_from_slice(&(i as u32).to_le_bytes()),
        DataType::I64 | DataType::U64 => slot.copy_from_slice(&(i as u64).to_le_bytes()),
        DataType::F16 => slot.copy_from_slice(&f16::from_f64(x).to_le_bytes()),
        DataType::Bf16 => slot.copy_from_slice(&bf16::from_f64(x).to_le_bytes()),
        DataType::F32 => slot.copy_from_slice(&(x as f32).to_le_bytes()),
        DataType::F64 => slot.copy_from_slice(&x.to_le_bytes()),
        DataType::F8E4M3 => slot[0] = F8E4M3::from_f64(x).to_bits(),
        DataType::F8E5M2 => slot[0] = F8E5M2::from_f64(x).to_bits(),
    }
}

/// A small integer for element `i` of `rank`, chosen so that sums and products over up to 64
/// ranks stay exact in every dtype (products hold at most a few factors of 2).
///
/// fp8 holds every integer only up to 16 (e4m3) or 8 (e5m2), so its reductions get +-1 (and
/// a factor 2 from ranks below 8 for prod), and above 8 ranks each element draws nonzero values
/// from at most 8 ranks (those with `rank % g == i % g`, `g = ceil(nranks / 8)`): every partial
/// sum, in any order, stays within 8.
pub fn fill_value(a: &CollArgs, rank: usize, i: usize, seed: u64) -> f64 {
    Pattern::new(a, seed).at(rank, i)
}

/// [`fill_value`]'s choices for one call, made once (a check asks for every rank's value of
/// every element: billions at 1 GB).
#[derive(Clone, Copy)]
pub(crate) struct Pattern {
    pub(crate) seed: u64,
    pub(crate) prod: bool,
    pub(crate) signed: bool,
    /// fp8 reductions: every value 1 (2 for some products below rank 8).
    pub(crate) ones: bool,
    pub(crate) fp8: bool,
    /// fp8 reductions above 8 ranks: only ranks with `rank % g == i % g` give a value.
    pub(crate) sparse: Option<usize>,
}

impl Pattern {
    pub(crate) fn new(a: &CollArgs, seed: u64) -> Pattern {
        let fp8 = matches!(a.dtype, DataType::F8E4M3 | DataType::F8E5M2);
        let reduces = matches!(
            a.coll,
            CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
        );
        Pattern {
            seed,
            prod: a.op == ReduceOp::Prod,
            signed: !matches!(a.dtype, DataType::U8 | DataType::U32 | DataType::U64),
            ones: fp8 && reduces,
            fp8,
            sparse: (fp8 && reduces && a.nranks > 8).then(|| a.nranks.div_ceil(8)),
        }
    }

    #[inline]
    fn at(&self, rank: usize, i: usize) -> f64 {
        if self.sparse.is_some_and(|g| rank % g != i % g) {
            return 0.0;
        }
        let h = (rank as u64)
            .wrapping_mul(0x9e37_79b9)
            .wrapping_add((i as u64).wrapping_mul(2_654_435_761))
            .wrapping_add(self.seed);
        let h = (h ^ (h >> 13)).wrapping_mul(0x5bd1_e995);
        let h = h ^ (h >> 15);
        let mag = if self.prod {
            if h.is_multiple_of(16) && (!self.fp8 || rank < 8) {
                2.0
            } else {
                1.0
            }
        } else if self.ones {
            1.0
        } else {
            (h % 4) as f64 + 1.0 // 1..=4
        };
        if self.signed && (h >> 8).is_multiple_of(2) {
            -mag
        } else {
            mag
        }
    }
}

/// Every rank's input buffer for a call (the send buffer's contents).
pub fn fill_input(a: &CollArgs, rank: usize, seed: u64) -> Vec<u8> {
    let dt = a.dtype;
    let mut out = vec![0u8; a.send_elems() * dt.size()];
    let pat = Pattern::new(a, seed);
    fill_in_parallel(&mut out, dt.size(), &|i, slot| {
        encode_one(dt, pat.at(rank, i), slot)
    });
    out
}

/// Elements `elems` of what [`fill_input`] makes for `rank` (the bytes a check needs beside a
/// receive buffer whose input the GPU wrote).
pub fn fill_part(a: &CollArgs, rank: usize, seed: u64, elems: std::ops::Range<usize>) -> Vec<u8> {
    let dt = a.dtype;
    let mut out = vec![0u8; elems.len() * dt.size()];
    let pat = Pattern::new(a, seed);
    fill_in_parallel(&mut out, dt.size(), &|i, slot| {
        encode_one(dt, pat.at(rank, elems.start + i), slot)
    });
    out
}

/// Reduces `xs` (one value per rank, in rank order) exactly, then rounds into `dt` the way the
/// kernels store it, including avg's single final division.
fn reduce_exact(
    dt: DataType,
    op: ReduceOp,
    nranks: usize,
    mut xs: impl Iterator<Item = f64>,
) -> f64 {
    let first = xs.next().unwrap_or(0.0);
    let acc = xs.fold(first, |acc, x| match op {
        ReduceOp::Sum | ReduceOp::Avg => acc + x,
        ReduceOp::Prod => acc * x,
        ReduceOp::Max => acc.max(x),
        ReduceOp::Min => acc.min(x),
    });
    if op == ReduceOp::Avg {
        avg_like_kernel(dt, acc, nranks)
    } else {
        wrap(dt, acc)
    }
}

/// Element-wise [`reduce_exact`] over every rank's decoded input.
fn reduce_all(dt: DataType, op: ReduceOp, vals: &[Vec<f64>]) -> Vec<f64> {
    let n = vals.first().map_or(0, |v| v.len());
    (0..n)
        .map(|i| reduce_exact(dt, op, vals.len(), vals.iter().map(|v| v[i])))
        .collect()
}

/// The final division exactly as the kernel performs it (same precision, same rounding).
fn avg_like_kernel(dt: DataType, sum: f64, n: usize) -> f64 {
    let wrapped = wrap(dt, sum);
    match dt {
        DataType::F16 | DataType::Bf16 | DataType::F32 | DataType::F8E4M3 | DataType::F8E5M2 => {
            (wrapped as f32 / n as f32) as f64
        }
        DataType::F64 => wrapped / n as f64,
        _ => (wrapped as i128 / n as i128) as f64,
    }
}

/// What rank `rank`'s receive buffer must hold after the call, given every rank's input and
/// the receive buffer's prior contents. For rooted reduce, non-roots' buffers are unchanged.
pub fn expected(a: &CollArgs, inputs: &[Vec<u8>], rank: usize, prior_recv: &[u8]) -> Vec<u8> {
    let dt = a.dtype;
    let es = dt.size();
    let p = a.nranks;
    let c = a.count;
    let vals: Vec<Vec<f64>> = inputs.iter().map(|b| decode(dt, b)).collect();
    match a.coll {
        CollKind::AllReduce => encode(dt, &reduce_all(dt, a.op, &vals)),
        CollKind::Reduce => {
            if rank == a.root {
                encode(dt, &reduce_all(dt, a.op, &vals))
            } else {
                prior_recv.to_vec()
            }
        }
        CollKind::ReduceScatter => {
            let full = reduce_all(dt, a.op, &vals);
            encode(dt, &full[rank * c..(rank + 1) * c])
        }
        CollKind::AllGather => inputs.iter().flat_map(|b| b[..c * es].to_vec()).collect(),
        CollKind::Broadcast => inputs[a.root][..c * es].to_vec(),
        CollKind::AllToAll => (0..p)
            .flat_map(|j| inputs[j][rank * c * es..(rank + 1) * c * es].to_vec())
            .collect(),
        CollKind::SendRecv => inputs[(rank + p - 1) % p][..c * es].to_vec(),
        CollKind::Barrier => Vec::new(),
    }
}

/// Rounds an exact value into `dt` the way the kernels store it (integers wrap).
pub fn wrap(dt: DataType, v: f64) -> f64 {
    // f64 to i128 is a library call: only integers pay it (the checks run it per element).
    let i = || v as i128;
    match dt {
        DataType::I8 => i() as i8 as f64,
        DataType::U8 => i() as u8 as f64,
        DataType::I32 => i() as i32 as f64,
        DataType::U32 => i() as u32 as f64,
        DataType::I64 => i() as i64 as f64,
        DataType::U64 => i() as u64 as f64,
        DataType::F16 => f16::from_f64(v).to_f64(),
        DataType::Bf16 => bf16::from_f64(v).to_f64(),
        DataType::F32 => v as f32 as f64,
        DataType::F64 => v,
        DataType::F8E4M3 => F8E4M3::from_f64(v).to_f64(),
        DataType::F8E5M2 => F8E5M2::from_f64(v).to_f64(),
    }
}

/// Decodes element `i` of a byte buffer without allocating.
fn decode_at(dt: DataType, b: &[u8], i: usize) -> f64 {
    let x = &b[i * dt.size()..(i + 1) * dt.size()];
    match dt {
        DataType::I8 => x[0] as i8 as f64,
        DataType::U8 => x[0] as f64,
        DataType::I32 => i32::from_le_bytes([x[0], x[1], x[2], x[3]]) as f64,
        DataType::U32 => u32::from_le_bytes([x[0], x[1], x[2], x[3]]) as f64,
        DataType::I64 => i64::from_le_bytes(arr8(x)) as f64,
        DataType::U64 => u64::from_le_bytes(arr8(x)) as f64,
        DataType::F16 => f16::from_le_bytes([x[0], x[1]]).to_f64(),
        DataType::Bf16 => bf16::from_le_bytes([x[0], x[1]]).to_f64(),
        DataType::F32 => f32::from_le_bytes([x[0], x[1], x[2], x[3]]) as f64,
        DataType::F64 => f64::from_le_bytes(arr8(x)),
        DataType::F8E4M3 => F8E4M3::from_bits(x[0]).to_f64(),
        DataType::F8E5M2 => F8E5M2::from_bits(x[0]).to_f64(),
    }
}

/// The expected value of element `i` of `rank`'s receive buffer when every rank's input was
/// filled by [`fill_value`] with `seed`, computed one element at a time so a checker needs no
/// copy of the other ranks' data. `None` where the buffer's content is unspecified (a rooted
/// reduce's non-root receive buffer).
pub fn expected_value(a: &CollArgs, rank: usize, i: usize, seed: u64) -> Option<f64> {
    expected_with(a, &Pattern::new(a, seed), rank, i)
}

fn expected_with(a: &CollArgs, pat: &Pattern, rank: usize, i: usize) -> Option<f64> {
    let (dt, op, p, c) = (a.dtype, a.op, a.nranks, a.count);
    let fill = |r: usize, j: usize| pat.at(r, j);
    let reduced = |j: usize| reduce_exact(dt, op, p, (0..p).map(|r| fill(r, j)));
    let v = match a.coll {
        CollKind::AllReduce => reduced(i),
        CollKind::Reduce if rank == a.root => reduced(i),
        CollKind::Reduce => return None,
        CollKind::ReduceScatter => reduced(rank * c + i),
        CollKind::AllGather => fill(i / c.max(1), i % c.max(1)),
        CollKind::Broadcast => fill(a.root, i),
        CollKind::AllToAll => fill(i / c.max(1), rank * c + i % c.max(1)),
        CollKind::SendRecv => fill((rank + p - 1) % p, i),
        CollKind::Barrier => return None,
    };
    Some(wrap(dt, v))
}

/// Counts elements of `out` (the receive buffer of `rank`) that differ from [`expected_value`].
pub fn count_wrong(a: &CollArgs, rank: usize, out: &[u8], seed: u64) -> u64 {
    let n = out.len() / a.dtype.size();
    let pat = Pattern::new(a, seed);
    count_in_parallel(n, &|i| {
        expected_with(a, &pat, rank, i).is_some_and(|e| e != decode_at(a.dtype, out, i))
    })
}

/// Elements a thread takes at least before work is spread over cores.
const PER_THREAD: usize = 1 << 20;

/// Threads for `n` elements: every core once there are millions, else one.
fn threads_for(n: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |p| p.get());
    cores.min(n / PER_THREAD).max(1)
}

/// Writes every element of `out` (elements of `es` bytes) with `put(index, its bytes)`, on
/// every core once there are millions: inputs are made element by element too, and one core
/// takes about 8 s for 1 GB (issue 30).
pub(crate) fn fill_in_parallel(out: &mut [u8], es: usize, put: &(dyn Fn(usize, &mut [u8]) + Sync)) {
    let n = out.len() / es.max(1);
    let threads = threads_for(n);
    let per = n.div_ceil(threads).max(1);
    let fill = |first: usize, part: &mut [u8]| {
        for (j, slot) in part.chunks_exact_mut(es.max(1)).enumerate() {
            put(first + j, slot);
        }
    };
    if threads == 1 {
        return fill(0, out);
    }
    // A panic in a part is the caller's panic, as it would be on one thread (scope rethrows).
    std::thread::scope(|s| {
        for (t, part) in out.chunks_mut(per * es).enumerate() {
            s.spawn(move || fill(t * per, part));
        }
    });
}

/// How many of elements 0..n are `bad`, on every core once there are millions: the reference
/// is computed element by element, and one core takes about a minute for 1 GB (issue 30).
pub(crate) fn count_in_parallel(n: usize, bad: &(dyn Fn(usize) -> bool + Sync)) -> u64 {
    let threads = threads_for(n);
    let count = |r: std::ops::Range<usize>| r.filter(|&i| bad(i)).count() as u64;
    if threads == 1 {
        return count(0..n);
    }
    let per = n.div_ceil(threads);
    std::thread::scope(|s| {
        let parts: Vec<_> = (0..threads)
            .map(|t| s.spawn(move || count(t * per..((t + 1) * per).min(n))))
            .collect();
        parts
            .into_iter()
            // A panic in a part is the caller's panic, as it would be on one thread.
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .sum()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_made_on_several_threads_equal_those_made_on_one() {
        use railcc_core::call::{CollArgs, CollKind};
        // 3 Mi elements: several threads wherever there are several cores (CI has 2).
        for dt in [DataType::F16, DataType::I32, DataType::F8E4M3] {
            let a = CollArgs {
                coll: CollKind::AllReduce,
                nranks: 3,
                count: (3 << 20) + 5,
                dtype: dt,
                op: ReduceOp::Sum,
                root: 0,
            };
            let one: Vec<f64> = (0..a.count).map(|i| fill_value(&a, 2, i, 9)).collect();
            assert_eq!(fill_input(&a, 2, 9), encode(dt, &one), "{dt:?}");
        }
        let mut out = vec![0u8; 10];
        fill_in_parallel(&mut out, 2, &|i, slot| slot.copy_from_slice(&[i as u8, 7]));
        assert_eq!(out, [0, 7, 1, 7, 2, 7, 3, 7, 4, 7]);
    }

    #[test]
    fn counting_on_several_threads_finds_every_wrong_element() {
        let n = 3 << 20;
        let wrong = [0usize, 1 << 20, (1 << 20) + 1, n / 2, n - 1];
        let bad = |i: usize| wrong.contains(&i) || i % 999_983 == 7;
        let one_thread = (0..n).filter(|&i| bad(i)).count() as u64;
        assert_eq!(count_in_parallel(n, &bad), one_thread);
        assert!(one_thread >= wrong.len() as u64);
        assert_eq!(count_in_parallel(0, &bad), 0);
        assert_eq!(count_in_parallel(8, &bad), 2, "elements 0 and 7");
    }

    #[test]
    fn streaming_matches_whole_buffer_reference() {
        for coll in [
            CollKind::AllReduce,
            CollKind::ReduceScatter,
            CollKind::AllGather,
            CollKind::AllToAll,
            CollKind::Broadcast,
            CollKind::SendRecv,
        ] {
            for dt in DataType::ALL {
                for op in ReduceOp::ALL {
                    let a = CollArgs {
                        coll,
                        nranks: 4,
                        count: 9,
                        dtype: dt,
                        op,
                        root: 2,
                    };
                    let inputs: Vec<Vec<u8>> = (0..4).map(|r| fill_input(&a, r, 5)).collect();
                    for r in 0..4 {
                        let prior = vec![0u8; a.recv_elems() * dt.size()];
                        let want = expected(&a, &inputs, r, &prior);
                        assert_eq!(count_wrong(&a, r, &want, 5), 0, "{coll:?} {dt} {op}");
                        let mut bad = want.clone();
                        bad[0] ^= 0x40;
                        assert_eq!(count_wrong(&a, r, &bad, 5), 1, "{coll:?} {dt} {op}");
                    }
                }
            }
        }
    }
}
