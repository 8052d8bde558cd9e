//! GEMM micro-kernels of the convolutions for x86_64: the AVX2 6×16 tile and skinny kernels,
//! and AVX-512 blocks.
//!
//! The packed-A layout is the same for every kernel (`[panel][k][MR]`, `MR = 6`), so the
//! weights are packed once whatever the CPU. An AVX-512 block of C is `RP` consecutive A
//! panels (up to 24 rows) × `W` B panels of 16 columns (one `zmm` each): 12×32 when both fit,
//! 24×16 when the output has a single 16-column panel (Mimi's 25/12.5 Hz layers), i.e. up to
//! 24 accumulators in the 32 vector registers. Every output is one FMA chain over `k` in
//! increasing order followed by the bias add, exactly like the AVX2 and scalar
//! micro-kernels, so all three give bitwise-equal results.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::arch::table::{BRows, SKINNY};
use crate::layout::{PackedA, MR, NR};

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn kernel_avx2(k: usize, a: &[f32], b: &[f32], tile: &mut [[f32; NR]; MR]) {
    assert!(a.len() >= k * MR && b.len() >= k * NR);
    // SAFETY: bounds checked above; unaligned loads only.
    unsafe {
        let mut c = [[_mm256_setzero_ps(); 2]; MR];
        let (mut ap, mut bp) = (a.as_ptr(), b.as_ptr());
        for _ in 0..k {
            let b0 = _mm256_loadu_ps(bp);
            let b1 = _mm256_loadu_ps(bp.add(8));
            for (r, cr) in c.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*ap.add(r));
                cr[0] = _mm256_fmadd_ps(av, b0, cr[0]);
                cr[1] = _mm256_fmadd_ps(av, b1, cr[1]);
            }
            ap = ap.add(MR);
            bp = bp.add(NR);
        }
        for (r, cr) in c.iter().enumerate() {
            _mm256_storeu_ps(tile[r].as_mut_ptr(), cr[0]);
            _mm256_storeu_ps(tile[r].as_mut_ptr().add(8), cr[1]);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn skinny_avx2(k: usize, a: &[f32], bt: &[f32], tile: &mut [[f32; SKINNY]; MR]) {
    assert!(a.len() >= k * MR + 2 && bt.len() >= k * SKINNY);
    // SAFETY: bounds checked above (8-lane loads of A read at most 2 padding floats).
    unsafe {
        let mut acc0 = [_mm256_setzero_ps(); SKINNY];
        let mut acc1 = [_mm256_setzero_ps(); SKINNY];
        let (ap, bp) = (a.as_ptr(), bt.as_ptr());
        let mut p = 0;
        while p + 2 <= k {
            let a0 = _mm256_loadu_ps(ap.add(p * MR));
            let a1 = _mm256_loadu_ps(ap.add((p + 1) * MR));
            for j in 0..SKINNY {
                acc0[j] =
                    _mm256_fmadd_ps(a0, _mm256_broadcast_ss(&*bp.add(p * SKINNY + j)), acc0[j]);
                acc1[j] = _mm256_fmadd_ps(
                    a1,
                    _mm256_broadcast_ss(&*bp.add((p + 1) * SKINNY + j)),
                    acc1[j],
                );
            }
            p += 2;
        }
        if p < k {
            let a0 = _mm256_loadu_ps(ap.add(p * MR));
            for j in 0..SKINNY {
                acc0[j] =
                    _mm256_fmadd_ps(a0, _mm256_broadcast_ss(&*bp.add(p * SKINNY + j)), acc0[j]);
            }
        }
        for j in 0..SKINNY {
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), _mm256_add_ps(acc0[j], acc1[j]));
            for r in 0..MR {
                tile[r][j] = lanes[r];
            }
        }
    }
}

