//! The 16-bit wire's kernels: f32 narrowed to bf16 or f16 to be sent,
//! widened back on arrival, widened and added in f32, and rounded (narrowed
//! and widened in one pass).
//!
//! * **bf16** rounds to nearest, ties to even; a finite value beyond bf16's
//!   largest (the top 0.4% of f32's range) saturates to it instead of
//!   becoming infinite, so bf16 never overflows where f32 does not.
//!   NaN stays NaN.
//! * **f16** carries `x * 2^-shift` (`shift` from the rank count, so that
//!   a sum of that many values within f16's range fits) and widens to
//!   `h * 2^shift`; round to nearest even by IEEE (F16C where the CPU
//!   has it); beyond f16's range a value becomes infinite.
//!
//! Like the reduction kernels, each is compiled for the baseline and with
//! AVX2 + F16C, chosen at run time; operands may be unaligned.

use super::DataType;
use half::f16;
use half::slice::HalfFloatSliceExt;
use std::ptr;
use std::sync::OnceLock;

/// Elements per stack block.
const BLOCK: usize = 512;

/// bf16 bits of `x`, rounded to nearest even, finite values saturating.
#[inline(always)]
fn to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    let abs = b & 0x7fff_ffff;
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    let sign = ((b >> 16) & 0x8000) as u16;
    let finite = abs < 0x7f80_0000;
    let nan = abs > 0x7f80_0000;
    let sat = finite && (rounded & 0x7fff) == 0x7f80;
    if nan {
        ((b >> 16) as u16) | 0x0040
    } else if sat {
        sign | 0x7f7f
    } else {
        rounded
    }
}

