//! The data path's byte copy.
//!
//! Payload bytes that the transports and the executor copy (into and out of
//! the shared-memory rings and mailboxes, a rank's own block into its output)
//! go through [`copy`], not straight to the C library's `memcpy`.
//!
//! Why: glibc (2.36 here) copies 2,112 bytes to 1 MiB on AMD processors with
//! `rep movsb`, and on the AMD EPYC guests tutti is measured on that runs at
//! 1.7-2.3 GB/s instead of 40-90 GB/s (16 KiB, in cache) whenever the
//! destination lies 1 to 31 bytes after the source modulo 4 KiB. A ring's
//! payload starts 16 bytes after its header and a large `Vec`'s buffer 16
//! bytes into its page, so which messages hit the slow case depended on
//! their sizes and on where buffers happened to lie: 2-rank AllGather of
//! 32-64 KiB took 11-22 us a call where 128 KiB took 8, and AllToAll of
//! 16-64 KiB 7-23 us. In that range of lengths [`copy`] uses its own
//! vector loop, which runs at the same speed at any offset; below it and
//! above it glibc's copy has no such case (vector moves for short copies, a
//! vector loop with non-temporal stores for long ones).
//!
//! From [`STREAM_MIN`] on, and for every piece of a received message that
//! long (or of one from 1 MiB in a call whose buffers outgrow the cache,
//! [`stream_received`]), the loop's stores are non-temporal
//! ([`copy_stream`]).
//!
//! ```text
//!  bytes:   0 ... 2 KiB ............... 1 MiB ........ 8 MiB ..........
//!  copy:    memcpy | vector loop (here)  | memcpy      | streaming loop
//! ```

/// Copies shorter than this go to `memcpy` (glibc's `rep movsb` threshold
/// is 2,112 bytes; below it glibc uses vector moves).
const LOOP_MIN: usize = 2048;

/// Copies at least this long go to `memcpy` (glibc stops using `rep movsb`
/// on AMD at the L2 size, 1 MiB here, and has a vector loop with
/// non-temporal stores for very large copies).
const LOOP_MAX: usize = 1 << 20;