/// All row blocks `p0..p1` against the column panels `q..q + w` of B (the wide GEMM entry of
/// the AVX-512 table).
///
/// # Safety
/// AVX-512F; as [`crate::arch::WideFn`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn blocks(
    a: &PackedA,
    b: BRows<'_>,
    q: usize,
    w: usize,
    b_n: usize,
    c: *mut f32,
    ldc: usize,
    bias: Option<&[f32]>,
    (p0, p1): (usize, usize),
) {
    let k = a.k;
    let panel = k * MR;
    let t0 = q * NR;
    let nv = (b_n - t0).min(w * NR);
    let b = match b {
        BRows::Gathered(p) => BRows::Gathered(p),
        BRows::InPlace { src, offs } => BRows::InPlace {
            src: src.add(t0),
            offs,
        },
    };
    let mut p = p0;
    while p < p1 {
        let rp = (p1 - p).min(if w == 2 { 2 } else { 4 });
        let r0 = p * MR;
        let mv = (a.m - r0).min(rp * MR);
        let ap = a.data_ptr().add(p * panel);
        let cp = c.add(r0 * ldc + t0);
        let bs = bias.map(|bb| &bb[r0..r0 + mv]);
        match (rp, w) {
            (1, 1) => kern::<1, 1>(k, ap, panel, b, cp, ldc, bs, mv, nv),
            (2, 1) => kern::<2, 1>(k, ap, panel, b, cp, ldc, bs, mv, nv),
            (3, 1) => kern::<3, 1>(k, ap, panel, b, cp, ldc, bs, mv, nv),
            (4, 1) => kern::<4, 1>(k, ap, panel, b, cp, ldc, bs, mv, nv),
            (1, _) => kern::<1, 2>(k, ap, panel, b, cp, ldc, bs, mv, nv),
            _ => kern::<2, 2>(k, ap, panel, b, cp, ldc, bs, mv, nv),
        }
        p += rp;
    }
}

/// Most accumulator rows of one block (`RP · MR` with `RP ≤ 4`).
const ROWS: usize = 4 * MR;

/// One step `kk` of a block: the `W` 16-wide B vectors at `$bp` times the `RP · MR` values of
/// A at `$ap` (panels `$astride` floats apart), into `$acc`. A macro, not a function: both
/// loops of [`kern`] must inline it with the accumulators kept in registers.
macro_rules! step {
    ($acc:ident, $ap:expr, $astride:expr, $bp:expr, $rp:ident, $w:ident) => {{
        let (ap, bp) = ($ap, $bp);
        let mut bv = [_mm512_setzero_ps(); $w];
        for (j, v) in bv.iter_mut().enumerate() {
            *v = _mm512_loadu_ps(bp.add(j * NR));
        }
        for i in 0..$rp {
            for r in 0..MR {
                let av = _mm512_set1_ps(*ap.add(i * $astride + r));
                for j in 0..$w {
                    $acc[i * MR + r][j] = _mm512_fmadd_ps(av, bv[j], $acc[i * MR + r][j]);
                }
            }
        }
    }};
}

/// One block: rows `0..mv` (of `RP` panels starting at `a`, `astride` floats apart) ×
/// columns `0..nv` (of `W` 16-wide panels of B: gathered with row stride `16·W`, or in place
/// from the block's first column), written to `c` (row stride `ldc`) plus the bias.
///
/// # Safety
/// AVX-512F; `a` holds `RP` panels of `k·MR` floats, `b` holds `k` rows of `16·W` floats,
/// `c` is writable for `mv` rows × `nv` columns, `bias` (when given) has `mv` values.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn kern<const RP: usize, const W: usize>(
    k: usize,
    a: *const f32,
    astride: usize,
    b: BRows<'_>,
    c: *mut f32,
    ldc: usize,
    bias: Option<&[f32]>,
    mv: usize,
    nv: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); W]; ROWS];
    let mut ap = a;
    match b {
        BRows::Gathered(mut bp) => {
            for _ in 0..k {
                step!(acc, ap, astride, bp, RP, W);
                ap = ap.add(MR);
                bp = bp.add(W * NR);
            }
        }
        BRows::InPlace { src, offs } => {
            for &o in &offs[..k] {
                step!(acc, ap, astride, src.add(o), RP, W);
                ap = ap.add(MR);
            }
        }
    }
    // The store loop reads a copy: with 24 rows LLVM does not unroll it, and a loop over `acc`
    // itself would index it at run time, which kept `acc` in memory and stored all 24
    // accumulators on every step of `k`. The copy has only the used rows, each at a constant
    // index, so the unused rows of the array (and their zeroing, 3 KB per block) disappear.
    let mut out = [[_mm512_setzero_ps(); W]; ROWS];
    out[..RP * MR].copy_from_slice(&acc[..RP * MR]);
    for (r, row) in out.iter().enumerate().take(RP * MR) {
        if r >= mv {
            break;
        }
        let bb = _mm512_set1_ps(bias.map_or(0.0, |bb| bb[r]));
        let dst = c.add(r * ldc);
        for (j, v) in row.iter().enumerate() {
            let cols = nv.saturating_sub(j * NR).min(NR);
            if cols == 0 {
                break;
            }
            let v = _mm512_add_ps(*v, bb);
            if cols == NR {
                _mm512_storeu_ps(dst.add(j * NR), v);
            } else {
                _mm512_mask_storeu_ps(dst.add(j * NR), ((1u32 << cols) - 1) as __mmask16, v);
            }
        }
    }
}
