//! Fused one-head attention kernels over a contiguous per-head KV layout (x86_64):
//! scores `q·kⱼ/√d`, the table's softmax (the portable body compiled for the level) and `Σ pⱼ vⱼ` with the output held in registers.
//! AVX-512 (zmm, 32 values per chunk) and AVX2 (ymm, 16 values per chunk) versions; the
//! scalar reference is `KvRing::attend_reference` in `src/attention.rs`.
//!
//! bf16 keys/values are widened exactly in registers without shuffles: a vector of 2k bf16
//! values read as 32-bit lanes gives the even elements by `<< 16` and the odd ones by masking
//! the low half. The query is permuted once into the same (even, odd) order and the output
//! permuted back once, so each score is a plain FMA dot product and each output element is
//! accumulated in exactly the order of the reference (`out += pⱼ·vⱼ`, j oldest first).

#![allow(clippy::too_many_arguments, clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::arch::table::Seg;

/// Largest head dimension the SIMD kernels take (registers / stack arrays).
const MAX_HD: usize = 256;

/// The AVX2 attention entry of the kernel table: head sizes that are multiples of 16 up to
/// [`MAX_HD`].
///
/// # Safety
/// AVX2/FMA/F16C available; segments as in [`head_avx512`].
pub(super) unsafe fn attend_head_avx2(
    bf16: bool,
    hd: usize,
    q: &[f32],
    segs: &[Seg; 2],
    inv: f32,
    scores: &mut [f32],
    out: &mut [f32],
) -> bool {
    if hd > MAX_HD || !hd.is_multiple_of(16) {
        return false;
    }
    head_avx2(bf16, hd, q, segs, inv, scores, out);
    true
}

/// The AVX-512 attention entry: zmm for multiples of 32, else as [`attend_head_avx2`].
///
/// # Safety
/// AVX-512 F/BW/DQ/VL, AVX2 and FMA available; segments as in [`head_avx512`].
pub(super) unsafe fn attend_head_avx512(
    bf16: bool,
    hd: usize,
    q: &[f32],
    segs: &[Seg; 2],
    inv: f32,
    scores: &mut [f32],
    out: &mut [f32],
) -> bool {
    if hd <= MAX_HD && hd.is_multiple_of(32) {
        head_avx512(bf16, hd, q, segs, inv, scores, out);
        return true;
    }
    attend_head_avx2(bf16, hd, q, segs, inv, scores, out)
}

// ---------------------------------------------------------------------------------------
// AVX-512

/// Loads chunk `c` (32 elements) of a row as two f32x16 vectors (see [`pos512`]).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,fma")]
unsafe fn load512<const BF16: bool>(row: *const u8, c: usize) -> (__m512, __m512) {
    if BF16 {
        let x = _mm512_loadu_si512(row.add(c * 64) as *const _);
        (
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(x)),
            _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(-65536))),
        )
    } else {
        let p = row.add(c * 128) as *const f32;
        (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)))
    }
}

