//! The reduction kernels: `dst[i] = a[i] (op) b[i]` over raw, possibly
//! unaligned memory.
//!
//! One generic body per (type, op) is written once and instantiated twice on
//! x86-64: for the baseline target and inside a `#[target_feature(enable =
//! "avx2,fma,f16c")]` wrapper, so the compiler vectorises it with AVX2 there.
//! Half-precision types go through f32 in blocks, using `half`'s slice
//! conversions (which use F16C at run time when the CPU has it).

use super::{DataType, ReduceOp};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use std::ptr;
use std::sync::OnceLock;

/// `dst = a (op) b` over `nbytes` bytes of elements of type `T`.
/// A reduction kernel: `dst[i] = a[i] (op) b[i]` over `nbytes` bytes, with
/// [`reduce`]'s contract (and no check of the CPU's features: those of
/// the kernels [`kernel`] returns were checked when it chose them).
pub type Kernel = unsafe fn(dst: *mut u8, a: *const u8, b: *const u8, nbytes: usize);

/// Arithmetic on one element type, in the form the kernels need.
trait Arith: Copy {
    fn sum(self, o: Self) -> Self;
    fn prod(self, o: Self) -> Self;
    fn max(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
}

macro_rules! arith_int {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn sum(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline(always)] fn prod(self, o: Self) -> Self { self.wrapping_mul(o) }
            #[inline(always)] fn max(self, o: Self) -> Self { if o > self { o } else { self } }
            #[inline(always)] fn min(self, o: Self) -> Self { if o < self { o } else { self } }
        }
    )*};
}
arith_int!(i8, u8, i32, i64, u32, u64);

macro_rules! arith_float {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            #[inline(always)] fn sum(self, o: Self) -> Self { self + o }
            #[inline(always)] fn prod(self, o: Self) -> Self { self * o }
            #[inline(always)] fn max(self, o: Self) -> Self { if o > self { o } else { self } }
            #[inline(always)] fn min(self, o: Self) -> Self { if o < self { o } else { self } }
        }
    )*};
}
arith_float!(f32, f64);

/// The element-wise loop. `dst` may equal `a` or `b` (in place), but must not
/// otherwise overlap them.
///
/// # Safety
/// `dst`, `a` and `b` must be valid for `n * size_of::<T>()` bytes.
#[inline(always)]
unsafe fn body<T: Arith>(dst: *mut T, a: *const T, b: *const T, n: usize, f: impl Fn(T, T) -> T) {
    // The compiler vectorises these loops behind a run-time check that the
    // output overlaps no input. An accumulator (`dst == a` or `dst == b`)
    // fails that check and would run the scalar loop (5x slower in cache,
    // 2x out of it), so it gets the two-pointer loop, which passes it.
    if ptr::eq(dst, a) {
        // SAFETY: as this function's contract says.
        unsafe { accumulate(dst, b, n, &f) }
    } else if ptr::eq(dst, b) {
        // SAFETY: as this function's contract says.
        unsafe { accumulate(dst, a, n, |d, s| f(s, d)) }
    } else {
        for i in 0..n {
            // SAFETY: the caller guarantees all three are valid for n elements;
            // unaligned accesses are allowed for any input alignment.
            unsafe {
                let x = ptr::read_unaligned(a.add(i));
                let y = ptr::read_unaligned(b.add(i));
                ptr::write_unaligned(dst.add(i), f(x, y));
            }
        }
    }
}

/// `dst[i] = g(dst[i], src[i])`: [`body`] with the output as one input.
///
/// # Safety
/// As for [`body`]; `src` does not overlap `dst`.
#[inline(always)]
unsafe fn accumulate<T: Arith>(dst: *mut T, src: *const T, n: usize, g: impl Fn(T, T) -> T) {
    for i in 0..n {
        // SAFETY: the caller guarantees both are valid for n elements;
        // unaligned accesses are allowed for any input alignment.
        unsafe {
            let s = ptr::read_unaligned(src.add(i));
            let d = ptr::read_unaligned(dst.add(i));
            ptr::write_unaligned(dst.add(i), g(d, s));
        }
    }
}

/// A 16-bit float type reduced by converting blocks to f32.
trait Half: Copy + Default {
    fn to_f32s(src: &[Self], dst: &mut [f32]);
    fn from_f32s(src: &[f32], dst: &mut [Self]);
}

