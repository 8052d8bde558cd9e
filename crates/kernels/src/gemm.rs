//! A small blocked f32 GEMM for the convolutions: `C[m, n] = A[m, k] · B[k, n]` with A
//! packed once (weights) in panels of [`MR`] rows and B read through a view of the input
//! (a row offset per row of B), so a convolution needs no explicit im2col. B is gathered per
//! call into panels of [`NR`] columns, except by the AVX-512 blocks, which read whole panels in
//! place. The AVX2 micro-kernel keeps a 6×16 block of C in 12 registers; the scalar
//! micro-kernel is its reference. Outputs at most [`SKINNY`] wide
//! (Mimi's 12.5/25 Hz layers) take a weight-streaming kernel that reads A exactly once.
#![allow(clippy::needless_range_loop)]

use std::cell::RefCell;

use crate::arch::{BRows, Kernels, MicroFn, WideFn, SKINNY};
use crate::layout::{gather, BView, PackedA, MR, NR};

thread_local! {
    /// B-panel buffers of the GEMMs this thread starts: one per share ([`with_panels`]), or one B
    /// gathered for all shares ([`with_scratch`]).
    static PANELS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Swaps `buf` with the calling thread's B-panel scratch (see [`crate::conv::Workspace`]).
pub(crate) fn swap_panels(buf: &mut Vec<f32>) {
    PANELS.with(|p| std::mem::swap(&mut *p.borrow_mut(), buf));
}

/// Floats of one share's B-panel buffer for a GEMM of depth `k`: two gathered column panels, or
/// the transposed B of the skinny kernel.
pub(crate) fn panel_len(k: usize) -> usize {
    k * (2 * NR).max(SKINNY)
}

/// Disjoint B-panel buffers, one per share of a GEMM, lent by [`with_panels`].
pub(crate) struct Panels {
    ptr: *mut f32,
    len: usize,
    shares: usize,
}

// SAFETY: shares use disjoint buffers (see `Panels::share`).
unsafe impl Sync for Panels {}

impl Panels {
    /// The buffer of share `i`.
    ///
    /// # Safety
    /// Only one thread at a time uses the buffer of share `i`.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn share(&self, i: usize) -> &mut [f32] {
        assert!(
            i < self.shares,
            "Panels::share: share {i} of {}",
            self.shares
        );
        // SAFETY: `with_panels` sized the buffer for `shares` buffers of `len` floats.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i * self.len), self.len) }
    }
}

/// Runs `f` with `shares` B-panel buffers for GEMMs of depth at most `k`, taken from the calling
/// thread's scratch. The buffers belong to the thread that starts the GEMM, not to the threads
/// that run its shares: which thread of a pool claims which share (a matter of scheduling) then
/// cannot make a thread allocate. The scratch grows on the caller during warm-up, the same way on
/// every frame; a per-worker buffer grew whenever a worker first claimed a share of a deeper
/// layer, at an unpredictable frame.
pub(crate) fn with_panels<R>(k: usize, shares: usize, f: impl FnOnce(&Panels) -> R) -> R {
    PANELS.with(|buf| {
        let mut buf = buf.borrow_mut();
        let len = panel_len(k);
        if buf.len() < len * shares {
            buf.resize(len * shares, 0.0);
        }
        f(&Panels {
            ptr: buf.as_mut_ptr(),
            len,
            shares,
        })
    })
}

/// Runs `f` with `len` floats of the calling thread's panel scratch, for B gathered once and
/// read by every share (the row-split GEMMs). It is the buffer [`with_panels`] lends: which of
/// the two a layer takes can change with the number of columns (a column split for many, a row
/// split for few), and one buffer grown to the larger need keeps a call with fewer columns from
/// growing anything after a warm-up with more.
pub(crate) fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    PANELS.with(|buf| {
        let mut buf = buf.borrow_mut();
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
        f(&mut buf[..len])
    })
}

