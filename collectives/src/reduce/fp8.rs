//! fp8 conversions by table, exactly as `float8`'s own: those go through f64 and f16 with
//! branches and reduced at 0.16-0.2 GB/s on the developer machine, 1/100 of f32.
//!
//! Widening: one f32 per byte value. Narrowing (round to nearest even, saturating as CUDA's
//! conversion; NaN to NaN) decides from the bits down to the rounding bit and whether any
//! bit below it is set. Both fp8 formats round at bit 19 or higher of an f32 (3 and 2
//! mantissa bits; subnormals higher still), so the top 16 bits and "is any of the low 16
//! set" decide it: two tables of 65536 results, read once per element. They are filled at
//! first use from `float8`'s conversion of `top << 16` and `top << 16 | 1`; the tests
//! compare the tables with it over a stride of every f32 bit pattern.

use float8::{F8E4M3, F8E5M2};
use std::sync::OnceLock;

/// One fp8 format's conversion tables.
pub struct Lut {
    widen: [f32; 256],
    /// `[low 16 bits zero][top 16 bits]`, then `[some low bit set][top 16 bits]`.
    narrow: Box<[u8; 1 << 17]>,
}

impl Lut {
    fn build(to_f32: impl Fn(u8) -> f32, from_f32: impl Fn(f32) -> u8) -> Lut {
        let mut widen = [0f32; 256];
        for (b, w) in widen.iter_mut().enumerate() {
            *w = to_f32(b as u8);
        }
        let mut narrow = Box::new([0u8; 1 << 17]);
        for (i, n) in narrow.iter_mut().enumerate() {
            let top = (i as u32 & 0xffff) << 16;
            let low = (i >> 16) as u32;
            *n = from_f32(f32::from_bits(top | low));
        }
        Lut { widen, narrow }
    }

    #[inline(always)]
    pub fn widen(&self, b: u8) -> f32 {
        self.widen[b as usize]
    }

    #[inline(always)]
    pub fn narrow(&self, f: f32) -> u8 {
        let x = f.to_bits();
        let i = (x >> 16) as usize | (usize::from(x & 0xffff != 0) << 16);
        self.narrow[i & 0x1ffff]
    }
}

/// The tables in `cell`, built from `float8`'s conversions at first use.
fn built(
    cell: &'static OnceLock<Lut>,
    to_f32: fn(u8) -> f32,
    from_f32: fn(f32) -> u8,
) -> &'static Lut {
    cell.get_or_init(|| Lut::build(to_f32, from_f32))
}

pub fn e4m3() -> &'static Lut {
    static LUT: OnceLock<Lut> = OnceLock::new();
    built(
        &LUT,
        |b| F8E4M3::from_bits(b).to_f32(),
        |f| F8E4M3::from_f32(f).to_bits(),
    )
}

pub fn e5m2() -> &'static Lut {
    static LUT: OnceLock<Lut> = OnceLock::new();
    built(
        &LUT,
        |b| F8E5M2::from_bits(b).to_f32(),
        |f| F8E5M2::from_f32(f).to_bits(),
    )
}

#[cfg(test)]
mod tests {
    use super::{e4m3, e5m2};
    use float8::{F8E4M3, F8E5M2};

    #[test]
    fn tables_convert_as_float8_does() {
        // Every byte both ways' first half; then f32 patterns: a stride through all of them,
        // and around every rounding decision (each top half with low halves 0, 1, 0x8000,
        // 0xffff).
        let mut xs: Vec<u32> = (0..=u32::MAX).step_by(65_537).collect();
        for top in 0..=0xffffu32 {
            xs.extend([0, 1, 0x8000, 0xffff].map(|low| top << 16 | low));
        }
        for b in 0..=255u8 {
            assert_eq!(
                e4m3().widen(b).to_bits(),
                F8E4M3::from_bits(b).to_f32().to_bits(),
                "e4m3 {b:#04x}"
            );
            assert_eq!(
                e5m2().widen(b).to_bits(),
                F8E5M2::from_bits(b).to_f32().to_bits(),
                "e5m2 {b:#04x}"
            );
        }
        for x in xs {
            let f = f32::from_bits(x);
            assert_eq!(
                e4m3().narrow(f),
                F8E4M3::from_f32(f).to_bits(),
                "e4m3 {x:#010x}"
            );
            assert_eq!(
                e5m2().narrow(f),
                F8E5M2::from_f32(f).to_bits(),
                "e5m2 {x:#010x}"
            );
        }
    }
}
