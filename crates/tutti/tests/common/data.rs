//! Test data: element values that are a formula of (case, rank, index), and
//! the expected result of each reduction with a tolerance derived from the
//! element type's rounding, the number of ranks and the operands' magnitudes.
//!
//! Values. 32- and 64-bit integers are a bijective hash of (case salt, rank,
//! index), so they are unique per (rank, index) for every count the tests use
//! (up to 2^24 elements per buffer) and span the whole range: sums and
//! products wrap, as they must. 8-bit integers are the same hash truncated.
//! Floats are pseudo-random with full mantissas, magnitudes in [1/8, 8) and
//! random signs, so that sums round and the tolerance matters; for products
//! they are drawn from {±1/2, ±1, ±2} so that a product of up to 8 ranks is an
//! exact power of two (no overflow even in f16).
//!
//! Tolerance of a float sum of k = n operands computed in any order, each
//! step rounding to the element type (unit roundoff u): the classic bound
//! |computed - exact| <= gamma(k-1) * sum|x|, gamma(m) = m*u / (1 - m*u).
//! f16 and bf16 are reduced through f32 and rounded back at each step, so
//! their u is u_half + u_f32. Avg divides once more (gamma(k) / n). The
//! reference sum is computed in f64 with Neumaier's compensation; its own
//! error is covered by a further 2 * 2^-53 * sum|x|.

use half::{bf16, f16};
use std::fmt::Debug;
use tutti::{Element, ReduceOp};

/// splitmix64's finaliser: a bijection on u64.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A bijection on u32 (lowbias32).
pub fn mix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^= x >> 16;
    x
}

/// How a case's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// Full-range integers, random floats in ±[1/8, 8).
    Plain,
    /// Full-range integers, floats in {±1/2, ±1, ±2}.
    Prod,
}

impl Flavor {
    pub fn for_op(op: ReduceOp) -> Flavor {
        if op == ReduceOp::Prod {
            Flavor::Prod
        } else {
            Flavor::Plain
        }
    }
}

/// What the tests need of an element type.
pub trait TElem: Element + PartialEq + Debug {
    /// Unit roundoff of one reduction step; 0 for integers.
    const U: f64;
    /// Width in bits.
    const BITS: u32;
    fn is_float() -> bool {
        Self::U > 0.0
    }
    /// A value from 64 random bits.
    fn from_bits(h: u64, fl: Flavor) -> Self;
    /// Floats: the value as f64. Integers: unused.
    fn to_f64(self) -> f64;
    /// Integers: the value, sign- or zero-extended. Floats: unused.
    fn to_i128(self) -> i128;
    /// Integers: the low bits of `x`. Floats: unused.
    fn from_i128_wrap(x: i128) -> Self;
    /// A filler that marks "not written" (and that no formula produces often).
    fn sentinel() -> Self;
}

fn float_bits(h: u64, fl: Flavor) -> f64 {
    let sign = if h >> 63 == 1 { -1.0 } else { 1.0 };
    match fl {
        Flavor::Prod => sign * [0.5, 1.0, 2.0][((h >> 32) % 3) as usize],
        Flavor::Plain => {
            let frac = (h & ((1u64 << 52) - 1)) as f64 / (1u64 << 52) as f64;
            let scale = [0.125, 0.25, 0.5, 1.0, 2.0, 4.0][((h >> 52) % 6) as usize];
            sign * (1.0 + frac) * scale
        }
    }
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl TElem for $t {
            const U: f64 = 0.0;
            const BITS: u32 = <$t>::BITS;
            fn from_bits(h: u64, _: Flavor) -> Self { h as $t }
            fn to_f64(self) -> f64 { self as f64 }
            fn to_i128(self) -> i128 { self as i128 }
            fn from_i128_wrap(x: i128) -> Self { x as $t }
            fn sentinel() -> Self { 0x5a as $t }
        }
    )*};
}
int_elem!(i8, u8, i32, i64, u32, u64);