/// Element index held by lane `i` of half `h` of chunk `c` (as loaded by [`load512`]).
#[inline(always)]
fn pos512<const BF16: bool>(c: usize, h: usize, i: usize) -> usize {
    if BF16 {
        32 * c + 2 * i + h
    } else {
        32 * c + 16 * h + i
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,fma")]
unsafe fn head512_nc<const BF16: bool, const NC: usize>(
    q: &[f32],
    segs: &[Seg; 2],
    inv: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let hd = NC * 32;
    let row_bytes = hd * if BF16 { 2 } else { 4 };
    // Query in the load order of the keys.
    let mut qp = [[0f32; 16]; 16];
    for c in 0..NC {
        for h in 0..2 {
            for i in 0..16 {
                qp[2 * c + h][i] = q[pos512::<BF16>(c, h, i)];
            }
        }
    }
    let mut qv = [_mm512_setzero_ps(); 16];
    for k in 0..2 * NC {
        qv[k] = _mm512_loadu_ps(qp[k].as_ptr());
    }
    let sp = scores.as_mut_ptr();
    let pf = crate::arch::table::PREFETCH.load(std::sync::atomic::Ordering::Relaxed);
    let mut j = 0usize;
    for seg in segs {
        let mut row = seg.k;
        for _ in 0..seg.n {
            if pf > 0 {
                for l in 0..row_bytes / 64 {
                    _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(pf + 64 * l) as *const i8);
                }
            }
            let mut a0 = _mm512_setzero_ps();
            let mut a1 = _mm512_setzero_ps();
            for c in 0..NC {
                let (e, o) = load512::<BF16>(row, c);
                a0 = _mm512_fmadd_ps(qv[2 * c], e, a0);
                a1 = _mm512_fmadd_ps(qv[2 * c + 1], o, a1);
            }
            *sp.add(j) = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)) * inv;
            row = row.add(row_bytes);
            j += 1;
        }
    }
    super::ops::rows_avx512::softmax(std::slice::from_raw_parts_mut(sp, j));
    let mut acc = [_mm512_setzero_ps(); 16];
    j = 0;
    for seg in segs {
        let mut row = seg.v;
        for _ in 0..seg.n {
            if pf > 0 {
                for l in 0..row_bytes / 64 {
                    _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(pf + 64 * l) as *const i8);
                }
            }
            let p = _mm512_set1_ps(*sp.add(j));
            for c in 0..NC {
                let (e, o) = load512::<BF16>(row, c);
                acc[2 * c] = _mm512_fmadd_ps(p, e, acc[2 * c]);
                acc[2 * c + 1] = _mm512_fmadd_ps(p, o, acc[2 * c + 1]);
            }
            row = row.add(row_bytes);
            j += 1;
        }
    }
    let mut tmp = [0f32; 16];
    for c in 0..NC {
        for h in 0..2 {
            _mm512_storeu_ps(tmp.as_mut_ptr(), acc[2 * c + h]);
            for i in 0..16 {
                out[pos512::<BF16>(c, h, i)] = tmp[i];
            }
        }
    }
}

/// One head with AVX-512. `hd` must be a multiple of 32 and at most [`MAX_HD`];
/// `scores` holds at least `segs[0].n + segs[1].n` values; `out` is `hd` long.
///
/// # Safety
/// AVX-512 F/BW/DQ/VL and FMA available; each segment's `k`/`v` point to `n` rows of `hd`
/// elements (bf16 when `bf16`, else f32).
unsafe fn head_avx512(
    bf16: bool,
    hd: usize,
    q: &[f32],
    segs: &[Seg; 2],
    inv: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    macro_rules! go {
        ($b:literal) => {
            match hd / 32 {
                1 => head512_nc::<$b, 1>(q, segs, inv, scores, out),
                2 => head512_nc::<$b, 2>(q, segs, inv, scores, out),
                3 => head512_nc::<$b, 3>(q, segs, inv, scores, out),
                4 => head512_nc::<$b, 4>(q, segs, inv, scores, out),
                5 => head512_nc::<$b, 5>(q, segs, inv, scores, out),
                6 => head512_nc::<$b, 6>(q, segs, inv, scores, out),
                7 => head512_nc::<$b, 7>(q, segs, inv, scores, out),
                _ => head512_nc::<$b, 8>(q, segs, inv, scores, out),
            }
        };
    }
    debug_assert!(hd.is_multiple_of(32) && hd <= MAX_HD);
    if bf16 {
        go!(true)
    } else {
        go!(false)
    }
}

// ---------------------------------------------------------------------------------------
// AVX2

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load256<const BF16: bool>(row: *const u8, c: usize) -> (__m256, __m256) {
    if BF16 {
        let x = _mm256_loadu_si256(row.add(c * 32) as *const __m256i);
        (
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(x)),
            _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(-65536))),
        )
    } else {
        let p = row.add(c * 64) as *const f32;
        (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
    }
}

