//! Quantized and dense matmul tiles for aarch64: baseline NEON (`smull` + pairwise adds),
//! `sdot` (dotprod) and `smmla` (i8mm) on the 8-row interleaved tiles of `layout.rs`. Every
//! quantized kernel computes the same integer block sums as the portable reference and then the
//! same f32 operations in the same order, so results are bitwise equal to it.
#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use std::arch::aarch64::*;
use std::arch::asm;

use crate::arch::table::{with_rows, GroupCounter, MatmulSpan};
use crate::layout::{Act, QKind, QPacked, QK, TILE};

/// f16 → f32 of 4 lanes (`fcvtl`, base ARMv8 floating point).
#[inline(always)]
pub(super) unsafe fn f16x4_to_f32(h: uint16x4_t) -> float32x4_t {
    let out: float32x4_t;
    asm!("fcvtl {o:v}.4s, {i:v}.4h", o = out(vreg) out, i = in(vreg) h,
         options(pure, nomem, nostack));
    out
}

/// bf16 bits → f32 of 4 lanes (exact: a shift).
#[inline(always)]
pub(super) unsafe fn bf16x4_to_f32(h: uint16x4_t) -> float32x4_t {
    vreinterpretq_f32_u32(vshll_n_u16::<16>(h))
}

/// The 8 per-row scales (or biases) of tile `t`, group `g`, as two f32x4 (rows 0–3, 4–7).
#[inline(always)]
unsafe fn load8(q: &QPacked, v: &[u16], t: usize, g: usize) -> [float32x4_t; 2] {
    let h = vld1q_u16(v.as_ptr().add(q.scale_index(t, g)));
    let (lo, hi) = (vget_low_u16(h), vget_high_u16(h));
    match q.kind {
        QKind::Q8Sym | QKind::Q4Sym => [f16x4_to_f32(lo), f16x4_to_f32(hi)],
        QKind::Affine8 | QKind::Affine4 => [bf16x4_to_f32(lo), bf16x4_to_f32(hi)],
    }
}

/// Block `b` (scale group `g`) of tile `t`: adds the scaled integer sums `is` (rows 0–3, 4–7 per activation row
/// `i0 + i`) to `acc` and the bias term to `corr`, exactly like the portable kernel.
#[inline(always)]
unsafe fn accumulate<const N: usize>(
    q: &QPacked,
    t: usize,
    b: usize,
    act: &Act<'_>,
    i0: usize,
    g: usize,
    is: &[[int32x4_t; 2]; N],
    acc: &mut [[float32x4_t; 2]; N],
    corr: &mut [[float32x4_t; 2]; N],
) {
    let nb = q.blocks;
    let sc = load8(q, &q.scales, t, g);
    let bias = match q.kind {
        QKind::Q8Sym => [vdupq_n_f32(0.0); 2],
        QKind::Q4Sym => [vmulq_n_f32(sc[0], -8.0), vmulq_n_f32(sc[1], -8.0)],
        QKind::Affine8 | QKind::Affine4 => load8(q, &q.biases, t, g),
    };
    for i in 0..N {
        let ab = (i0 + i) * nb + b;
        let (d, s) = (*act.d.get_unchecked(ab), *act.s.get_unchecked(ab));
        let shift = vdupq_n_s32(if q.kind == QKind::Affine8 {
            128 * *act.qs.get_unchecked(ab)
        } else {
            0
        });
        for h in 0..2 {
            let v = vcvtq_f32_s32(vaddq_s32(is[i][h], shift));
            acc[i][h] = vfmaq_f32(acc[i][h], vmulq_n_f32(sc[h], d), v);
            corr[i][h] = vfmaq_n_f32(corr[i][h], bias[h], s);
        }
    }
}

/// Writes the 8 outputs of tile `t` for activation rows `i0..i0 + N` (rows past `rows` dropped).
#[inline(always)]
unsafe fn store<const N: usize>(
    acc: &[[float32x4_t; 2]; N],
    corr: &[[float32x4_t; 2]; N],
    rows: usize,
    t: usize,
    i0: usize,
    y: *mut f32,
) {
    let valid = (rows - t * TILE).min(TILE);
    for i in 0..N {
        let mut o = [0f32; 8];
        vst1q_f32(o.as_mut_ptr(), vaddq_f32(acc[i][0], corr[i][0]));
        vst1q_f32(o.as_mut_ptr().add(4), vaddq_f32(acc[i][1], corr[i][1]));
        std::ptr::copy_nonoverlapping(o.as_ptr(), y.add((i0 + i) * rows + t * TILE), valid);
    }
}