impl TElem for f32 {
    const U: f64 = f32::EPSILON as f64 / 2.0;
    const BITS: u32 = 32;
    fn from_bits(h: u64, fl: Flavor) -> Self {
        float_bits(h, fl) as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn to_i128(self) -> i128 {
        unreachable!()
    }
    fn from_i128_wrap(_: i128) -> Self {
        unreachable!()
    }
    fn sentinel() -> Self {
        -12345.5
    }
}

impl TElem for f64 {
    const U: f64 = f64::EPSILON / 2.0;
    const BITS: u32 = 64;
    fn from_bits(h: u64, fl: Flavor) -> Self {
        float_bits(h, fl)
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn to_i128(self) -> i128 {
        unreachable!()
    }
    fn from_i128_wrap(_: i128) -> Self {
        unreachable!()
    }
    fn sentinel() -> Self {
        -12345.5
    }
}

impl TElem for f16 {
    const U: f64 = f16::EPSILON.to_f64_const() / 2.0 + f32::EPSILON as f64 / 2.0;
    const BITS: u32 = 16;
    fn from_bits(h: u64, fl: Flavor) -> Self {
        f16::from_f64(float_bits(h, fl))
    }
    fn to_f64(self) -> f64 {
        self.into()
    }
    fn to_i128(self) -> i128 {
        unreachable!()
    }
    fn from_i128_wrap(_: i128) -> Self {
        unreachable!()
    }
    fn sentinel() -> Self {
        f16::from_f32(-1234.0)
    }
}

impl TElem for bf16 {
    const U: f64 = bf16::EPSILON.to_f64_const() / 2.0 + f32::EPSILON as f64 / 2.0;
    const BITS: u32 = 16;
    fn from_bits(h: u64, fl: Flavor) -> Self {
        bf16::from_f64(float_bits(h, fl))
    }
    fn to_f64(self) -> f64 {
        self.into()
    }
    fn to_i128(self) -> i128 {
        unreachable!()
    }
    fn from_i128_wrap(_: i128) -> Self {
        unreachable!()
    }
    fn sentinel() -> Self {
        bf16::from_f32(-1234.0)
    }
}

/// The value of element `i` of rank `r`'s input in the case with `salt`.
pub fn val<T: TElem>(fl: Flavor, salt: u64, r: usize, i: usize) -> T {
    let h = if T::BITS <= 32 && !T::is_float() {
        // A bijection of (rank, index) for fixed salt: unique 32-bit values.
        debug_assert!(i < 1 << 24 && r < 256);
        let k = ((r as u32) << 24) | i as u32;
        mix32(k ^ mix32(salt as u32)) as u64
    } else {
        mix64(((r as u64) << 40 | i as u64) ^ mix64(salt))
    };
    T::from_bits(h, fl)
}

/// The expected value of one output element.
#[derive(Clone, Copy, Debug)]
pub enum Want<T> {
    /// Bit-for-bit (floats: `==`).
    Exact(T),
    /// Within `tol` of `x`.
    Near { x: f64, tol: f64 },
}

fn gamma(m: usize, u: f64) -> f64 {
    let mu = m as f64 * u;
    mu / (1.0 - mu)
}

/// The expected reduction of `xs` (one operand per rank, at most 64) under `op`.
pub fn reduce_want<T: TElem>(op: ReduceOp, xs: impl Iterator<Item = T>) -> Want<T> {
    let mut buf = [T::sentinel(); 64];
    let mut n = 0;
    for x in xs {
        buf[n] = x;
        n += 1;
    }
    let xs = &buf[..n];
    if !T::is_float() {
        let sum = || xs.iter().fold(0i128, |a, x| a.wrapping_add(x.to_i128()));
        let v = match op {
            ReduceOp::Sum => T::from_i128_wrap(sum()),
            ReduceOp::Prod => {
                T::from_i128_wrap(xs.iter().fold(1i128, |a, x| a.wrapping_mul(x.to_i128())))
            }
            ReduceOp::Max => *xs.iter().max_by_key(|x| x.to_i128()).expect("n >= 1"),
            ReduceOp::Min => *xs.iter().min_by_key(|x| x.to_i128()).expect("n >= 1"),
            // The wrapped sum, divided by n with truncation toward zero.
            ReduceOp::Avg => T::from_i128_wrap(T::from_i128_wrap(sum()).to_i128() / n as i128),
        };
        return Want::Exact(v);
    }
    let mut f = [0f64; 64];
    for (d, x) in f.iter_mut().zip(xs) {
        *d = x.to_f64();
    }
    let f = &f[..n];
    let abs_sum: f64 = f.iter().map(|x| x.abs()).sum();
    let ref_err = 2.0 * f64::EPSILON / 2.0 * abs_sum;
    let neumaier = || {
        let (mut s, mut c) = (0.0f64, 0.0f64);
        for &x in f {
            let t = s + x;
            c += if s.abs() >= x.abs() {
                (s - t) + x
            } else {
                (x - t) + s
            };
            s = t;
        }
        s + c
    };
    let pick = |better: fn(f64, f64) -> bool| {
        let mut k = 0;
        for i in 1..n {
            if better(f[i], f[k]) {
                k = i;
            }
        }
        Want::Exact(xs[k])
    };
    match op {
        ReduceOp::Sum => Want::Near {
            x: neumaier(),
            tol: gamma(n - 1, T::U) * abs_sum + ref_err,
        },
        ReduceOp::Avg => Want::Near {
            x: neumaier() / n as f64,
            tol: (gamma(n, T::U) * abs_sum + ref_err) / n as f64,
        },
        ReduceOp::Prod => {
            let p: f64 = f.iter().product();
            Want::Near {
                x: p,
                tol: gamma(n - 1, T::U) * p.abs(),
            }
        }
        ReduceOp::Max => pick(|a, b| a > b),
        ReduceOp::Min => pick(|a, b| a < b),
    }
}

/// True if `got` satisfies `want`.
pub fn matches<T: TElem>(got: T, want: &Want<T>) -> bool {
    match want {
        Want::Exact(w) => {
            if T::is_float() {
                got.to_f64() == w.to_f64()
            } else {
                got == *w
            }
        }
        Want::Near { x, tol } => {
            let g = got.to_f64();
            g.is_finite() && (g - x).abs() <= *tol
        }
    }
}

/// Checks `got[i]` against `want(i)` for every i; describes the first few
/// mismatches.
pub fn check<T: TElem>(got: &[T], want: impl Fn(usize) -> Want<T>) -> Result<(), String> {
    let mut bad = 0usize;
    let mut first = Vec::new();
    for (i, g) in got.iter().enumerate() {
        let w = want(i);
        if !matches(*g, &w) {
            bad += 1;
            if first.len() < 3 {
                first.push(format!("[{i}] = {g:?}, want {w:?}"));
            }
        }
    }
    if bad == 0 {
        Ok(())
    } else {
        Err(format!(
            "{bad} of {} elements wrong: {}",
            got.len(),
            first.join("; ")
        ))
    }
}