#[inline(always)]
fn pos256<const BF16: bool>(c: usize, h: usize, i: usize) -> usize {
    if BF16 {
        16 * c + 2 * i + h
    } else {
        16 * c + 8 * h + i
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn head256_nc<const BF16: bool, const NC: usize>(
    q: &[f32],
    segs: &[Seg; 2],
    inv: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let hd = NC * 16;
    let row_bytes = hd * if BF16 { 2 } else { 4 };
    let mut qp = [[0f32; 8]; 32];
    for c in 0..NC {
        for h in 0..2 {
            for i in 0..8 {
                qp[2 * c + h][i] = q[pos256::<BF16>(c, h, i)];
            }
        }
    }
    let sp = scores.as_mut_ptr();
    let mut j = 0usize;
    for seg in segs {
        let mut row = seg.k;
        for _ in 0..seg.n {
            let mut a0 = _mm256_setzero_ps();
            let mut a1 = _mm256_setzero_ps();
            for c in 0..NC {
                let (e, o) = load256::<BF16>(row, c);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qp[2 * c].as_ptr()), e, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qp[2 * c + 1].as_ptr()), o, a1);
            }
            *sp.add(j) = super::hsum(_mm256_add_ps(a0, a1)) * inv;
            row = row.add(row_bytes);
            j += 1;
        }
    }
    super::ops::rows_avx2::softmax(std::slice::from_raw_parts_mut(sp, j));
    // Values: at most 4 chunks (8 accumulators) per pass over the entries.
    let mut c0 = 0;
    while c0 < NC {
        let cn = (NC - c0).min(4);
        let mut acc = [_mm256_setzero_ps(); 8];
        j = 0;
        for seg in segs {
            let mut row = seg.v;
            for _ in 0..seg.n {
                let p = _mm256_set1_ps(*sp.add(j));
                for c in 0..cn {
                    let (e, o) = load256::<BF16>(row, c0 + c);
                    acc[2 * c] = _mm256_fmadd_ps(p, e, acc[2 * c]);
                    acc[2 * c + 1] = _mm256_fmadd_ps(p, o, acc[2 * c + 1]);
                }
                row = row.add(row_bytes);
                j += 1;
            }
        }
        let mut tmp = [0f32; 8];
        for c in 0..cn {
            for h in 0..2 {
                _mm256_storeu_ps(tmp.as_mut_ptr(), acc[2 * c + h]);
                for i in 0..8 {
                    out[pos256::<BF16>(c0 + c, h, i)] = tmp[i];
                }
            }
        }
        c0 += cn;
    }
}

/// One head with AVX2. `hd` must be a multiple of 16 and at most [`MAX_HD`].
///
/// # Safety
/// AVX2/FMA/F16C available; segments as in [`head_avx512`].
unsafe fn head_avx2(
    bf16: bool,
    hd: usize,
    q: &[f32],
    segs: &[Seg; 2],
    inv: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    macro_rules! go {
        ($b:literal) => {
            match hd / 16 {
                1 => head256_nc::<$b, 1>(q, segs, inv, scores, out),
                2 => head256_nc::<$b, 2>(q, segs, inv, scores, out),
                3 => head256_nc::<$b, 3>(q, segs, inv, scores, out),
                4 => head256_nc::<$b, 4>(q, segs, inv, scores, out),
                5 => head256_nc::<$b, 5>(q, segs, inv, scores, out),
                6 => head256_nc::<$b, 6>(q, segs, inv, scores, out),
                7 => head256_nc::<$b, 7>(q, segs, inv, scores, out),
                8 => head256_nc::<$b, 8>(q, segs, inv, scores, out),
                9 => head256_nc::<$b, 9>(q, segs, inv, scores, out),
                10 => head256_nc::<$b, 10>(q, segs, inv, scores, out),
                11 => head256_nc::<$b, 11>(q, segs, inv, scores, out),
                12 => head256_nc::<$b, 12>(q, segs, inv, scores, out),
                13 => head256_nc::<$b, 13>(q, segs, inv, scores, out),
                14 => head256_nc::<$b, 14>(q, segs, inv, scores, out),
                15 => head256_nc::<$b, 15>(q, segs, inv, scores, out),
                _ => head256_nc::<$b, 16>(q, segs, inv, scores, out),
            }
        };
    }
    debug_assert!(hd.is_multiple_of(16) && hd <= MAX_HD);
    if bf16 {
        go!(true)
    } else {
        go!(false)
    }
}