/// Computes `C[rows of panels p0..p1, cols of N-panels q0..q1] = A · B`, writing C row `r`
/// at `c[r·ldc ..]` and adding `bias[r]` when given; `buf` is a share's buffer from
/// [`with_panels`] (depth at least `a.k`).
///
/// # Safety
/// `c` must be valid for the written rows/cols; no other thread writes the same region.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm(
    kern: &Kernels,
    a: &PackedA,
    b: &BView<'_>,
    c: *mut f32,
    ldc: usize,
    bias: Option<&[f32]>,
    (p0, p1): (usize, usize),
    (q0, q1): (usize, usize),
    buf: &mut [f32],
) {
    let k = a.k;
    if b.n <= SKINNY {
        if q0 < q1 {
            let bt = transpose_skinny(b, k, buf);
            // The skinny kernels read 8 floats past a panel (zero padding of the packing).
            tiles(kern.gemm_skinny, a, bt, 8, c, ldc, bias, (p0, p1), b.n);
        }
        return;
    }
    if let Some(wide) = kern.gemm_wide {
        // Wide blocks, two column panels at a time where possible. A view that asks for it is
        // read in place where the panels' columns all exist (see `BView::in_place`); other
        // panels are gathered first.
        let mut q = q0;
        while q < q1 {
            let w = if q + 1 < q1 { 2 } else { 1 };
            let rows = if b.in_place && (q + w) * NR <= b.n {
                BRows::InPlace {
                    src: b.src.as_ptr(),
                    offs: b.offs,
                }
            } else {
                let bp = &mut buf[..k * w * NR];
                gather(b, k, q, w, bp);
                BRows::Gathered(bp.as_ptr())
            };
            wide(a, rows, q, w, b.n, c, ldc, bias, (p0, p1));
            q += w;
        }
        return;
    }
    let bp = &mut buf[..k * NR];
    for q in q0..q1 {
        let t0 = q * NR;
        let nv = (b.n - t0).min(NR);
        gather(b, k, q, 1, bp);
        tiles(kern.gemm_tile, a, bp, 0, c.add(t0), ldc, bias, (p0, p1), nv);
    }
}

/// Row panels `p0..p1` of A against the B block `bp` through the `W`-column micro-kernel
/// `kernel`: writes the first `nv` columns of each tile, plus `bias[r]`, to row `r` of `c`
/// (the block's first column). `pad` floats past each A panel go to the kernel too (those
/// that read ahead).
///
/// # Safety
/// `kernel` belongs to an available table; `c` is valid for the written rows and columns.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn tiles<const W: usize>(
    kernel: MicroFn<W>,
    a: &PackedA,
    bp: &[f32],
    pad: usize,
    c: *mut f32,
    ldc: usize,
    bias: Option<&[f32]>,
    (p0, p1): (usize, usize),
    nv: usize,
) {
    let k = a.k;
    for p in p0..p1 {
        let ap = &a.data[p * k * MR..(p + 1) * k * MR + pad];
        let mut tile = [[0f32; W]; MR];
        kernel(k, ap, bp, &mut tile);
        let mv = (a.m - p * MR).min(MR);
        for (ri, row) in tile.iter().enumerate().take(mv) {
            let r = p * MR + ri;
            let bv = bias.map_or(0.0, |bb| bb[r]);
            let dst = c.add(r * ldc);
            for (j, v) in row.iter().enumerate().take(nv) {
                *dst.add(j) = v + bv;
            }
        }
    }
}

/// `n <= SKINNY`: B transposed into `[k][SKINNY]` (zero past `n`) at the start of `buf`, so
/// the skinny kernels stream the packed A once.
fn transpose_skinny<'a>(b: &BView<'_>, k: usize, buf: &'a mut [f32]) -> &'a [f32] {
    let bt = &mut buf[..k * SKINNY];
    for (cc, dst) in bt.chunks_exact_mut(SKINNY).enumerate() {
        dst[..b.n].copy_from_slice(b.row(cc, 0, b.n));
        dst[b.n..].fill(0.0);
    }
    bt
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
pub(crate) unsafe fn gather_groups(
    b: &BView<'_>,
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
    wide: WideFn,
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
        wide(
            a,
            BRows::Gathered(pre.add(g * k * 2 * NR)),
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