/// Baseline NEON dot of 4 rows × 4 bytes (`w`) with the 4 bytes of lane `L` of `x`.
#[inline(always)]
unsafe fn dot4_neon<const L: i32>(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
    let xb = vreinterpretq_s8_s32(vdupq_laneq_s32::<L>(vreinterpretq_s32_s8(x)));
    let lo = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(xb)));
    let hi = vpaddlq_s16(vmull_high_s8(w, xb));
    vaddq_s32(acc, vpaddq_s32(lo, hi))
}

macro_rules! dot_neon {
    ($acc:expr, $w:expr, $x:expr, $lane:literal) => {
        dot4_neon::<$lane>($acc, $w, $x)
    };
}

macro_rules! dot_sdot {
    ($acc:expr, $w:expr, $x:expr, $lane:literal) => {{
        let mut a = $acc;
        asm!(
            concat!("sdot {a:v}.4s, {w:v}.16b, {x:v}.4b[", $lane, "]"),
            a = inout(vreg) a,
            w = in(vreg) $w,
            x = in(vreg) $x,
            options(pure, nomem, nostack)
        );
        a
    }};
}

/// Instantiates the one-activation-row-at-a-time tile kernels with a 4-byte dot step: `$dot`
/// is `dot_neon` (baseline) or `dot_sdot` (dotprod).
macro_rules! dot_kernels {
    ($module:ident, $feat:literal, $dot:ident) => {
        pub(super) mod $module {
            use super::*;

            /// Tile `t` against activation rows `i0..i0 + N`.
            #[inline]
            #[target_feature(enable = $feat)]
            pub(in crate::arch::aarch64) unsafe fn tile<const N: usize>(
                q: &QPacked,
                act: &Act<'_>,
                span: MatmulSpan,
                t: usize,
                i0: usize,
                y: *mut f32,
            ) {
                let cols = span.cols;
                let mut acc = [[vdupq_n_f32(0.0); 2]; N];
                let mut corr = [[vdupq_n_f32(0.0); 2]; N];
                let m4 = vdupq_n_u8(15);
                let mut groups = GroupCounter::new(q.group_blocks);
                for b in 0..q.blocks {
                    let wp = q.codes.as_ptr().add(q.tile_block_base(t, b));
                    let mut is = [[vdupq_n_s32(0); 2]; N];
                    let mut xv = [[vdupq_n_s8(0); 2]; N];
                    for i in 0..N {
                        let xp = act.q.as_ptr().add((i0 + i) * cols + b * QK);
                        xv[i] = [vld1q_s8(xp), vld1q_s8(xp.add(16))];
                    }
                    if q.kind.is_q4() {
                        // Byte i of row r in group k: low nibble = column 4k + i, high = 16 + 4k + i.
                        macro_rules! group {
                            ($k:literal) => {
                                let w0 = vld1q_u8(wp.add(64 * $k));
                                let w1 = vld1q_u8(wp.add(64 * $k + 16));
                                let l = [vandq_u8(w0, m4), vandq_u8(w1, m4)];
                                let h = [vshrq_n_u8::<4>(w0), vshrq_n_u8::<4>(w1)];
                                for i in 0..N {
                                    for r in 0..2 {
                                        let (lo, hi) =
                                            (vreinterpretq_s8_u8(l[r]), vreinterpretq_s8_u8(h[r]));
                                        is[i][r] = $dot!(is[i][r], lo, xv[i][0], $k);
                                        is[i][r] = $dot!(is[i][r], hi, xv[i][1], $k);
                                    }
                                }
                            };
                        }
                        group!(0);
                        group!(1);
                        group!(2);
                        group!(3);
                    } else {
                        // Group j: rows 0–7 × columns 4j..4j + 4.
                        macro_rules! group {
                            ($j:literal, $half:literal, $lane:literal) => {
                                let w0 = vld1q_s8(wp.add(64 * $j) as *const i8);
                                let w1 = vld1q_s8(wp.add(64 * $j + 16) as *const i8);
                                for i in 0..N {
                                    is[i][0] = $dot!(is[i][0], w0, xv[i][$half], $lane);
                                    is[i][1] = $dot!(is[i][1], w1, xv[i][$half], $lane);
                                }
                            };
                        }
                        group!(0, 0, 0);
                        group!(1, 0, 1);
                        group!(2, 0, 2);
                        group!(3, 0, 3);
                        group!(4, 1, 0);
                        group!(5, 1, 1);
                        group!(6, 1, 2);
                        group!(7, 1, 3);
                    }
                    accumulate::<N>(q, t, b, act, i0, groups.next(), &is, &mut acc, &mut corr);
                }
                store::<N>(&acc, &corr, span.rows, t, i0, y);
            }

            /// Quantized matmul over the rows of `span` (`r0` a multiple of 8).
            ///
            /// # Safety
            /// The CPU has the features of this module; `act` prepared for `n` rows of `cols`;
            /// `y` holds `n·rows`.
            #[target_feature(enable = $feat)]
            pub(in crate::arch::aarch64) unsafe fn quant(
                q: &QPacked,
                act: &Act<'_>,
                span: MatmulSpan,
                y: *mut f32,
            ) {
                for (t, i0, k) in crate::arch::table::tile_chunks(span, 4) {
                    with_rows!(k, tile(q, act, span, t, i0, y));
                }
            }
        }
    };
}