/// Copies `n` bytes from `src` to `dst`, like
/// [`std::ptr::copy_nonoverlapping`] (note the same argument order).
///
/// # Safety
/// `src` must be valid for reads and `dst` for writes of `n` bytes, and the
/// two ranges must not overlap.
#[inline]
pub unsafe fn copy(src: *const u8, dst: *mut u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    if n >= STREAM_MIN {
        // SAFETY: forwarded from the caller.
        unsafe { x86::copy::<true>(src, dst, n) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if (LOOP_MIN..LOOP_MAX).contains(&n) {
        // SAFETY: forwarded from the caller.
        unsafe { x86::copy::<false>(src, dst, n) };
        return;
    }
    // SAFETY: forwarded from the caller.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, n) }
}

/// Copies at least this long, and received messages at least this long,
/// are written with non-temporal stores ([`copy_stream`]): their
/// destinations do not fit in the caches anyway, and a store that does not
/// first read the line it writes saves a third of the memory traffic. 2
/// ranks, 64 MiB AllGather, 6 alternations: 3.3-3.7 GB/s busbw against
/// 1.8-2.8 with ordinary stores (docs/performance.md). From 8 MiB, not 4:
/// on this machine's 32 MiB last-level cache, a 2-rank AllGather of 8 MiB
/// (messages and its own block of 4 MiB, 12 MiB of buffers a rank) took
/// 377-502 us a call with ordinary stores against 609-690 streamed
/// (`bench/before_after.sh`, two sittings of 5 and 7 rounds, paired
/// 0.62 and 0.77), and AllToAll of 4 MiB 0.73 and 0.85.
pub const STREAM_MIN: usize = 8 << 20;

/// Received messages of at least [`STREAM_FOOTPRINT_MSG`] bytes are also
/// written with non-temporal stores when the call's buffers on this rank
/// (input and output, counted once where they are one) hold at least this
/// many bytes: then 2 ranks sharing the last-level cache (32 MiB here) do
/// not fit in it, whatever the size of each message. AllToAll of 16 MiB (2
/// ranks, 32 MiB of buffers a rank) streams its messages of 8 MiB; one of 8
/// MiB (messages of 4 MiB, 16 MiB of buffers) streams them by this rule.
/// At 8 MiB rather than 16 the rule also streamed AllGather of 8 MiB (12
/// MiB of buffers), 1.3-1.6x slower than with ordinary stores.
pub const STREAM_FOOTPRINT: usize = 16 << 20;

/// The smallest received message that [`STREAM_FOOTPRINT`] streams.
pub const STREAM_FOOTPRINT_MSG: usize = 1 << 20;

/// Whether a received message of `len` bytes, of a call whose buffers on
/// this rank hold `footprint` bytes, is written with non-temporal stores
/// (where nothing reads it again at once): [`STREAM_MIN`] and
/// [`STREAM_FOOTPRINT`].
pub fn stream_received(len: usize, footprint: usize) -> bool {
    len >= STREAM_MIN || (len >= STREAM_FOOTPRINT_MSG && footprint >= STREAM_FOOTPRINT)
}

/// Copies `n` bytes from `src` to `dst` with non-temporal stores where the
/// CPU has them: the destination's lines are not read first and do not stay
/// in the cache. For large destinations that nobody reads soon.
///
/// # Safety
/// As [`copy`].
#[inline]
pub unsafe fn copy_stream(src: *const u8, dst: *mut u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    if n >= 256 {
        // SAFETY: forwarded from the caller.
        unsafe { x86::copy::<true>(src, dst, n) };
        return;
    }
    // SAFETY: forwarded from the caller.
    unsafe { copy(src, dst, n) }
}

/// Copies `n` bytes from `src` to `dst` where the ranges may overlap, like
/// [`std::ptr::copy`]: through [`copy`] when they do not.
///
/// # Safety
/// `src` must be valid for reads and `dst` for writes of `n` bytes.
#[inline]
pub unsafe fn copy_overlapping(src: *const u8, dst: *mut u8, n: usize) {
    let (s, d) = (src as usize, dst as usize);
    if d.wrapping_sub(s) >= n && s.wrapping_sub(d) >= n {
        // SAFETY: the ranges are disjoint (|d - s| >= n); validity from the caller.
        unsafe { copy(src, dst, n) }
    } else {
        // SAFETY: validity from the caller; `ptr::copy` allows overlap.
        unsafe { std::ptr::copy(src, dst, n) }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m128i, __m256i, _mm256_loadu_si256, _mm256_storeu_si256, _mm256_stream_si256,
        _mm_loadu_si128, _mm_sfence, _mm_storeu_si128,
    };

    /// The loop for this CPU, with ordinary stores or (`STREAM`, where the
    /// CPU has AVX) non-temporal ones.
    ///
    /// # Safety
    /// As [`super::copy`], and `n >= 64`.
    #[inline]
    pub(super) unsafe fn copy<const STREAM: bool>(src: *const u8, dst: *mut u8, n: usize) {
        debug_assert!(n >= 64);
        if std::is_x86_feature_detected!("avx") {
            // SAFETY: the CPU has AVX; the rest is the caller's contract.
            unsafe { avx::<STREAM>(src, dst, n) }
        } else {
            // SAFETY: SSE2 is part of x86-64; the rest is the caller's contract.
            unsafe { copy_sse2(src, dst, n) }
        }
    }

    /// 128 bytes an iteration with 32-byte unaligned loads and stores aligned
    /// to the destination; the first and last 32 bytes are copied unaligned
    /// (overlapping the loop's bytes, which is harmless: same values). With
    /// `STREAM` the loop's stores are non-temporal (they must be aligned,
    /// which they are) and fenced before the first and last 32 bytes.
    ///
    /// # Safety
    /// As [`super::copy`], `n >= 32`, and the CPU has AVX.
    #[target_feature(enable = "avx")]
    unsafe fn avx<const STREAM: bool>(src: *const u8, dst: *mut u8, n: usize) {
        // The loops' stores are 32-byte aligned: i starts where dst + i is
        // aligned and moves in multiples of 32 (streaming stores need it).
        // SAFETY: every access lies in [0, n) of both ranges (n >= 32).
        unsafe {
            // A macro, not a closure: the intrinsics must be inlined here,
            // under this function's target feature.
            macro_rules! store {
                ($p:expr, $v:expr) => {
                    if STREAM {
                        _mm256_stream_si256($p as *mut __m256i, $v)
                    } else {
                        _mm256_storeu_si256($p as *mut __m256i, $v)
                    }
                };
            }
            let first = _mm256_loadu_si256(src as *const __m256i);
            let last = _mm256_loadu_si256(src.add(n - 32) as *const __m256i);
            let mut i = (32 - (dst as usize & 31)) & 31;
            while i + 128 <= n {
                let a = _mm256_loadu_si256(src.add(i) as *const __m256i);
                let b = _mm256_loadu_si256(src.add(i + 32) as *const __m256i);
                let c = _mm256_loadu_si256(src.add(i + 64) as *const __m256i);
                let d = _mm256_loadu_si256(src.add(i + 96) as *const __m256i);
                store!(dst.add(i), a);
                store!(dst.add(i + 32), b);
                store!(dst.add(i + 64), c);
                store!(dst.add(i + 96), d);
                i += 128;
            }
            while i + 32 <= n {
                store!(dst.add(i), _mm256_loadu_si256(src.add(i) as *const __m256i));
                i += 32;
            }
            if STREAM {
                _mm_sfence();
            }
            _mm256_storeu_si256(dst as *mut __m256i, first);
            _mm256_storeu_si256(dst.add(n - 32) as *mut __m256i, last);
        }
    }

    /// As [`avx`] with 16-byte moves, 64 bytes an iteration (ordinary stores).
    ///
    /// # Safety
    /// As [`super::copy`] and `n >= 16`.
    unsafe fn copy_sse2(src: *const u8, dst: *mut u8, n: usize) {
        // SAFETY: every access below lies in [0, n) of both ranges (n >= 16).
        unsafe {
            let first = _mm_loadu_si128(src as *const __m128i);
            let last = _mm_loadu_si128(src.add(n - 16) as *const __m128i);
            let mut i = (16 - (dst as usize & 15)) & 15;
            while i + 64 <= n {
                let a = _mm_loadu_si128(src.add(i) as *const __m128i);
                let b = _mm_loadu_si128(src.add(i + 16) as *const __m128i);
                let c = _mm_loadu_si128(src.add(i + 32) as *const __m128i);
                let d = _mm_loadu_si128(src.add(i + 48) as *const __m128i);
                _mm_storeu_si128(dst.add(i) as *mut __m128i, a);
                _mm_storeu_si128(dst.add(i + 16) as *mut __m128i, b);
                _mm_storeu_si128(dst.add(i + 32) as *mut __m128i, c);
                _mm_storeu_si128(dst.add(i + 48) as *mut __m128i, d);
                i += 64;
            }
            while i + 16 <= n {
                let a = _mm_loadu_si128(src.add(i) as *const __m128i);
                _mm_storeu_si128(dst.add(i) as *mut __m128i, a);
                i += 16;
            }
            _mm_storeu_si128(dst as *mut __m128i, first);
            _mm_storeu_si128(dst.add(n - 16) as *mut __m128i, last);
        }
    }

    /// A copy loop's signature.
    #[cfg(test)]
    pub(super) type CopyFn = unsafe fn(*const u8, *mut u8, usize);

    /// The loops this CPU can run, by name.
    #[cfg(test)]
    pub(super) fn both() -> Vec<(&'static str, CopyFn)> {
        let mut v: Vec<(&'static str, CopyFn)> = vec![("sse2", copy_sse2)];
        if std::is_x86_feature_detected!("avx") {
            // SAFETY: listed only where the CPU has AVX.
            v.push(("avx", |s, d, n| unsafe { avx::<false>(s, d, n) }));
            // SAFETY: as above.
            v.push(("avx_stream", |s, d, n| unsafe { avx::<true>(s, d, n) }));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// A received message streams when it is long, or when its call's
    /// buffers outgrow the cache and it is not short.
    #[test]
    fn which_received_messages_stream() {
        assert!(stream_received(STREAM_MIN, 0));
        assert!(!stream_received(STREAM_MIN - 1, 0));
        assert!(stream_received(STREAM_FOOTPRINT_MSG, STREAM_FOOTPRINT));
        assert!(!stream_received(STREAM_FOOTPRINT_MSG - 1, usize::MAX));
        assert!(!stream_received(STREAM_FOOTPRINT_MSG, STREAM_FOOTPRINT - 1));
    }

    /// Every length around the loops' boundaries and every alignment of both
    /// ends: exactly the bytes asked for are copied, nothing around them.
    #[test]
    fn copies_exactly_the_range_at_every_alignment() {
        let lens = [
            0, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 200, 2047, 2048, 2049, 4096,
            4111, 65536, 65551,
        ];
        let src = pattern(70_000, 7);
        for &n in &lens {
            for so in [0usize, 1, 8, 16, 31, 48] {
                for d_off in [0usize, 3, 8, 16, 32, 63] {
                    let mut dst = vec![0xA5u8; n + 128];
                    // SAFETY: both ranges lie inside their vectors; distinct vectors.
                    unsafe { copy(src.as_ptr().add(so), dst.as_mut_ptr().add(d_off), n) };
                    assert_eq!(
                        &dst[d_off..d_off + n],
                        &src[so..so + n],
                        "n {n} src+{so} dst+{d_off}"
                    );
                    assert!(
                        dst[..d_off].iter().all(|&b| b == 0xA5),
                        "n {n}: wrote before dst"
                    );
                    assert!(
                        dst[d_off + n..].iter().all(|&b| b == 0xA5),
                        "n {n}: wrote past dst"
                    );
                }
            }
        }
    }

    /// The SIMD loops themselves (whichever `copy` picks, all are tested).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_vector_loop_copies_exactly() {
        let src = pattern(9000, 3);
        for (name, f) in x86::both() {
            for n in [64usize, 65, 100, 127, 128, 129, 255, 256, 1000, 4099, 8192] {
                for so in [0usize, 5, 16] {
                    for d_off in [0usize, 1, 16, 31] {
                        let mut dst = vec![0u8; n + 64];
                        // SAFETY: in bounds of distinct vectors; n >= 64.
                        unsafe { f(src.as_ptr().add(so), dst.as_mut_ptr().add(d_off), n) };
                        assert_eq!(&dst[d_off..d_off + n], &src[so..so + n], "{name} n {n}");
                        assert!(dst[..d_off].iter().all(|&b| b == 0), "{name} n {n}");
                        assert!(dst[d_off + n..].iter().all(|&b| b == 0), "{name} n {n}");
                    }
                }
            }
        }
    }

    /// Overlapping ranges keep memmove's meaning; disjoint ones in one buffer
    /// take the fast copy.
    #[test]
    fn overlapping_copies_behave_like_memmove() {
        for n in [10usize, 3000, 5000] {
            for shift in [-700isize, -1, 1, 700, 5000, -5000] {
                let base = pattern(20_000, 11);
                let mut want = base.clone();
                let mut got = base.clone();
                let s = 8000usize;
                let d = (s as isize + shift) as usize;
                want.copy_within(s..s + n, d);
                // SAFETY: both ranges lie inside `got`.
                unsafe { copy_overlapping(got.as_ptr().add(s), got.as_mut_ptr().add(d), n) };
                assert_eq!(got, want, "n {n} shift {shift}");
            }
        }
    }
}
