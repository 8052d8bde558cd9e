#![allow(clippy::needless_range_loop)]
//! AVX2 + FMA + F16C kernels (x86_64). Only called after run-time detection
//! ([`crate::simd_level`]). Scalar references live beside the dispatchers in `matrix.rs`,
//! `ops.rs` and `gemm.rs`.

use std::arch::x86_64::*;

use crate::matrix::{Act, QKind, QPacked, TILE};
use crate::quant::QK;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum(v: __m256) -> f32 {
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps::<1>(v);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_bf16x8(p: *const u16) -> __m256 {
    let h = _mm_loadu_si128(p as *const __m128i);
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_f16x8(p: *const u16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_f32x8(p: *const f32) -> __m256 {
    _mm256_loadu_ps(p)
}

macro_rules! dense_kernel {
    ($name:ident, $block:ident, $t:ty, $load:ident, $conv:expr) => {
        /// 4 weight rows against `N` activation rows: each weight vector is loaded once
        /// and feeds `N` activation rows.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $block<const N: usize>(
            w0: *const $t,
            cols: usize,
            x: *const f32,
            out: &mut [[f32; 4]; N],
        ) {
            let conv = $conv;
            let main = cols / 8 * 8;
            let mut acc = [[_mm256_setzero_ps(); 4]; N];
            let mut c = 0;
            while c < main {
                let wv = [
                    $load(w0.add(c)),
                    $load(w0.add(cols + c)),
                    $load(w0.add(2 * cols + c)),
                    $load(w0.add(3 * cols + c)),
                ];
                for i in 0..N {
                    let xv = _mm256_loadu_ps(x.add(i * cols + c));
                    for r in 0..4 {
                        acc[i][r] = _mm256_fmadd_ps(wv[r], xv, acc[i][r]);
                    }
                }
                c += 8;
            }
            for i in 0..N {
                for r in 0..4 {
                    let mut s = hsum(acc[i][r]);
                    for c in main..cols {
                        s = conv(*w0.add(r * cols + c)).mul_add(*x.add(i * cols + c), s);
                    }
                    out[i][r] = s;
                }
            }
        }

        /// Dense matmul rows `r0..r1` (AVX2): blocks of 4 weight rows, each weight load
        /// feeding up to 2 activation rows.
        ///
        /// # Safety
        /// AVX2/FMA/F16C available; `w` is `rows·cols`, `x` is `n·cols`, `y` holds `n·rows`.
        #[target_feature(enable = "avx2,fma,f16c")]
        #[allow(clippy::too_many_arguments)]
        pub(crate) unsafe fn $name(
            w: &[$t],
            rows: usize,
            cols: usize,
            x: &[f32],
            n: usize,
            r0: usize,
            r1: usize,
            y: *mut f32,
        ) {
            debug_assert!(w.len() >= rows * cols && x.len() >= n * cols);
            let conv = $conv;
            let main = cols / 8 * 8;
            let mut r = r0;
            while r + 4 <= r1 {
                let w0 = w.as_ptr().add(r * cols);
                let mut i = 0;
                while i < n {
                    let xp = x.as_ptr().add(i * cols);
                    if n - i >= 2 {
                        let mut o = [[0f32; 4]; 2];
                        $block::<2>(w0, cols, xp, &mut o);
                        for (ii, row) in o.iter().enumerate() {
                            for (k, v) in row.iter().enumerate() {
                                *y.add((i + ii) * rows + r + k) = *v;
                            }
                        }
                        i += 2;
                    } else {
                        let mut o = [[0f32; 4]; 1];
                        $block::<1>(w0, cols, xp, &mut o);
                        for (k, v) in o[0].iter().enumerate() {
                            *y.add(i * rows + r + k) = *v;
                        }
                        i += 1;
                    }
                }
                r += 4;
            }
            while r < r1 {
                let w0 = w.as_ptr().add(r * cols);
                for i in 0..n {
                    let xp = x.as_ptr().add(i * cols);
                    let mut a0 = _mm256_setzero_ps();
                    let mut c = 0;
                    while c < main {
                        a0 = _mm256_fmadd_ps($load(w0.add(c)), _mm256_loadu_ps(xp.add(c)), a0);
                        c += 8;
                    }
                    let mut s = hsum(a0);
                    for c in main..cols {
                        s = conv(*w0.add(c)).mul_add(*xp.add(c), s);
                    }
                    *y.add(i * rows + r) = s;
                }
                r += 1;
            }
        }
    };
}

dense_kernel!(dense_f32, block_f32, f32, load_f32x8, |v: f32| v);
dense_kernel!(dense_bf16, block_bf16, u16, load_bf16x8, |b: u16| {
    half::bf16::from_bits(b).to_f32()
});
dense_kernel!(dense_f16, block_f16, u16, load_f16x8, |b: u16| {
    half::f16::from_bits(b).to_f32()
});

/// Loads the 8 per-row scales (as f32) of tile `t`, group `g`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_scales(q: &QPacked, v: &[u16], t: usize, g: usize) -> __m256 {
    let p = v.as_ptr().add((t * q.groups + g) * TILE);
    match q.kind {
        QKind::Q8Sym | QKind::Q4Sym => load_f16x8(p),
        QKind::Affine8 | QKind::Affine4 => load_bf16x8(p),
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bcast4(p: *const i8) -> __m256i {
    _mm256_set1_epi32((p as *const i32).read_unaligned())
}

/// Instantiates the quantized tile kernels for one feature set: `$vnni` selects AVX-VNNI
/// `vpdpbusd` (u8 × i8 → i32) instead of `vpmaddubsw` + `vpmaddwd`.
macro_rules! quant_kernels {
    ($module:ident, $feat:literal, $vnni:literal) => {
        mod $module {
            #![allow(clippy::needless_range_loop, unused_unsafe)]
            use super::*;

            /// One tile of 8 rows against `N` activation rows (`i0..i0+N`), q8 codes.
            #[inline]
            #[target_feature(enable = $feat)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn q8_tile<const N: usize>(
                q: &QPacked,
                t: usize,
                act: &Act<'_>,
                cols: usize,
                i0: usize,
                out: &mut [[f32; 8]; N],
            ) {
                let nb = q.blocks;
                let ones = _mm256_set1_epi16(1);
                let mut acc = [_mm256_setzero_ps(); N];
                let mut corr = [_mm256_setzero_ps(); N];
                let affine = q.kind == QKind::Affine8;
                let mut wp = q.codes.as_ptr().add(t * nb * TILE * QK);
                for b in 0..nb {
                    let mut isum = [_mm256_setzero_si256(); N];
                    for j in 0..8 {
                        let w = _mm256_loadu_si256(wp.add(32 * j) as *const __m256i);
                        let aw = _mm256_sign_epi8(w, w);
                        for i in 0..N {
                            let xb = bcast4(act.q.as_ptr().add((i0 + i) * cols + b * QK + 4 * j));
                            if $vnni {
                                isum[i] =
                                    _mm256_dpbusd_avx_epi32(isum[i], aw, _mm256_sign_epi8(xb, w));
                            } else {
                                let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xb, w));
                                isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(p, ones));
                            }
                        }
                    }
                    wp = wp.add(TILE * QK);
                    let g = b / q.group_blocks;
                    let sc = load_scales(q, &q.scales, t, g);
                    for i in 0..N {
                        let ab = (i0 + i) * nb + b;
                        let mut is = isum[i];
                        if affine {
                            is = _mm256_add_epi32(
                                is,
                                _mm256_set1_epi32(128 * *act.qs.get_unchecked(ab)),
                            );
                        }
                        let sd = _mm256_mul_ps(sc, _mm256_set1_ps(*act.d.get_unchecked(ab)));
                        acc[i] = _mm256_fmadd_ps(sd, _mm256_cvtepi32_ps(is), acc[i]);
                        if affine {
                            let bias = load_scales(q, &q.biases, t, g);
                            corr[i] = _mm256_fmadd_ps(
                                bias,
                                _mm256_set1_ps(*act.s.get_unchecked(ab)),
                                corr[i],
                            );
                        }
                    }
                }
                for i in 0..N {
                    _mm256_storeu_ps(out[i].as_mut_ptr(), _mm256_add_ps(acc[i], corr[i]));
                }
            }

            /// One tile of 8 rows against `N` activation rows, q4 codes (unsigned 0..15).
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn q4_tile<const N: usize>(
                q: &QPacked,
                t: usize,
                act: &Act<'_>,
                cols: usize,
                i0: usize,
                out: &mut [[f32; 8]; N],
            ) {
                let nb = q.blocks;
                let ones = _mm256_set1_epi16(1);
                let m4 = _mm256_set1_epi8(15);
                let mut acc = [_mm256_setzero_ps(); N];
                let mut corr = [_mm256_setzero_ps(); N];
                let sym = q.kind == QKind::Q4Sym;
                let minus8 = _mm256_set1_ps(-8.0);
                let mut wp = q.codes.as_ptr().add(t * nb * TILE * QK / 2);
                for b in 0..nb {
                    // Each i16 lane sums 8 products of at most 15·127·2: no saturation.
                    let mut s16 = [_mm256_setzero_si256(); N];
                    for k in 0..4 {
                        let p = _mm256_loadu_si256(wp.add(32 * k) as *const __m256i);
                        let lo = _mm256_and_si256(p, m4);
                        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(p), m4);
                        for i in 0..N {
                            let xq = act.q.as_ptr().add((i0 + i) * cols + b * QK + 4 * k);
                            let xl = bcast4(xq);
                            let xh = bcast4(xq.add(16));
                            if $vnni {
                                // i32 lanes: u8 × i8 products accumulated without saturation.
                                s16[i] = _mm256_dpbusd_avx_epi32(s16[i], lo, xl);
                                s16[i] = _mm256_dpbusd_avx_epi32(s16[i], hi, xh);
                            } else {
                                s16[i] = _mm256_add_epi16(s16[i], _mm256_maddubs_epi16(lo, xl));
                                s16[i] = _mm256_add_epi16(s16[i], _mm256_maddubs_epi16(hi, xh));
                            }
                        }
                    }
                    wp = wp.add(TILE * QK / 2);
                    let g = b / q.group_blocks;
                    let sc = load_scales(q, &q.scales, t, g);
                    let bias = if sym {
                        _mm256_mul_ps(sc, minus8)
                    } else {
                        load_scales(q, &q.biases, t, g)
                    };
                    for i in 0..N {
                        let ab = (i0 + i) * nb + b;
                        let is = if $vnni {
                            s16[i]
                        } else {
                            _mm256_madd_epi16(s16[i], ones)
                        };
                        let sd = _mm256_mul_ps(sc, _mm256_set1_ps(*act.d.get_unchecked(ab)));
                        acc[i] = _mm256_fmadd_ps(sd, _mm256_cvtepi32_ps(is), acc[i]);
                        corr[i] = _mm256_fmadd_ps(
                            bias,
                            _mm256_set1_ps(*act.s.get_unchecked(ab)),
                            corr[i],
                        );
                    }
                }
                for i in 0..N {
                    _mm256_storeu_ps(out[i].as_mut_ptr(), _mm256_add_ps(acc[i], corr[i]));
                }
            }

            #[inline]
            #[target_feature(enable = $feat)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn tile_n<const N: usize>(
                q: &QPacked,
                rows: usize,
                cols: usize,
                act: &Act<'_>,
                t: usize,
                i0: usize,
                y: *mut f32,
            ) {
                let mut out = [[0f32; 8]; N];
                if q.kind.is_q4() {
                    q4_tile::<N>(q, t, act, cols, i0, &mut out);
                } else {
                    q8_tile::<N>(q, t, act, cols, i0, &mut out);
                }
                let valid = (rows - t * TILE).min(TILE);
                for (i, o) in out.iter().enumerate() {
                    std::ptr::copy_nonoverlapping(
                        o.as_ptr(),
                        y.add((i0 + i) * rows + t * TILE),
                        valid,
                    );
                }
            }

            /// Quantized matmul over rows `r0..r1` (`r0` a multiple of 8), activations in `act`.
            ///
            /// # Safety
            /// AVX2/FMA/F16C available; `act` prepared for `n` rows of `cols`; `y` holds `n·rows`.
            #[target_feature(enable = $feat)]
            #[allow(clippy::too_many_arguments)]
            pub(super) unsafe fn quant(
                q: &QPacked,
                rows: usize,
                cols: usize,
                act: &Act<'_>,
                n: usize,
                r0: usize,
                r1: usize,
                y: *mut f32,
            ) {
                debug_assert_eq!(r0 % TILE, 0);
                for t in r0 / TILE..r1.div_ceil(TILE) {
                    let mut i0 = 0;
                    while i0 < n {
                        match n - i0 {
                            1 => tile_n::<1>(q, rows, cols, act, t, i0, y),
                            2 => tile_n::<2>(q, rows, cols, act, t, i0, y),
                            3 => tile_n::<3>(q, rows, cols, act, t, i0, y),
                            _ => tile_n::<4>(q, rows, cols, act, t, i0, y),
                        }
                        i0 += 4;
                    }
                }
            }
        }
    };
}

quant_kernels!(plain, "avx2,fma,f16c", false);
quant_kernels!(vnni, "avx2,fma,f16c,avxvnni", true);

/// Quantized matmul over rows `r0..r1` (`r0` a multiple of 8), activations in `act`;
/// uses AVX-VNNI when the CPU has it (and it is not disabled).
///
/// # Safety
/// AVX2/FMA/F16C available; `act` prepared for `n` rows of `cols`; `y` holds `n·rows`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn quant(
    q: &QPacked,
    rows: usize,
    cols: usize,
    act: &Act<'_>,
    n: usize,
    r0: usize,
    r1: usize,
    y: *mut f32,
) {
    if crate::cpu::vnni() {
        vnni::quant(q, rows, cols, act, n, r0, r1, y)
    } else {
        plain::quant(q, rows, cols, act, n, r0, r1, y)
    }
}
