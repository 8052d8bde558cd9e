//! Dense and quantized matmul tiles for AVX2 + FMA + F16C, AVX-VNNI and AVX-512 VNNI. The
//! portable references are in `arch/scalar.rs`.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::hsum;
use super::{dense_prefetch_distance, prefetch_lines};
use crate::arch::table::{with_rows, GroupCounter, MatmulSpan, PREFETCH};
use crate::layout::{Act, QKind, QPacked, QK, TILE};

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
            // Four row streams at once: half the distance (measured: 2 KiB gains ~10 % on a
            // 4096-column bf16 matrix, 4 KiB gains nothing as it runs into the next row), or
            // the next block for short rows.
            let pf = dense_prefetch_distance(cols * std::mem::size_of::<$t>(), 4);
            let lines = 32 * std::mem::size_of::<$t>() / 64;
            let mut c = 0;
            while c < main {
                if pf > 0 && c % 32 == 0 {
                    for r in 0..4 {
                        prefetch_lines(w0.add(r * cols + c) as *const u8, pf, lines);
                    }
                }
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

        /// Dense matmul rows of `span` (AVX2): blocks of 4 weight rows, each weight load
        /// feeding up to 2 activation rows.
        ///
        /// # Safety
        /// AVX2/FMA/F16C available; `w` is `rows·cols`, `x` is `n·cols`, `y` holds `n·rows`.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) unsafe fn $name(w: &[$t], x: &[f32], span: MatmulSpan, y: *mut f32) {
            let (rows, cols, n) = (span.rows, span.cols, span.n);
            debug_assert!(w.len() >= rows * cols && x.len() >= n * cols);
            let conv = $conv;
            let main = cols / 8 * 8;
            let mut r = span.r0;
            while r + 4 <= span.r1 {
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
            while r < span.r1 {
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
    let p = v.as_ptr().add(q.scale_index(t, g));
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
        pub(super) mod $module {
            #![allow(clippy::needless_range_loop, unused_unsafe)]
            use super::*;

            /// One tile of 8 rows against `N` activation rows (`i0..i0+N`): q4 codes (unsigned
            /// 0..15) when `Q4`, else q8. Both walk the blocks, scales and accumulators the same
            /// way; they differ in how a block's codes become i32 sums and in the offset term.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn quant_tile<const N: usize, const Q4: bool>(
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
                let affine = q.kind == QKind::Affine8;
                let sym = q.kind == QKind::Q4Sym;
                let minus8 = _mm256_set1_ps(-8.0);
                let split = row_split(N);
                // With VNNI and separate low/high accumulators (split >= 2: odd indices hold the
                // high nibbles), q4 high nibbles enter unshifted as 16·q (one `vpand`); their
                // i32 sums are multiples of 16 (|sum| < 2^19) and are shifted back exactly.
                let hi_raw = Q4 && $vnni && split >= 2;
                let mhi = _mm256_set1_epi8(-16);
                let mut wp = q.codes.as_ptr().add(q.tile_block_base(t, 0));
                // The first tile of a pair prefetches the pair's lines; the second finds them in cache.
                let pf = if t % 2 == 0 {
                    PREFETCH.load(std::sync::atomic::Ordering::Relaxed)
                } else {
                    0
                };
                let mut gc = GroupCounter::new(q.group_blocks);
                for b in 0..nb {
                    // A block of a tile: 8 rows of 32 bytes (q8) or 16 bytes (q4).
                    prefetch_lines(wp, pf, if Q4 { 4 } else { 8 });
                    // Integer sums per activation row in `split` partial accumulators: i32
                    // lanes, except q4 without VNNI (i16 lanes; each sums at most 8 products
                    // of at most 15·127·2: no saturation), low nibbles in even accumulators
                    // and high nibbles in odd ones.
                    let mut sums = [[_mm256_setzero_si256(); 4]; N];
                    if Q4 {
                        for k in 0..4 {
                            let p = _mm256_loadu_si256(wp.add(64 * k) as *const __m256i);
                            let lo = _mm256_and_si256(p, m4);
                            let hi = if hi_raw {
                                _mm256_and_si256(p, mhi)
                            } else {
                                _mm256_and_si256(_mm256_srli_epi16::<4>(p), m4)
                            };
                            for i in 0..N {
                                let xq = act.q.as_ptr().add((i0 + i) * cols + b * QK + 4 * k);
                                let xl = bcast4(xq);
                                let xh = bcast4(xq.add(16));
                                let (ia, ib) = ((2 * k) % split, (2 * k + 1) % split);
                                let s = &mut sums[i];
                                if $vnni {
                                    // u8 × i8 products accumulated without saturation.
                                    s[ia] = _mm256_dpbusd_avx_epi32(s[ia], lo, xl);
                                    s[ib] = _mm256_dpbusd_avx_epi32(s[ib], hi, xh);
                                } else {
                                    s[ia] = _mm256_add_epi16(s[ia], _mm256_maddubs_epi16(lo, xl));
                                    s[ib] = _mm256_add_epi16(s[ib], _mm256_maddubs_epi16(hi, xh));
                                }
                            }
                        }
                        wp = wp.add(TILE * QK);
                    } else {
                        for j in 0..8 {
                            let w = _mm256_loadu_si256(wp.add(64 * j) as *const __m256i);
                            let aw = _mm256_sign_epi8(w, w);
                            for i in 0..N {
                                let xb =
                                    bcast4(act.q.as_ptr().add((i0 + i) * cols + b * QK + 4 * j));
                                let a = &mut sums[i][j % split];
                                if $vnni {
                                    *a = _mm256_dpbusd_avx_epi32(*a, aw, _mm256_sign_epi8(xb, w));
                                } else {
                                    let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xb, w));
                                    *a = _mm256_add_epi32(*a, _mm256_madd_epi16(p, ones));
                                }
                            }
                        }
                        wp = wp.add(2 * TILE * QK);
                    }
                    let g = gc.next();
                    let sc = load_scales(q, &q.scales, t, g);
                    // The offset of q4 codes: −8·scale when symmetric (stored as code + 8), else
                    // the stored biases.
                    let bias4 = if !Q4 {
                        _mm256_setzero_ps()
                    } else if sym {
                        _mm256_mul_ps(sc, minus8)
                    } else {
                        load_scales(q, &q.biases, t, g)
                    };
                    for i in 0..N {
                        let ab = (i0 + i) * nb + b;
                        let s = &mut sums[i];
                        let mut is;
                        if Q4 {
                            if hi_raw {
                                let (mut l, mut h) = (s[0], s[1]);
                                if split == 4 {
                                    l = _mm256_add_epi32(l, s[2]);
                                    h = _mm256_add_epi32(h, s[3]);
                                }
                                s[0] = _mm256_add_epi32(l, _mm256_srai_epi32::<4>(h));
                            }
                            is = if $vnni {
                                s[0]
                            } else {
                                _mm256_madd_epi16(s[0], ones)
                            };
                            for k in 1..if hi_raw { 1 } else { split } {
                                is = _mm256_add_epi32(
                                    is,
                                    if $vnni {
                                        s[k]
                                    } else {
                                        _mm256_madd_epi16(s[k], ones)
                                    },
                                );
                            }
                        } else {
                            is = s[0];
                            for k in 1..split {
                                is = _mm256_add_epi32(is, s[k]);
                            }
                            // Affine q8 codes are stored as `code − 128`: add back 128·Σx.
                            if affine {
                                is = _mm256_add_epi32(
                                    is,
                                    _mm256_set1_epi32(128 * *act.qs.get_unchecked(ab)),
                                );
                            }
                        }
                        let sd = _mm256_mul_ps(sc, _mm256_set1_ps(*act.d.get_unchecked(ab)));
                        acc[i] = _mm256_fmadd_ps(sd, _mm256_cvtepi32_ps(is), acc[i]);
                        if Q4 || affine {
                            let bias = if Q4 {
                                bias4
                            } else {
                                load_scales(q, &q.biases, t, g)
                            };
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

            /// Tile `t` against activation rows `i0..i0 + N`, written to `y`.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn tile_n<const N: usize>(
                q: &QPacked,
                act: &Act<'_>,
                span: MatmulSpan,
                t: usize,
                i0: usize,
                y: *mut f32,
            ) {
                let (rows, cols) = (span.rows, span.cols);
                let mut out = [[0f32; 8]; N];
                if q.kind.is_q4() {
                    quant_tile::<N, true>(q, t, act, cols, i0, &mut out);
                } else {
                    quant_tile::<N, false>(q, t, act, cols, i0, &mut out);
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

            /// Quantized matmul over the rows of `span` (`r0` a multiple of 8), activations in
            /// `act`.
            ///
            /// # Safety
            /// AVX2/FMA/F16C available; `act` prepared for `n` rows of `cols`; `y` holds `n·rows`.
            #[target_feature(enable = $feat)]
            pub(in crate::arch::x86) unsafe fn quant(
                q: &QPacked,
                act: &Act<'_>,
                span: MatmulSpan,
                y: *mut f32,
            ) {
                debug_assert_eq!(span.r0 % TILE, 0);
                for (t, i0, k) in crate::arch::table::tile_chunks(span, 4) {
                    with_rows!(k, tile_n(q, act, span, t, i0, y));
                }
            }
        }
    };
}

quant_kernels!(plain, "avx2,fma,f16c", false);
quant_kernels!(vnni, "avx2,fma,f16c,avxvnni", true);

/// Independent integer accumulators per activation row of the quantized tile kernels for `n`
/// rows at once (ILP: one chain of 8 dependent adds per block would bound a single row to
/// ~5 cycles per load).
const fn row_split(n: usize) -> usize {
    match n {
        1 => 4,
        2 => 2,
        _ => 1,
    }
}

/// AVX-512 VNNI kernels over pairs of tiles (16 rows per zmm, one dword lane per row).
pub(super) mod avx512q {
    #![allow(clippy::needless_range_loop)]
    use super::*;

    /// The 16 per-row scales (or biases) of pair `p`, group `g`, as f32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn scales16(q: &QPacked, v: &[u16], p: usize, g: usize) -> __m512 {
        let ptr = v.as_ptr().add((p * q.groups + g) * 2 * TILE) as *const __m256i;
        let h = _mm256_loadu_si256(ptr);
        match q.kind {
            QKind::Q8Sym | QKind::Q4Sym => _mm512_cvtph_ps(h),
            QKind::Affine8 | QKind::Affine4 => {
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn bc(p: *const u8) -> __m512i {
        _mm512_set1_epi32((p as *const i32).read_unaligned())
    }

    /// Pair `p` (16 rows) against activation rows `i0..i0+N`: q4 codes (unsigned 0..15) when
    /// `Q4`, else q8 codes (signed). q8 activations enter `vpdpbusd` as unsigned bytes
    /// `x + 128` (`act.qu`), corrected by `128·Σw` (one extra `vpdpbusd` per weight vector,
    /// shared by the N rows). Both walk the blocks, scales and accumulators the same way.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn quant_pair<const N: usize, const Q4: bool>(
        q: &QPacked,
        p: usize,
        act: &Act<'_>,
        cols: usize,
        i0: usize,
        out: &mut [[f32; 16]; N],
    ) {
        let nb = q.blocks;
        let ones = _mm512_set1_epi8(1);
        let m4 = _mm512_set1_epi8(15);
        let mut acc = [_mm512_setzero_ps(); N];
        let mut corr = [_mm512_setzero_ps(); N];
        let affine = q.kind == QKind::Affine8;
        let sym = q.kind == QKind::Q4Sym;
        let minus8 = _mm512_set1_ps(-8.0);
        let mhi = _mm512_set1_epi8(-16); // 0xF0
                                         // q4 accumulators per row: [low nibbles a, b][high nibbles a, b] (2 chains each for one
                                         // or two rows). High nibbles enter unshifted (16·q, one `vpand`), their i32 sum is a
                                         // multiple of 16 and is shifted back exactly (|sum| < 2^19: no overflow).
        let split = if !Q4 {
            row_split(N)
        } else if N <= 2 {
            2
        } else {
            1
        };
        // A block of the pair: 16 rows of 32 bytes (q8) or 16 bytes (q4).
        let block = if Q4 { TILE * QK } else { 2 * TILE * QK };
        let mut wp = q.codes.as_ptr().add(p * nb * block);
        let xu = act.qu.as_ptr();
        let xq = act.q.as_ptr() as *const u8;
        let pf = PREFETCH.load(std::sync::atomic::Ordering::Relaxed);
        let mut gc = GroupCounter::new(q.group_blocks);
        for b in 0..nb {
            prefetch_lines(wp, pf, if Q4 { 4 } else { 8 });
            // i32 sums per activation row in `split` partial accumulators (q4: already
            // combined into the first).
            let mut isum = [[_mm512_setzero_si512(); 4]; N];
            // q8: Σw per row, in two chains.
            let mut ws0 = _mm512_setzero_si512();
            let mut ws1 = _mm512_setzero_si512();
            if Q4 {
                let mut lo_s = [[_mm512_setzero_si512(); 2]; N];
                let mut hi_s = [[_mm512_setzero_si512(); 2]; N];
                for k in 0..4 {
                    let w = _mm512_loadu_si512(wp.add(64 * k) as *const _);
                    let lo = _mm512_and_si512(w, m4);
                    let hi = _mm512_and_si512(w, mhi);
                    for i in 0..N {
                        let xp = xq.add((i0 + i) * cols + b * QK + 4 * k);
                        let a = k % split;
                        lo_s[i][a] = _mm512_dpbusd_epi32(lo_s[i][a], lo, bc(xp));
                        hi_s[i][a] = _mm512_dpbusd_epi32(hi_s[i][a], hi, bc(xp.add(16)));
                    }
                }
                for i in 0..N {
                    let mut l = lo_s[i][0];
                    let mut h = hi_s[i][0];
                    if split == 2 {
                        l = _mm512_add_epi32(l, lo_s[i][1]);
                        h = _mm512_add_epi32(h, hi_s[i][1]);
                    }
                    isum[i][0] = _mm512_add_epi32(l, _mm512_srai_epi32::<4>(h));
                }
            } else {
                for j in 0..8 {
                    let w = _mm512_loadu_si512(wp.add(64 * j) as *const _);
                    if j % 2 == 0 {
                        ws0 = _mm512_dpbusd_epi32(ws0, ones, w);
                    } else {
                        ws1 = _mm512_dpbusd_epi32(ws1, ones, w);
                    }
                    for i in 0..N {
                        let xb = bc(xu.add((i0 + i) * cols + b * QK + 4 * j));
                        let a = &mut isum[i][j % split];
                        *a = _mm512_dpbusd_epi32(*a, xb, w);
                    }
                }
            }
            wp = wp.add(block);
            let g = gc.next();
            let sc = scales16(q, &q.scales, p, g);
            let wsum128 = _mm512_slli_epi32::<7>(_mm512_add_epi32(ws0, ws1));
            // The offset of q4 codes: −8·scale when symmetric (stored as code + 8), else the
            // stored biases.
            let bias4 = if !Q4 {
                _mm512_setzero_ps()
            } else if sym {
                _mm512_mul_ps(sc, minus8)
            } else {
                scales16(q, &q.biases, p, g)
            };
            for i in 0..N {
                let ab = (i0 + i) * nb + b;
                let mut is = isum[i][0];
                if !Q4 {
                    for k in 1..split {
                        is = _mm512_add_epi32(is, isum[i][k]);
                    }
                    is = _mm512_sub_epi32(is, wsum128);
                    // Affine q8 codes are stored as `code − 128`: add back 128·Σx.
                    if affine {
                        is = _mm512_add_epi32(
                            is,
                            _mm512_set1_epi32(128 * *act.qs.get_unchecked(ab)),
                        );
                    }
                }
                let sd = _mm512_mul_ps(sc, _mm512_set1_ps(*act.d.get_unchecked(ab)));
                acc[i] = _mm512_fmadd_ps(sd, _mm512_cvtepi32_ps(is), acc[i]);
                if Q4 || affine {
                    let bias = if Q4 {
                        bias4
                    } else {
                        scales16(q, &q.biases, p, g)
                    };
                    corr[i] =
                        _mm512_fmadd_ps(bias, _mm512_set1_ps(*act.s.get_unchecked(ab)), corr[i]);
                }
            }
        }
        for i in 0..N {
            _mm512_storeu_ps(out[i].as_mut_ptr(), _mm512_add_ps(acc[i], corr[i]));
        }
    }

    /// Pair `p` against activation rows `i0..i0 + N`, written to `y`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn pair_n<const N: usize>(
        q: &QPacked,
        act: &Act<'_>,
        span: MatmulSpan,
        p: usize,
        i0: usize,
        y: *mut f32,
    ) {
        let (rows, cols) = (span.rows, span.cols);
        let mut out = [[0f32; 16]; N];
        if q.kind.is_q4() {
            quant_pair::<N, true>(q, p, act, cols, i0, &mut out);
        } else {
            quant_pair::<N, false>(q, p, act, cols, i0, &mut out);
        }
        let r = p * 2 * TILE;
        let valid = (rows - r).min(2 * TILE);
        for (i, o) in out.iter().enumerate() {
            std::ptr::copy_nonoverlapping(o.as_ptr(), y.add((i0 + i) * rows + r), valid);
        }
    }

    /// Rows of `span` (`r0` a multiple of 8): whole pairs of tiles with zmm, a lone tile at
    /// either end with the ymm kernels (AVX-VNNI ones when `VNNI`).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(in crate::arch::x86) unsafe fn quant<const VNNI: bool>(
        q: &QPacked,
        act: &Act<'_>,
        span: MatmulSpan,
        y: *mut f32,
    ) {
        debug_assert_eq!(span.r0 % TILE, 0);
        let n = span.n;
        let (mut t, t1) = (span.r0 / TILE, span.r1.div_ceil(TILE));
        while t < t1 {
            if t % 2 == 1 || t + 1 >= t1 {
                let tile = MatmulSpan {
                    r0: t * TILE,
                    r1: ((t + 1) * TILE).min(span.rows),
                    ..span
                };
                if VNNI {
                    super::vnni::quant(q, act, tile, y)
                } else {
                    super::plain::quant(q, act, tile, y)
                }
                t += 1;
                continue;
            }
            let p = t / 2;
            let mut i0 = 0;
            while i0 < n {
                with_rows!(n - i0, pair_n(q, act, span, p, i0, y));
                i0 += 4;
            }
            t += 2;
        }
    }
}
