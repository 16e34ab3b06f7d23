//! The wire kernels against `half`'s scalar conversions, at odd lengths
//! and unaligned.

use super::*;
use half::bf16;

fn values(n: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..n)
        .map(|i| ((i as f32) * 0.7311).sin() * 10f32.powi((i % 13) as i32 - 6))
        .collect();
    if n > 8 {
        v[1] = f32::MAX;
        v[2] = -f32::MAX;
        v[3] = f32::INFINITY;
        v[4] = f32::NAN;
        v[5] = 0.0;
        v[6] = -0.0;
        v[7] = f32::MIN_POSITIVE;
    }
    v
}

fn narrowed(wire: DataType, shift: u32, src: &[f32]) -> Vec<u16> {
    // Unaligned on both sides.
    let mut s = vec![0u8; src.len() * 4 + 1];
    s[1..].copy_from_slice(bytemuck::cast_slice(src));
    let mut d = vec![0u8; src.len() * 2 + 1];
    // SAFETY: both buffers hold n elements past offset 1.
    unsafe {
        narrow(
            wire,
            shift,
            d.as_mut_ptr().add(1),
            s.as_ptr().add(1),
            src.len(),
        )
    };
    d[1..]
        .chunks_exact(2)
        .map(|c| u16::from_ne_bytes([c[0], c[1]]))
        .collect()
}

fn widened(wire: DataType, shift: u32, w: &[u16], add: Option<&[f32]>) -> Vec<f32> {
    let mut out = vec![0f32; w.len()];
    let p = out.as_mut_ptr() as *mut u8;
    // SAFETY: all buffers hold w.len() elements.
    unsafe {
        match add {
            Some(a) => widen_add(
                wire,
                shift,
                p,
                a.as_ptr() as *const u8,
                w.as_ptr() as *const u8,
                w.len(),
            ),
            None => widen(wire, shift, p, w.as_ptr() as *const u8, w.len()),
        }
    }
    out
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
fn bf16_matches_half_and_saturates() {
    for n in [0, 1, 7, 511, 512, 513, 2000] {
        let v = values(n);
        let w = narrowed(DataType::Bf16, 0, &v);
        for (i, (&x, &h)) in v.iter().zip(&w).enumerate() {
            let want = bf16::from_f32(x);
            if x.is_finite() && want.is_infinite() {
                assert_eq!(h, (want.to_bits() & 0x8000) | 0x7f7f, "saturates at {i}");
            } else if x.is_nan() {
                assert!(bf16::from_bits(h).is_nan());
            } else {
                assert_eq!(h, want.to_bits(), "element {i}: {x}");
            }
        }
        let back = widened(DataType::Bf16, 0, &w, None);
        for (x, h) in back.iter().zip(&w) {
            assert!(same(*x, bf16::from_bits(*h).to_f32()));
        }
    }
}

#[test]
fn f16_scales_by_a_power_of_two() {
    for shift in [0, 1, 3] {
        let v: Vec<f32> = (0..1031).map(|i| (i as f32 - 500.0) * 131.0).collect();
        let w = narrowed(DataType::F16, shift, &v);
        let back = widened(DataType::F16, shift, &w, None);
        let s = (1u32 << shift) as f32;
        for i in 0..v.len() {
            let want = f16::from_f32(v[i] / s);
            assert_eq!(w[i], want.to_bits(), "shift {shift} element {i}");
            assert!(same(back[i], want.to_f32() * s));
        }
    }
    // 8 ranks of f16's largest: the sum's eighth fits, scaled by 2^-3.
    let big = vec![65504.0f32 * 8.0; 3];
    let back = widened(DataType::F16, 3, &narrowed(DataType::F16, 3, &big), None);
    assert_eq!(back, big);
}

#[test]
fn widen_add_and_round() {
    for wire in [DataType::Bf16, DataType::F16] {
        let v = values(1500);
        let a: Vec<f32> = (0..1500).map(|i| i as f32 * 0.25).collect();
        let w = narrowed(wire, 2, &v);
        let plain = widened(wire, 2, &w, None);
        let sum = widened(wire, 2, &w, Some(&a));
        for i in 0..v.len() {
            assert!(same(sum[i], a[i] + plain[i]), "{wire} element {i}");
        }
        // Round: in place and apart, idempotent.
        let mut r = v.clone();
        let mut apart = vec![0f32; v.len()];
        // SAFETY: both hold v.len() f32.
        unsafe {
            round(
                wire,
                2,
                apart.as_mut_ptr() as *mut u8,
                v.as_ptr() as *const u8,
                v.len(),
            );
            let p = r.as_mut_ptr() as *mut u8;
            round(wire, 2, p, p, v.len());
        }
        for i in 0..v.len() {
            assert!(
                same(r[i], plain[i]) && same(apart[i], plain[i]),
                "{wire} element {i}"
            );
        }
        assert_eq!(narrowed(wire, 2, &r), w);
    }
}
