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

use super::prefetch_lines;
use crate::arch::table::{HeadQuery, Seg};

/// Largest head dimension the SIMD kernels take (registers / stack arrays).
const MAX_HD: usize = 256;

/// Element index held by lane `i` of half `h` of chunk `c` (`2·L` elements, two vectors of `L`
/// lanes as loaded by a level's `load`): even and odd elements for bf16 rows, the two halves
/// for f32 rows.
#[inline(always)]
fn pos<const BF16: bool, const L: usize>(c: usize, h: usize, i: usize) -> usize {
    if BF16 {
        2 * L * c + 2 * i + h
    } else {
        2 * L * c + L * h + i
    }
}

/// The AVX-512 operations of the kernel body, under the names it uses.
mod zmm {
    pub(super) use super::super::ops::rows_avx512::softmax;
    pub(super) use std::arch::x86_64::{
        __m512 as F, _mm512_add_ps as add, _mm512_and_si512 as and, _mm512_castsi512_ps as cast,
        _mm512_fmadd_ps as fmadd, _mm512_loadu_ps as loadu, _mm512_loadu_si512 as loadu_si,
        _mm512_reduce_add_ps as reduce, _mm512_set1_epi32 as set1_epi32, _mm512_set1_ps as set1,
        _mm512_setzero_ps as zero, _mm512_slli_epi32 as slli, _mm512_storeu_ps as storeu,
    };
}

/// The AVX2 operations of the kernel body, under the names it uses.
mod ymm {
    pub(super) use super::super::hsum as reduce;
    pub(super) use super::super::ops::rows_avx2::softmax;
    pub(super) use std::arch::x86_64::{
        __m256 as F, _mm256_add_ps as add, _mm256_and_si256 as and, _mm256_castsi256_ps as cast,
        _mm256_fmadd_ps as fmadd, _mm256_loadu_ps as loadu, _mm256_loadu_si256 as loadu_si,
        _mm256_set1_epi32 as set1_epi32, _mm256_set1_ps as set1, _mm256_setzero_ps as zero,
        _mm256_slli_epi32 as slli, _mm256_storeu_ps as storeu,
    };
}

/// One pass of a level's kernel over the values of every entry (`$sp`: the probabilities)
/// for output chunks `c0..c0 + cn` (at most `$vchunks`, two accumulators each): `out += pⱼ·vⱼ`
/// in entry order. A macro, not a closure, so that a one-pass level keeps its constant chunk
/// indices and its code.
macro_rules! values_pass {
    (
        $lanes:literal, $vchunks:literal, $segs:ident, $sp:ident, $row_bytes:ident, $pf:ident,
        $out:ident, $c0:expr, $cn:expr
    ) => {{
        let (c0, cn) = ($c0, $cn);
        let mut acc = [zero(); 2 * $vchunks];
        let mut j = 0;
        for seg in $segs {
            let mut row = seg.v;
            for _ in 0..seg.n {
                prefetch_lines(row, $pf, $row_bytes / 64);
                let p = set1(*$sp.add(j));
                for c in 0..cn {
                    let (e, o) = load::<BF16>(row, c0 + c);
                    acc[2 * c] = fmadd(p, e, acc[2 * c]);
                    acc[2 * c + 1] = fmadd(p, o, acc[2 * c + 1]);
                }
                row = row.add($row_bytes);
                j += 1;
            }
        }
        let mut tmp = [0f32; $lanes];
        for c in 0..cn {
            for h in 0..2 {
                storeu(tmp.as_mut_ptr(), acc[2 * c + h]);
                for i in 0..$lanes {
                    $out[pos::<BF16, $lanes>(c0 + c, h, i)] = tmp[i];
                }
            }
        }
    }};
}