impl Half for f16 {
    fn to_f32s(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst)
    }
    fn from_f32s(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src)
    }
}

impl Half for bf16 {
    fn to_f32s(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst)
    }
    fn from_f32s(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src)
    }
}

/// Half-precision types reduced through f32, one stack block at a time.
///
/// # Safety
/// As for [`body`].
#[inline(always)]
unsafe fn body_half<H: Half>(
    dst: *mut H,
    a: *const H,
    b: *const H,
    n: usize,
    f: impl Fn(f32, f32) -> f32,
) {
    const BLOCK: usize = 512;
    let mut ha = [H::default(); BLOCK];
    let mut hb = [H::default(); BLOCK];
    let mut fa = [0f32; BLOCK];
    let mut fb = [0f32; BLOCK];
    let sz = std::mem::size_of::<H>();
    let mut done = 0;
    while done < n {
        let k = (n - done).min(BLOCK);
        // SAFETY: the caller guarantees a, b and dst are valid for n elements;
        // the stack blocks hold BLOCK >= k elements and do not overlap them.
        unsafe {
            ptr::copy_nonoverlapping(a.add(done) as *const u8, ha.as_mut_ptr() as *mut u8, k * sz);
            ptr::copy_nonoverlapping(b.add(done) as *const u8, hb.as_mut_ptr() as *mut u8, k * sz);
        }
        H::to_f32s(&ha[..k], &mut fa[..k]);
        H::to_f32s(&hb[..k], &mut fb[..k]);
        for i in 0..k {
            fa[i] = f(fa[i], fb[i]);
        }
        H::from_f32s(&fa[..k], &mut ha[..k]);
        // SAFETY: as above; dst is valid for n elements.
        unsafe {
            ptr::copy_nonoverlapping(ha.as_ptr() as *const u8, dst.add(done) as *mut u8, k * sz);
        }
        done += k;
    }
}

/// Instantiates one kernel per (type, op), for one target-feature set.
macro_rules! kernels {
    ($modname:ident, $($attr:meta)?) => {
        mod $modname {
            use super::*;
            macro_rules! k {
                ($name:ident, $t:ty, $f:expr) => {
                    $(#[$attr])?
                    pub(super) unsafe fn $name(dst: *mut u8, a: *const u8, b: *const u8, nbytes: usize) {
                        // SAFETY: the dispatcher's caller guarantees validity for nbytes.
                        unsafe { body::<$t>(dst as *mut $t, a as *const $t, b as *const $t, nbytes / std::mem::size_of::<$t>(), $f) }
                    }
                };
            }
            macro_rules! kh {
                ($name:ident, $t:ty, $f:expr) => {
                    $(#[$attr])?
                    pub(super) unsafe fn $name(dst: *mut u8, a: *const u8, b: *const u8, nbytes: usize) {
                        // SAFETY: the dispatcher's caller guarantees validity for nbytes.
                        unsafe { body_half::<$t>(dst as *mut $t, a as *const $t, b as *const $t, nbytes / 2, $f) }
                    }
                };
            }
            macro_rules! all_ops {
                ($t:ty, $sum:ident, $prod:ident, $max:ident, $min:ident) => {
                    k!($sum, $t, <$t as Arith>::sum);
                    k!($prod, $t, <$t as Arith>::prod);
                    k!($max, $t, <$t as Arith>::max);
                    k!($min, $t, <$t as Arith>::min);
                };
            }
            all_ops!(f32, f32_sum, f32_prod, f32_max, f32_min);
            all_ops!(f64, f64_sum, f64_prod, f64_max, f64_min);
            all_ops!(i8, i8_sum, i8_prod, i8_max, i8_min);
            all_ops!(u8, u8_sum, u8_prod, u8_max, u8_min);
            all_ops!(i32, i32_sum, i32_prod, i32_max, i32_min);
            all_ops!(i64, i64_sum, i64_prod, i64_max, i64_min);
            all_ops!(u32, u32_sum, u32_prod, u32_max, u32_min);
            all_ops!(u64, u64_sum, u64_prod, u64_max, u64_min);
            kh!(f16_sum, f16, |x, y| x + y);
            kh!(f16_prod, f16, |x, y| x * y);
            kh!(f16_max, f16, <f32 as Arith>::max);
            kh!(f16_min, f16, <f32 as Arith>::min);
            kh!(bf16_sum, bf16, |x, y| x + y);
            kh!(bf16_prod, bf16, |x, y| x * y);
            kh!(bf16_max, bf16, <f32 as Arith>::max);
            kh!(bf16_min, bf16, <f32 as Arith>::min);

            /// The kernel table, indexed by [`super::index`].
            pub(super) const TABLE: [super::Kernel; 40] = [
                f32_sum, f32_prod, f32_max, f32_min,
                f64_sum, f64_prod, f64_max, f64_min,
                f16_sum, f16_prod, f16_max, f16_min,
                bf16_sum, bf16_prod, bf16_max, bf16_min,
                i8_sum, i8_prod, i8_max, i8_min,
                u8_sum, u8_prod, u8_max, u8_min,
                i32_sum, i32_prod, i32_max, i32_min,
                i64_sum, i64_prod, i64_max, i64_min,
                u32_sum, u32_prod, u32_max, u32_min,
                u64_sum, u64_prod, u64_max, u64_min,
            ];
        }
    };
}

kernels!(generic,);
#[cfg(target_arch = "x86_64")]
kernels!(avx2, target_feature(enable = "avx2,fma,f16c"));

fn index(dtype: DataType, op: ReduceOp) -> usize {
    let t = match dtype {
        DataType::F32 => 0,
        DataType::F64 => 1,
        DataType::F16 => 2,
        DataType::Bf16 => 3,
        DataType::I8 => 4,
        DataType::U8 => 5,
        DataType::I32 => 6,
        DataType::I64 => 7,
        DataType::U32 => 8,
        DataType::U64 => 9,
    };
    let o = match op.step_op() {
        ReduceOp::Sum | ReduceOp::Avg => 0,
        ReduceOp::Prod => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
    };
    t * 4 + o
}

fn table() -> &'static [Kernel; 40] {
    static T: OnceLock<&'static [Kernel; 40]> = OnceLock::new();
    T.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c")
                && !crate::config::no_avx2_from_env()
            {
                return &avx2::TABLE;
            }
        }
        &generic::TABLE
    })
}

