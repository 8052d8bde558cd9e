//! Dense f32 matmul for AVX-512: 4 weight rows against up to 8 activation rows per pass.
//!
//! Mimi's transformer linears are f32 and take several activation rows at once: 2 per conversation
//! (two 25 Hz steps per 80 ms frame), 8 for a 4-slot server tick. The AVX2 kernel feeds 2 activation
//! rows per pass over a block of weight rows, so 8 rows cost four passes (the 4-slot transformers
//! took 1.5–1.8× one slot's time, `docs/bench-log.md`). Here one pass serves up to 8 activation
//! rows from 16 accumulators of 512 bits (4 weight rows × 4 register pairs), so a 4-slot tick reads
//! each weight block once: 8 rows over Mimi's ~100 MB of transformer weights took 2–8 % less time
//! than in two 4-row passes (`docs/bench-log.md`).
//!
//! The results are bitwise those of the AVX2 kernel (`matvec::dense_f32`; `matrix_props` checks it):
//! a 512-bit register holds two activation rows side by side, each half doing the AVX2 kernel's
//! 8-lane operations in the same order, and each half is reduced by the same horizontal sum and
//! scalar tail. So the output neither depends on the instruction set nor on the other rows of the
//! batch (Mimi's batched-vs-alone parity relies on the latter).

use std::arch::x86_64::*;

use super::{dense_prefetch_distance, hsum, prefetch_lines};
use crate::arch::table::{with_rows, MatmulSpan};

/// [`with_rows`] for chunks of up to 8 activation rows: calls `$f::<R, N>` with `N` the chunk's
/// row count.
macro_rules! with_rows8 {
    ($k:expr, $f:ident <$pre:literal> ($($arg:expr),* $(,)?)) => {
        match $k {
            5 => $f::<$pre, 5>($($arg),*),
            6 => $f::<$pre, 6>($($arg),*),
            7 => $f::<$pre, 7>($($arg),*),
            8.. => $f::<$pre, 8>($($arg),*),
            k => with_rows!(k, $f<$pre>($($arg),*)),
        }
    };
}

/// `R` weight rows (4, or 1 for the rows left over) against `N` activation rows (1 to 8, in up to
/// four pairs): writes `y[(i0 + i)·rows + r + k]`. Only the first pass over a weight block prefetches it
/// (the later passes find it in cache).
///
/// # Safety
/// AVX-512F/DQ available; `w0` holds `R·cols` values, `x` holds `N·cols`, `y` the whole output.
#[inline]
#[target_feature(enable = "avx512f,avx512dq,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn pass<const R: usize, const N: usize>(
    w0: *const f32,
    cols: usize,
    x: *const f32,
    prefetch: bool,
    y: *mut f32,
    rows: usize,
    r: usize,
    i0: usize,
) {
    let pairs = N.div_ceil(2);
    let main = cols / 8 * 8;
    let mut acc = [[_mm512_setzero_ps(); R]; 4];
    let pf = if prefetch {
        dense_prefetch_distance(cols * 4, R)
    } else {
        0
    };
    // The prefetch (two lines of each weight row per 32 columns) sits outside the 8-column
    // loop: with its test inside, LLVM kept two of the 16 accumulators on the stack, and the
    // store-to-load round trip of those two chains bounded the whole loop.
    let mut c = 0;
    while c < main {
        for k in 0..R {
            prefetch_lines(w0.add(k * cols + c) as *const u8, pf, 2);
        }
        let end = (c + 32).min(main);
        while c < end {
            let mut wv = [_mm512_setzero_ps(); R];
            for k in 0..R {
                wv[k] = _mm512_broadcast_f32x8(_mm256_loadu_ps(w0.add(k * cols + c)));
            }
            for p in 0..pairs {
                let lo = _mm256_loadu_ps(x.add(2 * p * cols + c));
                // An odd last row is paired with itself; its upper half is not stored.
                let hi = if 2 * p + 1 < N {
                    _mm256_loadu_ps(x.add((2 * p + 1) * cols + c))
                } else {
                    lo
                };
                let xv = _mm512_insertf32x8::<1>(_mm512_castps256_ps512(lo), hi);
                for k in 0..R {
                    acc[p][k] = _mm512_fmadd_ps(wv[k], xv, acc[p][k]);
                }
            }
            c += 8;
        }
    }
    for i in 0..N {
        let p = i / 2;
        for k in 0..R {
            let half = if i % 2 == 0 {
                _mm512_castps512_ps256(acc[p][k])
            } else {
                _mm512_extractf32x8_ps::<1>(acc[p][k])
            };
            let mut s = hsum(half);
            for c in main..cols {
                s = (*w0.add(k * cols + c)).mul_add(*x.add(i * cols + c), s);
            }
            *y.add((i0 + i) * rows + r + k) = s;
        }
    }
}

/// Dense f32 matmul rows of `span` (AVX-512): blocks of 4 weight rows, each weight load feeding
/// up to 8 activation rows.
///
/// # Safety
/// AVX-512F/DQ available; `w` is `rows·cols`, `x` is `n·cols`, `y` holds `n·rows`.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma,f16c")]
pub(super) unsafe fn dense_f32(w: &[f32], x: &[f32], span: MatmulSpan, y: *mut f32) {
    let (rows, cols, n) = (span.rows, span.cols, span.n);
    debug_assert!(w.len() >= rows * cols && x.len() >= n * cols);
    let mut r = span.r0;
    while r < span.r1 {
        let block = if span.r1 - r >= 4 { 4 } else { 1 };
        let w0 = w.as_ptr().add(r * cols);
        let mut i = 0;
        while i < n {
            let k = (n - i).min(8);
            let xp = x.as_ptr().add(i * cols);
            if block == 4 {
                with_rows8!(k, pass<4>(w0, cols, xp, i == 0, y, rows, r, i));
            } else {
                with_rows8!(k, pass<1>(w0, cols, xp, i == 0, y, rows, r, i));
            }
            i += k;
        }
        r += block;
    }
}