/// Instantiates the attention kernel of one level in module `$module`: vectors of `$lanes`
/// f32 (operations from `$ops`), head sizes a multiple of `2·$lanes` dispatched to a
/// const-generic body per chunk count (`$nc`, then `$last` for the rest), at most `$vchunks`
/// chunks of values accumulated per pass (the register budget), the permuted query kept in
/// registers when `$hoist`, KV rows prefetched when `$prefetch`; other head sizes go to
/// `$fallback`.
macro_rules! head_kernel {
    (
        $(#[$doc:meta])*
        mod $module:ident: $feat:literal, $ops:ident, lanes $lanes:literal,
        chunks [$($nc:literal)*] $last:literal, values $vchunks:literal,
        query in registers $hoist:literal, prefetch $prefetch:literal, fallback $fallback:path
    ) => {
        pub(super) mod $module {
            use super::$ops::*;
            use super::*;

            /// Loads chunk `c` (`2·$lanes` elements) of a row as two vectors (see [`pos`]).
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn load<const BF16: bool>(row: *const u8, c: usize) -> (F, F) {
                if BF16 {
                    let x = loadu_si(row.add(c * 4 * $lanes) as *const _);
                    (cast(slli::<16>(x)), cast(and(x, set1_epi32(-65536))))
                } else {
                    let p = row.add(c * 8 * $lanes) as *const f32;
                    (loadu(p), loadu(p.add($lanes)))
                }
            }

            #[target_feature(enable = $feat)]
            unsafe fn head_nc<const BF16: bool, const NC: usize>(
                q: &[f32],
                segs: &[Seg; 2],
                inv: f32,
                scores: &mut [f32],
                out: &mut [f32],
            ) {
                let hd = NC * 2 * $lanes;
                let row_bytes = hd * if BF16 { 2 } else { 4 };
                // Query in the load order of the keys.
                let mut qp = [[0f32; $lanes]; MAX_HD / $lanes];
                for c in 0..NC {
                    for h in 0..2 {
                        for i in 0..$lanes {
                            qp[2 * c + h][i] = q[pos::<BF16, $lanes>(c, h, i)];
                        }
                    }
                }
                // The query in registers when `$hoist` (it fits), else reloaded from L1 per key.
                let mut qv = [zero(); MAX_HD / $lanes];
                if $hoist {
                    for k in 0..2 * NC {
                        qv[k] = loadu(qp[k].as_ptr());
                    }
                }
                let sp = scores.as_mut_ptr();
                let pf = if $prefetch {
                    crate::arch::table::PREFETCH.load(std::sync::atomic::Ordering::Relaxed)
                } else {
                    0
                };
                let mut j = 0usize;
                for seg in segs {
                    let mut row = seg.k;
                    for _ in 0..seg.n {
                        prefetch_lines(row, pf, row_bytes / 64);
                        let mut a0 = zero();
                        let mut a1 = zero();
                        for c in 0..NC {
                            let (e, o) = load::<BF16>(row, c);
                            let (q0, q1) = if $hoist {
                                (qv[2 * c], qv[2 * c + 1])
                            } else {
                                (loadu(qp[2 * c].as_ptr()), loadu(qp[2 * c + 1].as_ptr()))
                            };
                            a0 = fmadd(q0, e, a0);
                            a1 = fmadd(q1, o, a1);
                        }
                        *sp.add(j) = reduce(add(a0, a1)) * inv;
                        row = row.add(row_bytes);
                        j += 1;
                    }
                }
                softmax(std::slice::from_raw_parts_mut(sp, j));
                // Values: one pass when every chunk of the largest head has its two accumulators,
                // else passes of `$vchunks` chunks.
                if 2 * $lanes * $vchunks >= MAX_HD {
                    values_pass!($lanes, $vchunks, segs, sp, row_bytes, pf, out, 0, NC);
                } else {
                    let mut c0 = 0;
                    while c0 < NC {
                        let cn = (NC - c0).min($vchunks);
                        values_pass!($lanes, $vchunks, segs, sp, row_bytes, pf, out, c0, cn);
                        c0 += cn;
                    }
                }
            }

            $(#[$doc])*
            pub(in crate::arch::x86) unsafe fn attend_head(
                head: &HeadQuery<'_>,
                scores: &mut [f32],
                out: &mut [f32],
            ) -> bool {
                let &HeadQuery { bf16, hd, q, ref segs, inv } = head;
                if hd > MAX_HD || !hd.is_multiple_of(2 * $lanes) {
                    return $fallback(head, scores, out);
                }
                if bf16 {
                    match hd / (2 * $lanes) {
                        $($nc => head_nc::<true, $nc>(q, segs, inv, scores, out),)*
                        _ => head_nc::<true, $last>(q, segs, inv, scores, out),
                    }
                } else {
                    match hd / (2 * $lanes) {
                        $($nc => head_nc::<false, $nc>(q, segs, inv, scores, out),)*
                        _ => head_nc::<false, $last>(q, segs, inv, scores, out),
                    }
                }
                true
            }
        }
    };
}

head_kernel! {
    /// The AVX-512 attention entry of the kernel table: zmm for head sizes that are multiples
    /// of 32 up to [`MAX_HD`] (the query held in 16 registers, one pass over the values), else
    /// as [`super::avx2::attend_head`].
    ///
    /// # Safety
    /// AVX-512 F/BW/DQ/VL, AVX2 and FMA available; as [`crate::arch::table::HeadFn`].
    mod avx512: "avx512f,avx512bw,avx512dq,avx512vl,fma", zmm, lanes 16,
    chunks [1 2 3 4 5 6 7] 8, values 8, query in registers true, prefetch true,
    fallback super::avx2::attend_head
}

head_kernel! {
    /// The AVX2 attention entry of the kernel table: head sizes that are multiples of 16 up to
    /// [`MAX_HD`] (values in passes of at most 4 chunks, 8 of the 16 ymm registers); `false`
    /// for others.
    ///
    /// # Safety
    /// AVX2/FMA/F16C available; as [`crate::arch::table::HeadFn`].
    mod avx2: "avx2,fma,f16c", ymm, lanes 8,
    chunks [1 2 3 4 5 6 7 8 9 10 11 12 13 14 15] 16, values 4, query in registers false,
    prefetch false, fallback crate::arch::scalar::attend_head
}