dot_kernels!(plain, "neon", dot_neon);
dot_kernels!(dotprod, "neon,dotprod", dot_sdot);

/// `acc += a (2×8 i8) · bᵀ (2×8 i8)` as a 2×2 i32 matrix (`smmla`).
#[inline]
#[target_feature(enable = "neon,dotprod,i8mm")]
unsafe fn smmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut r = acc;
    asm!("smmla {r:v}.4s, {a:v}.16b, {b:v}.16b", r = inout(vreg) r, a = in(vreg) a,
         b = in(vreg) b, options(pure, nomem, nostack));
    r
}

/// Rows (0,1), (2,3) of two 4-row × 4-byte groups holding columns `c..c+4` (`a`) and
/// `c+4..c+8` (`b`): `smmla` operands of 2 rows × 8 columns.
#[inline(always)]
unsafe fn pairs(a: uint8x16_t, b: uint8x16_t) -> [int8x16_t; 2] {
    let (a, b) = (vreinterpretq_u32_u8(a), vreinterpretq_u32_u8(b));
    [
        vreinterpretq_s8_u32(vzip1q_u32(a, b)),
        vreinterpretq_s8_u32(vzip2q_u32(a, b)),
    ]
}

/// i8mm: tile `t` against `2·P` activation rows, two at a time through `smmla`.
#[inline]
#[target_feature(enable = "neon,dotprod,i8mm")]
unsafe fn tile_mm<const P: usize, const N: usize>(
    q: &QPacked,
    act: &Act<'_>,
    span: MatmulSpan,
    t: usize,
    i0: usize,
    y: *mut f32,
) {
    let cols = span.cols;
    let mut acc = [[vdupq_n_f32(0.0); 2]; N];
    let mut corr = [[vdupq_n_f32(0.0); 2]; N];
    let m4 = vdupq_n_u8(15);
    let mut groups = GroupCounter::new(q.group_blocks);
    for b in 0..q.blocks {
        let wp = q.codes.as_ptr().add(q.tile_block_base(t, b));
        // Per pair of activation rows, chunk c: columns 8c..8c + 8 of both rows.
        let mut xm = [[vdupq_n_s8(0); 4]; P];
        for p in 0..P {
            let xa = act.q.as_ptr().add((i0 + 2 * p) * cols + b * QK);
            let xb = xa.add(cols);
            for c in 0..4 {
                xm[p][c] = vcombine_s8(vld1_s8(xa.add(8 * c)), vld1_s8(xb.add(8 * c)));
            }
        }
        // Row pairs (0,1), (2,3), (4,5), (6,7) × activation pair: [r·xa, r·xb, r'·xa, r'·xb].
        let mut mm = [[vdupq_n_s32(0); 4]; P];
        let mut step = |w: [int8x16_t; 4], c: usize| {
            for p in 0..P {
                for k in 0..4 {
                    mm[p][k] = smmla(mm[p][k], w[k], xm[p][c]);
                }
            }
        };
        if q.kind.is_q4() {
            for kk in 0..2 {
                let (a, bb) = (wp.add(128 * kk), wp.add(128 * kk + 64));
                let (a0, a1) = (vld1q_u8(a), vld1q_u8(a.add(16)));
                let (b0, b1) = (vld1q_u8(bb), vld1q_u8(bb.add(16)));
                let lo = |v: uint8x16_t| vandq_u8(v, m4);
                let hi = |v: uint8x16_t| vshrq_n_u8::<4>(v);
                let (l01, l45) = (pairs(lo(a0), lo(b0)), pairs(lo(a1), lo(b1)));
                step([l01[0], l01[1], l45[0], l45[1]], kk);
                let (h01, h45) = (pairs(hi(a0), hi(b0)), pairs(hi(a1), hi(b1)));
                step([h01[0], h01[1], h45[0], h45[1]], 2 + kk);
            }
        } else {
            for jj in 0..4 {
                let (a, bb) = (wp.add(128 * jj), wp.add(128 * jj + 64));
                let lo = pairs(vld1q_u8(a), vld1q_u8(bb));
                let hi = pairs(vld1q_u8(a.add(16)), vld1q_u8(bb.add(16)));
                step([lo[0], lo[1], hi[0], hi[1]], jj);
            }
        }
        let mut is = [[vdupq_n_s32(0); 2]; N];
        for p in 0..P {
            is[2 * p] = [
                vuzp1q_s32(mm[p][0], mm[p][1]),
                vuzp1q_s32(mm[p][2], mm[p][3]),
            ];
            is[2 * p + 1] = [
                vuzp2q_s32(mm[p][0], mm[p][1]),
                vuzp2q_s32(mm[p][2], mm[p][3]),
            ];
        }
        accumulate::<N>(q, t, b, act, i0, groups.next(), &is, &mut acc, &mut corr);
    }
    store::<N>(&acc, &corr, span.rows, t, i0, y);
}