/// `dst[i] = a[i] (op) b[i]` for `nbytes / dtype.size()` elements.
///
/// `Avg` reduces as `Sum` (the division happens once, at the end, in
/// [`scale_avg`]).
///
/// # Safety
/// `dst`, `a` and `b` must each be valid for `nbytes` bytes; `dst` may be
/// equal to `a` or `b` but must not partially overlap either.
pub unsafe fn reduce(
    dtype: DataType,
    op: ReduceOp,
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    nbytes: usize,
) {
    let k = kernel(dtype, op);
    // SAFETY: forwarded from this function's contract; the table holds only
    // kernels whose target features the running CPU has (checked in `table`).
    unsafe { k(dst, a, b, nbytes) }
}

/// The kernel [`reduce`] runs for `dtype` and `op`, for a caller that
/// reduces several times with the same pair (looked up once).
pub fn kernel(dtype: DataType, op: ReduceOp) -> Kernel {
    table()[index(dtype, op)]
}

/// Divides every element of `buf` by `n`, finishing an `Avg` reduction.
pub fn scale_avg(dtype: DataType, buf: &mut [u8], n: usize) {
    fn go<T: bytemuck::Pod>(buf: &mut [u8], f: impl Fn(T) -> T) {
        for c in buf.chunks_exact_mut(std::mem::size_of::<T>()) {
            let v: T = bytemuck::pod_read_unaligned(c);
            c.copy_from_slice(bytemuck::bytes_of(&f(v)));
        }
    }
    match dtype {
        DataType::F32 => go::<f32>(buf, |x| x / n as f32),
        DataType::F64 => go::<f64>(buf, |x| x / n as f64),
        DataType::F16 => go::<f16>(buf, |x| f16::from_f32(x.to_f32() / n as f32)),
        DataType::Bf16 => go::<bf16>(buf, |x| bf16::from_f32(x.to_f32() / n as f32)),
        DataType::I8 => go::<i8>(buf, |x| (x as i64 / n as i64) as i8),
        DataType::U8 => go::<u8>(buf, |x| (x as u64 / n as u64) as u8),
        DataType::I32 => go::<i32>(buf, |x| (x as i64 / n as i64) as i32),
        DataType::I64 => go::<i64>(buf, |x| x / n as i64),
        DataType::U32 => go::<u32>(buf, |x| (x as u64 / n as u64) as u32),
        DataType::U64 => go::<u64>(buf, |x| x / n as u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T: bytemuck::Pod>(dt: DataType, op: ReduceOp, a: &[T], b: &[T]) -> Vec<T> {
        let mut d = a.to_vec();
        let bytes = std::mem::size_of_val(a);
        // SAFETY: all three are valid slices of the same length; d aliases nothing.
        unsafe {
            reduce(
                dt,
                op,
                d.as_mut_ptr() as *mut u8,
                a.as_ptr() as *const u8,
                b.as_ptr() as *const u8,
                bytes,
            )
        };
        d
    }

    #[test]
    fn f32_ops() {
        let a: Vec<f32> = (0..1003).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..1003).map(|i| 2.0 * i as f32 - 500.0).collect();
        let s = run(DataType::F32, ReduceOp::Sum, &a, &b);
        let m = run(DataType::F32, ReduceOp::Max, &a, &b);
        for i in 0..a.len() {
            assert_eq!(s[i], a[i] + b[i]);
            assert_eq!(m[i], f32::max(a[i], b[i]));
        }
    }

    #[test]
    fn in_place_either_side() {
        // dst == a and dst == b take their own loops: the same results as
        // with a separate output.
        let a: Vec<f64> = (0..1001).map(|i| i as f64 * 0.25 - 40.0).collect();
        let b: Vec<f64> = (0..1001).map(|i| 300.0 - i as f64).collect();
        let bytes = std::mem::size_of_val(&a[..]);
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Max, ReduceOp::Min] {
            let want = run(DataType::F64, op, &a, &b);
            let (mut x, mut y) = (a.clone(), b.clone());
            // SAFETY: x and b are valid for `bytes`; the output is x itself.
            unsafe {
                let p = x.as_mut_ptr() as *mut u8;
                reduce(DataType::F64, op, p, p, b.as_ptr() as *const u8, bytes)
            };
            // SAFETY: a and y are valid for `bytes`; the output is y itself.
            unsafe {
                let p = y.as_mut_ptr() as *mut u8;
                reduce(DataType::F64, op, p, a.as_ptr() as *const u8, p, bytes)
            };
            assert_eq!(x, want, "{op:?}, dst == a");
            assert_eq!(y, want, "{op:?}, dst == b");
        }
    }

    #[test]
    fn half_and_ints() {
        let a: Vec<f16> = (0..777).map(|i| f16::from_f32(i as f32 * 0.5)).collect();
        let b: Vec<f16> = (0..777).map(|i| f16::from_f32(1.0 + i as f32)).collect();
        let s = run(DataType::F16, ReduceOp::Sum, &a, &b);
        for i in 0..a.len() {
            assert_eq!(s[i], f16::from_f32(a[i].to_f32() + b[i].to_f32()));
        }
        let x: Vec<u8> = (0..=255).collect();
        let y: Vec<u8> = (0..=255).rev().collect();
        let p = run(DataType::U8, ReduceOp::Min, &x, &y);
        for i in 0..256 {
            assert_eq!(p[i], Ord::min(x[i], y[i]));
        }
    }

    #[test]
    fn unaligned() {
        let a = vec![0u8; 4 * 65 + 1];
        let mut d = vec![0u8; 4 * 65 + 1];
        let mut b = vec![0u8; 4 * 65 + 1];
        for i in 0..65 {
            b[1 + 4 * i..5 + 4 * i].copy_from_slice(&(i as f32).to_ne_bytes());
        }
        // SAFETY: all pointers are valid for 260 bytes past offset 1.
        unsafe {
            reduce(
                DataType::F32,
                ReduceOp::Sum,
                d.as_mut_ptr().add(1),
                a.as_ptr().add(1),
                b.as_ptr().add(1),
                260,
            )
        };
        assert_eq!(&d[1..], &b[1..]);
        scale_avg(DataType::I32, &mut d[1..], 1);
    }
}
