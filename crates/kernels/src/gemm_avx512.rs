//! AVX-512 micro-kernels for the convolution GEMM of [`crate::gemm`] (runtime-dispatched
//! through [`crate::avx512`]).
//!
//! The packed-A layout is the same as the AVX2 path (`[panel][k][MR]`, `MR = 6`), so the
//! weights are packed once whatever the CPU. A block of C is `RP` consecutive A panels
//! (up to 24 rows) × `W` B panels of 16 columns (one `zmm` each): 12×32 when both fit,
//! 24×16 when the output has a single 16-column panel (Mimi's 25/12.5 Hz layers), i.e. up to
//! 24 accumulators in the 32 vector registers. Every output is one FMA chain over `k` in
//! increasing order followed by the bias add, exactly like the AVX2 and scalar
//! micro-kernels, so all three give bitwise-equal results.

use std::cell::RefCell;

use crate::gemm::{gather, BView, PackedA, MR, NR};

thread_local! {
    static BPANEL2: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// [`crate::gemm::gemm`] with the AVX-512 micro-kernels (same contract).
///
/// # Safety
/// The CPU must support AVX-512F; `c` must be valid for the written rows/cols and no other
/// thread may write the same region.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm<F: Fn(usize) -> usize>(
    a: &PackedA,
    b: &BView<'_, F>,
    c: *mut f32,
    ldc: usize,
    bias: Option<&[f32]>,
    (p0, p1): (usize, usize),
    (q0, q1): (usize, usize),
) {
    let k = a.k;
    BPANEL2.with(|buf| {
        let mut buf = buf.borrow_mut();
        if buf.len() < k * 2 * NR {
            buf.resize(k * 2 * NR, 0.0);
        }
        let mut q = q0;
        while q < q1 {
            let w = if q + 1 < q1 { 2 } else { 1 };
            let bp = &mut buf[..k * w * NR];
            gather(b, k, q, w, bp);
            blocks(a, bp.as_ptr(), q, w, b.n, c, ldc, bias, (p0, p1));
            q += w;
        }
    })
}

/// Floats of B gathered once for all column panels ([`gather_groups`]): groups of two
/// 16-column panels (the last one may be single), `k·32` floats apart.
pub(crate) fn gathered_len(k: usize, n: usize) -> usize {
    n.div_ceil(2 * NR) * k * 2 * NR
}

/// Number of column-panel groups of [`gathered_len`].
pub(crate) fn groups(n: usize) -> usize {
    n.div_ceil(2 * NR)
}

/// Gathers the B groups `g0..g1` (group `g` = column panels `2g`, `2g + 1`) into `dst`, the
/// start of the whole gathered buffer.
///
/// # Safety
/// `dst` is valid for [`gathered_len`] floats and no other thread writes these groups.
pub(crate) unsafe fn gather_groups<F: Fn(usize) -> usize>(
    b: &BView<'_, F>,
    k: usize,
    (g0, g1): (usize, usize),
    dst: *mut f32,
) {
    let np = b.n.div_ceil(NR);
    for g in g0..g1 {
        let q = 2 * g;
        let w = (np - q).min(2);
        let d = std::slice::from_raw_parts_mut(dst.add(g * k * 2 * NR), k * w * NR);
        gather(b, k, q, w, d);
    }
}

/// [`gemm`] over all column panels with B already gathered by [`gather_groups`] (shared by
/// the threads that split the rows).
///
/// # Safety
/// As [`gemm`]; `pre` holds the whole gathered B of `b_n` columns.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_pregathered(
    a: &PackedA,
    pre: *const f32,
    b_n: usize,
    c: *mut f32,
    ldc: usize,
    bias: Option<&[f32]>,
    (p0, p1): (usize, usize),
) {
    let k = a.k;
    let np = b_n.div_ceil(NR);
    for g in 0..groups(b_n) {
        let q = 2 * g;
        let w = (np - q).min(2);
        blocks(
            a,
            pre.add(g * k * 2 * NR),
            q,
            w,
            b_n,
            c,
            ldc,
            bias,
            (p0, p1),
        );
    }
}

/// All row blocks `p0..p1` against the gathered column panels `q..q + w` at `bptr`.
#[allow(clippy::too_many_arguments)]
unsafe fn blocks(
    a: &PackedA,
    bptr: *const f32,
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
    let mut p = p0;
    while p < p1 {
        let rp = (p1 - p).min(if w == 2 { 2 } else { 4 });
        let r0 = p * MR;
        let mv = (a.m - r0).min(rp * MR);
        let ap = a.data_ptr().add(p * panel);
        let cp = c.add(r0 * ldc + t0);
        let bs = bias.map(|bb| &bb[r0..r0 + mv]);
        match (rp, w) {
            (1, 1) => kern::<1, 1>(k, ap, panel, bptr, cp, ldc, bs, mv, nv),
            (2, 1) => kern::<2, 1>(k, ap, panel, bptr, cp, ldc, bs, mv, nv),
            (3, 1) => kern::<3, 1>(k, ap, panel, bptr, cp, ldc, bs, mv, nv),
            (4, 1) => kern::<4, 1>(k, ap, panel, bptr, cp, ldc, bs, mv, nv),
            (1, _) => kern::<1, 2>(k, ap, panel, bptr, cp, ldc, bs, mv, nv),
            _ => kern::<2, 2>(k, ap, panel, bptr, cp, ldc, bs, mv, nv),
        }
        p += rp;
    }
}

/// Most accumulator rows of one block (`RP · MR` with `RP ≤ 4`).
const ROWS: usize = 4 * MR;

/// One block: rows `0..mv` (of `RP` panels starting at `a`, `astride` floats apart) ×
/// columns `0..nv` (of `W` 16-wide panels of the gathered B, row stride `16·W`), written to
/// `c` (row stride `ldc`) plus the bias.
///
/// # Safety
/// AVX-512F; `a` holds `RP` panels of `k·MR` floats, `b` holds `k·16·W` floats, `c` is
/// writable for `mv` rows × `nv` columns, `bias` (when given) has `mv` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn kern<const RP: usize, const W: usize>(
    k: usize,
    a: *const f32,
    astride: usize,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    bias: Option<&[f32]>,
    mv: usize,
    nv: usize,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); W]; ROWS];
    let mut ap = a;
    let mut bp = b;
    for _ in 0..k {
        let mut bv = [_mm512_setzero_ps(); W];
        for (j, v) in bv.iter_mut().enumerate() {
            *v = _mm512_loadu_ps(bp.add(j * NR));
        }
        for i in 0..RP {
            for r in 0..MR {
                let av = _mm512_set1_ps(*ap.add(i * astride + r));
                for j in 0..W {
                    acc[i * MR + r][j] = _mm512_fmadd_ps(av, bv[j], acc[i * MR + r][j]);
                }
            }
        }
        ap = ap.add(MR);
        bp = bp.add(W * NR);
    }
    for (r, row) in acc.iter().enumerate().take(mv.min(RP * MR)) {
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