/// i8mm quantized matmul: pairs of activation rows through `smmla`, a lone last row through
/// `sdot`.
///
/// # Safety
/// dotprod and i8mm available; as [`dotprod::quant`].
#[target_feature(enable = "neon,dotprod,i8mm")]
pub(super) unsafe fn quant_i8mm(q: &QPacked, act: &Act<'_>, span: MatmulSpan, y: *mut f32) {
    let n = span.n;
    for t in span.r0 / TILE..span.r1.div_ceil(TILE) {
        let mut i0 = 0;
        while i0 < n {
            match n - i0 {
                1 => {
                    dotprod::tile::<1>(q, act, span, t, i0, y);
                    i0 += 1;
                }
                2 | 3 => {
                    tile_mm::<1, 2>(q, act, span, t, i0, y);
                    i0 += 2;
                }
                _ => {
                    tile_mm::<2, 4>(q, act, span, t, i0, y);
                    i0 += 4;
                }
            }
        }
    }
}

/// Dense matmul rows of `span`: one weight row at a time, 4 f32x4 accumulators per activation
/// row; `load` widens 4 weights at `w` (element offset `c`).
#[inline(always)]
unsafe fn dense<T: Copy>(
    w: &[T],
    x: &[f32],
    span: MatmulSpan,
    y: *mut f32,
    load: impl Fn(*const T) -> float32x4_t,
    widen: impl Fn(T) -> f32,
) {
    let (rows, cols, n) = (span.rows, span.cols, span.n);
    let main = cols / 16 * 16;
    for r in span.r0..span.r1 {
        let wr = w.as_ptr().add(r * cols);
        for i in 0..n {
            let xp = x.as_ptr().add(i * cols);
            let mut a = [vdupq_n_f32(0.0); 4];
            let mut c = 0;
            while c < main {
                for k in 0..4 {
                    a[k] = vfmaq_f32(a[k], load(wr.add(c + 4 * k)), vld1q_f32(xp.add(c + 4 * k)));
                }
                c += 16;
            }
            let mut s = vaddvq_f32(vaddq_f32(vaddq_f32(a[0], a[1]), vaddq_f32(a[2], a[3])));
            for c in main..cols {
                s = widen(*wr.add(c)).mul_add(*xp.add(c), s);
            }
            *y.add(i * rows + r) = s;
        }
    }
}

/// Dense f32 rows (NEON).
///
/// # Safety
/// `w` is `rows·cols`, `x` is `n·cols`, `y` holds `n·rows`.
pub(super) unsafe fn dense_f32(w: &[f32], x: &[f32], span: MatmulSpan, y: *mut f32) {
    dense(w, x, span, y, |p| vld1q_f32(p), |v| v)
}

/// Dense bf16 (`BF16`) or f16 rows (NEON).
///
/// # Safety
/// As [`dense_f32`].
pub(super) unsafe fn dense_half<const BF16: bool>(
    w: &[u16],
    x: &[f32],
    span: MatmulSpan,
    y: *mut f32,
) {
    dense(
        w,
        x,
        span,
        y,
        |p| {
            if BF16 {
                bf16x4_to_f32(vld1_u16(p))
            } else {
                f16x4_to_f32(vld1_u16(p))
            }
        },
        |b| {
            if BF16 {
                half::bf16::from_bits(b).to_f32()
            } else {
                half::f16::from_bits(b).to_f32()
            }
        },
    )
}