#[inline(always)]
fn from_bf16(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// The f32 scale `2^e` (exact for |e| < 127).
#[inline(always)]
fn pow2(e: i32) -> f32 {
    f32::from_bits(((127 + e) as u32) << 23)
}

/// Reads `k` f32s at `src` (unaligned) into `out`.
///
/// # Safety
/// `src` valid for `k * 4` bytes; `k <= out.len()`.
#[inline(always)]
unsafe fn load_f32(src: *const u8, out: &mut [f32], k: usize) {
    // SAFETY: per the contract; `out` does not overlap `src`.
    unsafe { ptr::copy_nonoverlapping(src, out.as_mut_ptr() as *mut u8, k * 4) }
}

/// Narrows `n` f32 at `src` into `n` wire elements at `dst`.
///
/// # Safety
/// `src` valid for `4n` bytes, `dst` for `2n`, not overlapping.
#[inline(always)]
unsafe fn narrow_body(bf: bool, shift: u32, dst: *mut u8, src: *const u8, n: usize) {
    let mut f = [0f32; BLOCK];
    let mut h = [0u16; BLOCK];
    let s = pow2(-(shift as i32));
    let mut done = 0;
    while done < n {
        let k = (n - done).min(BLOCK);
        // SAFETY: done + k <= n elements of src.
        unsafe { load_f32(src.add(done * 4), &mut f, k) };
        if bf {
            for i in 0..k {
                h[i] = to_bf16(f[i]);
            }
        } else {
            for x in &mut f[..k] {
                *x *= s;
            }
            let hs: &mut [f16] = bytemuck::cast_slice_mut(&mut h[..k]);
            hs.convert_from_f32_slice(&f[..k]);
        }
        // SAFETY: done + k <= n elements of dst.
        unsafe { ptr::copy_nonoverlapping(h.as_ptr() as *const u8, dst.add(done * 2), k * 2) };
        done += k;
    }
}

/// `dst = a + widen(w)` for `n` elements (`a` null: `dst = widen(w)`).
///
/// # Safety
/// `dst` (and `a`) valid for `4n` bytes, `w` for `2n`; `dst` may equal `a`
/// but overlaps `w` not at all.
#[inline(always)]
unsafe fn widen_body(bf: bool, shift: u32, dst: *mut u8, a: *const u8, w: *const u8, n: usize) {
    let mut f = [0f32; BLOCK];
    let mut acc = [0f32; BLOCK];
    let mut h = [0u16; BLOCK];
    let s = pow2(shift as i32);
    let mut done = 0;
    while done < n {
        let k = (n - done).min(BLOCK);
        // SAFETY: done + k <= n elements of w.
        unsafe { ptr::copy_nonoverlapping(w.add(done * 2), h.as_mut_ptr() as *mut u8, k * 2) };
        if bf {
            for i in 0..k {
                f[i] = from_bf16(h[i]);
            }
        } else {
            let hs: &[f16] = bytemuck::cast_slice(&h[..k]);
            hs.convert_to_f32_slice(&mut f[..k]);
            for x in &mut f[..k] {
                *x *= s;
            }
        }
        if !a.is_null() {
            // SAFETY: done + k <= n elements of a.
            unsafe { load_f32(a.add(done * 4), &mut acc, k) };
            for i in 0..k {
                f[i] += acc[i];
            }
        }
        // SAFETY: done + k <= n elements of dst.
        unsafe { ptr::copy_nonoverlapping(f.as_ptr() as *const u8, dst.add(done * 4), k * 4) };
        done += k;
    }
}

/// `dst = widen(narrow(src))` for `n` f32 (`dst` may equal `src`).
///
/// # Safety
/// `src` and `dst` valid for `4n` bytes; equal or apart.
#[inline(always)]
unsafe fn round_body(bf: bool, shift: u32, dst: *mut u8, src: *const u8, n: usize) {
    let mut h = [0u16; BLOCK];
    let mut done = 0;
    while done < n {
        let k = (n - done).min(BLOCK);
        let hp = h.as_mut_ptr() as *mut u8;
        // SAFETY: done + k <= n elements of each; the stack block holds k.
        unsafe {
            narrow_body(bf, shift, hp, src.add(done * 4), k);
            widen_body(bf, shift, dst.add(done * 4), ptr::null(), hp, k);
        }
        done += k;
    }
}

/// The four kernels for one wire type and one target-feature set.
#[derive(Clone, Copy)]
struct Kernels {
    narrow: unsafe fn(u32, *mut u8, *const u8, usize),
    widen: unsafe fn(u32, *mut u8, *const u8, *const u8, usize),
    round: unsafe fn(u32, *mut u8, *const u8, usize),
}

macro_rules! wire_kernels {
    ($modname:ident, $($attr:meta)?) => {
        mod $modname {
            use super::*;
            macro_rules! k {
                ($bf:expr, $narrow:ident, $widen:ident, $round:ident) => {
                    $(#[$attr])?
                    pub(super) unsafe fn $narrow(shift: u32, dst: *mut u8, src: *const u8, n: usize) {
                        // SAFETY: the dispatcher's caller keeps narrow_body's contract.
                        unsafe { narrow_body($bf, shift, dst, src, n) }
                    }
                    $(#[$attr])?
                    pub(super) unsafe fn $widen(shift: u32, dst: *mut u8, a: *const u8, w: *const u8, n: usize) {
                        // SAFETY: the dispatcher's caller keeps widen_body's contract.
                        unsafe { widen_body($bf, shift, dst, a, w, n) }
                    }
                    $(#[$attr])?
                    pub(super) unsafe fn $round(shift: u32, dst: *mut u8, src: *const u8, n: usize) {
                        // SAFETY: the dispatcher's caller keeps round_body's contract.
                        unsafe { round_body($bf, shift, dst, src, n) }
                    }
                };
            }
            k!(true, bf16_narrow, bf16_widen, bf16_round);
            k!(false, f16_narrow, f16_widen, f16_round);
            pub(super) const TABLE: [Kernels; 2] = [
                Kernels { narrow: bf16_narrow, widen: bf16_widen, round: bf16_round },
                Kernels { narrow: f16_narrow, widen: f16_widen, round: f16_round },
            ];
        }
    };
}

wire_kernels!(generic,);
#[cfg(target_arch = "x86_64")]
wire_kernels!(avx2, target_feature(enable = "avx2,fma,f16c"));

fn kernels(wire: DataType) -> Kernels {
    static T: OnceLock<&'static [Kernels; 2]> = OnceLock::new();
    let t = T.get_or_init(|| {
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
    });
    match wire {
        DataType::Bf16 => t[0],
        DataType::F16 => t[1],
        other => panic!("{other} is not a wire type (bf16, f16)"),
    }
}

/// Narrows `n` f32 at `src` to `n` elements of `wire` (bf16 or f16) at
/// `dst`, f16 values multiplied by `2^-shift` first (see the module docs).
///
/// # Safety
/// `src` valid for `4n` bytes, `dst` for `2n` bytes; they do not overlap.
pub unsafe fn narrow(wire: DataType, shift: u32, dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: forwarded; the kernel's features were checked when chosen.
    unsafe { (kernels(wire).narrow)(shift, dst, src, n) }
}

/// Widens `n` elements of `wire` at `w` to f32 at `dst` (f16 values
/// multiplied by `2^shift`).
///
/// # Safety
/// `w` valid for `2n` bytes, `dst` for `4n`; they do not overlap.
pub unsafe fn widen(wire: DataType, shift: u32, dst: *mut u8, w: *const u8, n: usize) {
    // SAFETY: forwarded; a null `a` means no addend.
    unsafe { (kernels(wire).widen)(shift, dst, ptr::null(), w, n) }
}

/// `dst = a + widen(w)` for `n` elements: f32 `a` and `dst`, `wire` `w`.
///
/// # Safety
/// `a` and `dst` valid for `4n` bytes (equal, or apart), `w` for `2n`, not
/// overlapping them.
pub unsafe fn widen_add(
    wire: DataType,
    shift: u32,
    dst: *mut u8,
    a: *const u8,
    w: *const u8,
    n: usize,
) {
    debug_assert!(!a.is_null());
    // SAFETY: forwarded.
    unsafe { (kernels(wire).widen)(shift, dst, a, w, n) }
}

/// `dst = widen(narrow(src))` for `n` f32: what a peer holds of a value
/// after it crossed the wire.
///
/// # Safety
/// `src` and `dst` valid for `4n` bytes, equal or apart.
pub unsafe fn round(wire: DataType, shift: u32, dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: forwarded.
    unsafe { (kernels(wire).round)(shift, dst, src, n) }
}

#[cfg(test)]
mod tests;
